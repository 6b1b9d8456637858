"""Run the test suite on a loaded machine: busy loops on the cores, then pytest. Not a test.

Usage (from the repository root)::

    python tools/loaded_tests.py                 # two busy loops, then python -m pytest -q
    python tools/loaded_tests.py --loops 2 -- -q tests/crawler/test_kill.py

CI runs on a shared machine, so a test that passes only on a quiet one is a defect
(docs/ARCHITECTURE.md, CI). This is how the suite is held to that: the loops spin at
100% CPU for as long as pytest runs, and pytest's exit status is this command's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _spin() -> None:
    while True:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, default=2, help="busy loops (default 2: this "
                   "project's machine has 2 cores)")
    p.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default -q)")
    args = p.parse_args()
    if args.loops < 0:
        p.error("--loops cannot be negative")
    loops = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.loops)]
    for loop in loops:
        loop.start()
    started = time.monotonic()
    try:
        code = subprocess.call([sys.executable, "-m", "pytest", *(args.pytest_args or ["-q"])],
                               cwd=REPO)
    finally:
        for loop in loops:
            loop.kill()
            loop.join()
    print(f"loaded_tests: pytest exit {code} with {args.loops} busy loops, "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
