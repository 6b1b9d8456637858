"""The in-memory index: 16-byte keys -> small unsigned integers, in numpy arrays.

Theory of operation
-------------------
Layout. The table is split into ``NUM_SEGMENTS`` independent segments chosen by
the top bits of the key's hash. Each segment is an open-addressing table of
prime capacity with two numpy arrays: ``keys`` (cap x 16 bytes) and ``vals``
(cap x W bytes, a W-byte little-endian unsigned value per slot). W is 1 for a
key set, 6 for a store (a VAL file offset) and 8 for a key -> int map, so a
store pays 22 bytes a slot.

Slot state lives in the value's top byte: 0xFE or 0xFF marks a sentinel, and
then the low byte says which: all 0xFF is EMPTY, 0xFE in the low byte (and
0xFF above it) is DELETED; for W = 1 these are the single bytes 0xFF and 0xFE.
Real values stay below 2**(8W - 1), so their top byte never looks like one.

Hash and probe sequence. The key, read as a little-endian 128-bit integer, is
multiplied by an odd 128-bit constant; bits 64..127 of the product, which
depend on every key bit, are then mixed (xorshift, multiply, xorshift) so
that sequential counters (in either byte order), keys with equal halves, and
md5 digests all spread alike. The segment
is ``h >> 60``; within it, double hashing:
start ``h % cap``, step ``1 + (h >> 20) % (cap - 1)``; cap is prime, so every
step visits every slot. Double hashing keeps the mean probe length under 2 at
the maximum load factor of 0.78 (linear probing would need ~3).

Resize rule. A segment is rebuilt when its used slots (live + deleted) pass
``MAX_LOAD`` of its capacity, to a capacity where its live keys fill
``MAX_LOAD / GROWTH``; it is also rebuilt smaller when deletions leave it
nearly empty. Only one segment is rebuilt at a time, so growth needs one
segment's worth of extra memory, never twice the index.

Concurrency. Lookups run without a lock: under the GIL each slice read or
write of a memoryview is atomic (and a C walk runs whole), a writer stores a
new slot's key before its value (which makes it live), and a rebuilt segment
replaces the old one in one list assignment. Every mutating method must be
called under the owner's lock.

Code. The walks over the slots (single keys, and the loops of the batch
paths) are ``IndexBase``'s, in C or in ``_fallback_index`` (see ``_backend``);
this module sizes, rebuilds and batches around them.
"""

from __future__ import annotations

import ctypes
import random
from typing import Any

import numpy as np

from ._backend import IndexBase, SegmentBase
from ._fallback_index import (
    KEY_SIZE,
    MAX_LOAD,
    MIN_LOAD,
    MIN_SEGMENT_CAPACITY,
    MULT64,
    MULT128,
    NUM_SEGMENTS,
    SMALL_BATCH,
    decode_values,
)

__all__ = ["KEY_SIZE", "NUM_SEGMENTS", "HashIndex", "as_key_array", "hash_key", "next_prime"]

GROWTH = 1.3
# After a batch this big (32 B a key of temporaries, and the segments it outgrew),
# the freed heap goes back to the OS: a crawl's PendSet of 14M keys, built at open
# in one batch, left ~35 MB a million keys in the shard's RSS otherwise.
TRIM_BATCH = 1 << 18
# Headroom a segment keeps when one batch alone outgrows it (see set_many).
BATCH_GROWTH = 1.04
M64 = 0xFFFF_FFFF_FFFF_FFFF
_SEG_SHIFT = 60
_STATS_CHUNK = 1 << 16  # keys probed at once by stats()


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):  # deterministic below 3.3e24
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(n: int) -> int:
    n = max(n, MIN_SEGMENT_CAPACITY)
    while not _is_prime(n):
        n += 1
    return n


