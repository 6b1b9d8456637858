"""The fetcher's HTTP/2 (crawler.net.h2session) against servers that misbehave: a real
TLS socket on loopback and a server written with the ``h2`` library's server side, each
answer scripted. Every bound of the HTTP/1.1 path holds over h2: body limit, read and
total timeouts, header count, resets, GOAWAY, fallback to HTTP/1.1."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import pytest
from test_fetch import (
    LIMIT,
    RAW,
    UA,
    MakeFetcher,
    RawServer,
    fetch_error,
    make_fetcher,  # noqa: F401 - the fixture
    raw_server,  # noqa: F401 - the fixture
    raw_tls,  # noqa: F401 - the fixture
)

from tools.testweb.tls import TLS

Respond = Callable[["H2Server", int, dict[bytes, bytes]], None]


class H2Server:
    """One server connection: the h2 state machine over the accepted TLS socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.conn = h2.connection.H2Connection(  # sends what it is told: hostile headers too
            h2.config.H2Configuration(client_side=False, header_encoding=None,
                                      validate_outbound_headers=False,
                                      normalize_outbound_headers=False))
        self.conn.initiate_connection()
        self.flush()
        self.reset: set[int] = set()

    def flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)

    def pump(self) -> list[h2.events.Event]:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionResetError
        events = self.conn.receive_data(data)
        for ev in events:
            if isinstance(ev, h2.events.StreamReset):
                self.reset.add(ev.stream_id)
        self.flush()
        return events

    def headers(self, sid: int, *pairs: tuple[str | bytes, str | bytes], status: int = 200,
                end: bool = False) -> None:
        self.conn.send_headers(sid, [(":status", str(status)), *pairs], end_stream=end)
        self.flush()

    def body(self, sid: int, data: bytes, end: bool = True) -> None:
        """Send ``data`` as flow control allows (waiting for the client's window)."""
        while data and sid not in self.reset:
            room = min(self.conn.local_flow_control_window(sid),
                       self.conn.max_outbound_frame_size, len(data))
            if room <= 0:
                self.pump()
                continue
            self.conn.send_data(sid, data[:room])
            self.flush()
            data = data[room:]
        if end and sid not in self.reset:
            self.conn.end_stream(sid)
            self.flush()


def h2_handler(respond: Respond) -> Callable[[socket.socket, int], None]:
    def handler(sock: socket.socket, n: int) -> None:
        srv = H2Server(sock)
        try:
            while True:
                for ev in srv.pump():
                    if isinstance(ev, h2.events.RequestReceived):
                        respond(srv, ev.stream_id, dict(ev.headers))
        except (OSError, h2.exceptions.ProtocolError):  # the client went (or was told to)
            return
    return handler


