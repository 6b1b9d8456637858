"""One HTTP(S) GET, bounded in every dimension: the crawler's only door to the web.

Theory of operation
-------------------
``Fetcher.fetch(url)`` resolves the host with ``resolve`` (the crawler's DNS
cache; its DNSError propagates unchanged) and sends one GET over an
``http.client`` connection whose socket is opened to the resolved IP
(crawler.net.connections: TCP, then TLS with the host name as SNI and for the
certificate check; the name also goes into the Host header). Kept-alive
connections are reused per origin; a reused one that the server had just
closed is retried once on a fresh connection. requests/urllib3 are not in
this path: they cost ~3x the CPU per fetch, and the crawler is CPU-bound.

Bounds, per fetch:

- ``connect_timeout``: the TCP connect, and the TLS handshake as a whole
  (CPython bounds a handshake by the socket timeout in total); both are also
  capped by the time left. ``read_timeout``: each socket read.
- ``total_timeout``, connect to last byte (DNS is the resolver's business),
  enforced by crawler.net.watchdog, which shuts the fetch's socket down at the
  deadline (a server dripping a byte every 100 ms never trips a read
  timeout); the fetch then raises ``FetchError(url, "total_timeout")`` and
  the connection is dropped.
- ``max_body_bytes`` on the wire (after chunked framing) and
  ``max_decoded_bytes`` after Content-Encoding (gzip, deflate, br, zstd: what
  crawler.net.decoding can decode here is what Accept-Encoding asks for),
  decoded while streaming, never past the limit, so a bomb never expands past
  it. A cut body is
  not an error: the result has ``truncated=True``, ``truncate_reason``
  "too_large" or "decompression_bomb", the body cut exactly at the limit, and
  the connection is closed. Memory: the body (plus the buffer's 1/8 slack)
  and one read of 64 KiB raw and 64 KiB decoded (a bomb's read is inflated
  64 KiB at a time). With a ``lease`` (crawler.run.budget), each piece is
  counted before it is kept, so a fetch waits rather than pass the crawl's
  memory budget. A coding not asked for (or a list of codings), if sent
  anyway, is left as received.
- Redirects are not followed: a 3xx's absolute Location is ``redirect``.
- ``proxies`` (target scheme -> crawler.net.proxy.Proxy): the connection to a
  target of that scheme is a tunnel through the proxy to the resolved, checked IP
  (never the name); TLS, the Host header and every bound above are as direct. A
  Fetcher's proxy of a scheme never changes, so the pool's origins (scheme, host,
  port) never mix proxied and direct connections. A proxy's failure is a connect
  failure (connect_refused, connect_timeout, connect_error) naming the proxy.
- A few headers are kept (lowercase, values cut to ``max_header_value``);
  http.client caps a header line at 64 KiB and a response at 100 headers.
  Set-Cookie, which comes once per cookie, is kept whole: its lines of at
  most 4096 bytes (what the cookie jar takes, crawler.web.cookies) joined by
  a newline, up to ``MAX_SET_COOKIE_BYTES``.

Errors: ``FetchError(url, reason)`` raised ``from`` the underlying error,
reason one of connect_refused, connect_timeout, connect_error (unreachable
and other connect failures), read_timeout, total_timeout, reset (connection
reset or closed mid-response), tls, protocol (garbage response, bad chunked
framing, a body its Content-Encoding cannot decode) or aborted (the Fetcher
was closed meanwhile: not the URL's fault). A URL that cannot be sent raises
URLError.

Thread safety: all public methods may be called from any number of threads.
A connection is used by one fetch at a time (out of the pool meanwhile).
"""

from __future__ import annotations

import http.client
import io
import logging
import ssl
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol
from urllib.parse import urlsplit

import certifi

from .. import outcomes
from ..config import (  # the defaults of what a crawl's options set (what none sets: below)
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DECODED_BYTES,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_TOTAL_TIMEOUT,
)
from ..exceptions import ConfigError, FetchError, URLError
from ..web.urls import DEFAULT_PORTS, URL, host_key
from . import decoding, proxy
from .answer import KEPT_HEADERS, VERSIONS, FetchResult, redirect_target, set_cookie_lines
from .auth import Credentials, merge_headers
from .connections import (
    Connection,
    ConnectionPool,
    Origin,
    connect_tcp,
    make_connection,
    wrap_tls,
)
from .h2session import ALPN_H2, H2Response
from .watchdog import Watch, Watchdog

log = logging.getLogger(__name__)

DEFAULT_POOL_CONNECTIONS = 1000  # origins whose idle connections are kept, LRU
DEFAULT_POOL_MAXSIZE = 8  # idle connections kept per host (more may be open at once)
DEFAULT_MAX_HEADER_VALUE = 2048
DEFAULT_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
READ_CHUNK = 64 << 10

