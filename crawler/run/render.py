"""The render pool (--render-js): fetched pages of chosen hosts rendered in headless
Chromium by a few tab threads, off the fetch workers' path.

Theory of operation
-------------------
A worker about to fetch a URL of a rendered host first *reserves* a place
here; when the pool is full it does not wait: the URL goes back to its host's
wait list for a moment and the worker takes another host's URL. A fetched
HTML page is then *handed* over with its answer, and the worker moves on. A
tab thread renders it (crawler.net.browser), and the page and its DOM become
the page's outcome, which goes to the committer like any other.

Nothing new has to be made durable: the bulk a URL was claimed from is
tombstoned only once every URL of it is committed, so a URL whose render was
under way when the crawler was killed is claimed, fetched and rendered again
on the next start. A stop requeues the pages not rendered yet.

A browser that dies is restarted, and the page it was rendering is tried once
more; a page that kills the browser twice is recorded with its server links
only (``render_failed``). Cut renders (timeout, memory, crash) are recorded the
same way, with the reason in the page record's ``render`` field.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from .. import outcomes
from ..config import CrawlerConfig
from ..exceptions import BrowserError, BrowserGone
from ..net.answer import FetchResult
from ..net.browser import Browser, Rendered, SubFetch
from ..state.frontier import Claimed, Frontier, Outcome
from .responses import ResponseReader

log = logging.getLogger(__name__)

_TRIES = 2  # renders of one page the browser may die in
# Chromium's profile, in the shard's directory: a kill -9 leaves it there, and the next
# start clears it (in /tmp it would stay for ever).
BROWSER_PROFILE_NAME = "browser-profile"


@dataclass(slots=True)
class RenderJob:
    claimed: Claimed
    response: FetchResult
    tries: int = 0


class RenderPool:
    """Thread-safe. ``reserve``/``hand``/``unreserve`` from workers; ``stop`` once."""

    def __init__(self, config: CrawlerConfig, *, subfetch: SubFetch, reader: ResponseReader,
                 record: Callable[..., bytes], frontier: Frontier) -> None:
        self.render_all = config.render_all
        self.patterns = [re.compile(p) for p in config.render_js]
        self.tabs = config.render_tabs
        self.timeout = config.render_timeout
        self.capacity = 2 * config.render_tabs  # reserved, queued and rendering
        self.browser = Browser(config.render_browser, memory_mb=config.render_memory,
                               user_agent=config.user_agent,
                               profile_dir=os.path.join(config.data_dir, BROWSER_PROFILE_NAME))
        self._subfetch = subfetch
        self._reader = reader
        self._record = record  # a Recorder (run.pagework): counts the outcome, encodes the record
        self._frontier = frontier
        self._cond = threading.Condition()
        self._queue: deque[RenderJob] = deque()
        self._held = 0  # places taken: reserved by a worker, queued, or rendering
        self._active = 0
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self.done = 0  # renders that ended "ok"
        self.failed: Counter[str] = Counter()  # cut renders, by reason
        self._wants: dict[str, bool] = {}

    # -- workers ------------------------------------------------------------------

    def wants(self, host: str) -> bool:
        """Whether the pages of ``host`` are rendered."""
        got = self._wants.get(host)
        if got is None:
            got = self.render_all or any(p.search(host) for p in self.patterns)
            if len(self._wants) < 100_000:
                self._wants[host] = got
        return got

    def reserve(self) -> bool:
        """Take a place for a page about to be fetched; False when the pool is full."""
        with self._cond:
            if self._held >= self.capacity or self._stopping:
                return False
            self._held += 1
            return True

    def unreserve(self) -> None:
        """The reserved page turned out not to need a render."""
        with self._cond:
            self._held -= 1
            self._cond.notify_all()

    def hand(self, job: RenderJob) -> None:
        """Queue a fetched page in the place reserved for it (once the pool is stopping:
        back to PendDB, as the pages it had queued)."""
        with self._cond:
            if not self._stopping:
                self._queue.append(job)
                self._cond.notify_all()
                return
            self._held -= 1
        self._requeue(job)

    def idle(self) -> bool:
        with self._cond:
            return self._held == 0

    # -- status --------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self._cond:
            return {
                "rendered": self.done,
                "render_failed": sum(self.failed.values()),
                "render_queued": len(self._queue),
                "rendering": self._active,
                "browser_starts": self.browser.starts,
            }

    # -- running ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the browser (a browser that cannot start fails the crawl here, at
        once) and the tab threads."""
        self.browser.connection()
        for i in range(self.tabs):
            t = threading.Thread(target=self._loop, name=f"render-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Kill the browser, end the tab threads, requeue every page not rendered."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.browser.close()
        for t in self._threads:
            t.join()
        with self._cond:
            left = list(self._queue)
            self._queue.clear()
            self._held -= len(left)
        for job in left:
            self._requeue(job)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def _take(self) -> RenderJob | None:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            self._active += 1
            return self._queue.popleft()

    def _loop(self) -> None:
        while True:
            job = self._take()
            if job is None:
                return
            try:
                self._render(job)
            except Exception:  # noqa: BLE001 - one bad page must not end a tab thread
                log.exception("render of %s failed", job.claimed.entry.url)
                self._finish(job, Rendered("render_failed"))

    def _render(self, job: RenderJob) -> None:
        r = job.response
        conn = None
        try:
            conn = self.browser.connection()
            out = self.browser.render(r.url, r.status, dict(r.headers), r.body,
                                      self._subfetch, self.timeout)
        except BrowserGone:
            if self._stopping:
                self._finish(job, None)
                return
            if conn is not None:
                self.browser.restart(conn)
            job.tries += 1
            if job.tries < _TRIES:
                log.warning("the browser died rendering %s: restarting it", r.url)
                with self._cond:
                    self._active -= 1
                    self._queue.appendleft(job)
                    self._cond.notify_all()
                return
            log.warning("the browser died again rendering %s: kept unrendered", r.url)
            out = Rendered(outcomes.RENDER_FAILED)
        except BrowserError as exc:  # the browser would not start again
            log.error("%s", exc)
            out = Rendered(outcomes.RENDER_FAILED)
        self._finish(job, out)

    def _complete(self, job: RenderJob, out: Rendered) -> None:
        """The page's record: the server's links and the DOM's, and the render's outcome."""
        c, r = job.claimed, job.response
        dom = out.dom if out.reason == outcomes.RENDER_OK else b""
        reason, fields, links = self._reader.read(c.entry, r, dom)
        record = self._record(c, r.status, reason, **fields, render=out.reason, dom=dom)
        self._frontier.submit(Outcome(c, record, links=links))

    def _requeue(self, job: RenderJob) -> None:
        """The crawl stops before the page is rendered: it is fetched again next run."""
        c = job.claimed
        self._frontier.submit(Outcome(c, None, requeue=c.entry))

    def _finish(self, job: RenderJob, out: Rendered | None) -> None:
        """Hand the outcome on (None: requeue the page, the crawl is stopping)."""
        try:
            if out is None:
                self._requeue(job)
            else:
                self._complete(job, out)
        finally:
            with self._cond:
                if out is not None:
                    if out.reason == outcomes.RENDER_OK:
                        self.done += 1
                    else:
                        self.failed[out.reason] += 1
                self._active -= 1
                self._held -= 1
                self._cond.notify_all()