@pytest.fixture
def h2_tls(raw_tls: TLS) -> ssl.SSLContext:  # noqa: F811 - the fixture imported above
    """A server context for raw.test offering h2 (and HTTP/1.1) by ALPN."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    raw_tls.good_cert.configure_cert(ctx)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


@pytest.fixture
def h2_server(raw_server: Any, h2_tls: ssl.SSLContext  # noqa: F811
              ) -> Callable[[Respond], RawServer]:
    return lambda respond: raw_server(h2_handler(respond), h2_tls)


@pytest.fixture
def fetcher(make_fetcher: MakeFetcher, raw_tls: TLS) -> Iterator[Any]:  # noqa: F811
    yield lambda **kw: make_fetcher(RAW, ca_bundle=str(raw_tls.ca_file), http2=True, **kw)


def page(body: bytes) -> Respond:
    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        srv.headers(sid, ("content-type", "text/html"), ("content-length", str(len(body))))
        srv.body(sid, body)
    return respond


def test_a_page_over_h2_reuses_its_connection(h2_server: Any, fetcher: Any) -> None:
    seen: list[dict[bytes, bytes]] = []
    body = b"<html>" + b"h2 " * 30_000 + b"</html>"  # past the first flow-control window

    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        seen.append(req)
        page(body)(srv, sid, req)

    srv = h2_server(respond)
    f = fetcher()
    for path in ("/a", "/b?x=1"):
        r = f.fetch(srv.url(path))
        assert (r.status, r.body, r.http_version) == (200, body, "HTTP/2")
        assert r.protocol.startswith("h2 tls/1.") and not r.truncated
        assert r.headers["content-type"] == "text/html"
    assert srv.connections == 1
    assert [s[b":path"] for s in seen] == [b"/a", b"/b?x=1"]
    assert seen[0][b":authority"] == f"raw.test:{srv.port}".encode()
    assert seen[0][b"user-agent"] == UA.encode() and b"host" not in seen[0]


def test_a_body_past_the_limit_is_cut_exactly(h2_server: Any, fetcher: Any) -> None:
    body = bytes(range(256)) * (3 * LIMIT // 256)
    srv = h2_server(page(body))
    r = fetcher().fetch(srv.url())
    assert r.truncated and r.truncate_reason == "too_large"
    assert r.body == body[:LIMIT] and r.wire_bytes == LIMIT


def test_a_stream_reset_mid_body_is_reset(h2_server: Any, fetcher: Any) -> None:
    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        srv.headers(sid, ("content-length", "100000"))
        srv.body(sid, b"x" * 1000, end=False)
        srv.conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
        srv.flush()

    srv = h2_server(respond)
    err = fetch_error(fetcher(), srv.url())
    assert err.reason == "reset" and "reset by the server" in str(err)


def test_goaway_before_the_answer_is_reset_at_once(h2_server: Any, fetcher: Any) -> None:
    release = threading.Event()

    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        srv.conn.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=0)
        srv.flush()
        release.wait(10)  # the socket stays open: the GOAWAY alone says the stream is lost

    srv = h2_server(respond)
    try:
        err = fetch_error(fetcher(), srv.url())
        assert err.reason == "reset" and "GOAWAY" in str(err)  # not a read timeout
    finally:
        release.set()


def test_a_kept_connection_the_server_closed_is_retried_once(
    h2_server: Any, fetcher: Any
) -> None:
    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        page(b"<p>one</p>")(srv, sid, req)
        srv.conn.close_connection(last_stream_id=sid)  # done with this connection
        srv.flush()

    srv = h2_server(respond)
    f = fetcher()
    assert f.fetch(srv.url("/1")).body == b"<p>one</p>"
    assert f.fetch(srv.url("/2")).body == b"<p>one</p>"  # on a second connection
    assert srv.connections == 2


def test_too_many_headers_is_a_protocol_error(h2_server: Any, fetcher: Any) -> None:
    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        srv.headers(sid, *[(f"x-h{i}", "v") for i in range(150)])
        srv.body(sid, b"hi")

    srv = h2_server(respond)
    err = fetch_error(fetcher(), srv.url())
    assert err.reason == "protocol" and "more than 100 headers" in str(err)


@pytest.mark.parametrize("value", [b"a\r\nx-injected: 1", b"a\x00b", b"a\nb"])
def test_a_header_value_with_a_line_break_or_nul_is_a_protocol_error(
    h2_server: Any, fetcher: Any, value: bytes
) -> None:
    # over HTTP/1.1 no such value can be read; over h2 it must not reach a record (or a
    # WARC written from it, where it would forge a header)
    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        srv.headers(sid, ("content-type", "text/html"), (b"x-evil", value))
        srv.body(sid, b"hi")

    srv = h2_server(respond)
    assert fetch_error(fetcher(), srv.url()).reason == "protocol"


def test_a_stalled_body_hits_the_read_timeout(h2_server: Any, fetcher: Any) -> None:
    release = threading.Event()

    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        srv.headers(sid, ("content-length", "10"))
        srv.body(sid, b"12345", end=False)
        release.wait(10)  # the rest never comes while the client waits

    srv = h2_server(respond)
    try:
        assert fetch_error(fetcher(), srv.url()).reason == "read_timeout"
    finally:
        release.set()


def test_a_dripped_body_hits_the_total_timeout(h2_server: Any, fetcher: Any) -> None:
    stop = threading.Event()

    def respond(srv: H2Server, sid: int, req: dict[bytes, bytes]) -> None:
        srv.headers(sid)
        while not stop.wait(0.05):  # a byte every 50 ms: never a read timeout
            srv.body(sid, b"a", end=False)

    srv = h2_server(respond)
    try:
        assert fetch_error(fetcher(total_timeout=1.0), srv.url()).reason == "total_timeout"
    finally:
        stop.set()


def test_a_server_without_h2_gets_http1(raw_server: Any, raw_tls: TLS,  # noqa: F811
                                        fetcher: Any) -> None:
    def handler(conn: socket.socket, n: int) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    srv = raw_server(handler, raw_tls.server_context())  # no ALPN offered back
    r = fetcher().fetch(srv.url())
    assert (r.body, r.http_version) == (b"ok", "HTTP/1.1")
    assert r.protocol.startswith("http/1.1 tls/1.")
