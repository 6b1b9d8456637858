"""The CPU each test file costs the machine, run alone: where the suite's time goes. Not a test.

Usage (from the repository root, on a quiet machine)::

    python tools/suite_cpu.py tests/crawler/test_ray.py tests/crawler/test_kill.py
    python tools/suite_cpu.py --json out.json tests/crawler/test_*.py

On 2 cores the suite keeps both busy (vmstat: 0-3% idle while it runs), so its time is
about the CPU its files use, halved: a file's wall time alone says less, since a test
that waits (a politeness delay, a timeout) costs the others nothing. Each file runs as
``python -m pytest -q -n 0 -p no:cacheprovider FILE``; its cost is the whole machine's
busy time meanwhile (from /proc/stat: its servers, browsers and Ray daemons count, which
the process's own rusage would miss), less what the machine used in a quiet second
measured before, scaled to the run's length. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def busy_seconds() -> float:
    """CPU-seconds the machine has spent busy since boot (all cores): /proc/stat's cpu
    line less idle and iowait."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def background(seconds: float = 2.0) -> float:
    """CPU-seconds a second the machine uses with nothing of ours running."""
    before = busy_seconds()
    time.sleep(seconds)
    return (busy_seconds() - before) / seconds


def measure(path: str, rest: float) -> dict[str, Any]:
    before, started = busy_seconds(), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0",
                           "-p", "no:cacheprovider", path],
                          cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    cpu = busy_seconds() - before - rest * wall
    last = done.stdout.strip().splitlines()[-1:] or [""]
    return {"file": path, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
            "exit": done.returncode, "summary": last[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="test files, each run alone in turn")
    p.add_argument("--json", metavar="FILE", help="also write the rows there")
    args = p.parse_args()
    rest = background()
    rows = []
    for path in args.files:
        row = measure(path, rest)
        rows.append(row)
        print(f"{row['cpu_s']:8.1f} {row['wall_s']:8.1f}  {path}  ({row['summary']})",
              flush=True)
    rows.sort(key=lambda r: -r["cpu_s"])
    total = sum(r["cpu_s"] for r in rows)
    print(f"\n{'cpu s':>8} {'wall s':>8}  (taken off: {rest:.2f} CPU-s a second, the machine's "
          "use before, nothing of ours running)")
    for row in rows:
        print(f"{row['cpu_s']:8.1f} {row['wall_s']:8.1f}  {row['file']}")
    cores = len(os.sched_getaffinity(0))
    print(f"{total:8.1f}           all {len(rows)} files: about {total / cores / 60:.1f} min "
          f"on {cores} busy cores")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
