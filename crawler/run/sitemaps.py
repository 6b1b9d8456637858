"""Sitemaps: the URLs a site lists for crawlers, read for the pages no link reaches.

Theory of operation (docs/SITEMAPS.md has the rules as a user sees them):

- Discovery. The first time in a run that a page URL of an origin gets past
  BadHosts, DNS and its robots.txt check, the engine calls ``discover``. The
  origin's candidates are, in order, its robots.txt's ``Sitemap:`` lines
  (``--sitemaps all`` or ``robots``, robots.txt obeyed and answered 2xx),
  resolved against the robots.txt URL, and its ``/sitemap.xml`` (``all``).
  Only sitemaps of the origin itself are read: a Sitemap line naming another
  host is dropped (its host is crawled, if at all, for its own sitemaps).
- Each candidate not yet read becomes a SitemapTask queued at the front of
  its host in the scheduler, so a worker takes it under the host's
  politeness (--per-host, --delay, Crawl-delay, backoff) and checks, like a
  page, BadHosts, DNS with the private-address rule, and robots.txt (a
  disallowed sitemap is not fetched).
- Its answer is parsed by crawler.web.sitemaps (bounded: 50,000 URLs and
  50 MB uncompressed per file, and the fetcher's --max-body-bytes and
  --max-decoded-bytes). Page URLs of the same origin enter the frontier at
  depth 1 (as if the home page linked them) through the same scope and
  depth checks and dedup as links; an index's children of the same origin
  are candidates one level down, to MAX_SITEMAP_NESTING; a same-origin
  redirect is a candidate at the same level. Per origin at most
  MAX_SITEMAPS_PER_HOST sitemaps are read in one crawl.
- Crash safety: the URLs go through Frontier.receive, whose event is set once
  they are written and fsynced; only then is the sitemap's record written
  (crawler.state.sitemapstore). A kill in between refetches one sitemap. On
  a resume, a recorded index is not fetched again, but its recorded children
  are visited again, so a kill between an index and its children loses none.
- 429 and 5xx answers and transient failures are retried like a page's
  (--max-retries, the host's backoff or Retry-After); then the failure is
  recorded, as is every other answer, so nothing is fetched twice.

- Memory. The sitemaps of one origin are a *walk*: it starts at discovery
  and ends once none of the origin's sitemaps waits or is being read (no
  visit of the origin can come after that: visits come from discovery and
  from the origin's own sitemaps). Only a live walk keeps its state (the
  sitemap URLs it visited, its budget count), so that state is bounded by
  the origins with sitemaps waiting in the scheduler. An ended walk leaves
  the md5 of its origin in a KeySet (~22 bytes an origin, the one cost per
  origin of a run), so the origin is not walked again this run. It is not
  evicted: re-walking an origin from the store would fetch nothing already
  fetched (every answer is recorded, a 404 ``/sitemap.xml`` too), but its
  budget would start over and sitemaps the budget had dropped would be read.

Thread-safety: ``discover`` from any worker (a lock guards the walks); a
SitemapTask is served by one worker at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin

from kvstore import KeySet, md5_key

from .. import outcomes
from ..config import CrawlerConfig, Scope
from ..exceptions import DataDirError, URLError
from ..net.answer import FetchResult
from ..net.fetch import Fetcher
from ..state.frontier import Frontier
from ..state.sitemapstore import SitemapStore
from ..web.sitemaps import MAX_SITEMAP_BYTES, SitemapEntry, parse_sitemap
from ..web.urls import URL, normalize, parse
from .counters import Counters
from .gate import Failed, Gate, Refused
from .politeness import HostSlot, Scheduler
from .responses import ResponseReader
from .robotscache import RobotsCache
from .robotsgate import Wait

log = logging.getLogger(__name__)

MAX_SITEMAPS_PER_HOST = 64  # sitemaps read per origin in one crawl
MAX_SITEMAP_NESTING = 2  # an index's children are level 1, theirs level 2; no deeper
SITEMAP_DEPTH = 1  # the depth its URLs enter at: one link from the home page
_LOOK = 0.1  # seconds between two looks at whether the crawl stops, while waiting


class _Walk:
    """The live sitemap walk of one origin."""

    __slots__ = ("held", "read", "visited")

    def __init__(self) -> None:
        self.held = 1  # its discovery under way, plus its sitemaps queued or being read
        self.read = 0  # sitemaps visited (the budget's count)
        self.visited: set[str] = set()  # sitemap URLs queued or found recorded


class Sitemaps:
    """The sitemaps of one crawl: discovery, the store, the counts. ``fetcher(max_body,
    max_decoded)`` makes the crawl's kind of Fetcher with those limits."""

    def __init__(self, config: CrawlerConfig, *, scheduler: Scheduler, gate: Gate,
                 frontier: Frontier, reader: ResponseReader, scope: Scope,
                 robots: RobotsCache, counters: Counters, stopping: threading.Event,
                 fetcher: Callable[[int, int], Fetcher]) -> None:
        cfg = config
        self.config, self.scheduler, self.gate = config, scheduler, gate
        self.frontier, self.reader, self.scope, self.robots = frontier, reader, scope, robots
        self.counters, self.stopping = counters, stopping
        self.mode = cfg.sitemaps
        self.store = SitemapStore(cfg.data_dir)
        # The decoded limit is the smaller of ours and the protocol's 50 MB.
        self.max_bytes = min(cfg.max_decoded_bytes, MAX_SITEMAP_BYTES)
        self.fetcher = fetcher(cfg.max_body_bytes, self.max_bytes)
        self._lock = threading.Lock()
        self._walks: dict[str, _Walk] = {}  # robots key -> its live walk
        self._walked = KeySet()  # md5 of the robots keys whose walk ended this run
        self.counts: Counter[str] = Counter()

    # -- discovery --------------------------------------------------------------

    def discover(self, u: URL) -> None:
        """A page URL of ``u``'s origin is about to be fetched (or decided): visit the
        origin's sitemaps once per run. Cheap after the first call for an origin."""
        origin = u.robots_key
        if origin in self._walks:  # a dict read is atomic: no lock on the hot path
            return
        key = md5_key(origin)
        if key in self._walked:  # so is a KeySet's
            return
        with self._lock:
            if origin in self._walks or key in self._walked:
                return
            self._walks[origin] = _Walk()
        try:
            candidates = []
            cfg = self.config
            if self.mode in ("all", "robots") and cfg.obey_robots:
                rules = self.robots.peek(origin)
                for value in rules.sitemaps if rules is not None else ():
                    candidates.append(urljoin(u.robots_url, value))
            if self.mode == "all":
                candidates.append(origin + "/sitemap.xml")
            for url in candidates:
                self.visit(u, url, 0)
        finally:
            self.done(origin)

    def done(self, origin: str) -> None:
        """One hold on ``origin``'s walk ends (its discovery, or one of its sitemaps
        read or given up); with the last, the walk ends and only its mark stays."""
        with self._lock:
            walk = self._walks.get(origin)
            if walk is None:
                return
            walk.held -= 1
            if walk.held <= 0:
                del self._walks[origin]
                self._walked.add(md5_key(origin))

    def walks(self) -> int:
        """Origins whose sitemap walk is under way (the ones that hold memory)."""
        return len(self._walks)

    def visit(self, site: URL, url: str, level: int) -> None:
        """Queue sitemap ``url`` of ``site``'s origin, or, if a run recorded it, visit
        what it led to. Other origins, repeats and visits past the budget are dropped."""
        try:
            s = parse(normalize(url, max_length=self.config.max_url_length))
        except URLError:
            self.count("sitemap_bad_url")
            return
        if s.origin != site.origin:
            self.count("sitemap_off_origin")
            return
        if not self.scope.allows(s.url, s.host):  # --allow-regex, --deny-regex
            self.count("sitemap_out_of_scope")
            return
        with self._lock:
            # The caller holds the walk (its discovery, or the sitemap being read).
            walk = self._walks.get(site.robots_key)
            if walk is None or s.url in walk.visited:
                return
            if walk.read >= MAX_SITEMAPS_PER_HOST:
                self.counts["sitemap_budget"] += 1
                return
            walk.read += 1
            walk.visited.add(s.url)
        record = self.store.get(s.url)
        if record is None:
            with self._lock:
                walk.held += 1  # until the task is done with (SitemapTask.serve)
            self.scheduler.offer(s.host, SitemapTask(self, s, level), front=True)
            return
        if record.get("redirect"):
            self.visit(site, record["redirect"], level)
        if level < MAX_SITEMAP_NESTING:
            for child in record.get("children", ()):
                self.visit(site, child, level + 1)

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def close(self) -> None:
        self.fetcher.close()
        self.store.close()


