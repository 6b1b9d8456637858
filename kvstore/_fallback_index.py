"""The pure-Python walks over the index's slots: ``IndexBase`` and ``SegmentBase``, the
reference that ``_speedups.c`` mirrors and the fallback (see ``_fallback`` and
``_backend``), with the table's constants and the numpy helpers of the batch
paths (which have no twins).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import random

KEY_SIZE = 16
NUM_SEGMENTS = 16
MAX_LOAD = 0.78
# A segment whose live keys fall under this share of its slots is rebuilt smaller.
MIN_LOAD = 0.1
MIN_SEGMENT_CAPACITY = 127  # small sets with churn would otherwise rebuild constantly
# Reads past the mapped part of VAL use pread until this much is unmapped.
REMAP_SLACK = 8 << 20
# Below this many keys a batch goes through the single-key path: numpy's
# per-call overhead would cost more than it saves.
SMALL_BATCH = 1024  # measured crossover on a 2-core Xeon: ~1,000 keys
_TAIL = 64  # _lookup_into finishes chains of the last few keys one by one
_SEG_SHIFT = 60  # also written as a literal in the single-key paths
_STEP_SHIFT = 20  # also written as a literal in the single-key paths
MULT128 = 0x9E3779B97F4A7C15_F39CC0605CEDC835  # odd; the same literals appear inlined below
MULT64 = 0xBF58476D1CE4E5B9
_M64 = 0xFFFF_FFFF_FFFF_FFFF
_U64 = np.dtype("<u8")


def _randbelow(rng: random.Random, n: int) -> int:
    """``rng.randrange(n)`` as CPython computes it, spelled out so the C twin draws alike."""
    k = n.bit_length()
    r = rng.getrandbits(k)
    while r >= n:
        r = rng.getrandbits(k)
    return r


def _mulhi(a: np.ndarray, b: int) -> np.ndarray:
    """High 64 bits of the 128-bit products a * b (a uint64 array, b < 2**64)."""
    m32 = np.uint64(0xFFFF_FFFF)
    s32 = np.uint64(32)
    a_lo, a_hi = a & m32, a >> s32
    b_lo, b_hi = np.uint64(b & 0xFFFF_FFFF), np.uint64(b >> 32)
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = (ll >> s32) + (lh & m32) + (hl & m32)
    out: np.ndarray = hh + (lh >> s32) + (hl >> s32) + (mid >> s32)
    return out


class SegmentBase:
    """One open-addressing table: the arrays and counts (see ``_index``)."""

    __slots__ = ("cap", "keys", "vals", "kmv", "vmv", "live", "deleted")
    cap: int
    keys: np.ndarray
    vals: np.ndarray
    kmv: bytearray
    vmv: bytearray
    live: int
    deleted: int


class IndexBase:
    """The probing half of ``HashIndex``: every walk over the slots.

    The owner (``HashIndex``) provides ``_rebuild(s, live_hint)``,
    ``_random_live_key()``, ``_deleted`` (the DELETED slot value) and ``_rng``.
    """

    __slots__ = ("width", "_segs")
    width: int
    _segs: list[Any]
    _deleted: bytes
    _rng: random.Random

    if TYPE_CHECKING:

        def _rebuild(self, s: int, live_hint: int) -> Any: ...

        def _random_live_key(self) -> bytes: ...

    @staticmethod
    def _hash_keys(keys: np.ndarray, out: np.ndarray) -> None:
        """``out[j]`` = the hash of ``keys[j]`` (uint64 math wraps, as intended)."""
        halves = keys.view(_U64).reshape(-1, 2)
        lo, hi = halves[:, 0], halves[:, 1]
        c_lo, c_hi = MULT128 & _M64, MULT128 >> 64
        v: np.ndarray = _mulhi(lo, c_lo) + lo * np.uint64(c_hi) + hi * np.uint64(c_lo)
        v ^= v >> np.uint64(32)
        v *= np.uint64(MULT64)
        v ^= v >> np.uint64(29)
        out[:] = v

    @staticmethod
    def _group_batch(
        keys: np.ndarray,
        values: np.ndarray,
        gkeys: np.ndarray,
        ghash: np.ndarray,
        gvals: np.ndarray,
        counts: np.ndarray,
    ) -> int:
        """A batch made ready for ``_insert_segment``: the last occurrence of each key
        (key, hash, value), segment by segment and in batch order within a segment, at
        the front of ``gkeys``/``ghash``/``gvals``; ``counts[s]`` = the keys of segment
        ``s``. Returns how many keys are kept. ``keys`` is (n, 16) uint8 and ``values``
        int64, either of them strided by rows (the KEY records of an open)."""
        keys = np.ascontiguousarray(keys)
        values = np.ascontiguousarray(values, dtype=np.int64)
        n = len(keys)
        kw = keys.view(_U64).reshape(-1, 2)
        order = np.lexsort((np.arange(n), kw[:, 1], kw[:, 0]))  # by key, then position
        sk = kw[order]
        last = np.ones(n, dtype=bool)
        last[:-1] = (sk[1:, 0] != sk[:-1, 0]) | (sk[1:, 1] != sk[:-1, 1])
        keep = np.sort(order[last])
        del order, sk, last
        kept = keys[keep]
        h = np.empty(len(keep), dtype=np.uint64)
        IndexBase._hash_keys(kept, h)
        segid = (h >> np.uint64(_SEG_SHIFT)).astype(np.uint8)
        by_seg = np.argsort(segid, kind="stable")  # uint8 keys: a linear-time radix sort
        m = len(keep)
        gkeys[:m] = kept[by_seg]
        ghash[:m] = h[by_seg]
        gvals[:m] = values[keep[by_seg]]
        counts[:] = np.bincount(segid, minlength=NUM_SEGMENTS)
        return m

    # -- single keys -----------------------------------------------------------

    def get(self, key: bytes) -> int:
        """Return the key's value, or -1 if absent. Lock-free."""
        # hash_key() inlined, with literal constants: this is the hottest path.
        x = int.from_bytes(key, "little")
        h = ((x * 0x9E3779B97F4A7C15_F39CC0605CEDC835) >> 64) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 32
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 29
        seg = self._segs[h >> 60]
        cap, kmv, vmv, w = seg.cap, seg.kmv, seg.vmv, self.width
        i = h % cap
        step = 0  # computed on the first miss only: most lookups end at the first slot
        top = w - 1
        while True:
            b = i * w
            if vmv[b + top] >= 0xFE:
                if vmv[b] == 0xFF:
                    return -1
            elif kmv[i * 16 : i * 16 + 16] == key:
                raw = vmv[b : b + w]  # one copy: a racing delete cannot tear it
                if raw[top] >= 0xFE:
                    return -1
                return int.from_bytes(raw, "little")
            if not step:
                step = 1 + (h >> 20) % (cap - 1)
            i += step
            if i >= cap:
                i -= cap

    def __contains__(self, key: bytes) -> bool:
        """Lock-free; ``get`` without decoding the value."""
        x = int.from_bytes(key, "little")
        h = ((x * 0x9E3779B97F4A7C15_F39CC0605CEDC835) >> 64) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 32
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 29
        seg = self._segs[h >> 60]
        cap, kmv, vmv, w = seg.cap, seg.kmv, seg.vmv, self.width
        i = h % cap
        step = 0
        top = w - 1
        while True:
            if vmv[i * w + top] >= 0xFE:
                if vmv[i * w] == 0xFF:
                    return False
            elif kmv[i * 16 : i * 16 + 16] == key:
                return True
            if not step:
                step = 1 + (h >> 20) % (cap - 1)
            i += step
            if i >= cap:
                i -= cap

    def set(self, key: bytes, value: int) -> bool:
        """Insert or overwrite; return True if the key was new. Caller holds the lock."""
        w = self.width
        raw = value.to_bytes(w, "little")  # OverflowError before anything changes
        x = int.from_bytes(key, "little")
        h = ((x * 0x9E3779B97F4A7C15_F39CC0605CEDC835) >> 64) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 32
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 29
        s = h >> 60
        seg = self._segs[s]
        if seg.live + seg.deleted + 1 > MAX_LOAD * seg.cap:
            seg = self._rebuild(s, seg.live + 1)
        cap, kmv, vmv = seg.cap, seg.kmv, seg.vmv
        i = h % cap
        step = 0
        top = w - 1
        free = -1
        while True:
            b = i * w
            if vmv[b + top] >= 0xFE:
                if vmv[b] == 0xFF:
                    break
                if free < 0:
                    free = i
            elif kmv[i * 16 : i * 16 + 16] == key:
                vmv[b : b + w] = raw
                return False
            if not step:
                step = 1 + (h >> 20) % (cap - 1)
            i += step
            if i >= cap:
                i -= cap
        if free >= 0:
            i = free
            seg.deleted -= 1
        kmv[i * 16 : i * 16 + 16] = key  # key first: the value write makes the slot live
        vmv[i * w : i * w + w] = raw
        seg.live += 1
        return True

    def delete(self, key: bytes) -> int:
        """Remove the key; return its old value or -1 if absent. Caller holds the lock."""
        x = int.from_bytes(key, "little")
        h = ((x * 0x9E3779B97F4A7C15_F39CC0605CEDC835) >> 64) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 32
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 29
        s = h >> 60
        seg = self._segs[s]
        cap, kmv, vmv, w = seg.cap, seg.kmv, seg.vmv, self.width
        i = h % cap
        step = 0
        top = w - 1
        while True:
            b = i * w
            if vmv[b + top] >= 0xFE:
                if vmv[b] == 0xFF:
                    return -1
            elif kmv[i * 16 : i * 16 + 16] == key:
                old = int.from_bytes(vmv[b : b + w], "little")
                vmv[b : b + w] = self._deleted
                seg.live -= 1
                seg.deleted += 1
                if seg.live < MIN_LOAD * seg.cap and seg.cap > MIN_SEGMENT_CAPACITY:
                    self._rebuild(s, seg.live)
                return old
            if not step:
                step = 1 + (h >> 20) % (cap - 1)
            i += step
            if i >= cap:
                i -= cap

    def random_key(self) -> bytes:
        """A key drawn uniformly from the live keys; KeyError if empty. Caller holds the lock."""
        segs = self._segs
        if not any(s.live for s in segs):
            raise KeyError("random_key(): the index is empty")
        total = sum(s.cap for s in segs)
        w = self.width
        for _ in range(32):
            r = _randbelow(self._rng, total)
            for seg in segs:  # the segment holding slot r of all slots, in order
                if r < seg.cap:
                    break
                r -= seg.cap
            if seg.vmv[r * w + w - 1] < 0xFE:
                return bytes(seg.kmv[r * 16 : r * 16 + 16])
        return self._random_live_key()  # mostly deleted or empty slots

    # -- batches ------------------------------------------------------------------

    def _set_each(self, keys: np.ndarray, values: np.ndarray) -> None:
        """``set`` or (value < 0) ``delete`` each key in order. Caller holds the lock."""
        kb = keys.tobytes()
        for j in range(len(values)):
            k, v = kb[j * 16 : j * 16 + 16], int(values[j])
            if v < 0:
                self.delete(k)
            else:
                self.set(k, v)

    # The batch loops keep one compact array per property of the keys still
    # probing (position, step, key halves, batch index) and shrink them all
    # with one mask per round; slot state and keys are read with 1-D gathers.

    def _probe_start(self, h: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
        pos = (h % np.uint64(cap)).astype(np.int64)
        step = (np.uint64(1) + (h >> np.uint64(_STEP_SHIFT)) % np.uint64(cap - 1)).astype(np.int64)
        return pos, step

    def _lookup_into(self, keys: np.ndarray, out: np.ndarray, probes: np.ndarray | None) -> None:
        """``out[j]`` = the value of ``keys[j]`` (``out`` arrives full of -1, the absent
        value); ``probes[j]`` = the slots its probe visited, if ``probes`` is given."""
        n = len(keys)
        if n < SMALL_BATCH and probes is None:
            kb = keys.tobytes()
            for j in range(n):
                out[j] = self.get(kb[j * 16 : j * 16 + 16])
            return
        h = np.empty(n, dtype=np.uint64)
        self._hash_keys(keys, h)
        segid = (h >> np.uint64(_SEG_SHIFT)).astype(np.uint8)
        kw = keys.view(_U64).reshape(-1, 2)
        w, top = self.width, self.width - 1
        for s, idx in group_by_segment(segid):
            seg = self._segs[s]
            cap = seg.cap
            flat_vals = seg.vals.reshape(-1)
            flat_keys = seg.keys.view(_U64).reshape(-1)
            pos, step = self._probe_start(h[idx], cap)
            k0, k1 = kw[idx, 0], kw[idx, 1]
            rounds = 0
            while len(idx):
                if len(idx) < _TAIL and probes is None:
                    # A few keys left on long chains: numpy's per-call cost would dominate.
                    for j in idx.tolist():
                        out[j] = self.get(keys[j].tobytes())
                    break
                rounds += 1
                state = flat_vals[pos * w + top]
                live = state < 0xFE
                empty = ~live & (flat_vals[pos * w] == 0xFF)
                match = live & (flat_keys[2 * pos] == k0) & (flat_keys[2 * pos + 1] == k1)
                done = match | empty
                if probes is not None:
                    probes[idx[done]] = rounds
                if match.any():
                    out[idx[match]] = decode_values(seg.vals[pos[match]])
                go = ~done
                idx, pos, step, k0, k1 = idx[go], pos[go] + step[go], step[go], k0[go], k1[go]
                pos[pos >= cap] -= cap

    def _rehash(self, old: Any, new: Any) -> None:
        """Insert the live slots of segment ``old``, in slot order, into segment ``new``
        as ``_insert_segment`` inserts them (a rebuild). Caller holds the lock."""
        live = np.flatnonzero(old.vals[:, self.width - 1] < 0xFE)
        if len(live):
            keys = np.take(old.keys, live, axis=0)
            h = np.empty(len(keys), dtype=np.uint64)
            self._hash_keys(keys, h)
            self._insert_segment(new, keys, h, decode_values(old.vals[live]))

    def _insert_segment(
        self, seg: Any, keys: np.ndarray, h: np.ndarray, values: np.ndarray
    ) -> None:
        """Vectorized insert of *distinct* keys into one segment.

        A key takes the first EMPTY slot of its probe sequence, or its own slot
        if present (live or deleted). Keys are distinct, so only empty slots are
        contested: when several keys reach one in a round, the lowest batch
        position takes it and the others probe on. Deleted slots of other keys
        are not reused here (the single-key path reuses them), so no key can
        end up twice. A value < 0 leaves a DELETED slot. Work is proportional to
        the batch, never to the segment. Caller holds the lock.
        """
        m = len(keys)
        cap, w, top = seg.cap, self.width, self.width - 1
        flat_vals = seg.vals.reshape(-1)
        flat_keys = seg.keys.view(_U64).reshape(-1)
        encoded = values.astype("<i8").view(np.uint8).reshape(-1, 8)[:, :w]
        deleted_raw = np.frombuffer(self._deleted, dtype=np.uint8)
        kw = keys.view(_U64).reshape(-1, 2)
        pos, step = self._probe_start(h, cap)
        idx = np.arange(m, dtype=np.int64)
        k0, k1 = kw[:, 0].copy(), kw[:, 1].copy()
        while len(idx):
            state = flat_vals[pos * w + top]
            live = state < 0xFE
            empty = ~live & (flat_vals[pos * w] == 0xFF)
            same = ~empty & (flat_keys[2 * pos] == k0) & (flat_keys[2 * pos + 1] == k1)
            cand = np.flatnonzero(empty | same)
            taken = np.zeros(len(idx), dtype=bool)
            if len(cand):
                cp = pos[cand]
                order = np.argsort(cp, kind="stable")  # by slot, then batch position
                first = np.ones(len(cand), dtype=bool)
                first[1:] = cp[order[1:]] != cp[order[:-1]]
                win = cand[order[first]]  # one key per slot
                wp, wi = pos[win], idx[win]
                was_live, was_empty = live[win], empty[win]
                dele = values[wi] < 0
                seg.keys[wp] = keys[wi]  # keys before values: the value makes a slot live
                seg.vals[wp] = np.where(dele[:, None], deleted_raw[None, :], encoded[wi])
                n_dele = int(np.count_nonzero(dele))
                seg.live += len(wi) - n_dele - int(np.count_nonzero(was_live))
                seg.deleted += n_dele - int(np.count_nonzero(~was_empty & ~was_live))
                taken[win] = True
            # Losers of a contest stay on their slot for the next round (it is no longer
            # empty: they will move on then); keys that met other keys move on now.
            advance = ~taken & ~empty
            pos = np.where(advance, pos + step, pos)
            pos[pos >= cap] -= cap
            keep = ~taken
            idx, pos, step, k0, k1 = idx[keep], pos[keep], step[keep], k0[keep], k1[keep]


# -- numpy helpers of the batch paths (no C twins; _index uses them too) ---------------


def decode_values(raw: np.ndarray) -> np.ndarray:
    """(n, W) little-endian slot values -> int64."""
    padded = np.zeros((len(raw), 8), dtype=np.uint8)
    padded[:, : raw.shape[1]] = raw
    return padded.view("<i8").reshape(-1)


def group_by_segment(segid: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (segment, ascending indices of its keys) for each segment present."""
    order = np.argsort(segid, kind="stable")  # uint8 keys: a linear-time radix sort
    counts = np.bincount(segid, minlength=NUM_SEGMENTS)
    start = 0
    for s in range(NUM_SEGMENTS):
        c = int(counts[s])
        if c:
            yield s, order[start : start + c]
        start += c
