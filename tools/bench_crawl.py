"""Benchmark the crawl engine against Scrapy on a loopback test web (issue 6). Not a test.

Usage (from the repository root; needs nginx: ``apt-get install -y nginx-light``):

    python tools/bench_crawl.py                  # 50,000 pages, 20 hosts, 16 and 64, 3 runs
    python tools/bench_crawl.py --pages 2000 --hosts 5 --concurrency 8 --repeat 1   # a quick look
    python tools/bench_crawl.py --crawlers ours --no-flatness --profile
    python tools/bench_crawl.py --threads-test --crawlers none --no-flatness   # 5,000 threads
    python tools/bench_crawl.py --threads-test --crawlers none --no-flatness --tt-processes 2
    python tools/bench_crawl.py --processes 1,2,3 --crawlers ours,wget --concurrency 64 \
        --repeat 1 --no-flatness          # shards side by side, wget as the C reference
    python tools/bench_crawl.py --processes 2 --crawlers ours,ray --concurrency 64 \
        --repeat 3 --no-flatness          # 2 Ray actors against 2 processes (the [ray] extra)

Method. The fault-free test web (``SiteConfig(pages, hosts, seed=0, crawl_delay=0)``; the
last host is HTTPS) is exported as static files and served by nginx on loopback
(``worker_processes`` from ``--nginx-workers``, default 1: nginx, the crawler and this
script share the machine's cores, and one nginx worker serves static files far faster than
either crawler fetches them). A loopback DNS server (``tools.testweb.dnsserver``) answers
for the hosts: our crawler asks it through ``--nameserver``, Scrapy through a resolver that
queries it with dnspython (``tools/bench_scrapy/spider.py``); both cache one answer per host.

Every run is a fresh process; runs alternate between the crawlers so that drifting load
hits both. Same rules for both: robots.txt obeyed, no delay, total concurrency N (ours:
``--threads N``, Scrapy: ``CONCURRENT_REQUESTS=N``), per-host concurrency ``--per-host``
(default N // 4, the same for both), unlimited depth, every test host in scope. Scrapy
stores nothing (it counts responses; AutoThrottle, cookies and the telnet console off); our
crawler stores every page in MainDB as it always does (zlib-compressed bodies): it does
more work per page. Scrapy runs in a benchmark-only venv (``--scrapy-venv``, created with
``python -m venv`` + ``pip install scrapy dnspython`` on first use).

Ours runs once per ``--processes`` value (default: the CPUs; ``--threads`` is the total
over the shards). wget (``--crawlers ...,wget``) is the single-threaded C reference: one
connection, robots.txt obeyed, every test host spanned, reaching nginx as an HTTP proxy
for both schemes (so it never resolves a name: the HTTPS host is out of its reach and
counts against its oracle share); it runs once per repeat, at concurrency 1.

Reported per crawler, process count and concurrency (medians over ``--repeat`` runs):
  pages/s        responses fetched (any status, robots.txt excluded) / crawl seconds
                 (ours: the engine's run time from its summary line; Scrapy: its
                 elapsed_time_seconds); interpreter start-up is outside both
  peak RSS       ours: the largest sum of VmRSS over the whole process tree (supervisor
                 and shards), polled from /proc while it runs; peers: VmHWM of the process
                 (``ru_maxrss`` would be floored at this script's RSS: Linux carries the
                 parent's high-water mark across fork + exec)
  CPU ms/page    (user + system CPU of the process and the children it reaped: the
                 shards) / responses fetched
  oracle share   |fetched URLs ∩ oracle| / |oracle|, oracle = ``web.oracle.crawl()`` with robots
                 obeyed (ours: the URLs of MainDB records with a response; Scrapy: every
                 response off the wire, from its ``response_downloaded`` signal)
Memory flatness: our peak RSS with ``--max-pages`` at pages/2 and pages (fresh processes,
the largest concurrency), and their ratio. ``--threads-test`` runs tools/measure_crawl.py
with 5,000 threads against a slow Python test web (1 s per page) and compares pages/s with
the ideal (threads / latency, capped by one core at our measured CPU per page: the GIL).
``--profile`` runs our crawler once under py-spy (all threads; cProfile sees only the main
thread) and prints the top self and cumulative entries.

Output: a markdown table on stdout (progress on stderr) and JSON (``--out``, default
``bench-results/crawl-<timestamp>.json``, git-ignored) with keys ``machine``, ``config``,
``oracle``, ``runs``, ``summary``, ``ratios``, ``flatness``, ``threads_test``, ``profile``.
Nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

import kvstore
from crawler.state.pages import decode_page
from crawler.state.shards import shard_dirs
from tools.measure_crawl import crawl_command
from tools.testweb.dnsserver import DNSServer
from tools.testweb.export import export
from tools.testweb.graph import Graph, SiteConfig
from tools.testweb.oracle import Oracle
from tools.testweb.site import Site
from tools.testweb.urls import normalize

if TYPE_CHECKING:
    from tools.testweb import TestWeb

log, child_env, free_port = bu.log, bu.child_env, bu.free_port

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = Path.home() / ".cache" / "kvcrawl-bench" / "scrapy-venv"
RUN_TIMEOUT = 3600.0  # one crawl; a hung crawler is killed and the run reported as failed





@dataclass
class _Web:
    """What ``crawl_command`` reads from a TestWeb, for the nginx-served export."""

    seed_url: str
    nameserver: tuple[str, int]
    ca_file: Path


class ServedSite:
    """The exported site under nginx plus a loopback DNS server; a context manager."""

    def __init__(
        self,
        workdir: Path,
        config: SiteConfig,
        nginx_workers: str,
        ours_env: dict[str, str] | None = None,
        address: str = "127.0.0.1",
    ) -> None:
        self.dir = workdir / "site"
        self.address = address  # nginx and the DNS server listen here; every host is here
        self.ours_env = ours_env or {}  # extra environment of our crawler (experiments)
        self.config = config
        self.nginx_workers = nginx_workers
        self.http_port, self.https_port = free_port(), free_port()
        self.hosts = [f"h{i}.test" for i in range(config.hosts)]
        self._nginx: subprocess.Popen[bytes] | None = None
        self.dns = DNSServer(dict.fromkeys(self.hosts, address), host=address, port=0)

    def __enter__(self) -> ServedSite:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            raise SystemExit(
                "bench_crawl: nginx not found: apt-get update && apt-get install -y nginx-light"
            )
        started = time.monotonic()
        graph = Graph(self.config)
        conf = export(graph, self.dir, http_port=self.http_port, https_port=self.https_port,
                      address=self.address)
        text = conf.read_text().replace(
            "worker_processes auto;", f"worker_processes {self.nginx_workers};"
        )
        conf.write_text(text)
        log(f"exported {self.config.pages} pages in {time.monotonic() - started:.1f} s")
        directives = "daemon off;" + (" user root;" if os.geteuid() == 0 else "")
        cmd = [nginx, "-p", str(self.dir), "-c", "nginx.conf", "-g", directives]
        check = subprocess.run([*cmd, "-t"], capture_output=True, text=True, check=False)
        if check.returncode != 0:
            raise SystemExit(f"bench_crawl: nginx -t failed: {check.stderr.strip()}")
        self._nginx = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        self._wait_listening()
        self.dns.start()
        site = Site(
            graph, http_port=self.http_port, https_port=self.https_port if self.config.tls else None
        )
        self.seed_url = site.seed_url
        self.oracle = Oracle(site).crawl(obey_robots=True)
        log(
            f"nginx on {self.address}:{self.http_port}/{self.https_port}, dns {self.dns.address}; "
            f"oracle: {len(self.oracle.fetched)} URLs"
        )
        return self

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self._nginx is not None
            if self._nginx.poll() is not None:
                raise SystemExit(f"bench_crawl: nginx exited ({self._nginx.returncode})")
            try:
                socket.create_connection((self.address, self.http_port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("bench_crawl: nginx did not start listening")

    def __exit__(self, *exc: object) -> None:
        self.dns.stop()
        if self._nginx is not None and self._nginx.poll() is None:
            self._nginx.send_signal(signal.SIGQUIT)  # graceful stop of the master we started
            try:
                self._nginx.wait(10)
            except subprocess.TimeoutExpired:
                self._nginx.kill()
                self._nginx.wait()

    @property
    def web(self) -> _Web:
        return _Web(self.seed_url, self.dns.address, self.dir / "tls" / "ca.pem")

    def share(self, urls: set[str]) -> float:
        want = self.oracle.fetched
        return len(urls & want) / max(1, len(want))


def canonical(urls: Iterable[str]) -> set[str]:
    """The testweb's canonical form of each URL (one normalizer for both crawlers)."""
    return {c for c in map(normalize, urls) if c is not None}


