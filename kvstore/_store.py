"""The store: a MutableMapping over one generation of KEY/VAL files and an index.

Theory of operation
-------------------
Writes go to two in-memory buffers under the store's lock: value records to
``wbuf`` and KEY records to ``kbuf``. ``flush()`` writes VAL's buffer, then
KEY's, with plain ``write()`` calls; from then on a kill -9 cannot lose them.
``sync()`` adds fsync.

Reads take no lock. ``wbuf`` is a ``(base, bytearray)`` pair replaced as a
whole at each flush, so a reader that found offset ``off`` in the index reads
the value from that bytearray when ``off >= base`` and from the file (an mmap,
or pread past the mapped length) otherwise. The current generation (files,
index, buffers) is one object swapped by compaction in one assignment.

Every value read is CRC-checked: a damaged record raises CorruptStoreError,
never returns wrong bytes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _datafiles, _indexfile, _open, _recovery
from . import _format as fmt
from ._backend import Lock, StoreBase
from ._compact import Compaction
from ._fallback import REMAP_SLACK, check_key
from ._index import as_key_array
from ._open import _Generation
from ._reader import read_prefix, read_value
from ._stats import StoreStats, generation_stats
from ._views import ItemsView, ValuesView
from .exceptions import (
    InvalidKeyError,
    ReadOnlyError,
    StoreClosedError,
    StoreNotFoundError,
    ValueTooLargeError,
)

if TYPE_CHECKING:
    from ._verify import Damage, VerifyReport

log = logging.getLogger(__name__)

DEFAULT_MAX_VALUE_SIZE = 64 << 20
DEFAULT_BUFFER_SIZE = 1 << 20
DEFAULT_TAIL_CHECK_BYTES = 1 << 20  # a kill -9 tears at most the last flush (~buffer_size)
# Reads past the mapped part of VAL use pread until this much is unmapped.
_REMAP_SLACK = REMAP_SLACK  # the C read path tests the same bound
# put_many works through big batches in chunks of this many records (bounded temporaries).
PUT_MANY_CHUNK = 1 << 16
_OPEN_CHUNK = 1 << 20  # KEY records indexed per batch on open


class Store(StoreBase, MutableMapping[bytes, bytes]):
    """An append-only key-value store; open it with ``kvstore.open()``.

    Every method is thread-safe. Lookups (``in``, ``[]``, ``get``,
    ``contains_many``) take no lock; writes are serialized by one lock.
    ``in``, ``[]``, ``get``, ``[k] = v`` and ``del`` come from ``StoreBase``
    (C, or its pure-Python twin: see ``_backend``).
    ``recovery`` says what the open left out (a torn tail), or is None.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        capacity: int | None = None,
        max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        tail_check_bytes: int = DEFAULT_TAIL_CHECK_BYTES,
        map_values: bool = True,
    ) -> None:
        if not 0 <= max_value_size <= fmt.MAX_VALUE_SIZE_LIMIT:
            raise ValueError(f"max_value_size must be 0..{fmt.MAX_VALUE_SIZE_LIMIT}")
        self.path = os.fspath(path)
        self.readonly = readonly
        self.max_value_size = max_value_size
        self._buffer_size = buffer_size
        self._tail_check_bytes = tail_check_bytes
        self.map_values = map_values
        # What the open left out of the store (a torn tail), or None: see _recovery.Recovery.
        self.recovery: _recovery.Recovery | None = None
        # How the open got its index: "saved" (read back from a clean close) or "rebuilt".
        self.index_source = "rebuilt"
        self._lock = Lock()
        self._writer_lock: _datafiles.WriterLock | None = None
        self._g: _Generation | None = None
        _datafiles.prepare_directory(self.path, readonly)
        if not readonly:
            self._writer_lock = _datafiles.acquire_lock(self.path)
        try:
            self._g = self._open_generation(capacity or 0, tail_check_bytes)
        except BaseException:
            self._release_lock()
            raise

    # -- opening ------------------------------------------------------------

    def _open_generation(self, capacity: int, tail_check_bytes: int) -> _Generation:
        for _attempt in range(10):  # a compaction may swap generations under a reader
            gen, leftovers = _datafiles.find_generation(self.path)
            if gen is None:
                if self.readonly:
                    raise StoreNotFoundError(2, "no store in this directory", self.path)
                gen = 1
                _datafiles.create_generation(self.path, gen)
            elif not self.readonly:
                for name in leftovers:
                    log.info("%s: removing %s left by an interrupted compaction", self.path, name)
                    os.remove(os.path.join(self.path, name))
            try:
                files = _datafiles.DataFiles(
                    self.path, gen, self.readonly, map_values=self.map_values
                )
            except FileNotFoundError:
                if self.readonly:
                    continue
                raise
            try:
                return self._load(files, capacity, tail_check_bytes)
            except BaseException:
                files.close()
                raise
        raise StoreNotFoundError(2, "store files keep changing under a read-only open", self.path)

    def _load(
        self, files: _datafiles.DataFiles, capacity: int, tail_check_bytes: int
    ) -> _Generation:
        g, self.recovery, self.index_source = _open.load(
            files,
            self.path,
            readonly=self.readonly,
            capacity=capacity,
            tail_check_bytes=tail_check_bytes,
            chunk_records=_OPEN_CHUNK,
        )
        return g

    # -- lifecycle ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._g is None

    def _live(self) -> _Generation:
        g = self._g
        if g is None:
            raise StoreClosedError(f"{self.path}: store is closed")
        return g

    def _writable(self) -> _Generation:
        g = self._live()
        if self.readonly:
            raise ReadOnlyError(f"{self.path}: store was opened with readonly=True")
        return g

    def close(self) -> None:
        """Flush, fsync and close. Idempotent. If the final flush fails (a full
        disk), the store stays open so that nothing buffered is lost."""
        with self._lock:
            g = self._g
            if g is None:
                return
            if not self.readonly:
                self._flush_locked(g)
                os.fsync(g.files.val_fd)
                os.fsync(g.files.key_fd)
                self._save_index(g)
            self._g = None
            g.files.close()
            self._release_lock()

    def _save_index(self, g: _Generation) -> None:
        """Write the index beside the KEY file, so the next open need not rebuild it.
        Best effort: a failure (a full disk) costs the next open a rebuild, nothing else."""
        try:
            _indexfile.save(
                self.path,
                g.files.gen,
                g.index,
                key_fd=g.files.key_fd,
                key_size=g.key_size,
                val_fd=g.files.val_fd,
                val_size=g.wbuf[0],
                header_size=fmt.HEADER_SIZE,
            )
        except OSError as exc:
            log.warning(
                "%s: could not save the index (%s); the next open rebuilds it", self.path, exc
            )

    def abandon(self) -> None:
        """Close *without* writing what is still buffered; the files keep exactly
        what earlier flushes wrote. For an embedder whose flush failed (a full
        disk) and who keeps several stores in a write order: writing the rest
        later, once space is back, could land one store's data without another's.
        Idempotent."""
        with self._lock:
            g = self._g
            if g is None:
                return
            self._g = None
            g.files.close()
            self._release_lock()

    def _release_lock(self) -> None:
        if self._writer_lock is not None:
            self._writer_lock.close()
            self._writer_lock = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if getattr(self, "_g", None) is not None:
                self.close()
        except Exception:  # noqa: BLE001 - nothing can be reported from a finalizer
            pass

    def __repr__(self) -> str:
        state = "closed" if self._g is None else f"{len(self)} keys"
        return f"<kvstore.Store {self.path!r} {state}{' readonly' if self.readonly else ''}>"

    # -- reads ------------------------------------------------------------------

    def _read(self, g: _Generation, off: int, key: bytes) -> bytes:
        """The slow path of a get (the C code and the pure twin call it): see _reader."""
        return read_value(g, off, key)

    def get_prefix(self, key: bytes, n: int) -> bytes:
        """The first ``min(n, len(value))`` bytes of ``key``'s value, in one read of about
        ``n`` bytes: for a reader that needs a value's head (a record's header), not all of
        it. KeyError if absent. The record is checked to be the key's own, as by a get,
        but its CRC covers the whole value, so it is checked only when ``n`` covers the
        whole value (then the result is exactly ``db[key]``); damage past ``n`` is not
        seen (``verify()`` or a get finds it). Lock-free."""
        if n < 0:
            raise ValueError(f"get_prefix: n must be >= 0, got {n}")
        key = check_key(key)
        g = self._live()
        off = g.index.get(key)
        if off < 0:
            raise KeyError(key)
        return read_prefix(g, off, key, n)

    def __len__(self) -> int:
        return len(self._live().index)

    def __iter__(self) -> Iterator[bytes]:
        """Iterate over a snapshot of the keys taken when iteration starts, in the order
        their records lie in the VAL file: a loop that reads each value reads the file
        front to back (the kernel's read-ahead then serves it), not at random."""
        with self._lock:
            keys, offsets = self._live().index.items_arrays()
        kb = keys[np.argsort(offsets, kind="stable")].tobytes()
        for j in range(0, len(kb), fmt.KEY_SIZE):
            yield kb[j : j + fmt.KEY_SIZE]

    def items(self) -> ItemsView:
        """(key, value) pairs of a snapshot of the keys; a key another thread deletes
        during the loop is skipped, never a KeyError. Thread-safe."""
        return ItemsView(self)

    def values(self) -> ValuesView:
        """The values of a snapshot of the keys, skipping keys deleted meanwhile."""
        return ValuesView(self)

    def popitem(self) -> tuple[bytes, bytes]:
        """Remove and return some (key, value); KeyError if empty. A key that another
        thread deletes first is passed over (so ``clear()`` does not stop early)."""
        for key in self:
            try:
                value = self[key]
                del self[key]
            except KeyError:
                continue
            return key, value
        raise KeyError("popitem(): the store is empty")

    def contains_many(self, keys: Any) -> np.ndarray:
        """Bool array: which of ``keys`` are present. Vectorized; no lock."""
        try:
            arr = as_key_array(keys)
        except ValueError as exc:
            raise InvalidKeyError(str(exc)) from None
        found, _ = self._live().index.lookup_many(arr)
        return found >= 0

    def versions(self) -> tuple[int, np.ndarray, np.ndarray]:
        """(generation, keys, versions): a snapshot of every live key ((n, 16) uint8) and
        its record's version (int64), in no order, without disk access. A key's version
        changes whenever its value is written again, and only then, within one
        generation; ``compact()`` starts a new generation (every version may change and
        a new one may equal an old one), so versions compare only under one generation.
        For readers that keep a copy of a store up to date (a search index)."""
        with self._lock:
            g = self._live()
            keys, offsets = g.index.items_arrays()
            return g.files.gen, keys, offsets

    def versions_of(self, keys: Any) -> tuple[int, np.ndarray]:
        """(generation, versions): the record version of each of ``keys`` (int64, -1 for
        an absent key), as :meth:`versions` gives it, without disk access. Vectorized.
        For a caller that notes a version beside its own copy of a value's facts and
        later checks the note still stands."""
        try:
            arr = as_key_array(keys)
        except ValueError as exc:
            raise InvalidKeyError(str(exc)) from None
        with self._lock:
            g = self._live()
            found, _ = g.index.lookup_many(arr)
            return g.files.gen, found

    def random_key(self) -> bytes:
        """A live key drawn uniformly at random, without disk access; KeyError if empty."""
        with self._lock:
            return self._live().index.random_key()

    # -- writes -------------------------------------------------------------------

    def _check_value(self, value: Any) -> bytes:
        if not isinstance(value, bytes):
            if not isinstance(value, bytearray | memoryview):
                raise TypeError(f"values are bytes, got {type(value).__name__}")
            value = bytes(value)
        if len(value) > self.max_value_size:
            raise ValueTooLargeError(len(value), self.max_value_size)
        return bytes(value)

    def put_many(self, keys: Any, values: Sequence[bytes] | Iterable[bytes]) -> None:
        """Store many records, vectorized; later duplicates win.

        A big batch is worked through in chunks of ``PUT_MANY_CHUNK`` records, so
        its temporaries stay bounded (RSS after a bulk load is the index, not a
        copy of the batch); every value is checked before anything is written,
        so a bad value anywhere writes nothing. Other writers may interleave
        between chunks; readers see a chunk's records once it is indexed.
        """
        try:
            arr = as_key_array(keys)
        except ValueError as exc:
            raise InvalidKeyError(str(exc)) from None
        vals = values if type(values) is list else list(values)
        if len(vals) != len(arr):
            raise ValueError(f"put_many: {len(arr)} keys but {len(vals)} values")
        if not vals:
            return
        n = len(vals)
        if n > PUT_MANY_CHUNK:
            vals = self._check_values(vals)  # raises on the first bad one
            with self._lock:
                g = self._writable()
                if n > len(g.index):  # a bulk load: size the index once, as for one batch
                    g.index.reserve(n)
        for start in range(0, n, PUT_MANY_CHUNK):
            chunk = vals if n <= PUT_MANY_CHUNK else vals[start : start + PUT_MANY_CHUNK]
            self._put_chunk(arr[start : start + len(chunk)], chunk)

    def _put_chunk(self, arr: np.ndarray, vals: list[bytes]) -> None:
        rel = np.empty(len(vals), dtype=np.int64)
        g = self._g
        keyed = g is None or g.keyed
        data = self._pack_values(arr, vals, rel, keyed)  # checks every value as a put does
        with self._lock:
            g = self._writable()
            if g.keyed is not keyed:  # a compaction rewrote the generation meanwhile
                data = self._pack_values(arr, vals, rel, g.keyed)
            base, buf = g.wbuf
            offs = rel + (base + len(buf))
            buf += data
            g.kbuf += fmt.key_records(arr, offs)
            g.index.set_many(arr, offs)
            if len(buf) + len(g.kbuf) >= self._buffer_size:
                self._flush_locked(g)

    def flush(self) -> None:
        """Hand every buffered write to the OS; it then survives a kill -9."""
        with self._lock:
            g = self._live()
            if not self.readonly:
                self._flush_locked(g)

    def sync(self) -> None:
        """flush(), then fsync both files: the writes then survive a power loss.

        The fsync runs outside the lock, on duplicates of the descriptors: it can
        take a second on a busy disk, and other threads' reads and writes must not
        wait for it (what they write meanwhile is simply left to the next sync)."""
        with self._lock:
            g = self._live()
            if self.readonly:
                return
            self._flush_locked(g)
            fds = [os.dup(g.files.val_fd)]  # a concurrent close() cannot pull these away
            try:
                fds.append(os.dup(g.files.key_fd))
            except OSError:
                os.close(fds[0])
                raise
        try:
            for fd in fds:  # VAL before KEY, as they were written
                os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)

    def _flush_locked(self, g: _Generation) -> None:
        # VAL before KEY: a KEY record must never reach the disk before its value.
        # Either both buffers land or the files are cut back to the last good flush,
        # keeping both buffers for a retry: values whose KEY records failed would be
        # garbage that the next open cuts into recovered/.
        base, buf = g.wbuf
        if buf:
            try:
                _datafiles.write_all(g.files.val_fd, buf)
            except OSError:
                os.ftruncate(g.files.val_fd, base)  # undo a partial write; the buffer is kept
                raise
        if g.kbuf:
            try:
                _datafiles.write_all(g.files.key_fd, g.kbuf)
            except OSError:
                os.ftruncate(g.files.key_fd, g.key_size)
                if buf:
                    os.ftruncate(g.files.val_fd, base)
                raise
            g.key_size += len(g.kbuf)
            g.kbuf = bytearray()
        if buf:
            g.wbuf = (base + len(buf), bytearray())  # readers now find these values in VAL

    # -- maintenance ------------------------------------------------------------------

    def compact(self) -> None:
        """Rewrite only live records into a new generation and drop the old one.

        Other threads keep reading and writing while it runs; they wait only for
        the final swap. A kill at any instant leaves a store that opens with
        every live record. The store holds its lock and swaps the generation;
        ``_compact`` does the file work (see there).
        """
        if self.readonly:
            raise ReadOnlyError(f"{self.path}: store was opened with readonly=True")
        with self._lock:
            g = self._writable()
            self._flush_locked(g)
            job = Compaction(self.path, g)
        try:
            for keys, offs in job.chunks():
                with self._lock:
                    self._same(g)
                    current, _ = g.index.lookup_many(keys)
                job.copy(keys, offs, live=(offs >= 0) & (current == offs))
            job.check_copied()
            with self._lock:
                self._same(g)
                self._flush_locked(g)
                job.replay_tail()
                job.check_complete(g.index)
                job.publish()
                try:
                    new = job.open_new()
                except BaseException:
                    # The new generation is the store on disk now; writing on into the
                    # old one would lose those writes at the next open.
                    self._g = None
                    g.files.close()
                    self._release_lock()
                    raise
                self._g = new
                job.remove_old()
        except BaseException:
            job.discard()
            raise
        finally:
            job.close()

    def _same(self, g: _Generation) -> None:
        if self._g is not g:
            raise StoreClosedError(f"{self.path}: store was closed during compaction")

    def stats(self) -> StoreStats:
        """Counts and sizes; flushes first so that the files are current."""
        with self._lock:
            g = self._live()
            if not self.readonly:
                self._flush_locked(g)
            return generation_stats(g)

    def index_stats(self) -> dict[str, float | int]:
        with self._lock:
            return self._live().index.stats()

    def verify(self) -> list[Damage]:
        """Every KEY record in the files on disk whose value record is unsound (CRC,
        offset, length, overlap), live or not, torn tail included; [] if none.
        Thread-safe. ``verify_report()`` also says what a writable open would cut."""
        return self.verify_report().damages

    def verify_report(self) -> VerifyReport:
        """Check the files as they are on disk (flushing first): every damaged record,
        and the torn tail a writable open would cut. Thread-safe."""
        from ._verify import verify

        with self._lock:
            g = self._live()
            if not self.readonly:
                self._flush_locked(g)
        return verify(g.files, tail_check_bytes=self._tail_check_bytes)
