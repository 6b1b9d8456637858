"""One page of the frontier, from its host's slot to its recorded outcome.

A claimed URL waits in its host's queue as a :class:`PageTask`. On a worker it
goes: the per-host page limit, the gate (BadHosts, DNS, robots.txt:
crawler.run.gate), sitemap discovery for its origin, the render pool's
reservation (--render-js), the --max-pages count, a lease on the memory budget,
the fetch (a conditional GET on a revisit; the cookies of the jar for the URL,
crawler.state.cookiestore, and its Set-Cookie kept there), then the answer: a
429/5xx is retried after the host's wait, a 304 of a revisit keeps the stored body, an HTML
page of a rendered host goes to the browser, anything else becomes a page record
and the links worth admitting (crawler.run.responses). The Outcome goes to the
frontier, which commits it in its crash-safe order; the slot is released with
the delay the host owes.

A URL ends as exactly one recorded outcome, or goes back to PendDB to be tried
later (a transient failure within its retry budget, or a stop: "aborted").

A cookie wall (a 3xx that sets a cookie and redirects to the URL itself, until
the cookie comes back) is asked once more: the task goes back to the front of
its host's queue, the host owing its delay as after any request, and its next
turn sends the cookie. Once: a second wall is recorded as the redirect it is
(its target is known, so it is not fetched again). The second request is the
same page's: it counts against neither --max-pages nor --max-pages-per-host.
docs/HOSTILE.md tables the outcome of each fault of a hostile web.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .. import outcomes
from ..config import CrawlerConfig
from ..exceptions import URLError
from ..net.answer import FetchResult
from ..net.fetch import Fetcher
from ..state.cookiestore import CookieJar
from ..state.frontier import Claimed, Frontier, Outcome
from ..state.pages import PageRecord, Pending, encode_page
from ..web.links import is_html
from ..web.urls import URL, normalize
from .budget import Lease, MemoryBudget
from .counters import Counters
from .gate import Cleared, Failed, Gate, Refused
from .politeness import HostSlot, Scheduler
from .render import RenderJob, RenderPool
from .responses import ResponseReader
from .revisit import Revisits
from .robotsgate import Wait
from .sitemaps import Sitemaps

log = logging.getLogger(__name__)

# How long a URL of a rendered host waits when the render pool is full.
_RENDER_FULL_WAIT = 0.05
# A page record's encoding holds its compressed body and the record (each at most
# about the body) beside the body; this covers its header and link list besides.
RECORD_SLACK = 1 << 20


@dataclass(frozen=True, slots=True)
class _Result:
    outcome: Outcome | None  # None: the URL went back to its host's wait list (unless handed)
    not_before: float = 0.0  # monotonic time before which the host is not contacted again
    contacted: bool = True  # False: decided without a request, the host owes no delay
    handed: bool = False  # the task is someone else's now (the render pool)


@dataclass(frozen=True)
class Recorder:
    """Makes page records (the pages' and the render pool's), counting each outcome."""

    config: CrawlerConfig
    revisits: Revisits
    counters: Counters

    def __call__(self, c: Claimed, status: int, reason: str, *,
                 prior: PageRecord | None = None, **fields: Any) -> bytes:
        """A page record, counted; ``prior``: the record a revisit set aside (its interval)."""
        self.counters.count(outcomes.outcome_key(status, reason, fields.get("truncated", "")))
        cfg = self.config
        if cfg.revisit_after:  # every outcome comes back (crawler.state.due)
            fields["revisit_interval"] = self.revisits.interval(
                cfg.revisit_after, c.key, status, reason, fields, prior)
        page = PageRecord(url=c.entry.url, status=status, fetched_at=time.time(),
                          depth=c.entry.depth, reason=reason, **fields)
        return encode_page(page)


@dataclass(frozen=True)
class PageWork:
    """What every page task shares: the parts of the crawl a page goes through.
    ``stop`` ends the crawl (the --max-pages limit was reached: ``limit_reached``)."""

    config: CrawlerConfig
    scheduler: Scheduler
    gate: Gate
    fetcher: Fetcher
    frontier: Frontier
    reader: ResponseReader
    revisits: Revisits
    counters: Counters
    budget: MemoryBudget
    record: Recorder
    sitemaps: Sitemaps | None
    renderer: RenderPool | None
    stop: Callable[[], None]
    limit_reached: threading.Event
    cookies: CookieJar | None = None  # None: --no-cookies

    def task(self, claimed: Claimed, url: URL) -> PageTask:
        return PageTask(self, claimed, url)

    def submit(self, c: Claimed, record: bytes) -> None:
        self.frontier.submit(Outcome(c, record))


class PageTask:
    """A claimed URL and its parts (split once, at claim), waiting for its host."""

    __slots__ = ("work", "claimed", "url", "walled")

    def __init__(self, work: PageWork, claimed: Claimed, url: URL) -> None:
        self.work = work
        self.claimed = claimed
        self.url = url
        self.walled = False  # a cookie wall answered: this turn sends its cookie

    def drop(self) -> None:
        pass  # its bulk stays live in PendDB: the next run claims it again

    def serve(self, slot: HostSlot) -> None:
        w, c = self.work, self.claimed
        result = _Result(None)
        try:
            result = self._handle(slot)
            if result.handed:
                pass
            elif result.outcome is not None:
                w.frontier.submit(result.outcome)
            else:
                w.scheduler.offer(slot.host, self, front=True)
        except Exception:  # noqa: BLE001 - one bad page must not kill a worker
            log.exception("unexpected error on %s", c.entry.url)
            w.submit(c, w.record(c, 0, outcomes.INTERNAL_ERROR))
        finally:
            w.scheduler.release(slot, not_before=result.not_before, contacted=result.contacted)

    def _handle(self, slot: HostSlot) -> _Result:
        w, u = self.work, self.url
        limit = w.config.max_pages_per_host
        if limit is not None and slot.fetches >= limit and not self.walled:  # checked again
            return self._final(outcomes.HOST_PAGE_LIMIT)
        verdict = w.gate.check(slot, u)
        if isinstance(verdict, Wait):
            return _Result(None, verdict.not_before, contacted=verdict.contacted)
        if isinstance(verdict, Failed):  # its robots.txt request got no usable answer
            return self._failed(slot, verdict)
        if w.sitemaps is not None and (isinstance(verdict, Cleared) or verdict.robots_known):
            w.sitemaps.discover(u)  # the origin's robots.txt is known now
        if isinstance(verdict, Refused):
            return self._final(verdict.reason)
        render = w.renderer is not None and w.renderer.wants(u.host)
        if render and not w.renderer.reserve():  # type: ignore[union-attr]
            # A worker never waits on the browser: this host's URL waits, others go on.
            return _Result(None, time.monotonic() + _RENDER_FULL_WAIT, contacted=False)
        result = _Result(None, contacted=False)
        try:
            result = self._fetch(slot, verdict, render)
        finally:
            if render and not result.handed:
                w.renderer.unreserve()  # type: ignore[union-attr]
        return result

    def _fetch(self, slot: HostSlot, cleared: Cleared, render: bool) -> _Result:
        w, c = self.work, self.claimed
        if self.walled:
            pass  # the page's second request: reserved at its first
        elif not w.scheduler.reserve_fetch(slot, w.config.max_pages_per_host):
            return self._final(outcomes.HOST_PAGE_LIMIT)
        elif not w.counters.reserve_fetch(w.config.max_pages):
            w.limit_reached.set()
            w.stop()
            return _Result(None, contacted=False)
        lease = w.budget.lease()  # the body, its parse and its record count here
        jar = w.cookies
        try:
            prior, headers = w.revisits.conditional(c.key)
            sent = jar.header(self.url) if jar is not None else ""
            if sent:
                headers += (("Cookie", sent),)
            got = w.gate.fetch(w.fetcher, self.url, cleared, headers=headers, lease=lease)
            if isinstance(got, Failed):
                return self._failed(slot, got)
            w.counters.add_bytes(got.wire_bytes)
            if sent:  # the record keeps what was sent (the WARC request record shows it)
                got = replace(got, cookie=sent)
            if jar is not None and jar.receive(self.url, got.headers.get("set-cookie", "")):
                if self._cookie_wall(got):  # ask again, with the cookie, on its next turn
                    w.scheduler.host_ok(slot)
                    return _Result(None)
            return self._response(slot, got, render, prior, lease)
        finally:
            got = None  # type: ignore[assignment]  # the body goes before its bytes are given back
            lease.close()

    def _cookie_wall(self, r: FetchResult) -> bool:
        """Whether ``r``, which set a cookie, is a redirect to this URL itself, and the
        first (so the task goes back to its host's queue, ``walled``)."""
        if self.walled or not r.redirect or not 300 <= r.status < 400:
            return False
        try:
            target = normalize(r.redirect, max_length=self.work.config.max_url_length)
        except URLError:
            return False
        self.walled = target == self.url.url
        return self.walled

    def _final(self, reason: str) -> _Result:
        """A failure recorded without a request to the host (it owes no delay)."""
        w, c = self.work, self.claimed
        return _Result(Outcome(c, w.record(c, 0, reason)), contacted=False)

    def _failed(self, slot: HostSlot, failed: Failed) -> _Result:
        """A request that got no usable answer."""
        w, c = self.work, self.claimed
        if failed.aborted:  # the crawl is stopping: not the URL's fault, try it next run
            return _Result(Outcome(c, None, requeue=c.entry), contacted=False)
        if failed.host_failure:  # the gate put the host in BadHosts
            return _Result(Outcome(c, w.record(c, 0, failed.reason)))
        wait = w.gate.backoff(slot)
        if failed.transient and c.entry.attempts < w.config.max_retries:
            return self._retry(failed.reason, wait)
        return _Result(Outcome(c, w.record(c, 0, failed.reason)), time.monotonic() + wait)

    def _retry(self, reason: str, wait: float) -> _Result:
        """Requeue the URL with one more attempt; its host waits ``wait`` seconds."""
        w, e = self.work, self.claimed.entry
        w.counters.count(outcomes.RETRY + reason)
        again = Pending(e.url, e.depth, e.hops, e.attempts + 1)
        return _Result(Outcome(self.claimed, None, requeue=again), time.monotonic() + wait)

    def _response(self, slot: HostSlot, r: FetchResult, render: bool,
                  prior: PageRecord | None, lease: Lease) -> _Result:
        w, c = self.work, self.claimed
        e, status = c.entry, r.status
        if status == 429 or 500 <= status < 600:
            wait = w.gate.answer_wait(slot, r)
            if e.attempts < w.config.max_retries:
                return self._retry(outcomes.http_retry(status), wait)
            record = w.record(c, status, "", prior=prior, **w.reader.fields(r, ""))
            return _Result(Outcome(c, record), time.monotonic() + wait)
        w.scheduler.host_ok(slot)
        if prior is not None:  # a recrawl: an answer came, the record set aside is done with
            w.revisits.forget(c.key)
            if status == 304 and prior.status == 200:  # the stored body is still the page
                fields = w.revisits.not_modified(prior, r)
                return _Result(Outcome(c, w.record(c, 200, prior.reason, prior=prior, **fields)))
        if render and status == 200 and r.body and is_html(r.headers.get("content-type"),
                                                           r.body[:512]):
            w.renderer.hand(RenderJob(c, r))  # type: ignore[union-attr]
            return _Result(None, handed=True)
        held = lease.needed  # the body as fetched
        reason, fields, links = w.reader.read(e, r, reserve=lease.grow)
        if fields["body"]:  # its encoding: compressed body and record beside the body
            lease.hold(held + 2 * len(fields["body"]) + RECORD_SLACK)
        record = w.record(c, status, reason, prior=prior, **fields)
        return _Result(Outcome(c, record, links=links))

