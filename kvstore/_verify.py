"""Full check of a generation as it is on disk: every KEY record, and the torn tail.

Unlike an open, which stops at the first unsound record (point-in-time
recovery), this reads every KEY record in the file and checks the value
record it references, so damage is reported wherever it is, including in
the tail that an open would cut or leave out. It then asks the open's own
scan what a writable open would cut, so the two never disagree.

A keyed generation (format 3, see _format) is checked in step: KEY record i
stands for VAL record i, so each KEY record is held against the VAL record where
the one before ended (its kind, key and, for a put, offset), and every VAL record
is CRC-checked on the way. That catches a flipped offset that lands on another
intact record, a flipped key (the lost record and the phantom one), and a
tombstone whose key changed. After a damaged VAL record the walk finds its place
again at the next put whose own record is sound (deletion records are 24 bytes,
so the tombstones before it are placed backwards from it). KEY records missing
from the end are caught by the saved index's stamp: a clean close wrote down how
long both files were, and data files only grow.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field

import numpy as np

from . import _datafiles, _indexfile, _mend, _recovery
from . import _format as fmt
from ._backend import check_keyed_records
from ._open import OFFSET_WIDTH, files_now

_CHUNK = 1 << 16  # KEY records per step: their keys become Python bytes


@dataclass(frozen=True)
class Damage:
    """A KEY record whose value record is unsound: ``offset`` is the value's VAL
    offset as the record states it (-1 for a tombstone), ``key_offset`` the record's
    own KEY offset."""

    key: bytes
    offset: int
    reason: str
    key_offset: int | None = None


@dataclass(frozen=True)
class VerifyReport:
    """``records`` KEY records checked in files of ``key_file_bytes``/``val_file_bytes``;
    ``damages``: every unsound one; ``missing``: damage of the files as a whole (KEY
    records lost from the end); ``torn_tail``: what a writable open would cut."""

    records: int
    key_file_bytes: int
    val_file_bytes: int
    damages: list[Damage] = field(default_factory=list)
    torn_tail: _recovery.TornTail | None = None
    missing: list[str] = field(default_factory=list)
    format_version: int = fmt.FORMAT_VERSION
    values_damaged: bool = False  # some damage is in VAL records, not only in KEY
    mended: _mend.Mended | None = None  # what a writable open would rewrite from VAL

    @property
    def repairable(self) -> bool:
        """Damage that ``repair`` undoes: in the KEY file of a keyed store (format 3),
        whose VAL records are all sound."""
        keyed = self.format_version >= fmt.KEYED_VERSION
        return keyed and not self.ok and not self.values_damaged

    @property
    def ok(self) -> bool:
        """No damaged record, nothing missing, and no complete record that a writable
        open would cut (a partial KEY record or unreferenced VAL bytes are an
        interrupted append)."""
        cut = self.torn_tail is not None and self.torn_tail.key_records
        return not self.damages and not self.missing and not cut


def verify(
    files: _datafiles.DataFiles, *, tail_check_bytes: int, chunk_records: int = _CHUNK
) -> VerifyReport:
    """Check the headers and every KEY record up to the files' current sizes."""
    _datafiles.check_headers(files)
    key_size = os.fstat(files.key_fd).st_size
    val_size = os.fstat(files.val_fd).st_size  # after KEY: see load_records
    n = (key_size - fmt.HEADER_SIZE) // fmt.KEY_RECORD_SIZE
    values_damaged = True  # what a plain store's damage is (they name no keys)
    with mmap.mmap(files.val_fd, val_size, access=mmap.ACCESS_READ) as mm:
        if files.keyed:
            walk = _Walk(mm, val_size)
            damages = walk.run(files.key_fd, n, chunk_records)
            values_damaged = walk.values_damaged
        else:
            damages = _plain(files.key_fd, mm, n, val_size, chunk_records)
    missing = _missing(files, key_size, val_size)
    if _indexfile.trusted(files.directory, files.gen, OFFSET_WIDTH,
                          files_now(files, key_size, val_size)):
        # An open uses the index the clean close saved: it cuts and mends nothing.
        return VerifyReport(n, key_size, val_size, damages, None, missing, files.version,
                            values_damaged, None)
    chunk = _datafiles.CHUNK_RECORDS
    scan = _recovery.scan_tail(files, key_size, val_size, tail_check_bytes, chunk)
    return VerifyReport(
        n, key_size, val_size, damages, scan.tail, missing, files.version, values_damaged,
        scan.mend.summary() if scan.mend is not None else None,
    )



def _plain(fd: int, mm: mmap.mmap, n: int, val_size: int, chunk_records: int) -> list[Damage]:
    """Formats 1 and 2: each put's value record, by its offset, against the one before."""
    damages: list[Damage] = []
    prev_end = fmt.HEADER_SIZE
    for start, recs in _datafiles.iter_key_records(fd, 0, n, chunk_records, reuse=True):
        offs = recs["off"]
        puts = np.flatnonzero(offs != fmt.TOMBSTONE)
        keys = recs["key"][puts].tolist()
        for j, key, off in zip(puts.tolist(), keys, offs[puts].tolist(), strict=True):
            problem, end = fmt.check_val_record(mm, off, val_size, prev_end)
            if problem is None:
                prev_end = end
            else:
                damages.append(Damage(key, off, problem, _key_offset(start + j)))
    return damages


