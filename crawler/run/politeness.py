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

Idle hosts are evicted
----------------------
A crawl that meets a million hosts cannot keep a slot for each. A slot with
nothing waiting, no fetch in flight and its next time already passed carries
only its counters, so once more than ``max_slots`` slots exist, creating a
slot evicts such idle ones: their counters (fetches, failures, robots.txt
failures) are packed into one int in a ``KeyIntMap`` keyed by md5 of the host
(~31 bytes a host instead of ~1 KB) and restored when the host comes back.
So --max-pages-per-host and the backoff's doubling are exact across an
eviction. A host whose next time is still ahead (its delay, Crawl-delay,
Retry-After, a backoff) is never evicted, so no host is contacted early.
Its delay is not kept: it is the default or robots.txt's Crawl-delay, which
the robots.txt gate sets on the slot before every request
(crawler.run.robotsgate), the evicted host's rules being cached or on disk.

Slots that go idle are listed (once each) in a FIFO; each slot created, and
each release, past the bound examines at most ``_SWEEP`` entries of it: a
stale entry (the slot got busy again) is dropped, one whose time is ahead
goes to the back, the others are evicted. So eviction costs O(1) per call,
never O(hosts), and a crawl whose hosts all have a slot already still sheds
the idle ones as its fetches end. The bound is soft: it is exceeded while
more than ``max_slots`` hosts are busy or waiting out their delay. A waiting
list is allocated when a URL first waits for the host and freed when it empties.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kvstore import KeyIntMap

from ..web.urls import host_key

__all__ = ["DEFAULT_MAX_SLOTS", "HostSlot", "Scheduler", "Task"]

#: Host slots kept in memory before idle ones are evicted (read when a Scheduler is made).
DEFAULT_MAX_SLOTS = 20_000
# Idle-list entries examined per slot created past the bound.
_SWEEP = 8
# The packed counters of an evicted host: fetches | failures << 32 | robots_failures << 48.
# Counts are clamped: past 2**16 failures the backoff is at its cap long since, and a
# robots_failures count is only ever compared with --max-retries.
_FETCHES_MAX, _FAILURES_MAX, _ROBOTS_MAX = (1 << 32) - 1, (1 << 16) - 1, (1 << 15) - 1


@dataclass(slots=True)
class HostSlot:
    host: str
    delay: float
    queue: deque[Task] | None = None  # its waiting tasks; None while none wait
    active: int = 0
    next_at: float = 0.0
    in_heap: bool = False
    listed: bool = False  # in the scheduler's list of idle slots
    fetches: int = 0  # page requests reserved this run (for max pages per host)
    failures: int = 0  # consecutive failed requests (timeouts, resets, 429/5xx): the backoff
    robots_failures: int = 0  # consecutive robots.txt fetches that gave no usable answer


class Task(Protocol):
    """What waits in a host's queue: one interface for every kind of request.

    A worker that gets a host's slot hands it to the task, which makes its request
    through the gate (crawler.run.gate) and releases the slot. Three kinds: a page
    of the frontier (crawler.run.pagework), a sitemap (crawler.run.sitemaps) and a
    request of a page rendering in the browser (crawler.run.subfetch). The engine's
    workers run any of them the same way, never asking which."""

    def serve(self, slot: HostSlot) -> None:
        """Do the work on a worker that holds the host's ``slot``, then release the
        slot (or hand the task back to its host's queue and release it). Never
        raises: a failure is the task's own outcome."""

    def drop(self) -> None:
        """The crawl stops before the task ran: let go of what waits on it."""


def _pack(s: HostSlot) -> int:
    return (
        min(s.fetches, _FETCHES_MAX)
        | min(s.failures, _FAILURES_MAX) << 32
        | min(s.robots_failures, _ROBOTS_MAX) << 48
    )


