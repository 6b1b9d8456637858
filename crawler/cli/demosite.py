"""The demo's site: a few small hosts on loopback, served while ``demo`` crawls them.

Theory of operation. Each host is an address of its own in 127.0.0.0/8 (Linux
routes all of it to loopback), so the crawler's per-host politeness sees
separate hosts and spreads its fetches over them. All hosts listen on one
port: the first binds port 0, the others take the port it got (if one of them
finds it taken, every socket is closed and a new port is tried). Nothing is
resolved by DNS: every URL names its host by its IP.

The pages are fixed text, so every run crawls the same site: links between
the hosts, a robots.txt per host (one path disallowed), a sitemap that lists a
page no link reaches, a permanent redirect, a 404, and one link to a loopback
address that is not one of the demo's hosts (a crawl of the demo must not
follow it). The hosts answer GET and HEAD; a path they do not know is a 404.

Every request is logged in ``requests`` (when, which host, which path), so a
test can see what a crawl asked and how often. Thread-safe: each host's
server answers on threads of its own; ``DemoSite`` itself is started and
stopped from one thread.
"""

from __future__ import annotations

import errno
import logging
import socketserver
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

# Every host's address, the first the home page's. 127.0.0.1 is left alone: it is the
# address a user's own servers are most likely on.
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6")
# A loopback address the home page links to and the crawl must never fetch.
OUTSIDE = "127.0.0.9"
BIND_TRIES = 20  # ports tried before giving up (each is taken on some address)


@dataclass(frozen=True, slots=True)
class Page:
    """One page: its title, a sentence, and its links. A link is ``"N/path"`` (host
    number N of HOSTS, from 1), ``"/path"`` (this host), or ``"outside/path"``."""

    title: str
    text: str
    links: tuple[str, ...] = ()


# host number -> path -> page. What each host holds is kept to a few pages: at one
# request a second per host (the default politeness), the crawl takes seconds.
PAGES: dict[int, dict[str, Page]] = {
    1: {
        "/": Page("Home", "The home of a small web that lives on your own machine.",
                  ("/about.html", "2/", "3/", "4/", "5/", "/private/plans.html",
                   "outside/")),
        "/about.html": Page("About", "Every host of this web is an address of 127.0.0.0/8.",
                            ("/", "2/start.html")),
    },
    2: {
        "/": Page("Docs", "How to use the tool, in two pages.",
                  ("/start.html", "/install", "1/")),
        "/start.html": Page("Getting started", "Crawl, rank, report.", ("/", "3/")),
    },
    3: {
        "/": Page("Blog", "Notes, one a week.",
                  ("/2024/first.html", "/2024/second.html", "/2023/gone.html")),
        "/2024/first.html": Page("First post", "A first note.", ("1/about.html", "5/")),
        "/2024/second.html": Page("Second post", "A second note.", ("/", "4/today.html")),
    },
    4: {
        "/": Page("News", "What happened today.", ("/today.html", "3/2024/second.html")),
        "/today.html": Page("Today", "Nothing much.", ("/",)),
        # In the sitemap only: no page links here.
        "/archive.html": Page("Archive", "Found through the sitemap.", ("/",)),
    },
    5: {
        "/": Page("Shop", "Things to buy.", ("/item.html", "1/")),
        "/item.html": Page("Item", "A thing to buy.", ("/", "2/")),
    },
}
# Permanent redirects: host number -> path -> the path it moved to (same host).
REDIRECTS = {2: {"/install": "/start.html"}}
# robots.txt of every host: one path is off-limits.
DISALLOWED = "/private/"
# Sitemaps: host number -> the paths its /sitemap.xml lists (others have none: a 404).
SITEMAPS = {4: ("/", "/today.html", "/archive.html")}