# -- the two crawlers --------------------------------------------------------------------


def run_ours(
    site: ServedSite,
    work: Path,
    n: int,
    per_host: int,
    max_pages: int | None,
    tag: str,
    wrapper: list[str] | None = None,
    processes: int = 1,
    ray: bool = False,
) -> dict[str, Any]:
    tag = f"{'ray' if ray else 'p'}{processes}-{tag}"
    data = work / f"ours-{tag}"
    shutil.rmtree(data, ignore_errors=True)
    web = cast("TestWeb", site.web)  # crawl_command reads seed_url, nameserver and ca_file only
    # ray: a private one-machine cluster started by the crawl (--ray local), its start-up
    # outside crawl_s as the interpreter's is; its servers are in the process tree
    shards = ["--ray", "local", "--shards"] if ray else ["--processes"]
    opts = ["--threads", str(n), "--per-host", str(per_host), "--delay", "0", "--timeout", "30",
            *shards, str(processes)]
    cmd = crawl_command(web, data, *opts, "--quiet")
    if max_pages:
        cmd += ["--max-pages", str(max_pages)]
    out, err = work / f"ours-{tag}.out", work / f"ours-{tag}.err"
    load = bu.loadavg()
    m = bu.run_measured(
        [*(wrapper or []), *cmd],
        cwd=REPO,
        env={**child_env(), **site.ours_env},
        timeout=RUN_TIMEOUT,
        stdout_path=out,
        stderr_path=err,
    )
    said = bu.crawl_summary(out.read_text())
    if m["returncode"] != 0 or said is None:
        raise bu.WorkerError(f"our crawler failed ({m['returncode']}): {err.read_text()[-2000:]}")
    summary = said[1]
    urls: list[str] = []
    for shard in shard_dirs(str(data)):
        with kvstore.open(os.path.join(shard, "main"), readonly=True) as main:
            for k in main:
                rec = decode_page(main[k], with_body=False)
                if rec.status:
                    urls.append(rec.url)
    shutil.rmtree(data, ignore_errors=True)
    fetched = int(summary["fetched"])
    return {
        **m,
        # the whole process tree (supervisor and shards) at its largest
        "peak_rss_bytes": m["tree_peak_rss_bytes"],
        "main_peak_rss_bytes": m["peak_rss_bytes"],
        "crawler": "ours-ray" if ray else "ours",
        "processes": processes,
        "concurrency": n,
        "per_host": per_host,
        "max_pages": max_pages,
        "fetched": fetched,
        "crawl_s": summary["seconds"],
        "complete": summary["complete"],
        "pages_per_s": fetched / max(1e-9, float(summary["seconds"])),
        "cpu_s_per_page": m["cpu_s"] / max(1, fetched),
        "oracle_share": site.share(canonical(urls)),
        "outcomes": summary["outcomes"],
        "load_before": load,
        "git": bu.git_revision(REPO),
    }


