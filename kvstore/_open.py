"""How a store's generation is loaded on open: from the index a clean close saved, or by
rebuilding the index from the KEY file (after a crash, or on any doubt).

Theory of operation
-------------------
``load`` first asks ``_indexfile`` for the saved index, which it trusts only when
its stamp matches the files exactly; then the files are what the clean close
left, and nothing is recovered. Otherwise ``_recovery.load_records`` finds the sound
part of the files (cutting a torn tail for a writer) and the index is built from
the kept KEY records one bounded chunk at a time, sized once for all of them.
"""

from __future__ import annotations

import os

from . import _datafiles, _indexfile, _recovery
from . import _format as fmt
from ._index import HashIndex, release_freed_memory

OFFSET_WIDTH = 6  # index bytes per offset: VAL files up to 128 TiB


class _Generation:
    """Everything that compaction replaces at once. ``keyed``: the VAL records' layout
    (see _format), which the C paths read here, per generation: a compaction from
    format 2 to 3 swaps it with the rest."""

    __slots__ = ("files", "index", "wbuf", "kbuf", "key_size", "keyed")

    def __init__(
        self, files: _datafiles.DataFiles, index: HashIndex, val_end: int, key_size: int
    ) -> None:
        self.files = files
        self.keyed = files.keyed
        self.index = index
        self.wbuf: tuple[int, bytearray] = (val_end, bytearray())
        self.kbuf = bytearray()
        self.key_size = key_size

    def val_end(self) -> int:
        base, buf = self.wbuf
        return base + len(buf)


def load(
    files: _datafiles.DataFiles,
    path: str,
    *,
    readonly: bool,
    capacity: int,
    tail_check_bytes: int,
    chunk_records: int,
) -> tuple[_Generation, _recovery.Recovery | None, str]:
    """(the generation, what the open left out or None, "saved" or "rebuilt")."""
    saved = _load_saved(files, path)
    if saved is not None:
        return saved, None, "saved"  # the files are exactly what a clean close left
    loaded = _recovery.load_records(
        files,
        readonly=readonly,
        tail_check_bytes=tail_check_bytes,
        chunk_records=chunk_records,
    )
    recovery = loaded.recovery
    val_end = loaded.val_end
    key_size = loaded.key_end
    index = HashIndex(OFFSET_WIDTH, capacity=max(capacity, loaded.records))
    for chunk in loaded.chunks():
        index.set_many(fmt.record_key_rows(chunk), chunk["off"])
        del chunk  # dropped before the next chunk is read into the same buffer
    index.fit(min_keys=capacity)
    del loaded
    release_freed_memory()
    files.remap(val_end)
    return _Generation(files, index, val_end, key_size), recovery, "rebuilt"


def files_now(files: _datafiles.DataFiles, key_size: int, val_size: int) -> _indexfile.FilesNow:
    """What a saved index's stamp is checked against: these files at these sizes (the
    open and verify ask the same question with it)."""
    return _indexfile.FilesNow(files.key_fd, key_size, files.val_fd, val_size, fmt.HEADER_SIZE,
                               files.keyed)


def _load_saved(files: _datafiles.DataFiles, path: str) -> _Generation | None:
    """The generation with the index a clean close saved, if it matches the files
    exactly (see _indexfile); None otherwise, and the caller rebuilds."""
    _datafiles.check_headers(files)
    key_size = os.fstat(files.key_fd).st_size
    val_size = os.fstat(files.val_fd).st_size
    index = _indexfile.load(path, files.gen, OFFSET_WIDTH, files_now(files, key_size, val_size))
    if index is None:
        return None
    files.remap(val_size)
    return _Generation(files, index, val_size, key_size)
