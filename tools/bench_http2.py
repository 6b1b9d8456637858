"""Benchmark a crawl over TLS with HTTP/1.1 against the same crawl with ``--http2``
(issue 29). Not a test.

Usage (from the repository root; needs Debian's nginx: ``apt-get install -y nginx-light``)::

    python tools/bench_http2.py --pages 5000 --hosts 10 --repeat 3

The test web is exported with every host on https (``listen ... ssl http2``) and served
by nginx on loopback; the test web's DNS server gives the names. ``python -m crawler
start`` crawls it whole, one process (``--processes 1``), ``--threads`` threads,
``--per-host`` connections a host, no delay, once with HTTP/1.1 and once with
``--http2``, alternating, ``--repeat`` times. Reported per mode: pages/s and CPU ms per
page of the crawler process (user + system, from wait4), peak RSS, medians of the runs,
and nginx's count of requests by protocol (so h2 was really spoken). JSON goes to
``--out`` (default bench-results/http2-<timestamp>.json).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import _benchutil as bu  # noqa: E402
from tools.measure_crawl import crawl_command  # noqa: E402
from tools.testweb import SiteConfig, TestWeb  # noqa: E402
from tools.testweb.export import ACCESS_FIELDS, export, nginx_serving  # noqa: E402
from tools.testweb.graph import Graph  # noqa: E402
from tools.testweb.site import Site  # noqa: E402

MODES = ("https1", "h2")


def crawl_once(args: argparse.Namespace, web: TestWeb, site: Site, root: Path, work: Path,
               mode: str, n: int) -> dict[str, Any]:
    data = work / f"crawl-{mode}-{n}"
    log_path = root / "logs/access.log"
    log_path.write_bytes(b"")  # nginx appends: this run's requests only
    cmd = crawl_command(web, data, "--ca-bundle", str(root / "tls/ca.pem"), "--processes", "1",
                        "--threads", str(args.threads), "--per-host", str(args.per_host),
                        "--delay", "0", "--sitemaps", "off", "--quiet",
                        *(["--http2"] if mode == "h2" else []))
    cmd[cmd.index(web.seed_url)] = site.seed_url
    run = bu.run_measured(cmd, cwd=REPO, env=bu.child_env(), timeout=3600,
                          stderr_path=work / f"crawl-{mode}-{n}.err")
    if run["returncode"] != 0:
        err = (work / f"crawl-{mode}-{n}.err").read_text()[-500:]
        raise SystemExit(f"bench_http2: the {mode} crawl failed: {err}")
    protocols: collections.Counter[str] = collections.Counter()
    for line in log_path.read_text().splitlines():
        protocols[dict(zip(ACCESS_FIELDS, line.split("\t"), strict=False))["$server_protocol"]] += 1
    pages = sum(protocols.values())
    shutil.rmtree(data, ignore_errors=True)
    return {"mode": mode, "requests": pages, "protocols": dict(protocols),
            "wall_s": run["wall_s"], "cpu_s": run["cpu_s"],
            "pages_per_s": pages / max(run["wall_s"], 1e-9),
            "cpu_ms_per_page": 1e3 * run["cpu_s"] / max(pages, 1),
            "peak_rss": run["peak_rss_bytes"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=5000)
    p.add_argument("--hosts", type=int, default=10)
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--per-host", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", help="parent of the temporary directory")
    p.add_argument("--out", help="JSON path (default bench-results/http2-<timestamp>.json)")
    args = p.parse_args()
    if shutil.which("nginx") is None:
        raise SystemExit("bench_http2: nginx not found: apt-get install -y nginx-light")
    config = SiteConfig(pages=args.pages, hosts=args.hosts, seed=11, crawl_delay=0.0,
                        tls_hosts=tuple(range(args.hosts)))
    work = Path(tempfile.mkdtemp(prefix="bench-http2-", dir=args.workdir))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    web = TestWeb(config).start()  # its DNS server: the names on 127.0.0.1
    try:
        http_port, https_port = bu.free_port(), bu.free_port()
        root = work / "site"
        export(Graph(config), root, http_port=http_port, https_port=https_port,
               access_log=True, http2=True)
        site = Site(Graph(config), http_port=http_port, https_port=https_port)
        with nginx_serving(root, https_port):
            for rep in range(args.repeat):
                for mode in MODES:
                    r = crawl_once(args, web, site, root, work, mode, rep)
                    runs[mode].append(r)
                    bu.log(f"run {rep + 1} {mode}: {r['requests']} requests "
                           f"{r['pages_per_s']:.0f}/s {r['cpu_ms_per_page']:.3f} ms/page "
                           f"rss {r['peak_rss'] / 1e6:.0f} MB {r['protocols']}")
    finally:
        web.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = {m: {"pages_per_s": bu.median([r["pages_per_s"] for r in rs]),
                   "cpu_ms_per_page": bu.median([r["cpu_ms_per_page"] for r in rs]),
                   "peak_rss": bu.median([r["peak_rss"] for r in rs])}
               for m, rs in runs.items()}
    base, h2 = summary["https1"], summary["h2"]
    ratios = {"pages_per_s": h2["pages_per_s"] / base["pages_per_s"],
              "cpu_ms_per_page": h2["cpu_ms_per_page"] / base["cpu_ms_per_page"]}
    print(bu.markdown_table(
        ["mode", "pages/s", "CPU ms/page", "peak RSS"],
        [[m, f"{s['pages_per_s']:.0f}", f"{s['cpu_ms_per_page']:.3f}",
          f"{s['peak_rss'] / 1e6:.0f} MB"] for m, s in summary.items()]))
    print(f"h2 / https1: pages/s x{ratios['pages_per_s']:.2f}, "
          f"CPU per page x{ratios['cpu_ms_per_page']:.2f}")
    out = Path(args.out or REPO / "bench-results" / f"http2-{bu.timestamp()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "machine": bu.machine_info(("h2",)),
                               "runs": runs, "summary": summary, "ratios": ratios},
                              indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
