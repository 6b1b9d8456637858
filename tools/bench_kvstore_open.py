"""Benchmark: kvstore's open (saved index vs rebuild) and the memory of a bulk load.

    python tools/bench_kvstore_open.py --n 10000000 --repeat 3

Each measurement runs in a fresh process (this script with ``--worker``):

  bulk          one ``put_many`` of N random keys with 8-byte values, then flush; rate,
                and RSS during (peak, sampled every 2 ms) and after (after gc), both net
                of the process before the call (inputs already built), against the
                index's own size. Then a clean close, which writes the saved index.
  open_saved    a read-only open of the cleanly closed store: it reads the saved index
  open_rebuild  the same open with the saved index moved aside (what an open after a
                crash does): the index is rebuilt from the KEY file

Both opens report records/s and RSS per key net of a fresh interpreter with kvstore
imported. Data files are read once first, so they sit in the page cache. Medians of
``--repeat`` runs; prints a table and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import _benchutil as bu  # noqa: E402

OPS = ("bulk", "open_saved", "open_rebuild")


class _PeakSampler:
    """Peak RSS while a block runs, sampled from /proc/self/statm."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = bu.rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, bu.rss_bytes())

    def __enter__(self) -> _PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, bu.rss_bytes())


def _worker(op: str, path: str, n: int) -> dict[str, Any]:
    import numpy as np

    import kvstore

    backend = getattr(kvstore, "BACKEND", "python")
    if op == "bulk":
        rng = np.random.default_rng(1)
        keys = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
        values = [i.to_bytes(8, "little") for i in range(n)]
        gc.collect()
        base = bu.rss_bytes()
        db = kvstore.open(path)
        t0 = time.perf_counter()
        with _PeakSampler() as peak:
            db.put_many(keys, values)
            db.flush()
        dt = time.perf_counter() - t0
        gc.collect()
        after = bu.rss_bytes()
        index_bytes = int(db.index_stats()["memory_bytes"])
        db.close()
        return {
            "op": op,
            "backend": backend,
            "n": n,
            "rate": n / dt,
            "seconds": dt,
            "index_bytes": index_bytes,
            "index_per_key": index_bytes / n,
            "after_net": after - base,
            "peak_net": peak.peak - base,
            "after_vs_index": (after - base) / index_bytes,
            "peak_vs_index": (peak.peak - base) / index_bytes,
        }
    gc.collect()
    base = bu.rss_bytes()
    t0 = time.perf_counter()
    with _PeakSampler() as peak:
        db = kvstore.open(path, readonly=True)
    dt = time.perf_counter() - t0
    after = bu.rss_bytes()
    count = len(db)
    index_bytes = int(db.index_stats()["memory_bytes"])
    db.close()
    return {
        "op": op,
        "backend": backend,
        "n": count,
        "rate": count / dt,
        "seconds": dt,
        "rss_per_key_net": (after - base) / count,
        "peak_per_key_net": (peak.peak - base) / count,
        "rss_per_key": after / count,
        "index_per_key": index_bytes / count,
    }


def _run(op: str, path: str, n: int, timeout: float) -> dict[str, Any]:
    rec: dict[str, Any] = bu.run_worker(
        [__file__, "--worker", op, "--path", path, "--n", str(n)], timeout=timeout
    )
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", help="where the store is built (default: a temp dir, removed)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--worker", choices=OPS, help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.path, args.n)))
        return 0
    top = Path(args.dir or tempfile.mkdtemp(prefix="kvbench-open-"))
    runs: dict[str, list[dict[str, Any]]] = {op: [] for op in OPS}
    try:
        for _ in range(args.repeat):
            store = top / "store"
            shutil.rmtree(store, ignore_errors=True)
            runs["bulk"].append(_run("bulk", str(store), args.n, args.timeout))
            bu.warm_page_cache(store)
            runs["open_saved"].append(_run("open_saved", str(store), args.n, args.timeout))
            saved = sorted(store.glob("data-*.idx"))
            aside = [s.with_suffix(".aside") for s in saved]
            for s, a in zip(saved, aside, strict=True):
                os.rename(s, a)
            try:
                runs["open_rebuild"].append(_run("open_rebuild", str(store), args.n, args.timeout))
            finally:
                for s, a in zip(saved, aside, strict=True):
                    os.rename(a, s)
    finally:
        if not args.dir:
            shutil.rmtree(top, ignore_errors=True)
    med = {
        op: {
            k: statistics.median(r[k] for r in rs)
            for k in rs[0]
            if isinstance(rs[0][k], float | int)
        }
        for op, rs in runs.items()
        if rs
    }
    backend = runs["bulk"][0]["backend"] if runs["bulk"] else "?"
    print(f"kvstore {backend} backend, N={args.n:,}, medians of {args.repeat}")
    b = med["bulk"]
    print(
        f"bulk put_many      {b['rate'] / 1e6:6.2f} M keys/s   "
        f"index {b['index_per_key']:.1f} B/key   RSS after {b['after_vs_index']:.2f}x index   "
        f"peak {b['peak_vs_index']:.2f}x index"
    )
    for op in ("open_saved", "open_rebuild"):
        o = med[op]
        print(
            f"{op:<18} {o['rate'] / 1e6:6.2f} M records/s   "
            f"RSS {o['rss_per_key_net']:.1f} B/key net ({o['rss_per_key']:.1f} plain, "
            f"peak {o['peak_per_key_net']:.1f} net, index {o['index_per_key']:.1f})"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"n": args.n, "runs": runs, "medians": med}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
