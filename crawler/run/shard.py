"""One shard of a crawl: its engine, its inbox and its forwarder; and the shard process around it.

Theory of operation
-------------------
:class:`ShardRunner` is what a supervisor (or, in issue 13, a Ray actor)
drives: it builds shard ``index``'s engine over ``DIR/shard-NN`` with its
share of ``--threads`` and of ``--max-pages`` (under a supervisor, the count
every shard of the run takes from: crawler.run.pagelimit), serves the link exchange into the
frontier's ``receive`` and starts the forwarder that empties the outbox. Its
controls are :meth:`report` (a status snapshot plus ``idle`` and
``activity``, from which the supervisor decides that the crawl is complete),
:meth:`finish`, :meth:`stop` and :meth:`orphaned`.

:func:`child_main` is a shard process started by crawler.run.supervisor. Its
stdin carries JSON lines from the supervisor: first the shard's setup, then
``{"cmd": "report", "seq": N}``, ``finish`` and ``stop``; its stdout (kept for
the protocol only: fd 1 then points at stderr) carries the answers and, last,
``{"final": ...}``. Logging goes to stderr, which it shares with the
supervisor. The process is its own session, so a Ctrl-C in the terminal
reaches only the supervisor, which stops the shards through the protocol.

A supervisor that dies is noticed at once: stdin reaches EOF (the supervisor
held the only write end), and a watch thread also checks ``getppid``. The
shard then stops cleanly; fetches still open after ``ORPHAN_GRACE`` seconds
are cut (requeued), and past ``ORPHAN_DEADLINE`` the process exits
regardless: as safe as a kill -9, since every write is crash-safe.

Exit status: 0 after a clean end (complete, stopped, or its page limit),
1 after a crawler error the supervisor must not retry (a full disk...), 2
after an unexpected error (a bug: it is restarted like a killed shard), 3 when
the previous run's shard still held the directory after ``LEFTOVER_WAIT``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any, NoReturn

from ..config import CrawlerConfig
from ..exceptions import CrawlerError, DataDirError
from ..state.pages import decode_bulk
from ..state.shards import ShardPlace, shard_dir
from .engine import Engine
from .exchange import SOCKET_NAME, Forwarder, LinkExchange, UnixExchange, linger_for
from .pagelimit import SharedPageLimit

log = logging.getLogger(__name__)

ADMIT_TIMEOUT = 30.0  # seconds a received batch may wait for the committer before a refusal
ORPHAN_GRACE = 2.0  # seconds an orphaned shard lets its fetches finish before cutting them
ORPHAN_DEADLINE = 8.0  # seconds after which an orphaned shard exits whatever it is doing
LEFTOVER_WAIT = 30.0  # seconds to wait for a previous run's shard to let go of the directory
PARENT_CHECK = 0.5  # seconds between getppid checks
EXIT_FAILED, EXIT_CRASHED, EXIT_LOCKED = 1, 2, 3


def share(total: int, place: ShardPlace) -> int:
    """Shard ``place.index``'s share of ``total`` split as evenly as integers allow."""
    return total // place.count + (1 if place.index < total % place.count else 0)


def shard_config(config: CrawlerConfig, place: ShardPlace, *,
                 shared_limit: bool = False) -> CrawlerConfig:
    """The crawl's settings for one shard: its directory, its share of the threads
    (at least one) and of ``max_pages`` (all of it with ``shared_limit``: the shards
    count together, crawler.run.pagelimit)."""
    max_pages = config.max_pages
    return dataclasses.replace(
        config,
        data_dir=shard_dir(config.data_dir, place.index, place.count),
        threads=max(1, share(config.threads, place)),
        max_pages=None if max_pages is None or shared_limit else share(max_pages, place),
    )


def socket_paths(data_dir: str, count: int) -> list[str]:
    return [os.path.join(shard_dir(data_dir, i, count), SOCKET_NAME) for i in range(count)]