Resolve = Callable[[str], str]


class Lease(Protocol):
    """Where a fetch counts the body bytes it holds (crawler.run.budget.Lease)."""

    def grow(self, n: int) -> None: ...


_RESET = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
          http.client.IncompleteRead, ssl.SSLEOFError)


def _classify(exc: BaseException, phase: str) -> str:
    """The reason class of an error in ``phase``: connect, tls, response or body."""
    if phase == "connect":
        if isinstance(exc, ConnectionRefusedError):
            return outcomes.CONNECT_REFUSED
        return outcomes.CONNECT_TIMEOUT if isinstance(exc, TimeoutError) else outcomes.CONNECT_ERROR
    if isinstance(exc, TimeoutError):
        return outcomes.CONNECT_TIMEOUT if phase == "tls" else outcomes.READ_TIMEOUT
    if isinstance(exc, _RESET):  # before HTTPException: RemoteDisconnected is both
        return outcomes.RESET
    if phase == "tls" or isinstance(exc, ssl.SSLError):
        return outcomes.TLS
    if isinstance(exc, zlib.error | ValueError | http.client.HTTPException):
        return outcomes.PROTOCOL  # bad status line, too many headers, bad chunk size, bad gzip
    return outcomes.RESET  # any other socket error ends the stream early


def _detail(exc: BaseException) -> str:
    return repr(exc)[:200]


def _request_of(url: str) -> URL:
    """Split an http(s) URL string for sending; URLError if it cannot be sent as it is.
    (A parsed URL from crawler.web.urls.parse is sent as it is.)"""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise URLError(url, f"cannot be requested: {exc}") from exc
    scheme = parts.scheme.lower()
    if not host or scheme not in DEFAULT_PORTS:
        raise URLError(url, "not an http(s) URL with a host")
    if not url.isascii() or any(c in url for c in " \t\r\n\x00"):
        raise URLError(url, "cannot be requested: not a normalized URL (raw spaces or non-ASCII)")
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal, as it goes into the Host header
    port = port or DEFAULT_PORTS[scheme]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return URL(url, scheme, host, port, target, host_key(host))


Response = http.client.HTTPResponse | H2Response


def _ssl_context(ca_bundle: str | None, http2: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)  # CERT_REQUIRED, hostname check
    if http2:  # offered in the handshake; the server chooses (h2 needs TLS 1.2 or later)
        ctx.set_alpn_protocols([ALPN_H2, "http/1.1"])
    try:
        ctx.load_verify_locations(ca_bundle or certifi.where())
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load CA bundle {ca_bundle!r}: {exc}") from exc
    return ctx


# -- the fetcher -------------------------------------------------------------------------


