"""HTTP/2 on one TLS connection, one stream at a time, shaped like http.client's answer.

Why one stream at a time: a connection is used by one fetch at a time, as an HTTP/1.1
one is (crawler.net.connections), so ``--per-host N`` still means N requests in flight
to a host, the politeness the crawl promises, and the fetcher's bounds (the watchdog
that shuts the socket, the socket's read timeout, the body limits) apply unchanged. A
crawler fetching one host politely gains little from multiplexing; what HTTP/2 gives it
is the protocol many sites now prefer, HPACK-compressed headers on a kept-alive
connection, and the answer the site really serves over h2.

The framing, HPACK and flow control are the ``h2`` library's (a sans-I/O state
machine); the socket is ours. :meth:`H2Session.get` sends one GET and returns once the
response's headers are in, as an :class:`H2Response` with what crawler.net.fetch reads
from an ``http.client.HTTPResponse``: ``status``, ``version`` (20), ``msg.get`` and
``get_all``, ``getheader``, ``read(n)``, ``will_close`` and ``close``.

Errors surface as the HTTP/1.1 path's do, so the fetcher classifies them alike: a
stream reset, a GOAWAY that drops the stream or a closed socket is a
ConnectionResetError (reset); a frame or header block that breaks the protocol, more
than :data:`MAX_HEADERS` headers or a header list past :data:`MAX_HEADER_LIST` bytes
is an http.client.HTTPException (protocol). Server push is refused in our SETTINGS.
"""

from __future__ import annotations

import http.client
import re
import socket
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack

ALPN_H2 = "h2"
READ_SIZE = 64 << 10
MAX_HEADERS = 100  # as http.client caps a response (its _MAXHEADERS)
MAX_HEADER_LIST = 64 << 10  # decoded header bytes, as http.client caps one header line
# Headers HTTP/2 forbids (RFC 9113 8.2.2) or carries otherwise (Host is :authority).
_NOT_SENT = frozenset({b"host", b"connection", b"keep-alive", b"proxy-connection",
                       b"transfer-encoding", b"upgrade", b"te"})
_H2_ERRORS = (h2.exceptions.H2Error, hpack.HPACKError)
# What no HTTP/1.1 header line can hold, and so no record or WARC written from one: h2
# itself rejects these only from 4.2 on, so the check is ours, whatever its release.
_FORBIDDEN = re.compile(rb"[\r\n\x00]")


