"""A Ray cluster of several nodes in network namespaces (tools/cluster.py), for tests.

    from cluster_helpers import ray_cluster  # noqa: F401 - the fixture

``ray_cluster`` (module scope) is a started :class:`tools.cluster.Cluster` of
``NODES`` nodes, removed after the module's tests whatever they did. It skips only
where the kernel (or the user) refuses network namespaces; mark such tests
``@pytest.mark.ci_may_skip`` with that reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvstore
from crawler.state.pages import PageRecord, decode_page
from crawler.state.shards import PLACEMENT_NAME, shard_dir
from tools.cluster import Cluster, refused

NODES = 3
NAMESPACES = "needs network namespaces (root, ip netns, veth, a bridge); this kernel refused"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    why = refused()
    if why is not None:
        pytest.skip(f"{NAMESPACES}: {why}")
    cluster = Cluster.create(NODES)
    try:
        yield cluster.up()
    finally:
        cluster.down()


def node_root(cluster: Cluster, address: str) -> Path:
    (node,) = [n for n in cluster.nodes if n.address == address]
    return Path(node.root)


def placement(cluster: Cluster, rel: str) -> list[str]:
    """Each shard's node address, from ray.json on the driver's node (the head)."""
    path = Path(cluster.nodes[0].root, rel, PLACEMENT_NAME)
    nodes: list[str] = json.loads(path.read_text())["nodes"]
    return nodes


def shard_path(cluster: Cluster, rel: str, index: int, count: int) -> Path:
    """Shard ``index``'s directory on its own node's disk (``rel``: the crawl's DIR
    under the cluster's mount)."""
    root = node_root(cluster, placement(cluster, rel)[index])
    return Path(shard_dir(str(root / rel), index, count))


def cluster_records(cluster: Cluster, rel: str, count: int) -> dict[str, PageRecord]:
    """Every page record of the crawl, each shard read on its own node's root."""
    out: dict[str, PageRecord] = {}
    for i in range(count):
        for url, rec in cluster_records_of(shard_path(cluster, rel, i, count)).items():
            assert url not in out, f"{url} recorded by two shards"
            out[url] = rec
    return out


def cluster_records_of(shard: Path) -> dict[str, PageRecord]:
    """The page records of one shard directory, by URL."""
    out: dict[str, PageRecord] = {}
    with kvstore.open(shard / "main", readonly=True) as db:
        for key in db:
            rec = decode_page(db[key], with_body=False)
            out[rec.url] = rec
    return out


def cluster_fetched(cluster: Cluster, rel: str, count: int) -> set[str]:
    return {u for u, r in cluster_records(cluster, rel, count).items() if r.status > 0}
