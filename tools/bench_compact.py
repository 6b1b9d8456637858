"""Benchmark kvstore's compaction: seconds and MB/s for a store with dead records.

A measurement tool, not a test. It builds one store (``--keys`` keys of
``--value-bytes`` each, then overwrites every ``--overwrite``-th key and deletes
every ``--delete``-th), copies it once per run, and times ``compact()`` on the
copy from a cold start of the process's view (the files are in the page cache,
as after the crawl that wrote them). It prints the median and writes JSON.

To compare two versions of kvstore, run it from a worktree of each, alternating,
on the same ``--dir``: e.g. ``git worktree add /tmp/old <rev>`` then
``(cd /tmp/old && python tools/bench_compact.py --json old.json)`` and the same here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import kvstore


def build(path: Path, keys: int, value_bytes: int, overwrite: int, delete: int) -> None:
    value = os.urandom(value_bytes)
    with kvstore.open(path, capacity=keys) as db:
        batch = 1 << 14
        for start in range(0, keys, batch):
            ks = [kvstore.md5_key(str(i)) for i in range(start, min(keys, start + batch))]
            db.put_many(ks, [value] * len(ks))
        for i in range(0, keys, overwrite):
            db[kvstore.md5_key(str(i))] = value[::-1]
        for i in range(1, keys, delete):
            del db[kvstore.md5_key(str(i))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--overwrite", type=int, default=4, help="overwrite every Nth key")
    parser.add_argument("--delete", type=int, default=5, help="delete every Nth key")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the stores are built (a temp dir)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-compact-"))
    source = work / "source"
    if not source.exists():
        build(source, args.keys, args.value_bytes, args.overwrite, args.delete)
    size = sum(p.stat().st_size for p in source.glob("data-*"))
    seconds = []
    for _ in range(args.repeat):
        copy = work / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
        with kvstore.open(copy) as db:
            started = time.perf_counter()
            db.compact()
            seconds.append(time.perf_counter() - started)
            live = len(db)
        after = sum(p.stat().st_size for p in copy.glob("data-*"))
    median = statistics.median(seconds)
    result = {
        "keys": args.keys, "live": live, "value_bytes": args.value_bytes,
        "bytes_before": size, "bytes_after": after, "seconds": seconds,
        "median_seconds": round(median, 3),
        "new_generation_mb_per_s": round(after / median / 1e6, 1),
        "backend": kvstore.BACKEND, "kvstore": str(Path(kvstore.__file__).parent),
    }
    print(f"compact {args.keys:,} keys ({live:,} live), {size / 1e6:.0f} MB -> "
          f"{after / 1e6:.0f} MB: median {median:.2f} s of {args.repeat} "
          f"({result['new_generation_mb_per_s']} MB/s written) [{kvstore.BACKEND}]")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
