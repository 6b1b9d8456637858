"""``status DIR`` from the committer's counters against ``status DIR --recount`` (a scan of
every record and bulk), on a synthetic crawl built through the crawler's own frontier.

    python tools/bench_status.py --pages 200000 --workdir /tmp/bench-status --repeat 3

The crawl: ``--pages`` page records and ``--pending`` URLs left in PendDB, one
shard, written by a real Frontier (seeds, claims, submitted outcomes, commits) through
tools/_seedbuild.py, the builder of tools/seedscale.py, so its counts.json is the
committer's: a broad crawl's outcomes, link lists, and HTML bodies padded with 2 KB
of hex as this benchmark's crawl always had. Each status is a fresh ``python -m crawler
status DIR --json`` process (interpreter start included), timed wall-clock; the
median of ``--repeat``. The data stays under ``--workdir`` (never the repository).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools._benchutil import machine_info, median  # noqa: E402
from tools._seedbuild import build_crawl  # noqa: E402
from tools._seedweb import Shape  # noqa: E402

PAD = 2048  # hex bytes added to each HTML body: ~2 KB that zlib cannot shrink much


def build(data: Path, pages: int, pending: int) -> None:
    """A one-shard crawl of ``pages`` records and ``pending`` URLs waiting, built through
    the frontier by tools/_seedbuild.py (what tools/seedscale.py builds, one shard)."""
    shape = Shape(pages=pages, pending=pending, hosts=max(1, min(5000, pages // 40)),
                  shards=1, pad=PAD)
    build_crawl(shape, str(data), verbose=False)


def timed_status(data: Path, *flags: str) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "crawler", "status", str(data), "--json",
                           *flags], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    return time.perf_counter() - start, json.loads(done.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=200_000)
    p.add_argument("--pending", type=int, default=20_000)
    p.add_argument("--workdir", default="/tmp/bench-status")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    data = Path(args.workdir) / f"crawl-{args.pages}"
    if not (data / "counts.json").exists():
        shutil.rmtree(data, ignore_errors=True)
        start = time.perf_counter()
        build(data, args.pages, args.pending)
        print(f"built {args.pages} records in {time.perf_counter() - start:.1f} s: {data}",
              file=sys.stderr)
    fast = [timed_status(data) for _ in range(args.repeat)]
    slow = [timed_status(data, "--recount") for _ in range(args.repeat)]
    a, b = fast[0][1], slow[0][1]
    same = {k: v for k, v in a.items() if k != "counts_from"} == {
        k: v for k, v in b.items() if k != "counts_from"}
    print(json.dumps({
        "pages": b["recorded"], "pending": b["pending"],
        "counters_s": round(median([t for t, _ in fast]), 3),
        "recount_s": round(median([t for t, _ in slow]), 3),
        "counts_from": a["counts_from"], "same_numbers": same,
        "machine": machine_info(),
    }, indent=1))
    return 0 if same and a["counts_from"] == "counters" else 1


if __name__ == "__main__":
    sys.exit(main())
