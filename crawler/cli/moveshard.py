"""``python -m crawler move-shard``: record that a Ray crawl's shard now lives on another node.

A shard's state is on its node's disk, and its actor is pinned to the node
``ray.json`` names (docs/RAY.md). When a node is gone for good, its disk
copied or restored onto another node at the same path, this command points
the shard at the new node; the next ``start --ray`` creates the actor there.
It is offline: it holds the crawl's supervisor lock, so no driver runs
meanwhile, and it rewrites ``ray.json`` in one atomic, fsynced rename, so a
crash leaves the old placement or the new one.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from typing import Any

from ..exceptions import DataDirError, UsageError
from ..run.supervisor import take_lock
from ..state.shards import (
    PLACEMENT_NAME,
    crawl_count,
    placement_of,
    read_started,
    shard_dir,
    write_placement,
)
from ._common import log_to_stderr


def add_parsers(sub: Any) -> None:
    move = sub.add_parser(
        "move-shard",
        help="record that a Ray crawl's shard now lives on another node",
        description="Points SHARD of a crawl that ran on Ray at NODE in DIR/ray.json, so the "
        "next start --ray creates its actor there. Copy or restore the shard's directory "
        "(DIR/shard-NN, from the old node's disk) to the same path on NODE first: the shard "
        "resumes from what it finds there. Run it on the driver's node, with the crawl "
        "stopped (docs/RAY.md, \"A node that never comes back\").",
        epilog="example: python -m crawler move-shard /srv/crawl 3 10.0.0.7",
    )
    move.add_argument("data", metavar="DIR", help="crawl data directory (the driver's node's)")
    move.add_argument("shard", metavar="SHARD", type=int, help="the shard's number (0, 1, ...)")
    move.add_argument("node", metavar="NODE",
                      help="the new node's address, as Ray names it (its node IP address)")


def cmd_move_shard(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    data = args.data
    count = crawl_count(data)
    try:
        node = str(ipaddress.ip_address(args.node))
    except ValueError:
        raise UsageError(f"{args.node!r} is not a node address: Ray names a node by its IP "
                         "address (ray status, or the NodeManagerAddress of ray.nodes())") from None
    if not 0 <= args.shard < count:
        raise UsageError(f"{data} has shards 0 to {count - 1}, not {args.shard}")
    _placement(data, count)  # a damaged or missing ray.json fails before the lock file is made
    lock = take_lock(data, "a crawl is running on this data directory: stop it (Ctrl-C) and "
                           "move the shard then")
    try:
        nodes = _placement(data, count)
        old = nodes[args.shard]
        where = shard_dir(data, args.shard, count)
        if old == node:
            print(f"move-shard {data}: shard {args.shard} is already on {node}")
            return 0
        nodes[args.shard] = node
        write_placement(data, nodes, read_started(data, count))  # its copy is there
    finally:
        os.close(lock)
    print(f"move-shard {data}: shard {args.shard} moved from {old} to {node}; the next "
          f"start --ray runs it there, from {where} on that node's disk")
    return 0


def _placement(data: str, count: int) -> list[str]:
    nodes = placement_of(data, count)
    if nodes is None:
        raise DataDirError(f"{data}: this crawl did not run on Ray (no {PLACEMENT_NAME}): "
                           "its shards are all on this machine")
    return nodes


COMMANDS = {"move-shard": cmd_move_shard}