def run_wget(site: ServedSite, work: Path, tag: str) -> dict[str, Any]:
    """wget's recursive crawl of the same site: single-threaded C, one connection, robots.txt
    obeyed, every test host spanned. wget cannot use our DNS server, so it reaches the
    hosts through nginx as an HTTP proxy (nginx serves absolute-form requests by their
    host): the HTTPS host is out of its reach (it would need CONNECT, which nginx refuses),
    a share it misses. Both proxies point at nginx and no_proxy is unset, so wget never
    resolves a name itself: nothing leaves loopback."""
    wget = shutil.which("wget")
    if wget is None:
        raise bu.WorkerError("wget is not installed (apt-get install -y wget)")
    files = work / f"wget-{tag}"
    shutil.rmtree(files, ignore_errors=True)
    proxy = f"http://127.0.0.1:{site.http_port}/"
    cmd = [
        wget, "--recursive", "--level=inf", "--span-hosts", "--domains=" + ",".join(site.hosts),
        "-e", "robots=on", "-e", "use_proxy=yes", "-e", f"http_proxy={proxy}",
        "-e", f"https_proxy={proxy}", "-e", "no_proxy=",
        "--no-verbose", "--delete-after", "--tries=1", "--timeout=30",
        "--directory-prefix", str(files), site.seed_url,
    ]
    out, err = work / f"wget-{tag}.out", work / f"wget-{tag}.err"
    load = bu.loadavg()
    env = {k: v for k, v in child_env().items() if k.lower() != "no_proxy"}
    m = bu.run_measured(cmd, cwd=work, env=env, timeout=RUN_TIMEOUT,
                        stdout_path=out, stderr_path=err)
    urls: list[str] = []
    statuses: Counter[str] = Counter()
    for line in err.read_text(errors="replace").splitlines():
        # "2024-01-01 12:00:00 URL:http://h0.test:8080/p/1 [1234/1234] -> "..." [1]"
        # and "http://h0.test:8080/x: 2024-01-01 12:00:00 ERROR 404: Not Found."
        if " URL:" in line:
            url = line.split(" URL:", 1)[1].split(" ", 1)[0]
            statuses["200"] += 1
        elif " ERROR " in line and line.startswith("http"):
            url = line.split(": ", 1)[0]
            statuses[line.rsplit(" ERROR ", 1)[1].split(":", 1)[0]] += 1
        else:
            continue
        if not url.endswith("/robots.txt"):
            urls.append(url)
    shutil.rmtree(files, ignore_errors=True)
    fetched = len(urls)
    return {
        **m,
        "crawler": "wget",
        "processes": 1,
        "concurrency": 1,
        "per_host": 1,
        "max_pages": None,
        "fetched": fetched,
        "crawl_s": m["wall_s"],
        "complete": m["returncode"] in (0, 4, 8),  # 8: some server said 404 (expected)
        "pages_per_s": fetched / max(1e-9, m["wall_s"]),
        "cpu_s_per_page": m["cpu_s"] / max(1, fetched),
        "oracle_share": site.share(canonical(urls)),
        "outcomes": dict(statuses),
        "load_before": load,
        "git": bu.git_revision(REPO),
    }


