"""The supervisor of a sharded crawl: starts the shard processes, restarts the dead, sees one crawl.

Theory of operation
-------------------
The process the user started runs :class:`Supervisor`. It holds
``DIR/supervisor.lock`` (one supervisor per crawl), starts one process per
shard (crawler.run.shard.child_main, each its own session so a Ctrl-C reaches
only us) and talks to each over its stdin/stdout in JSON lines.

Every ``PROBE_INTERVAL`` it asks every shard for a report. The crawl is
*complete* when two consecutive rounds (the second asked only after every
answer to the first came in) find every shard idle with the same
``activity`` (its commit counter) and the same incarnation: then no shard
admitted or wrote anything between its two answers, and since a link in
transit keeps its sender's outbox non-empty (the sender is not idle until the
owner's ack) and admitting it is a commit, nothing was in transit either. It
then tells every shard to ``finish``. ``--max-pages`` is one count the shards
share (``DIR/pages.count``, made at the start of each run: crawler.run.pagelimit);
the shard that finds it used up stops, and the supervisor stops the others.

A shard that dies (killed, crashed) is started again after a backoff that
doubles from ``RESTART_BACKOFF`` up to ``MAX_BACKOFF`` and is reset once a
shard ran ``STABLE_AFTER`` seconds; after ``MAX_QUICK_RESTARTS`` quick deaths
in a row the crawl stops with an error. Its links wait meanwhile in the
other shards' outboxes. A shard that exits 1 (a full disk, a bad data
directory) is not restarted: the crawl stops and reports its error.

:meth:`stop` (Ctrl-C, SIGTERM) sends ``stop`` to every shard and waits for
their clean exits (a stop before or while they start starts no more of them; a
shard still opening its stores takes the command once it has); :meth:`kill`
(a second Ctrl-C) kills them at once, which is as safe as any kill -9. If the
supervisor itself dies, every shard sees its stdin end and stops on its own
(crawler.run.shard).

One status line every ``status_interval`` seconds sums the shards' latest
reports; ``DIR/status.json`` holds that sum and every shard's report.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from ..config import CrawlerConfig
from ..exceptions import DataDirError
from . import pagelimit
from .overview import Overview, Round, ShardTally, Summary, quiescent

log = logging.getLogger(__name__)

LOCK_NAME = "supervisor.lock"
PROBE_INTERVAL = 0.2  # seconds between report rounds
ROUND_TIMEOUT = 2.0  # seconds after which an unanswered round is abandoned
RESTART_BACKOFF = 0.5  # seconds before the first restart of a dead shard
MAX_BACKOFF = 15.0
STABLE_AFTER = 30.0  # a shard that ran this long before dying restarts without delay growth
MAX_QUICK_RESTARTS = 5
_CHILD = "from crawler.run.shard import child_main; child_main()"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# glibc gives each thread that allocates its own malloc arena, up to 8 a core, and an
# arena keeps what its thread freed: a shard of many threads holds ~8 MB more resident
# for it. Two arenas: ~17 MB less over a 2-shard crawl, within the rate's noise
# (docs/PERFORMANCE.md).
# A value the user set is kept.
SHARD_MALLOC_ARENAS = "2"


def shard_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The environment a shard process starts with, from the supervisor's."""
    env = dict(parent)
    # the child imports this crawler, wherever the parent found it
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, parent.get("PYTHONPATH")) if p)
    env.setdefault("MALLOC_ARENA_MAX", SHARD_MALLOC_ARENAS)
    return env


@dataclass
class _Shard(ShardTally):
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    report_seq: int = -1
    quick_deaths: int = 0
    restart_at: float | None = None  # when to start it again after a death


