"""The gate before any request: every kind of request (a page, a sitemap, a rendering
page's script or XHR) goes through the same checks, in the same order, with the same
meaning of each failure.

Theory of operation. A worker holding a host's politeness slot asks
:meth:`Gate.check` about a URL. In order:

1. BadHosts: a host marked unreachable is not contacted until its retry time
   (``Refused(bad_host:<reason>)``, no request);
2. DNS, our own resolver, with the private-address rule
   (``Refused(dns_nxdomain / private_ip ...)``; the host goes to BadHosts);
3. robots.txt (unless ``--ignore-robots``): rules not known yet mean its fetch
   (``Wait``: the URL goes back to its host's queue, robots.txt was this turn's
   request), a host whose robots.txt cannot be had waits or is refused
   (``robots_unavailable``), a disallowed URL is refused (``robots_disallowed``); a
   robots.txt fetch that shows the host unreachable fails it as a request would
   (``Failed``).

``Cleared`` carries the address DNS gave: :meth:`Gate.fetch` connects to exactly
that one (the address checked is the address connected), and turns the fetcher's
and the resolver's errors into a ``Failed`` whose reason means one thing
everywhere (crawler.outcomes): a host failure puts the host in BadHosts; a
transient one is worth another try after the host's backoff, which the task asks
for with :meth:`Gate.backoff` (or :meth:`Gate.answer_wait` for a 429/5xx answer).

What each kind of request then does with a refusal or a failure (record it, answer
the browser, count it) is the task's; the checks and their meaning are here once.

Thread-safe: workers call it at once; BadHosts, the resolver, the robots.txt gate
and the scheduler are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .. import outcomes
from ..config import CrawlerConfig
from ..exceptions import DNSError, FetchError
from ..net.answer import FetchResult, parse_retry_after
from ..net.dnscache import DNSCache
from ..net.fetch import Fetcher
from ..state.badhosts import BadHosts
from ..web.urls import URL
from .budget import Lease
from .politeness import HostSlot, Scheduler
from .robotsgate import RobotsGate, Wait

__all__ = ["Cleared", "Failed", "Gate", "Refused", "Wait"]


@dataclass(frozen=True, slots=True)
class Cleared:
    """The URL may be requested now, from this address."""

    address: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The URL is not to be requested, and no request was made: ``reason`` says why
    (crawler.outcomes); ``robots_known``: the host's robots.txt rules decided."""

    reason: str
    robots_known: bool = False


@dataclass(frozen=True, slots=True)
class Failed:
    """A request that got no usable answer, ``reason`` from crawler.outcomes."""

    reason: str

    @property
    def aborted(self) -> bool:
        """The crawl is stopping: not the URL's fault, it is tried next run."""
        return self.reason == outcomes.ABORTED

    @property
    def host_failure(self) -> bool:
        """The host is unreachable (it was put in BadHosts)."""
        return self.reason in outcomes.HOST_FAILURES

    @property
    def transient(self) -> bool:
        """Worth another try after the host's backoff, within --max-retries."""
        return self.reason in outcomes.TRANSIENT


class Gate:
    """BadHosts, DNS and robots.txt before a request, and the request itself."""

    def __init__(
        self,
        config: CrawlerConfig,
        *,
        scheduler: Scheduler,
        bad_hosts: BadHosts,
        dns: DNSCache,
        robots: RobotsGate,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.bad_hosts = bad_hosts
        self.dns = dns
        self.robots = robots

    def check(self, slot: HostSlot, u: URL) -> Cleared | Wait | Refused | Failed:
        """May ``u`` be requested now, by a worker holding its host's ``slot``? A Failed
        when the robots.txt request found the host unreachable (or was aborted)."""
        bad = self.bad_hosts.reason(u.host_key, time.time())
        if bad is not None:
            return Refused(outcomes.bad_host(bad))
        try:
            address = self.dns.resolve(u.host)
        except DNSError as exc:
            return Refused(self._dns_failed(u, exc))
        if not self.config.obey_robots:
            return Cleared(address)
        try:
            verdict = self.robots.check(slot, u)
        except FetchError as exc:  # robots.txt showed the host unreachable
            return self._failed(u, exc)
        if isinstance(verdict, Wait):
            return verdict
        return Cleared(address) if verdict is None else Refused(verdict, robots_known=True)

    def fetch(self, fetcher: Fetcher, u: URL, cleared: Cleared, *,
              headers: tuple[tuple[str, str], ...] = (), lease: Lease | None = None,
              ) -> FetchResult | Failed:
        """Request ``u`` from the address ``check`` cleared; a Failed for no usable answer
        (a host failure puts the host in BadHosts)."""
        try:
            return fetcher.fetch(u, headers, lease=lease, address=cleared.address)
        except DNSError as exc:  # not asked again with an address; kept for a caller without
            return Failed(self._dns_failed(u, exc))
        except FetchError as exc:
            return self._failed(u, exc)

    def backoff(self, slot: HostSlot) -> float:
        """Count a failed request of the host; the seconds it now waits (doubled per
        consecutive failure from --backoff, at most --max-retry-after)."""
        return self.scheduler.host_failed(slot, self.config.backoff, self.config.max_retry_after)

    def answer_wait(self, slot: HostSlot, r: FetchResult) -> float:
        """The seconds the host waits after a 429 or 5xx answer: its Retry-After on
        429/503 (at most --max-retry-after), else the host's backoff."""
        ra = None
        if r.status in (429, 503):
            ra = parse_retry_after(r.headers.get("retry-after", ""), time.time())
        if ra is None:
            return self.backoff(slot)
        return min(ra, self.config.max_retry_after)

    def mark_bad(self, u: URL, reason: str) -> None:
        retry_at = time.time() + self.config.bad_host_retry
        self.bad_hosts.mark(u.host_key, u.host, reason, retry_at)

    def _failed(self, u: URL, exc: FetchError) -> Failed:
        failed = Failed(exc.reason)
        if failed.host_failure:
            self.mark_bad(u, exc.reason)
        return failed

    def _dns_failed(self, u: URL, exc: DNSError) -> str:
        reason = outcomes.dns_reason(exc.kind)
        self.mark_bad(u, reason)
        return reason