class Scheduler:
    """Thread-safe. ``offer`` from the feeder, ``next``/``release`` from workers."""

    def __init__(
        self,
        *,
        per_host: int,
        delay: float,
        max_waiting: int,
        max_waiting_per_host: int,
        max_slots: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_host = per_host
        self.delay = delay
        self.max_waiting = max_waiting
        self.max_waiting_per_host = max_waiting_per_host
        self.max_slots = max(1, DEFAULT_MAX_SLOTS if max_slots is None else max_slots)
        self._clock = clock
        self._slots: dict[str, HostSlot] = {}
        self._idle: deque[HostSlot] = deque()  # slots that went idle, oldest first
        self._gone = KeyIntMap()  # md5(host) -> packed counters of an evicted host
        self._heap: list[tuple[float, int, HostSlot]] = []
        self._seq = 0
        self._cond = threading.Condition()
        self._timer_until = math.inf  # when the worker watching the heap wakes up
        self._closed = False
        self.waiting = 0
        self.active = 0
        self.evictions = 0

    def slot(self, host: str) -> HostSlot:
        """The host's slot (made if needed). One that is idle may later be evicted:
        hold it only while a URL of the host is active."""
        with self._cond:
            s = self._slot(host)
            self._list_if_idle(s)
            return s

    def _slot(self, host: str) -> HostSlot:
        s = self._slots.get(host)
        if s is None:
            s = self._slots[host] = HostSlot(host, self.delay)
            packed = self._gone.pop(host_key(host), None)
            if packed is not None:  # evicted before: its counters come back
                s.fetches = packed & _FETCHES_MAX
                s.failures = packed >> 32 & _FAILURES_MAX
                s.robots_failures = packed >> 48 & _ROBOTS_MAX
            if len(self._slots) > self.max_slots:
                self._evict()
        return s

    def _list_if_idle(self, s: HostSlot) -> None:
        if not s.listed and not s.queue and s.active == 0:
            s.listed = True
            self._idle.append(s)

    def _evict(self) -> None:
        """Evict idle slots whose time has passed, examining at most _SWEEP of them."""
        now = self._clock()
        for _ in range(min(_SWEEP, len(self._idle))):
            if len(self._slots) <= self.max_slots:
                return
            s = self._idle.popleft()
            if self._slots.get(s.host) is not s:
                continue  # evicted already (listed twice across an eviction)
            if s.queue or s.active:
                s.listed = False  # busy again: listed anew when it goes idle
                continue
            if s.next_at > now:
                self._idle.append(s)  # its delay is not over: politeness needs its time
                continue
            del self._slots[s.host]
            self._gone[host_key(s.host)] = _pack(s)
            self.evictions += 1

    def _push(self, s: HostSlot) -> None:
        if not s.in_heap and s.queue and s.active < self.per_host:
            s.in_heap = True
            self._seq += 1
            heapq.heappush(self._heap, (s.next_at, self._seq, s))
            self._cond.notify()

    def has_room(self) -> bool:
        return self.waiting < self.max_waiting

    def offer(self, host: str, item: Task, *, front: bool = False) -> bool:
        """Queue a URL for its host; False if the host's (or the global) wait list is full."""
        with self._cond:
            if not front and self.waiting >= self.max_waiting:
                return False  # before making a slot: a refused host costs nothing
            s = self._slot(host)
            q = s.queue
            if q is None:
                q = s.queue = deque()
            if not front and len(q) >= self.max_waiting_per_host:
                return False
            if front:
                q.appendleft(item)
            else:
                q.append(item)
            self.waiting += 1
            self._push(s)
            return True

    def next(self, timeout: float | None = None) -> tuple[HostSlot, Task] | None:
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

    def _pop_ready(self, now: float) -> tuple[HostSlot, Task] | None:
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
            q = s.queue
            if not q or s.active >= self.per_host:
                continue
            item = q.popleft()
            if not q:
                s.queue = None  # an empty deque is ~600 bytes: most hosts wait for nothing
            self.waiting -= 1
            s.active += 1
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
            self._list_if_idle(s)
            if len(self._slots) > self.max_slots:
                self._evict()

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

    def set_delay(self, s: HostSlot, delay: float) -> None:
        """The host's delay between requests from now on (its robots.txt Crawl-delay)."""
        with self._cond:
            s.delay = delay

    def reserve_fetch(self, s: HostSlot, limit: int | None) -> bool:
        """Count one page request for the host; False (nothing counted) once ``limit``
        requests were reserved this run."""
        with self._cond:
            if limit is not None and s.fetches >= limit:
                return False
            s.fetches += 1
            return True

    def drain(self) -> list[Task]:
        """Remove and return every waiting URL (at shutdown)."""
        with self._cond:
            items = [item for s in self._slots.values() if s.queue for item in s.queue]
            for s in self._slots.values():
                s.queue = None
                s.in_heap = False
            self.waiting = 0
            self._heap.clear()
            return items

    def idle(self) -> bool:
        with self._cond:
            return self.waiting == 0 and self.active == 0

    def hosts(self) -> int:
        """Hosts seen this run: those with a slot and those evicted."""
        with self._cond:
            return len(self._slots) + len(self._gone)

    def slots(self) -> int:
        """Host slots in memory now."""
        return len(self._slots)

    def delayed(self) -> int:
        """Hosts with URLs waiting and a free connection whose turn is not yet: politeness
        (their delay, Crawl-delay, a Retry-After or a backoff) holds them now."""
        with self._cond:
            now = self._clock()
            return sum(1 for _, _, s in self._heap if s.next_at > now and s.queue)

    def close(self) -> None:
        """Make every ``next()``, blocked or future, return None: the workers stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
