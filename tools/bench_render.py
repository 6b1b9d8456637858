"""Benchmark of JavaScript rendering (--render-js), on the test web over loopback.

Two measurements, each repeated (medians reported), each a ``python -m crawler
start`` subprocess whose whole process tree (crawler, Chromium and its
renderers) is polled for RSS:

1. *rendered*: every page rendered (--render-js-all), with 1, 4 and 8 tabs:
   pages rendered per second (the crawl's own average from status.json) and
   the tree's peak RSS.
2. *one host rendered*: a 20-host web crawled with rendering off, then with
   rendering for one host only (h1.test). What is compared is the other
   hosts' pages/s, from the test web's request log (the first 95% of their
   requests over the time they took: the last few are pages linked only from
   h1's pages, which wait for its renders), and the cores the whole tree kept
   busy (its CPU seconds over the wall time): the rest of the crawl should not
   slow down by more than the CPU the browser takes.

    python tools/bench_render.py                 # the defaults below, ~5 minutes
    python tools/bench_render.py --repeat 1 --pages 100 --tabs 1 4
    python tools/bench_render.py --tabs          # only the one-host-rendered comparison
    python tools/bench_render.py --report runs.json   # the tables of a saved run

Prints a Markdown table and, with --json FILE, writes the runs. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools._benchutil import (  # noqa: E402
    fmt_bytes,
    loadavg,
    machine_info,
    markdown_table,
    median,
    run_measured,
)
from tools.measure_crawl import crawl_command  # noqa: E402
from tools.testweb import TestWeb  # noqa: E402
from tools.testweb.graph import SiteConfig  # noqa: E402


def crawl(web: TestWeb, work: Path, *options: str) -> dict[str, Any]:
    """One crawl of ``web``; its resource use and status.json."""
    data = Path(tempfile.mkdtemp(dir=work))
    web.log.clear()
    # No Crawl-delay either: the slowest host's tail would set every crawl's length.
    cmd = crawl_command(web, data / "c", "--delay", "0", "--max-crawl-delay", "0",
                        "--per-host", "4", "--threads", "32", "--processes", "1",
                        "--status-interval", "1", *options)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = run_measured(cmd, cwd=REPO, env=env, timeout=1800,
                       stderr_path=data / "stderr.txt")
    if run["returncode"] != 0:
        raise SystemExit(f"crawl failed: {(data / 'stderr.txt').read_text()[-2000:]}")
    with open(data / "c" / "status.json") as f:
        run["status"] = json.load(f)
    run["requests"] = [(r.host, r.start) for r in web.log.records()]
    shutil.rmtree(data)
    return run


def others_rate(run: dict[str, Any], rendered_host: str, share: float = 0.95) -> float:
    """Pages/s of the hosts that are not rendered: the first ``share`` of their requests
    over the time they took from the crawl's first request. (The last few are pages
    found only on the rendered host's pages, so they wait for its renders.)"""
    t0 = min(t for _, t in run["requests"])
    starts = sorted(t - t0 for host, t in run["requests"] if host != rendered_host)
    k = max(1, int(len(starts) * share))
    return float(k / max(1e-9, starts[k - 1]))


def tables(result: dict[str, Any]) -> str:
    rows = []
    for tabs, runs in result["rendered"].items():
        rows.append([str(tabs),
                     f"{median([r['status']['rendered'] for r in runs]):.0f}",
                     f"{median([r['status']['avg_pages_per_s'] for r in runs]):.1f}",
                     fmt_bytes(median([r['tree_peak_rss_bytes'] for r in runs])),
                     f"{median([r['cpu_s'] for r in runs]):.1f}"])
    out = markdown_table(["tabs", "rendered", "pages/s", "tree peak RSS", "CPU s"], rows)
    rows = []
    for name, runs in result["mixed"].items():
        rows.append([name,
                     f"{median([others_rate(r, 'h1.test') for r in runs]):.0f}",
                     f"{median([r['status'].get('rendered', 0) for r in runs]):.0f}",
                     f"{median([r['cpu_s'] / r['wall_s'] for r in runs]):.2f}",
                     f"{median([r['wall_s'] for r in runs]):.1f}",
                     fmt_bytes(median([r['tree_peak_rss_bytes'] for r in runs]))])
    out += "\n\n" + markdown_table(
        ["rendering", "other hosts' pages/s (first 95%)", "rendered", "cores busy (CPU s / wall s)",
         "wall s", "tree peak RSS"], rows)
    return out + f"\n\nload {result['load_before']} -> {result['load_after']}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=200, help="pages of the all-rendered web")
    p.add_argument("--tabs", type=int, nargs="*", default=[1, 4, 8],
                   help="tab counts of the all-rendered crawls (none: skip them)")
    p.add_argument("--mixed-pages", type=int, default=4000, help="pages of the 20-host web")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="write every run here")
    p.add_argument("--report", metavar="JSON", help="print the tables of a saved --json run")
    args = p.parse_args()
    if args.report:
        with open(args.report) as f:
            print(tables(json.load(f)))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-render-"))
    result: dict[str, Any] = {"machine": machine_info(), "load_before": loadavg(),
                              "rendered": {}, "mixed": {}}
    try:
        with TestWeb(SiteConfig(hosts=4, pages=args.pages, seed=11)) as web:
            for tabs in args.tabs or ():
                runs = [crawl(web, work, "--render-js-all", "--render-tabs", str(tabs))
                        for _ in range(args.repeat)]
                result["rendered"][tabs] = runs
        with TestWeb(SiteConfig(hosts=20, pages=args.mixed_pages, seed=12)) as web:
            for name, opts in (("off", ()), ("h1.test", ("--render-js", r"^h1\.test$"))):
                result["mixed"][name] = [crawl(web, work, *opts) for _ in range(args.repeat)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = loadavg()
    print(tables(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
