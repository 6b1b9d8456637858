"""Changing a crawl's shard count offline (``crawler reshard DIR --shards N``): build, commit, swap.

Theory of operation
-------------------
Three phases; a kill -9 at any instant, then the same command again, ends in
the state an uninterrupted run leaves.

1. **Build.** The old shards are opened for writing (their locks keep any
   crawl out; the CLI also holds ``supervisor.lock``) and only read. The new
   shards are written from nothing in ``DIR/.reshard-tmp/shard-NN/``
   (crawler.state.reshardmove), then fsynced, files and directories, counters
   included. ``PLAN.json`` there names the target count. A rerun that finds
   the work directory without a commit mark deletes it and builds again:
   the old shards were never touched.
2. **Commit point.** ``DIR/.reshard-tmp/COMMIT.json`` (old count, new count,
   the new Ray placement if any), written to a temporary name, fsynced,
   renamed, the directory fsynced. From here on the new layout is the crawl.
3. **Swap** (rolled forward by every rerun that finds the mark): the old
   shard directories (N > 1) or the shard's entries at the top of ``DIR``
   (N == 1, the legacy layout: ``main/``, ``pend/``...) are renamed into
   ``DIR/.reshard-old/``, each new one renamed into its place (for a new
   count of 1, the entries of ``shard-00`` into ``DIR`` itself), derived data
   (``rank/``; a shard's ``search/`` goes with its old directory) and the
   stale ``status.json`` set aside too; then ``shards.json`` (and
   ``ray.json``) are replaced atomically, ``.reshard-old`` is deleted, and the
   mark and the work directory last. Every step is a rename that a rerun
   skips when it finds it done (its source gone), so the swap is idempotent.

While ``.reshard-tmp`` exists every other command refuses the crawl in one
line (crawler.state.shards.read_count): before the commit the old layout is
intact but a rerun will delete the work; after it the layout is half swapped.

Settings, seeds and everything else at the top of ``DIR`` stay as they are.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
from dataclasses import dataclass, field
from typing import Any

from ..config import MAX_SHARDS
from ..exceptions import DataDirError, UsageError
from .jsonfile import fsync_path, read_json, write_json
from .reshardmove import Mover, NewShard, OldShard
from .shards import (
    RESHARD_NAME,
    crawl_count,
    place,
    read_placement,
    shard_dir,
    write_count,
    write_placement,
)
from .statusfile import STATUS_NAME

log = logging.getLogger(__name__)

PLAN_NAME = "PLAN.json"
COMMIT_NAME = "COMMIT.json"
ASIDE_NAME = ".reshard-old"
RANK_NAME = "rank"  # crawler.read.rank.RANK_DIR: PageRank over the crawl, derived
SEARCH_NAME = "search"  # crawler.search.schema.SEARCH_DIR: a shard's index, derived
# What a shard directory holds (at the top of DIR for one shard): moved aside as a whole.
SHARD_ENTRIES = ("main", "pend", "badhosts", "robots", "sitemaps", "cookies", "prior",
                 "outbox", SEARCH_NAME, "depths.bin", "due.bin", "urls.log", "counts.json",
                 STATUS_NAME, "inbox.sock", "browser-profile",
                 "outcomes.bin")  # written anew for the new MainDB's versions
# Tests only: "POINT" or "POINT:N" kills this process (SIGKILL) the Nth time POINT is
# reached: record (each MainDB record moved), built, committed, swap (each rename), swapped.
KILL_ENV = "CRAWLER_TEST_RESHARD_KILL"


@dataclass
class ReshardReport:
    old: int
    new: int
    moved: dict[str, int] = field(default_factory=dict)
    dropped_robots: int = 0
    finished: int | None = None  # the count of an interrupted reshard this run completed
    derived: bool = False  # a rank store or a search index was removed
    nodes: list[str] | None = None  # the new Ray placement

    @property
    def noop(self) -> bool:
        return self.old == self.new


class _Checkpoints:
    """The test hook of KILL_ENV (nothing at all when it is not set)."""

    def __init__(self) -> None:
        spec = os.environ.get(KILL_ENV, "")
        point, _, n = spec.partition(":")
        self.point, self.left = point, int(n or 1)

    def __call__(self, name: str) -> None:
        if name == self.point:
            self.left -= 1
            if self.left == 0:
                os.kill(os.getpid(), signal.SIGKILL)


def pending_plan(data_dir: str) -> dict[str, Any] | None:
    """The commit mark of a reshard of ``data_dir`` past its commit point, else None."""
    path = os.path.join(data_dir, RESHARD_NAME, COMMIT_NAME)
    try:
        doc = read_json(path, "a reshard's commit mark")
    except FileNotFoundError:
        return None
    if not (isinstance(doc, dict) and all(isinstance(doc.get(k), int) for k in ("from", "to"))):
        raise DataDirError(f"{path}: not a reshard's commit mark")
    return doc


def reshard(data_dir: str, count: int) -> ReshardReport:
    """Give the crawl in ``data_dir`` ``count`` shards (see the module docstring). The
    caller holds the crawl's supervisor lock. Raises DataDirError (a crawl running, a
    damaged store, absent Ray shards) with the crawl as it was, UsageError for a count
    out of range."""
    if not 1 <= count <= MAX_SHARDS:
        raise UsageError(f"--shards {count}: a crawl has 1 to {MAX_SHARDS} shards")
    if not os.path.isdir(data_dir):
        raise DataDirError(f"{data_dir}: no such crawl directory")
    checkpoint = _Checkpoints()
    work = os.path.join(data_dir, RESHARD_NAME)
    finished = None
    plan = pending_plan(data_dir)
    if plan is not None:
        log.info("%s: finishing the reshard to %d shards it was killed in", data_dir, plan["to"])
        _swap(data_dir, plan, checkpoint)
        finished = plan["to"]
    elif os.path.lexists(work):
        log.info("%s: a reshard killed before its commit point: building again", data_dir)
        shutil.rmtree(work)
    old = crawl_count(data_dir)
    report = ReshardReport(old, count, finished=finished)
    if old == count:
        return report
    nodes = read_placement(data_dir)
    dirs = [shard_dir(data_dir, i, old) for i in range(old)]
    if nodes is not None:
        absent = [i for i, d in enumerate(dirs) if not os.path.isdir(os.path.join(d, "main"))]
        if absent:
            raise DataDirError(
                f"{data_dir}: shard(s) {', '.join(map(str, absent))} of this Ray crawl are "
                "not on this machine: copy every shard directory here, then reshard")
        report.nodes = place(count, nodes)
    report.derived = os.path.isdir(os.path.join(data_dir, RANK_NAME)) or any(
        os.path.isdir(os.path.join(d, SEARCH_NAME)) for d in dirs)
    if old > 1:
        for d in dirs:  # what a newer crawler keeps and this one does not know: say so
            unknown = sorted(set(os.listdir(d)) - set(SHARD_ENTRIES) - {"shards.json"})
            unknown = [n for n in unknown if not n.endswith(".tmp")]
            if unknown:
                log.warning("%s: %s not carried to the new shards", d, ", ".join(unknown))
    plan = {"from": old, "to": count, "nodes": report.nodes}
    _build(data_dir, dirs, plan, report, checkpoint)
    _swap(data_dir, plan, checkpoint)
    return report


def _build(data_dir: str, dirs: list[str], plan: dict[str, Any], report: ReshardReport,
           checkpoint: _Checkpoints) -> None:
    """The new shards in the work directory, then the commit mark."""
    work = os.path.join(data_dir, RESHARD_NAME)
    olds: list[OldShard] = []
    news: list[NewShard] = []
    committed = False
    try:
        for d in dirs:  # every lock before anything is written
            olds.append(OldShard(d))
        os.mkdir(work)
        write_json(os.path.join(work, PLAN_NAME), {"to": plan["to"]})
        news = [NewShard(os.path.join(work, f"shard-{j:02d}")) for j in range(plan["to"])]
        mover = Mover(news, checkpoint)
        for old in olds:
            mover.move_shard(old)
        for old in olds:  # after every frontier: admission dedups against all of them
            mover.admit_outbox(old)
        mover.improve_depths()
        for new in news:
            new.finish()
        news = []
        fsync_path(work)
        checkpoint("built")
        write_json(os.path.join(work, COMMIT_NAME), plan)  # fsynced, renamed
        fsync_path(work)  # the commit point
        committed = True
        checkpoint("committed")
        report.moved, report.dropped_robots = mover.moved, mover.dropped_robots
    finally:
        for new in news:
            new.abandon()
        for old in olds:
            old.close()
        if not committed and olds:  # an error: the crawl stays as it was, usable
            shutil.rmtree(work, ignore_errors=True)


def _swap(data_dir: str, plan: dict[str, Any], checkpoint: _Checkpoints) -> None:
    """Roll the committed layout into place; each step skipped once done."""
    old, new = plan["from"], plan["to"]
    work = os.path.join(data_dir, RESHARD_NAME)
    aside = os.path.join(data_dir, ASIDE_NAME)
    os.makedirs(aside, exist_ok=True)

    def set_aside(path: str, name: str) -> None:
        dst = os.path.join(aside, name)
        if os.path.lexists(dst):  # cannot happen: each path is set aside once
            shutil.rmtree(dst) if os.path.isdir(dst) else os.unlink(dst)
        os.rename(path, dst)
        checkpoint("swap")

    if old > 1:  # old shards that have no new one in their place
        for i in range(new if new > 1 else 0, old):
            path = shard_dir(data_dir, i, old)
            if os.path.lexists(path):
                set_aside(path, os.path.basename(path))
    elif new > 1:  # one old shard: its entries at the top of DIR
        for name in SHARD_ENTRIES:
            if os.path.lexists(os.path.join(data_dir, name)):
                set_aside(os.path.join(data_dir, name), "top-" + name)
    moves: list[tuple[str, str, str]] = []  # (new source, its place, the aside name)
    if new > 1:
        for j in range(new):
            name = f"shard-{j:02d}"
            moves.append((os.path.join(work, name), os.path.join(data_dir, name), name))
    else:
        src = os.path.join(work, "shard-00")
        for name in sorted(os.listdir(src)) if os.path.isdir(src) else []:
            moves.append((os.path.join(src, name), os.path.join(data_dir, name), "top-" + name))
    for src, dst, name in moves:
        if os.path.lexists(src):  # not moved in yet: what is in its place is old
            if os.path.lexists(dst):
                set_aside(dst, name)
            os.rename(src, dst)
            checkpoint("swap")
    for name in (RANK_NAME, STATUS_NAME):  # derived, and the old shards' status
        if os.path.lexists(os.path.join(data_dir, name)):
            set_aside(os.path.join(data_dir, name), "top-" + name)
    write_count(data_dir, new)
    if plan.get("nodes"):
        # every new shard was written here: copied to its node, it must be found there
        write_placement(data_dir, plan["nodes"], [True] * new)
    fsync_path(data_dir)
    checkpoint("swapped")
    shutil.rmtree(aside)
    for name in os.listdir(work):
        if name != COMMIT_NAME:
            path = os.path.join(work, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    os.unlink(os.path.join(work, COMMIT_NAME))
    os.rmdir(work)
    fsync_path(data_dir)
    log.info("%s: %d shard(s) -> %d", data_dir, old, new)