def ensure_scrapy(venv: Path, install: bool) -> Path | None:
    """The venv's python, created on first use; None if missing and ``install`` is off."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import scrapy, dns"]
    if py.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return py
    if not install:
        return None
    log(f"creating the Scrapy venv in {venv} (python -m venv; pip install scrapy dnspython)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "scrapy", "dnspython"], check=True)
    return py


def run_scrapy(
    site: ServedSite, work: Path, py: Path, n: int, per_host: int, max_pages: int | None, tag: str
) -> dict[str, Any]:
    urls_path = work / f"scrapy-{tag}.urls"
    ns = "{}:{}".format(*site.dns.address)
    cmd = [
        str(py),
        "-m",
        "tools.bench_scrapy.run",
        "--seed",
        site.seed_url,
        "--hosts",
        ",".join(site.hosts),
        "--nameserver",
        ns,
        "--concurrency",
        str(n),
        "--per-host",
        str(per_host),
        "--urls",
        str(urls_path),
    ]
    if max_pages:
        cmd += ["--max-pages", str(max_pages)]
    out, err = work / f"scrapy-{tag}.out", work / f"scrapy-{tag}.err"
    load = bu.loadavg()
    m = bu.run_measured(
        cmd, cwd=REPO, env=child_env(), timeout=RUN_TIMEOUT, stdout_path=out, stderr_path=err
    )
    lines = out.read_text().splitlines()
    if m["returncode"] != 0 or not lines:
        raise bu.WorkerError(f"scrapy failed ({m['returncode']}): {err.read_text()[-2000:]}")
    stats = json.loads(lines[-1])["stats"]
    fetched = int(stats.get("downloader/response_count", 0)) - int(
        stats.get("robotstxt/response_count", 0)
    )
    with open(urls_path, encoding="utf-8") as f:
        urls = canonical(u for u in f.read().splitlines() if not u.endswith("/robots.txt"))
    urls_path.unlink()
    crawl_s = float(stats.get("elapsed_time_seconds", m["wall_s"]))
    statuses = {
        k.rsplit("/", 1)[1]: v
        for k, v in stats.items()
        if k.startswith("downloader/response_status_count/")
    }
    return {
        **m,
        "crawler": "scrapy",
        "processes": 1,
        "concurrency": n,
        "per_host": per_host,
        "max_pages": max_pages,
        "fetched": fetched,
        "crawl_s": round(crawl_s, 1),
        "complete": stats.get("finish_reason") == "finished",
        "pages_per_s": fetched / max(1e-9, crawl_s),
        "cpu_s_per_page": m["cpu_s"] / max(1, fetched),
        "oracle_share": site.share(urls),
        "outcomes": statuses,
        "load_before": load,
        "git": bu.git_revision(REPO),
    }


# -- summaries ----------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int, int, int | None], list[dict[str, Any]]] = {}
    for r in runs:
        key = (r["crawler"], r.get("processes", 1), r["concurrency"], r["max_pages"])
        groups.setdefault(key, []).append(r)
    out = []
    for (crawler, processes, n, max_pages), rs in groups.items():
        out.append(
            {
                "crawler": crawler,
                "processes": processes,
                "concurrency": n,
                "per_host": rs[0]["per_host"],
                "max_pages": max_pages,
                "runs": len(rs),
                "fetched": bu.median([r["fetched"] for r in rs]),
                "pages_per_s": bu.median([r["pages_per_s"] for r in rs]),
                "peak_rss_bytes": bu.median([r["peak_rss_bytes"] for r in rs]),
                "cpu_s_per_page": bu.median([r["cpu_s_per_page"] for r in rs]),
                "oracle_share": bu.median([r["oracle_share"] for r in rs]),
            }
        )
    return out


def ratios(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours (each process count) against each peer: Scrapy at the same concurrency,
    wget (one connection: its only setting) at any."""
    full = [s for s in summary if s["max_pages"] is None]
    out = []
    for ours in sorted((s for s in full if s["crawler"] == "ours"),
                       key=lambda s: (s["concurrency"], s["processes"])):
        n = ours["concurrency"]
        for peer in full:
            if peer["crawler"] == "scrapy" and peer["concurrency"] != n:
                continue
            if peer["crawler"] not in ("scrapy", "wget"):
                continue
            out.append(_ratio(ours, peer))
    return out


