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
write of a memoryview is atomic, a writer stores a new slot's key before its
value (which makes it live), and a rebuilt segment replaces the old one in one
list assignment. Every mutating method must be called under the owner's lock.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator
from typing import Any

import numpy as np

KEY_SIZE = 16
NUM_SEGMENTS = 16
_SEG_SHIFT = 60  # also written as a literal in the single-key paths
MAX_LOAD = 0.78
GROWTH = 1.3
# A segment whose live keys fall under this share of its slots is rebuilt smaller.
MIN_LOAD = 0.1
MIN_SEGMENT_CAPACITY = 127  # small sets with churn would otherwise rebuild constantly
MULT128 = 0x9E3779B97F4A7C15_F39CC0605CEDC835  # odd; the same literals appear inlined below
MULT64 = 0xBF58476D1CE4E5B9
M64 = 0xFFFF_FFFF_FFFF_FFFF
_STEP_SHIFT = 20  # also written as a literal in the single-key paths
# Below this many keys a batch goes through the single-key path: numpy's
# per-call overhead would cost more than it saves.
SMALL_BATCH = 1024  # measured crossover on a 2-core Xeon: ~1,000 keys
_TAIL = 64  # lookup_many finishes chains of the last few keys in Python

_U64 = np.dtype("<u8")


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


def hash_key(key: bytes) -> int:
    """The reference hash (inlined by hand in the single-key paths)."""
    x = int.from_bytes(key, "little")
    v = ((x * MULT128) >> 64) & M64  # bits 64..127 of x * MULT128 mod 2**128
    v ^= v >> 32
    h = (v * MULT64) & M64
    return h ^ (h >> 29)


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


def hash_keys(keys: np.ndarray) -> np.ndarray:
    """Vectorized ``hash_key`` over an (n, 16) uint8 array (uint64 math wraps, as intended)."""
    halves = keys.view(_U64).reshape(-1, 2)
    lo, hi = halves[:, 0], halves[:, 1]
    c_lo, c_hi = MULT128 & M64, MULT128 >> 64
    v: np.ndarray = _mulhi(lo, c_lo) + lo * np.uint64(c_hi) + hi * np.uint64(c_lo)
    v ^= v >> np.uint64(32)
    v *= np.uint64(MULT64)
    v ^= v >> np.uint64(29)
    return v


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


class _Segment:
    # The slots live in bytearrays: slicing one and comparing it with a bytes
    # key is the fastest single-key path Python has; numpy views of the same
    # memory serve the batch paths.
    __slots__ = ("cap", "keys", "vals", "kmv", "vmv", "live", "deleted")

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


