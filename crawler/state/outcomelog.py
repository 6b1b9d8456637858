"""The outcome log: what selects a page record, apart from its body, for dry runs that
read no body (``retry --dry-run``, ``recrawl --dry-run``).

Theory of operation
-------------------
``outcomes.bin`` (beside ``main/``) is an append-only file of fixed 48-byte
records (crawler.state.recordlog), one for every page record the committer
puts in MainDB: its url_key, the first 8 bytes of its host's key, its HTTP
status, its reason and why its body was cut (as codes of ``VOCABULARY``), its
fetch time, and the MainDB *version* it describes (kvstore's generation and
record version, ``Store.versions_of``: known in memory once the record is put).
It is appended after MainDB's flush in the same commit, and fsynced with the
other stores.

A log record *stands* while MainDB's version of its key is still the one it
names. Checking that costs no disk read (``versions_of`` looks in the key
index), so a reader trusts only standing records, and nothing else needs to
keep the log exact: a record rewritten since, a record retry deleted, a
compaction (a new generation), a kill between MainDB's flush and the log's, a
writer that does not keep the log (reshard, a tool) all leave log records that
no longer stand, or live keys with none. The reader finds those keys (every
live key MainDB has minus the ones a standing record covered) and reads their
records' heads, as before the log existed. So the log makes a dry run fast, and
its absence or damage only makes it slow; a crawl made before the log reads
every head once, and a real retry or recrawl logs what it read
(crawler.state.retry), so the next dry run is fast.

A reason that is not in ``VOCABULARY`` (a newer crawler's) is coded UNKNOWN,
and its record is read too. Codes are written to disk: the vocabulary
(crawler.outcomes.LOGGED) is appended to, never reordered.

Not thread-safe: the committer's (writing) or one reader's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence

import numpy as np

import kvstore

from .. import outcomes
from ..exceptions import URLError
from ..web.urls import host_key, host_of
from .admission import keys_array
from .jsonfile import fsync_path
from .pages import PageRecord
from .recordlog import RecordLog, keys_of, read_chunks

__all__ = ["OUTCOMES_NAME", "UNKNOWN", "VOCABULARY", "OutcomeLog", "carry", "host_prefix",
           "standing"]

log = logging.getLogger(__name__)

OUTCOMES_NAME = "outcomes.bin"
# Beside it while a compaction runs: its standing rows (carry), the rewritten log (remap).
CARRY_SUFFIX, REMAP_SUFFIX = ".carry.tmp", ".remap.tmp"

# Every reason a record carries, and every reason a body was cut: code = position.
VOCABULARY: tuple[str, ...] = outcomes.LOGGED
CODE = {word: i for i, word in enumerate(VOCABULARY)}
UNKNOWN = 255  # a word not in VOCABULARY: the record is read instead

FACTS = np.dtype([
    ("host", "V8"),  # host_key(host)[:8]; zeros for a URL with no host
    ("generation", "<u4"),
    ("version", "<i8"),  # MainDB's record version this describes (kvstore versions_of)
    ("fetched", "<f8"),
    ("status", "<i2"),
    ("reason", "u1"),
    ("truncated", "u1"),
])
FIELD = "facts"
DTYPE = np.dtype([("key", "V16"), (FIELD, FACTS)])
assert DTYPE.itemsize == 48 and len(VOCABULARY) < UNKNOWN


def host_prefix(host: str) -> bytes:
    """The 8 bytes a log record keeps of a host: the first of its BadHosts key."""
    return host_key(host)[:8]


def _code(word: str) -> int:
    return CODE.get(word, UNKNOWN)


def facts_of(pages: Sequence[PageRecord], generation: int, versions: np.ndarray) -> np.ndarray:
    """The FACTS rows of ``pages`` (their heads: no body needed)."""
    rows = np.zeros(len(pages), dtype=FACTS)
    hosts = []
    for page in pages:
        try:
            hosts.append(host_prefix(host_of(page.url)))
        except URLError:
            hosts.append(bytes(8))
    rows["host"] = np.frombuffer(b"".join(hosts), dtype="V8")
    rows["generation"] = generation
    rows["version"] = versions
    rows["fetched"] = [p.fetched_at for p in pages]
    rows["status"] = [p.status if -1 < p.status < 32768 else -1 for p in pages]
    rows["reason"] = [_code(p.reason) for p in pages]
    rows["truncated"] = [_code(p.truncated) for p in pages]
    return rows


class OutcomeLog:
    """A shard's ``outcomes.bin``, written by the committer (or a real retry)."""

    def __init__(self, data_dir: str) -> None:
        self.log = RecordLog(os.path.join(data_dir, OUTCOMES_NAME), FIELD, FACTS)
        self._staged: list[np.ndarray] = []

    def discard_leftovers(self) -> None:
        """Remove what a compaction killed between its carry and its remap left beside
        the log (each file up to the log's size). For a writer's open, which holds the
        shard's lock: never between a carry and its remap."""
        for stale in (self.log.path + CARRY_SUFFIX, self.log.path + REMAP_SUFFIX):
            try:
                os.unlink(stale)
            except FileNotFoundError:
                continue
            log.info("%s: removed, left by a compaction that did not finish", stale)

    def note(self, main: kvstore.Store, keys: list[bytes], pages: Sequence[PageRecord | None]
             ) -> None:
        """Log the records of ``keys`` just put in MainDB (``pages``: their heads; None for
        one that would not decode, left to be read). Call after the put: the version is
        MainDB's in memory, and before the flush is fine (the log is written after it)."""
        kept = [(k, p) for k, p in zip(keys, pages, strict=True) if p is not None]
        if not kept:
            return
        generation, versions = main.versions_of(keys_array([k for k, _ in kept]))
        rows = np.zeros(len(kept), dtype=DTYPE)
        rows["key"] = np.frombuffer(b"".join(k for k, _ in kept), dtype="V16")
        rows[FIELD] = facts_of([p for _, p in kept], generation, versions)
        self._staged.append(rows)

    def write(self) -> None:
        """Append what ``note`` staged and flush it to the OS (raises OSError)."""
        staged, self._staged = self._staged, []
        for rows in staged:
            self.log.append(rows)

    def remap(self, main: kvstore.Store, carried: str, size: int) -> int:
        """After ``main``'s compaction (a new generation, new versions), rewrite the log:
        the ``carried`` rows (``carry``'s, standing before it) of keys not logged since
        ``size``, and the last row of each key logged since, each given its record's
        version now. Call with no commit in flight, so every record put has its row
        (the frontier's commit lock). Returns the rows kept; raises OSError (the log is
        then as it was: its rows stand for nothing, and records are read instead)."""
        path = self.log.path
        tail = [c for c in read_chunks(path, DTYPE, start=size)]
        since = np.concatenate(tail) if tail else np.zeros(0, dtype=DTYPE)
        _, last = np.unique(since["key"][::-1], return_index=True)
        since = since[::-1][last]  # a key's last row describes its record now
        logged = kvstore.KeySet()
        logged.add_many(keys_of(since))
        new, kept = path + REMAP_SUFFIX, 0
        with open(new, "wb") as f:
            for chunk in read_chunks(carried, DTYPE):
                if len(logged):
                    chunk = chunk[~logged.contains_many(keys_of(chunk))]
                rows = _renamed(main, chunk)
                f.write(rows.tobytes())
                kept += len(rows)
            rows = _renamed(main, since)
            f.write(rows.tobytes())
            kept += len(rows)
            f.flush()
            os.fsync(f.fileno())
        self.log.close()
        try:
            os.replace(new, path)
            fsync_path(os.path.dirname(path) or ".")
        finally:
            self.log = RecordLog(path, FIELD, FACTS)
        return kept

    def sync(self) -> None:
        self.log.sync()

    def close(self) -> None:
        self.log.close()

    def abandon(self) -> None:
        self.log.abandon()


