"""One HTTP(S) GET, bounded in every dimension: the crawler's only door to the web.

Theory of operation
-------------------
``Fetcher.fetch(url)`` resolves the host with ``resolve`` (the crawler's DNS
cache; its DNSError propagates unchanged) and sends one GET straight through
urllib3 (requests' own transport, without requests' per-request preparation,
which cost more CPU than the rest of the exchange): pools are keyed by
(scheme, host, port) as usual but their connections open their socket to the
resolved IP. The connection
keeps the host *name*, so http.client puts it in the Host header and urllib3
sends it as TLS SNI and checks the certificate against it (one SSLContext per
Fetcher: CERT_REQUIRED, hostname check, ``ca_bundle`` or certifi). Kept-alive
connections are reused per host; a reused one that the server had just closed
is retried once on a fresh connection.

Bounds, per fetch:

- ``connect_timeout``: the TCP connect, and the TLS handshake as a whole
  (CPython bounds a handshake by the socket timeout in total); both are also
  capped by the time left. ``read_timeout``: each socket read.
- ``total_timeout``, connect to last byte (DNS is the resolver's business).
  A server dripping a byte every 100 ms never trips a read timeout, so a
  watchdog (one thread per Fetcher, a heap of deadlines) watches each fetch:
  the socket in use is attached to the fetch's *watch* when opened or reused
  and detached before its connection returns to the pool; on expiry the
  watchdog shuts it down (shutdown(2) wakes a blocked recv at once), the fetch
  raises ``FetchError(url, "total_timeout")`` and the connection is dropped.
- ``max_body_bytes`` on the wire (after chunked framing) and
  ``max_decoded_bytes`` after gzip/deflate, decoded here while streaming with
  zlib's ``max_length``, so a bomb never expands past the limit. A cut body is
  not an error: the result has ``truncated=True``, ``truncate_reason``
  "too_large" or "decompression_bomb", the body cut exactly at the limit, and
  the connection is closed. Memory: the limit plus one read. Other codings
  (br, zstd) are not requested; if sent anyway the body is left as received.
- Redirects are not followed: a 3xx's absolute Location is ``redirect``.
- A few headers are kept (lowercase, values cut to ``max_header_value``);
  http.client caps a header line at 64 KiB and a response at 100 headers.

Errors: ``FetchError(url, reason)`` raised ``from`` the library error, reason
one of connect_refused, connect_timeout, connect_error (unreachable and other
connect failures), read_timeout, total_timeout, reset (connection reset or
closed mid-response), tls, protocol (garbage response, bad gzip data) or
aborted (the Fetcher was closed meanwhile: not the URL's fault). A URL that
cannot be sent raises URLError.

Thread safety: all public methods may be called from any number of threads.
Pools and SSLContext are shared (urllib3 pools are thread-safe). urllib3 calls
our connection code deep in its stack, where the only handle on the fetch is
the calling thread, so the watch is found through a thread-local; its fields
change only under the watchdog's lock.
"""

from __future__ import annotations

import email.utils
import heapq
import http.client
import io
import itertools
import logging
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from requests.utils import DEFAULT_CA_BUNDLE_PATH
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, PoolManager, Timeout
from urllib3 import exceptions as u3
from urllib3.connection import HTTPConnection, HTTPSConnection

from .exceptions import ConfigError, FetchError, URLError

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_TOTAL_TIMEOUT = 60.0
DEFAULT_MAX_BODY_BYTES = 10 << 20
DEFAULT_MAX_DECODED_BYTES = 20 << 20
DEFAULT_POOL_CONNECTIONS = 1000  # hosts whose pools (and idle connections) are kept, LRU
DEFAULT_POOL_MAXSIZE = 8  # idle connections kept per host (more may be open at once)
DEFAULT_MAX_HEADER_VALUE = 2048
DEFAULT_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
READ_CHUNK = 64 << 10

KEPT_HEADERS = ("content-type", "content-length", "content-encoding", "location",
                "retry-after", "last-modified", "etag", "server", "date", "x-robots-tag")