class SitemapTask:
    """One sitemap waiting in its host's queue."""

    __slots__ = ("sitemaps", "url", "level", "attempts")

    def __init__(self, sitemaps: Sitemaps, url: URL, level: int) -> None:
        self.sitemaps = sitemaps
        self.url = url
        self.level = level
        self.attempts = 0

    def drop(self) -> None:
        pass  # not recorded: the next run reads it (its walk ends with this one)

    def serve(self, slot: HostSlot) -> None:
        """Fetch and read the sitemap on a worker holding the host's ``slot``; free it."""
        sitemaps = self.sitemaps
        wait: Wait | None = None
        contacted = False
        try:
            wait, contacted = self.run(slot)
        except Exception:  # noqa: BLE001 - one bad sitemap must not kill a worker
            log.exception("unexpected error on sitemap %s", self.url.url)
        finally:
            if wait is not None:  # robots.txt pending, or a retry after a failure
                sitemaps.scheduler.offer(slot.host, self, front=True)
            else:  # read or given up: its walk may end
                sitemaps.done(self.url.robots_key)
            sitemaps.scheduler.release(
                slot,
                not_before=wait.not_before if wait is not None else 0.0,
                contacted=contacted or (wait is not None and wait.contacted),
            )

    def run(self, slot: HostSlot) -> tuple[Wait | None, bool]:
        """(a Wait if the task goes back to its host's queue, whether the host was contacted)."""
        u, sitemaps = self.url, self.sitemaps
        cfg = sitemaps.config
        verdict = sitemaps.gate.check(slot, u)
        if isinstance(verdict, Wait):
            return verdict, False
        if isinstance(verdict, Refused):  # not recorded: the host or robots.txt may change
            sitemaps.count(f"sitemap_{_refusal(verdict.reason)}")
            return None, False
        got = verdict if isinstance(verdict, Failed) else sitemaps.gate.fetch(
            sitemaps.fetcher, u, verdict)
        if isinstance(got, Failed):
            if got.aborted:  # the crawl is stopping: read it next run
                return None, False
            if got.transient and self.attempts < cfg.max_retries:
                return self._again(slot, None), True
            self._store(status=0, reason=got.reason)
            return None, True
        sitemaps.counters.add_bytes(got.wire_bytes)
        if got.status == 429 or 500 <= got.status < 600:
            if self.attempts < cfg.max_retries:
                return self._again(slot, got), True
            self._store(status=got.status)
            return None, True
        sitemaps.scheduler.host_ok(slot)
        self._read(got)
        return None, True

    def _again(self, slot: HostSlot, r: FetchResult | None) -> Wait:
        """Try once more after the host's backoff, or the Retry-After of a 429/503."""
        self.attempts += 1
        gate = self.sitemaps.gate
        self.sitemaps.count("sitemap_retry")
        wait = gate.backoff(slot) if r is None else gate.answer_wait(slot, r)
        return Wait(time.monotonic() + wait)

    def _read(self, r: FetchResult) -> None:
        """What an answer gives: URLs to the frontier, children and redirects visited."""
        sitemaps = self.sitemaps
        cfg = sitemaps.config
        u = self.url
        if 300 <= r.status < 400:
            if r.redirect:
                sitemaps.visit(u, r.redirect, self.level)
            self._store(status=r.status, redirect=r.redirect or "")
            return
        if r.status != 200:
            self._store(status=r.status)
            return
        sm = parse_sitemap(
            r.body, r.url, truncated=r.truncated, max_bytes=sitemaps.max_bytes,
            max_url_length=cfg.max_url_length,
        )
        listed, off = _same_origin(u, sm.urls, cfg.max_url_length)
        found, off_children = _same_origin(u, sm.sitemaps, cfg.max_url_length)
        urls = [url for url, _ in listed]
        children = [url for url, _ in found]
        entries = []
        if cfg.max_depth is None or SITEMAP_DEPTH <= cfg.max_depth:
            entries = [p for _, p in sitemaps.reader.admissible(urls, SITEMAP_DEPTH, 0)]
        if entries:
            try:
                done = sitemaps.frontier.receive(entries)
            except DataDirError:  # the crawl is stopping: read it again next run
                return
            while not done.wait(_LOOK):
                if sitemaps.stopping.is_set():
                    return
        if self.level < MAX_SITEMAP_NESTING:
            for child in children:
                sitemaps.visit(u, child, self.level + 1)
        elif children:
            sitemaps.count("sitemap_nesting_limit", len(children))
        sitemaps.count("sitemap_urls", len(entries))
        if sm.error:
            sitemaps.count(f"sitemap_{sm.error}")
        self._store(
            status=200, kind=sm.kind, error=sm.error, children=children,
            urls=[list(entry) for entry in listed],
            admitted=len(entries), off_origin=off + off_children, dropped=sm.dropped,
        )

    def _store(self, *, status: int, **fields: Any) -> None:
        sitemaps = self.sitemaps
        record: dict[str, Any] = {
            "url": self.url.url, "status": status, "reason": fields.pop("reason", ""),
            "fetched_at": time.time(), "level": self.level, "kind": "", "error": "",
            "redirect": "", "urls": [], "children": [], "admitted": 0, "off_origin": 0,
            "dropped": 0,
        }
        record.update(fields)
        sitemaps.store.put(record)
        sitemaps.count("sitemaps_read")


def _refusal(reason: str) -> str:
    """The count a refused sitemap is kept under: ``sitemap_bad_host`` and
    ``sitemap_dns_failed`` for every such reason, the robots.txt reason itself."""
    if reason.startswith(outcomes.BAD_HOST):
        return "bad_host"
    if reason in outcomes.DNS_REASONS.values():
        return "dns_failed"
    return reason


def _same_origin(
    site: URL, entries: tuple[SitemapEntry, ...], max_length: int
) -> tuple[list[tuple[str, str]], int]:
    """(normalized URL, lastmod) of the ``entries`` of ``site``'s origin, in file order,
    and how many others there were (other origins, or not a URL we fetch)."""
    out, off = [], 0
    for e in entries:
        try:
            x = parse(normalize(e.url, max_length=max_length))
        except URLError:
            off += 1
            continue
        if x.origin == site.origin:
            out.append((x.url, e.lastmod))
        else:
            off += 1
    return out, off
