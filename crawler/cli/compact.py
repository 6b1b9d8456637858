"""``python -m crawler compact``: give back the space of dead records, running or not.

Each shard on this machine is compacted by this command if no run holds it, or
asked to compact by the run that does (crawler.state.compaction): the crawl goes
on meanwhile. Shards go one at a time (the free disk a compaction needs is one
shard's live records), each answer awaited, unless ``--no-wait`` asks them all.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

import kvstore

from ..exceptions import DataDirError
from ..state import compaction
from ..state.shards import crawl_count, shard_dirs
from ..state.statusfile import is_running, read_status
from ._common import log_to_stderr

POLL = 0.5  # seconds between two looks at the shards asked


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "compact",
        help="rewrite each shard's MainDB and PendDB without their dead records",
        description="Compacts every shard's MainDB (page records: revisits and rewrites "
        "leave the old record dead, retry leaves deletions) and PendDB. A shard no run "
        "holds is compacted here; a running one is asked, and its crawl compacts while it "
        "goes on fetching. Shards go one at a time; each needs free disk for a copy of "
        "its live records. See docs/CRAWLING.md, \"Compacting the stores\".",
        epilog="example: python -m crawler compact data",
    )
    p.add_argument("data", metavar="DIR", help="crawl data directory")
    p.add_argument("--no-wait", action="store_true",
                   help="ask the running shards and return, without waiting for their answer")


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _line(shard: str, result: dict[str, Any], by: str) -> str:
    parts = [f"{name} {_mb(r['before'])} -> {_mb(r['after'])} in {r['seconds']:.1f} s"
             for name in ("main", "pend") if (r := result.get(name))]
    error = f"; not finished: {result['error']}" if result.get("error") else ""
    return f"compact {shard}: {', '.join(parts) or 'nothing done'} ({by}){error}"


def _running(shard: str) -> bool:
    try:
        return is_running(read_status(shard))
    except DataDirError:  # a damaged status file: the store's lock tells (_here)
        return False


def _here(shard: str) -> dict[str, Any] | None:
    """Compact ``shard`` here; None when a run holds it after all (it is asked)."""
    try:
        return compaction.compact_shard(shard)
    except kvstore.exceptions.StoreLockedError:
        compaction.request(shard)
        return None


def _wait(shard: str) -> tuple[dict[str, Any], str]:
    """The answer to the request of ``shard``: the running crawl's, or this command's
    once no run holds the shard (it stopped before it got to the request)."""
    while True:
        if not compaction.asked(shard):
            result = compaction.read_result(shard)
            if result is not None:
                return result, "by the running crawl"
        elif not _running(shard) and (result := _here(shard)) is not None:
            return result, "here, the run having stopped"
        time.sleep(POLL)


def cmd_compact(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    crawl_count(args.data)  # one line for a directory with no crawl
    failed = False
    for shard in shard_dirs(args.data):  # one at a time: free disk for one shard's copy
        if not os.path.isdir(os.path.join(shard, "main")):
            print(f"compact {shard}: not on this machine (a Ray shard: run compact on its "
                  "node) or not started yet")
            continue
        if _running(shard):
            compaction.request(shard)
            result = None
        else:
            result = _here(shard)
        if result is not None:
            by = "here"
        else:
            print(f"compact {shard}: asked the running crawl", flush=True)
            if args.no_wait:
                continue
            result, by = _wait(shard)
        failed |= bool(result.get("error"))
        print(_line(shard, result, by), flush=True)
    return 1 if failed else 0


COMMANDS = {"compact": cmd_compact}