_DECODED = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_VERSIONS = {9: "HTTP/0.9", 10: "HTTP/1.0", 11: "HTTP/1.1", 20: "HTTP/2"}
_HEAP_SLACK = 4096  # finished watches tolerated in the heap before it is compacted

Resolve = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One HTTP answer (any status). ``body`` is decoded (gzip/deflate) and at
    most the Fetcher's limit; ``wire_bytes`` counts body bytes received."""

    url: str
    status: int
    headers: dict[str, str]
    body: bytes
    ip: str
    started: float  # time.time() at the start
    elapsed: float  # seconds, DNS included
    wire_bytes: int
    truncated: bool = False
    truncate_reason: str | None = None  # "too_large" | "decompression_bomb"
    redirect: str | None = None  # absolute Location of a 3xx
    http_version: str = "HTTP/1.1"


# -- pure helpers ----------------------------------------------------------------------


def parse_retry_after(value: str, now: float) -> float | None:
    """Seconds to wait from a Retry-After value (delay-seconds or an HTTP-date,
    against ``now`` as time.time()), clamped to >= 0; None if unparsable."""
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:  # pragma: no cover - older Pythons returned None
        return None
    return max(0.0, when.timestamp() - now)


def parse_content_type(value: str) -> tuple[str, str | None]:
    """("text/html", "utf-8") from "text/html; charset=UTF-8"; ("", None) when absent."""
    mime, _, params = value.partition(";")
    charset = None
    for param in params.split(";"):
        name, _, val = param.partition("=")
        if name.strip().lower() == "charset":
            charset = val.strip().strip("\"'").strip().lower() or None
    return mime.strip().lower(), charset


def content_type(result: FetchResult) -> tuple[str, str | None]:
    """(mime, charset) of a FetchResult, lowercase; ("", None) when not declared."""
    return parse_content_type(result.headers.get("content-type", ""))


def _redirect_target(url: str, location: str) -> str | None:
    try:  # http.client decodes header bytes as Latin-1; most servers send UTF-8
        location = location.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    location = location.strip()
    if not location:
        return None
    try:
        return urljoin(url, location)
    except ValueError:  # e.g. a broken IPv6 literal
        return None


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and everything it wraps (cause, context, urllib3 reason, args)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 32:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        for nxt in (e.__cause__, e.__context__, getattr(e, "reason", None), *e.args):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return seen


def _classify(exc: BaseException, in_body: bool) -> str:
    """The reason class of a urllib3/http.client/ssl/socket error."""
    chain = _chain(exc)

    def has(*types: type[BaseException]) -> bool:
        return any(isinstance(e, types) for e in chain)

    if has(ConnectionRefusedError):
        return "connect_refused"
    if has(u3.ReadTimeoutError, TimeoutError) and not has(u3.ConnectTimeoutError):
        return "read_timeout"
    if has(u3.NewConnectionError):
        return "connect_error"
    if has(u3.ConnectTimeoutError, TimeoutError):
        return "connect_timeout"
    if has(u3.InvalidChunkLength, zlib.error):
        return "protocol"
    if in_body or has(ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
                      http.client.IncompleteRead, u3.IncompleteRead):
        return "reset"  # mid-body, anything that ends the stream early
    if has(ssl.SSLError, u3.SSLError):
        return "tls"
    return "protocol"


def _detail(exc: BaseException) -> str:
    return repr(_chain(exc)[-1])[:200]


@dataclass(frozen=True, slots=True)
class _Request:
    scheme: str
    host: str
    port: int
    target: str  # path and query, as sent


