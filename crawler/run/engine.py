"""The crawl loop: a feeder, a committer and a pool of worker threads.

Theory of operation
-------------------
The *feeder* (the main thread) claims random bulks from the frontier while the
scheduler has room, and offers each URL to its host's wait list (a URL whose
host list is full goes back to PendDB). *Workers* (``threads`` of them, small
stacks) take the next URL whose host may be contacted, run it through the
checks (per-host page limit, BadHosts, DNS, robots.txt: crawler.run.robotsgate),
fetch it, turn the response into a page record and the links worth admitting
(crawler.run.responses), and submit that Outcome. The *committer* writes
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
link extraction each piece it parses, the engine the record it encodes; a worker
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..config import CrawlerConfig, Scope
from ..exceptions import CrawlerError, DataDirError, DiskFullError, DNSError, FetchError, URLError
from ..net.dnscache import DNSCache
from ..net.fetch import READ_CHUNK, Fetcher, FetchResult, parse_retry_after
from ..state.badhosts import BadHosts
from ..state.frontier import DISK_FULL_ERRNOS, Claimed, Frontier, Outcome
from ..state.pages import PageRecord, Pending, encode_page
from ..state.shards import Router, ShardPlace
from ..web.links import is_html, parse_bound
from ..web.robots import product_token
from ..web.urls import URL, normalize, parse
from . import status as status_mod
from .budget import BUDGET_QUANTUM, Lease, MemoryBudget, return_large_blocks
from .politeness import HostSlot, Scheduler
from .render import RenderJob, RenderPool
from .responses import ResponseReader
from .revisit import Revisits
from .robotsgate import HOST_FAILURES, ROBOTS_FETCH_BYTES, ROBOTS_MAX_REDIRECTS, RobotsGate, Wait
from .sitemaps import Sitemaps, SitemapTask
from .subfetch import SubTask, render_subfetch

__all__ = ["ROBOTS_MAX_REDIRECTS", "Engine"]

log = logging.getLogger(__name__)

# Bulks claimed per feeder pass (then the status line gets its turn).
_FEED_BULKS = 64
# Failures worth another try later (within the retry budget), after a host backoff.
_TRANSIENT = {"read_timeout", "total_timeout", "reset", "protocol"}
# How long a URL of a rendered host waits when the render pool is full.
_RENDER_FULL_WAIT = 0.05
# A page record's encoding holds its compressed body and the record (each at most
# about the body) beside the body; this covers its header and link list besides.
_RECORD_SLACK = 1 << 20


def largest_lease(max_decoded_bytes: int) -> int:
    """The most one URL's lease holds: its body as the fetcher keeps it (1/8 buffer
    slack, a read in hand), then the larger of its parse and its record's encoding.
    The default budget is twice this: the oldest lease can always finish, and as
    much again is shared by the others (crawler.run.budget)."""
    body = max_decoded_bytes + max_decoded_bytes // 8 + 2 * READ_CHUNK
    record = 2 * max_decoded_bytes + _RECORD_SLACK
    return body + max(parse_bound(max_decoded_bytes), record) + BUDGET_QUANTUM


class _Task(NamedTuple):
    """What waits in the scheduler: a claimed URL and its parts, split once at claim."""

    claimed: Claimed
    url: URL


@dataclass(frozen=True, slots=True)
class _Result:
    outcome: Outcome | None  # None: the URL went back to its host's wait list (unless handed)
    not_before: float = 0.0  # monotonic time before which the host is not contacted again
    contacted: bool = True  # False: decided without a request, the host owes no delay
    handed: bool = False  # the task is someone else's now (the render pool, a subrequest)


class Engine:
    """One crawl over one data directory. ``run()`` blocks until done or stopped."""

    def __init__(self, config: CrawlerConfig, *, place: ShardPlace | None = None) -> None:
        self.config = config
        self.place = place or ShardPlace()
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
        self.dns = DNSCache(
            list(config.nameservers) or None,
            timeout=config.dns_timeout,
            allow_private_ips=config.allow_private_ips,
        )
        # bodies held and parse buffers, shard-wide (docs/HOSTILE.md, "Memory")
        largest = largest_lease(config.max_decoded_bytes)
        self.budget = MemoryBudget(config.memory_budget or 2 * largest, largest)
        return_large_blocks()  # so that freed bodies leave the process (crawler.run.budget)
        self.fetcher = self._fetcher(config.max_body_bytes, config.max_decoded_bytes)
        self.robots_fetcher = self._fetcher(ROBOTS_FETCH_BYTES, ROBOTS_FETCH_BYTES)
        self.scheduler = Scheduler(
            per_host=config.per_host,
            delay=config.delay,
            max_waiting=config.waiting_limit,
            max_waiting_per_host=config.max_waiting_per_host,
        )
        self.robots_gate = RobotsGate(
            config, self.scheduler, self.robots_fetcher, count=self._count
        )
        self.robots = self.robots_gate.cache  # the parsed robots.txt of each host
        self.robots_store = self.robots_gate.store
        self.sitemaps = Sitemaps(self) if config.sitemaps != "off" else None
        self.stats_lock = threading.Lock()  # guards outcomes, fetched, bytes
        self.outcomes: Counter[str] = Counter()
        self.fetched = 0
        self.bytes = 0
        self.subrequests = 0  # requests made for pages rendering in the browser
        self._stopping = threading.Event()
        self._limit_reached = threading.Event()
        self._workers: list[threading.Thread] = []
        self._workers_done = threading.Event()  # tells the committer to drain and stop
        self._finish = threading.Event()  # a shard: every shard is idle, the crawl is complete
        self.failure: CrawlerError | None = None  # why the crawl stopped on its own, if it did
        self.renderer = (
            RenderPool(config, subfetch=render_subfetch(self), reader=self.reader,
                       record=self._record, frontier=self.frontier)
            if config.rendering else None
        )
        # Alone, the engine logs the status line; a shard's supervisor logs the crawl's.
        self.reporter = status_mod.Reporter(
            self, interval=config.status_interval, log_line=self.place.count == 1
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
        return self._stopping

    def count_subrequest(self) -> None:
        with self.stats_lock:
            self.subrequests += 1

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
            for item in self.scheduler.drain():  # their bulks stay live in PendDB
                if isinstance(item, SubTask):
                    item.answer("aborted")
            for t in self._workers:
                t.join()
            self._workers_done.set()
            committer.join()
            if before_close is not None:
                before_close()
            reporter.report(final=True)
            self.close()
        if self.failure is not None:
            raise self.failure
        return complete

    def close(self) -> None:
        self.frontier.close()
        self.bad_hosts.close()
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
                    self._submit(c, self._record(c, 0, "bad_url"))
                    taken = True
                    continue
                if self.scheduler.offer(u.host, _Task(c, u)):
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
            if item is None:
                continue
            slot, task = item
            if isinstance(task, (SubTask, SitemapTask)):
                task.serve(self, slot)
                continue
            claimed = task.claimed
            result = _Result(None)
            try:
                result = self._handle(slot, claimed, task.url)
                if result.handed:
                    pass
                elif result.outcome is not None:
                    self.frontier.submit(result.outcome)
                else:
                    self.scheduler.offer(slot.host, task, front=True)
            except Exception:  # noqa: BLE001 - one bad page must not kill a worker
                log.exception("unexpected error on %s", claimed.entry.url)
                self._submit(claimed, self._record(claimed, 0, "internal_error"))
            finally:
                self.scheduler.release(
                    slot, not_before=result.not_before, contacted=result.contacted
                )

    # -- one URL ----------------------------------------------------------------

    def _handle(self, slot: HostSlot, c: Claimed, u: URL) -> _Result:
        cfg = self.config
        limit = cfg.max_pages_per_host
        if limit is not None and slot.fetches >= limit:  # checked again when reserving
            return self._final(c, 0, "host_page_limit")
        bad = self.bad_hosts.reason(u.host_key, time.time())
        if bad is not None:
            return self._final(c, 0, f"bad_host:{bad}")
        try:
            self.dns.resolve(u.host)
            verdict = self.robots_gate.check(slot, u) if cfg.obey_robots else None
            if isinstance(verdict, Wait):
                return _Result(None, verdict.not_before, contacted=verdict.contacted)
            if self.sitemaps is not None:  # the origin's robots.txt is known now
                self.sitemaps.discover(u)
            if verdict is not None:
                return self._final(c, 0, verdict)
        except DNSError as exc:
            return self._dns_failure(c, u, exc)
        except FetchError as exc:
            return self._failure(slot, c, u, exc.reason)
        render = self.renderer is not None and self.renderer.wants(u.host)
        if render and not self.renderer.reserve():  # type: ignore[union-attr]
            # A worker never waits on the browser: this host's URL waits, others go on.
            return _Result(None, time.monotonic() + _RENDER_FULL_WAIT, contacted=False)
        result = _Result(None, contacted=False)
        try:
            result = self._fetch(slot, c, u, render)
        finally:
            if render and not result.handed:
                self.renderer.unreserve()  # type: ignore[union-attr]
        return result

    def _fetch(self, slot: HostSlot, c: Claimed, u: URL, render: bool) -> _Result:
        lease = self.budget.lease()  # the body, its parse and its record count here
        response: FetchResult | None = None
        try:
            try:
                if not self.scheduler.reserve_fetch(slot, self.config.max_pages_per_host):
                    return self._final(c, 0, "host_page_limit")
                if not self._reserve_fetch():
                    return _Result(None, contacted=False)
                prior, validators = self.revisits.conditional(c.key)
                response = self.fetcher.fetch(u, validators, lease=lease)
            except DNSError as exc:
                return self._dns_failure(c, u, exc)
            except FetchError as exc:
                return self._failure(slot, c, u, exc.reason)
            with self.stats_lock:
                self.bytes += response.wire_bytes
            return self._response(slot, c, response, render, prior, lease)
        finally:
            response = None  # the body goes before its bytes are given back
            lease.close()

    def _dns_failure(self, c: Claimed, u: URL, exc: DNSError) -> _Result:
        reason = "private_ip" if exc.kind == "private" else f"dns_{exc.kind}"
        self._mark_bad(u, reason)
        return self._final(c, 0, reason)

    def _reserve_fetch(self) -> bool:
        """Count a fetch against --max-pages; False (and stop) once the limit is reached."""
        with self.stats_lock:
            if self.config.max_pages is not None and self.fetched >= self.config.max_pages:
                self._limit_reached.set()
                self.stop()
                return False
            self.fetched += 1
            return True

    # -- outcomes -----------------------------------------------------------------

    def _record(self, c: Claimed, status: int, reason: str, *,
                prior: PageRecord | None = None, **fields: Any) -> bytes:
        """A page record; ``prior``: the record a revisit set aside (for its interval)."""
        key = status_mod.outcome_key(status, reason, fields.get("truncated", ""))
        with self.stats_lock:
            self.outcomes[key] += 1
        if self.config.revisit_after:  # every outcome comes back (crawler.state.due)
            fields["revisit_interval"] = self.revisits.interval(
                self.config.revisit_after, c.key, status, reason, fields, prior)
        page = PageRecord(
            url=c.entry.url,
            status=status,
            fetched_at=time.time(),
            depth=c.entry.depth,
            reason=reason,
            **fields,
        )
        return encode_page(page)

    def _count(self, key: str) -> None:
        with self.stats_lock:
            self.outcomes[key] += 1

    def _submit(self, c: Claimed, record: bytes) -> None:
        self.frontier.submit(Outcome(c, record))

    def _final(self, c: Claimed, status: int, reason: str) -> _Result:
        """A failure recorded without a request to the host (it owes no delay)."""
        return _Result(Outcome(c, self._record(c, status, reason)), contacted=False)

    def _mark_bad(self, u: URL, reason: str) -> None:
        retry_at = time.time() + self.config.bad_host_retry
        self.bad_hosts.mark(u.host_key, u.host, reason, retry_at)

    def _failure(self, slot: HostSlot, c: Claimed, u: URL, reason: str) -> _Result:
        """A request that got no usable answer."""
        if reason == "aborted":  # the crawl is stopping: not the URL's fault, try it next run
            return _Result(Outcome(c, None, requeue=c.entry), contacted=False)
        if reason in HOST_FAILURES:
            self._mark_bad(u, reason)
            return _Result(Outcome(c, self._record(c, 0, reason)))
        cfg = self.config
        wait = self.scheduler.host_failed(slot, cfg.backoff, cfg.max_retry_after)
        if reason in _TRANSIENT and c.entry.attempts < cfg.max_retries:
            return self._retry(c, reason, wait)
        return _Result(Outcome(c, self._record(c, 0, reason)), time.monotonic() + wait)

    def _retry(self, c: Claimed, reason: str, wait: float) -> _Result:
        """Requeue the URL with one more attempt; its host waits ``wait`` seconds."""
        self._count(f"retry:{reason}")
        e = c.entry
        again = Pending(e.url, e.depth, e.hops, e.attempts + 1)
        return _Result(Outcome(c, None, requeue=again), time.monotonic() + wait)

    def _response(self, slot: HostSlot, c: Claimed, r: FetchResult, render: bool,
                  prior: PageRecord | None = None, lease: Lease | None = None) -> _Result:
        cfg = self.config
        e = c.entry
        status = r.status
        if status == 429 or 500 <= status < 600:
            ra = None
            if status in (429, 503):
                ra = parse_retry_after(r.headers.get("retry-after", ""), time.time())
            if ra is None:
                wait = self.scheduler.host_failed(slot, cfg.backoff, cfg.max_retry_after)
            else:  # the server said how long: that, not our backoff
                wait = min(ra, cfg.max_retry_after)
            if e.attempts < cfg.max_retries:
                return self._retry(c, f"http_{status}", wait)
            outcome = Outcome(c, self._record(c, status, "", prior=prior,
                                              **self.reader.fields(r, "")))
            return _Result(outcome, time.monotonic() + wait)
        self.scheduler.host_ok(slot)
        if prior is not None:  # a recrawl: an answer came, the record set aside is done with
            self.revisits.forget(c.key)
            if status == 304 and prior.status == 200:  # the stored body is still the page
                fields = self.revisits.not_modified(prior, r)
                return _Result(Outcome(c, self._record(c, 200, prior.reason, prior=prior,
                                                       **fields)))
        if render and status == 200 and r.body and is_html(r.headers.get("content-type"),
                                                           r.body[:512]):
            self.renderer.hand(RenderJob(c, r))  # type: ignore[union-attr]
            return _Result(None, handed=True)
        if lease is None:
            reason, fields, links = self.reader.read(e, r)
        else:
            held = lease.needed  # the body as fetched
            reason, fields, links = self.reader.read(e, r, reserve=lease.grow)
            if fields["body"]:  # its encoding: compressed body and record beside the body
                lease.hold(held + 2 * len(fields["body"]) + _RECORD_SLACK)
        return _Result(Outcome(c, self._record(c, status, reason, prior=prior, **fields),
                               links=links))
