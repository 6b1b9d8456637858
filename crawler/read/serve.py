"""``python -m crawler serve``: the crawl report live, read-only, over HTTP on loopback.

A background thread recomputes the report (crawler.read.report, through a
read-only reader: it never writes the crawl) every ``interval`` seconds, and
only when the crawl changed (its record count or status.json moved on);
requests are answered from the last computed report, so a slow computation
never holds a request. ``/`` is the HTML page, which refreshes itself every
``refresh`` seconds; ``/report.json`` the same numbers; ``/metrics`` the shards' status
in the Prometheus text format (crawler.read.metrics, read at each scrape); ``/search`` the
search page (crawler.search.page, when the command line gives one: no script, a
Content-Security-Policy that allows nothing from anywhere); anything else is 404
and any method but GET/HEAD is 405. The server binds 127.0.0.1 by default:
the report shows URLs and hosts of the crawl, for the operator.

Who is answered (:class:`HostRule`). A loopback port is reachable from any
web page in the operator's browser through DNS rebinding (a name the page's
author controls, re-pointed at 127.0.0.1), so the Host header is checked
before anything else: only the names the server is reachable by on purpose
get an answer, the others 421 Misdirected Request, a missing (under HTTP/1.1),
repeated or malformed Host 400 (RFC 9112 §3.2), with a short text and no
crawl data. A rebinding page always sends its own name, never an address, so
a server bound to every address (0.0.0.0, ::) also answers any address
literal. Our own HTML pages escape every text they show.

Thread safety: the report is swapped under a lock; http.server serves each
request in its own thread; a HostRule is immutable.
"""

from __future__ import annotations

import html
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..exceptions import ConfigError, CrawlerError
from . import metrics
from .listing import CrawlReader
from .report import compute
from .reporthtml import render

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
DEFAULT_INTERVAL = 30.0  # seconds between recomputations (at most)
DEFAULT_REFRESH = 15  # seconds between reloads of the page
# A connection that sends no (complete) request in this long is closed: each one holds a
# thread, so a client that connects and says nothing must not hold it forever.
DEFAULT_REQUEST_TIMEOUT = 30.0
# Seconds stop() waits for a report or a search under way before it leaves them to an
# exit without the interpreter's shutdown (stop's docstring).
STOP_WAIT = 2.0
#: ``/search``'s page: (query string) -> (status, HTML); crawler.search.page supplies it
#: (the search layer sits above this one, so the command line hands it in).
SearchPage = Callable[[str], tuple[int, str]]
SEARCH_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                 "base-uri 'none'; frame-ancestors 'none'")
#: The names a server is always reachable by on this machine (with or without its port).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
#: Binding these means every address of the machine.
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")
ALLOWED_METHODS = ("GET", "HEAD")
_NO_HOST_NEEDED = ("HTTP/0.9", "HTTP/1.0")  # Host is required from HTTP/1.1 on (no browser)
_MISDIRECTED = (b"misdirected request: this server does not answer for that Host"
                b" (see serve --allow-host)\n")
_BAD_HOST = b"bad request: HTTP/1.1 needs exactly one valid Host header\n"
_NOT_ALLOWED = b"method not allowed: this server is read-only (GET, HEAD)\n"
_WAITING = ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"refresh\" content=\"2\"><title>Crawl report</title></head>"
            "<body><p>Computing the report of {dir}&hellip;</p></body></html>\n")