def _request_of(url: str) -> _Request:
    """Split an http(s) URL for urlopen; URLError if it cannot be sent as it is."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise URLError(url, f"cannot be requested: {exc}") from exc
    scheme = parts.scheme.lower()
    if not host or scheme not in ("http", "https"):
        raise URLError(url, "not an http(s) URL with a host")
    if not url.isascii() or any(c in url for c in " \t\r\n\x00"):
        raise URLError(url, "cannot be requested: not a normalized URL (raw spaces or non-ASCII)")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Request(scheme, host, port or (443 if scheme == "https" else 80), target)


# -- the watchdog ------------------------------------------------------------------------


def _shut(sock: socket.socket) -> None:
    # socket.socket.shutdown on purpose: SSLSocket.shutdown would also drop its
    # SSL object under a thread that may be inside SSL_read right now.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed or never connected
        pass


class _Watch:
    """The deadline of one fetch and the socket it is using (guarded by the dog's lock)."""

    __slots__ = ("dog", "deadline", "ip", "sock", "expired", "killed", "aborted", "done",
                 "reused")

    def __init__(self, dog: _Watchdog, deadline: float, ip: str) -> None:
        self.dog, self.deadline, self.ip = dog, deadline, ip
        self.sock: socket.socket | None = None
        self.expired = self.killed = self.aborted = self.done = self.reused = False

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


_current = threading.local()  # .watch: the _Watch of the fetch this thread is running


def _current_watch() -> _Watch | None:
    return getattr(_current, "watch", None)


class _Watchdog:
    """Shuts down the socket of any fetch that outlives its deadline. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = itertools.count()
        self._active = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, timeout: float, ip: str) -> _Watch:
        """A watch for the calling thread's fetch, expiring ``timeout`` s from now."""
        with self._cond:
            w = _Watch(self, time.monotonic() + timeout, ip)
            self._active += 1
            if self._closed:
                w.expired = w.aborted = True
            else:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="fetch-watchdog",
                                                    daemon=True)
                    self._thread.start()
                heapq.heappush(self._heap, (w.deadline, next(self._seq), w))
                if self._heap[0][2] is w:
                    self._cond.notify()
        _current.watch = w
        return w

    def attach(self, w: _Watch, sock: socket.socket) -> None:
        with self._cond:
            if w.done:
                return
            if w.expired:
                w.killed = True
                _shut(sock)
            else:
                w.sock = sock

    def detach(self, w: _Watch) -> bool:
        """Forget the socket (its connection goes back to the pool); True if it was killed."""
        with self._cond:
            w.sock = None
            return w.killed

    def finish(self, w: _Watch) -> None:
        with self._cond:
            if not w.done:
                w.done, w.sock = True, None
                self._active -= 1
                if len(self._heap) > _HEAP_SLACK + 2 * self._active:
                    self._heap = [e for e in self._heap if not e[2].done]
                    heapq.heapify(self._heap)
        _current.watch = None

    def close(self) -> None:
        """Stop the thread and cut every fetch in flight (they raise "aborted")."""
        with self._cond:
            self._closed = True
            for _, _, w in self._heap:
                if not w.done:
                    w.expired = w.aborted = True
                    if w.sock is not None:
                        w.killed = True
                        _shut(w.sock)
            self._heap.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                w = heapq.heappop(self._heap)[2]
                if w.done:
                    continue
                w.expired = True
                if w.sock is not None:
                    w.killed = True
                    log.debug("total timeout: shutting down a socket to %s", w.ip)
                    _shut(w.sock)
                    w.sock = None


# -- urllib3 plumbing ------------------------------------------------------