class DemoSite:
    """The demo's hosts, listening on loopback until :meth:`stop` (a context manager).

    ``hosts``: how many of HOSTS to serve (the pages of the others are not served and
    links to them lead nowhere); ``port``: 0 for any free one, the same on every host.
    """

    def __init__(self, *, hosts: int = len(HOSTS), port: int = 0) -> None:
        if not 1 <= hosts <= len(HOSTS):
            raise ValueError(f"hosts: 1 to {len(HOSTS)}, not {hosts}")
        self.addresses = HOSTS[:hosts]
        self._wanted_port = port
        self.port = 0
        self._servers: list[_HostServer] = []
        self._threads: list[threading.Thread] = []
        # (time.monotonic(), host address, path) of every request, in the order answered
        self.requests: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()  # guards requests

    # -- what it serves ------------------------------------------------------------------

    def origin(self, number: int) -> str:
        """``http://IP:PORT`` of host ``number`` (1-based)."""
        return f"http://{HOSTS[number - 1]}:{self.port}"

    @property
    def home(self) -> str:
        """The seed: the first host's home page."""
        return self.origin(1) + "/"

    @property
    def origins(self) -> list[str]:
        return [self.origin(n) for n in range(1, len(self.addresses) + 1)]

    def url(self, number: int, link: str) -> str:
        """The absolute URL of ``link`` (as in :class:`Page`) on host ``number``."""
        head, slash, path = link.partition("/")
        if not head:
            return self.origin(number) + link
        if head == "outside":
            return f"http://{OUTSIDE}:{self.port}/{path}"
        return self.origin(int(head)) + slash + path

    def answer(self, number: int, path: str) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of GET ``path`` on host ``number``. Thread-safe."""
        with self._lock:
            self.requests.append((time.monotonic(), HOSTS[number - 1], path))
        html = "text/html; charset=utf-8"
        if path == "/robots.txt":
            lines = ["User-agent: *", f"Disallow: {DISALLOWED}"]
            if number in SITEMAPS:
                lines.append(f"Sitemap: {self.origin(number)}/sitemap.xml")
            return 200, {"Content-Type": "text/plain"}, ("\n".join(lines) + "\n").encode()
        if path == "/sitemap.xml" and number in SITEMAPS:
            urls = "".join(f"<url><loc>{self.origin(number)}{p}</loc></url>"
                           for p in SITEMAPS[number])
            body = ('<?xml version="1.0" encoding="UTF-8"?><urlset xmlns='
                    f'"http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>')
            return 200, {"Content-Type": "application/xml"}, body.encode()
        moved = REDIRECTS.get(number, {}).get(path)
        if moved is not None:
            return 301, {"Location": self.origin(number) + moved}, b""
        page = PAGES.get(number, {}).get(path)
        if page is None:
            body = "<!doctype html><title>Not found</title><p>No such page.</p>"
            return 404, {"Content-Type": html}, body.encode()
        items = "".join(f'<li><a href="{self.url(number, link)}">{link}</a></li>'
                        for link in page.links)
        body = (f"<!doctype html><html><head><title>{page.title}</title></head><body>"
                f"<h1>{page.title}</h1><p>{page.text}</p><ul>{items}</ul></body></html>")
        return 200, {"Content-Type": html}, body.encode()

    def page_count(self) -> int:
        """Pages a complete crawl of the served hosts records with status 200."""
        return sum(len(PAGES[n]) for n in range(1, len(self.addresses) + 1))

    # -- serving ---------------------------------------------------------------------------

    def start(self) -> DemoSite:
        """Listen on every host (OSError if an address cannot be bound) and serve."""
        if self._servers:
            raise RuntimeError("the demo site is serving already")
        for _ in range(BIND_TRIES):
            try:
                self._servers = self._bind_all()
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or self._wanted_port:
                    raise
        else:
            raise OSError(errno.EADDRINUSE, f"no port free on all of {', '.join(self.addresses)}"
                          f" after {BIND_TRIES} tries")
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, name="demo-site",
                                      kwargs={"poll_interval": 0.1}, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("demo site on %s", ", ".join(self.origins))
        return self

    def _bind_all(self) -> list[_HostServer]:
        servers: list[_HostServer] = []
        port = self._wanted_port
        try:
            for number, address in enumerate(self.addresses, 1):
                server = _HostServer((address, port), self, number)
                servers.append(server)
                port = port or server.server_address[1]
        except OSError:
            for server in servers:
                server.server_close()
            raise
        self.port = port
        return servers

    def stop(self) -> None:
        """Stop answering and close every socket. Idempotent."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def __enter__(self) -> DemoSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _HostServer(ThreadingHTTPServer):
    """One host of the site: its address, its number, the site that answers for it."""

    daemon_threads = True
    allow_reuse_address = False  # a port another program holds is taken, not shared

    def __init__(self, address: tuple[str, int], site: DemoSite, number: int) -> None:
        self.site, self.number = site, number
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind asks socket.getfqdn() for its name: a reverse DNS query
        # that may leave the machine. The demo's hosts are their addresses.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Handler(BaseHTTPRequestHandler):
    server: _HostServer
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        status, headers, content = self.server.site.answer(self.server.number,
                                                            self.path.split("?")[0])
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if body:
            self.wfile.write(content)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)
