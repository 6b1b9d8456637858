"""The robots.txt gate: may this URL be fetched now, by its host's robots.txt?

The engine (crawler.run.engine) asks the gate about each URL before fetching
it. The gate is kept apart because robots.txt is a job of its own, and the
crawl loop needs none of its parts: the parsed rules in memory
(crawler.run.robotscache), the answers kept on disk for the next run
(crawler.state.robotsstore), and the robots.txt fetch with its redirects. The
rules themselves are pure (crawler.web.robots). docs/HOSTILE.md tables what
each answer to a robots.txt fetch means.

The gate keeps no per-host state of its own: the rules are in the cache
(LRU-bounded, crawler.run.robotscache) and on disk; it sets a host's
Crawl-delay on its scheduler slot at every check (Scheduler.set_delay, under the
scheduler's lock), as the scheduler may have
evicted the slot that had it (crawler.run.politeness).

Thread-safety: every worker calls ``check`` at once; the cache lets only one
worker at a time fetch a given host's robots.txt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import outcomes
from ..config import CrawlerConfig
from ..exceptions import FetchError
from ..net.fetch import Fetcher
from ..state.robotsstore import RobotsStore
from ..web.robots import DEFAULT_MAX_ROBOTS_BYTES, DEFAULT_ROBOTS_TTL, RobotsRules
from ..web.urls import URL
from .politeness import HostSlot, Scheduler
from .robotscache import RobotsCache

ROBOTS_MAX_REDIRECTS = 5  # RFC 9309 §2.3.1.2 asks for at least five
# Failures that say the host itself is unreachable: it goes to BadHosts (a certificate
# is the host's, not the URL's). A robots.txt fetch failing so fails its URL the same way.
HOST_FAILURES = outcomes.HOST_FAILURES
# robots.txt bytes fetched: one more than the parser reads, so it can tell a cut file
# (and drop its cut last line) from one of exactly that size.
ROBOTS_FETCH_BYTES = DEFAULT_MAX_ROBOTS_BYTES + 1


@dataclass(frozen=True, slots=True)
class Wait:
    """The URL goes back to its host's wait list."""

    not_before: float = 0.0  # monotonic time before which the host is not contacted again
    contacted: bool = True  # False: no request was made, the host owes no delay


class RobotsGate:
    """robots.txt for one crawl: cached, kept on disk, fetched by one worker per host.

    ``fetcher`` is the engine's robots.txt Fetcher (the engine closes it); ``count``
    adds one to an outcome counter of the engine's."""

    def __init__(
        self,
        config: CrawlerConfig,
        scheduler: Scheduler,
        fetcher: Fetcher,
        *,
        count: Callable[[str], None],
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.fetcher = fetcher
        self.cache = RobotsCache()
        self.store = RobotsStore(config.data_dir, max_body=DEFAULT_MAX_ROBOTS_BYTES)
        self._count = count

    def check(self, slot: HostSlot, u: URL) -> Wait | str | None:
        """None if the URL may be fetched now; a Wait if it goes back to its host's wait
        list; otherwise the reason to record it with, unfetched. Thread-safe. Raises
        FetchError when robots.txt shows that the host cannot be reached."""
        key = u.robots_key
        now = time.time()
        rules = self.cache.get(key, now)
        cfg = self.config
        if rules is None:
            if not self.cache.begin_fetch(key, now):  # another worker is fetching it
                return Wait(time.monotonic() + 0.05, contacted=False)
            rules = self._kept(key, now)  # an earlier run's answer, if still fresh
            if rules is None:
                return self._fetch_rules(slot, key, u)
        if rules.crawl_delay is not None:
            # Before every request, not only when the rules are read: the scheduler
            # evicts idle slots, and one made anew starts with the default delay.
            self._set_delay(slot, rules.crawl_delay)
        if rules.state == "disallow_all_for_now":
            if slot.robots_failures <= cfg.max_retries:
                # The whole host waits for the next robots.txt try; its URLs stay in memory.
                wait = max(0.0, (rules.retry_at or now) - now)
                return Wait(time.monotonic() + wait, contacted=False)
            return outcomes.ROBOTS_UNAVAILABLE
        if not rules.can_fetch(u):
            return outcomes.ROBOTS_DISALLOWED
        return None

    def _set_delay(self, slot: HostSlot, crawl_delay: float) -> None:
        """The host's delay: its Crawl-delay, at least --delay, at most --max-crawl-delay
        (set through the scheduler, under its lock, like every slot field)."""
        cfg = self.config
        self.scheduler.set_delay(slot, max(cfg.delay, min(crawl_delay, cfg.max_crawl_delay)))

    def _fetch_rules(self, slot: HostSlot, key: str, u: URL) -> Wait:
        """Fetch the host's robots.txt (the fetch claim is ours), cache and keep it."""
        cfg = self.config
        rules = None
        try:
            status, body = self._fetch(u.robots_url)
            failed = status is None or status >= 500 or status == 429
            failures = self.scheduler.robots_outcome(slot, failed)
            if failed and failures <= cfg.max_retries:
                self._count(outcomes.RETRY + outcomes.ROBOTS_UNAVAILABLE)
            retry = cfg.backoff * 2.0 ** min(max(failures - 1, 0), 60)
            rules = RobotsRules.from_response(
                status,
                body,
                user_agent=cfg.user_agent,
                now=time.time(),
                error_retry=min(retry, cfg.max_retry_after),
                previous=self.cache.peek(key),
            )
            if status is not None:
                self.store.save(key, status, body or b"", rules.fetched_at)
        finally:
            if rules is None:
                self.cache.abort_fetch(key)
            else:
                self.cache.finish_fetch(key, rules)
        if rules.crawl_delay is not None:
            self._set_delay(slot, rules.crawl_delay)
        return Wait()  # robots.txt was this visit's request; the URL waits its turn

    def _kept(self, key: str, now: float) -> RobotsRules | None:
        """The rules of the robots.txt answer a run kept on disk, cached and returned
        (ending the fetch claim ``begin_fetch`` gave), or None (the claim stays)."""
        kept = self.store.load(key, now, DEFAULT_ROBOTS_TTL)
        if kept is None:
            return None
        status, body, fetched_at = kept
        rules = RobotsRules.from_response(
            status, body, user_agent=self.config.user_agent, now=fetched_at
        )
        self.cache.finish_fetch(key, rules)
        return rules

    def _fetch(self, url: str) -> tuple[int | None, bytes | None]:
        """(status, body) of robots.txt after up to ROBOTS_MAX_REDIRECTS redirects (RFC
        9309 §2.3.1.2: at least five; past them the last 3xx is returned, which means
        "unavailable"); (None, None) if no answer."""
        status = None
        for _request in range(1 + ROBOTS_MAX_REDIRECTS):
            try:
                r = self.fetcher.fetch(url)
            except FetchError as exc:
                if exc.reason in HOST_FAILURES or exc.reason == outcomes.ABORTED:
                    raise  # the host itself cannot be reached: its URLs fail the same way
                return None, None
            if r.redirect and 300 <= r.status < 400:
                url, status = r.redirect, r.status
                continue
            return r.status, r.body
        return status, b""