class ShardRunner:
    """Shard ``place`` of the crawl ``config`` describes (``config.data_dir``: the crawl's
    top directory). Thread-safe controls; ``run`` once."""

    def __init__(
        self,
        config: CrawlerConfig,
        place: ShardPlace,
        exchange: LinkExchange,
        seeds: Sequence[str] = (),
        *,
        leftover_wait: float = LEFTOVER_WAIT,
        page_count: str | None = None,
    ) -> None:
        self.place = place
        self.exchange = exchange
        shared = page_count is not None and config.max_pages is not None
        cfg = shard_config(config, place, shared_limit=shared)
        os.makedirs(cfg.data_dir, exist_ok=True)
        self.engine = _open_engine(cfg, place, leftover_wait)
        try:
            if shared:
                assert page_count is not None and config.max_pages is not None
                self.engine.counters.shared = SharedPageLimit(page_count, config.max_pages)
            self.engine.add_seeds(list(seeds))
            outbox = self.engine.frontier.outbox  # None for the one shard of a crawl
            # (a Ray crawl of --shards 1): it has no other shard to send links to
            self.forwarder = (None if outbox is None else
                              Forwarder(outbox, exchange, linger=linger_for(place.count)))
            self.received_batches = 0
            self.received_urls = 0
            self._counts_lock = threading.Lock()
            exchange.serve(place.index, self._admit)
        except BaseException:
            self._close_page_count()
            self.engine.close()
            raise
        self.started = time.monotonic()

    def _admit(self, payload: bytes) -> None:
        entries = decode_bulk(payload)
        done = self.engine.frontier.receive(entries)
        if not done.wait(ADMIT_TIMEOUT):
            raise DataDirError("the committer did not write the batch in time")
        with self._counts_lock:
            self.received_batches += 1
            self.received_urls += len(entries)

    def run(self) -> bool:
        """Crawl until :meth:`finish` (True) or a stop / the page limit (False)."""
        if self.forwarder is not None:
            self.forwarder.start()
        try:
            return self.engine.run(before_close=self._close_exchange)
        finally:
            self._close_page_count()

    def _close_page_count(self) -> None:
        if self.engine.counters.shared is not None:
            self.engine.counters.shared.close()

    def _close_exchange(self) -> None:
        if self.forwarder is not None:
            self.forwarder.stop()
        self.exchange.close()

    def report(self) -> dict[str, Any]:
        """A status snapshot plus what completion is decided on: ``idle`` (nothing to
        fetch, commit or send) and ``activity`` (grows with every commit)."""
        e = self.engine
        # activity first: a commit between the two reads then shows as activity
        activity = e.frontier.commits
        snap = e.reporter.snapshot()
        snap.update(idle=e.idle(), activity=activity, limit=e.limit_reached,
                    **self.exchange_counts())
        return snap

    def exchange_counts(self) -> dict[str, int]:
        """The links this shard handed to others and took from them (in its reports and
        its final word, so the last of them is not lost with the last report)."""
        sent = self.forwarder
        with self._counts_lock:
            received = {"received_batches": self.received_batches,
                        "received_urls": self.received_urls}
        return {
            "sent_batches": 0 if sent is None else sent.sent_batches,
            "sent_urls": 0 if sent is None else sent.sent_urls,
            **received,
            "send_failures": 0 if sent is None else sent.failures,
        }

    def final(self, complete: bool) -> dict[str, Any]:
        e = self.engine
        counts = e.counters.snapshot()
        return {
            "complete": complete,
            "limit": e.limit_reached,
            "fetched": counts.fetched,
            "outcomes": counts.outcomes,
            "seconds": round(time.monotonic() - self.started, 1),
            **self.exchange_counts(),
        }

    def finish(self) -> None:
        self.engine.finish()

    def stop(self) -> None:
        self.engine.stop()

    def orphaned(self) -> None:
        """The supervisor is gone: stop now, cut slow fetches, never outlive the deadline."""
        log.warning("shard %d: the supervisor is gone; stopping", self.place.index)
        self.engine.stop()

        def cut() -> None:
            time.sleep(ORPHAN_GRACE)
            self.engine.abort_fetches()
            time.sleep(ORPHAN_DEADLINE - ORPHAN_GRACE)
            log.warning("shard %d: not stopped after %.0f s; exiting", self.place.index,
                        ORPHAN_DEADLINE)
            os._exit(EXIT_FAILED)  # every write so far is crash-safe: like a kill -9

        threading.Thread(target=cut, name="orphan-deadline", daemon=True).start()


