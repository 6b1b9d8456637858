"""KEY records mended from VAL on open: KEY damage that a keyed VAL file can undo.

Theory of operation
-------------------
In a keyed generation (format 3) KEY record i stands for VAL record i, and each
VAL record names its key and says whether it is a put or a deletion. So where
the open's in-step check finds a KEY record that disagrees with a *sound* VAL
record (a flipped key or offset bit), the VAL record says what the KEY record
was: the open rewrites it from VAL and goes on, instead of cutting it and every
record after it as a torn tail.

Past the last KEY record, each sound VAL record gets its KEY record from VAL
(a KEY file cut short, or a kill -9 between an append's VAL and KEY writes:
values are appended in order, so any prefix of them is a state the store
passed through). Where the VAL record itself is unsound, the walk looks for its place again at a
later put whose own record is sound (it lies where its KEY record says and
names its key): the records in between are damage in the middle, left in place
for ``verify`` to list and ``repair`` or a delete to settle; only when nothing
sound follows is it the torn tail of an interrupted write, which the open cuts.

The walk is ``check_keyed_records`` (C, or its Python twin) over chunks, with
Python only at the records it does not pass. A writer saves the KEY bytes it
rewrites in ``recovered/`` first, then writes the mended records in place; a
read-only open applies them to the records it indexes (``patch``).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import numpy as np

from . import _format as fmt
from ._backend import check_keyed_records
from ._datafiles import read_key_records

__all__ = ["Mended", "Walk", "record_reason", "sound_record", "walk"]

_RESYNC_LIMIT = 4096  # later puts tried as the place to go on from after an unsound record


@dataclass(frozen=True)
class Mended:
    """``records`` KEY records rewritten from their VAL records (the first at KEY
    offset ``key_offset``, ``reason``: why it disagreed), and ``kept_damaged`` records
    whose VAL record is unsound, left in place because sound records follow them."""

    records: int
    key_offset: int
    reason: str
    kept_damaged: int
    added: int = 0

    def describe(self) -> str:
        parts = []
        if self.records:
            parts.append(
                f"{self.records:,} KEY record{'s' if self.records != 1 else ''} rewritten "
                f"from VAL (first: {self.reason})"
            )
        if self.added:
            parts.append(
                f"{self.added:,} KEY record{'s' if self.added != 1 else ''} added for the sound "
                "VAL records past the KEY file's end"
            )
        if self.kept_damaged:
            parts.append(
                f"{self.kept_damaged:,} damaged record{'s' if self.kept_damaged != 1 else ''} "
                "left in place for verify and repair (sound records follow)"
            )
        return "; ".join(parts)


@dataclass
class Walk:
    """Where the walk stopped: ``valid`` KEY records are kept, VAL up to ``pos``;
    ``mends`` maps a KEY record's index to its record rebuilt from VAL; ``unindexed``:
    kept damaged records whose offset no index can hold (left out of the index);
    ``added``: KEY records for the sound VAL records past the last KEY record (a KEY
    file cut short: VAL still names them); ``reason``: why the first cut record is
    unsound ("" if none is cut)."""

    valid: int
    pos: int
    mends: dict[int, bytes] = field(default_factory=dict)
    added: bytearray = field(default_factory=bytearray)
    first_reason: str = ""
    kept_damaged: int = 0
    unindexed: set[int] = field(default_factory=set)
    reason: str = ""

    def summary(self) -> Mended | None:
        if not self.mends and not self.kept_damaged and not self.added:
            return None
        first = min(self.mends) if self.mends else -1
        return Mended(len(self.mends), _key_offset(first) if first >= 0 else -1,
                      self.first_reason, self.kept_damaged,
                      len(self.added) // fmt.KEY_RECORD_SIZE)

    def added_records(self) -> np.ndarray:
        return np.frombuffer(bytes(self.added), dtype=fmt.KEY_RECORD_DTYPE)


def walk(
    fd: int, mm: mmap.mmap, first: int, n: int, size: int, pos: int, chunk_records: int
) -> Walk:
    """Check KEY records ``first``..``n - 1`` against the VAL records from ``pos`` on,
    in step, mending what VAL can mend (see the module docstring). Each chunk of KEY
    records is read once, however many of its records need mending."""
    w = Walk(first, pos)
    chunk = _Chunk(fd, n, chunk_records)
    k = first
    while k < n:
        recs, j = chunk.at(k)
        passed, pos = check_keyed_records(mm, recs.view(np.uint8).reshape(-1)[
            j * fmt.KEY_RECORD_SIZE :], size, pos)
        k += passed
        if j + passed == len(recs):
            continue
        key, off = recs["key"][j + passed].tobytes(), int(recs["off"][j + passed])
        found = sound_record(mm, pos, size)
        if found is not None:  # KEY damage: the VAL record says what the KEY record was
            owner, vo, end = found
            if not w.mends:
                problem, _ = fmt.check_keyed_record(mm, pos, size, key, off)
                w.first_reason = record_reason(key, k, off, problem)
            w.mends[k] = owner + vo.to_bytes(8, "little", signed=True)
            k, pos = k + 1, end
            continue
        resumed = _resync(fd, mm, k + 1, n, size, pos)
        if resumed is None:  # nothing sound follows: the torn tail of a write
            problem, _ = fmt.check_keyed_record(mm, pos, size, key, off)
            w.reason = record_reason(key, k, off, problem)
            break
        for i in range(k, resumed):  # damage in the middle: kept for verify and repair
            o = chunk.offset(i)
            if o != fmt.TOMBSTONE and not fmt.HEADER_SIZE <= o <= size - fmt.RECORD_HEADER_SIZE:
                w.unindexed.add(i)
        w.kept_damaged += resumed - k
        k, pos = resumed, chunk.offset(resumed)
    if k == n and not w.reason:  # VAL names records the KEY file lacks: they are sound
        while (found := sound_record(mm, pos, size)) is not None:
            owner, vo, pos = found
            w.added += owner + vo.to_bytes(8, "little", signed=True)
    w.valid, w.pos = k, pos
    return w


class _Chunk:
    """The chunk of KEY records the walk is in, read again only when it leaves it."""

    def __init__(self, fd: int, n: int, chunk_records: int) -> None:
        self.fd, self.n, self.size = fd, n, chunk_records
        self.base, self.recs = 0, np.empty(0, dtype=fmt.KEY_RECORD_DTYPE)

    def at(self, k: int) -> tuple[np.ndarray, int]:
        """(the chunk holding record ``k``, ``k``'s place in it)."""
        if not self.base <= k < self.base + len(self.recs):
            self.base = k
            self.recs = read_key_records(self.fd, k, min(self.size, self.n - k))
        return self.recs, k - self.base

    def offset(self, k: int) -> int:
        recs, j = self.at(k)
        return int(recs["off"][j])


def patch(recs: np.ndarray, start: int, w: Walk) -> np.ndarray:
    """KEY records ``recs`` (from index ``start``) as the mended file holds them, without
    the records no index can hold: what the index is built from."""
    stop = start + len(recs)
    hits = [j for j in w.mends if start <= j < stop]
    if hits:
        raw = recs.view(np.uint8).reshape(-1, fmt.KEY_RECORD_SIZE)
        for j in hits:
            raw[j - start] = np.frombuffer(w.mends[j], dtype=np.uint8)
    drop = [j - start for j in w.unindexed if start <= j < stop]
    if drop:
        recs = np.delete(recs, drop)
    return recs


def sound_record(mm: mmap.mmap, pos: int, size: int) -> tuple[bytes, int, int] | None:
    """(its key, its KEY offset: ``pos`` or -1 for a deletion, its end) if an intact
    keyed record starts at ``pos``, else None."""
    if pos < fmt.HEADER_SIZE or pos + fmt.RECORD_HEADER_SIZE > size:
        return None
    owner = bytes(mm[pos + 8 : pos + fmt.RECORD_HEADER_SIZE])
    length = int.from_bytes(mm[pos : pos + fmt.LENGTH_SIZE], "little")
    off = fmt.TOMBSTONE if length == fmt.DELETED else pos
    problem, end = fmt.check_keyed_record(mm, pos, size, owner, off)
    return None if problem is not None else (owner, off, end)


def _resync(fd: int, mm: mmap.mmap, first: int, n: int, size: int, after: int) -> int | None:
    """The first put from KEY record ``first`` on (at most ``_RESYNC_LIMIT`` tried) whose
    own record lies past ``after``, sound and of its key; None if there is none."""
    tried = 0
    for start in range(first, n, 1 << 12):
        recs = read_key_records(fd, start, min(1 << 12, n - start))
        offs = recs["off"]
        for j in np.flatnonzero(offs > after).tolist():
            off = int(offs[j])
            key = recs["key"][j].tobytes()
            if off <= size - fmt.RECORD_HEADER_SIZE:
                problem, _ = fmt.check_keyed_record(mm, off, size, key, off)
                if problem is None:
                    return start + j
            tried += 1
            if tried >= _RESYNC_LIMIT:
                return None
    return None


def _key_offset(index: int) -> int:
    return fmt.HEADER_SIZE + index * fmt.KEY_RECORD_SIZE


def record_reason(key: bytes, index: int, off: int, problem: str | None) -> str:
    """What is wrong with KEY record ``index`` (``key``, ``off``), for a log line."""
    where = f"KEY record at offset {_key_offset(index)} (key {key.hex()})"
    return f"{where} -> VAL offset {off}: {problem}"
