"""``python -m crawler reshard``: change a stopped crawl's shard count.

The plan, its commit point and why a kill -9 at any instant is safe are
crawler.state.reshard; moving each kind of state is crawler.state.reshardmove.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from typing import Any

from ..config import MAX_PROCESSES, MAX_SHARDS
from ..run.supervisor import take_lock
from ..state.reshard import reshard
from ..state.shards import RESHARD_NAME, crawl_count
from ._common import log_to_stderr


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of shards") from None
    if not 1 <= n <= MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"{n}: a crawl has 1 to {MAX_SHARDS} shards")
    return n


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "reshard",
        help="change a stopped crawl's shard count (every record and pending URL moves)",
        description="Moves every page record, pending URL, bad host, robots.txt answer, "
        "sitemap, cookie, depth, revisit time and outbox link of the crawl to the shard "
        "that owns its host under the new count, so that the crawl resumes with "
        "--processes N (or --ray ... --shards N). The crawl must be stopped. A kill at any "
        "moment is safe: run the same command again. The rank store and search indexes "
        "are removed (run rank / index again). See docs/SHARDS.md.",
        epilog="example: python -m crawler reshard crawl1 --shards 4 "
        "(then python -m crawler start --data crawl1 --processes 4)",
    )
    p.add_argument("data", metavar="DIR", help="crawl data directory (the crawl stopped)")
    p.add_argument("--shards", type=_count, required=True, metavar="N",
                   help=f"the new shard count, 1 to {MAX_SHARDS}")


def cmd_reshard(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    data = args.data
    if not os.path.lexists(os.path.join(data, RESHARD_NAME)):
        crawl_count(data)  # not a crawl, a damaged shards.json: before the lock file is made
    lock = take_lock(data, "a crawl is running on this data directory: stop it (Ctrl-C) and "
                           "run reshard again")
    try:
        report = reshard(data, args.shards)
    except KeyboardInterrupt:  # before the commit point the build is removed, else kept
        again = os.path.lexists(os.path.join(data, RESHARD_NAME))
        print(f"crawler: reshard {data} interrupted: " + (
            "run the same command again to finish it" if again else "the crawl is as it was"),
            file=sys.stderr)
        return 130
    finally:
        os.close(lock)
    if report.finished is not None:
        print(f"reshard {data}: finished the interrupted reshard to {report.finished} shard(s)")
    if report.noop:
        print(f"reshard {data}: the crawl has {report.new} shard(s) already; nothing to do")
        return 0
    moved = ", ".join(f"{n} {what}" for what, n in report.moved.items() if n)
    print(f"reshard {data}: {report.old} -> {report.new} shard(s): {moved or 'nothing to move'}")
    if report.dropped_robots:
        print(f"  {report.dropped_robots} kept robots.txt answer(s) of origins no URL names "
              "were dropped (fetched again when needed)")
    if report.derived:
        print("  the rank store and search indexes were removed: run rank / index again")
    if report.nodes is not None or report.new > MAX_PROCESSES:  # more than one machine runs
        if report.nodes is not None:
            _placement_lines(data, report.nodes)
        print(f"resume: python -m crawler start --data {shlex.quote(data)} --ray ADDRESS "
              f"--shards {report.new}")
    else:
        print(f"resume: python -m crawler start --data {shlex.quote(data)} --processes "
              f"{report.new}")
    return 0


def _placement_lines(data: str, nodes: list[str]) -> None:
    """Where ray.json now places each shard; which directories to copy where."""
    where: dict[str, list[str]] = {}
    for i, node in enumerate(nodes):
        where.setdefault(node, []).append(f"shard-{i:02d}" if len(nodes) > 1 else "the shard")
    print(f"  ray.json: {len(nodes)} shard(s) round-robin over {len(where)} node(s)")
    if len(where) > 1:
        print("  every new shard is on this machine: before start --ray, on each node replace "
              f"{data}/shard-*/ and shards.json with this machine's copies of its shards:")
        for node, names in where.items():
            print(f"    {node}: {' '.join(names)}")


COMMANDS = {"reshard": cmd_reshard}
