"""The link exchange between shards: its interface, a Unix-socket transport, and the forwarder.

Theory of operation
-------------------
The boundary between one shard's engine and the rest of a crawl is
:class:`LinkExchange`, two calls and a close:

* ``serve(index, admit)``: batches sent to shard ``index`` (this one) are
  handed to ``admit(payload)``, which returns once they are durable here (the
  frontier's ``receive`` event: written, flushed and fsynced) and raises to
  refuse them (stopping, or not in time);
* ``send(dest, payload)``: hand one batch to shard ``dest``; returns once
  ``dest``'s ``admit`` returned, raises ExchangeError if it did not (down,
  restarting, stopping, no answer in time). The caller still has the batch in
  its outbox and sends it again later.

A payload is one PendDB bulk (crawler.state.pages.encode_bulk): thousands of
URLs a message. Delivery is at least once: a batch whose answer was lost is
sent again, and the owner's admission dedups it. Nothing else crosses the
boundary, so on Ray (issue 13) ``send`` is ``ray.get(actors[dest].admit.remote(
payload))`` and ``serve`` is the actor's ``admit`` method.

:class:`UnixExchange`: each shard listens on ``inbox.sock`` in its own
directory; a sender keeps one connection per destination. A frame is
``b"KVLX"``, the payload's length and CRC32 (u32 LE each), the payload; the
answer is one byte, ``+`` (durable) or ``-`` (refused). Unix sockets rather
than pipes through the supervisor: links go straight from shard to shard (no
relay process paying a copy and a GIL slot for all traffic), a restarted
shard listens again at the same path and senders simply reconnect (no pipes
to re-plumb), and shards calling each other is the shape actors have. A path
longer than a socket address allows is reached through ``/proc/self/fd`` of
its directory (Linux).

:class:`Forwarder`: a thread that empties the outbox. A destination's records
go as one message once they hold ``batch_urls`` URLs (the exchange's
``max_batch_urls`` at most) or the oldest has waited ``linger`` seconds; the
records are deleted (``Outbox.ack``) only after the owner answered. A
destination that fails is retried with a doubling backoff. One message at a
time: sending to several destinations at once was tried and made messages
smaller and the crawl slower on two cores (docs/SCALE.md).

Thread safety: ``send`` from any thread (one connection per destination,
under a lock); ``admit`` runs in the exchange's connection threads.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from ..exceptions import ExchangeError
from ..state.outbox import Outbox

log = logging.getLogger(__name__)

SOCKET_NAME = "inbox.sock"
DEFAULT_TIMEOUT = 60.0  # seconds for a connect, or for the owner to make a batch durable
DEFAULT_BATCH_URLS = 5000  # URLs a message carries at most (fewer after ``linger``)
DEFAULT_LINGER = 0.1  # seconds a record may wait for more before it is sent alone
MAX_LINGER = 5.0  # the linger of a crawl of many shards (linger_for) stays below this
MAX_BACKOFF = 5.0  # seconds between tries to a shard that is down
MAX_PAYLOAD = 256 << 20
_MAGIC = b"KVLX"
_HEAD = struct.Struct("<4sII")
_OK, _REFUSED = b"+", b"-"
_MAX_SUN_PATH = 100  # sockaddr_un holds 108 bytes on Linux, fewer elsewhere

Admit = Callable[[bytes], None]


def linger_for(count: int) -> float:
    """How long a link may wait for company in a crawl of ``count`` shards: 0.1 s up to
    8 shards, then growing with the count, since a shard's links spread over ``count -
    1`` destinations and each message should still carry many (docs/SCALE.md)."""
    return min(MAX_LINGER, DEFAULT_LINGER * max(1.0, count / 8))


class LinkExchange(ABC):
    """How batches of links travel between shards (see the module docstring)."""

    max_batch_urls = DEFAULT_BATCH_URLS  # URLs one message carries at most

    @abstractmethod
    def serve(self, index: int, admit: Admit) -> None:
        """Hand batches sent to shard ``index`` to ``admit`` from now on."""

    @abstractmethod
    def send(self, dest: int, payload: bytes) -> None:
        """Deliver ``payload`` to shard ``dest``: returns once it is durable there;
        raises ExchangeError otherwise."""

    @abstractmethod
    def close(self) -> None:
        """Stop serving and drop connections (idempotent)."""


class UnixExchange(LinkExchange):
    """Shards on one machine, each listening on a Unix socket (``addresses[i]``)."""

    def __init__(self, addresses: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.addresses = list(addresses)
        self.timeout = timeout
        self._dir_fds: dict[str, int] = {}
        self._conns: dict[int, socket.socket] = {}
        self._locks = [threading.Lock() for _ in self.addresses]
        self._listener: socket.socket | None = None
        self._accepted: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def _path(self, index: int) -> str:
        path = self.addresses[index]
        if len(os.fsencode(path)) <= _MAX_SUN_PATH:
            return path
        parent, name = os.path.split(path)
        with self._lock:
            fd = self._dir_fds.get(parent)
            if fd is None:
                fd = self._dir_fds[parent] = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{fd}/{name}"

    # -- the inbox ------------------------------------------------------------------------

    def serve(self, index: int, admit: Admit) -> None:
        path = self._path(index)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(path)  # left by a run that was killed; we hold the shard's lock
        except FileNotFoundError:
            pass
        listener.bind(path)
        listener.listen(64)
        self._listener = listener
        threading.Thread(
            target=self._accept_loop, args=(listener, admit), name="inbox", daemon=True
        ).start()

    def _accept_loop(self, listener: socket.socket, admit: Admit) -> None:
        while not self._closed:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._accepted.add(conn)
            threading.Thread(
                target=self._serve_conn, args=(conn, admit), name="inbox-conn", daemon=True
            ).start()

    def _serve_conn(self, conn: socket.socket, admit: Admit) -> None:
        try:
            while True:
                head = _recv_exact(conn, _HEAD.size)
                if head is None:
                    return
                magic, size, crc = _HEAD.unpack(head)
                if magic != _MAGIC or size > MAX_PAYLOAD:
                    log.warning("inbox: a bad frame; dropping the connection")
                    return
                payload = _recv_exact(conn, size)
                if payload is None:
                    return
                if zlib.crc32(payload) != crc:
                    log.warning("inbox: a batch failed its CRC; refused")
                    conn.sendall(_REFUSED)
                    continue
                try:
                    admit(payload)
                except Exception as exc:  # noqa: BLE001 - any failure is a refusal: the sender retries
                    log.debug("inbox: batch refused: %s", exc)
                    conn.sendall(_REFUSED)
                    continue
                conn.sendall(_OK)
        except OSError:
            return
        finally:
            with self._lock:
                self._accepted.discard(conn)
            conn.close()

    # -- sending ---------------------------------------------------------------------------

    def send(self, dest: int, payload: bytes) -> None:
        frame = _HEAD.pack(_MAGIC, len(payload), zlib.crc32(payload)) + payload
        with self._locks[dest]:
            # A cached connection may be to a shard that restarted since: one more try
            # on a fresh connection before the failure counts.
            for fresh in (dest not in self._conns, True):
                try:
                    sock = self._connection(dest)
                    sock.sendall(frame)
                    answer = sock.recv(1)
                except OSError as exc:
                    self._drop(dest)
                    if fresh:
                        raise ExchangeError(dest, f"not reachable: {exc}") from exc
                    continue
                if answer == _OK:
                    return
                self._drop(dest)
                if answer == _REFUSED:
                    raise ExchangeError(dest, "refused the batch (stopping, or busy)")
                if fresh:
                    raise ExchangeError(dest, "closed the connection")

    def _connection(self, dest: int) -> socket.socket:
        sock = self._conns.get(dest)
        if sock is None:
            if self._closed:
                raise OSError("the exchange is closed")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self._path(dest))
            except OSError:
                sock.close()
                raise
            self._conns[dest] = sock
        return sock

    def _drop(self, dest: int) -> None:
        sock = self._conns.pop(dest, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            accepted = list(self._accepted)
        if self._listener is not None:
            self._listener.close()
        for conn in accepted:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for dest in list(self._conns):
            self._drop(dest)
        for fd in self._dir_fds.values():
            os.close(fd)
        self._dir_fds.clear()


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    """``n`` bytes, or None at a clean end of the stream before the first byte."""
    parts, got = [], 0
    while got < n:
        chunk = conn.recv(min(n - got, 1 << 20))
        if not chunk:
            if got:
                raise ConnectionResetError("the peer closed mid-frame")
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class Forwarder:
    """Hands the outbox's records to their owners through ``exchange``; a thread."""

    def __init__(
        self,
        outbox: Outbox,
        exchange: LinkExchange,
        *,
        batch_urls: int = DEFAULT_BATCH_URLS,
        linger: float = DEFAULT_LINGER,
    ) -> None:
        self.outbox = outbox
        self.exchange = exchange
        self.batch_urls = min(batch_urls, exchange.max_batch_urls)
        self.linger = linger
        self.sent_batches = 0
        self.sent_urls = 0
        self.failures = 0
        self._stop = threading.Event()
        self._retry_at: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._thread = threading.Thread(target=self._loop, name="forwarder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the message in progress (what is not acked stays in the outbox)."""
        self._stop.set()
        with self.outbox.changed:
            self.outbox.changed.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.forward()
            except Exception:  # noqa: BLE001 - a broken outbox must not kill the thread silently
                log.exception("forwarder: unexpected error; retrying in 1 s")
                wait = 1.0
            if wait > 0 and not self._stop.is_set():
                with self.outbox.changed:
                    self.outbox.changed.wait(wait)

    def forward(self) -> float:
        """One pass over the destinations; how long to wait before the next (0: go on)."""
        now = time.monotonic()
        wait = self.linger
        for dest, (urls, oldest) in sorted(self.outbox.pending().items()):
            if self._stop.is_set():
                break
            retry = self._retry_at.get(dest, 0.0)
            if now < retry:
                wait = min(wait, retry - now)
                continue
            if urls < self.batch_urls and now - oldest < self.linger:
                wait = min(wait, self.linger - (now - oldest))
                continue
            taken = self.outbox.take(dest, self.batch_urls)
            if taken is None:
                continue
            try:
                self.exchange.send(dest, taken.payload)
            except ExchangeError as exc:
                self.failures += 1
                backoff = min(MAX_BACKOFF, self._backoff.get(dest, 0.05) * 2)
                self._backoff[dest] = backoff
                self._retry_at[dest] = time.monotonic() + backoff
                log.log(
                    logging.INFO if backoff >= MAX_BACKOFF else logging.DEBUG,
                    "%s; %d links kept, next try in %.2f s", exc, urls, backoff,
                )
                wait = min(wait, backoff)
                continue
            self.outbox.ack(taken)
            self._backoff.pop(dest, None)
            self._retry_at.pop(dest, None)
            self.sent_batches += 1
            self.sent_urls += taken.urls
            wait = 0.0
        return max(wait, 0.0)
