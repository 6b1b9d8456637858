"""A small HTTP/1.1 server on asyncio that serves a Site (plain and TLS).

Theory of operation: one background thread runs an asyncio loop with one
listening socket per scheme, bound on 127.0.0.0/8 only (or, for tools/cluster.py's
network namespaces, on its bridge in 198.18.0.0/15). Each connection is
a coroutine that reads a request head (``readuntil`` CRLFCRLF, at most
``MAX_HEAD`` bytes), answers it and loops while the connection is kept
alive (HTTP/1.1 default; ``Connection: close`` and HTTP/1.0 close). An idle
connection costs one suspended coroutine and a buffer, so thousands of slow
clients are cheap; nothing blocks the loop except rendering a page.

The answer comes from ``Site.lookup`` (pure); the response faults that act
while sending (a delay, a drip, a reset, a stream, a gzip bomb, 429/503
until the n-th attempt) are carried out here. A body that is slow to make
(``Node.lazy``: the sitemaps' gzip bomb) is made off the loop's thread.
Every request is logged in the RequestLog before its bytes go out (see
requestlog.py).

Sockets are bound in ``bind()`` on the caller's thread, so the ports are
known before the Site (whose URLs carry them) is built and served.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import logging
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from email.utils import formatdate
from http import HTTPStatus

from .cookiewall import sends
from .encodings import BOMBS, bomb, chosen, encode
from .faults import Fault
from .hostile_pages import filler
from .model import Node
from .requestlog import OWN_HEADERS, Request, RequestLog
from .site import Site
from .sitemapped import padding
from .tls import SNI_ATTR
from .urls import SERVE_NETWORKS_TEXT, servable

log = logging.getLogger(__name__)

# The Last-Modified of every generated page: the site does not change.
LAST_MODIFIED = "Mon, 01 Jan 2024 00:00:00 GMT"
_LAST_MODIFIED = email.utils.parsedate_to_datetime(LAST_MODIFIED)


def not_modified(etag: str, if_none_match: str | None, if_modified_since: str | None) -> bool:
    """Whether a GET with these request headers gets 304 for a page with ``etag`` and
    LAST_MODIFIED (RFC 9110 §13.2.2: If-None-Match first; If-Modified-Since only without
    it, and only a valid date)."""
    if if_none_match is not None:
        tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
        return "*" in tags or etag in tags
    if if_modified_since is not None:
        try:
            since = email.utils.parsedate_to_datetime(if_modified_since)
        except (TypeError, ValueError):
            return False
        return since.tzinfo is not None and since >= _LAST_MODIFIED
    return False


MAX_HEAD = 1 << 20  # request heads beyond this get 431
IDLE_TIMEOUT = 120.0  # seconds a kept-alive connection may sit idle
BACKLOG = 8192
CHUNK = 64 * 1024
RESET_GRACE = 0.05  # seconds between the partial body and the RST, so it arrives first
THREAD_TIMEOUT = 5.0


def check_loopback(address: str) -> None:
    """Refuse to bind anything outside loopback and tools/cluster.py's range (urls.py's
    SERVE_NETWORKS)."""
    if not servable(address):
        raise ValueError(f"testweb binds loopback or the cluster range only "
                         f"({SERVE_NETWORKS_TEXT}), not {address}")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class WebServer:
    """Serves one Site on an HTTP port and (optionally) an HTTPS port."""

    def __init__(self, *, address: str = "127.0.0.1", log_: RequestLog | None = None) -> None:
        check_loopback(address)
        self.address = address
        self.log = log_ if log_ is not None else RequestLog()
        self._socks: dict[str, socket.socket] = {}
        self._site: Site | None = None
        self._ssl: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._hits: Counter[tuple[str, str, str]] = Counter()
        self._date = (0, "")

    # -- lifecycle -----------------------------------------------------------------

    def bind(self, http_port: int = 0, https_port: int | None = None) -> None:
        """Bind the listening sockets (``0``: a free port; None: no HTTPS)."""
        for scheme, port in (("http", http_port), ("https", https_port)):
            if port is None:
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.address, port))
                sock.listen(BACKLOG)
            except OSError as exc:
                sock.close()
                self.close_sockets()
                # The bare errno text does not say which of the ports it was.
                raise OSError(
                    exc.errno, f"{scheme} port {self.address}:{port}: {exc.strerror}"
                ) from exc
            sock.setblocking(False)
            self._socks[scheme] = sock

    @property
    def http_port(self) -> int:
        return int(self._socks["http"].getsockname()[1])

    @property
    def https_port(self) -> int | None:
        sock = self._socks.get("https")
        return None if sock is None else int(sock.getsockname()[1])

    def start(self, site: Site, ssl_context: ssl.SSLContext | None = None) -> None:
        """Serve ``site`` from a background thread; returns once it accepts connections."""
        if "https" in self._socks and ssl_context is None:
            raise ValueError("an HTTPS port is bound but no ssl_context was given")
        self._site, self._ssl = site, ssl_context
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="testweb-http", daemon=True
        )
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]

    def stop(self) -> None:
        """Close every connection and the listening sockets; idempotent."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop is already closed
                pass
            self._thread.join(THREAD_TIMEOUT)
        self._loop = self._thread = None
        self.close_sockets()

    def close_sockets(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

    def reset_counters(self) -> None:
        """Forget how often each 429/503 URL was asked (so they fail again)."""
        self._hits.clear()

    @property
    def open_connections(self) -> int:
        return len(self._writers)

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        except BaseException as exc:  # surfaced to start() or logged
            if not ready.is_set():
                failure.append(exc)
            else:
                log.exception("testweb server loop died")
        finally:
            ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        servers = []
        for scheme, sock in self._socks.items():
            port = sock.getsockname()[1]
            tls = self._ssl if scheme == "https" else None

            async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter,
                             scheme: str = scheme, port: int = port) -> None:
                try:
                    await self._connection(r, w, scheme, port)
                except asyncio.CancelledError:
                    # Shutting down. Ending normally keeps asyncio 3.11's
                    # stream callback from logging the cancellation as an error.
                    pass

            # backlog again: asyncio calls listen() anew with it (default 100).
            if tls is None:
                srv = await asyncio.start_server(handle, sock=sock, limit=MAX_HEAD,
                                                 backlog=BACKLOG)
            else:
                srv = await asyncio.start_server(handle, sock=sock, limit=MAX_HEAD,
                                                 backlog=BACKLOG, ssl=tls,
                                                 ssl_handshake_timeout=10.0)
            servers.append(srv)
        ready.set()
        await self._stop.wait()
        for srv in servers:
            srv.close()
        for w in list(self._writers):
            w.transport.abort()
        await asyncio.sleep(0)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one connection ---------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          scheme: str, port: int) -> None:
        conn = self.log.next_conn()
        self._writers.add(writer)
        ssl_obj = writer.get_extra_info("ssl_object")
        sni = getattr(ssl_obj, SNI_ATTR, None) if ssl_obj is not None else None
        peer = (writer.get_extra_info("peername") or ("",))[0]
        try:
            keep = True
            while keep:
                try:
                    async with asyncio.timeout(IDLE_TIMEOUT):
                        head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    await self._simple(writer, 431, close=True)
                    return
                except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, ssl.SSLError):
                    return
                keep = await self._request(reader, writer, head, conn, scheme, port, sni, peer)
        except (ConnectionError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("testweb: error on connection %d", conn)
        finally:
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       head: bytes, conn: int, scheme: str, port: int, sni: str | None,
                       peer: str = "") -> bool:
        """Answer one request; returns whether to keep the connection."""
        try:
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            headers: dict[str, str] = {}
            other: list[tuple[str, str]] = []
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    name, value = name.strip().lower(), value.strip()
                    headers[name] = value
                    if name not in OWN_HEADERS:
                        other.append((name, value))
            length = int(headers.get("content-length", "0"))
        except ValueError:
            await self._simple(writer, 400, close=True)
            return False
        if "transfer-encoding" in headers or not version.startswith("HTTP/1."):
            await self._simple(writer, 501, close=True)
            return False
        if length:
            await reader.readexactly(length)
        host = headers.get("host", "")
        if target.startswith(("http://", "https://")):  # absolute-form
            rest = target.split("://", 1)[1]
            host, slash, path = rest.partition("/")
            target = slash + path or "/"
        host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        host = host.lower()
        conn_hdr = headers.get("connection", "").lower()
        keep = "close" not in conn_hdr and (version == "HTTP/1.1" or "keep-alive" in conn_hdr)
        rec = Request(conn, scheme, port, host, target, method, time.time(), sni=sni,
                      agent=headers.get("user-agent", ""), other=tuple(other),
                      peer=peer)
        self.log.add(rec)
        if method not in ("GET", "HEAD"):
            await self._send(writer, rec, 405, [("Allow", "GET, HEAD")], b"", keep, head_only=False)
            return keep
        site = self._site
        assert site is not None
        h = site.hosts.get(host)
        if h is None or h.scheme != scheme:
            node = site.lookup("", target)  # 421 Misdirected Request
        else:
            node = site.lookup(host, target)
        if node.wall is not None and not sends(headers.get("cookie"), node.needs_cookie or ""):
            node = node.wall  # a cookie wall, and the request lacks its cookie
        validators = (headers.get("if-none-match"), headers.get("if-modified-since"))
        return await self._answer(writer, rec, node, keep, method == "HEAD", validators,
                                  headers.get("accept-encoding"))

    async def _answer(self, writer: asyncio.StreamWriter, rec: Request, node: Node,
                      keep: bool, head_only: bool,
                      validators: tuple[str | None, str | None] = (None, None),
                      accept_encoding: str | None = None) -> bool:
        site = self._site
        assert site is not None
        f = node.delivery
        if f is not None and f.kind in ("slow_first_byte", "robots_slow"):
            await asyncio.sleep(f.num("delay"))
        if f is not None and node.retries:
            key = (rec.scheme, rec.host, rec.target)
            self._hits[key] += 1
            if node.retries < 0 or self._hits[key] <= node.retries:
                status = int(f.kind[-3:])
                body = b"Too many requests, retry later.\n"
                extra = [("Retry-After", str(f.get("retry_after"))), ("Content-Type", "text/plain")]
                await self._send(writer, rec, status, extra, body, keep, head_only)
                return keep
        headers: list[tuple[str, str]] = []
        if node.content_type:
            headers.append(("Content-Type", node.content_type))
        if node.raw_location is not None:
            headers.append(("Location", node.raw_location))
        headers.extend(node.headers)
        if f is not None and f.kind in ("slow_drip", "reset", "huge_body", "nul_body", *BOMBS):
            return await self._stream(writer, rec, node, f, headers, keep, head_only)
        if node.lazy is not None:
            body = await asyncio.to_thread(site.body, rec.host, node)
        else:
            body = site.body(rec.host, node)
        if node.page is not None and node.status == 200 and f is None:
            # A generated page has validators, and a conditional GET that matches them
            # gets 304 with no body (RFC 9110 §13.1.1: If-None-Match wins when both come).
            etag = f'"{hashlib.md5(body).hexdigest()[:16]}"'
            headers += [("ETag", etag), ("Last-Modified", LAST_MODIFIED)]
            if not_modified(etag, *validators):
                same = [(k, v) for k, v in headers if k != "Content-Type"]
                await self._send(writer, rec, 304, same, b"", keep, head_only)
                return keep
            # The site's codings, as nginx's filters do: the first one the client accepts.
            coding = chosen(site.config.encodings, accept_encoding)
            if coding is not None:
                body = await asyncio.to_thread(encode, coding, body)
                headers += [("Content-Encoding", coding), ("Vary", "Accept-Encoding")]
                rec.encoding = coding
        await self._send(writer, rec, node.status, headers, body, keep, head_only)
        return keep

    # -- writing ------------------------------------------------------------------------

    def _head(self, status: int, headers: list[tuple[str, str]], length: int | None,
              keep: bool) -> bytes:
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, formatdate(now, usegmt=True))
        lines = [f"HTTP/1.1 {status} {_reason(status)}", "Server: testweb",
                 f"Date: {self._date[1]}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if length is None:
            lines.append("Transfer-Encoding: chunked")
        else:
            lines.append(f"Content-Length: {length}")
        lines.append("Connection: keep-alive" if keep else "Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _simple(self, writer: asyncio.StreamWriter, status: int, close: bool) -> None:
        body = f"{status} {_reason(status)}\n".encode()
        writer.write(self._head(status, [("Content-Type", "text/plain")], len(body), not close)
                     + body)
        await writer.drain()

    async def _send(self, writer: asyncio.StreamWriter, rec: Request, status: int,
                    headers: list[tuple[str, str]], body: bytes, keep: bool,
                    head_only: bool) -> None:
        data = self._head(status, headers, len(body), keep)
        if not head_only:
            data += body
            rec.bytes = len(body)
        rec.status = status
        rec.end = time.time()
        rec.outcome = "ok"
        writer.write(data)
        try:
            await writer.drain()
        except ConnectionError:
            rec.outcome = "aborted"
            raise

    async def _stream(self, writer: asyncio.StreamWriter, rec: Request, node: Node, f: Fault,
                      headers: list[tuple[str, str]], keep: bool, head_only: bool) -> bool:
        """The response faults that act while the body is being sent."""
        body = node.body or b""
        kind = f.kind
        length: int | None = len(body)
        if kind == "huge_body":
            length = None if f.get("chunked") else int(f.num("size"))
        elif kind in BOMBS or kind == "nul_body":
            fill = int(f.num("byte")) if kind == "nul_body" else 0x20
            coding = BOMBS.get(kind, "gzip")
            body = await asyncio.to_thread(bomb, coding, int(f.num("size")), fill)
            length = len(body)
            headers.append(("Content-Encoding", coding))
            rec.encoding = coding
        rec.status = node.status
        rec.end = time.time()
        writer.write(self._head(node.status, headers, length, keep))
        if head_only:
            rec.outcome = "ok"
            await writer.drain()
            return keep
        try:
            if kind == "slow_drip":
                interval = f.num("interval")
                for i in range(len(body)):
                    rec.bytes += 1
                    rec.end = time.time()
                    if i + 1 == len(body):
                        rec.outcome = "ok"  # logged before the client can read the last byte
                    writer.write(body[i : i + 1])
                    await writer.drain()
                    if i + 1 < len(body):
                        await asyncio.sleep(interval)
            elif kind == "reset":
                after = min(int(f.num("after")), len(body))
                rec.bytes = after
                rec.outcome = "reset"
                rec.end = time.time()
                writer.write(body[:after])
                await writer.drain()
                while writer.transport.get_write_buffer_size():
                    await asyncio.sleep(0.001)
                await asyncio.sleep(RESET_GRACE)
                _abort_with_rst(writer)
                return False
            elif kind == "huge_body":
                # The node's body first (empty for the fault's pages), then filler:
                # link-free HTML for HTML, XML padding for the rest (sitemaps' huge.xml).
                size = int(f.num("size"))
                head = body[:size]
                block = filler(CHUNK) if node.html else padding(CHUNK)
                left = size - len(head)
                if head:
                    rec.bytes += len(head)
                    writer.write(b"%x\r\n%s\r\n" % (len(head), head) if length is None else head)
                while left > 0:
                    piece = block[: min(left, CHUNK)]
                    left -= len(piece)
                    rec.bytes += len(piece)
                    rec.end = time.time()
                    if length is None:
                        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    else:
                        writer.write(piece)
                    await writer.drain()
                if length is None:
                    writer.write(b"0\r\n\r\n")
            else:  # the bombs, nul_body
                rec.bytes = len(body)
                rec.end = time.time()
                writer.write(body)
            rec.outcome = "ok"
            await writer.drain()
        except ConnectionError:
            rec.outcome = "aborted"
            return False
        return keep


def _abort_with_rst(writer: asyncio.StreamWriter) -> None:
    """Close so the peer gets a TCP RST, not a FIN (SO_LINGER with zero timeout)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
