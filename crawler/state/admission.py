"""Admission: which offered links are new, and the log of every URL admitted.

The frontier's committer (crawler.state.frontier) passes each batch of offered
links through here before it writes them to PendDB. Admission is a job of its
own, with state of its own: a cache of recently seen keys and ``urls.log``. It
only reads the frontier's stores. Keeping it apart leaves the frontier with
claims and the crash-safe write order. Only the committer's thread calls it, so
two pages that link the same URL can never both admit it.
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
from typing import Any, Protocol, TextIO

import numpy as np

from .pages import Pending

# Keys recently seen by admission, in two generations of up to this many each.
# Links repeat (navigation, popular pages): most offers stop here, for the price of
# a Python set probe instead of three store lookups (~3 us each in small batches).
DEFAULT_RECENT_KEYS = 1 << 15
# Admission batches of at least this many distinct keys skip the cache (see dedup).
DEFAULT_VECTOR_BATCH = 1024


class KnownKeys(Protocol):
    """A store or key set that answers "which of these keys do you hold?"."""

    def contains_many(self, keys: Any) -> np.ndarray: ...


class HeldTogether:
    """Key sets asked as one, under ``lock``. A key moves between them under that lock
    (the frontier's claim: PendSet to ProcessingSet; a release: back), so asked one after
    the other it could be in neither at the moments they were asked, and be admitted
    again: a second bulk, and one pending URL too many in status's counters."""

    def __init__(self, lock: threading.Lock, *sets: KnownKeys) -> None:
        self._lock = lock
        self._sets = sets

    def contains_many(self, keys: Any) -> np.ndarray:
        with self._lock:
            found = self._sets[0].contains_many(keys)
            for known_by in self._sets[1:]:
                found = found | known_by.contains_many(keys)
        return found


def keys_array(keys: list[bytes]) -> np.ndarray:
    """16-byte keys as the (n, 16) uint8 array that batch lookups and adds take."""
    return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 16)


def _open_url_log(path: str) -> TextIO:
    """``urls.log`` for appending, starting on a fresh line (a full disk may have cut
    the last one)."""
    cut = False
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            cut = f.read(1) != b"\n"
    log_file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by Admission.close
    if cut:
        log_file.write("\n")
    return log_file


class Admission:
    """Deduplicates offered links and logs the ones admitted to ``log_path``.

    ``known_by``: what already knows a key, cheapest to ask first (the frontier's
    MainDB, PendSet and ProcessingSet). Not thread-safe: the committer's alone
    (``admitted`` may be read from any thread)."""

    def __init__(
        self,
        log_path: str,
        known_by: tuple[KnownKeys, ...],
        *,
        recent_keys: int = DEFAULT_RECENT_KEYS,
    ) -> None:
        self._known_by = known_by
        self._recent_cap = recent_keys
        self._recent: set[bytes] = set()  # known keys (admitted or done): a key never
        self._older: set[bytes] = set()  # stops being known, so a hit is always right
        self.admitted = 0
        self._log = _open_url_log(log_path)

    def dedup(self, candidates: list[tuple[bytes, Pending]]) -> tuple[list[Pending], list[bytes]]:
        """The candidates never seen before (first offer of each wins), and their keys.

        Order of the checks, cheapest first: this batch (a dict built in C), then
        for a small batch the recent-keys cache (Python sets), then each of
        ``known_by`` (the frontier's: MainDB, then PendSet and ProcessingSet asked
        together, ``HeldTogether``), each asked only about the keys the ones before
        did not know. A big batch skips the cache: the stores' vectorized lookups
        cost less per key than a Python loop over it."""
        fresh = dict(reversed(candidates))  # the first offer of a key is the one kept
        keys = list(dict.fromkeys(map(operator.itemgetter(0), candidates)))  # in offer order
        small = len(keys) < DEFAULT_VECTOR_BATCH
        if small:
            recent, older = self._recent, self._older
            keys = [k for k in keys if k not in recent and k not in older]
        for known_by in self._known_by:
            if not keys:
                break
            known = known_by.contains_many(keys_array(keys)).tolist()
            if small:
                for k in itertools.compress(keys, known):
                    self._remember(k)
            keys = [k for k, old in zip(keys, known, strict=True) if not old]
        if small:
            for k in keys:
                self._remember(k)
        entries = [fresh[k] for k in keys]
        if entries:
            self._log.write("".join(e.url + "\n" for e in entries))
            self._log.flush()
            self.admitted += len(entries)
        return entries, keys

    def _remember(self, key: bytes) -> None:
        if len(self._recent) >= self._recent_cap:
            self._older, self._recent = self._recent, set()
        self._recent.add(key)

    def close(self) -> None:
        """Close ``urls.log`` (raises OSError if its buffered tail cannot be written)."""
        self._log.close()
