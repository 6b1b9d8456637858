"""The pieces of tools/sim_exchange.py that run inside the Ray actors: a synthetic web and a shard.

:class:`SynthWeb` is a bounded web of ``pages`` pages spread over ``hosts``
hosts, generated from the URL alone (no I/O): page ``i`` is
``http://h{i % hosts}.sim/p{i}``; its links are its two children in a binary
tree over all pages (``2i+1``, ``2i+2``: every page is reachable from page 0
in log2(pages) hops, so a crawl from page 0 fetches the whole web) and
``links - 2`` more, drawn from the URL's SHAKE-128 hash (deterministic,
and cheap next to the frontier's work): a share ``same_host`` to a random
page of the same host, the rest to a random page anywhere.

:class:`SimShard` is one shard with a synthetic fetcher: a real Frontier
(kvstore files in its directory, the shard's Router, so the committer splits
links between its PendDB and its outbox exactly as a real shard's does), a
real Forwarder emptying that outbox over the real RayExchange, and an
``admit`` that makes received batches durable through ``Frontier.receive``
before it returns (what ShardRunner's admit does). Two threads stand in for
the engine's: a feeder claims bulks, "fetches" each URL (one constant page
record, the links from SynthWeb keyed as the engine keys them) and submits
an Outcome; a committer commits, with the engine's sleeps and queue bound.
The synthetic part of a fetch costs ~15 us a page and keying its links ~20 us
(a real worker pays that too); the rest is the frontier's, the outbox's and the
exchange's work, whose throughput the simulation measures (the feeder's and
the committer's busy seconds are reported, so the split can be checked).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from hashlib import shake_128
from typing import Any

from crawler.exceptions import DataDirError
from crawler.run.exchange import DEFAULT_BATCH_URLS, DEFAULT_LINGER, Forwarder
from crawler.run.rayshard import RayExchange
from crawler.run.shard import ADMIT_TIMEOUT
from crawler.state.frontier import Claimed, Frontier, Outcome
from crawler.state.pages import PageRecord, Pending, decode_bulk, encode_page
from crawler.state.shards import Router, ShardPlace, shard_dir
from crawler.web.urls import url_key

FEED_BULKS = 64  # bulks claimed per feeder pass (the engine's)
FEED_SLEEP = 0.02  # seconds the feeder waits when there was nothing to claim (the engine's)
COMMIT_SLEEP = 0.005  # seconds the committer waits when nothing was queued (the engine's)
MAX_QUEUED = 64  # outcomes uncommitted before submit waits (the engine's: --threads, 64)


@dataclass(frozen=True, slots=True)
class SynthWeb:
    pages: int
    hosts: int
    links: int  # links per page (at least the two tree links)
    same_host: float  # share of the random links that stay on the page's host

    def url(self, i: int) -> str:
        return f"http://h{i % self.hosts}.sim/p{i}"

    def page_of(self, url: str) -> int:
        return int(url.rpartition("/p")[2])

    def links_of(self, i: int) -> list[str]:
        """The page's links as normalized URLs, each once, in a fixed order."""
        p, hosts = self.pages, self.hosts
        h = i % hosts
        out = [j for j in (2 * i + 1, 2 * i + 2) if j < p]
        extra = max(0, self.links - 2)
        if extra:
            # two 32-bit draws a link from the URL's hash: cheap, so the fetch stays
            # a small share of a shard's time
            digest = shake_128(self.url(i).encode()).digest(8 * extra)
            draws = struct.unpack(f"<{2 * extra}I", digest)
            on_host = (p - 1 - h) // hosts + 1  # pages h, h+H, h+2H... below p
            cut = int(self.same_host * 2**32)
            for k in range(0, 2 * extra, 2):
                if draws[k] < cut:
                    out.append(h + hosts * (draws[k + 1] % on_host))
                else:
                    out.append(draws[k + 1] % p)
        return [f"http://h{j % hosts}.sim/p{j}" for j in dict.fromkeys(out)]


