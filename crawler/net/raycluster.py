"""Joining a Ray cluster, and pinning work to the node that holds a shard's disk.

One place for what the Ray crawl (crawler.run.raydriver) and the Ray search and index
(crawler.search.onray) both do: connect (``local``: a private one-machine cluster
bound to 127.0.0.1; ``auto``; ``HOST:PORT``) and find the node with an address, for a
hard NodeAffinitySchedulingStrategy: a shard's state is on its node's local disk, so
what reads it runs there or nowhere.

Thread safety: call from the thread that drives Ray (Ray's own rule for ``ray.init``).
"""

from __future__ import annotations

import os
from typing import Any

from ..exceptions import CrawlerError

NAMESPACE = "kvcrawl"  # every actor of ours is in it


def connect(address: str, *, quiet: bool = False) -> None:
    """Join the cluster at ``address`` (``local``, ``auto``, ``HOST:PORT``). ``quiet``:
    the actors' output is not copied to this process's stderr (a command whose errors
    are one line; a crawl's driver shows its actors' logs). Raises CrawlerError, one
    line, when the cluster cannot be reached."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never report home
    if address == "local":
        # Ray's switch for one-machine clusters: every server binds 127.0.0.1 (read
        # when ray is imported, so set first)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "configure_logging": False,
                              "log_to_driver": not quiet}
    if address == "local":
        kwargs.update(
            address="local",
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            object_store_memory=128 << 20,  # links pass as small objects
        )
    else:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise CrawlerError(f"--ray {address}: cannot reach the cluster: {exc}") from None


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]


def node_id(address: str) -> str | None:
    """The Ray node id of the alive node with ``address``, None when there is none."""
    ids = sorted(n["NodeID"] for n in alive_nodes() if n["NodeManagerAddress"] == address)
    return ids[0] if ids else None


def pinned(node: str) -> Any:
    """A scheduling strategy that runs only on node id ``node`` (never elsewhere)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node, soft=False)


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


__all__ = ["NAMESPACE", "alive_nodes", "connect", "node_id", "pinned", "shutdown"]