def _missing(files: _datafiles.DataFiles, key_size: int, val_size: int) -> list[str]:
    saved = _indexfile.saved_sizes(files.directory, files.gen)
    if saved is None:
        return []
    out = []
    for name, now, then, unit in (
        ("KEY", key_size, saved[0], fmt.KEY_RECORD_SIZE),
        ("VAL", val_size, saved[1], 1),
    ):
        if now < then:
            lost = (then - now) // unit if unit > 1 else then - now
            what = "KEY records" if unit > 1 else "bytes"
            out.append(
                f"the {name} file is {then - now} bytes shorter than at its last clean close "
                f"({lost} {what} lost from its end)"
            )
    return out


def _key_offset(index: int) -> int:
    return fmt.HEADER_SIZE + index * fmt.KEY_RECORD_SIZE


class _Walk:
    """The in-step check of a keyed generation (see the module docstring)."""

    def __init__(self, mm: mmap.mmap, size: int) -> None:
        self.mm, self.size = mm, size
        self.pos: int | None = fmt.HEADER_SIZE  # where the next VAL record lies; None: lost
        self.pending: list[tuple[int, bytes]] = []  # tombstones not placed yet (pos lost)
        self.damages: list[Damage] = []
        self.values_damaged = False  # a VAL record met was unsound, or the place was lost

    def run(self, fd: int, n: int, chunk_records: int) -> list[Damage]:
        for start, recs in _datafiles.iter_key_records(fd, 0, n, chunk_records, reuse=True):
            raw = recs.view(np.uint8).reshape(-1)
            j = 0
            while j < len(recs):
                if self.pos is not None:  # the fast path over sound records
                    passed, self.pos = check_keyed_records(
                        self.mm, raw[j * fmt.KEY_RECORD_SIZE :], self.size, self.pos
                    )
                    j += passed
                    if j == len(recs):
                        break
                self._step(start + j, recs["key"][j].tobytes(), int(recs["off"][j]))
                j += 1
        for index, key in self.pending:
            self._damage(index, key, fmt.TOMBSTONE, "its VAL record cannot be located "
                         "(the records around it are damaged)")
        return self.damages

    def _damage(self, index: int, key: bytes, off: int, reason: str) -> None:
        """Note a damaged KEY record (called before the place moves on from it)."""
        if self.pos is None or self._sound(self.pos) is None:
            self.values_damaged = True
        self.damages.append(Damage(key, off, reason, _key_offset(index)))

    def _sound(self, pos: int) -> int | None:
        """The end of the record at ``pos`` if it is intact (whoever it belongs to)."""
        found = _mend.sound_record(self.mm, pos, self.size)
        return None if found is None else found[2]

    def _intact_end(self, pos: int) -> int | None:
        """Where the record after the one at ``pos`` starts, or None if that cannot be
        told: the end of an intact record, else where its length field says it ends
        if a sound record starts there (damage in the value bytes only)."""
        end = self._sound(pos)
        if end is not None or pos + fmt.RECORD_HEADER_SIZE > self.size:
            return end
        end = fmt.keyed_record_end(self.mm, pos)
        return end if end == self.size or self._sound(end) is not None else None

    def _step(self, index: int, key: bytes, off: int) -> None:
        """One record that the fast path did not pass, or met while the place is lost."""
        pos = self.pos
        if off == fmt.TOMBSTONE:
            if pos is None:
                self.pending.append((index, key))
                return
            problem, end = fmt.check_keyed_record(self.mm, pos, self.size, key, off)
            if problem is None:
                self.pos = end
            else:
                self._damage(index, key, off, f"VAL record at {pos}: {problem}")
                self.pos = self._intact_end(pos)
            return
        own, own_end = fmt.check_keyed_record(self.mm, off, self.size, key, off)
        if self.pending:
            self._place_pending(own is None, off)
        if pos is not None and off != pos:
            # A sound record of its own key elsewhere (an older one): only the step shows it.
            why = own or f"offset {off} is not where its VAL record lies ({pos})"
            self._damage(index, key, off, why)
            self.pos = self._intact_end(pos)
            if self.pos is None and own is None:
                self.pos = own_end
        elif own is not None:
            self._damage(index, key, off, own)
            self.pos = None if pos is None else self._intact_end(pos)
        else:
            self.pos = own_end

    def _place_pending(self, anchored: bool, off: int) -> None:
        """Check the tombstones met while the place was lost: they lie just before the
        put at ``off`` (24 bytes each), if that put's own record is sound."""
        pending, self.pending = self.pending, []
        pos = off - fmt.RECORD_HEADER_SIZE * len(pending)
        for index, key in pending:
            if not anchored:
                self._damage(index, key, fmt.TOMBSTONE, "its VAL record cannot be located "
                             "(the records around it are damaged)")
                continue
            problem, _ = fmt.check_keyed_record(self.mm, pos, self.size, key, fmt.TOMBSTONE)
            if problem is not None:
                self._damage(index, key, fmt.TOMBSTONE, f"VAL record at {pos}: {problem}")
            pos += fmt.RECORD_HEADER_SIZE
        if anchored:
            self.pos = off
