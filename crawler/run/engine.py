"""The crawl loop: a feeder, a committer and a pool of worker threads.

Theory of operation
-------------------
The *feeder* (the main thread) claims random bulks from the frontier while the
scheduler has room, and offers each URL to its host's wait list (a URL whose
host list is full goes back to PendDB). *Workers* (``threads`` of them, small
stacks) take the next task whose host may be contacted and hand it the host's
slot: a page of the frontier (crawler.run.pagework), a sitemap
(crawler.run.sitemaps) or a rendering page's request (crawler.run.subfetch), each
through the same gate before its request (BadHosts, DNS, robots.txt:
crawler.run.gate) and the same vocabulary of outcomes (crawler.outcomes). A page
becomes a page record and the links worth admitting (crawler.run.responses), an
Outcome the frontier commits. The *committer* writes
outcomes in the frontier's crash-safe order. With --render-js, a fetched HTML
page of a rendered host is handed to the render pool instead (crawler.run.render),
which submits its Outcome once the page is rendered; the requests the page
makes in the browser come back here as SubTasks (crawler.run.subfetch).

A URL ends as exactly one recorded outcome (a page, a redirect, an HTTP error,
or a failure reason) or goes back to PendDB to be tried later (a transient
error within its retry budget). The designed outcome of each fault of the
hostile web is tabled in docs/HOSTILE.md; in short:

- transient failures (timeouts, resets, 429/5xx) back the *host* off: it is
  not contacted for ``backoff`` seconds, doubled per consecutive failure of
  the host (capped at ``max_retry_after``), or for Retry-After on 429/503;
  the URL is retried up to ``max_retries`` times, then recorded;
- hosts that cannot be reached at all (DNS failures, refused connections,
  bad certificates) go to BadHosts with a retry time, and their other URLs
  are recorded without touching the network meanwhile;
- robots.txt that gives 5xx / 429 / no answer means "disallow for now": the
  host's URLs wait (kept in its wait list) while robots.txt is fetched again
  after the host's backoff, up to ``max_retries`` more times; after that
  they are recorded ``robots_unavailable`` until the next robots.txt retry.
  robots.txt is read through its own Fetcher capped just above the 512 KiB
  the parser reads, whatever the page limits.

Memory: every URL fetched takes a lease on the shard's budget of bytes in flight
(crawler.run.budget, ``memory_budget``): the fetcher counts the body as it arrives,
link extraction each piece it parses, the page work the record it encodes; a worker
that would pass the budget waits, the oldest lease never does. docs/HOSTILE.md has
the numbers.

Stopping: the feeder stops claiming, waiting URLs are dropped from memory
(their bulks stay live in PendDB), workers finish their fetch, the committer
writes everything, the stores close. A kill -9 at any point loses at most the
URLs in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import outcomes
from ..config import CrawlerConfig, Scope
from ..exceptions import CrawlerError, DataDirError, DiskFullError, URLError
from ..net.auth import load_netrc
from ..net.dnscache import DNSCache
from ..net.fetch import READ_CHUNK, Fetcher
from ..net.proxy import proxy_map
from ..state.badhosts import BadHosts
from ..state.cookiestore import CookieJar
from ..state.frontier import DISK_FULL_ERRNOS, Frontier
from ..state.pages import Pending
from ..state.shards import Router, ShardPlace
from ..web.links import parse_bound
from ..web.robots import product_token
from ..web.urls import normalize, parse
from . import status as status_mod
from .budget import BUDGET_QUANTUM, MemoryBudget, return_large_blocks
from .counters import Counters
from .gate import Gate
from .pagework import RECORD_SLACK, PageWork, Recorder
from .politeness import Scheduler
from .render import RenderPool
from .responses import ResponseReader
from .revisit import Revisits
from .robotsgate import ROBOTS_FETCH_BYTES, ROBOTS_MAX_REDIRECTS, RobotsGate
from .sitemaps import Sitemaps
from .subfetch import SubRequests, render_subfetch

__all__ = ["ROBOTS_MAX_REDIRECTS", "Engine", "largest_lease"]

log = logging.getLogger(__name__)

# Bulks claimed per feeder pass (then the status line gets its turn).
_FEED_BULKS = 64


def largest_lease(max_decoded_bytes: int) -> int:
    """The most one URL's lease holds: its body as the fetcher keeps it (1/8 buffer
    slack, a read in hand), then the larger of its parse and its record's encoding.
    The default budget is twice this: the oldest lease can always finish, and as
    much again is shared by the others (crawler.run.budget)."""
    body = max_decoded_bytes + max_decoded_bytes // 8 + 2 * READ_CHUNK
    record = 2 * max_decoded_bytes + RECORD_SLACK
    return body + max(parse_bound(max_decoded_bytes), record) + BUDGET_QUANTUM


class Engine:
    """One crawl over one data directory. ``run()`` blocks until done or stopped.

    It builds the crawl's parts and runs the threads; what a request goes through is
    the gate's and the tasks' (see the module docstring)."""

    def __init__(self, config: CrawlerConfig, *, place: ShardPlace | None = None) -> None:
        self.config = config
        self.place = place or ShardPlace()
        # every fetcher's (pages, robots.txt, sitemaps, subrequests); a bad one: ConfigError
        self.proxies = proxy_map(config.proxy)
        for target, via in sorted(self.proxies.items()):  # str(via): no credentials
            log.info("%s URLs are fetched through the proxy %s", target, via)
        self.scope = Scope(config)
        # One shard of several: links for other shards' hosts go to the frontier's outbox.
        self.router = Router(self.place) if self.place.count > 1 else None
        self.reader = ResponseReader(config, self.scope, product_token(config.user_agent))
        # a recrawl's or --revisit-after's conditional GETs (prior/ records)
        self.revisits = Revisits(config.data_dir, create=bool(config.revisit_after))
        self.frontier = Frontier(
            config.data_dir,
            sync_interval=config.sync_interval,
            max_queued=config.threads,
            router=self.router,
            track_depth=config.max_depth is not None,  # BFS-exact depth (state.depths)
            expand=self.reader.expand,
            revisit_after=config.revisit_after or None,
            prior=self.revisits.store,
        )
        self.bad_hosts = BadHosts(config.data_dir)
        # the pages' cookies (robots.txt, sitemaps and a rendering page's requests go without)
        self.cookies = CookieJar(config.data_dir) if config.cookies else None
        self.dns = DNSCache(
            list(config.nameservers) or None,
            timeout=config.dns_timeout,
            allow_private_ips=config.allow_private_ips,
        )
        # bodies held and parse buffers, shard-wide (docs/HOSTILE.md, "Memory")
        largest = largest_lease(config.max_decoded_bytes)
        self.budget = MemoryBudget(config.memory_budget or 2 * largest, largest)
        return_large_blocks()  # so that freed bodies leave the process (crawler.run.budget)
        self.counters = Counters()
        # read here, by each shard, so no secret travels in a config or a settings file
        self.credentials = load_netrc(config.netrc) if config.netrc else None
        self.fetcher = self._fetcher(config.max_body_bytes, config.max_decoded_bytes)
        self.robots_fetcher = self._fetcher(ROBOTS_FETCH_BYTES, ROBOTS_FETCH_BYTES)
        self.scheduler = Scheduler(
            per_host=config.per_host,
            delay=config.delay,
            max_waiting=config.waiting_limit,
            max_waiting_per_host=config.max_waiting_per_host,
        )
        self.robots_gate = RobotsGate(
            config, self.scheduler, self.robots_fetcher, count=self.counters.count
        )
        self.robots = self.robots_gate.cache  # the parsed robots.txt of each host
        self.robots_store = self.robots_gate.store
        self.gate = Gate(config, scheduler=self.scheduler, bad_hosts=self.bad_hosts,
                         dns=self.dns, robots=self.robots_gate)
        self._stopping = threading.Event()
        self._limit_reached = threading.Event()
        self._workers: list[threading.Thread] = []
        self._workers_done = threading.Event()  # tells the committer to drain and stop
        self._finish = threading.Event()  # a shard: every shard is idle, the crawl is complete
        self.failure: CrawlerError | None = None  # why the crawl stopped on its own, if it did
        self._counts_lock = threading.Lock()  # status_counts against the stores' close
        self._final_counts: dict[str, Any] | None = None
        self.sitemaps = Sitemaps(
            config, scheduler=self.scheduler, gate=self.gate, frontier=self.frontier,
            reader=self.reader, scope=self.scope, robots=self.robots, counters=self.counters,
            stopping=self._stopping, fetcher=self._fetcher,
        ) if config.sitemaps != "off" else None
        record = Recorder(config, self.revisits, self.counters)
        self.subrequests = SubRequests(self.scheduler, self.gate, self.fetcher, self.counters,
                                       self._stopping, config.max_url_length)
        self.renderer = (
            RenderPool(config, subfetch=render_subfetch(self.subrequests), reader=self.reader,
                       record=record, frontier=self.frontier)
            if config.rendering else None
        )
        self.pages = PageWork(
            config, self.scheduler, self.gate, self.fetcher, self.frontier, self.reader,
            self.revisits, self.counters, self.budget, record, self.sitemaps, self.renderer,
            self.stop, self._limit_reached, cookies=self.cookies,
        )
        # Alone, the engine logs the status line; a shard's supervisor logs the crawl's.
        self.reporter = status_mod.Reporter(
            self.status_counts, data_dir=config.data_dir, interval=config.status_interval,
            log_line=self.place.count == 1,
        )

    def _fetcher(self, max_body_bytes: int, max_decoded_bytes: int) -> Fetcher:
        cfg = self.config
        return Fetcher(
            user_agent=cfg.user_agent,
            resolve=self.dns.resolve,
            connect_timeout=cfg.connect_timeout,
            read_timeout=cfg.read_timeout,
            total_timeout=cfg.total_timeout,
            max_body_bytes=max_body_bytes,
            max_decoded_bytes=max_decoded_bytes,
            ca_bundle=cfg.ca_bundle,
            added_headers=cfg.headers,
            credentials=self.credentials,
            http2=cfg.http2,
            proxies=self.proxies,
        )

    # -- seeds ----------------------------------------------------------------

    def add_seeds(self, seeds: list[str]) -> None:
        entries = []
        for seed in seeds:
            try:
                entries.append(Pending(normalize(seed, max_length=self.config.max_url_length)))
            except URLError as exc:
                raise CrawlerError(f"bad seed URL: {exc}") from None
        if self.router is not None:  # every shard is given every seed: each keeps its own
            entries = [e for e in entries if self.router.ours(e.url)]
        self.frontier.add_seeds(entries)

    # -- running ----------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()
        self.scheduler.close()

    def finish(self) -> None:
        """A shard: the crawl is complete (every shard was seen idle, with nothing
        sent between them), so ``run()`` returns True once this one is idle."""
        self._finish.set()

    def abort_fetches(self) -> None:
        """Cut the fetches in flight (they end "aborted" and are requeued): for a stop
        that cannot wait for slow hosts. Thread-safe."""
        self.fetcher.close()
        self.robots_fetcher.close()
        if self.sitemaps is not None:
            self.sitemaps.fetcher.close()
        if self.renderer is not None:
            self.renderer.browser.close()

    @property
    def stopping_event(self) -> threading.Event:
        """Set once the crawl stops (for threads that watch it)."""
        return self._stopping

    @property
    def limit_reached(self) -> bool:
        return self._limit_reached.is_set()

    def idle(self) -> bool:
        """Nothing to fetch, commit or hand to another shard right now. Thread-safe."""
        outbox = self.frontier.outbox
        return (
            self.scheduler.idle()
            and self.frontier.idle()
            and (outbox is None or outbox.empty())
            and (self.renderer is None or self.renderer.idle())
        )

    def run(self, *, before_close: Callable[[], None] | None = None) -> bool:
        """Crawl until complete (True) or stopped / limit reached (False).

        Alone, the crawl is complete when nothing is pending; a shard of several
        waits, idle, for :meth:`finish`. ``before_close`` runs once the workers and
        the committer are done, before the stores close (a shard stops its link
        exchange there). Raises DiskFullError (after a clean stop) when the data
        directory ran out of space, and DataDirError when a commit failed otherwise."""
        cfg = self.config
        if self.renderer is not None:
            try:
                self.renderer.start()  # a browser that cannot start fails the crawl now
            except CrawlerError:
                self.close()
                raise
        committer = threading.Thread(target=self._commit_loop, name="committer", daemon=True)
        committer.start()
        old_stack = threading.stack_size(cfg.stack_size)
        try:
            for i in range(cfg.threads):
                if self._stopping.is_set():  # a stop while thousands start: no more of them
                    break
                t = threading.Thread(target=self._work_loop, name=f"worker-{i}", daemon=True)
                t.start()
                self._workers.append(t)
        finally:
            threading.stack_size(old_stack)
        reporter = self.reporter
        reporter.report()  # status.json says from now on that this run is on (or was killed)
        complete = False
        try:
            while not self._stopping.is_set():
                fed = self._feed()
                if (not fed and self.idle() and not cfg.revisit_after
                        and (self.router is None or self._finish.is_set())):
                    complete = True  # (a revisiting crawl runs until stopped)
                    break
                reporter.maybe_report()
                if not fed:
                    time.sleep(0.02)
        finally:
            self._stopping.set()
            self.scheduler.close()
            if self.renderer is not None:  # pages not rendered yet go back to PendDB
                self.renderer.stop()
            for task in self.scheduler.drain():  # pages' bulks stay live in PendDB
                task.drop()
            for t in self._workers:
                t.join()
            self._workers_done.set()
            committer.join()
            if before_close is not None:
                before_close()
            reporter.report(final=True)
            with self._counts_lock:  # a report asked for from now on gets these counts
                self._final_counts = self._status_counts()
                self.close()
        if self.failure is not None:
            raise self.failure
        return complete

    def close(self) -> None:
        self.frontier.close()
        self.bad_hosts.close()
        if self.cookies is not None:
            self.cookies.close()
        self.robots_store.close()
        self.fetcher.close()
        self.robots_fetcher.close()
        if self.sitemaps is not None:
            self.sitemaps.close()
        self.revisits.close()

    def _feed(self) -> bool:
        """Claim bulks while the scheduler has room; True if any URL was taken on.

        A URL whose host's wait list is full goes back to its bulk (Frontier.release:
        nothing written); two bulks in a row of which nothing was taken end the round,
        so a crawl held up by a few busy hosts does not spin on their bulks."""
        fed = False
        refused_bulks = 0
        for _ in range(_FEED_BULKS):  # bounded, so the status line is not starved
            if not self.scheduler.has_room() or self._limit_reached.is_set():
                break
            claimed = self.frontier.claim()
            if claimed is None:
                break
            taken = not claimed  # a claim with nothing left to do ends its bulk: progress
            for c in claimed:
                try:
                    u = parse(c.entry.url)  # the only split of this URL's string
                except URLError:
                    self.pages.submit(c, self.pages.record(c, 0, outcomes.BAD_URL))
                    taken = True
                    continue
                if self.scheduler.offer(u.host, self.pages.task(c, u)):
                    taken = True
                else:
                    self.frontier.release(c)
            if taken:
                fed, refused_bulks = True, 0
            else:
                refused_bulks += 1
                if refused_bulks >= 2:
                    break
        return fed

    def _commit_loop(self) -> None:
        while True:
            done = self._workers_done.is_set()  # read before committing: nothing can follow it
            try:
                n = self.frontier.commit()
            except OSError as exc:
                if exc.errno in DISK_FULL_ERRNOS:
                    self.failure = DiskFullError(self.config.data_dir, exc)
                    log.error("%s", self.failure)
                else:
                    self.failure = DataDirError(f"{self.config.data_dir}: write failed: {exc}")
                    log.exception("commit failed; stopping the crawl")
                self.stop()
                return
            except Exception as exc:  # noqa: BLE001 - a failed commit must stop the crawl
                self.failure = DataDirError(f"{self.config.data_dir}: commit failed: {exc!r}")
                log.exception("commit failed; stopping the crawl")
                self.stop()
                return
            if done and n == 0:
                return
            if n == 0:
                time.sleep(0.005)

    def _work_loop(self) -> None:
        while not self._stopping.is_set():
            item = self.scheduler.next()  # returns None once stop() closes the scheduler
            if item is not None:
                slot, task = item
                task.serve(slot)  # a page, a sitemap or a subrequest: each releases the slot

    # -- status -------------------------------------------------------------------

    def status_counts(self) -> dict[str, Any]:
        """The crawl's counts for a status snapshot (crawler.run.status). Thread-safe;
        asked after the stores closed (a shard's supervisor asks when it likes), the
        counts they had then."""
        with self._counts_lock:
            if self._final_counts is not None:
                return dict(self._final_counts)
            return self._status_counts()

    def _status_counts(self) -> dict[str, Any]:
        counts = self.counters.snapshot()
        frontier = self.frontier.counts()
        outbox = self.frontier.outbox
        out: dict[str, Any] = {
            "shard": self.place.index,
            "shards": self.place.count,
            "outbox": outbox.urls() if outbox is not None else 0,
            "fetched": counts.fetched,
            "done": frontier["done"],
            "pending": frontier["pending"],
            "in_flight": frontier["in_flight"],
            "waiting": self.scheduler.waiting,
            "delayed_hosts": self.scheduler.delayed(),
            "hosts": self.scheduler.hosts(),
            "bad_hosts": len(self.bad_hosts),
            # URLs a shorter path reached after they were admitted (--max-depth), and
            # pages that could not be read again for it (stored without their body)
            "depth_improved": self.frontier.depths.improved,
            "depth_not_reread": self.reader.not_reread,
            "outcomes": counts.outcomes,
            "mb": round(counts.bytes / 1e6, 1),
            "bytes": counts.bytes,
            "uncommitted": frontier["uncommitted"],
            "memory": self.budget.snapshot(),  # bytes in flight (docs/HOSTILE.md, "Memory")
            "sitemaps": self.sitemaps.snapshot() if self.sitemaps is not None else {},
        }
        due = self.frontier.due
        if due is not None:  # --revisit-after: re-queued this run, and waiting for their time
            out.update(revisits=self.frontier.revisits, revisits_waiting=due.waiting)
        if self.renderer is not None:
            browser_rss = status_mod.tree_rss_bytes(self.renderer.browser.pid)
            out.update(self.renderer.counts(), subrequests=counts.subrequests,
                       browser_rss_mb=round(browser_rss / 1e6, 1))
        return out
