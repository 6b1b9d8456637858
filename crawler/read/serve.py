"""``python -m crawler serve``: the crawl report live, read-only, over HTTP on loopback.

A background thread recomputes the report (crawler.read.report, through a
read-only reader: it never writes the crawl) every ``interval`` seconds, and
only when the crawl changed (its record count or status.json moved on);
requests are answered from the last computed report, so a slow computation
never holds a request. ``/`` is the HTML page, which refreshes itself every
``refresh`` seconds; ``/report.json`` the same numbers; anything else is 404
and any method but GET/HEAD is 405. The server binds 127.0.0.1 by default:
the report shows URLs and hosts of the crawl, for the operator.

Thread safety: the report is swapped under a lock; http.server serves each
request in its own thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..exceptions import CrawlerError
from .listing import CrawlReader
from .report import compute
from .reporthtml import render

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
DEFAULT_INTERVAL = 30.0  # seconds between recomputations (at most)
DEFAULT_REFRESH = 15  # seconds between reloads of the page
_WAITING = ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"refresh\" content=\"2\"><title>Crawl report</title></head>"
            "<body><p>Computing the report of {dir}&hellip;</p></body></html>\n")


class ReportServer:
    """Serves one crawl's report. ``start()`` returns once listening; ``stop()`` ends it."""

    def __init__(self, data_dir: str, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 interval: float = DEFAULT_INTERVAL, refresh: int = DEFAULT_REFRESH,
                 **options: Any) -> None:
        with CrawlReader(data_dir):  # fail now, not in the thread, on a bad directory
            pass
        self.data_dir, self.interval, self.refresh = data_dir, interval, refresh
        self.options = options  # for report.compute (limit, rank...)
        self._lock = threading.Lock()
        self._html: bytes | None = None
        self._json: bytes | None = None
        self._error: str | None = None
        self._stamp: tuple[int, float] | None = None
        self._stop = threading.Event()
        self.computations = 0
        server = ThreadingHTTPServer((host, port), _handler(self))
        server.daemon_threads = True
        self.httpd = server
        self.address: tuple[str, int] = server.server_address[:2]  # type: ignore[assignment]
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/"

    def start(self) -> ReportServer:
        for target, name in ((self.httpd.serve_forever, "serve-http"),
                             (self._refresher, "serve-report")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("serving the report of %s at %s", self.data_dir, self.url)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for t in self._threads:
            t.join(timeout=60)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._html is not None or self._error is not None:
                    return True
            time.sleep(0.05)
        return False

    def _changed(self) -> bool:
        with CrawlReader(self.data_dir) as reader:
            records = len(reader)
        try:
            mtime = os.stat(os.path.join(self.data_dir, "status.json")).st_mtime
        except OSError:
            mtime = 0.0
        stamp = (records, mtime)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    def refresh_now(self) -> None:
        """Recompute the report if the crawl changed (the refresher thread's step)."""
        try:
            if not self._changed():
                return
            report = compute(self.data_dir, **self.options)
            page = render(report, refresh=self.refresh).encode("utf-8")
            data = json.dumps(report).encode("utf-8")
            with self._lock:
                self._html, self._json, self._error = page, data, None
                self.computations += 1
        except (CrawlerError, OSError, ValueError) as exc:
            log.warning("report of %s failed: %s", self.data_dir, exc)
            with self._lock:
                self._error = str(exc)
                self._stamp = None  # try again next time

    def _refresher(self) -> None:
        while not self._stop.is_set():
            self.refresh_now()
            self._stop.wait(self.interval)

    def page(self, path: str) -> tuple[int, str, bytes]:
        with self._lock:
            html, data, error = self._html, self._json, self._error
        if path in ("/", "/index.html"):
            if html is None:
                text = (_WAITING.format(dir=self.data_dir) if error is None else
                        f"<!DOCTYPE html><title>error</title><p>report failed: {error}</p>")
                return HTTPStatus.OK, "text/html; charset=utf-8", text.encode("utf-8")
            return HTTPStatus.OK, "text/html; charset=utf-8", html
        if path == "/report.json":
            if data is None:
                return (HTTPStatus.SERVICE_UNAVAILABLE, "application/json",
                        json.dumps({"error": error or "computing"}).encode())
            return HTTPStatus.OK, "application/json", data
        return HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n"


def _handler(server: ReportServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kvcrawl-report"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(body=False)

        def _refuse(self) -> None:
            self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
            self.send_header("Allow", "GET, HEAD")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815 - read-only

        def _answer(self, *, body: bool) -> None:
            code, ctype, data = server.page(self.path.split("?", 1)[0])
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


__all__ = ["DEFAULT_INTERVAL", "DEFAULT_PORT", "DEFAULT_REFRESH", "ReportServer"]
