"""Compacting a shard's MainDB and PendDB when asked: offline, or by the running crawl.

Theory of operation
-------------------
MainDB only grows: a revisit or a rewrite at a smaller depth leaves the old
record dead, and ``retry`` leaves tombstones. Nothing compacts it by itself:
knowing how much of it is dead costs a read of every live record's header
(kvstore's ``stats()``: at 20M pages, 10M scattered reads a shard), too much for
a rule checked every few seconds. ``crawler compact DIR`` asks instead.

- A shard no run holds is compacted by the command itself (``compact_shard``),
  under each store's write lock; its counters, if they were current, are
  stamped again (the counts do not change, the files do).
- A running shard is asked through a file: the command writes
  ``compact.request`` in the shard's directory, the frontier's upkeep (on its
  syncer's thread, crawler.state.syncer) sees it at its next fsync, compacts
  both stores while the committer goes on writing (kvstore allows it), writes
  ``compact.result`` and removes the request. A request the run did not reach
  (it stopped first) is done by the next run, or by the command once no run
  holds the shard.

A compaction starts a new MainDB generation, whose record versions the outcome
log's rows (crawler.state.outcomelog) do not name: the rows that stood before
it are copied aside first (``carry``, beside the crawl), and once it is done the
log is rewritten with each row's new version (``OutcomeLog.remap``, with no
commit in flight: the frontier's commit lock), so dry runs and the counters'
recount stay fast. If that fails, the log stands for nothing and records are
read instead, as before the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from contextlib import AbstractContextManager
from typing import Any

import kvstore

from ..exceptions import DataDirError
from .jsonfile import read_json, write_json
from .outcomelog import OutcomeLog, carry
from .tally import load_counts, shard_stamp, write_counts

__all__ = ["REQUEST_NAME", "RESULT_NAME", "answer", "asked", "compact_shard",
           "compact_stores", "read_result", "request"]

log = logging.getLogger(__name__)

REQUEST_NAME = "compact.request"
RESULT_NAME = "compact.result"


def request(shard: str) -> None:
    """Ask the run holding ``shard`` to compact its stores (durably: a run that stops
    before it gets there leaves the request to the next); any older result goes."""
    try:
        os.unlink(os.path.join(shard, RESULT_NAME))
    except FileNotFoundError:
        pass
    write_json(os.path.join(shard, REQUEST_NAME), {"asked": time.time()})


def asked(shard: str) -> bool:
    """Whether a compaction of ``shard`` was asked and not done yet."""
    return os.path.exists(os.path.join(shard, REQUEST_NAME))


def _files(store: kvstore.Store) -> int:
    found = kvstore.stamp(store.path)
    return found[1] + found[2] if found is not None else 0


def compact_stores(shard: str, main: kvstore.Store, pend: kvstore.Store,
                   outcomes: OutcomeLog, quiet: AbstractContextManager[Any]) -> dict[str, Any]:
    """Compact MainDB, then PendDB; what each took (bytes of their files before and
    after, seconds), or the error that stopped it (a full disk: the store as it was).
    The outcome log is carried over MainDB's new generation (``outcomelog.carry`` and
    ``OutcomeLog.remap``), its rewrite done inside ``quiet``: no commit in flight."""
    result: dict[str, Any] = {"done": time.time()}
    for name, store in (("main", main), ("pend", pend)):
        before, started = _files(store), time.monotonic()
        carried: tuple[str, int] | None = None
        try:
            if store is main:
                carried = carry(shard, main)
            store.compact()
        except (OSError, kvstore.exceptions.KVStoreError) as exc:  # a full disk, damage
            log.warning("%s: %s not compacted: %s", shard, name, exc)
            result["error"] = f"{name}: {exc}"
            if carried is not None:
                _unlink(carried[0])
            break
        if carried is not None:
            try:
                with quiet:
                    result["outcome_rows"] = outcomes.remap(main, *carried)
            except OSError as exc:
                log.warning("%s: the outcome log was not carried over the compaction (%s): "
                            "dry runs read every record until a real retry or recrawl "
                            "logs them", shard, exc)
            finally:
                _unlink(carried[0])
        result[name] = {"before": before, "after": _files(store),
                        "seconds": round(time.monotonic() - started, 2)}
        log.info("%s: %s compacted: %d -> %d bytes in %.1f s", shard, name, before,
                 result[name]["after"], result[name]["seconds"])
    return result


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def answer(shard: str, result: dict[str, Any]) -> None:
    """Write the result of an asked compaction and take the request away."""
    write_json(os.path.join(shard, RESULT_NAME), result)
    try:
        os.unlink(os.path.join(shard, REQUEST_NAME))
    except FileNotFoundError:
        pass


def read_result(shard: str) -> dict[str, Any] | None:
    """The last asked compaction's result (None: none yet). DataDirError if damaged."""
    try:
        doc = read_json(os.path.join(shard, RESULT_NAME), "a compaction result")
    except FileNotFoundError:
        return None
    if not isinstance(doc, dict):
        raise DataDirError(f"{os.path.join(shard, RESULT_NAME)}: not a compaction result")
    return doc


def compact_shard(shard: str) -> dict[str, Any]:
    """Compact the stores of a shard no run holds; its counters stay current if they
    were. Raises kvstore's StoreLockedError when a run holds it after all."""
    tally, _, _, why = load_counts(shard)
    with kvstore.open(os.path.join(shard, "main")) as main, \
            kvstore.open(os.path.join(shard, "pend")) as pend:
        outcomes = OutcomeLog(shard)
        outcomes.discard_leftovers()
        try:
            result = compact_stores(shard, main, pend, outcomes, contextlib.nullcontext())
        finally:
            outcomes.close()
    if tally is not None and not why:
        write_counts(shard, tally, shard_stamp(shard))
    if asked(shard):
        answer(shard, result)
    return result