class Supervisor(Overview):
    """Runs the ``count`` shards of the crawl in ``config.data_dir``. ``run`` once."""

    def __init__(
        self,
        config: CrawlerConfig,
        count: int,
        seeds: list[str],
        *,
        log_level: int = logging.INFO,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.count = count
        self.seeds = seeds
        self.log_level = log_level
        self.probe_interval = probe_interval
        self.shards = [_Shard(i) for i in range(count)]
        self._messages: queue.Queue[tuple[int, int, dict[str, Any] | None]] = queue.Queue()
        self._stopping = False
        self._stop_sent = False
        self._finishing = False
        self._error: str | None = None
        self._limit = False
        self._seq = 0
        self._round: Round | None = None  # the last answered round
        self._round_sent = 0.0
        self._lock_fd = take_lock(self.data_dir)
        # --max-pages is one count for all the shards (crawler.run.pagelimit)
        self._page_count: str | None = None
        if config.max_pages is not None:
            self._page_count = os.path.join(self.data_dir, pagelimit.COUNT_NAME)
            try:
                pagelimit.create(self._page_count)
            except BaseException:
                os.close(self._lock_fd)
                raise
        self._config_hex = pickle.dumps(config).hex()
        self._started = time.monotonic()
        self._last_status = self._started
        self._last_fetched = 0
        self._last_status_t = self._started

    # -- controls (signal handlers call these) ---------------------------------------------

    def stop(self) -> None:
        """Stop every shard cleanly (they finish their fetches and write everything)."""
        self._stopping = True

    def kill(self) -> None:
        """Kill every shard at once (safe: as any kill -9)."""
        for s in self.shards:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.kill()

    # -- the shard processes --------------------------------------------------------------

    def _spawn(self, s: _Shard) -> None:
        s.incarnation += 1
        s.report, s.report_seq, s.final, s.restart_at = None, -1, None, None
        s.started = time.monotonic()
        env = shard_env(os.environ)
        proc = subprocess.Popen(
            # the arguments only name the shard in ps; the setup comes on stdin
            [sys.executable, "-c", _CHILD, f"shard-{s.index:02d}", self.data_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C in the terminal is ours, not theirs
            env=env,
        )
        s.proc = proc
        setup = {
            "index": s.index,
            "count": self.count,
            "config": self._config_hex,
            # every incarnation: one killed before its first commit must not lose them
            # (admission drops the ones already known)
            "seeds": self.seeds,
            "log_level": self.log_level,
            "page_count": self._page_count,
        }
        self._send(s, setup)
        if self._finishing:  # it died while the others were finishing: it finishes too
            self._send(s, {"cmd": "finish"})
        assert proc.stdout is not None
        threading.Thread(
            target=self._read, args=(s.index, s.incarnation, proc.stdout),
            name=f"shard-{s.index}-reader", daemon=True,
        ).start()
        log.debug("shard %d started (pid %d)", s.index, proc.pid)

    def _read(self, index: int, incarnation: int, out: IO[bytes]) -> None:
        for line in out:
            try:
                self._messages.put((index, incarnation, json.loads(line)))
            except ValueError:
                log.warning("shard %d: a bad protocol line: %r", index, line[:200])
        self._messages.put((index, incarnation, None))  # its stdout ended: it exited

    def _send(self, s: _Shard, message: dict[str, Any]) -> None:
        if s.proc is None or s.proc.stdin is None or s.proc.poll() is not None:
            return
        try:
            s.proc.stdin.write((json.dumps(message) + "\n").encode())
            s.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it is dying; its exit is handled when its stdout ends

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> Summary:
        try:
            for s in self.shards:
                if self._stopping:  # Ctrl-C or SIGTERM while they start: start no more
                    s.exited = True
                    continue
                self._spawn(s)
            self._maybe_status(initial=True)
            next_probe = time.monotonic()
            while not all(s.exited for s in self.shards):
                now = time.monotonic()
                if self._stopping and not self._stop_sent:
                    self._stop_sent = True
                    for s in self.shards:
                        self._send(s, {"cmd": "stop"})
                        if s.restart_at is not None:  # dead, waiting for its restart
                            s.restart_at, s.exited = None, True
                if now >= next_probe:
                    self._probe(now)
                    self._maybe_status()
                    next_probe = now + self.probe_interval
                self._restart_due(now)
                timeout = max(0.0, min(next_probe - time.monotonic(), 0.05))
                try:
                    index, incarnation, msg = self._messages.get(timeout=timeout)
                except queue.Empty:
                    continue
                self._handle(self.shards[index], incarnation, msg)
        except BaseException:
            self.kill()
            raise
        finally:
            os.close(self._lock_fd)
        return self._summary()

    def _handle(self, s: _Shard, incarnation: int, msg: dict[str, Any] | None) -> None:
        if incarnation != s.incarnation:
            return  # from a dead incarnation
        if msg is None:
            self._exited(s)
        elif "final" in msg:
            s.final = msg["final"]
        elif "report" in msg:
            s.report, s.report_seq = msg["report"], int(msg.get("seq", -1))
            if s.report.get("limit") and not self._limit:
                self._limit = True
                log.info("--max-pages reached (shard %d had more to fetch): stopping",
                         s.index)
                self._stopping = True

    def _exited(self, s: _Shard) -> None:
        assert s.proc is not None
        code = s.proc.wait()
        for pipe in (s.proc.stdin, s.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        final = s.final or {}
        s.retire()
        if final.get("limit") and not self._limit:
            self._limit = True
            self._stopping = True
        if code == 0 and (self._stopping or self._finishing or final.get("limit")):
            s.exited = True
            return
        if final.get("error") and code in (1, 3):
            self._error = f"shard {s.index}: {final['error']}"
            log.error("%s", self._error)
            s.exited = True
            self._stopping = True
            return
        if self._stopping:
            s.exited = True  # died while stopping: the next run resumes it
            return
        lived = time.monotonic() - s.started
        s.quick_deaths = 0 if lived >= STABLE_AFTER else s.quick_deaths + 1
        if s.quick_deaths > MAX_QUICK_RESTARTS:
            self._error = f"shard {s.index} died {s.quick_deaths} times in a row; giving up"
            log.error("%s", self._error)
            s.exited = True
            self._stopping = True
            return
        delay = min(MAX_BACKOFF, RESTART_BACKOFF * 2 ** max(0, s.quick_deaths - 1))
        s.restart_at = time.monotonic() + delay
        log.warning(
            "shard %d (pid %d) %s; restarting it in %.1f s",
            s.index, s.proc.pid, _describe_exit(code), delay,
        )

    def _restart_due(self, now: float) -> None:
        for s in self.shards:
            if s.restart_at is not None and now >= s.restart_at and not self._stopping:
                self._spawn(s)

    def _probe(self, now: float) -> None:
        """Ask for reports; decide completion on two consecutive answered rounds."""
        seq = self._seq
        if seq > 0:
            if all(s.report_seq == seq and s.report is not None for s in self.shards):
                self._evaluate()
            elif now - self._round_sent < ROUND_TIMEOUT:
                return  # its answers are still coming: one round at a time
            else:
                self._round = None  # a shard is down or restarting: start over
        self._seq += 1
        self._round_sent = now
        for s in self.shards:
            if not s.exited:
                self._send(s, {"cmd": "report", "seq": self._seq})

    def _evaluate(self) -> None:
        if self._finishing or self._stopping:
            return
        this = [
            (s.incarnation, int(s.report["activity"]), bool(s.report["idle"]))
            for s in self.shards
            if s.report is not None
        ]
        if quiescent(self._round, this):
            self._finishing = True
            log.debug("every shard idle twice in a row with nothing between: finishing")
            for s in self.shards:
                self._send(s, {"cmd": "finish"})
        self._round = this


def take_lock(data_dir: str, busy: str = "another crawl is running on this data directory") -> int:
    """Hold ``DIR/supervisor.lock`` (one driver per crawl, and no retry beside it); the
    fd, to close at the end. Raises DataDirError (``DIR: busy``) if someone holds it."""
    path = os.path.join(data_dir, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirError(f"{data_dir}: {busy}") from None
    return fd


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
