"""A crawl on a real Ray cluster of 3 nodes, each in its own network namespace with its own
disk (tools/cluster.py): placement over the nodes, and a node lost and returned."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_helpers import (
    NAMESPACES,
    cluster_fetched,
    cluster_records_of,
    node_root,
    placement,
    ray_cluster,  # noqa: F401 - the fixture
    shard_path,
)
from crawl_helpers import REPO, page_refetches
from test_ray import open_during, ray_args, refetches_by_shard
from test_shards import answered, summary, tail, wait_until

from crawler.cli import main
from crawler.state.shards import owner, shard_dir
from tools.cluster import Cluster
from tools.testweb import TestWeb

pytest.importorskip("ray", reason="the [ray] extra is not installed")  # CI installs it
pytestmark = [pytest.mark.ci_may_skip(NAMESPACES), pytest.mark.system_packages("iproute2")]

MakeWeb = Callable[..., TestWeb]
SHARDS = 3  # one on each of the 3 nodes: what a node's loss proves needs no more
THREADS = 8
HOSTS = 14  # several hosts for each shard, before and after the reshard to 2


def start(cluster: Cluster, web: TestWeb, rel: str, log: Path,
          *extra: str, shards: int = SHARDS) -> subprocess.Popen[bytes]:
    """The crawl's driver, on the head node (a Ray driver attaches to its node's raylet),
    its DIR the cluster's mount/``rel`` (on every node: that node's own root)."""
    # Every timeout 60 s: on two loaded cores the shards, 3 Ray nodes and the test web (its
    # DNS server too) share the CPU, and a fetch, connect or lookup that outlasts its
    # timeout is retried (a refetch) or, for a lookup or a connect, marks the host bad
    # and records its pages bad_host (seen in CI: 6 actors starting at once starved the
    # DNS server past the 10 s default)
    args = ray_args(web, Path(cluster.mount, rel), cluster.head_address, shards,
                    "--threads", str(THREADS), "--status-interval", "0.2", "--timeout", "60",
                    "--connect-timeout", "60", "--read-timeout", "60", "--dns-timeout", "60",
                    *extra)
    with open(log, "ab") as err:
        return subprocess.Popen(cluster.command(0, args), cwd=REPO, env=cluster.env,
                                stdout=subprocess.PIPE, stderr=err)


def driver_status(cluster: Cluster, rel: str) -> dict[str, object]:
    """The driver's status.json (on the head's disk), {} until it is written."""
    try:
        return dict(json.loads(Path(cluster.nodes[0].root, rel, "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def per_shard(cluster: Cluster, rel: str) -> list[dict[str, object]]:
    return list(driver_status(cluster, rel).get("per_shard", []))  # type: ignore[call-overload]


def repeats(web: TestWeb, t0: float) -> list[tuple[str, str, float, float | None, int | None]]:
    """Requests of a URL asked more than once: (url, peer, start, end, status), times
    from ``t0``."""
    seen: dict[str, list[tuple[str, str, float, float | None, int | None]]] = {}
    for r in web.log.records():
        seen.setdefault(r.url, []).append(
            (r.url, r.peer, round(r.start - t0, 2),
             None if r.end is None else round(r.end - t0, 2), r.status))
    return [x for reqs in seen.values() if len(reqs) > 1 for x in reqs]


def under_way(cluster: Cluster, web: TestWeb, rel: str, proc: subprocess.Popen[bytes],
              log: Path, pages: int) -> None:
    """Wait until every shard reported and ``pages`` more pages were answered, the crawl
    still running (then a test may cut a node)."""
    wait_until(lambda: len([s for s in per_shard(cluster, rel) if s.get("pid")]) == SHARDS,
               "every shard up", 180)
    target = answered(web) + pages
    wait_until(lambda: answered(web) >= target or proc.poll() is not None, "progress", 180)
    assert proc.poll() is None, f"the crawl ended before the power cut:\n{tail(log)}"


def refetches_bounded(web: TestWeb, gone: set[int], t_cut: float,
                      t_dead: float) -> dict[int, int]:
    """A refetch is of a URL in flight on the lost node at the cut (or within the
    committer's bound, the thread count, of one shard); the other shards refetched
    nothing. Returns the refetches by shard."""
    refetched = refetches_by_shard(web, SHARDS)
    bound = open_during(web, gone, SHARDS, t_cut, t_dead) + len(gone) * THREADS
    assert sum(refetched.get(s, 0) for s in gone) <= bound, (refetched, bound)
    assert all(refetched.get(s, 0) == 0 for s in range(SHARDS) if s not in gone), (
        refetched, repeats(web, t_cut))
    return refetched


def assert_each_shard_on_its_node_only(cluster: Cluster, rel: str) -> None:
    for i in range(SHARDS):
        own = shard_path(cluster, rel, i, SHARDS)
        assert (own / "main").is_dir(), own
        for n in cluster.nodes:
            if Path(n.root) != node_root(cluster, placement(cluster, rel)[i]):
                assert not os.path.exists(shard_dir(str(Path(n.root, rel)), i, SHARDS)), (i, n)


@pytest.mark.slow
def test_a_crawl_over_three_nodes_matches_the_oracle_with_each_shard_on_its_node(
    make_testweb: MakeWeb, tmp_path: Path, ray_cluster: Cluster,  # noqa: F811
) -> None:
    cluster = ray_cluster
    web = make_testweb(pages=280, hosts=HOSTS, seed=5, crawl_delay=0.02, address=cluster.gateway)
    want = web.oracle.crawl()
    log = tmp_path / "crawl.log"
    proc = start(cluster, web, "placed", log, "--per-host", "1", "--delay", "0.01")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, tail(log)
    got = summary(out.decode())
    assert got["complete"] is True and got["shards"] == SHARDS
    assert cluster_fetched(cluster, "placed", SHARDS) == set(want.fetched)
    assert web.log.urls() == set(want.requests)
    assert not web.log.duplicates()  # each page (and robots.txt) requested once
    assert {owner(h, SHARDS) for h in web.log.hosts()} == set(range(SHARDS))  # all worked
    for host in web.log.hosts():  # one owner per host: its politeness is exact
        assert web.log.max_concurrency(host) <= 1, host
        delay = max(0.01, want.crawl_delay.get(host, 0.0))
        assert all(g >= delay - 0.01 for g in web.log.gaps(host)), host
    # the alive nodes in address order, round-robin; each shard's files on its node only
    addresses = [n.address for n in cluster.nodes]
    assert placement(cluster, "placed") == [addresses[i % 3] for i in range(SHARDS)]
    assert_each_shard_on_its_node_only(cluster, "placed")


def answered_for(web: TestWeb, shards: set[int]) -> int:
    """Requests the test web has answered for the hosts of ``shards``."""
    return sum(1 for r in web.log.records(done=True) if owner(r.host, SHARDS) in shards)


@pytest.mark.slow
def test_a_lost_node_waits_and_its_return_resumes_its_shards_with_nothing_lost(
    make_testweb: MakeWeb, tmp_path: Path, ray_cluster: Cluster,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = ray_cluster
    web = make_testweb(pages=1400, hosts=HOSTS, seed=7, crawl_delay=0.0,
                       address=cluster.gateway)
    want = set(web.oracle.crawl().fetched)
    log = tmp_path / "crawl.log"
    lost = 2  # node 2 holds shard 2
    gone = {i for i in range(SHARDS) if i % len(cluster.nodes) == lost}
    proc = start(cluster, web, "lost", log, "--per-host", "2")
    try:
        under_way(cluster, web, "lost", proc, log, 250)
        reported = sum(int(p.get("fetched", 0)) for p in per_shard(cluster, "lost")
                       if p["shard"] in gone)
        t_cut = time.time()
        cluster.kill_node(lost)  # link down, every process SIGKILLed, namespace gone
        t_dead = time.time()
        # (counted from the loss: by the time the driver is sure of it, 5 s without an
        # answer, the others may have fetched all they can reach without shard 2)
        others = set(range(SHARDS)) - gone
        before = answered_for(web, others)
        # The driver sees the shards gone; the others crawl on and keep the lost
        # shards' links in their outboxes (on their own disks)
        wait_until(lambda: driver_status(cluster, "lost").get("shards_up") == SHARDS - len(gone),
                   "the driver seeing the lost shards", 180)
        wait_until(lambda: sum(int(s.get("outbox", 0)) for s in per_shard(cluster, "lost")) > 0,
                   "links for the lost shards waiting in outboxes", 120)
        wait_until(lambda: answered_for(web, others) > before, "the others crawling on", 120)
        assert main(["status", str(Path(cluster.nodes[0].root, "lost")), "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["running"] is True and info["shards_down"] == sorted(gone)
        # Ray declares the node dead and lets go of its actors (~17 s with the cluster's
        # health checks); then the node comes back
        wait_until(lambda: all(f"shard {i}: Ray let go of its actor" in log.read_text()
                               for i in gone), "Ray letting go of the lost actors", 300)
        assert proc.poll() is None, tail(log)
        t_back = time.time()
        cluster.start_node(lost)  # the same address, the same disk
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, tail(log)
    got = summary(out.decode())
    assert got["complete"] is True
    assert cluster_fetched(cluster, "lost", SHARDS) == want
    assert_each_shard_on_its_node_only(cluster, "lost")
    # The lost incarnations' fetches are counted, up to their last report: what no
    # report said before the cut is the most that can be missing
    lost_fetches = sum(1 for r in web.log.records() if owner(r.host, SHARDS) in gone
                       and r.start <= t_dead)
    fetched = int(str(got["fetched"]))
    assert fetched >= len(want) - (lost_fetches - reported), (fetched, lost_fetches, reported)
    # the loss is logged at once, for the lost shards only (not for actors starting)
    down = [ln for ln in log.read_text().splitlines() if " is down for " in ln]
    assert {int(ln.split("shard ")[1].split()[0]) for ln in down} == gone, down
    # nobody fetched the lost shards' hosts while their node was down
    assert not [r for r in web.log.records() if owner(r.host, SHARDS) in gone
                and t_dead < r.start < t_back]
    print("refetches by shard:", refetches_bounded(web, gone, t_cut, t_dead))


@pytest.mark.slow
def test_a_node_back_before_rays_verdict_resumes_its_shards_with_nothing_lost(
    make_testweb: MakeWeb, tmp_path: Path, ray_cluster: Cluster,  # noqa: F811
) -> None:
    """A quick reboot: the node starts again (same address, same disk) at once after
    the power cut, before Ray's health checks declared it dead. Ray lets go of the old
    actors as the node registers again; the driver must take that for a lost node (its
    old node id is dead), not for actors that failed for good, and create them there."""
    cluster = ray_cluster
    web = make_testweb(pages=1000, hosts=HOSTS, seed=19, crawl_delay=0.0,
                       address=cluster.gateway)
    want = set(web.oracle.crawl().fetched)
    log = tmp_path / "crawl.log"
    lost = 1  # node 1 holds shard 1
    gone = {i for i in range(SHARDS) if i % len(cluster.nodes) == lost}
    proc = start(cluster, web, "rebooted", log, "--per-host", "2")
    try:
        under_way(cluster, web, "rebooted", proc, log, 200)
        t_cut = time.time()
        cluster.kill_node(lost)
        t_dead = time.time()
        cluster.start_node(lost)  # back in a few seconds: Ray's verdict takes ~17
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, tail(log)
    assert summary(out.decode())["complete"] is True
    text = log.read_text()
    assert "failed for good" not in text
    assert all(f"shard {i} resumed on its node" in text for i in gone)  # created there again
    assert cluster_fetched(cluster, "rebooted", SHARDS) == want
    assert_each_shard_on_its_node_only(cluster, "rebooted")
    refetches_bounded(web, gone, t_cut, t_dead)


@pytest.mark.slow
def test_a_node_that_never_comes_back_is_replaced_with_move_shard(
    make_testweb: MakeWeb, tmp_path: Path, ray_cluster: Cluster,  # noqa: F811
) -> None:
    """Its disk restored on another node, ``move-shard`` points its shards there: the
    crawl resumes without it and ends == oracle, nothing its shards recorded lost."""
    cluster = ray_cluster
    web = make_testweb(pages=900, hosts=HOSTS, seed=11, crawl_delay=0.0,
                       address=cluster.gateway)
    want = set(web.oracle.crawl().fetched)
    log = tmp_path / "crawl.log"
    lost, spare = 2, 1
    gone = {i for i in range(SHARDS) if i % len(cluster.nodes) == lost}
    proc = start(cluster, web, "moved", log, "--per-host", "2")
    try:
        under_way(cluster, web, "moved", proc, log, 200)
        t_cut = time.time()
        cluster.kill_node(lost)
        t_dead = time.time()
        wait_until(lambda: all(f"shard {i}: Ray let go of its actor" in log.read_text()
                               for i in gone), "Ray letting go of the lost actors", 300)
        proc.send_signal(signal.SIGINT)  # the crawl stopped, as move-shard wants
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    try:
        # the lost node's disk, restored onto the spare node; the crawl pointed at it
        driver_dir = Path(cluster.nodes[0].root, "moved")
        old = Path(cluster.nodes[lost].root, "moved")
        recorded = {i: len(cluster_records_of(old / f"shard-{i:02d}")) for i in gone}
        assert all(recorded.values()), recorded  # each lost shard had recorded pages
        for i in gone:
            shutil.copytree(old / f"shard-{i:02d}", Path(cluster.nodes[spare].root, "moved",
                                                         f"shard-{i:02d}"))
            assert main(["move-shard", str(driver_dir), str(i),
                         cluster.nodes[spare].address]) == 0
        shutil.rmtree(old)  # that disk is gone for good
        addresses = [n.address for n in cluster.nodes]
        assert placement(cluster, "moved") == [
            addresses[spare if i in gone else i % 3] for i in range(SHARDS)]
        proc = start(cluster, web, "moved", log)
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, tail(log)
        assert summary(out.decode())["complete"] is True
        assert cluster_fetched(cluster, "moved", SHARDS) == want
        for i in gone:  # what the lost shards had recorded is there still
            assert len(cluster_records_of(shard_path(cluster, "moved", i, SHARDS))) >= recorded[i]
        # refetched: at most what the lost node had in flight at the cut, plus each lost
        # shard's uncommitted outcomes (the thread count); the others stopped cleanly
        refetches_bounded(web, gone, t_cut, t_dead)
    finally:
        cluster.start_node(lost)  # for the module's other tests


def test_a_crawl_over_three_nodes_is_resharded_and_resumes_on_them(
    make_testweb: MakeWeb, tmp_path: Path, ray_cluster: Cluster,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/SHARDS.md's way for a crawl of several nodes: every shard directory gathered
    on one machine, ``reshard`` there, each new shard copied to the node the new ray.json
    names (here 3 shards, one a node, made 2: the third node's pages move to the other
    two); the resumed crawl ends == oracle, no page fetched twice."""
    cluster = ray_cluster
    web = make_testweb(pages=500, hosts=HOSTS, seed=17, crawl_delay=0.0,
                       address=cluster.gateway)
    want = set(web.oracle.crawl().fetched)
    log = tmp_path / "crawl.log"
    proc = start(cluster, web, "resharded", log, "--max-pages", "150")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, tail(log)
    assert summary(out.decode())["complete"] is False
    # gathered: the driver's top-level files, and each shard from its own node's disk
    gathered = tmp_path / "gathered"
    shutil.copytree(Path(cluster.nodes[0].root, "resharded"), gathered,
                    ignore=shutil.ignore_patterns("shard-*"))
    for i in range(SHARDS):
        shutil.copytree(shard_path(cluster, "resharded", i, SHARDS), gathered / f"shard-{i:02d}")
    capsys.readouterr()
    assert main(["reshard", str(gathered), "--shards", "2"]) == 0
    said = capsys.readouterr().out
    nodes = json.loads((gathered / "ray.json").read_text())["nodes"]
    assert nodes == sorted(n.address for n in cluster.nodes)[:2]  # round-robin, address order
    for i, address in enumerate(nodes):
        assert f"shard-{i:02d}" in said and address in said  # the command says where
    # placed: every node's old shards gone, the top-level files everywhere, each new
    # shard on its node only
    for n in cluster.nodes:
        mine = Path(n.root, "resharded")
        shutil.rmtree(mine)
        shutil.copytree(gathered, mine, ignore=shutil.ignore_patterns("shard-*"))
        for i, address in enumerate(nodes):
            if address == n.address:
                shutil.copytree(gathered / f"shard-{i:02d}", mine / f"shard-{i:02d}")
    proc = start(cluster, web, "resharded", log, shards=2)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, tail(log)
    got = summary(out.decode())
    assert got["complete"] is True and got["shards"] == 2
    assert cluster_fetched(cluster, "resharded", 2) == want
    assert page_refetches(web) == {}
    assert placement(cluster, "resharded") == nodes