def release_freed_memory() -> None:
    """Hand the heap freed by an index build back to the OS (glibc keeps it otherwise).

    A build's temporaries are tens of MB; glibc raises its mmap threshold after
    freeing such blocks and then serves them from the heap, which it does not
    shrink on its own. Elsewhere this is a no-op. Public for embedders that free big
    temporaries of their own (arrays of keys, say) beside the store's.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def hash_key(key: bytes) -> int:
    """The reference hash (inlined by hand in the single-key paths)."""
    x = int.from_bytes(key, "little")
    v = ((x * MULT128) >> 64) & M64  # bits 64..127 of x * MULT128 mod 2**128
    v ^= v >> 32
    h = (v * MULT64) & M64
    return h ^ (h >> 29)


def as_key_array(keys: Any) -> np.ndarray:
    """Accept (n, 16) uint8, (n,) V16/S16 arrays or a sequence of 16-byte bytes."""
    if isinstance(keys, np.ndarray):
        if keys.dtype == np.uint8 and keys.ndim == 2 and keys.shape[1] == KEY_SIZE:
            return np.ascontiguousarray(keys)
        if keys.dtype.itemsize == KEY_SIZE and keys.ndim == 1 and keys.dtype.kind in "VS":
            return np.ascontiguousarray(keys).view(np.uint8).reshape(-1, KEY_SIZE)
        raise ValueError(
            f"keys array must be (n, 16) uint8 or (n,) V16/S16, got {keys.dtype} {keys.shape}"
        )
    keys = list(keys)
    for k in keys:
        if not isinstance(k, bytes | bytearray | memoryview) or len(k) != KEY_SIZE:
            raise ValueError(f"every key must be {KEY_SIZE} bytes, got {k!r:.60}")
    if not keys:
        return np.empty((0, KEY_SIZE), dtype=np.uint8)
    return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, KEY_SIZE)


class _Segment(SegmentBase):
    # The slots live in bytearrays: slicing one and comparing it with a bytes
    # key is the fastest single-key path Python has, and C walks them as
    # plain memory; numpy views of the same memory serve the batch paths.
    __slots__ = ()

    def __init__(self, cap: int, width: int) -> None:
        self.cap = cap
        self.kmv = bytearray(cap * KEY_SIZE)
        self.vmv = bytearray(cap * width)
        self.keys = np.frombuffer(self.kmv, dtype=np.uint8).reshape(cap, KEY_SIZE)
        self.vals = np.frombuffer(self.vmv, dtype=np.uint8).reshape(cap, width)
        self.vals.fill(0xFF)
        self.live = 0
        self.deleted = 0

    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.vals.nbytes)


class HashIndex(IndexBase):
    """16-byte key -> unsigned int of ``width`` bytes; see the module docstring.

    Inherited from ``IndexBase``: ``get``, ``in``, ``set``, ``delete`` and
    ``random_key`` (single keys) and the loops of the batch paths.
    """

    _segment: type[_Segment] = _Segment

    def __init__(self, width: int, capacity: int = 0) -> None:
        if not 1 <= width <= 8:
            raise ValueError("width must be 1..8 bytes")
        self.width = width
        self.max_value = (1 << (8 * width - 1)) - 1
        self._empty = b"\xff" * width
        self._deleted = b"\xfe" + b"\xff" * (width - 1)
        # Room for the hinted keys plus the random excess one segment may draw.
        per = capacity / NUM_SEGMENTS
        per_seg = int((per + 4 * per**0.5) / MAX_LOAD) + 1
        self._segs = [self._segment(next_prime(per_seg), width) for _ in range(NUM_SEGMENTS)]
        self._rng = random.Random()

    def __len__(self) -> int:
        return sum(s.live for s in self._segs)

    def _random_live_key(self) -> bytes:
        """random_key() among mostly deleted or empty slots: pick among the live ones."""
        segs = self._segs
        lives = [s.live for s in segs]
        seg = segs[self._rng.choices(range(len(segs)), weights=lives)[0]]
        slots = self._live_slots(seg)
        i = int(slots[self._rng.randrange(len(slots))])
        return bytes(seg.kmv[i * 16 : i * 16 + 16])

    def _live_slots(self, seg: _Segment) -> np.ndarray:
        """The slot numbers of a segment's live entries (a value's top byte below 0xFE)."""
        return np.flatnonzero(seg.vals[:, self.width - 1] < 0xFE)

    # -- batch paths (vectorized per segment) --------------------------------

    def hashes(self, keys: np.ndarray) -> np.ndarray:
        """``hash_key`` of every row of an (n, 16) uint8 array."""
        out = np.empty(len(keys), dtype=np.uint64)
        self._hash_keys(np.ascontiguousarray(keys), out)
        return out

    def lookup_many(
        self, keys: np.ndarray, count_probes: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return (values with -1 for absent, probes used) for an (n, 16) uint8 array."""
        n = len(keys)
        out = np.full(n, -1, dtype=np.int64)
        probes = np.zeros(n, dtype=np.int64)
        if n:
            self._lookup_into(np.ascontiguousarray(keys), out, probes if count_probes else None)
        return out, probes

    def set_many(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Insert/overwrite a batch in order (later duplicates win); a value of -1 deletes.
        ``keys`` is (n, 16) uint8, its rows may be strided (``_format.record_key_rows``).

        Caller holds the lock.
        """
        n = len(keys)
        if n == 0:
            return
        values = np.asarray(values, dtype=np.int64)
        if n < SMALL_BATCH:
            self._set_each(np.ascontiguousarray(keys), np.ascontiguousarray(values))
            return
        gkeys = np.empty((n, KEY_SIZE), dtype=np.uint8)
        ghash = np.empty(n, dtype=np.uint64)
        gvals = np.empty(n, dtype=np.int64)
        counts = np.zeros(NUM_SEGMENTS, dtype=np.int64)
        self._group_batch(keys, values, gkeys, ghash, gvals, counts)
        end = 0
        for s, count in enumerate(counts.tolist()):
            start, end = end, end + count
            if not count:
                continue
            seg = self._segs[s]
            if seg.live + seg.deleted + count > MAX_LOAD * seg.cap:
                seg = self._grow(s, seg.live + count)
            self._insert_segment(seg, gkeys[start:end], ghash[start:end], gvals[start:end])
            # Shrink only a segment that deletions emptied, never one still filling up.
            if seg.deleted and seg.live < MIN_LOAD * seg.cap and seg.cap > MIN_SEGMENT_CAPACITY:
                self._rebuild(s, seg.live)
        del gkeys, ghash, gvals
        if n >= TRIM_BATCH:
            release_freed_memory()

    def _grow(self, s: int, need: int) -> _Segment:
        """Rebuild segment ``s`` for ``need`` live keys: geometrically while it fills up,
        but to just what a big batch needs when it alone outgrows GROWTH, so a bulk
        load ends near MAX_LOAD (~29 bytes a key) rather than at MAX_LOAD / GROWTH (~37)."""
        live = self._segs[s].live
        growth = max(BATCH_GROWTH, min(GROWTH, live * GROWTH / need)) if need else GROWTH
        return self._rebuild(s, need, growth)

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more keys spread over the segments (a big batch that
        arrives in chunks), as one batch of that size would. Caller holds the lock."""
        per = extra / NUM_SEGMENTS
        for s, seg in enumerate(self._segs):
            if seg.live + seg.deleted + per > MAX_LOAD * seg.cap:
                # Room for this segment's share and the random excess it may draw.
                self._grow(s, seg.live + int(per + 4 * per**0.5) + 1)

    def _rebuild(self, s: int, live_hint: int, growth: float = GROWTH) -> _Segment:
        """Rebuild segment ``s`` (dropping deleted slots) sized for ``live_hint`` keys
        times ``growth`` at MAX_LOAD."""
        old = self._segs[s]
        cap = next_prime(int(max(live_hint, old.live) * growth / MAX_LOAD) + 1)
        new = self._segment(cap, self.width)
        self._rehash(old, new)
        self._segs[s] = new  # one assignment: lock-free readers see old or new, never half
        return new

    def fit(self, min_keys: int = 0) -> None:
        """After a bulk load: rebuild segments full of deleted slots, or left sparse
        (but keep room for ``min_keys`` keys, a caller's capacity hint)."""
        floor = min_keys / NUM_SEGMENTS
        for s, seg in enumerate(self._segs):
            want = max(seg.live, floor)
            sparse = want < 0.75 * (MAX_LOAD / GROWTH) * seg.cap and seg.cap > MIN_SEGMENT_CAPACITY
            if sparse or seg.deleted > 0.05 * seg.cap:
                self._rebuild(s, int(want))

    # -- whole-index views ----------------------------------------------------

    def items_arrays(
        self, lo: int | None = None, hi: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Snapshot of (keys (n,16) uint8, values int64) of every live entry, or of
        those with ``lo <= value <= hi``: filtered a segment at a time, so memory is
        one segment's values plus what is returned."""
        ks, vs = [], []
        for seg in list(self._segs):
            live = self._live_slots(seg)
            vals = decode_values(seg.vals[live])
            if lo is not None or hi is not None:
                keep = np.ones(len(vals), dtype=bool)
                if lo is not None:
                    keep &= vals >= lo
                if hi is not None:
                    keep &= vals <= hi
                live, vals = live[keep], vals[keep]
            ks.append(seg.keys[live])
            vs.append(vals)
        return np.concatenate(ks), np.concatenate(vs)

    def values_array(self) -> np.ndarray:
        """Snapshot of the values (int64) of every live entry, without their keys."""
        return np.concatenate([decode_values(seg.vals[self._live_slots(seg)])
                               for seg in list(self._segs)])

    def memory_bytes(self) -> int:
        return sum(s.nbytes() for s in self._segs)

    def stats(self) -> dict[str, float | int]:
        cap = sum(s.cap for s in self._segs)
        live = len(self)
        deleted = sum(s.deleted for s in self._segs)
        probes = 0
        for seg in list(self._segs):  # a segment at a time: memory is not a copy of the index
            slots = self._live_slots(seg)
            for j in range(0, len(slots), _STATS_CHUNK):
                keys = seg.keys[slots[j : j + _STATS_CHUNK]]
                probes += int(self.lookup_many(keys, count_probes=True)[1].sum())
        mean_probe = probes / live if live else 0.0
        return {
            "capacity": cap,
            "live": live,
            "deleted": deleted,
            "load_factor": (live + deleted) / cap,
            "max_load_factor": MAX_LOAD,
            "mean_probe_length": mean_probe,
            "memory_bytes": self.memory_bytes(),
        }
