"""Repair: rebuild a keyed generation's KEY file from its VAL file.

Theory of operation
-------------------
In format 3 every VAL record names its key and a delete leaves a record too, so
VAL alone says everything KEY does: KEY record i is (key of VAL record i, its
offset, or -1 for a deletion). ``verify`` finds KEY damage by holding the two
against each other; ``repair`` fixes it by writing KEY again from VAL.

1. Take the writer lock (nobody else may have the store open), and walk VAL
   from its header, CRC-checking every record. A last record cut short by a
   crash (it runs past the end, or fails its CRC and ends exactly at the end) is
   a torn append and is cut; any other unsound record stops the repair before
   anything is written: a damaged *value* cannot be rebuilt from anywhere, and
   KEY records written from a VAL file we cannot trust could bless a wrong value.
2. Write the new KEY records to ``data-<gen>.key.tmp``, fsync; copy the old KEY
   file, and any VAL bytes cut, to ``recovered/`` (nothing is thrown away);
   rename the new KEY file into place; cut VAL; drop the saved index (it
   describes the old files); fsync the directory. A crash before the rename
   leaves the old store as it was (the ``.tmp`` is a leftover the next writer
   deletes); after it, the new KEY file is complete.

Every intact record in VAL is kept, including an append that a crash left without
its KEY records: repair is run on purpose, after ``verify`` found damage, and then
keeping every record that is provably whole loses the least.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from dataclasses import dataclass

import numpy as np

from . import _datafiles, _recovery
from . import _format as fmt
from ._indexfile import index_path
from .exceptions import CorruptStoreError, StoreNotFoundError

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class RepairReport:
    """``records`` KEY records written; of the old ones, ``changed`` differed at the
    same place, ``dropped`` were past the new end, ``added`` records are new at the end;
    ``val_bytes_cut`` bytes of a torn last VAL record were cut; ``saved``: the files in
    recovered/ that keep the old KEY file and the cut bytes."""

    records: int
    changed: int
    added: int
    dropped: int
    val_bytes_cut: int
    saved: tuple[str, ...]

    @property
    def unchanged(self) -> bool:
        return not (self.changed or self.added or self.dropped or self.val_bytes_cut)


def repair(path: str) -> RepairReport:
    """Rewrite the KEY file of the store in ``path`` from its VAL file (see the module
    docstring). Raises StoreLockedError if the store is open elsewhere,
    CorruptStoreError if a VAL record other than a torn last one is damaged (nothing
    is changed then), and CorruptStoreError for a format 1 or 2 store, whose VAL
    records do not name their keys."""
    path = os.fspath(path)
    _datafiles.prepare_directory(path, readonly=True)
    lock = _datafiles.acquire_lock(path)
    try:
        gen, _ = _datafiles.find_generation(path)
        if gen is None:
            raise StoreNotFoundError(2, "no store in this directory", path)
        files = _datafiles.DataFiles(path, gen, readonly=False)
        try:
            # Only VAL's header counts: the KEY file, header included, is written anew.
            head = os.pread(files.val_fd, fmt.HEADER_SIZE, 0)
            vgen, files.version = fmt.unpack_header_version(head, fmt.VAL_MAGIC, files.val_path)
            if vgen != gen:
                raise CorruptStoreError(
                    files.val_path, 16, f"generation mismatch: file name says {gen}, header {vgen}"
                )
            if not files.keyed:
                raise CorruptStoreError(
                    files.val_path, 8,
                    f"format {files.version}: its VAL records do not name their keys, so the "
                    "KEY file cannot be rebuilt from them (a sound store moves to format 3 "
                    "with python -m kvstore compact)",
                )
            return _rebuild(files)
        finally:
            files.close()
    finally:
        lock.close()


def _rebuild(files: _datafiles.DataFiles) -> RepairReport:
    val_size = os.fstat(files.val_fd).st_size
    key_size = os.fstat(files.key_fd).st_size
    with mmap.mmap(files.val_fd, val_size, access=mmap.ACCESS_READ) as mm:
        records, end = _walk(mm, val_size, files.val_path)
    new = np.frombuffer(bytes(records), dtype=fmt.KEY_RECORD_DTYPE)
    old_n = max(0, (key_size - fmt.HEADER_SIZE) // fmt.KEY_RECORD_SIZE)
    old = _datafiles.read_key_records(files.key_fd, 0, old_n)
    both = min(len(old), len(new))
    changed = int(np.count_nonzero(old[:both] != new[:both]))
    report_args = (len(new), changed, len(new) - both, len(old) - both, val_size - end)
    header = os.pread(files.key_fd, fmt.HEADER_SIZE, 0)
    whole = key_size == fmt.HEADER_SIZE + old_n * fmt.KEY_RECORD_SIZE
    if not any(report_args[1:]) and whole and header == fmt.pack_header(fmt.KEY_MAGIC, files.gen):
        return RepairReport(*report_args, saved=())
    saved = _replace_key_file(files, records, key_size, val_size, end)
    report = RepairReport(*report_args, saved=saved)
    log.warning(
        "%s: repair rebuilt the KEY file from VAL: %d records, %d changed, %d added, %d "
        "dropped, %d torn VAL bytes cut; the old files are kept in %s",
        files.directory, report.records, report.changed, report.added, report.dropped,
        report.val_bytes_cut, ", ".join(saved),
    )
    return report


def _walk(mm: mmap.mmap, size: int, val_path: str) -> tuple[bytearray, int]:
    """KEY records for every intact VAL record, and where the last one ends."""
    records = bytearray()
    pos = fmt.HEADER_SIZE
    while pos + fmt.RECORD_HEADER_SIZE <= size:
        end = fmt.keyed_record_end(mm, pos)
        if end > size:
            break  # a torn last record
        key = bytes(mm[pos + 8 : pos + fmt.RECORD_HEADER_SIZE])
        deleted = int.from_bytes(mm[pos : pos + 4], "little") == fmt.DELETED
        off = fmt.TOMBSTONE if deleted else pos
        problem, _ = fmt.check_keyed_record(mm, pos, size, key, off)
        if problem is not None:
            if end == size:
                break  # the last record, torn inside its bytes
            raise CorruptStoreError(
                val_path, pos,
                f"VAL record: {problem}; its value cannot be rebuilt, so repair changed "
                "nothing (restore the store from a backup, or dump what still reads and "
                "load it into a new store)",
            )
        records += fmt.pack_key_record(key, off)
        pos = end
    return records, pos


def _replace_key_file(
    files: _datafiles.DataFiles, records: bytearray, key_size: int, val_size: int, val_end: int
) -> tuple[str, ...]:
    rdir = os.path.join(files.directory, _recovery.RECOVERED_DIR)
    os.makedirs(rdir, exist_ok=True)
    stamp = _recovery.recovered_stamp()
    old_key = os.path.join(rdir, f"gen{files.gen:06d}-{stamp}-repair.key")
    _recovery.save_range(files.key_fd, 0, key_size, old_key)
    saved = [old_key]
    if val_end < val_size:
        out = os.path.join(rdir, f"gen{files.gen:06d}-{stamp}-at{val_end}.val")
        _recovery.save_range(files.val_fd, val_end, val_size, out)
        saved.append(out)
    _datafiles.fsync_dir(rdir)
    tmp = files.key_path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _datafiles.write_all(fd, fmt.pack_header(fmt.KEY_MAGIC, files.gen))
        _datafiles.write_all(fd, records)
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):  # stale: it describes the old files
        os.remove(index_path(files.directory, files.gen))
    os.rename(tmp, files.key_path)
    if val_end < val_size:
        os.ftruncate(files.val_fd, val_end)
        os.fsync(files.val_fd)
    _datafiles.fsync_dir(files.directory)
    return tuple(saved)
