"""A store's counts and sizes (``Store.stats()``), read from its generation."""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import _format as fmt
from ._backend import BACKEND

if TYPE_CHECKING:
    from ._open import _Generation


@dataclass(frozen=True)
class StoreStats:
    generation: int
    records: int
    live_keys: int
    live_bytes: int
    dead_bytes: int
    key_file_bytes: int
    val_file_bytes: int
    index_capacity: int
    index_bytes: int
    load_factor: float
    mean_probe_length: float
    backend: str = BACKEND  # which hot paths run: "c" or "python" (kvstore.BACKEND)


def generation_stats(g: _Generation) -> StoreStats:
    """The stats of a flushed generation. The caller holds the store's lock."""
    live_bytes = int(_live_record_sizes(g).sum())
    istats = g.index.stats()
    val_end = g.wbuf[0]
    return StoreStats(
        generation=g.files.gen,
        records=(g.key_size - fmt.HEADER_SIZE) // fmt.KEY_RECORD_SIZE,
        live_keys=int(istats["live"]),
        live_bytes=live_bytes,
        dead_bytes=val_end - fmt.HEADER_SIZE - live_bytes,
        key_file_bytes=g.key_size,
        val_file_bytes=val_end,
        index_capacity=int(istats["capacity"]),
        index_bytes=int(istats["memory_bytes"]),
        load_factor=float(istats["load_factor"]),
        mean_probe_length=float(istats["mean_probe_length"]),
    )


# Bytes of the VAL file mapped at once while stats() reads the live records' lengths:
# a window at a time, so a scan of a big file never holds more than this of it in the
# RSS (a whole-file map held every page it touched until it closed: 0.7 GB at once for
# a 20M-page crawl's PendDB, every time the frontier asked whether to compact it).
WINDOW_BYTES = 32 << 20


def _live_record_sizes(g: _Generation) -> np.ndarray:
    """Sizes (header + value) of the live records, in file order, read from the VAL
    file through a moving window of ``WINDOW_BYTES`` mapped at a time."""
    offs = np.sort(g.index.values_array())
    if not len(offs):
        return np.zeros(0, dtype=np.int64)
    out = np.empty(len(offs), dtype=np.int64)
    end = g.wbuf[0]
    step = max(WINDOW_BYTES, 2 * mmap.ALLOCATIONGRANULARITY)
    i = 0
    while i < len(offs):
        base = int(offs[i]) - int(offs[i]) % mmap.ALLOCATIONGRANULARITY
        stop = min(base + step, end)
        # The records whose length field lies wholly inside the window: at least one,
        # since offs[i] is less than a granule past base and its record fits the file.
        j = int(np.searchsorted(offs, stop - fmt.LENGTH_SIZE, side="right"))
        with mmap.mmap(g.files.val_fd, stop - base, access=mmap.ACCESS_READ,
                       offset=base) as mm:
            data = np.frombuffer(mm, dtype=np.uint8)
            try:
                out[i:j] = fmt.record_lengths(data, offs[i:j] - base)
            finally:
                del data
        i = j
    return out + g.files.record_header_size
