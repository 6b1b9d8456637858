"""tools/cluster.py: Ray nodes in network namespaces, each with its own disk; down after a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.cluster import Cluster, down_all, refused
from tools.rayenv import token_pids

pytest.importorskip("ray", reason="the [ray] extra is not installed")  # CI installs it
NAMESPACES = "needs network namespaces (root, ip netns, veth, a bridge); this kernel refused"
# A kernel (or user) that refuses namespaces may skip in CI; a missing package never does.
pytestmark = [pytest.mark.ci_may_skip(NAMESPACES), pytest.mark.system_packages("iproute2")]

REACH = """
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30).close()
"""


def ours(prefix: str, listing: list[str]) -> list[str]:
    return [x for x in listing if x.startswith(prefix)]


def test_nodes_have_their_own_disk_and_down_all_removes_what_a_crashed_run_left() -> None:
    why = refused()
    if why is not None:
        pytest.skip(f"{NAMESPACES}: {why}")
    cluster = Cluster.create(2)
    try:
        cluster.up()
        # node 1 reaches the head's GCS over the bridge, and writes on its own disk
        host, port = cluster.head_address.split(":")
        reach = subprocess.run(cluster.command(1, [sys.executable, "-c", REACH, host, port]),
                               env=cluster.env, capture_output=True, text=True, timeout=60)
        assert reach.returncode == 0, reach.stderr
        mark = os.path.join(cluster.mount, "mark")
        subprocess.run(cluster.command(1, ["touch", mark]), check=True, timeout=60)
        assert [os.path.exists(Path(n.root, "mark")) for n in cluster.nodes] == [False, True]
        assert not os.path.exists(mark)  # nothing is mounted in the root namespace
        assert token_pids(cluster.token)  # its Ray processes run
    except BaseException:
        cluster.down()
        raise
    # a crashed run leaves all of it behind; down --all finds it by its names
    removed = down_all(ident=cluster.id)
    assert {f"netns {n.netns}" for n in cluster.nodes} <= set(removed)
    assert f"link {cluster.bridge}" in removed and f"dir {cluster.base}" in removed
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"kvc-{cluster.id}" not in netns and f"kvc{cluster.id}" not in links
    assert not os.path.exists(cluster.base) and token_pids(cluster.token) == []
    cluster.down()  # and down is idempotent: nothing left to remove is no error


@pytest.mark.slow
@pytest.mark.system_packages("nftables", "nginx-light")  # its counters; the site's server
def test_bench_cluster_counts_the_exchange_and_the_bytes_between_nodes(tmp_path: Path) -> None:
    why = refused()
    if why is not None:
        pytest.skip(f"{NAMESPACES}: {why}")
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "tools/bench_cluster.py", "--nodes", "2", "--no-baseline", "--pages",
         "400", "--hosts", "6", "--idle", "1", "--repeat", "2", "--workdir", str(tmp_path / "w"),
         "--out", str(out)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    first, run = json.loads(out.read_text())["runs"]
    # the same crawl twice on one cluster: its bytes are counted once each time (a second
    # set of counters made for the second run doubled them)
    assert run["peer_bytes_per_link"] < 1.6 * first["peer_bytes_per_link"], (first, run)
    assert run["nodes"] == 2 and run["complete"] is True
    assert run["fetched"] == run["oracle_pages"]  # the whole site, over both nodes
    # links went to other shards and each was received (3 shards, 6 hosts); at least
    # once: a batch whose answer was lost is sent again and counted again on arrival
    assert run["links_sent"] > 0 and run["links_received"] >= run["links_sent"]
    assert run["cpu_by_role"]["shard actors"] > 0 and run["cpu_by_role"]["driver"] > 0
    # the nodes sent each other bytes, and what one sent the other received (the nodes'
    # counters are read one after the other: Ray's heartbeats may fall between)
    sent, received = run["peer_bytes"]["sent"], run["peer_bytes"]["received"]
    assert sent > 0 and abs(sent - received) < 0.1 * sent
    assert run["peer_bytes_per_link"] is not None and run["peer_bytes_per_link"] > 0