class H2Headers:
    """A response's headers, looked up by name in any case (``msg`` of http.client)."""

    __slots__ = ("_items",)

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items

    def get(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        for key, value in self._items:
            if key == name:
                return value
        return default

    def get_all(self, name: str, default: Any = None) -> list[str] | Any:
        name = name.lower()
        found = [value for key, value in self._items if key == name]
        return found or default


class H2Response:
    """One stream's answer; its body read as it arrives (see the module docstring)."""

    version = 20

    def __init__(self, session: H2Session, stream_id: int) -> None:
        self._session = session
        self.stream_id = stream_id
        self.status = 0  # set when the final headers arrive
        self.got_headers = False
        self.msg = H2Headers([])
        self._body = bytearray()
        self.ended = False
        self.error: BaseException | None = None

    @property
    def will_close(self) -> bool:
        return not self._session.usable

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.msg.get(name, default)

    def read(self, n: int) -> bytes:
        """Up to ``n`` body bytes; b"" at the stream's end. Raises what ended it early."""
        while not self._body and not self.ended:
            if self.error is not None:
                raise self.error
            self._session.pump()
        piece = bytes(self._body[:n])
        del self._body[:n]
        return piece

    def close(self) -> None:
        """Give the stream up (its body was cut): the server is told to stop sending."""
        self._session.cancel(self)

    # -- fed by the session --------------------------------------------------------------

    def _headers(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.got_headers = True
        if len(raw) > MAX_HEADERS:
            self.error = http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
            return
        items = []
        for name, value in raw:
            if _FORBIDDEN.search(name) or _FORBIDDEN.search(value):
                self.error = http.client.HTTPException(
                    f"a header holds a line break or NUL: {name[:40]!r}")
                return
            if name == b":status":
                self.status = int(value)
            elif not name.startswith(b":"):
                items.append((name.decode("latin-1").lower(), value.decode("latin-1")))
        self.msg = H2Headers(items)

    def _data(self, data: bytes) -> None:
        self._body += data


class H2Session:
    """One HTTP/2 connection over a connected TLS socket; used by one thread at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        # Outbound checks off: what we send is checked once, at start (crawler.net.auth);
        # inbound ones stay: a CR, LF or NUL in a header must never reach a record.
        config = h2.config.H2Configuration(client_side=True, header_encoding=None,
                                           validate_outbound_headers=False,
                                           normalize_outbound_headers=False)
        self._conn = h2.connection.H2Connection(config=config)
        self._conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
        })
        self._stream: H2Response | None = None
        self.usable = True  # False after a GOAWAY, a connection error or a closed socket
        try:
            self._conn.initiate_connection()
        except _H2_ERRORS as exc:  # pragma: no cover - nothing received yet
            raise http.client.HTTPException(f"HTTP/2: {exc}") from exc
        self._flush()

    def get(self, authority: str, target: str,
            headers: tuple[tuple[str, str], ...]) -> H2Response:
        """Send a GET and read until its final headers are in."""
        if not self.usable:
            raise ConnectionResetError("the HTTP/2 connection is closing (GOAWAY)")
        try:
            sid = self._conn.get_next_available_stream_id()
            fields = [(b":method", b"GET"), (b":scheme", b"https"),
                      (b":authority", authority.encode("ascii")),
                      (b":path", target.encode("ascii"))]
            for name, value in headers:
                key = name.lower().encode("ascii")
                if key not in _NOT_SENT:
                    fields.append((key, value.encode("latin-1")))
            self._conn.send_headers(sid, fields, end_stream=True)
        except _H2_ERRORS as exc:
            self.usable = False
            raise http.client.HTTPException(f"HTTP/2: {exc}") from exc
        resp = self._stream = H2Response(self, sid)
        self._flush()
        while not resp.status:
            if resp.error is not None:
                raise resp.error
            if resp.got_headers:
                raise http.client.HTTPException("HTTP/2 response without a :status")
            if resp.ended:  # a stream that ended with no final headers
                raise http.client.HTTPException("HTTP/2 stream ended without a response")
            self.pump()
        return resp

    def pump(self) -> None:
        """Read once from the socket and apply what came (one read: 64 KiB at most)."""
        data = self.sock.recv(READ_SIZE)
        if not data:
            self.usable = False
            raise ConnectionResetError("the server closed the HTTP/2 connection")
        try:
            events = self._conn.receive_data(data)
        except _H2_ERRORS as exc:
            self.usable = False
            raise http.client.HTTPException(f"HTTP/2 protocol error: {exc!r}"[:200]) from exc
        for event in events:
            self._apply(event)
        self._flush()

    def cancel(self, resp: H2Response) -> None:
        if not resp.ended:
            resp.ended = True
            try:
                self._conn.reset_stream(resp.stream_id, h2.errors.ErrorCodes.CANCEL)
                self._flush()
            except (*_H2_ERRORS, OSError):
                self.usable = False

    def close(self) -> None:
        self.usable = False
        try:
            self._conn.close_connection()
            self._flush()
        except (*_H2_ERRORS, OSError):
            pass
        self.sock.close()

    def _flush(self) -> None:
        out = self._conn.data_to_send()
        if out:
            self.sock.sendall(out)

    def _apply(self, event: h2.events.Event) -> None:
        resp = self._stream
        mine = resp is not None and getattr(event, "stream_id", None) == resp.stream_id
        if isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:  # let the server send on (the body is bounded
                self._conn.acknowledge_received_data(  # by the fetcher's reads, not here)
                    event.flow_controlled_length, event.stream_id)
            if mine and resp is not None and event.data:
                resp._data(event.data)
        elif isinstance(event, h2.events.ResponseReceived):
            if mine and resp is not None:
                resp._headers(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            if mine and resp is not None:
                resp.ended = True
        elif isinstance(event, h2.events.StreamReset):
            if mine and resp is not None and not resp.ended:
                resp.error = ConnectionResetError(
                    f"HTTP/2 stream reset by the server ({event.error_code!r})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.usable = False
            last = event.last_stream_id
            if resp is not None and not resp.ended and (
                    event.error_code or last is None or resp.stream_id > last):
                resp.error = ConnectionResetError(
                    f"HTTP/2 GOAWAY ({event.error_code!r}) before the answer ended")
