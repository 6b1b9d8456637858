"""The requests a page makes while it renders (its scripts, its XHRs), made by the
crawler's workers under the same rules as pages.

A tab thread (crawler.run.render) that the browser asks for a script or an
XHR does not fetch it itself: it queues a SubTask at the front of the URL's
host in the scheduler and waits for the answer. A worker takes it like any
URL of that host, so the request waits for the host's politeness slot and
delay, and goes through BadHosts, DNS (no private address unless
--allow-private-ips), robots.txt and the fetcher's limits. Its answer goes
to the browser; it is not recorded in MainDB (it is not a page).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from ..exceptions import DNSError, FetchError, URLError
from ..net.browser import Answer, SubFetch
from ..web.urls import URL, normalize, parse
from .politeness import HostSlot
from .robotsgate import Wait

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

_LOOK = 0.1  # seconds between two looks at whether the crawl stops, while waiting


class SubTask:
    """One request of a rendering page, waiting in its host's queue."""

    __slots__ = ("url", "deadline", "future", "contacted")

    def __init__(self, url: URL, deadline: float) -> None:
        self.url = url
        self.deadline = deadline  # monotonic: the page's render time limit
        self.future: Future[Answer | str] = Future()
        self.contacted = False  # whether a request was sent to the host

    def answer(self, got: Answer | str) -> None:
        try:
            self.future.set_result(got)
        except InvalidStateError:  # the tab stopped waiting for it
            pass

    def serve(self, engine: Engine, slot: HostSlot) -> None:
        """Make the request on a worker holding the host's ``slot``, and free the slot."""
        wait = None
        try:
            wait = self.run(engine, slot)
        except Exception:  # noqa: BLE001 - one bad request must not kill a worker
            log.exception("unexpected error on subrequest %s", self.url.url)
            self.answer("internal_error")
        finally:
            if wait is not None:  # robots.txt of its host is being fetched: try again later
                engine.scheduler.offer(slot.host, self, front=True)
            engine.scheduler.release(
                slot,
                not_before=wait.not_before if wait is not None else 0.0,
                contacted=wait.contacted if wait is not None else self.contacted,
            )

    def run(self, engine: Engine, slot: HostSlot) -> Wait | None:
        """Make the request on a worker; a Wait if it goes back to the host's queue."""
        u = self.url
        if self.future.done():
            return None
        if time.monotonic() >= self.deadline:
            self.answer("render_timeout")
            return None
        bad = engine.bad_hosts.reason(u.host_key, time.time())
        if bad is not None:
            self.answer(f"bad_host:{bad}")
            return None
        try:
            engine.dns.resolve(u.host)
            if engine.config.obey_robots:
                verdict = engine.robots_gate.check(slot, u)
                if isinstance(verdict, Wait):
                    return verdict
                if verdict is not None:
                    self.answer(verdict)
                    return None
            self.contacted = True
            r = engine.fetcher.fetch(u)
        except DNSError as exc:
            self.answer("private_ip" if exc.kind == "private" else f"dns_{exc.kind}")
            return None
        except FetchError as exc:
            self.answer(exc.reason)
            return None
        with engine.stats_lock:
            engine.bytes += r.wire_bytes
        engine.count_subrequest()
        self.answer(Answer(r.status, dict(r.headers), r.body))
        return None


def render_subfetch(engine: Engine) -> SubFetch:
    """The browser's ``subfetch`` for ``engine``: queue, wait, answer."""
    stopping: threading.Event = engine.stopping_event

    def subfetch(url: str, kind: str, deadline: float) -> Answer | str:
        try:
            u = parse(normalize(url, max_length=engine.config.max_url_length))
        except URLError:
            return "bad_url"
        task = SubTask(u, deadline)
        engine.scheduler.offer(u.host, task, front=True)
        while True:
            left = deadline - time.monotonic()
            if stopping.is_set():
                task.future.cancel()
                return "aborted"
            if left <= 0:
                task.future.cancel()
                return "render_timeout"
            try:
                got: Any = task.future.result(timeout=min(_LOOK, left))
            except TimeoutError:
                continue
            return got  # type: ignore[no-any-return]

    return subfetch
