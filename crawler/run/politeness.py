"""Per-host politeness: connection limits, delays, backoff, and a bounded wait list.

Theory of operation
-------------------
Each host has a ``HostSlot`` (its waiting URLs, active fetches, the time it
may next be contacted, its delay). Hosts that have URLs waiting and a free
connection sit in a heap ordered by that time. ``next()`` hands a worker the
URL of the earliest host whose time has come, marking one connection busy;
``release()`` frees it and sets the host's next time to now + its delay (so
the gap from the end of one request to the start of the next is at least the
delay), or later after a Retry-After or an error backoff. A URL decided
without contacting the host (a cached robots.txt verdict, a bad host, a page
limit) releases with ``contacted=False`` and costs the host no delay, so a
dead host's thousand URLs are recorded at once, not one per delay. A slow
host only holds its own connections: other hosts keep flowing (no
head-of-line blocking).

Per-host counters (consecutive failures for the backoff, robots.txt failures,
fetches for max pages per host) change under the scheduler's lock, through
``host_failed``, ``host_ok``, ``robots_outcome`` and ``reserve_fetch``.

Memory is bounded: at most ``max_waiting`` URLs wait in all, and at most
``max_waiting_per_host`` for one host; ``offer()`` refuses beyond that and the
caller sends the URL back to PendDB.
"""

from __future__ import annotations

import heapq
import math
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
    pages: int = 0  # URLs handed out for this host
    fetches: int = 0  # page requests reserved this run (for max pages per host)
    failures: int = 0  # consecutive failed requests (timeouts, resets, 429/5xx): the backoff
    robots_failures: int = 0  # consecutive robots.txt fetches that gave no usable answer
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
        self._timer_until = math.inf  # when the worker watching the heap wakes up
        self._closed = False
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

    def next(self, timeout: float | None = None) -> tuple[HostSlot, Any] | None:
        """The next URL whose host may be contacted now; None after ``timeout``
        (``None``: wait until one is ready or ``close()``).

        Thousands of workers wait here, so idle ones sleep untimed: only one
        (the *timer*) sleeps until the earliest host's time, and whoever takes a
        URL wakes one more to take over that role.
        """
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                now = self._clock()
                got = self._pop_ready(now)
                if got is not None:
                    if self._heap:
                        self._cond.notify()  # someone must watch the next host's time
                    return got
                if self._closed or (deadline is not None and now >= deadline):
                    return None
                wait = None if deadline is None else deadline - now
                # Become a timer if no one is watching the earliest host's time.
                timer = bool(self._heap) and self._heap[0][0] < self._timer_until
                if timer:
                    self._timer_until = self._heap[0][0]
                    until_top = max(0.0, self._timer_until - now)
                    wait = until_top if wait is None else min(wait, until_top)
                self._cond.wait(wait)
                if timer:
                    self._timer_until = math.inf

    def _pop_ready(self, now: float) -> tuple[HostSlot, Any] | None:
        while self._heap:
            at, _, s = self._heap[0]
            if at != s.next_at and s.next_at > at:  # the host's time moved: re-file it
                self._seq += 1
                heapq.heapreplace(self._heap, (s.next_at, self._seq, s))
                continue
            if at > now:
                return None
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
        return None

    def release(self, s: HostSlot, *, not_before: float = 0.0, contacted: bool = True) -> None:
        """A URL of ``s`` is done with: free the connection. If the host was
        ``contacted`` it waits its delay; in any case not before ``not_before``
        (a monotonic time, after a Retry-After or backoff)."""
        with self._cond:
            s.active -= 1
            self.active -= 1
            floor = self._clock() + s.delay if contacted else 0.0
            s.next_at = max(s.next_at, floor, not_before)
            self._push(s)  # wakes one waiting worker if the host has more to do

    # -- per-host counters (thread-safe) -------------------------------------------

    def host_failed(self, s: HostSlot, base: float, cap: float) -> float:
        """Count a failed request; the seconds the host now waits: ``base`` doubled
        for each consecutive failure before this one, at most ``cap``."""
        with self._cond:
            s.failures += 1
            return min(base * 2.0 ** min(s.failures - 1, 60), cap)

    def host_ok(self, s: HostSlot) -> None:
        """A request got a usable answer: the backoff starts over."""
        with self._cond:
            s.failures = 0

    def robots_outcome(self, s: HostSlot, failed: bool) -> int:
        """Count a robots.txt fetch; the number of consecutive failed ones (0 after a success)."""
        with self._cond:
            s.robots_failures = s.robots_failures + 1 if failed else 0
            return s.robots_failures

    def reserve_fetch(self, s: HostSlot, limit: int | None) -> bool:
        """Count one page request for the host; False (nothing counted) once ``limit``
        requests were reserved this run."""
        with self._cond:
            if limit is not None and s.fetches >= limit:
                return False
            s.fetches += 1
            return True

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

    def close(self) -> None:
        """Make every ``next()``, blocked or future, return None: the workers stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
