"""Per-host politeness: connection limits, delays, backoff, and a bounded wait list.

Theory of operation
-------------------
Each host has a ``HostSlot`` (its waiting URLs, active fetches, the time it
may next be contacted, its delay). Hosts that have URLs waiting and a free
connection sit in a heap ordered by that time. ``next()`` hands a worker the
URL of the earliest host whose time has come, marking one connection busy;
``release()`` frees it and sets the host's next time to now + its delay (so
the gap from the end of one request to the start of the next is at least the
delay), or later after a Retry-After or an error backoff. A slow host only
holds its own connections: other hosts keep flowing (no head-of-line
blocking).

Memory is bounded: at most ``max_waiting`` URLs wait in all, and at most
``max_waiting_per_host`` for one host; ``offer()`` refuses beyond that and the
caller sends the URL back to PendDB.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class HostSlot:
    host: str
    delay: float
    queue: deque[Any] = field(default_factory=deque)
    active: int = 0
    next_at: float = 0.0
    in_heap: bool = False
    pages: int = 0  # URLs handed out for this host (for max pages per host)
    failures: int = 0  # consecutive failures, for the backoff
    state: dict[str, Any] = field(default_factory=dict)  # robots rules etc., owned by the engine


class Scheduler:
    """Thread-safe. ``offer`` from the feeder, ``next``/``release`` from workers."""

    def __init__(
        self,
        *,
        per_host: int,
        delay: float,
        max_waiting: int,
        max_waiting_per_host: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_host = per_host
        self.delay = delay
        self.max_waiting = max_waiting
        self.max_waiting_per_host = max_waiting_per_host
        self._clock = clock
        self._slots: dict[str, HostSlot] = {}
        self._heap: list[tuple[float, int, HostSlot]] = []
        self._seq = 0
        self._cond = threading.Condition()
        self.waiting = 0
        self.active = 0

    def slot(self, host: str) -> HostSlot:
        with self._cond:
            return self._slot(host)

    def _slot(self, host: str) -> HostSlot:
        s = self._slots.get(host)
        if s is None:
            s = self._slots[host] = HostSlot(host, self.delay)
        return s

    def _push(self, s: HostSlot) -> None:
        if not s.in_heap and s.queue and s.active < self.per_host:
            s.in_heap = True
            self._seq += 1
            heapq.heappush(self._heap, (s.next_at, self._seq, s))
            self._cond.notify()

    def has_room(self) -> bool:
        return self.waiting < self.max_waiting

    def offer(self, host: str, item: Any, *, front: bool = False) -> bool:
        """Queue a URL for its host; False if the host's (or the global) wait list is full."""
        with self._cond:
            s = self._slot(host)
            if not front and (
                len(s.queue) >= self.max_waiting_per_host or self.waiting >= self.max_waiting
            ):
                return False
            if front:
                s.queue.appendleft(item)
            else:
                s.queue.append(item)
            self.waiting += 1
            self._push(s)
            return True

    def next(self, timeout: float) -> tuple[HostSlot, Any] | None:
        """The next URL whose host may be contacted now, or None after ``timeout``."""
        deadline = self._clock() + timeout
        with self._cond:
            while True:
                now = self._clock()
                while self._heap:
                    at, _, s = self._heap[0]
                    if at != s.next_at and s.next_at > at:  # the host's time moved: re-file it
                        heapq.heapreplace(self._heap, (s.next_at, self._seq, s))
                        self._seq += 1
                        continue
                    if at > now:
                        break
                    heapq.heappop(self._heap)
                    s.in_heap = False
                    if not s.queue or s.active >= self.per_host:
                        continue
                    item = s.queue.popleft()
                    self.waiting -= 1
                    s.active += 1
                    s.pages += 1
                    self.active += 1
                    self._push(s)  # more connections allowed for it?
                    return s, item
                if now >= deadline:
                    return None
                wait = deadline - now
                if self._heap:
                    wait = min(wait, max(0.0, self._heap[0][0] - now))
                self._cond.wait(wait)

    def release(self, s: HostSlot, *, not_before: float = 0.0) -> None:
        """A fetch for ``s`` ended: free the connection; the host waits its delay
        (or until ``not_before``, a monotonic time, after a Retry-After or backoff)."""
        with self._cond:
            s.active -= 1
            self.active -= 1
            s.next_at = max(s.next_at, self._clock() + s.delay, not_before)
            self._push(s)
            self._cond.notify_all()

    def drain(self) -> list[Any]:
        """Remove and return every waiting URL (at shutdown)."""
        with self._cond:
            items = [item for s in self._slots.values() for item in s.queue]
            for s in self._slots.values():
                s.queue.clear()
            self.waiting = 0
            self._heap.clear()
            for s in self._slots.values():
                s.in_heap = False
            return items

    def idle(self) -> bool:
        with self._cond:
            return self.waiting == 0 and self.active == 0

    def hosts(self) -> int:
        return len(self._slots)

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()