class TimedRayExchange(RayExchange):
    """RayExchange whose ``send`` is timed (the Forwarder's thread is its only caller)."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(names)
        self.calls = 0
        self.seconds = 0.0
        self.bytes = 0

    def send(self, dest: int, payload: bytes) -> None:
        started = time.perf_counter()
        try:
            super().send(dest, payload)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1
            self.bytes += len(payload)


class Sink:
    """An actor whose ``admit`` does nothing: RayExchange.send to it costs Ray alone."""

    def admit(self, payload: bytes) -> None:
        pass


class SimShard:
    """Shard ``index`` of ``count`` over ``shard_dir(data_dir, index, count)``: a Ray actor
    (``ray.remote(SimShard)``, threaded: admits run beside the loop)."""

    def __init__(
        self,
        web: SynthWeb,
        index: int,
        count: int,
        names: Sequence[str],
        data_dir: str,
        seeds: Sequence[int],
        batch_urls: int = DEFAULT_BATCH_URLS,
        linger: float = DEFAULT_LINGER,
    ) -> None:
        self.web = web
        self.router = Router(ShardPlace(index, count))
        self.frontier = Frontier(
            shard_dir(data_dir, index, count), router=self.router, max_queued=MAX_QUEUED
        )
        self.exchange = TimedRayExchange(names)
        outbox = self.frontier.outbox
        self.forwarder = (
            Forwarder(outbox, self.exchange, batch_urls=batch_urls, linger=linger)
            if outbox is not None
            else None
        )
        self.exchange.serve(index, self._admit)
        mine = [web.url(i) for i in seeds if self.router.ours(web.url(i))]
        self.frontier.add_seeds([Pending(u) for u in mine])  # as Engine.add_seeds filters
        # one body-less 200 record for every page: a real page's cost (fetch, parse,
        # encode) is the workers', not what this measures
        self._record = encode_page(PageRecord(url="", status=200, fetched_at=0.0, depth=0))
        self.fetched = bytearray(web.pages)  # fetches of each page (saturates at 255)
        self.misrouted = 0  # pages claimed here that another shard owns
        self.offered = 0  # links submitted with outcomes
        self.received_batches = self.received_urls = 0
        self.admit_seconds = 0.0
        self._admit_lock = threading.Lock()
        self.started = self.last_active = 0.0
        self.error: str | None = None
        self.fetch_seconds = self.commit_seconds = self.sync_seconds = 0.0
        self.syncs = 0
        pend = self.frontier.pend
        pend.sync = self._timed_sync(pend.sync)  # type: ignore[method-assign]
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._guard, args=(loop,), name=loop.__name__, daemon=True)
            for loop in (self._feed_loop, self._commit_loop)
        ]

    # -- the actor's methods ---------------------------------------------------------

    def pid(self) -> int:
        return os.getpid()

    def start(self) -> None:
        self.started = self.last_active = time.monotonic()
        if self.forwarder is not None:
            self.forwarder.start()
        for t in self._threads:
            t.start()

    def admit(self, payload: bytes) -> None:
        self.exchange.admit(payload)

    def report(self) -> dict[str, Any]:
        """What completion is decided on, as ShardRunner.report gives it."""
        activity = self.frontier.commits  # first: a commit between the reads is activity
        outbox = self.frontier.outbox
        idle = self.frontier.idle() and (outbox is None or outbox.empty())
        return {"activity": activity, "idle": idle, "error": self.error}

    def finish(self) -> dict[str, Any]:
        """Stop the loop, the forwarder and the exchange, close the frontier (in
        ShardRunner's order); the counters and per-page fetch counts."""
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join()
        if self.forwarder is not None:
            self.forwarder.stop()
        self.exchange.close()
        self.frontier.close()
        fw, ex = self.forwarder, self.exchange
        return {
            "pid": os.getpid(),
            "error": self.error,
            "started": self.started,
            "last_active": self.last_active,
            "fetched": sum(self.fetched),
            "fetched_pages": bytes(self.fetched),
            "misrouted": self.misrouted,
            "offered": self.offered,
            "admitted": self.frontier.admitted,
            "commits": self.frontier.commits,
            "sent_batches": fw.sent_batches if fw else 0,
            "sent_urls": fw.sent_urls if fw else 0,
            "send_failures": fw.failures if fw else 0,
            "send_calls": ex.calls,
            "send_seconds": ex.seconds,
            "send_bytes": ex.bytes,
            "received_batches": self.received_batches,
            "received_urls": self.received_urls,
            "admit_seconds": self.admit_seconds,
            "fetch_seconds": self.fetch_seconds,
            "commit_seconds": self.commit_seconds,
            "syncs": self.syncs,
            "sync_seconds": self.sync_seconds,
        }

    # -- inside ------------------------------------------------------------------------

    def _admit(self, payload: bytes) -> None:
        """ShardRunner._admit, timed: durable here (written, flushed, fsynced) or raises."""
        started = time.perf_counter()
        entries = decode_bulk(payload)
        done = self.frontier.receive(entries)
        if not done.wait(ADMIT_TIMEOUT):
            raise DataDirError("the committer did not write the batch in time")
        with self._admit_lock:
            self.received_batches += 1
            self.received_urls += len(entries)
            self.admit_seconds += time.perf_counter() - started

    def _timed_sync(self, sync: Callable[[], None]) -> Callable[[], None]:
        """PendDB's fsync, timed: a commit that received batches fsyncs before the admits
        return (the periodic fsync of the syncer thread is counted too)."""

        def timed() -> None:
            started = time.perf_counter()
            sync()
            with self._admit_lock:  # the committer's and the syncer thread's
                self.sync_seconds += time.perf_counter() - started
                self.syncs += 1

        return timed

    def _guard(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which fails the run
            self.error = f"{loop.__name__}: {type(exc).__name__}: {exc}"

    def _feed_loop(self) -> None:
        """The engine's feeder and workers in one: claim, "fetch", submit."""
        frontier = self.frontier
        while not self._stop.is_set():
            worked = False
            for _ in range(FEED_BULKS):
                claimed = frontier.claim()
                if claimed is None:
                    break
                worked = True
                for c in claimed:
                    t = time.perf_counter()
                    outcome = self._fetch(c)
                    self.fetch_seconds += time.perf_counter() - t
                    frontier.submit(outcome)  # waits while MAX_QUEUED are uncommitted
            if worked:
                self.last_active = time.monotonic()
            else:
                time.sleep(FEED_SLEEP)

    def _commit_loop(self) -> None:
        """Engine._commit_loop: commit what is queued (outcomes, received batches)."""
        frontier = self.frontier
        while not self._stop.is_set():
            started = time.perf_counter()
            n = frontier.commit()
            self.commit_seconds += time.perf_counter() - started
            if n:
                self.last_active = time.monotonic()
            else:
                time.sleep(COMMIT_SLEEP)

    def _fetch(self, c: Claimed) -> Outcome:
        """The synthetic fetch: the constant record, and the page's links keyed as the
        engine's ResponseReader keys them."""
        entry = c.entry
        i = self.web.page_of(entry.url)
        if self.fetched[i] < 255:
            self.fetched[i] += 1
        if not self.router.ours(entry.url):
            self.misrouted += 1
        urls = self.web.links_of(i)
        depth = entry.depth + 1
        links = [(url_key(u), Pending(u, depth)) for u in urls]
        self.offered += len(links)
        return Outcome(c, self._record, links=links)