class Fetcher:
    """Fetches URLs with one GET each; see the module docstring. Thread-safe."""

    def __init__(
        self,
        *,
        user_agent: str,
        resolve: Resolve,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        total_timeout: float = DEFAULT_TOTAL_TIMEOUT,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
        ca_bundle: str | None = None,
        pool_connections: int = DEFAULT_POOL_CONNECTIONS,
        pool_maxsize: int = DEFAULT_POOL_MAXSIZE,
        max_header_value: int = DEFAULT_MAX_HEADER_VALUE,
        accept: str = DEFAULT_ACCEPT,
        added_headers: tuple[tuple[str, str], ...] = (),
        credentials: Credentials | None = None,
        http2: bool = False,
        proxies: Mapping[str, proxy.Proxy] | None = None,
    ) -> None:
        """``added_headers``: the user's lines (--header, checked by
        crawler.net.auth.parse_header), sent with every request; ``credentials``: the
        Authorization to send each host over https (--netrc); ``http2``: offer h2 in
        the TLS handshake of https connections (crawler.net.h2session)."""
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout),
                            ("total_timeout", total_timeout), ("max_body_bytes", max_body_bytes),
                            ("max_decoded_bytes", max_decoded_bytes),
                            ("pool_connections", pool_connections),
                            ("pool_maxsize", pool_maxsize), ("max_header_value", max_header_value)):
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value!r}")
        self._proxies = dict(proxies or {})
        for scheme, p in self._proxies.items():
            if scheme not in proxy.TARGETS or (scheme == "https" and p.scheme == "https"):
                raise ConfigError(f"no {p.scheme} proxy for {scheme} targets: see "
                                  "crawler.net.proxy")
        self._resolve = resolve
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._total = total_timeout
        self._max_body = max_body_bytes
        self._max_decoded = max_decoded_bytes
        self._max_header = max_header_value
        self._headers = merge_headers((("User-Agent", user_agent), ("Accept", accept),
                                       ("Accept-Encoding", decoding.ACCEPT_ENCODING)),
                                      added_headers)
        self._credentials = credentials
        self._ssl = _ssl_context(ca_bundle, http2)
        # an https proxy speaks HTTP/1.1 (CONNECT): never offered h2
        self._proxy_ssl = _ssl_context(ca_bundle) if http2 and self._proxies else self._ssl
        self._dog = Watchdog()
        self._pool = ConnectionPool(origins=pool_connections, per_origin=pool_maxsize)
        self._closed = False

    def fetch(self, url: str | URL, headers: tuple[tuple[str, str], ...] = (), *,
              lease: Lease | None = None, address: str | None = None) -> FetchResult:
        """GET ``url`` (http/https): a string, or a URL parsed from a normalized one
        (:func:`crawler.web.urls.parse`), which is not split or checked again.
        ``headers`` are sent besides ours (a recrawl's If-None-Match, If-Modified-Since).
        ``lease``: where the body's bytes are counted before they are kept (it may
        make the fetch wait). ``address``: the host's IP as ``resolve`` gave it to the
        caller already (then it is not asked again: the address checked is the one
        connected). Raises DNSError (from ``resolve``), FetchError or URLError; any
        HTTP status is a FetchResult. Thread-safe."""
        started, t0 = time.time(), time.monotonic()
        request = url if isinstance(url, URL) else None
        text = url.url if isinstance(url, URL) else url
        if self._closed:
            raise FetchError(text, outcomes.ABORTED, "the fetcher is closed")
        if request is None:
            request = _request_of(text)
        ip = address if address is not None else self._resolve(request.host.strip("[]"))
        w = self._dog.start(self._total)
        try:
            return self._exchange(text, request, ip, w, started, t0, headers, lease)
        finally:
            self._dog.finish(w)

    def close(self) -> None:
        """Close every pooled connection; fetches in flight end with "aborted".
        Idempotent, thread-safe."""
        if self._closed:
            return
        self._closed = True
        self._dog.close()
        self._pool.close()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one exchange ---------------------------------------------------------------------

    def _fail(self, url: str, w: Watch, exc: BaseException, phase: str) -> FetchError:
        if w.aborted:
            return FetchError(url, outcomes.ABORTED, "the fetcher was closed")
        # A socket timeout is capped at what is left of the total: one that fires at the
        # deadline is the total's, even before the watchdog's thread (starved on a busy
        # machine) has marked the watch expired.
        if w.expired or (isinstance(exc, TimeoutError) and w.remaining() <= 0):
            return FetchError(url, outcomes.TOTAL_TIMEOUT, f"over {self._total:g} s")
        return FetchError(url, _classify(exc, phase), _detail(exc))

    def _open(self, url: str, req: URL, origin: Origin, ip: str, w: Watch) -> Connection:
        """A new connection to ``ip`` for ``req``'s origin, TLS done, attached to ``w``."""
        scheme, host, port = origin
        via = self._proxies.get(scheme)
        try:
            timeout = max(min(self._connect_timeout, w.remaining()), 0.001)
            if via is None:
                sock = connect_tcp(ip, port, timeout)
            else:
                sock = proxy.connect(via, timeout)
                self._dog.attach(w, sock)  # the handshake is in the total time too
                sock = proxy.tunnel(sock, via, ip, port, self._proxy_ssl)
        except OSError as exc:
            raise self._fail(url, w, exc, "connect") from exc
        self._dog.attach(w, sock)
        if scheme == "https":
            try:
                sock.settimeout(max(min(self._connect_timeout, w.remaining()), 0.001))
                sock = wrap_tls(sock, host, self._ssl)
            except (OSError, ValueError) as exc:
                raise self._fail(url, w, exc, "tls") from exc
            self._dog.attach(w, sock)
        sock.settimeout(self._read_timeout)
        try:
            return make_connection(origin, sock, ip)  # HTTP/2 sends its preface here
        except (OSError, http.client.HTTPException) as exc:
            sock.close()
            raise self._fail(url, w, exc, "response") from exc

    def _send(
        self, url: str, req: URL, origin: Origin, ip: str, w: Watch,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> tuple[Connection, Response]:
        """Send the GET and read the status line and headers."""
        for attempt in (1, 2):
            conn = self._pool.take(origin) if attempt == 1 else None
            reused = conn is not None
            if conn is None:
                conn = self._open(url, req, origin, ip, w)
            elif conn.sock is not None:
                self._dog.attach(w, conn.sock)
            try:
                auth = self._credentials and self._credentials.header_for(req.scheme, req.host)
                sent = self._headers + extra + ((("Authorization", auth),) if auth else ())
                if conn.h2 is not None:
                    answer = conn.h2.get(req.netloc, req.target, sent)
                    conn.sent += 1
                    return conn, answer
                h = conn.http
                h.putrequest("GET", req.target, skip_host=True, skip_accept_encoding=True)
                h.putheader("Host", req.netloc)
                for name, value in sent:
                    h.putheader(name, value)
                h.endheaders()
                conn.sent += 1
                return conn, h.getresponse()
            except http.client.InvalidURL as exc:
                self._discard(conn, w)
                raise URLError(url, f"cannot be requested: {exc}") from exc
            except (http.client.HTTPException, OSError, ValueError) as exc:
                self._discard(conn, w)
                err = self._fail(url, w, exc, "response")
                if attempt == 1 and reused and err.reason == outcomes.RESET:
                    log.debug("%s: kept-alive connection was closed, retrying once", url)
                    continue
                raise err from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _discard(self, conn: Connection, w: Watch) -> None:
        self._dog.detach(w)
        conn.close()

    def _release(self, origin: Origin, conn: Connection, w: Watch, reusable: bool) -> None:
        killed = self._dog.detach(w)
        if killed or not reusable or conn.sock is None:
            conn.close()  # its socket was shut down, has unread bytes, or the server closes it
        else:
            self._pool.give(origin, conn)

    def _exchange(self, url: str, req: URL, ip: str, w: Watch, started: float, t0: float,
                  extra: tuple[tuple[str, str], ...], lease: Lease | None) -> FetchResult:
        origin = req.origin
        conn, resp = self._send(url, req, origin, ip, w, extra)
        try:
            body, wire, reason = self._read_body(resp, resp.getheader("content-encoding"),
                                                 lease)
        except (http.client.HTTPException, OSError, zlib.error, ValueError) as exc:
            self._discard(conn, w)
            raise self._fail(url, w, exc, "body") from exc
        if w.killed and reason is None:  # the body may have been cut by the watchdog
            self._discard(conn, w)
            raise self._fail(url, w, TimeoutError(), "body")
        self._release(origin, conn, w, reusable=reason is None and not resp.will_close)
        msg = resp.msg
        headers = {}
        for name in KEPT_HEADERS:
            value = msg.get(name)
            if value is not None:
                if "\x00" in value:  # no record (or WARC) holds one; h2 refuses it outright
                    value = value.replace("\x00", "")
                headers[name] = value[: self._max_header]
        cookies = set_cookie_lines(msg.get_all("set-cookie"))
        if cookies:
            headers["set-cookie"] = cookies
        redirect = None
        if 300 <= resp.status < 400:
            locations = msg.get_all("location")
            if locations:
                redirect = redirect_target(url, locations[0])
        return FetchResult(
            url=url, status=resp.status, headers=headers, body=body, ip=conn.ip,
            started=started, elapsed=time.monotonic() - t0, wire_bytes=wire,
            truncated=reason is not None, truncate_reason=reason, redirect=redirect,
            http_version=VERSIONS.get(resp.version, f"HTTP/{resp.version}"),
            protocol=conn.protocol)

    def _read_body(self, resp: Response, coding: str | None,
                   lease: Lease | None = None) -> tuple[bytes, int, str | None]:
        """Stream the body within both limits: (body, wire bytes, truncate reason)."""
        decoder = decoding.decoder_for(coding)
        cap = self._max_decoded if decoder else min(self._max_body, self._max_decoded)
        out = io.BytesIO()
        wire = size = 0
        reason: str | None = None
        keep = (lambda n: None) if lease is None else lease.grow
        keep(2 * READ_CHUNK)  # the read in hand and its decoded piece

        def take(pieces: Iterable[bytes]) -> str | None:
            """Keep ``pieces`` up to the cap; the truncate reason once past it."""
            nonlocal size
            for piece in pieces:
                full = len(piece) > cap - size
                if full:
                    piece = piece[: cap - size]
                keep(len(piece) + len(piece) // 8)  # BytesIO grows by 1/8 over its size
                out.write(piece)
                size += len(piece)
                if full:
                    return outcomes.DECOMPRESSION_BOMB if decoder else outcomes.TOO_LARGE
            return None

        while reason is None:
            data = resp.read(min(READ_CHUNK, self._max_body - wire + 1))
            if not data:
                if decoder is not None:
                    reason = take(decoder.finish(cap - size + 1))
                break
            wire += len(data)
            if wire > self._max_body:  # one byte over: there is more than the limit
                data = data[: len(data) - (wire - self._max_body)]
                wire, reason = self._max_body, outcomes.TOO_LARGE
            full = take(decoder.pieces(data, cap - size + 1) if decoder else (data,))
            reason = full or reason
        if reason is not None:
            resp.close()  # unread bytes on the wire: the connection cannot be reused
        return out.getvalue(), wire, reason
