"""Full CRC check of a generation: every value record the KEY file references."""

from __future__ import annotations

import mmap
import os
import zlib

import numpy as np

from . import _format as fmt
from ._files import DataFiles
from ._store import Damage

_CHUNK = 1 << 16


def verify(files: DataFiles, key_size: int, val_end: int) -> list[Damage]:
    """Return every damaged record (live or superseded) up to the given file sizes."""
    damages: list[Damage] = []
    n = (key_size - fmt.HEADER_SIZE) // fmt.KEY_RECORD_SIZE
    fd = os.open(files.val_path, os.O_RDONLY)  # our own map: independent of the store's
    try:
        mm = mmap.mmap(fd, val_end, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    with mm:
        prev_end = fmt.HEADER_SIZE
        for start in range(0, n, _CHUNK):
            recs = np.fromfile(
                files.key_path,
                dtype=fmt.KEY_RECORD_DTYPE,
                count=min(_CHUNK, n - start),
                offset=fmt.HEADER_SIZE + start * fmt.KEY_RECORD_SIZE,
            )
            for key, off in zip(recs["key"].tolist(), recs["off"].tolist(), strict=True):
                if off == fmt.TOMBSTONE:
                    continue
                if off < fmt.HEADER_SIZE or off + fmt.VAL_HEADER_SIZE > val_end:
                    damages.append(Damage(key, off, "offset outside the VAL file"))
                    continue
                length, crc = fmt.unpack_val_header(mm, off)
                end = off + fmt.VAL_HEADER_SIZE + length
                if end > val_end:
                    damages.append(
                        Damage(key, off, f"value length {length} runs past the end of the VAL file")
                    )
                elif zlib.crc32(mm[off + fmt.VAL_HEADER_SIZE : end]) != crc:
                    damages.append(Damage(key, off, "CRC mismatch"))
                elif off < prev_end:
                    damages.append(Damage(key, off, "record overlaps the previous one"))
                else:
                    prev_end = end
    return damages
