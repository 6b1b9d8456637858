"""``start --ray``: the checks made before a crawl on Ray writes anything (docs/RAY.md)."""

from __future__ import annotations

import argparse
import importlib.util
import socket

from ..exceptions import CrawlerError
from ..state.shards import PLACEMENT_NAME, read_placement

CONNECT_CHECK = 5.0  # seconds for the head to accept a connection


def check_args(args: argparse.Namespace, data_dir: str) -> int | None:
    """The shard count asked for (None: the recorded one, or the default); refuses
    --ray without Ray installed, --shards without --ray, --processes with it, and a
    resume without --ray of a crawl whose shards live on several nodes."""
    if args.ray is None:
        if args.shards is not None:
            raise CrawlerError("--shards goes with --ray; on this machine alone use --processes")
        nodes = placed_nodes(data_dir)
        if len(set(nodes)) > 1:
            raise CrawlerError(
                f"--data {data_dir}: its shards live on {len(set(nodes))} Ray nodes "
                f"({PLACEMENT_NAME}): resume it with --ray ADDRESS"
            )
        processes: int | None = args.processes
        return processes
    if args.processes is not None:
        raise CrawlerError("--processes is for a crawl on this machine; with --ray use --shards")
    check_ray(args.ray)
    shards: int | None = args.shards
    return shards


def check_ray(address: str) -> None:
    """Refuse --ray ADDRESS without Ray installed, or at a HOST:PORT nobody answers."""
    if importlib.util.find_spec("ray") is None:
        raise CrawlerError(
            "--ray needs Ray: pip install 'kvcrawl[ray]' (in a checkout: pip install -e '.[ray]')"
        )
    if address != "local":
        check_reachable(address)


def placed_nodes(data_dir: str) -> list[str]:
    """The node of each shard of a crawl that ran on Ray ([] for one that did not);
    DataDirError for a damaged ray.json."""
    return read_placement(data_dir) or []


def check_reachable(address: str) -> None:
    """Fail in seconds, not minutes (ray.init retries an address nobody listens on),
    when HOST:PORT refuses connections."""
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_CHECK).close()
    except OSError as exc:
        raise CrawlerError(
            f"--ray {address}: nothing answers there ({exc.strerror or exc}): start the "
            "cluster first (ray start --head), or use --ray local"
        ) from None
