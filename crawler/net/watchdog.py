"""Total time limits for fetches: one thread cuts the socket of any fetch past its deadline.

A server dripping a byte every 100 ms never trips a per-read timeout, so each
fetch gets a :class:`Watch` (its deadline and the socket it is using). The
socket is *attached* when opened or reused and *detached* before its
connection goes back to the pool. When a deadline passes, the watchdog
thread shuts the attached socket down: shutdown(2) wakes a blocked recv or
send at once, the fetch sees an error, finds ``watch.expired`` set and
reports a total timeout; the connection is never reused (``watch.killed``).

Thread safety: every method may be called from any thread; a Watch's fields
change only under the watchdog's lock. One heap of deadlines, one thread,
started on first use.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import socket
import threading
import time

log = logging.getLogger(__name__)

_HEAP_SLACK = 4096  # finished watches tolerated in the heap before it is compacted


def shut(sock: socket.socket) -> None:
    """Wake whoever is blocked on ``sock``; harmless on a closed socket."""
    # socket.socket.shutdown on purpose: SSLSocket.shutdown would also drop its
    # SSL object under a thread that may be inside SSL_read right now.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed or never connected
        pass


class Watch:
    """The deadline of one fetch and the socket it is using (guarded by the dog's lock)."""

    __slots__ = ("dog", "deadline", "sock", "expired", "killed", "aborted", "done")

    def __init__(self, dog: Watchdog, deadline: float) -> None:
        self.dog, self.deadline = dog, deadline
        self.sock: socket.socket | None = None
        self.expired = self.killed = self.aborted = self.done = False

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


class Watchdog:
    """Shuts down the socket of any fetch that outlives its deadline. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Watch]] = []
        self._seq = itertools.count()
        self._active = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, timeout: float) -> Watch:
        """A watch for one fetch, expiring ``timeout`` s from now."""
        with self._cond:
            w = Watch(self, time.monotonic() + timeout)
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
        return w

    def attach(self, w: Watch, sock: socket.socket) -> None:
        """``sock`` is now the fetch's; shut at once if the deadline already passed."""
        with self._cond:
            if w.done:
                return
            if w.expired:
                w.killed = True
                shut(sock)
            else:
                w.sock = sock

    def detach(self, w: Watch) -> bool:
        """Forget the socket (its connection may go back to the pool); True if it was killed."""
        with self._cond:
            w.sock = None
            return w.killed

    def finish(self, w: Watch) -> None:
        with self._cond:
            if not w.done:
                w.done, w.sock = True, None
                self._active -= 1
                if len(self._heap) > _HEAP_SLACK + 2 * self._active:
                    self._heap = [e for e in self._heap if not e[2].done]
                    heapq.heapify(self._heap)

    def close(self) -> None:
        """Stop the thread and cut every fetch in flight (they report "aborted")."""
        with self._cond:
            self._closed = True
            for _, _, w in self._heap:
                if not w.done:
                    w.expired = w.aborted = True
                    if w.sock is not None:
                        w.killed = True
                        shut(w.sock)
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
                    log.debug("total timeout: shutting down a socket")
                    shut(w.sock)
                    w.sock = None