class HashIndex:
    """16-byte key -> unsigned int of ``width`` bytes; see the module docstring."""

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
        self._segs = [_Segment(next_prime(per_seg), width) for _ in range(NUM_SEGMENTS)]
        self._rng = random.Random()

    # -- single-key paths (memoryviews, no numpy scalars) -------------------

    def __len__(self) -> int:
        return sum(s.live for s in self._segs)

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
        # hash_key() inlined, with literal constants: this is the hottest path.
        x = int.from_bytes(key, "little")
        h = ((x * 0x9E3779B97F4A7C15_F39CC0605CEDC835) >> 64) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 32
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
        h ^= h >> 29
        s = h >> 60
        seg = self._segs[s]
        if seg.live + seg.deleted + 1 > MAX_LOAD * seg.cap:
            seg = self._rebuild(s, seg.live + 1)
        cap, kmv, vmv, w = seg.cap, seg.kmv, seg.vmv, self.width
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
                vmv[b : b + w] = value.to_bytes(w, "little")
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
        vmv[i * w : i * w + w] = value.to_bytes(w, "little")
        seg.live += 1
        return True

    def delete(self, key: bytes) -> int:
        """Remove the key; return its old value or -1 if absent. Caller holds the lock."""
        # hash_key() inlined, with literal constants: this is the hottest path.
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
        caps = [s.cap for s in segs]
        bounds = list(np.cumsum(caps))
        total = bounds[-1]
        top = self.width - 1
        for _ in range(32):
            r = self._rng.randrange(total)
            si = bisect.bisect_right(bounds, r)
            seg = segs[si]
            i = r - (bounds[si] - caps[si])
            if seg.vmv[i * self.width + top] < 0xFE:
                return bytes(seg.kmv[i * 16 : i * 16 + 16])
        # Mostly deleted or empty slots: pick among the live ones directly.
        lives = [s.live for s in segs]
        seg = segs[self._rng.choices(range(len(segs)), weights=lives)[0]]
        slots = np.flatnonzero(seg.vals[:, top] < 0xFE)
        i = int(slots[self._rng.randrange(len(slots))])
        return bytes(seg.kmv[i * 16 : i * 16 + 16])

    # -- batch paths (vectorized per segment) --------------------------------

    def _probe_start(self, h: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
        pos = (h % np.uint64(cap)).astype(np.int64)
        step = (np.uint64(1) + (h >> np.uint64(_STEP_SHIFT)) % np.uint64(cap - 1)).astype(np.int64)
        return pos, step

    # The batch loops keep one compact array per property of the keys still
    # probing (position, step, key halves, batch index) and shrink them all
    # with one mask per round; slot state and keys are read with 1-D gathers.

    def lookup_many(
        self, keys: np.ndarray, count_probes: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return (values with -1 for absent, probes used) for an (n, 16) uint8 array."""
        n = len(keys)
        out = np.full(n, -1, dtype=np.int64)
        probes = np.zeros(n, dtype=np.int64)
        if n == 0:
            return out, probes
        if n < SMALL_BATCH and not count_probes:
            kb = keys.tobytes()
            for j in range(n):
                out[j] = self.get(kb[j * 16 : j * 16 + 16])
            return out, probes
        h = hash_keys(keys)
        segid = (h >> np.uint64(_SEG_SHIFT)).astype(np.uint8)
        kw = keys.view(_U64).reshape(-1, 2)
        w, top = self.width, self.width - 1
        for s, idx in _group(segid):
            seg = self._segs[s]
            cap = seg.cap
            flat_vals = seg.vals.reshape(-1)
            flat_keys = seg.keys.view(_U64).reshape(-1)
            pos, step = self._probe_start(h[idx], cap)
            k0, k1 = kw[idx, 0], kw[idx, 1]
            rounds = 0
            while len(idx):
                if len(idx) < _TAIL and not count_probes:
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
                if count_probes:
                    probes[idx[done]] = rounds
                if match.any():
                    out[idx[match]] = self._decode(seg.vals[pos[match]])
                go = ~done
                idx, pos, step, k0, k1 = idx[go], pos[go] + step[go], step[go], k0[go], k1[go]
                pos[pos >= cap] -= cap
        return out, probes

    def _decode(self, raw: np.ndarray) -> np.ndarray:
        padded = np.zeros((len(raw), 8), dtype=np.uint8)
        padded[:, : self.width] = raw
        return padded.view("<i8").reshape(-1)

    def _encode(self, values: np.ndarray) -> np.ndarray:
        return values.astype("<i8").view(np.uint8).reshape(-1, 8)[:, : self.width]

    def set_many(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Insert/overwrite a batch in order (later duplicates win); a value of -1 deletes.

        Caller holds the lock.
        """
        n = len(keys)
        if n == 0:
            return
        values = np.asarray(values, dtype=np.int64)
        if n < SMALL_BATCH:
            kb = keys.tobytes()
            for j in range(n):
                k, v = kb[j * 16 : j * 16 + 16], int(values[j])
                if v < 0:
                    self.delete(k)
                else:
                    self.set(k, v)
            return
        keys, values = _latest_of_each(keys, values)
        h = hash_keys(keys)
        segid = (h >> np.uint64(_SEG_SHIFT)).astype(np.uint8)
        for s, idx in _group(segid):
            seg = self._segs[s]
            if seg.live + seg.deleted + len(idx) > MAX_LOAD * seg.cap:
                seg = self._rebuild(s, seg.live + len(idx))
            self._insert_segment(seg, keys[idx], h[idx], values[idx])
            # Shrink only a segment that deletions emptied, never one still filling up.
            if seg.deleted and seg.live < MIN_LOAD * seg.cap and seg.cap > MIN_SEGMENT_CAPACITY:
                self._rebuild(s, seg.live)

    def _insert_segment(
        self, seg: _Segment, keys: np.ndarray, h: np.ndarray, values: np.ndarray
    ) -> None:
        """Vectorized insert of *distinct* keys into one segment.

        A key takes the first EMPTY slot of its probe sequence, or its own slot
        if present (live or deleted). Keys are distinct, so only empty slots are
        contested: when several keys reach one in a round, the lowest batch
        position takes it and the others probe on. Deleted slots of other keys
        are not reused here (the single-key path reuses them), so no key can
        end up twice. Work is proportional to the batch, never to the segment.
        """
        m = len(keys)
        cap, w, top = seg.cap, self.width, self.width - 1
        flat_vals = seg.vals.reshape(-1)
        flat_keys = seg.keys.view(_U64).reshape(-1)
        encoded = self._encode(np.maximum(values, 0))
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

    def _rebuild(self, s: int, live_hint: int) -> _Segment:
        """Rebuild segment ``s`` (dropping deleted slots) sized for ``live_hint`` keys."""
        old = self._segs[s]
        top = self.width - 1
        live = np.flatnonzero(old.vals[:, top] < 0xFE)
        cap = next_prime(int(max(live_hint, len(live)) * GROWTH / MAX_LOAD) + 1)
        new = _Segment(cap, self.width)
        keys = old.keys[live]
        if len(live):
            vals = self._decode(old.vals[live])
            self._insert_segment(new, keys, hash_keys(keys), vals)
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

    def items_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Snapshot of (keys (n,16) uint8, values int64) of every live entry."""
        ks, vs = [], []
        top = self.width - 1
        for seg in list(self._segs):
            live = np.flatnonzero(seg.vals[:, top] < 0xFE)
            ks.append(seg.keys[live])
            vs.append(self._decode(seg.vals[live]))
        return np.concatenate(ks), np.concatenate(vs)

    def iter_keys(self) -> Iterator[bytes]:
        keys, _ = self.items_arrays()
        kb = keys.tobytes()
        for j in range(0, len(kb), 16):
            yield kb[j : j + 16]

    def memory_bytes(self) -> int:
        return sum(s.nbytes() for s in self._segs)

    def stats(self) -> dict[str, float | int]:
        cap = sum(s.cap for s in self._segs)
        live = len(self)
        deleted = sum(s.deleted for s in self._segs)
        mean_probe = 0.0
        if live:
            keys, _ = self.items_arrays()
            _, probes = self.lookup_many(keys, count_probes=True)
            mean_probe = float(probes.mean())
        return {
            "capacity": cap,
            "live": live,
            "deleted": deleted,
            "load_factor": (live + deleted) / cap,
            "max_load_factor": MAX_LOAD,
            "mean_probe_length": mean_probe,
            "memory_bytes": self.memory_bytes(),
        }


def _latest_of_each(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The batch without earlier duplicates of a key (a later record wins), in order."""
    kw = keys.view(_U64).reshape(-1, 2)
    n = len(kw)
    order = np.lexsort((np.arange(n), kw[:, 1], kw[:, 0]))  # by key, then position
    sk = kw[order]
    last = np.ones(n, dtype=bool)
    last[:-1] = (sk[1:, 0] != sk[:-1, 0]) | (sk[1:, 1] != sk[:-1, 1])
    if last.all():
        return keys, values
    keep = np.sort(order[last])
    return keys[keep], values[keep]


def _group(segid: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (segment, ascending indices of its keys) for each segment present."""
    order = np.argsort(segid, kind="stable")  # uint8 keys: a linear-time radix sort
    counts = np.bincount(segid, minlength=NUM_SEGMENTS)
    start = 0
    for s in range(NUM_SEGMENTS):
        c = int(counts[s])
        if c:
            yield s, order[start : start + c]
        start += c
