"""Benchmark PageRank on disk (crawler.read.graph + crawler.read.rank) on a synthetic graph.

    python tools/bench_rank.py                                # 10M pages, 200M links
    python tools/bench_rank.py --sizes 1000000:20000000,2000000:40000000 --iterations 3
    python tools/bench_rank.py --sizes 200000:2000000 --block-nodes 65536 --chunk 65536

Each size runs in a fresh worker process (``--worker``): it generates the graph
straight into a GraphBuilder (no crawl, no kvstore: what is measured is the
graph build and the iterations), builds it, and runs ``--iterations``
PageRank iterations (the tolerance is set so they all run). Reported per size:
build seconds (scan + join + tiles), seconds per iteration, peak RSS of the
worker (VmHWM), the build's and the iterations' own peaks (VmHWM is reset
between them), its RSS before the graph (the interpreter with numpy), disk
used by the graph. The graph: node i's key is a 128-bit mix of i
(uniform, like md5); 95% of the nodes answered 200, 3% 404, 2% nothing; out
degrees are uniform in 0..2m (mean m = links / nodes), targets skewed toward
low ids (``u**3``: a power-law-like in-degree), 5% nofollow, 2% to URLs the
crawl never recorded. Prints a markdown table, writes JSON (``--out``).
Memory must not grow with the size; time per iteration grows with the links.
"""

from __future__ import annotations

import argparse
import json
import shutil
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
DEFAULT_SIZES = "10000000:200000000"
GEN_BATCH = 1 << 16  # nodes generated per add_many call


def _mix(x: Any) -> Any:
    """splitmix64's finalizer on a uint64 array: a bijection, well spread."""
    import numpy as np

    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keys_of(ids: Any) -> bytes:
    """The 16-byte keys of node ids (big-endian halves, as url_keys are compared)."""
    import numpy as np

    ids = ids.astype(np.uint64)
    out = np.empty((len(ids), 2), dtype=">u8")
    with np.errstate(over="ignore"):
        out[:, 0] = _mix(ids)
        out[:, 1] = _mix(ids ^ np.uint64(0x9E3779B97F4A7C15))
    return out.tobytes()


