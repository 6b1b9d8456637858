"""Which live PendDB bulks are claimable, claimed, cooling or finished: the frontier's
claim bookkeeping, in memory only (a restart finds every live bulk claimable again).

A bulk's life here: ``add`` (written, claimable) -> ``take`` (a worker claims it at
random) -> ``hold`` with the number of its URLs handed out; each URL then ends by
``commit`` (its outcome written) or ``release`` (handed back unworked). When the last
one ends, the bulk is *finished* if every URL was committed (tombstoned by the commit
that ended it; by the next commit when ``hold`` had nothing to hand out), or *cooling*
for ``cooldown`` seconds, then claimable again, if any was released: its released URLs
are still to do, in the bulk as written. (Requeued instead, a busy host's URLs would be
rewritten into new bulks again and again.)

Not thread-safe but for ``add`` (the claimable set is a thread-safe KeySet): the
frontier calls the rest under its claim lock, together with PendSet and ProcessingSet,
so that ``idle`` never sees a bulk between two of these states.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import numpy as np

import kvstore

__all__ = ["RELEASE_COOLDOWN", "BulkClaims"]

# Seconds a bulk whose URLs were handed back (release) waits before it is claimed again.
RELEASE_COOLDOWN = 0.5


class BulkClaims:
    """The claim state of every live bulk, by its PendDB key."""

    def __init__(self, cooldown: float = RELEASE_COOLDOWN,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cooldown = cooldown
        self._clock = clock
        self.unclaimed = kvstore.KeySet()
        self._claimed: dict[bytes, int] = {}  # bulk key -> URLs not yet committed
        self._finished: list[bytes] = []  # to tombstone at the next commit
        self._released: set[bytes] = set()  # claimed bulks with URLs handed back
        self._cooling: collections.deque[tuple[float, bytes]] = collections.deque()

    def __len__(self) -> int:
        """Bulks claimable now (cooling ones not counted)."""
        return len(self.unclaimed)

    def add(self, keys: np.ndarray) -> None:
        """New live bulks (16-byte keys, an (n, 16) uint8 array), claimable at once.
        Needs no lock of the caller's (the commit adds them without one)."""
        self.unclaimed.add_many(keys)

    def take(self) -> bytes | None:
        """A random claimable bulk, now taken (``hold`` says what became of it); None
        when there is none right now. Cooled bulks are claimable again first."""
        now = self._clock()
        while self._cooling and self._cooling[0][0] <= now:
            self.unclaimed.add(self._cooling.popleft()[1])
        try:
            bk = self.unclaimed.random_key()
        except KeyError:
            return None
        self.unclaimed.discard(bk)
        return bk

    def hold(self, bk: bytes, urls: int) -> None:
        """A taken bulk handed out ``urls`` URLs; with none (all done before, or in
        flight from another bulk) it is finished at once."""
        if urls:
            self._claimed[bk] = urls
        else:
            self._finished.append(bk)

    def release(self, bk: bytes) -> None:
        """One of the bulk's URLs was handed back unworked."""
        self._released.add(bk)
        if self._end_one(bk):
            self._cool(bk)

    def commit(self, bk: bytes) -> bool:
        """One of the bulk's URLs was written (a record, or requeued in a new bulk).
        True: that was its last and every URL of it is done: the caller's commit
        tombstones it (after its records are flushed)."""
        if not self._end_one(bk):
            return False
        if bk in self._released:  # some of its URLs are still to do
            self._cool(bk)
            return False
        return True

    def take_finished(self) -> list[bytes]:
        """The finished bulks, for the commit to tombstone; forgotten here."""
        finished, self._finished = self._finished, []
        return finished

    def idle(self) -> bool:
        """No bulk claimable, claimed, cooling or waiting for its tombstone."""
        return not (self._claimed or self._finished or self._cooling or len(self.unclaimed))

    def _end_one(self, bk: bytes) -> bool:
        """One URL of a claimed bulk ended; whether it was the bulk's last."""
        left = self._claimed[bk] - 1
        if left:
            self._claimed[bk] = left
            return False
        del self._claimed[bk]
        return True

    def _cool(self, bk: bytes) -> None:
        self._released.discard(bk)
        self._cooling.append((self._clock() + self.cooldown, bk))
