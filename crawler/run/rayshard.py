"""A shard as a Ray actor: the same ShardRunner a shard process drives, over a Ray link exchange.

Theory of operation
-------------------
:class:`ShardActor` is made a Ray actor by the driver (crawler.run.raydriver,
``ray.remote(**options)(ShardActor)``), so this module imports without Ray
installed until an actor is built. Its constructor opens shard ``index``'s
engine over ``DIR/shard-NN`` on its node's local disk, serves the exchange
and starts the crawl in a thread of its own, so a restart by Ray (which runs
the constructor again with the same arguments) resumes the crawl from that
directory with no call from the driver.

Its methods are the shard's controls: :meth:`admit` (a batch of links from
another shard; returns once durable here, raises to refuse), :meth:`report`
(the status snapshot of ShardRunner.report plus this incarnation's ``token``
and, once its run ended, ``final``), :meth:`finish`, :meth:`stop` and
:meth:`pid` (for tests and operators: the worker process to kill).

:class:`RayExchange` is the link exchange over actor calls: ``send`` is
``ray.get(actor.admit.remote(payload), timeout)``, each actor found by its
name (the driver names them per run: ``<crawl>-<run>-NN`` in the ``kvcrawl``
namespace). A payload is one PendDB bulk of up to 1,000 URLs (kept under Ray's
100 KiB inline limit), so a call's ~1.3 ms is paid per hundreds of links. Any Ray failure (the actor
restarting, dead, not created yet, no answer in time) is an ExchangeError:
the Forwarder keeps the batch in its outbox and retries, the same at-least-
once delivery as over Unix sockets. A send waits ``PATIENCE`` seconds, not the
whole timeout: an actor on a node that went silent is held by Ray until the node
is declared dead, and the forwarder (one message at a time) must go on serving
the other shards meanwhile; that call stays out, and the next send to its shard
fails at once until it is answered or ``timeout`` old.

The actor runs its methods in a thread pool (``max_concurrency``), so admits
from several senders and the driver's reports run side by side with the
crawl's own threads. It relies on the GIL no more than the engine does.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..config import CrawlerConfig
from ..exceptions import CrawlerError, DataDirError, ExchangeError
from ..net.raycluster import NAMESPACE
from ..state.shards import ShardPlace, open_layout, shard_dir
from .exchange import DEFAULT_TIMEOUT, Admit, LinkExchange
from .shard import EXIT_CRASHED, ShardRunner

log = logging.getLogger(__name__)

# Seconds a send waits for an owner's answer before the forwarder moves on to the other
# shards (the call stays out, up to the exchange's timeout). An admit is a write and an
# fsync: well under this even on a loaded machine; a longer one costs a duplicate send.
PATIENCE = 3.0


def actor_name(crawl: str, run: str, index: int) -> str:
    return f"{crawl}-{run}-{index:02d}"


class RayExchange(LinkExchange):
    """Shards as named Ray actors (``names[i]`` is shard i's)."""

    # Ray passes an argument of up to 100 KiB inline; a bigger one goes through the object
    # store, ~3x the cost of a call (4.2 ms against 1.35, tools/sim_exchange.py): 1,000
    # URLs of ~80 bytes stay under it.
    max_batch_urls = 1000

    def __init__(self, names: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
                 patience: float = PATIENCE) -> None:
        self.names = list(names)
        self.timeout = timeout
        self.patience = min(patience, timeout)
        self._handles: dict[int, Any] = {}
        # dest -> (an admit call that outlived our patience, when it was made)
        self._unanswered: dict[int, tuple[Any, float]] = {}
        self._admit: Admit | None = None
        self._closed = False

    def serve(self, index: int, admit: Admit) -> None:
        self._admit = admit

    def admit(self, payload: bytes) -> None:
        """The actor's ``admit``: refused (raises) until served or once closed."""
        admit = self._admit
        if admit is None or self._closed:
            raise ExchangeError(-1, "not accepting batches")
        admit(payload)

    def send(self, dest: int, payload: bytes) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        if self._closed:
            raise ExchangeError(dest, "the exchange is closed")
        self._still_unanswered(dest)
        try:
            handle = self._handles.get(dest)
            if handle is None:
                handle = self._handles[dest] = ray.get_actor(
                    self.names[dest], namespace=NAMESPACE
                )
            ref = handle.admit.remote(payload)
            ray.get(ref, timeout=self.patience)
        except ValueError as exc:  # no actor of that name (not created yet, or gone)
            raise ExchangeError(dest, f"no actor {self.names[dest]}: {exc}") from exc
        except GetTimeoutError as exc:
            # An actor on a node that went silent (a power cut) takes Ray a while to
            # declare dead, and Ray holds the call until then: the forwarder sends one
            # message at a time, so it moves on to the others and asks again later.
            self._unanswered[dest] = (ref, time.monotonic())
            raise ExchangeError(dest, f"no answer in {self.patience:.0f} s") from exc
        except RayError as exc:  # restarting, dead, or its admit refused the batch
            self._handles.pop(dest, None)
            raise ExchangeError(dest, f"{type(exc).__name__}: {_first_line(exc)}") from exc

    def _still_unanswered(self, dest: int) -> None:
        """Raise ExchangeError while ``dest`` has a call out that is neither answered
        nor older than the timeout (no second call piles up behind it). Its batch is
        still in the sender's outbox either way: an answer that came is sent again and
        deduplicated there (at least once, as ever)."""
        import ray

        out = self._unanswered.get(dest)
        if out is None:
            return
        ref, since = out
        waited = time.monotonic() - since
        ready, _ = ray.wait([ref], timeout=0)
        if not ready and waited < self.timeout:
            raise ExchangeError(dest, f"an earlier batch is unanswered for {waited:.0f} s")
        del self._unanswered[dest]
        if not ready:
            self._handles.pop(dest, None)  # given up on: find the actor afresh

    def close(self) -> None:
        self._closed = True
        self._handles.clear()
        self._unanswered.clear()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _must_be_here(directory: str, index: int) -> None:
    import ray

    if os.path.isdir(os.path.join(directory, "main")):
        return
    node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    raise DataDirError(
        f"{directory} is not on this node ({node}), where ray.json says shard {index} "
        "ran: copy its directory here (docs/SHARDS.md), or point ray.json at the node "
        "that has it (move-shard); started empty it would lose its pages and pending URLs")


class ShardActor:
    """Shard ``index`` of ``count`` of the crawl ``config`` describes (``config.data_dir``:
    the crawl's top directory, the same path on every node)."""

    def __init__(
        self,
        config: CrawlerConfig,
        index: int,
        count: int,
        names: Sequence[str],
        seeds: Sequence[str],
        log_level: int = logging.INFO,
        ran_here: bool = False,
    ) -> None:
        """``ran_here``: ray.json records that this shard has run on its node, so its
        directory must be here (a forgotten copy after a reshard or move-shard would
        otherwise start it empty, losing its pages and pending URLs)."""
        place = ShardPlace(index, count)
        logging.basicConfig(
            level=log_level,
            stream=sys.stderr,
            format=f"%(asctime)s %(levelname)s shard-{index:02d} %(name)s: %(message)s",
        )
        self.token = uuid.uuid4().hex  # this incarnation: a restart is a new token
        self.error: str | None = None
        self.final: dict[str, Any] | None = None
        self.exchange = RayExchange(names)
        self.runner: ShardRunner | None = None
        try:
            # this node's copy of the layout: pages/export on this node read it
            open_layout(config.data_dir, count)
            if ran_here:
                _must_be_here(shard_dir(config.data_dir, index, count), index)
            self.runner = ShardRunner(config, place, self.exchange, seeds)
        except (CrawlerError, OSError) as exc:  # a bad directory: say it, do not crash-loop
            log.error("shard %d: %s", index, exc)
            self.error = str(exc)
            return
        threading.Thread(target=self._run, name="shard-run", daemon=True).start()

    def _run(self) -> None:
        assert self.runner is not None
        try:
            complete = self.runner.run()
        except CrawlerError as exc:
            log.error("%s", exc)
            self.error = str(exc)
            self.final = {**self.runner.final(False), "error": str(exc)}
            return
        except Exception:  # noqa: BLE001 - a bug: die so that Ray restarts the shard
            log.exception("shard %d: unexpected error", self.runner.place.index)
            logging.shutdown()
            os._exit(EXIT_CRASHED)
        self.final = self.runner.final(complete)

    def admit(self, payload: bytes) -> None:
        self.exchange.admit(payload)

    def report(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "pid": os.getpid(),
            "error": self.error,
            "final": self.final,
            "report": self._report(),
        }

    def _report(self) -> dict[str, Any] | None:
        runner = self.runner
        if runner is None or self.final is not None:
            return None
        try:
            return runner.report()
        except Exception:  # noqa: BLE001 - its run is closing the engine: no report this round
            return None

    def finish(self) -> None:
        if self.runner is not None:
            self.runner.finish()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()

    def pid(self) -> int:
        return os.getpid()