def _open_engine(cfg: CrawlerConfig, place: ShardPlace, wait: float) -> Engine:
    """The shard's engine; while the previous run's shard process (its supervisor was
    killed) still holds the directory, wait for it to exit, up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    logged = False
    while True:
        try:
            return Engine(cfg, place=place)
        except DataDirError as exc:
            if "another crawl is running" not in str(exc) or time.monotonic() >= deadline:
                raise
            if not logged:
                log.info("shard %d: waiting for the previous run's shard to exit", place.index)
                logged = True
            time.sleep(0.1)


# -- the shard process ------------------------------------------------------------------------


class _Control:
    """The shard's side of the supervisor protocol (JSON lines on stdin / stdout)."""

    def __init__(self, ctl_in: IO[bytes], ctl_out: IO[bytes]) -> None:
        self.ctl_in = ctl_in
        self.ctl_out = ctl_out
        self._lock = threading.Lock()
        self.runner: ShardRunner | None = None
        self.ready = threading.Event()  # set once ``runner`` is (or will never be) there
        self.gone = threading.Event()  # the supervisor is gone

    def write(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                self.ctl_out.write(data)
                self.ctl_out.flush()
            except (BrokenPipeError, ValueError):
                self.parent_gone()

    def parent_gone(self) -> None:
        if self.gone.is_set():
            return
        self.gone.set()
        if self.runner is not None:
            self.runner.orphaned()

    def read_loop(self) -> None:
        for line in self.ctl_in:
            try:
                msg = json.loads(line)
            except ValueError:
                log.warning("shard: a bad control line: %r", line[:200])
                continue
            self.ready.wait()  # commands sent while the engine opens wait for it
            cmd, runner = msg.get("cmd"), self.runner
            if runner is None:
                continue
            if cmd == "report":
                self.write({"seq": msg.get("seq"), "report": runner.report()})
            elif cmd == "finish":
                runner.finish()
            elif cmd == "stop":
                runner.stop()
        self.parent_gone()  # EOF: the supervisor held the only write end

    def watch_parent(self, ppid: int) -> None:
        while not self.gone.is_set():
            if os.getppid() != ppid:
                self.parent_gone()
                return
            time.sleep(PARENT_CHECK)


def child_main() -> None:
    """Entry point of a shard process (``python -c "from crawler.run.shard import
    child_main; child_main()"``, started by the supervisor)."""
    ppid = os.getppid()
    ctl_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol
    ctl_in = sys.stdin.buffer
    setup = json.loads(ctl_in.readline() or b"null")
    if setup is None:
        raise SystemExit(EXIT_FAILED)  # the supervisor died before saying anything
    place = ShardPlace(int(setup["index"]), int(setup["count"]))
    logging.basicConfig(
        level=int(setup.get("log_level", logging.INFO)),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s shard-{place.index:02d} %(name)s: %(message)s",
    )
    config: CrawlerConfig = pickle.loads(bytes.fromhex(setup["config"]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    control = _Control(ctl_in, ctl_out)
    threading.Thread(target=control.read_loop, name="control", daemon=True).start()
    threading.Thread(
        target=control.watch_parent, args=(ppid,), name="parent-watch", daemon=True
    ).start()
    exchange = UnixExchange(socket_paths(config.data_dir, place.count))
    try:
        runner = ShardRunner(config, place, exchange, list(setup.get("seeds", [])),
                             page_count=setup.get("page_count"))
    except DataDirError as exc:
        log.error("%s", exc)
        control.write({"final": {"error": str(exc)}})
        _exit(EXIT_LOCKED if "another crawl" in str(exc) else EXIT_FAILED)
    except (CrawlerError, OSError) as exc:  # OSError: the inbox socket cannot be bound
        log.error("%s", exc)
        control.write({"final": {"error": str(exc)}})
        _exit(EXIT_FAILED)
    control.runner = runner
    control.ready.set()
    if control.gone.is_set():
        runner.orphaned()
    signal.signal(signal.SIGTERM, lambda signum, frame: runner.stop())
    try:
        complete = runner.run()
    except CrawlerError as exc:
        log.error("%s", exc)
        control.write({"final": {**runner.final(False), "error": str(exc)}})
        _exit(EXIT_FAILED)
    except Exception:  # noqa: BLE001 - a bug: die loudly, the supervisor restarts the shard
        log.exception("shard %d: unexpected error", place.index)
        _exit(EXIT_CRASHED)
    control.write({"final": runner.final(complete)})
    _exit(0)


def _exit(code: int) -> NoReturn:
    """Leave at once: the stores are closed (or were never open), and an interpreter
    shutdown would wait on the daemon threads blocked reading stdin."""
    logging.shutdown()
    with contextlib.suppress(OSError, ValueError):  # stderr's reader may be gone (| tee)
        sys.stderr.flush()
    os._exit(code)