def _ratio(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    return {
        "concurrency": ours["concurrency"],
        "processes": ours["processes"],
        "peer": peer["crawler"],
        "pages_per_s": ours["pages_per_s"] / max(1e-9, peer["pages_per_s"]),
        "peak_rss": ours["peak_rss_bytes"] / max(1, peer["peak_rss_bytes"]),
        "cpu_s_per_page": ours["cpu_s_per_page"] / max(1e-12, peer["cpu_s_per_page"]),
        "oracle_share": ours["oracle_share"] / max(1e-9, peer["oracle_share"]),
    }


def tables(result: dict[str, Any]) -> str:
    parts = []
    rows = [
        [
            s["crawler"],
            str(s.get("processes", 1)),
            str(s["concurrency"]),
            str(s["per_host"]),
            f"{s['fetched']:.0f}",
            f"{s['pages_per_s']:.0f}",
            bu.fmt_bytes(s["peak_rss_bytes"]),
            f"{s['cpu_s_per_page'] * 1e3:.2f}",
            f"{s['oracle_share']:.4f}",
            str(s["runs"]),
        ]
        for s in result["summary"]
        if s["max_pages"] is None
    ]
    if rows:
        parts.append(
            bu.markdown_table(
                [
                    "crawler",
                    "processes",
                    "concurrency",
                    "per host",
                    "fetched",
                    "pages/s",
                    "peak RSS",
                    "CPU ms/page",
                    "oracle share",
                    "runs",
                ],
                rows,
            )
        )
    if result["ratios"]:
        parts.append(
            bu.markdown_table(
                [
                    "ours: concurrency",
                    "processes",
                    "peer",
                    "pages/s ours/peer",
                    "peak RSS ours/peer",
                    "CPU/page ours/peer",
                    "oracle share ours/peer",
                ],
                [
                    [
                        str(r["concurrency"]),
                        str(r["processes"]),
                        r["peer"],
                        f"{r['pages_per_s']:.2f}x",
                        f"{r['peak_rss']:.2f}x",
                        f"{r['cpu_s_per_page']:.2f}x",
                        f"{r['oracle_share']:.3f}x",
                    ]
                    for r in result["ratios"]
                ],
            )
        )
    fl = result.get("flatness")
    if fl:
        rows = [
            [
                str(p["max_pages"]),
                f"{p['fetched']:.0f}",
                bu.fmt_bytes(p["peak_rss_bytes"]),
                str(p["runs"]),
            ]
            for p in fl["points"]
        ]
        parts.append(
            bu.markdown_table(["ours --max-pages", "fetched", "peak RSS", "runs"], rows)
            + f"\n\nRSS({fl['points'][-1]['max_pages']}) / RSS({fl['points'][0]['max_pages']})"
            f" = {fl['ratio']:.3f}"
        )
    tt = result.get("threads_test")
    if tt:
        parts.append(
            bu.markdown_table(
                [
                    "threads",
                    "latency s",
                    "fetched",
                    "pages/s",
                    "ideal pages/s",
                    "achieved/ideal",
                    "peak RSS",
                ],
                [
                    [
                        str(tt["threads"]),
                        str(tt["slow"]),
                        str(tt["fetched"]),
                        f"{tt['pages_per_s']:.0f}",
                        f"{tt['ideal_pages_per_s']:.0f}",
                        f"{tt['achieved_over_ideal']:.2f}",
                        bu.fmt_bytes(tt["peak_rss_bytes"]),
                    ]
                ],
            )
        )
    prof = result.get("profile")
    if prof:
        for kind in ("self", "cumulative"):
            parts.append(
                f"py-spy, top {kind} ({prof['samples']} samples)\n\n"
                + bu.markdown_table(
                    ["%", "function"],
                    [[f"{100 * c / max(1, prof['samples']):.1f}", f] for f, c in prof[kind]],
                )
            )
    return "\n\n".join(parts)


# -- extras: flatness, 5,000 threads, profile ---------------------------------------------------


def flatness(
    site: ServedSite, work: Path, points: list[int], n: int, per_host: int, repeat: int,
    processes: int = 1,
) -> dict[str, Any]:
    runs = [
        run_ours(site, work, n, per_host, p, f"flat-{p}-{i}", processes=processes)
        for i in range(repeat)
        for p in points
    ]
    for r in runs:
        log(f"  flatness --max-pages {r['max_pages']}: {bu.fmt_bytes(r['peak_rss_bytes'])}")
    pts = []
    for p in points:
        rs = [r for r in runs if r["max_pages"] == p]
        pts.append(
            {
                "max_pages": p,
                "runs": len(rs),
                "fetched": bu.median([r["fetched"] for r in rs]),
                "peak_rss_bytes": bu.median([r["peak_rss_bytes"] for r in rs]),
            }
        )
    return {
        "concurrency": n,
        "processes": processes,
        "points": pts,
        "runs": runs,
        "ratio": pts[-1]["peak_rss_bytes"] / max(1, pts[0]["peak_rss_bytes"]),
    }


def threads_test(
    args: argparse.Namespace, work: Path, cpu_s_per_page: float | None
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(REPO / "tools" / "measure_crawl.py"),
        "--pages",
        str(args.tt_pages),
        "--hosts",
        str(args.tt_hosts),
        "--threads",
        str(args.tt_threads),
        "--per-host",
        "5",
        "--slow",
        str(args.tt_slow),
        "--max-pages",
        str(args.tt_max_pages),
        "--processes",
        str(args.tt_processes),
    ]
    out, err = work / "threads.out", work / "threads.err"
    log("threads test: " + " ".join(cmd[1:]))
    m = bu.run_measured(
        cmd, cwd=REPO, env=child_env(), timeout=RUN_TIMEOUT, stdout_path=out, stderr_path=err
    )
    if m["returncode"] != 0:
        raise bu.WorkerError(f"measure_crawl failed: {err.read_text()[-2000:]}")
    r = json.loads(out.read_text())
    # measure_crawl's peak_rss_mb is ru_maxrss, floored at its own (test web) RSS; the
    # crawler's VmHWM, polled while it runs, is its true peak.
    # the supervisor and its shards (the sum of their peaks bounds the tree's peak)
    crawler_rss = [
        sum(d["peak_rss_bytes"] for d in m["descendants"]
            if "crawler start" in d["cmd"] or "crawler.run.shard" in d["cmd"])
    ]
    per_page = cpu_s_per_page or r["cpu_s"] / max(1, r["fetched"])
    # the CPU bound: one core per shard process (each has its own GIL), at most the cores
    cores = min(args.tt_processes, os.cpu_count() or 1)
    ideal = min(args.tt_threads / args.tt_slow, cores / per_page)
    return {
        "threads": args.tt_threads,
        "processes": args.tt_processes,
        "slow": args.tt_slow,
        "pages": args.tt_pages,
        "hosts": args.tt_hosts,
        "fetched": r["fetched"],
        "pages_per_s": r["pages_per_s"],
        "latency_bound": args.tt_threads / args.tt_slow,
        "cpu_bound": cores / per_page,
        "cpu_s_per_page_used": per_page,
        "ideal_pages_per_s": ideal,
        "achieved_over_ideal": r["pages_per_s"] / ideal,
        "peak_rss_bytes": max(crawler_rss) or int(r["peak_rss_mb"] * 1024 * 1024),
        "cpu_s_per_page": r["cpu_s"] / max(1, r["fetched"]),
        "measure_crawl": r,
    }


def _frame_name(frame: str) -> str:
    """``func (path:line)`` -> ``func (path)``: aggregate a function over its lines."""
    name, _, where = frame.rpartition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if name else frame


def profile(
    site: ServedSite, work: Path, n: int, per_host: int, top: int, processes: int = 1
) -> dict[str, Any] | None:
    spy = shutil.which("py-spy")
    if spy is None:
        log("profile: py-spy is not installed (pip install py-spy); skipped")
        return None
    raw = work / "pyspy.txt"
    wrapper = [spy, "record", "--format", "raw", "--rate", "200", "-o", str(raw)]
    if processes > 1:
        wrapper.append("--subprocesses")  # the shards are where the crawling happens
    run = run_ours(site, work, n, per_host, None, "profile", wrapper=[*wrapper, "--"],
                   processes=processes)
    self_c: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame_name(f) for f in stack.split(";")]
        samples += int(count)
        self_c[frames[-1]] += int(count)
        for f in set(frames):
            cum[f] += int(count)
    return {
        "concurrency": n,
        "samples": samples,
        "pages_per_s_under_profiler": run["pages_per_s"],
        "fetched": run["fetched"],
        "self": self_c.most_common(top),
        "cumulative": cum.most_common(top),
    }


