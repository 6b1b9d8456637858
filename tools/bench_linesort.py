"""The external sort of `index`'s anchor lines (crawler.read._linesort.LineSorter): time
to add and merge ``--mb`` MB of lines shaped like them (a 32-hex-digit key, a tab, a few
words) with merges of ``--fan-in`` runs at once against the default (as many as the
limit of open files allows), alternating, ``--repeat`` times each.

    python tools/bench_linesort.py --mb 400 --buffer-mb 1 --fan-in 64 --repeat 3

At 20M pages a shard's lines are ~9 GB in runs of 16 MB (~570 runs): with 64 at once
they are read and written twice, with the default once. Wall and process CPU seconds,
medians, and the bytes the runs wrote (one line of JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from crawler.read._linesort import LineSorter, default_fan_in  # noqa: E402

WORDS = [w.encode() for w in ("home news about contact the page next more read blog "
                              "products help search login previous archive").split()]


def lines(mb: float, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    out, size = [], 0
    while size < mb * 1e6:
        line = (rng.getrandbits(128).to_bytes(16, "big").hex().encode() + b"\t"
                + b" ".join(rng.choices(WORDS, k=rng.randint(1, 4))) + b"\n")
        out.append(line)
        size += len(line)
    return out


def one(data: list[bytes], buffer: int, fan_in: int | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-linesort-") as tmp:
        wall, cpu = time.monotonic(), time.process_time()
        sorter = LineSorter(tmp, buffer_bytes=buffer, fan_in=fan_in)
        for line in data:
            sorter.add(line)
        runs = len(os.listdir(tmp))
        written = sum(os.path.getsize(os.path.join(tmp, n)) for n in os.listdir(tmp))
        last, count = b"", 0
        for line in sorter.sorted():
            assert line >= last
            last, count = line, count + 1
        assert count == len(data)
        passes, n = 0, runs  # passes over the runs before the last merge (LineSorter's)
        while n > sorter.fan_in:
            n, passes = -(-n // sorter.fan_in), passes + 1
        return {"wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu,
                "runs": runs, "passes": passes, "bytes_written": written * (1 + passes)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=400, help="MB of lines to sort")
    p.add_argument("--buffer-mb", type=float, default=1, help="MB of lines a run holds")
    p.add_argument("--fan-in", type=int, default=64, help="the runs merged at once to compare")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true", help="one line of JSON")
    args = p.parse_args(argv)
    data = lines(args.mb)
    buffer = int(args.buffer_mb * 1e6)
    cases: dict[str, int | None] = {f"fan_in_{args.fan_in}": args.fan_in,
                                    f"default_{default_fan_in()}": None}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for _ in range(args.repeat):
        for name, fan_in in cases.items():
            runs[name].append(one(data, buffer, fan_in))
    out: dict[str, Any] = {"mb": args.mb, "lines": len(data), "buffer_mb": args.buffer_mb}
    for name, results in runs.items():
        out[name] = {k: round(statistics.median(r[k] for r in results), 2) for k in results[0]}
    if args.json:
        print(json.dumps(out))
    else:
        for name in cases:
            print(name, " ".join(f"{k}={v}" for k, v in out[name].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
