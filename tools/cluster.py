"""A Ray cluster of several nodes on one machine, each node in its own network namespace.

    python tools/cluster.py up --nodes 3         # prints the cluster's state (JSON)
    python tools/cluster.py exec BASE 0 -- python -m crawler start URL --data DIR/c \\
        --ray HEAD:6379 --shards 6 ...           # a command on node 0 (the head)
    python tools/cluster.py down BASE            # or: down --all (every leftover)

Theory of operation
-------------------
Needs root (``ip netns``, veth, a bridge, mounts). Addresses come from the
benchmarking range 198.18.0.0/15 only: cluster S has the bridge ``kvcIDbr`` at
198.18.S.1/24 in the root namespace, and node k the network namespace
``kvc-ID-nK`` with ``eth0`` at 198.18.S.(10+k), the other end of a veth pair
whose root end (``kvcIDvK``) is a port of the bridge. No default route and no
IPv6: a node reaches the bridge's subnet and nothing else. The test web serves on the
bridge's address (tools/testweb ``address=``), so every node reaches it.

Each node has its own data root, BASE/roots/nK, standing in for its local disk.
The crawl's DIR is the same path on every node (docs/RAY.md, "Where the data
lives"): BASE/data. A holder process (``sleep``) is started per node inside the
node's network namespace and a private mount namespace of its own in which the
node's root is bind-mounted onto BASE/data; ``ray start`` and any command given
to :meth:`Cluster.command` enter both namespaces of that holder (``nsenter``),
so an actor on node k writes under node k's root. In the root namespace
BASE/data stays an empty directory: nothing is mounted there.

``ray start`` binds each node's servers to its address (``--node-ip-address``;
the head on ``--port 6379``), with its own ``--temp-dir`` under BASE/ray, usage
stats off and the cluster's own auth token (tools/rayenv.py). A Ray driver must
run on a node (it attaches to that node's raylet), so a crawl's driver runs on
the head: ``exec BASE 0 -- ...`` or :meth:`Cluster.command`.

:meth:`Cluster.kill_node` is a power cut: the node's link goes down first (so
nothing it would send on dying reaches the others), then every process in its
network namespace gets SIGKILL, then the namespace is deleted.
:meth:`Cluster.start_node` brings a node back: a fresh namespace, the same
address, the same root. ``down`` removes every namespace, link, process and
directory the cluster made, and is idempotent; every name starts with ``kvc``
so ``down --all`` finds what a crashed run left. The state of a cluster is
BASE/cluster.json (BASE is /tmp/kvc-ID).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python tools/cluster.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.rayenv import alive, new_token, ray_env

log = logging.getLogger(__name__)

PREFIX = "kvc"
PARENT = "/tmp"  # BASE is PARENT/kvc-ID: short, for the Unix sockets under Ray's temp dir
RANGE = ipaddress.ip_network("198.18.0.0/15")
HEAD_PORT = 6379
STATE = "cluster.json"
START_TIMEOUT = 240.0  # seconds for one `ray start` on a busy machine
KILL_WAIT = 30.0  # seconds for a namespace's processes to be gone after SIGKILL
# How soon the head's GCS declares a silent node dead: ~17 s (Ray's defaults: ~64 s,
# measured after kill_node): a check every second, 2 s to answer, 5 misses.
HEALTH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "5",
}


class ClusterError(Exception):
    """A step of up/down failed (the message names the command and its error)."""


@dataclass
class Node:
    index: int
    address: str
    netns: str
    veth: str
    root: str  # this node's disk
    temp: str  # its Ray temp dir
    holder: int | None = None  # pid of the process that holds its namespaces


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


def _ray() -> str:
    return os.path.join(os.path.dirname(sys.executable), "ray")


def _used_subnets() -> set[int]:
    """The third octet of every 198.18.S.0/24 an interface of the root namespace has."""
    out = _run("ip", "-4", "-o", "addr", "show").stdout
    used = set()
    for line in out.splitlines():
        cidr = line.split()[3]
        ip = ipaddress.ip_interface(cidr).ip
        if ip in RANGE and ip.packed[1] == 18:
            used.add(ip.packed[2])
    return used


def _no_ipv6(link: str) -> None:
    """No IPv6 on a link of ours (not even link-local): 198.18.0.0/15 is all it carries."""
    switch = Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6")
    if switch.exists():  # absent: no IPv6 in this kernel at all
        switch.write_text("1\n")


def netns_pids(netns: str) -> list[int]:
    done = _run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _empty_netns(netns: str) -> None:
    """SIGKILL every process in ``netns`` until none is left (a raylet may start a
    worker while its siblings are being killed)."""
    deadline = time.monotonic() + KILL_WAIT
    while True:
        pids = [p for p in netns_pids(netns) if alive(p)]
        if not pids:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"{netns}: processes {pids} survived SIGKILL")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


class Cluster:
    """A head (node 0) and workers, each in its network namespace; see the module doc."""

    def __init__(self, base: str, subnet: int, token: str, nodes: list[Node]) -> None:
        self.base = base
        self.subnet = subnet
        self.token = token
        self.nodes = nodes
        self.id = os.path.basename(base).removeprefix(f"{PREFIX}-")
        self.bridge = f"{PREFIX}{self.id}br"
        self.gateway = f"198.18.{subnet}.1"  # the bridge's address: the test web serves here
        self.mount = os.path.join(base, "data")  # the crawl's DIR goes under it, on every node
        self._holders: dict[int, subprocess.Popen[str]] = {}

    # -- making one, finding one ---------------------------------------------------

    @classmethod
    def create(cls, count: int, *, parent: str = PARENT) -> Cluster:
        """A new cluster of ``count`` nodes, nothing started yet (see :meth:`up`)."""
        if count < 1:
            raise ClusterError("a cluster needs at least one node")
        used = _used_subnets()
        free = [s for s in range(1, 255) if s not in used]
        if not free:
            raise ClusterError("every 198.18.S.0/24 is in use")
        # a random free one: two clusters made at the same moment (two test runs on one
        # machine) then rarely pick the same subnet, which nothing here could detect
        subnet = free[int.from_bytes(os.urandom(2), "big") % len(free)]
        while True:
            ident = os.urandom(2).hex()
            base = os.path.join(parent, f"{PREFIX}-{ident}")
            try:
                os.mkdir(base)
                break
            except FileExistsError:
                continue
        nodes = [
            Node(k, f"198.18.{subnet}.{10 + k}", f"{PREFIX}-{ident}-n{k}",
                 f"{PREFIX}{ident}v{k}", os.path.join(base, "roots", f"n{k}"),
                 os.path.join(base, "ray", f"n{k}"))
            for k in range(count)
        ]
        cluster = cls(base, subnet, new_token(), nodes)
        os.makedirs(cluster.mount)
        for n in nodes:
            os.makedirs(n.root)
            os.makedirs(n.temp)
        cluster.save()
        return cluster

    @classmethod
    def load(cls, base: str) -> Cluster:
        with open(os.path.join(base, STATE), encoding="utf-8") as f:
            state = json.load(f)
        return cls(base, state["subnet"], state["token"], [Node(**n) for n in state["nodes"]])

    def save(self) -> None:
        state = {"subnet": self.subnet, "token": self.token, "head": self.head_address,
                 "gateway": self.gateway, "mount": self.mount,
                 "nodes": [asdict(n) for n in self.nodes]}
        tmp = os.path.join(self.base, STATE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, os.path.join(self.base, STATE))

    @property
    def head_address(self) -> str:
        return f"{self.nodes[0].address}:{HEAD_PORT}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a Ray process or driver of this cluster."""
        return {**ray_env(self.token, loopback=False), **HEALTH}

    def command(self, k: int, argv: list[str]) -> list[str]:
        """``argv`` run on node ``k``: in its network namespace and its mount namespace
        (where BASE/data is node k's root). Run it with :attr:`env`."""
        holder = self.nodes[k].holder
        if holder is None or not alive(holder):
            raise ClusterError(f"node {k} is down")
        # --root and --wd: the holder's root and /, which in a chroot (CI's fresh machine)
        # are not the mount namespace's own: entering the namespace alone leaves the chroot
        return ["nsenter", f"--target={holder}", "--mount", "--net", "--root", "--wd=/", "--",
                *argv]

    # -- up and down -------------------------------------------------------------------

    def up(self) -> Cluster:
        """The bridge, then every node (the head first); :meth:`down` on any failure."""
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _no_ipv6(self.bridge)
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for n in self.nodes:
                self.start_node(n.index)
        except BaseException:
            self.down()
            raise
        return self

    def start_node(self, k: int) -> None:
        """Node ``k`` up (again): a fresh namespace at its address, its root mounted at
        BASE/data there, ``ray start`` in it."""
        n = self.nodes[k]
        if n.holder is not None and alive(n.holder):
            raise ClusterError(f"node {k} is up")
        peer = f"{PREFIX}{self.id}p{k}"
        _run("ip", "netns", "add", n.netns)
        _run("ip", "link", "add", n.veth, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", n.netns)
        _no_ipv6(n.veth)
        _run("ip", "netns", "exec", n.netns, "sh", "-c", "for c in all default; do "
             "f=/proc/sys/net/ipv6/conf/$c/disable_ipv6; [ ! -e $f ] || echo 1 > $f; done")
        _run("ip", "link", "set", n.veth, "master", self.bridge, "up")
        inside = ("ip", "-n", n.netns)
        _run(*inside, "link", "set", peer, "name", "eth0")
        _run(*inside, "addr", "add", f"{n.address}/24", "dev", "eth0")
        _run(*inside, "link", "set", "eth0", "up")
        _run(*inside, "link", "set", "lo", "up")
        errors = os.path.join(self.base, f"holder-n{k}.log")
        with open(errors, "w") as err:
            holder = subprocess.Popen(
                ["ip", "netns", "exec", n.netns, "unshare", "--mount", "--propagation",
                 "private", "--", "sh", "-c",
                 'mount --bind "$1" "$2" && echo up && exec sleep infinity',
                 "holder", n.root, self.mount],
                stdout=subprocess.PIPE, stderr=err, start_new_session=True, text=True,
            )
        self._holders[k] = holder  # reaped by kill_node
        assert holder.stdout is not None
        ready = holder.stdout.readline().strip() == "up"
        holder.stdout.close()
        if not ready:
            holder.wait()
            raise ClusterError(f"node {k}: its mount: {Path(errors).read_text().strip()}")
        n.holder = holder.pid
        self.save()
        ray = [_ray(), "start", f"--node-ip-address={n.address}", f"--temp-dir={n.temp}",
               "--num-cpus=1", "--disable-usage-stats", f"--object-store-memory={80 << 20}"]
        if k == 0:
            ray += ["--head", f"--port={HEAD_PORT}", "--include-dashboard=false"]
        else:
            ray += [f"--address={self.head_address}"]
        done = subprocess.run(self.command(k, ray), env=self.env, capture_output=True,
                              text=True, timeout=START_TIMEOUT)
        if done.returncode != 0:
            raise ClusterError(f"node {k}: ray start: {done.stderr.strip()[-2000:]}")
        log.info("node %d up at %s (root %s)", k, n.address, n.root)

    def kill_node(self, k: int) -> None:
        """A power cut of node ``k``: its link down, every process of it SIGKILLed, its
        namespace gone. Idempotent; its root (its disk) is kept."""
        n = self.nodes[k]
        _run("ip", "link", "set", n.veth, "down", check=False)
        if os.path.exists(f"/run/netns/{n.netns}"):
            _empty_netns(n.netns)
            _run("ip", "netns", "del", n.netns)
        _run("ip", "link", "del", n.veth, check=False)  # gone with the namespace, normally
        if n.holder is not None and alive(n.holder):  # a holder outside it: never, but sure
            os.kill(n.holder, signal.SIGKILL)
        held = self._holders.pop(k, None)
        if held is not None:
            held.wait()
        n.holder = None
        if os.path.isdir(self.base):
            self.save()

    def down(self) -> None:
        """Every node killed, the bridge and BASE removed. Idempotent."""
        for n in reversed(self.nodes):
            self.kill_node(n.index)
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def down_all(parent: str = PARENT, *, ident: str = "") -> list[str]:
    """Remove whatever any cluster left (namespaces, links, BASE directories), or only
    cluster ``ident``'s: what ``down --all`` does after a crashed run. Returns what it
    removed."""
    removed = []
    for line in _run("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}-{ident}"):
            _empty_netns(name)
            _run("ip", "netns", "del", name, check=False)
            removed.append(f"netns {name}")
    for line in _run("ip", "-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(f"{PREFIX}{ident}"):
            _run("ip", "link", "del", name, check=False)
            removed.append(f"link {name}")
    for entry in sorted(os.listdir(parent)):
        path = os.path.join(parent, entry)
        if entry.startswith(f"{PREFIX}-{ident}") and os.path.exists(os.path.join(path, STATE)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"dir {path}")
    return removed


def refused() -> str | None:
    """Why this machine cannot make network namespaces (not root, a kernel or container
    that refuses them), or None when it can."""
    if os.geteuid() != 0:
        return "not root"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    try:
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    except FileNotFoundError:
        return "no ip command (iproute2)"
    if made.returncode != 0:
        return made.stderr.strip() or "ip netns add failed"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/cluster.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a head and workers; print the state (JSON)")
    up.add_argument("--nodes", type=int, default=3, help="nodes, the head included")
    down = sub.add_parser("down", help="remove a cluster, or every leftover with --all")
    down.add_argument("base", nargs="?", help="the cluster's directory (/tmp/kvc-ID)")
    down.add_argument("--all", action="store_true", help="every kvc namespace, link and dir")
    run = sub.add_parser("exec", help="run a command on node K with the cluster's env")
    run.add_argument("base")
    run.add_argument("node", type=int)
    run.add_argument("argv", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    try:
        if args.cmd == "up":
            cluster = Cluster.create(args.nodes).up()
            print(Path(cluster.base, STATE).read_text(encoding="utf-8").strip())
        elif args.cmd == "down":
            if args.all:
                for what in down_all():
                    print(f"removed {what}")
            elif args.base:
                Cluster.load(args.base).down()
            else:
                p.error("down needs BASE or --all")
        else:
            cluster = Cluster.load(args.base)
            argv_ = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            return subprocess.run(cluster.command(args.node, argv_), env=cluster.env).returncode
    except (ClusterError, OSError) as exc:
        print(f"cluster: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