def compare(
    site: ServedSite,
    work: Path,
    args: argparse.Namespace,
    conc: list[int],
    crawlers: list[str],
    py: Path | None,
) -> list[dict[str, Any]]:
    """Every crawler at every concurrency (ours at every process count), ``--repeat``
    times, alternating crawlers; wget (one connection, nothing to vary) once a repeat."""
    runs = []
    for i in range(args.repeat):
        if "wget" in crawlers:
            runs.append(_logged("wget", 1, i, run_wget(site, work, f"{i}")))
        for n in conc:
            per_host = args.per_host or max(1, n // 4)
            for c in crawlers:
                tag = f"{n}-{i}"
                if c in ("ours", "ray"):
                    for p in args.process_counts:
                        r = run_ours(site, work, n, per_host, None, tag, processes=p,
                                     ray=c == "ray")
                        name = f"ours --ray local --shards {p}" if c == "ray" else f"ours -p{p}"
                        runs.append(_logged(name, n, i, r))
                elif c == "scrapy":
                    assert py is not None
                    r = run_scrapy(site, work, py, n, per_host, None, tag)
                    runs.append(_logged(c, n, i, r))
    return runs


def _logged(name: str, n: int, i: int, r: dict[str, Any]) -> dict[str, Any]:
    log(
        f"{name} n={n} run {i + 1}: {r['fetched']} fetched, "
        f"{r['pages_per_s']:.0f} pages/s, rss {bu.fmt_bytes(r['peak_rss_bytes'])}, "
        f"cpu {r['cpu_s_per_page'] * 1e3:.2f} ms/page, share {r['oracle_share']:.4f}, "
        f"load {r['load_before']}"
    )
    return r


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=50_000)
    p.add_argument("--hosts", type=int, default=20)
    p.add_argument("--concurrency", default="16,64", help="comma-separated total concurrencies")
    p.add_argument("--per-host", type=int, help="per-host concurrency (default: concurrency // 4)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--crawlers", default="ours,scrapy",
        help="ours, ray (ours on a local Ray cluster, --processes as shard counts), scrapy, "
        "wget, both (ours,scrapy), none"
    )
    p.add_argument(
        "--processes",
        default=str(os.cpu_count() or 1),
        help="ours: comma-separated --processes values, side by side (default: the CPUs)",
    )
    p.add_argument("--scrapy-venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--no-install", action="store_true", help="never create the Scrapy venv")
    p.add_argument("--nginx-workers", default="1", help="nginx worker_processes (1 or auto)")
    p.add_argument(
        "--ours-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for our crawler, e.g. MALLOC_ARENA_MAX=2 (repeatable)",
    )
    p.add_argument("--no-flatness", action="store_true")
    p.add_argument("--flatness-points", help="--max-pages values (default: pages/2,pages)")
    p.add_argument(
        "--flatness-processes",
        type=int,
        help="ours: --processes of the flatness and profile runs (default: the last --processes)",
    )
    p.add_argument("--profile", action="store_true", help="one run of ours under py-spy")
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument("--threads-test", action="store_true", help="the 5,000-thread slow-site run")
    p.add_argument("--tt-threads", type=int, default=5000)
    p.add_argument("--tt-pages", type=int, default=20_000)
    p.add_argument("--tt-hosts", type=int, default=1000)
    p.add_argument("--tt-slow", type=float, default=1.0)
    p.add_argument("--tt-max-pages", type=int, default=10_000)
    p.add_argument("--tt-processes", type=int, default=1,
                   help="shards of the threads test (--tt-threads is their total)")
    p.add_argument(
        "--workdir",
        type=Path,
        default=REPO / "bench-results",
        help="parent of the temporary site and crawl directories",
    )
    p.add_argument(
        "--out", type=Path, help="JSON path (default bench-results/crawl-<timestamp>.json)"
    )
    return p.parse_args(argv)


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: the crawler, nginx and the work dir are cleaned up


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    conc = [int(x) for x in args.concurrency.split(",") if x.strip()]
    args.process_counts = [int(x) for x in args.processes.split(",") if x.strip()]
    extra_processes = args.flatness_processes or args.process_counts[-1]
    crawlers = {"both": ["ours", "scrapy"], "none": []}.get(args.crawlers, args.crawlers.split(","))
    py = None
    if "scrapy" in crawlers:
        py = ensure_scrapy(args.scrapy_venv, not args.no_install)
        if py is None:
            log(f"no Scrapy venv at {args.scrapy_venv} and --no-install: Scrapy skipped")
            crawlers.remove("scrapy")
    args.workdir.mkdir(parents=True, exist_ok=True)
    out_path = args.out or REPO / "bench-results" / f"crawl-{bu.timestamp()}.json"
    config = SiteConfig(pages=args.pages, hosts=args.hosts, seed=0, crawl_delay=0.0)
    result: dict[str, Any] = {
        "machine": {
            **bu.machine_info(("numpy", "lxml", "requests")),
            "load_start": bu.loadavg(),
            "git_start": bu.git_revision(REPO),
            "nginx_worker_processes": args.nginx_workers,
        },
        "config": {
            "pages": args.pages,
            "hosts": args.hosts,
            "concurrency": conc,
            "repeat": args.repeat,
            "crawlers": crawlers,
            "processes": args.process_counts,
            "per_host": args.per_host,
            "ours_env": args.ours_env,
        },
        "runs": [],
        "summary": [],
        "ratios": [],
        "flatness": None,
        "threads_test": None,
        "profile": None,
    }
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="crawl-work-") as tmp:
        work = Path(tmp)
        if crawlers or not args.no_flatness or args.profile:
            ours_env = dict(kv.split("=", 1) for kv in args.ours_env)
            with ServedSite(work, config, args.nginx_workers, ours_env) as site:
                result["oracle"] = {
                    "fetched": len(site.oracle.fetched),
                    "robots": len(site.oracle.robots),
                    "blocked": len(site.oracle.blocked),
                }
                result["runs"] = compare(site, work, args, conc, crawlers, py)
                result["summary"] = summarize(result["runs"])
                result["ratios"] = ratios(result["summary"])
                n = max(conc)
                per_host = args.per_host or max(1, n // 4)
                if not args.no_flatness:
                    pts = (
                        [int(x) for x in args.flatness_points.split(",")]
                        if args.flatness_points
                        else [args.pages // 2, args.pages]
                    )
                    result["flatness"] = flatness(
                        site, work, pts, n, per_host, args.repeat, extra_processes
                    )
                if args.profile:
                    result["profile"] = profile(
                        site, work, n, per_host, args.profile_top, extra_processes
                    )
        if args.threads_test:
            ours = [
                s for s in result["summary"] if s["crawler"] == "ours" and s["max_pages"] is None
            ]
            cpu = max(ours, key=lambda s: s["concurrency"])["cpu_s_per_page"] if ours else None
            result["threads_test"] = threads_test(args, work, cpu)
    result["machine"]["load_end"] = bu.loadavg()
    result["machine"]["git_end"] = bu.git_revision(REPO)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(tables(result))
    m = result["machine"]
    print(f"\nload (1/5/15 min): start {m['load_start']}, end {m['load_end']}")
    log(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
