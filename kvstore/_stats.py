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


def _live_record_sizes(g: _Generation) -> np.ndarray:
    """Sizes (header + value) of the live records, read from the mapped VAL file."""
    _, offs = g.index.items_arrays()
    if not len(offs):
        return np.zeros(0, dtype=np.int64)
    # A map of its own, closed after: the store's own may not exist (map_values=False),
    # and a scan of every record should not leave the file's pages in the RSS.
    with mmap.mmap(g.files.val_fd, g.wbuf[0], access=mmap.ACCESS_READ) as mm:
        data = np.frombuffer(mm, dtype=np.uint8)
        try:
            return fmt.record_lengths(data, offs) + g.files.record_header_size
        finally:
            del data