def standing(data_dir: str, main: kvstore.Store, covered: kvstore.KeySet,
             size: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The standing records of a shard's outcome log (its first ``size`` bytes; None:
    all), a chunk at a time, as (keys as an (n, 16) uint8 array, FACTS rows): each live
    key of ``main`` at most once, added to ``covered`` as it is given. A record whose
    words are not all known is not given (the key stays uncovered: its record is read).
    Reads the log only."""
    path = os.path.join(data_dir, OUTCOMES_NAME)
    for chunk in read_chunks(path, DTYPE, size):
        keys = keys_of(chunk)
        facts = chunk[FIELD]
        generation, current = main.versions_of(keys)
        ok = (current >= 0) & (facts["version"] == current)
        ok &= facts["generation"] == generation
        ok &= (facts["reason"] != UNKNOWN) & (facts["truncated"] != UNKNOWN)
        if not ok.any():
            continue
        keys, facts = keys[ok], facts[ok]
        # A key logged twice for one version (a log written again after a kill): once.
        _, first = np.unique(np.ascontiguousarray(keys).view("V16").ravel(), return_index=True)
        keys, facts = keys[first], facts[first]
        fresh = ~covered.contains_many(keys)
        keys, facts = keys[fresh], facts[fresh]
        covered.add_many(keys)
        yield keys, facts


def uncovered(main: kvstore.Store, covered: kvstore.KeySet) -> np.ndarray:
    """The live keys of ``main`` not in ``covered`` (those no standing log row stood
    for), as an (n, 16) uint8 array in file order: reading their records is one sweep."""
    _, keys, versions = main.versions()
    missing = ~covered.contains_many(keys) if len(covered) else np.ones(len(keys), bool)
    order: np.ndarray = keys[missing][np.argsort(versions[missing], kind="stable")]
    return order


def carry(data_dir: str, main: kvstore.Store) -> tuple[str, int]:
    """Before a compaction of ``main``: the log's rows that stand now, copied to a file
    beside it, and the log's size when they were read (every row past it was logged
    later); for ``OutcomeLog.remap`` once the compaction is done. Raises OSError."""
    path = os.path.join(data_dir, OUTCOMES_NAME)
    size = os.path.getsize(path) if os.path.exists(path) else 0
    size -= size % DTYPE.itemsize
    carried = path + CARRY_SUFFIX
    with open(carried, "wb") as f:
        for keys, facts in standing(data_dir, main, kvstore.KeySet(), size):
            rows = np.zeros(len(keys), dtype=DTYPE)
            rows["key"] = np.frombuffer(keys.tobytes(), dtype="V16")
            rows[FIELD] = facts
            f.write(rows.tobytes())
    return carried, size


def _renamed(main: kvstore.Store, rows: np.ndarray) -> np.ndarray:
    """``rows`` given the version their key has in ``main`` now (live keys only)."""
    if not len(rows):
        return rows
    generation, versions = main.versions_of(keys_of(rows))
    live = versions >= 0
    out = rows[live].copy()
    out[FIELD]["generation"] = generation
    out[FIELD]["version"] = versions[live]
    return out


def words(facts: np.ndarray) -> tuple[np.ndarray, list[tuple[int, str, str]]]:
    """The distinct (status, reason, truncated) of ``facts`` rows and, for each row, the
    index of its own: a selection asks its question once per distinct outcome."""
    combo = (facts["status"].astype(np.int64) << 16) | (facts["reason"].astype(np.int64) << 8)
    combo |= facts["truncated"].astype(np.int64)
    distinct, which = np.unique(combo, return_inverse=True)
    out = [(int(c >> 16), VOCABULARY[(c >> 8) & 0xFF], VOCABULARY[c & 0xFF])
           for c in distinct.tolist()]
    return which.reshape(-1), out


def hosts_u64(prefixes: Sequence[bytes] | np.ndarray) -> np.ndarray:
    """Host prefixes (8 bytes each, or FACTS' ``host`` column) as uint64, to compare."""
    data = b"".join(prefixes) if isinstance(prefixes, (list, tuple)) else np.asarray(
        prefixes).tobytes()
    return np.frombuffer(data, dtype="<u8")
