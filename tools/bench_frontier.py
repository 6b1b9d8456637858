"""Benchmark the crawler's frontier alone at scale, no network, synthetic URLs (issue 6).

Not a test.

Usage (from the repository root):

    python tools/bench_frontier.py                         # checkpoints up to 10M URLs, 3 runs
    python tools/bench_frontier.py --urls 50000000 --repeat 1    # the opt-in 50M run
    python tools/bench_frontier.py --urls 1000000 --repeat 1 --profile   # where the time goes

Method. Each run is a fresh process (this script with ``--worker``) that drives
``crawler.state.frontier.Frontier`` exactly as the engine does: ``add_seeds`` + ``commit``, then
rounds of ``claim`` (random unclaimed bulks of ~25 URLs) until ``--batch`` URLs are
claimed, one ``submit(Outcome)`` per claimed URL, one ``commit``. Every completed URL stores
a small page record (``encode_page`` of a body-less 200 record, ~150 bytes: the frontier's
cost without page bodies) and offers ``--links`` links (default 10), each a new URL with
probability ``--new-share`` (default 0.5) or else a URL offered before (already pending,
in flight or done: the dedup must reject it). URLs are ``http://h<i>.example/p<n>.html``
spread over ``--hosts`` hosts (default 2M) by a multiplicative hash of n. So the frontier
grows as a crawl's does: at N admitted URLs about N/5 are done and 4N/5 pending.

Rates (the table shows each since the previous checkpoint, so decay is visible):
  admit/s   links offered (duplicates included) / seconds spent inside ``Frontier.commit()``,
            i.e. through the committer's dedup (MainDB + PendSet + ProcessingSet + batch),
            its urls.log and PendDB writes, and the rest of the commit (page records into
            MainDB, ProcessingSet removals, bulk tombstones, periodic fsync). Building the
            links and their md5 keys is the workers' job in the crawler and is excluded;
            its rate is reported as ``keying/s``.
  claim/s   URLs handed out / seconds spent inside ``Frontier.claim()`` (drawing a random
            bulk, reading and decoding it from PendDB, the MainDB / ProcessingSet checks and
            the PendSet -> ProcessingSet move).
RSS is the process's resident set at the checkpoint; disk is the sum of file sizes under
the data directory (main/, pend/, urls.log). Bytes per URL (RSS above the empty frontier,
and disk, per admitted URL) project what ``--project`` URLs (default 280M) would need.

Output: a markdown table on stdout (progress on stderr) and JSON (``--out``, default
``bench-results/frontier-<timestamp>.json``, git-ignored) with keys ``machine``, ``config``,
``runs`` (every checkpoint of every run), ``checkpoints`` (medians), ``projection``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

REPO = Path(__file__).resolve().parents[1]
_MIX = 2654435761  # Knuth's multiplicative hash: URL n -> host


def default_checkpoints(urls: int) -> list[int]:
    marks = [m * 10**e for e in range(3, 10) for m in (1, 2, 5)]
    return [m for m in marks if m < urls and m >= urls // 50] + [urls]


# -- the worker (a fresh process per run) ----------------------------------------------------------


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from crawler.state.frontier import Claimed, Frontier, Outcome
    from crawler.state.pages import PageRecord, Pending, encode_page
    from crawler.web.urls import url_key

    hosts = args.hosts
    rng = random.Random(args.seed)
    marks = [int(x) for x in args.checkpoints.split(",")]

    def url(n: int) -> str:
        return f"http://h{(n * _MIX) % hosts}.example/p{n}.html"

    f = Frontier(args.data)
    base_rss = bu.rss_bytes()
    seeds = max(1, args.batch // 10)
    f.add_seeds([Pending(url(n)) for n in range(seeds)])
    f.commit()
    next_id = seeds
    t_claim = t_commit = t_keys = 0.0
    claimed_n = offered = done = 0
    points: list[dict[str, Any]] = []
    last = {"t_claim": 0.0, "t_commit": 0.0, "t_keys": 0.0, "claimed": 0, "offered": 0}
    started = time.perf_counter()
    while marks:
        t0 = time.perf_counter()
        claimed: list[Claimed] = []
        while len(claimed) < args.batch:
            bulk = f.claim()
            if bulk is None:
                break
            claimed.extend(bulk)
        t_claim += time.perf_counter() - t0
        claimed_n += len(claimed)
        if not claimed and f.idle():
            raise RuntimeError("the frontier ran dry: raise --new-share or --links")
        for c in claimed:
            t0 = time.perf_counter()
            links = []
            for _ in range(args.links):
                if rng.random() < args.new_share:
                    n, next_id = next_id, next_id + 1
                else:
                    n = int(rng.random() * next_id)
                u = url(n)
                links.append((url_key(u), Pending(u, c.entry.depth + 1)))
            t_keys += time.perf_counter() - t0
            offered += len(links)
            rec = encode_page(
                PageRecord(
                    url=c.entry.url,
                    status=200,
                    fetched_at=time.time(),
                    depth=c.entry.depth,
                    content_type="text/html",
                    outlinks=len(links),
                )
            )
            f.submit(Outcome(c, rec, links=links))
        t0 = time.perf_counter()
        f.commit()
        t_commit += time.perf_counter() - t0
        done += len(claimed)
        while marks and f.admitted >= marks[0]:
            marks.pop(0)
            d = {
                "t_claim": t_claim - last["t_claim"],
                "t_commit": t_commit - last["t_commit"],
                "t_keys": t_keys - last["t_keys"],
                "claimed": claimed_n - last["claimed"],
                "offered": offered - last["offered"],
            }
            last = {
                "t_claim": t_claim,
                "t_commit": t_commit,
                "t_keys": t_keys,
                "claimed": claimed_n,
                "offered": offered,
            }
            counts = f.counts()
            point = {
                "urls": f.admitted,
                "done": counts["done"],
                "pending": counts["pending"],
                "offered": offered,
                "elapsed_s": round(time.perf_counter() - started, 2),
                "admit_per_s": d["offered"] / max(1e-9, d["t_commit"]),
                "claim_per_s": d["claimed"] / max(1e-9, d["t_claim"]),
                "keying_per_s": d["offered"] / max(1e-9, d["t_keys"]),
                "admit_per_s_total": offered / max(1e-9, t_commit),
                "claim_per_s_total": claimed_n / max(1e-9, t_claim),
                "rss_bytes": bu.rss_bytes(),
                "base_rss_bytes": base_rss,
                "disk_bytes": bu.disk_usage(args.data)[0],
            }
            points.append(point)
            print(
                f"  {point['urls']:>11,} URLs  admit {bu.fmt_rate(point['admit_per_s'])}/s  "
                f"claim {bu.fmt_rate(point['claim_per_s'])}/s  "
                f"rss {bu.fmt_bytes(point['rss_bytes'])}  "
                f"disk {bu.fmt_bytes(point['disk_bytes'])}  ({point['elapsed_s']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    f.close()
    return {"points": points, "peak_rss_bytes": bu.peak_rss_bytes()}


# -- the parent -------------------------------------------------------------------------


def run_once(args: argparse.Namespace, data: Path, i: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--data",
        str(data),
        "--checkpoints",
        ",".join(map(str, args.marks)),
        "--hosts",
        str(args.hosts),
        "--links",
        str(args.links),
        "--new-share",
        str(args.new_share),
        "--batch",
        str(args.batch),
        "--seed",
        str(args.seed + i),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise bu.WorkerError(f"frontier worker exited {proc.returncode}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for j, first in enumerate(runs[0]["points"]):
        pts = [r["points"][j] for r in runs]
        row = {"urls": first["urls"], "runs": len(pts)}
        for k in (
            "done",
            "pending",
            "admit_per_s",
            "claim_per_s",
            "keying_per_s",
            "admit_per_s_total",
            "claim_per_s_total",
            "rss_bytes",
            "base_rss_bytes",
            "disk_bytes",
            "elapsed_s",
        ):
            row[k] = bu.median([p[k] for p in pts])
        out.append(row)
    return out


def projection(last: dict[str, Any], target: int) -> dict[str, Any]:
    ram_per = (last["rss_bytes"] - last["base_rss_bytes"]) / last["urls"]
    disk_per = last["disk_bytes"] / last["urls"]
    mem = bu.mem_total_bytes()
    free = shutil.disk_usage(REPO).free
    return {
        "urls": target,
        "ram_bytes_per_url": ram_per,
        "disk_bytes_per_url": disk_per,
        "ram_bytes": last["base_rss_bytes"] + ram_per * target,
        "disk_bytes": disk_per * target,
        "machine_ram_bytes": mem,
        "disk_free_bytes": free,
        "fits": bool(
            mem
            and last["base_rss_bytes"] + ram_per * target < 0.8 * mem
            and disk_per * target < 0.9 * free
        ),
    }


def table(rows: list[dict[str, Any]]) -> str:
    return bu.markdown_table(
        ["URLs so far", "done", "pending", "admit/s", "claim/s", "keying/s", "RSS", "disk", "runs"],
        [
            [
                f"{r['urls']:,.0f}",
                f"{r['done']:,.0f}",
                f"{r['pending']:,.0f}",
                bu.fmt_rate(r["admit_per_s"]),
                bu.fmt_rate(r["claim_per_s"]),
                bu.fmt_rate(r["keying_per_s"]),
                bu.fmt_bytes(r["rss_bytes"]),
                bu.fmt_bytes(r["disk_bytes"]),
                str(r["runs"]),
            ]
            for r in rows
        ],
    )


def run_profile(args: argparse.Namespace, top: int) -> None:
    """One in-process run under cProfile (the simulation is single-threaded), top entries."""
    import cProfile
    import pstats

    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="frontier-prof-") as tmp:
        ns = argparse.Namespace(**{**vars(args), "data": tmp, "checkpoints": str(args.urls)})
        prof = cProfile.Profile()
        prof.runcall(worker, ns)
        for key in ("tottime", "cumulative"):
            print(f"\ncProfile, top {top} by {key}:")
            pstats.Stats(prof, stream=sys.stdout).sort_stats(key).print_stats(top)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--urls", type=int, default=10_000_000, help="admitted URLs to reach (50M: opt-in)"
    )
    p.add_argument(
        "--checkpoints", help="comma-separated URL counts (default 1-2-5 steps up to --urls)"
    )
    p.add_argument("--hosts", type=int, default=2_000_000)
    p.add_argument("--links", type=int, default=10, help="links offered per completed URL")
    p.add_argument(
        "--new-share", type=float, default=0.5, help="share of offered links that are new"
    )
    p.add_argument("--batch", type=int, default=1000, help="URLs claimed and completed per commit")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--project", type=int, default=280_000_000, help="URLs to project RAM and disk for"
    )
    p.add_argument(
        "--profile", action="store_true", help="one in-process run under cProfile instead"
    )
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument("--workdir", type=Path, default=REPO / "bench-results")
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        bu.emit(worker(args))
        return 0
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.profile:
        run_profile(args, args.profile_top)
        return 0
    args.marks = (
        [int(x) for x in args.checkpoints.split(",")]
        if args.checkpoints
        else default_checkpoints(args.urls)
    )
    result: dict[str, Any] = {
        "machine": {
            **bu.machine_info(),
            "load_start": bu.loadavg(),
            "git_start": bu.git_revision(REPO),
            "filesystem": bu.filesystem_of(args.workdir),
        },
        "config": {
            k: getattr(args, k)
            for k in ("urls", "hosts", "links", "new_share", "batch", "repeat", "seed", "marks")
        },
        "runs": [],
    }
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=args.workdir, prefix="frontier-") as tmp:
            print(f"run {i + 1}/{args.repeat} (load {bu.loadavg()})", file=sys.stderr, flush=True)
            result["runs"].append(run_once(args, Path(tmp) / "crawl", i))
    rows = medians(result["runs"])
    result["checkpoints"] = rows
    result["projection"] = projection(rows[-1], args.project)
    result["machine"]["load_end"] = bu.loadavg()
    result["machine"]["git_end"] = bu.git_revision(REPO)
    out = args.out or REPO / "bench-results" / f"frontier-{bu.timestamp()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(rows))
    pr = result["projection"]
    print(
        f"\n{pr['ram_bytes_per_url']:.1f} B RAM and {pr['disk_bytes_per_url']:.1f} B disk "
        f"per admitted URL: {pr['urls'] / 1e6:.0f}M URLs would need "
        f"~{bu.fmt_bytes(pr['ram_bytes'])} RAM and ~{bu.fmt_bytes(pr['disk_bytes'])} disk "
        f"(this machine: {bu.fmt_bytes(pr['machine_ram_bytes'])} RAM, "
        f"{bu.fmt_bytes(pr['disk_free_bytes'])} disk free: "
        f"{'fits' if pr['fits'] else 'does not fit'})"
    )
    m = result["machine"]
    print(f"load (1/5/15 min): start {m['load_start']}, end {m['load_end']}")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