class _HTTPConnection(HTTPConnection):
    """Opens its socket to the IP of the calling thread's watch, keeping the host name."""

    peer_ip: str | None = None
    _sent = 0  # requests sent on the current socket

    def _new_conn(self) -> socket.socket:
        w = _current_watch()
        if w is None:
            raise u3.NewConnectionError(self, "no resolved address: only Fetcher.fetch connects")
        timeout = self.timeout if isinstance(self.timeout, float | int) else None
        remaining = max(w.remaining(), 0.001)  # the connect counts against total_timeout
        timeout = remaining if timeout is None else min(timeout, remaining)
        family = socket.AF_INET6 if ":" in w.ip else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            for opt in self.socket_options or ():
                sock.setsockopt(*opt)
            sock.settimeout(timeout)
            sock.connect((w.ip, self.port))
        except TimeoutError as e:
            sock.close()
            raise u3.ConnectTimeoutError(self, f"connect to {self.host} ({w.ip}) timed out") from e
        except OSError as e:
            sock.close()
            raise u3.NewConnectionError(self, f"cannot connect to {self.host} ({w.ip}): {e}") from e
        self.peer_ip, self._sent = w.ip, 0
        w.dog.attach(w, sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        w = _current_watch()
        if w is not None and self.sock is not None:  # TLS already up, or kept alive
            w.reused = self._sent > 0
            w.dog.attach(w, self.sock)
        super().request(*args, **kwargs)  # connects here if plain HTTP and new
        self._sent += 1


class _HTTPSConnection(_HTTPConnection, HTTPSConnection):
    pass


class _PoolMixin:
    def _put_conn(self, conn: Any) -> None:
        w = _current_watch()
        if w is not None and w.dog.detach(w) and conn is not None:
            conn.close()  # its socket was shut down: never reuse it
        super()._put_conn(conn)  # type: ignore[misc]


class _HTTPPool(_PoolMixin, HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(_PoolMixin, HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


def _pool_manager(ssl_context: ssl.SSLContext, connections: int, maxsize: int) -> PoolManager:
    """Pools of resolved connections, LRU over ``connections`` hosts; TLS from our context
    (CERT_REQUIRED and the trust store live in it, loaded once)."""
    manager = PoolManager(num_pools=connections, maxsize=maxsize, block=False,
                          ssl_context=ssl_context)
    manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
    return manager


def _ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)  # CERT_REQUIRED, hostname check
    try:
        ctx.load_verify_locations(ca_bundle or DEFAULT_CA_BUNDLE_PATH)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load CA bundle {ca_bundle!r}: {exc}") from exc
    return ctx


class _Decoder:
    """Streaming gzip/deflate with a cap on each call's output (zlib's max_length)."""

    def __init__(self, wbits: int) -> None:
        self._z = zlib.decompressobj(wbits)
        self._raw_ok = wbits == zlib.MAX_WBITS  # "deflate" is sometimes sent without zlib header
        self._fed = False

    def decode(self, data: bytes, limit: int) -> bytes:
        try:
            out = self._z.decompress(data, limit)
        except zlib.error:
            if not self._raw_ok or self._fed:
                raise
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._z.decompress(data, limit)
        self._fed = True
        return out

    def flush(self) -> bytes:
        return self._z.flush()


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
    ) -> None:
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout),
                            ("total_timeout", total_timeout), ("max_body_bytes", max_body_bytes),
                            ("max_decoded_bytes", max_decoded_bytes),
                            ("pool_connections", pool_connections),
                            ("pool_maxsize", pool_maxsize), ("max_header_value", max_header_value)):
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value!r}")
        self._resolve = resolve
        self._timeout = Timeout(connect=connect_timeout, read=read_timeout)
        self._total = total_timeout
        self._max_body = max_body_bytes
        self._max_decoded = max_decoded_bytes
        self._max_header = max_header_value
        self._headers = {"User-Agent": user_agent, "Accept": accept,
                         "Accept-Encoding": "gzip, deflate"}
        self._dog = _Watchdog()
        self._pools = _pool_manager(_ssl_context(ca_bundle), pool_connections, pool_maxsize)
        self._closed = False

    def fetch(self, url: str) -> FetchResult:
        """GET ``url`` (http/https). Raises DNSError (from ``resolve``), FetchError or
        URLError; any HTTP status is a FetchResult. Thread-safe."""
        started, t0 = time.time(), time.monotonic()
        if self._closed:
            raise FetchError(url, "aborted", "the fetcher is closed")
        request = _request_of(url)
        ip = self._resolve(request.host)
        w = self._dog.start(self._total, ip)
        try:
            return self._exchange(url, request, w, started, t0)
        finally:
            self._dog.finish(w)

    def close(self) -> None:
        """Close every pooled connection; fetches in flight end with "aborted".
        Idempotent, thread-safe."""
        if self._closed:
            return
        self._closed = True
        self._dog.close()
        pools = self._pools.pools
        for key in pools.keys():  # urllib3 2 leaves dropped pools to the GC: close them now
            pool = pools.get(key)
            if pool is not None:
                pool.close()
        self._pools.clear()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one exchange ---------------------------------------------------------------------

    def _fail(self, url: str, w: _Watch, exc: BaseException, in_body: bool) -> FetchError:
        if w.aborted:
            return FetchError(url, "aborted", "the fetcher was closed")
        if w.expired:
            return FetchError(url, "total_timeout", f"over {self._total:g} s")
        return FetchError(url, _classify(exc, in_body), _detail(exc))

    def _send(self, url: str, request: _Request, w: _Watch) -> Any:
        for attempt in (1, 2):
            w.reused = False
            try:
                pool = self._pools.connection_from_host(request.host, request.port,
                                                        request.scheme)
                return pool.urlopen("GET", request.target, headers=self._headers,
                                    retries=False, redirect=False, assert_same_host=False,
                                    timeout=self._timeout, preload_content=False,
                                    decode_content=False)
            except (u3.LocationValueError, http.client.InvalidURL) as exc:
                raise URLError(url, f"cannot be requested: {exc}") from exc
            except (u3.HTTPError, http.client.HTTPException, OSError, ValueError) as exc:
                err = self._fail(url, w, exc, in_body=False)
                if attempt == 1 and err.reason == "reset" and w.reused:
                    log.debug("%s: kept-alive connection was closed, retrying once", url)
                    continue
                raise err from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(self, url: str, request: _Request, w: _Watch,
                  started: float, t0: float) -> FetchResult:
        raw = self._send(url, request, w)
        peer = getattr(raw.connection, "peer_ip", None) or w.ip
        hdrs = raw.headers
        try:
            body, wire, reason = self._read_body(raw, hdrs.get("content-encoding"))
        except (u3.HTTPError, http.client.HTTPException, OSError, zlib.error) as exc:
            raise self._fail(url, w, exc, in_body=True) from exc
        finally:
            raw.release_conn()  # a no-op if the read already gave it back
        if w.killed and reason is None:  # the body may have been cut by the watchdog
            raise self._fail(url, w, TimeoutError(), in_body=True)
        headers = {}
        for name in KEPT_HEADERS:
            value = hdrs.get(name)
            if value is not None:
                headers[name] = value[: self._max_header]
        redirect = None
        locations = hdrs.getlist("location")
        if 300 <= raw.status < 400 and locations:
            redirect = _redirect_target(url, locations[0])
        return FetchResult(
            url=url, status=raw.status, headers=headers, body=body, ip=peer, started=started,
            elapsed=time.monotonic() - t0, wire_bytes=wire, truncated=reason is not None,
            truncate_reason=reason, redirect=redirect,
            http_version=_VERSIONS.get(raw.version, f"HTTP/{raw.version}"))

    def _read_body(self, raw: Any, coding: str | None) -> tuple[bytes, int, str | None]:
        """Stream the body within both limits: (body, wire bytes, truncate reason)."""
        wbits = _DECODED.get((coding or "").strip().lower())
        decoder = _Decoder(wbits) if wbits is not None else None
        cap = self._max_decoded if decoder else min(self._max_body, self._max_decoded)
        out = io.BytesIO()
        wire = size = 0
        reason: str | None = None
        while reason is None:
            data = raw.read(min(READ_CHUNK, self._max_body - wire + 1), decode_content=False)
            if not data:
                if decoder is not None:
                    tail = decoder.flush()[: cap - size]
                    out.write(tail)
                break
            wire += len(data)
            if wire > self._max_body:  # one byte over: there is more than the limit
                data = data[: len(data) - (wire - self._max_body)]
                wire, reason = self._max_body, "too_large"
            piece = decoder.decode(data, cap - size + 1) if decoder else data
            if len(piece) > cap - size:
                piece = piece[: cap - size]
                reason = "decompression_bomb" if decoder else "too_large"
            out.write(piece)
            size += len(piece)
        if reason is not None:
            raw.close()  # unread bytes on the wire: the connection cannot be reused
        return out.getvalue(), wire, reason
