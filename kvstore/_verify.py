"""Full check of a generation as it is on disk: every KEY record, and the torn tail.

Unlike an open, which stops at the first unsound record (point-in-time
recovery), this reads every KEY record in the file and checks the value
record it references, so damage is reported wherever it is, including in
the tail that an open would cut or leave out. It then asks the open's own
scan what a writable open would cut, so the two never disagree.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field

import numpy as np

from . import _files
from . import _format as fmt
from ._store import Damage

_CHUNK = 1 << 16  # KEY records per step: their keys become Python bytes


@dataclass(frozen=True)
class VerifyReport:
    """``records`` KEY records checked in files of ``key_file_bytes``/``val_file_bytes``;
    ``damages``: every unsound one; ``torn_tail``: what a writable open would cut."""

    records: int
    key_file_bytes: int
    val_file_bytes: int
    damages: list[Damage] = field(default_factory=list)
    torn_tail: _files.TornTail | None = None

    @property
    def ok(self) -> bool:
        """No damaged record, and no complete record that a writable open would cut
        (a partial KEY record or unreferenced VAL bytes are an interrupted append)."""
        return not self.damages and (self.torn_tail is None or not self.torn_tail.key_records)


def verify(
    files: _files.DataFiles, *, tail_check_bytes: int, chunk_records: int = _CHUNK
) -> VerifyReport:
    """Check the headers and every KEY record up to the files' current sizes."""
    _files.check_headers(files)
    key_size = os.fstat(files.key_fd).st_size
    val_size = os.fstat(files.val_fd).st_size  # after KEY: see load_records
    n = (key_size - fmt.HEADER_SIZE) // fmt.KEY_RECORD_SIZE
    damages: list[Damage] = []
    with mmap.mmap(files.val_fd, val_size, access=mmap.ACCESS_READ) as mm:
        prev_end = fmt.HEADER_SIZE
        for start, recs in _files.iter_key_records(
            files.key_fd, 0, n, chunk_records, reuse=True
        ):
            offs = recs["off"]
            puts = np.flatnonzero(offs != fmt.TOMBSTONE)
            keys = recs["key"][puts].tolist()
            for j, key, off in zip(puts.tolist(), keys, offs[puts].tolist(), strict=True):
                problem, end = fmt.check_val_record(mm, off, val_size, prev_end)
                if problem is None:
                    prev_end = end
                else:
                    koff = fmt.HEADER_SIZE + (start + j) * fmt.KEY_RECORD_SIZE
                    damages.append(Damage(key, off, problem, koff))
    scan = _files.scan_tail(files, key_size, val_size, tail_check_bytes, _files.CHUNK_RECORDS)
    return VerifyReport(n, key_size, val_size, damages, scan.tail)