def generate(builder: Any, nodes: int, links: int, *, seed: int = 0,
             batch: int = GEN_BATCH) -> None:
    """Feed a synthetic graph of ``nodes`` records and about ``links`` edges to ``builder``
    (a GraphBuilder), ``batch`` records at a time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mean = links / max(nodes, 1)
    for start in range(0, nodes, batch):
        ids = np.arange(start, min(nodes, start + batch), dtype=np.int64)
        u = rng.random(len(ids))
        status = np.where(u < 0.95, 200, np.where(u < 0.98, 404, 0)).astype(np.int16)
        counts = rng.integers(0, int(2 * mean) + 1, len(ids))
        counts = np.where(status == 200, counts, 0)
        total = int(counts.sum())
        targets = (nodes * rng.random(total) ** 3).astype(np.int64)
        off = rng.random(total) < 0.02
        targets[off] = nodes + rng.integers(0, nodes, int(off.sum()))  # never recorded
        src = np.repeat(ids, counts)
        targets = _dedup_per_source(src, targets)
        counts = np.bincount(src[targets >= 0] - start, minlength=len(ids))
        targets = targets[targets >= 0]
        flags = (rng.random(len(targets)) < 0.05).astype(np.uint8)  # nofollow
        urls = [b"http://s%d.test/p%d" % (i % 1000, i) for i in ids.tolist()]
        builder.add_many(keys_of(ids), urls, status, keys_of(targets), counts, flags.tobytes())


def _dedup_per_source(src: Any, targets: Any) -> Any:
    """Targets with repeats of the same (source, target) replaced by -1 (a page links a URL
    once)."""
    import numpy as np

    order = np.lexsort((targets, src))
    s, t = src[order], targets[order]
    dup = np.zeros(len(t), dtype=bool)
    dup[1:] = (s[1:] == s[:-1]) & (t[1:] == t[:-1])
    out = targets.copy()
    out[order[dup]] = -1
    return out


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so a phase's own peak can be read."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def worker(args: argparse.Namespace) -> int:
    """One size in this (fresh) process: generate, build, iterate; one JSON line out."""
    import numpy as np

    from crawler.read.graph import GraphBuilder
    from crawler.read.rank import pagerank, write_order

    baseline = bu.rss_bytes()
    work = tempfile.mkdtemp(prefix="bench-rank-", dir=args.workdir)
    try:
        t0 = time.monotonic()
        builder = GraphBuilder(work, expected=args.nodes, block=args.block_nodes,
                               chunk=args.chunk, bucket_nodes=args.bucket_nodes)
        generate(builder, args.nodes, args.links, seed=args.seed, batch=args.gen_batch)
        t1 = time.monotonic()
        graph = builder.finish()
        t2 = time.monotonic()
        build_peak = bu.peak_rss_bytes()
        disk, _ = bu.disk_usage(work)
        reset = _reset_hwm()
        result = pagerank(graph, tol=1e-300, max_iter=args.iterations, chunk=args.chunk)
        t3 = time.monotonic()
        iterate_peak = bu.peak_rss_bytes() if reset else None
        write_order(graph, args.chunk)
        order_s = time.monotonic() - t3
        rank_sum = sum(float(graph.read("rank.f8", np.float64, b).sum())
                       for b in range(graph.blocks))  # by block: the worker's RSS is measured
        bu.emit({
            "nodes": args.nodes, "links": graph.info.links, "edges": graph.info.edges,
            "fetched": graph.info.fetched, "dangling": graph.info.dangling,
            "blocks": graph.info.blocks, "buckets": graph.info.buckets,
            "generate_and_scan_s": round(t1 - t0, 2), "join_and_tiles_s": round(t2 - t1, 2),
            "iterations": result.iterations,
            "s_per_iteration": round(result.seconds_per_iteration, 3),
            "edges_per_s": round(graph.info.edges / max(result.seconds_per_iteration, 1e-9)),
            "rank_sum": rank_sum, "delta": result.delta,
            "build_s": round(t2 - t0, 2), "iterate_s": round(result.seconds, 2),
            "order_s": round(order_s, 2),
            "baseline_rss": baseline, "build_peak_rss": build_peak,
            "iterate_peak_rss": iterate_peak,
            "peak_rss": bu.peak_rss_bytes(), "disk_bytes": disk,
        })
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def run_size(nodes: int, links: int, args: argparse.Namespace) -> dict[str, Any]:
    argv = [str(Path(__file__).resolve()), "--worker", "--nodes", str(nodes), "--links",
            str(links), "--iterations", str(args.iterations), "--block-nodes",
            str(args.block_nodes), "--chunk", str(args.chunk), "--seed", str(args.seed),
            "--gen-batch", str(args.gen_batch), "--bucket-nodes", str(args.bucket_nodes)]
    if args.workdir:
        argv += ["--workdir", str(args.workdir)]
    return bu.run_worker(argv, cwd=REPO)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from crawler.read.graph import DEFAULT_BLOCK_NODES, DEFAULT_CHUNK, NODES_PER_BUCKET

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="NODES:LINKS,... one worker each")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--block-nodes", type=int, default=DEFAULT_BLOCK_NODES)
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-nodes", type=int, default=NODES_PER_BUCKET,
                   help="node keys per join bucket")
    p.add_argument("--gen-batch", type=int, default=GEN_BATCH,
                   help="records generated at a time (the generator's own memory)")
    p.add_argument("--workdir", type=Path, help="where graphs are built (default: /tmp)")
    p.add_argument("--out", type=Path, help="JSON path (default bench-results/rank-<ts>.json)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--links", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    rows, results = [], []
    for spec in args.sizes.split(","):
        nodes, links = (int(float(x)) for x in spec.split(":"))
        print(f"{nodes} nodes, {links} links...", file=sys.stderr, flush=True)
        r = run_size(nodes, links, args)
        r["load"] = bu.loadavg()
        results.append(r)
        rows.append([f"{r['nodes']:,}", f"{r['links']:,}", f"{r['edges']:,}",
                     f"{r['generate_and_scan_s']:.1f}", f"{r['join_and_tiles_s']:.1f}",
                     f"{r['s_per_iteration']:.2f}", bu.fmt_rate(r["edges_per_s"]),
                     bu.fmt_bytes(r["baseline_rss"]), bu.fmt_bytes(r["peak_rss"]),
                     bu.fmt_bytes(r["disk_bytes"])])
    print(bu.markdown_table(["nodes", "links", "rank edges", "gen+scan s", "join+tiles s",
                             "s/iteration", "edges/s", "RSS before", "peak RSS", "disk"], rows))
    out = args.out or REPO / "bench-results" / f"rank-{bu.timestamp()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": bu.machine_info(), "config": vars(args) | {
        "workdir": str(args.workdir), "out": str(out)}, "results": results}, indent=1,
        default=str))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
