"""One crawl on a real Ray cluster of 1, 2 and 3 nodes (issue 32, "Measure"): pages/s,
links exchanged, the cluster's CPU by role, and the bytes the nodes send each other.

Usage (from the repository root, as root; needs nginx and nft, which
``tools/install-system-packages`` installs with the tests' other system packages):

    python tools/bench_cluster.py                      # 1, 2, 3 nodes; 3 shards; 20k pages
    python tools/bench_cluster.py --nodes 1,3 --shards 6 --pages 50000 --repeat 2

Method. For each node count a fresh cluster of network namespaces (tools/cluster.py:
addresses from 198.18.0.0/15, nothing leaves the machine). The fault-free test web
(``SiteConfig(pages, hosts, seed=0, crawl_delay=0)``, tools/bench_crawl.ServedSite)
is served by nginx on the cluster's bridge address with the test DNS server beside
it. The crawl's driver runs on the head node (``--ray HEAD:6379 --shards N``, the
same shard count whatever the node count: only the placement changes), over
``--broad --delay 0``, to the end of the site.

Measured, per run:

- pages/s: pages fetched over the crawl's own seconds (its summary line: from the
  moment the cluster is reached, Ray's actor start-up included);
- the exchange: links sent to other shards and received (every shard's
  ``sent_urls``/``received_urls``/``sent_batches`` in DIR/status.json); links a
  page, URLs a message;
- CPU: every process of every node's namespace (the driver, the shards' actor
  workers, Ray's own daemons: raylet, GCS, the agents; not nginx or the DNS server),
  from /proc/PID/stat polled every ``--poll`` s (a process's last reading before it
  exits is kept), split by role, and per page. First the same crawl with one shard on
  one node (no exchange; ``--no-baseline`` skips it): a run's CPU beyond that run's
  CPU per page, over the links it sent, is what a link costs to send and to receive
  (Ray's calls, the owner's admission, the sender's outbox);
- the wire: an nft counter in each node's namespace on what it sends to and
  receives from the *other nodes* (the web and the DNS are on the bridge's address:
  not counted). The same counters over ``--idle`` seconds of the idle cluster before
  the crawl give Ray's own background chatter, subtracted at the crawl's length;
  what is left, over the links sent, is the bytes a URL costs on the wire between
  nodes (Ray's control traffic of the crawl included). One node sends nothing to
  another: its exchange goes over its own loopback.

The two cores are shared by every node, nginx and this script: read the CPU and
byte columns rather than pages/s for what a link costs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

from tools.bench_crawl import ServedSite
from tools.cluster import Cluster, netns_pids, refused
from tools.measure_crawl import crawl_command
from tools.testweb.graph import SiteConfig

REPO = Path(__file__).resolve().parents[1]
TABLE = "kvcbench"
TICKS = os.sysconf("SC_CLK_TCK")
RUN_TIMEOUT = 1800.0


def _nft(netns: str, *argv: str, script: str | None = None) -> str:
    done = subprocess.run(["ip", "netns", "exec", netns, "nft", *argv], input=script,
                          capture_output=True, text=True, check=True)
    return done.stdout


def count_peers(cluster: Cluster) -> None:
    """In each node's namespace, a counter on what it sends to the other nodes and one
    on what it receives from them (made anew: a second set of rules would count twice)."""
    for n in cluster.nodes:
        peers = [m.address for m in cluster.nodes if m is not n]
        if not peers:
            continue
        others = "{ " + ", ".join(peers) + " }"
        _nft(n.netns, "-f", "-", script=(
            f"table ip {TABLE}\ndelete table ip {TABLE}\n"
            f"table ip {TABLE} {{\n"
            f"  chain out {{ type filter hook output priority 0; ip daddr {others} counter; }}\n"
            f"  chain in {{ type filter hook input priority 0; ip saddr {others} counter; }}\n"
            "}\n"))


def peer_bytes(cluster: Cluster) -> dict[str, int]:
    """Bytes every node sent to the others, and received from them, so far."""
    total = {"sent": 0, "received": 0}
    for n in cluster.nodes:
        if len(cluster.nodes) == 1:
            break
        listing = json.loads(_nft(n.netns, "-j", "list", "table", "ip", TABLE))
        for item in listing["nftables"]:
            rule = item.get("rule")
            if rule is None:
                continue
            for expr in rule["expr"]:
                if "counter" in expr:
                    total["sent" if rule["chain"] == "out" else "received"] += \
                        expr["counter"]["bytes"]
    return total


def role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "crawler start" in cmd:
        return "driver"
    if cmd.startswith("ray::"):
        return "shard actors" if "Shard" in cmd else "ray workers"
    return "ray daemons"


class CpuPoll:
    """Every process of the cluster's namespaces: the CPU seconds each has used, kept
    at its last reading (a process that exits keeps what was read before)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.seconds: dict[int, float] = {}
        self.roles: dict[int, str] = {}
        self.base: dict[int, float] = {}

    def poll(self) -> None:
        for n in self.cluster.nodes:
            for pid in netns_pids(n.netns):
                try:
                    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                self.seconds[pid] = (int(fields[11]) + int(fields[12])) / TICKS
                if self.roles.get(pid) not in ("driver", "shard actors"):
                    self.roles[pid] = role(pid)  # a Ray worker names itself once it hosts

    def start(self) -> None:
        """From now on: what the processes used before is not counted."""
        self.poll()
        self.base = dict(self.seconds)

    def by_role(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, s in self.seconds.items():
            name = self.roles.get(pid, "gone")
            out[name] = out.get(name, 0.0) + s - self.base.get(pid, 0.0)
        return {k: round(v, 2) for k, v in sorted(out.items())}


class ExchangeCounts:
    """Each shard's exchange counters, the largest seen in the driver's status.json
    (they only grow within an incarnation; the final status.json holds each shard's
    final counts, so the last links sent are counted with their receipt)."""

    FIELDS = ("sent_urls", "received_urls", "sent_batches", "send_failures")

    def __init__(self) -> None:
        self.seen: dict[tuple[int, str], int] = {}

    def update(self, path: Path) -> None:
        try:
            shards = json.loads(path.read_text()).get("per_shard", [])
        except (OSError, ValueError):
            return  # not written yet, or being replaced
        for s in shards:
            for name in self.FIELDS:
                if name in s:
                    key = (int(s["shard"]), name)
                    self.seen[key] = max(self.seen.get(key, 0), int(s[name]))

    def total(self, name: str) -> int:
        return sum(v for (_, n), v in self.seen.items() if n == name)


def crawl(cluster: Cluster, site: ServedSite, args: argparse.Namespace, shards: int,
          tag: str, work: Path) -> dict[str, Any]:
    """One crawl of the whole site on ``cluster``; its measures."""
    rel = f"c-{tag}"
    data = Path(cluster.mount, rel)
    cmd = crawl_command(cast(Any, site.web), data, "--ray", cluster.head_address,
                        "--shards", str(shards), "--threads", str(args.threads),
                        "--per-host", str(args.per_host), "--delay", "0", "--timeout", "30",
                        "--status-interval", "0.5", "--quiet")
    cpu = CpuPoll(cluster)
    count_peers(cluster)
    cpu.start()
    before = peer_bytes(cluster)
    time.sleep(args.idle)  # the idle cluster's own chatter between nodes
    idle = peer_bytes(cluster)
    idle_rate = {k: (idle[k] - before[k]) / args.idle for k in idle}
    cpu.poll()
    idle_cpu = sum(cpu.by_role().values()) / args.idle
    cpu.start()
    out, err = work / f"{tag}.out", work / f"{tag}.err"
    status_path = Path(cluster.nodes[0].root, rel, "status.json")
    exchange = ExchangeCounts()
    started = time.monotonic()
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(cluster.command(0, cmd), cwd=REPO, env=cluster.env,
                                stdout=o, stderr=e)
        try:
            while proc.poll() is None:
                cpu.poll()
                exchange.update(status_path)
                if time.monotonic() - started > RUN_TIMEOUT:
                    proc.kill()
                time.sleep(args.poll)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    wall = time.monotonic() - started
    after = peer_bytes(cluster)
    said = bu.crawl_summary(out.read_text())
    if proc.returncode != 0 or said is None:
        raise SystemExit(f"bench_cluster: the crawl failed ({proc.returncode}): "
                         f"{err.read_text()[-2000:]}")
    summary = said[1]
    exchange.update(status_path)  # the final status.json: each shard's last counts
    sent = exchange.total("sent_urls")
    fetched = int(summary["fetched"])
    seconds = float(summary["seconds"])
    roles = cpu.by_role()
    total_cpu = sum(roles.values())
    wire = {k: after[k] - idle[k] for k in after}
    crawl_wire = max(0.0, wire["sent"] - idle_rate["sent"] * wall)
    return {
        "nodes": len(cluster.nodes), "shards": shards, "fetched": fetched,
        "crawl_s": seconds, "wall_s": round(wall, 2), "complete": summary["complete"],
        "pages_per_s": round(fetched / max(1e-9, seconds), 1),
        "links_sent": sent,
        "links_received": exchange.total("received_urls"),
        "batches_sent": exchange.total("sent_batches"),
        "send_failures": exchange.total("send_failures"),
        "cpu_s": round(total_cpu, 2), "cpu_by_role": roles,
        "idle_cpu_per_s": round(idle_cpu, 3),
        "cpu_ms_per_page": round(1000 * total_cpu / max(1, fetched), 3),
        "peer_bytes": wire, "idle_peer_bytes_per_s": idle_rate,
        "peer_bytes_per_link": (round(crawl_wire / sent, 1)
                                if sent and len(cluster.nodes) > 1 else None),
    }


def measure(nodes: int, shards: int, config: SiteConfig, args: argparse.Namespace,
            work: Path) -> list[dict[str, Any]]:
    bu.log(f"{nodes} node(s): starting the cluster")
    cluster = Cluster.create(nodes)
    try:
        cluster.up()
        with ServedSite(work / f"n{nodes}", config, "1", address=cluster.gateway) as site:
            runs = []
            for i in range(args.repeat):
                r = crawl(cluster, site, args, shards, f"n{nodes}s{shards}-{i}", work)
                r["oracle_pages"] = len(site.oracle.fetched)
                bu.log(f"{nodes} node(s), run {i}: {r['fetched']} pages, "
                       f"{r['pages_per_s']} pages/s, {r['links_sent']} links sent, "
                       f"{r['peer_bytes_per_link']} B a link between nodes")
                runs.append(r)
            return runs
    finally:
        cluster.down()
        shutil.rmtree(work / f"n{nodes}", ignore_errors=True)


def table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for r in runs:
        roles = r["cpu_by_role"]
        rows.append([str(r["nodes"]), str(r["shards"]), str(r["fetched"]),
                     f"{r['pages_per_s']:.0f}", str(r["links_sent"]),
                     f"{r['links_sent'] / max(1, r['batches_sent']):.0f}",
                     f"{r['cpu_ms_per_page']:.2f}",
                     "-" if r["extra_cpu_ms_per_link"] is None
                     else f"{r['extra_cpu_ms_per_link']:.2f}",
                     " / ".join(f"{roles.get(k, 0):.0f}" for k in
                                ("driver", "shard actors", "ray daemons", "ray workers")),
                     "-" if r["peer_bytes_per_link"] is None else f"{r['peer_bytes_per_link']:.0f}",
                     bu.fmt_bytes(r["peer_bytes"]["sent"])])
    return bu.markdown_table(
        ["nodes", "shards", "pages", "pages/s", "links sent", "URLs/msg", "CPU ms/page",
         "extra CPU ms/link", "CPU s driver/actors/daemons/workers", "B/link on wire",
         "between nodes"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="1,2,3", help="node counts, comma-separated")
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--pages", type=int, default=20_000)
    p.add_argument("--hosts", type=int, default=30)
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--per-host", type=int, default=4)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the run with one shard (1 node) the exchange's CPU is read against")
    p.add_argument("--idle", type=float, default=10.0,
                   help="seconds of the idle cluster measured before each crawl")
    p.add_argument("--poll", type=float, default=0.25)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("results/bench_cluster.json"))
    args = p.parse_args(argv)
    try:
        counts = [int(x) for x in args.nodes.split(",")]
    except ValueError:
        p.error(f"--nodes {args.nodes!r}: comma-separated numbers")
    if min(counts) < 1 or args.shards < 1 or args.repeat < 1 or args.idle <= 0:
        p.error("--nodes, --shards and --repeat must be >= 1, --idle > 0")
    why = refused()
    if why is not None:
        raise SystemExit(f"bench_cluster: needs network namespaces: {why}")
    if shutil.which("nft") is None:
        raise SystemExit("bench_cluster: nft not found: tools/install-system-packages "
                         "installs it (Debian's nftables)")
    bu.nginx_binary("bench_cluster")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    config = SiteConfig(pages=args.pages, hosts=args.hosts, seed=0, crawl_delay=0.0)
    result: dict[str, Any] = {"machine": {**bu.machine_info(("ray",)),
                                          "load_start": bu.loadavg(),
                                          "git": bu.git_revision(REPO)},
                              "args": vars(args), "runs": []}
    if not args.no_baseline:  # one shard: the same crawl with no exchange at all
        result["runs"] += measure(1, 1, config, args, work)
    for nodes in counts:
        result["runs"] += measure(nodes, args.shards, config, args, work)
    base = [r["cpu_ms_per_page"] for r in result["runs"] if r["shards"] == 1]
    for r in result["runs"]:  # what the exchange added, per link sent
        r["extra_cpu_ms_per_link"] = (
            round((r["cpu_s"] * 1000 - bu.median(base) * r["fetched"]) / r["links_sent"], 3)
            if base and r["links_sent"] else None)
    bu.write_results(args.out, result, table(result["runs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
