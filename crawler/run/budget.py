"""A shard's budget of bytes in flight: the response bodies its workers hold and their
parse buffers. A worker that would pass it waits; nothing is allocated beyond it.

Theory of operation
-------------------
Each URL a worker fetches takes a :class:`Lease` and grows it *before* holding more
bytes: the fetcher as the body arrives (crawler.net.fetch), link extraction before each
piece it feeds the parser (crawler.web.links), the engine before it encodes the record.
Closing the lease gives every byte back. The budget never hands out more than
``limit`` in all, and never deadlocks although leases grow while holding bytes:

- Leases are ranked by age. The *oldest* open lease is always granted: it never waits.
- Any other lease is granted only if the leases other than the oldest then hold at
  most ``limit - largest`` (``largest``: the most one lease can hold). The oldest can
  therefore always grow to ``largest`` within ``limit``; when it closes, the next
  oldest inherits the same guarantee, so every lease in turn finishes.
- A lease also waits while an older lease is waiting (no overtaking), so a wait
  lasts at most until the leases before it are done.

A lease larger than ``largest`` (or a ``limit`` below it) cannot break the order: its
turn comes when it is the oldest, and it then proceeds alone, past the limit if it must.

The budget bounds the bytes held; for the process's RSS to follow, freed bodies must
leave the process. glibc's malloc raises its mmap threshold to the largest block freed
(up to 32 MiB), so after the first 20 MiB body every body comes from a thread arena,
which keeps its pages once freed, and RSS follows each arena's worst moment instead:
466 MB against 209 MB with a fixed threshold, in the crawl of
tests/crawler/test_parse_memory.py. :func:`return_large_blocks` fixes it at 1 MiB:
larger blocks get mappings of their own, given back when freed and grown by mremap.

Thread safety: every method may be called from any thread; one lease belongs to one
worker at a time.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import threading
import time
from types import TracebackType

__all__ = ["BUDGET_QUANTUM", "MMAP_THRESHOLD", "Lease", "MemoryBudget", "return_large_blocks"]

log = logging.getLogger(__name__)

# Leases grow in steps of at least this much: one lock round per 64 KiB, not per read.
BUDGET_QUANTUM = 64 << 10
# Blocks of this size and more are mapped on their own (see return_large_blocks).
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def return_large_blocks(threshold: int = MMAP_THRESHOLD) -> bool:
    """Make glibc's malloc map blocks of ``threshold`` bytes and more on their own, so
    a freed body leaves the process (module doc). Process-wide; True if it was set.
    Left alone where the user set ``MALLOC_MMAP_THRESHOLD_`` or the C library is not
    glibc."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        done = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False
    log.debug("malloc: blocks of %d bytes and more mapped on their own: %s", threshold, done)
    return done


class Lease:
    """The bytes one URL's handling holds (see the module doc). Use as a context manager."""

    __slots__ = ("_budget", "ticket", "granted", "needed", "closed")

    def __init__(self, budget: MemoryBudget, ticket: int) -> None:
        self._budget = budget
        self.ticket = ticket  # age rank: smaller is older
        self.granted = 0  # bytes the budget counts for this lease
        self.needed = 0  # bytes asked for so far (granted in quanta, so granted >= needed)
        self.closed = False

    def grow(self, n: int) -> None:
        """Count ``n`` more bytes held; waits while the budget cannot take them."""
        if n <= 0:
            return
        self.needed += n
        if self.needed > self.granted:
            self._budget._grant(self, max(self.needed - self.granted, BUDGET_QUANTUM))

    def hold(self, total: int) -> None:
        """Grow to at least ``total`` bytes in all (never shrinks)."""
        self.grow(total - self.needed)

    def close(self) -> None:
        """Give every byte back. Idempotent."""
        self._budget._close(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class MemoryBudget:
    """``limit`` bytes in flight for a shard; ``largest``: the most one lease can hold."""

    def __init__(self, limit: int, largest: int) -> None:
        if limit < 1 or largest < 1:
            raise ValueError(f"budget limit and largest must be > 0, got {limit}, {largest}")
        self.limit = limit
        self.largest = largest
        self._shared = max(0, limit - largest)  # what the leases but the oldest may hold
        self._cond = threading.Condition(threading.Lock())
        self._tickets = itertools.count()
        self._open: dict[Lease, None] = {}  # open leases, oldest first (tickets only grow)
        self._waiting: dict[Lease, None] = {}
        self.in_use = 0
        self.peak = 0  # the most ever held at once
        self.waits = 0  # grants that had to wait
        self.wait_seconds = 0.0
        self.longest_wait = 0.0

    def lease(self) -> Lease:
        """A new, empty lease (the youngest). Thread-safe."""
        with self._cond:
            lease = Lease(self, next(self._tickets))
            self._open[lease] = None
            return lease

    def snapshot(self) -> dict[str, float]:
        """The numbers status.json shows: limit, in use, peak (bytes), waits, their
        seconds in all and the longest."""
        with self._cond:
            return {"limit": self.limit, "in_use": self.in_use, "peak": self.peak,
                    "waits": self.waits, "wait_s": round(self.wait_seconds, 3),
                    "longest_wait_s": round(self.longest_wait, 3)}

    # -- the lease's side -------------------------------------------------------------

    def _may(self, lease: Lease, n: int) -> bool:
        oldest = next(iter(self._open))
        if lease is oldest:
            return True
        if any(w.ticket < lease.ticket for w in self._waiting):
            return False  # no overtaking an older lease that waits
        return self.in_use - oldest.granted + n <= self._shared

    def _grant(self, lease: Lease, n: int) -> None:
        with self._cond:
            if lease.closed:
                raise ValueError("grow() on a closed lease")
            if not self._may(lease, n):
                started = time.monotonic()
                self.waits += 1
                self._waiting[lease] = None
                try:
                    while not self._may(lease, n):
                        self._cond.wait()
                finally:
                    del self._waiting[lease]
                    waited = time.monotonic() - started
                    self.wait_seconds += waited
                    self.longest_wait = max(self.longest_wait, waited)
                    self._cond.notify_all()  # a younger lease may go now
            lease.granted += n
            self.in_use += n
            self.peak = max(self.peak, self.in_use)

    def _close(self, lease: Lease) -> None:
        with self._cond:
            if lease.closed:
                return
            lease.closed = True
            self.in_use -= lease.granted
            lease.granted = 0
            del self._open[lease]
            self._cond.notify_all()
