"""HTTP/1.1 and HTTP/2 connections opened to a resolved IP, and the pool of idle ones.

A :class:`Connection` is an ``http.client`` connection whose socket we open
ourselves: TCP to the IP the crawler's DNS cache gave (http.client would
resolve the name itself), then TLS with the host *name* as SNI and for the
certificate check (our SSLContext: CERT_REQUIRED, hostname check). The name
also goes into the Host header. ``auto_open`` is off, so http.client can
never open a connection (or look a name up) on its own. A TLS connection whose
handshake chose ``h2`` (ALPN, when the fetcher offers it) carries an
:class:`~crawler.net.h2session.H2Session` instead, used one stream at a time.

:class:`ConnectionPool` keeps idle connections per origin (scheme, host,
port): at most ``per_origin`` each, and at most ``origins`` origins, least
recently used dropped first (their sockets closed). Thread-safe: one lock
around the dict; connections themselves are used by one thread at a time
(taken out of the pool while in use).

Why not requests/urllib3: per fetch they cost ~3x the CPU of this path
(request preparation, header merging, pool-key normalization, retries and
response wrappers we do not use), and the crawler is CPU-bound.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections import OrderedDict

from .h2session import ALPN_H2, H2Session

Origin = tuple[str, str, int]  # (scheme, host, port)


class Connection:
    """One open connection (used by one thread at a time): ``http`` for HTTP/1.1, or
    ``h2`` for HTTP/2."""

    __slots__ = ("h2", "http", "ip", "sent")

    def __init__(self, conn: http.client.HTTPConnection, ip: str,
                 h2: H2Session | None = None) -> None:
        self.http = conn
        self.h2 = h2
        self.ip = ip
        self.sent = 0  # requests sent on it

    @property
    def sock(self) -> socket.socket | None:
        if self.h2 is not None:
            return self.h2.sock if self.h2.usable else None
        sock: socket.socket | None = self.http.sock
        return sock

    @property
    def protocol(self) -> str:
        """The protocols spoken, as WARC-Protocol names them: "h2 tls/1.3",
        "http/1.1 tls/1.2", or "" for plain HTTP/1.1."""
        sock = self.h2.sock if self.h2 is not None else self.http.sock
        version = sock.version() if isinstance(sock, ssl.SSLSocket) else None
        if not version:
            return ""
        tls = version.lower().replace("tlsv", "tls/")
        return f"{ALPN_H2 if self.h2 is not None else 'http/1.1'} {tls}"

    def close(self) -> None:
        if self.h2 is not None:
            self.h2.close()
        self.http.close()


def connect_tcp(ip: str, port: int, timeout: float) -> socket.socket:
    """A connected TCP socket (raises OSError: refused, timeout, unreachable)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)
        sock.connect((ip, port))
    except BaseException:
        sock.close()
        raise
    return sock


def wrap_tls(sock: socket.socket, host: str, context: ssl.SSLContext) -> ssl.SSLSocket:
    """The TLS handshake on ``sock`` (bounded by its timeout), SNI and check against ``host``."""
    try:
        return context.wrap_socket(sock, server_hostname=host.strip("[]"))
    except BaseException:
        sock.close()
        raise


def make_connection(origin: Origin, sock: socket.socket, ip: str) -> Connection:
    """Wrap a connected (and for https, TLS) socket for ``origin``: HTTP/2 when its TLS
    handshake chose h2."""
    _, host, port = origin
    # Plain HTTPConnection for https too: the socket is already TLS, the Host
    # header is ours, and HTTPSConnection() would build (and load CAs into) a
    # fresh SSLContext each time, ~50 ms under the GIL.
    conn = http.client.HTTPConnection(host, port)
    conn.auto_open = 0  # never connect (or resolve a name) by itself
    if isinstance(sock, ssl.SSLSocket) and sock.selected_alpn_protocol() == ALPN_H2:
        return Connection(conn, ip, H2Session(sock))  # conn keeps no socket: never used
    conn.sock = sock
    return Connection(conn, ip)


class ConnectionPool:
    """Idle kept-alive connections by origin, LRU-bounded. Thread-safe."""

    def __init__(self, *, origins: int, per_origin: int) -> None:
        self._origins = origins
        self._per_origin = per_origin
        self._idle: OrderedDict[Origin, list[Connection]] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def take(self, origin: Origin) -> Connection | None:
        """An idle connection to ``origin`` (most recently used first), or None."""
        with self._lock:
            idle = self._idle.get(origin)
            if not idle:
                return None
            conn = idle.pop()
            if not idle:
                del self._idle[origin]
            return conn

    def give(self, origin: Origin, conn: Connection) -> None:
        """Keep ``conn`` for reuse (or close it when the pool is full or closed)."""
        dropped: list[Connection] = []
        with self._lock:
            if self._closed:
                dropped.append(conn)
            else:
                idle = self._idle.get(origin)
                if idle is None:
                    idle = self._idle[origin] = []
                else:
                    self._idle.move_to_end(origin)
                if len(idle) < self._per_origin:
                    idle.append(conn)
                else:
                    dropped.append(conn)
                while len(self._idle) > self._origins:
                    dropped.extend(self._idle.popitem(last=False)[1])
        for c in dropped:
            c.close()

    def close(self) -> None:
        """Close every idle connection; later ones given back are closed too."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, OrderedDict()
        for conns in idle.values():
            for c in conns:
                c.close()
