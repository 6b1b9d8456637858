"""The requests a page makes while it renders (its scripts, its XHRs), made by the
crawler's workers under the same rules as pages.

A tab thread (crawler.run.render) that the browser asks for a script or an
XHR does not fetch it itself: it queues a SubTask at the front of the URL's
host in the scheduler and waits for the answer. A worker takes it like any
URL of that host, so the request waits for the host's politeness slot and
delay, and goes through BadHosts, DNS (no private address unless
--allow-private-ips), robots.txt and the fetcher's limits. Its answer goes
to the browser; it is not recorded in MainDB (it is not a page). The checks and
the meaning of each failure are the gate's (crawler.run.gate), as for a page.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from .. import outcomes
from ..exceptions import URLError
from ..net.browser import Answer, SubFetch
from ..net.fetch import Fetcher
from ..web.urls import URL, normalize, parse
from .counters import Counters
from .gate import Failed, Gate, Refused
from .politeness import HostSlot, Scheduler
from .robotsgate import Wait

log = logging.getLogger(__name__)

_LOOK = 0.1  # seconds between two looks at whether the crawl stops, while waiting


@dataclass(frozen=True)
class SubRequests:
    """What the requests of rendering pages use of the crawl."""

    scheduler: Scheduler
    gate: Gate
    fetcher: Fetcher
    counters: Counters
    stopping: threading.Event
    max_url_length: int


class SubTask:
    """One request of a rendering page, waiting in its host's queue."""

    __slots__ = ("work", "url", "deadline", "future", "contacted")

    def __init__(self, work: SubRequests, url: URL, deadline: float) -> None:
        self.work = work
        self.url = url
        self.deadline = deadline  # monotonic: the page's render time limit
        self.future: Future[Answer | str] = Future()
        self.contacted = False  # whether a request was sent to the host

    def answer(self, got: Answer | str) -> None:
        try:
            self.future.set_result(got)
        except InvalidStateError:  # the tab stopped waiting for it
            pass

    def drop(self) -> None:
        self.answer(outcomes.ABORTED)

    def serve(self, slot: HostSlot) -> None:
        """Make the request on a worker holding the host's ``slot``, and free the slot."""
        scheduler = self.work.scheduler
        wait = None
        try:
            wait = self.run(slot)
        except Exception:  # noqa: BLE001 - one bad request must not kill a worker
            log.exception("unexpected error on subrequest %s", self.url.url)
            self.answer(outcomes.INTERNAL_ERROR)
        finally:
            if wait is not None:  # robots.txt of its host is being fetched: try again later
                scheduler.offer(slot.host, self, front=True)
            scheduler.release(
                slot,
                not_before=wait.not_before if wait is not None else 0.0,
                contacted=wait.contacted if wait is not None else self.contacted,
            )

    def run(self, slot: HostSlot) -> Wait | None:
        """Make the request on a worker; a Wait if it goes back to the host's queue."""
        w, u = self.work, self.url
        if self.future.done():
            return None
        if time.monotonic() >= self.deadline:
            self.answer(outcomes.RENDER_TIMEOUT)
            return None
        verdict = w.gate.check(slot, u)
        if isinstance(verdict, Wait):
            return verdict
        if isinstance(verdict, Refused | Failed):
            self.contacted = isinstance(verdict, Failed)
            self.answer(verdict.reason)
            return None
        self.contacted = True
        got = w.gate.fetch(w.fetcher, u, verdict)
        if isinstance(got, Failed):
            self.answer(got.reason)
            return None
        w.counters.subrequest(got.wire_bytes)
        self.answer(Answer(got.status, dict(got.headers), got.body))
        return None


def render_subfetch(work: SubRequests) -> SubFetch:
    """The browser's ``subfetch``: queue, wait, answer."""
    stopping = work.stopping

    def subfetch(url: str, kind: str, deadline: float) -> Answer | str:
        try:
            u = parse(normalize(url, max_length=work.max_url_length))
        except URLError:
            return outcomes.BAD_URL
        task = SubTask(work, u, deadline)
        work.scheduler.offer(u.host, task, front=True)
        while True:
            left = deadline - time.monotonic()
            if stopping.is_set():
                task.future.cancel()
                return outcomes.ABORTED
            if left <= 0:
                task.future.cancel()
                return outcomes.RENDER_TIMEOUT
            try:
                got: Any = task.future.result(timeout=min(_LOOK, left))
            except TimeoutError:
                continue
            return got  # type: ignore[no-any-return]

    return subfetch