def split_host(value: str) -> tuple[str, int | None] | None:
    """(lowercase name, port or None) of a Host header value or ``--allow-host``
    entry (``name``, ``name:port``, ``[v6]``, ``[v6]:port``); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        name, rest = value[: end + 1], value[end + 1 :]
        if end < 0 or not _is_ipv6(name[1:-1]) or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text = value.partition(":")
        if not colon:
            port_text = None
        if not name or any(c.isspace() or c in "/\\@:[]?#" for c in name):
            return None
    if not port_text:  # "name:" has an empty port: the default (RFC 3986 §3.2.3)
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def _is_address(name: str) -> bool:
    """Whether a Host name is an IP address literal (dotted IPv4, bracketed IPv6)."""
    if name.startswith("["):
        return _is_ipv6(name[1:-1])
    try:
        return ipaddress.ip_address(name).version == 4
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class HostRule:
    """Which Host header values a server answers. Immutable; build it with :meth:`for_server`.

    A name in ``names`` is answered without a port or with ``port`` (the port
    the server listens on); ``exact`` holds ``--allow-host`` entries given
    with their own port (a tunnel's, say); ``any_address``: any address
    literal too (the server is bound to every address).
    """

    names: frozenset[str]
    port: int
    exact: frozenset[tuple[str, int]] = frozenset()
    any_address: bool = False

    @classmethod
    def for_server(cls, bind_host: str, port: int, allow: Iterable[str] = ()) -> HostRule:
        """The rule of a server bound to ``bind_host``:``port``: the loopback names,
        ``bind_host`` itself, each ``allow`` entry (``NAME`` or ``NAME:PORT``); bound to
        every address, any address literal and this machine's name as well. Raises
        ValueError for a malformed ``allow`` entry."""
        names = set(LOOPBACK_NAMES)
        wildcard = bind_host in WILDCARD_ADDRESSES
        if wildcard:
            names.add(socket.gethostname().lower())
        else:
            names.add(f"[{bind_host.lower()}]" if _is_ipv6(bind_host) else bind_host.lower())
        exact = set()
        for entry in allow:
            parsed = split_host(entry) if entry.strip() == entry else None
            if parsed is None:
                raise ValueError(f"--allow-host {entry!r}: not a NAME or NAME:PORT")
            if parsed[1] is None:
                names.add(parsed[0])
            else:
                exact.add((parsed[0], parsed[1]))
        return cls(frozenset(names), port, frozenset(exact), wildcard)

    def accepts(self, host: str) -> bool:
        """Whether a request with this Host header value is answered. Thread-safe."""
        parsed = split_host(host)
        if parsed is None:
            return False
        name, port = parsed
        if port is not None and (name, port) in self.exact:
            return True
        if port is not None and port != self.port:
            return False
        return name in self.names or (self.any_address and _is_address(name))


class ReportServer:
    """Serves one crawl's report. ``start()`` returns once listening; ``stop()`` ends it.

    ``allow_hosts``: Host names (``NAME`` or ``NAME:PORT``) answered besides the
    ones :meth:`HostRule.for_server` gives; a malformed one raises ConfigError.
    """

    def __init__(self, data_dir: str, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 interval: float = DEFAULT_INTERVAL, refresh: int = DEFAULT_REFRESH,
                 allow_hosts: Iterable[str] = (),
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 search: SearchPage | None = None,
                 augment: Callable[[dict[str, Any]], None] | None = None,
                 **options: Any) -> None:
        allow_hosts = tuple(allow_hosts)
        self.request_timeout = request_timeout
        try:
            HostRule.for_server(host, port, allow_hosts)  # refuse a bad entry before binding
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        with CrawlReader(data_dir):  # fail now, not in the thread, on a bad directory
            pass
        self.data_dir, self.interval, self.refresh = data_dir, interval, refresh
        self.search = search
        self.augment = augment  # adds to each computed report (the search index's checks)
        self.options = options  # for report.compute (limit, rank...)
        self._lock = threading.Lock()
        self._html: bytes | None = None
        self._json: bytes | None = None
        self._error: str | None = None
        self._stamp: tuple[int, float] | None = None
        self._stop = threading.Event()
        self._answering = 0  # requests inside page(): a search may be in native code
        self._answered = threading.Condition()
        self.computations = 0
        server = ThreadingHTTPServer((host, port), _handler(self))
        server.daemon_threads = True
        self.httpd = server
        self.address: tuple[str, int] = server.server_address[:2]  # type: ignore[assignment]
        #: Who is answered: decided once the port is known (port 0 picks one).
        self.hosts = HostRule.for_server(host, self.address[1], allow_hosts)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/"

    def start(self) -> ReportServer:
        for target, name in ((self.httpd.serve_forever, "serve-http"),
                             (self._refresher, "serve-report")):
            t = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(t)  # before it starts: a stop() during start() sees it
            t.start()
        log.info("serving the report of %s at %s", self.data_dir, self.url)
        return self

    def stop(self, wait: float | None = None) -> bool:
        """Stop serving now. A report being computed and requests being answered are
        waited for ``wait`` seconds at most (default STOP_WAIT: Ctrl-C stops at once);
        their threads are daemons that write nothing. True if they ended; False if one
        is still at work, and then the process must end without the interpreter's
        shutdown (``os._exit``), which can abort a thread inside native code such as the
        charts' C++ (``crawler.cli._common.exit_at_once``)."""
        self._stop.set()
        # shutdown() waits for serve_forever: not if a signal cut start() before its thread
        # ran (a caller may also run serve_forever itself, without start())
        if not any(t.name == "serve-http" and t.ident is None for t in self._threads):
            self.httpd.shutdown()
        self.httpd.server_close()
        wait = STOP_WAIT if wait is None else wait
        deadline = time.monotonic() + wait
        for t in self._threads:
            if t.ident is not None:
                t.join(timeout=60 if t.name == "serve-http" else wait)
        with self._answered:  # a request's thread is a daemon too (a search in tantivy)
            self._answered.wait_for(lambda: self._answering == 0,
                                    max(0.0, deadline - time.monotonic()))
            answering = self._answering
        return answering == 0 and not any(t.is_alive() for t in self._threads)

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
            if self.augment is not None:
                self.augment(report)
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

    def page(self, path: str, query: str = "") -> tuple[int, str, bytes]:
        with self._answered:
            self._answering += 1
        try:
            return self._page(path, query)
        finally:
            with self._answered:
                self._answering -= 1
                self._answered.notify_all()

    def _page(self, path: str, query: str) -> tuple[int, str, bytes]:
        if path == "/search" and self.search is not None:
            code, text = self.search(query)
            return code, "text/html; charset=utf-8", text.encode("utf-8")
        with self._lock:
            report_html, data, error = self._html, self._json, self._error
        if path in ("/", "/index.html"):
            if report_html is None:
                text = (_WAITING.format(dir=html.escape(self.data_dir)) if error is None else
                        "<!DOCTYPE html><title>error</title>"
                        f"<p>report failed: {html.escape(error)}</p>")
                return HTTPStatus.OK, "text/html; charset=utf-8", text.encode("utf-8")
            return HTTPStatus.OK, "text/html; charset=utf-8", report_html
        if path == "/report.json":
            if data is None:
                return (HTTPStatus.SERVICE_UNAVAILABLE, "application/json",
                        json.dumps({"error": error or "computing"}).encode())
            return HTTPStatus.OK, "application/json", data
        if path == "/metrics":  # read anew each scrape: the shards' status files
            try:
                text = metrics.metrics_text(self.data_dir)
            except (OSError, CrawlerError) as exc:
                return (HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                        f"metrics unavailable: {exc}\n".encode())
            return HTTPStatus.OK, metrics.CONTENT_TYPE, text.encode("utf-8")
        return HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n"


def _handler(server: ReportServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kvcrawl-report"
        timeout = server.request_timeout  # on the socket: a silent client is dropped

        def parse_request(self) -> bool:
            """http.server's parsing, then the Host and the method, before any do_*: so
            every method, known to http.server or not, gets 421/400/405 (not 501)."""
            if not super().parse_request():
                return False
            hosts = self.headers.get_all("Host") or []
            if len(hosts) > 1 or (not hosts and self.request_version not in _NO_HOST_NEEDED):
                return self._refuse(HTTPStatus.BAD_REQUEST, _BAD_HOST)
            if hosts and split_host(hosts[0]) is None:
                return self._refuse(HTTPStatus.BAD_REQUEST, _BAD_HOST)
            if hosts and not server.hosts.accepts(hosts[0]):
                log.info("refused a request for Host %r from %s (serve --allow-host NAME "
                         "answers it)", hosts[0], self.address_string())
                return self._refuse(HTTPStatus.MISDIRECTED_REQUEST, _MISDIRECTED)
            if self.command not in ALLOWED_METHODS:
                return self._refuse(HTTPStatus.METHOD_NOT_ALLOWED, _NOT_ALLOWED,
                                    Allow=", ".join(ALLOWED_METHODS))
            return True

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(body=False)

        def _refuse(self, code: HTTPStatus, text: bytes, **headers: str) -> bool:
            self.close_connection = True
            self._send(code, "text/plain; charset=utf-8", text, body=self.command != "HEAD",
                       **headers)
            return False

        def _answer(self, *, body: bool) -> None:
            path, _, query = self.path.partition("?")
            code, ctype, data = server.page(path, query)
            # the search page's policy: nothing but its inline style and its own form
            extra = {"Content-Security-Policy": SEARCH_POLICY} if path == "/search" else {}
            self._send(code, ctype, data, body=body, **extra)

        def _send(self, code: int, ctype: str, data: bytes, *, body: bool,
                  **headers: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


__all__ = ["DEFAULT_INTERVAL", "DEFAULT_PORT", "DEFAULT_REFRESH", "HostRule", "ReportServer",
           "split_host"]
