"""Where a command's CPU goes, by kind of process, the whole machine's. Not a test.

Usage (from the repository root, on a quiet machine)::

    python tools/proc_cpu.py -- python -m pytest -q -p no:cacheprovider
    python tools/proc_cpu.py --interval 1 --json cpu.json -- python -m pytest -q FILE

While the command runs, every process of the machine is read from /proc every
``--interval`` seconds; at its end, the CPU each process used while it was seen is
summed by kind: the kernel thread or program's name, and for Python the module or
script it runs (``python -m crawler start``, ``ray::ShardActor``, ...). The kernel's
own threads count (a memory monitor such as kdamond can take a sixth of the machine
while a suite runs), and so do daemons the command's process tree never waits for (a
Ray head, nginx), which the command's own rusage would miss. A process that starts
and ends between two reads is not seen: the last row, ``(between reads)``, is the
machine's busy time (/proc/stat) less everything seen, so the rows add up. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

try:
    from tools.suite_cpu import busy_seconds
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools.suite_cpu import busy_seconds

TICK = os.sysconf("SC_CLK_TCK")
UNSEEN = "(between reads)"


def kind(comm: str, argv: list[str]) -> str:
    """A process's kind: its name, and for a Python interpreter what it runs (``-m
    MODULE``, a script's file name, or ``-c`` with the code's first words)."""
    if not comm.startswith("python") or len(argv) < 2:
        return comm
    args = [a for a in argv[1:] if a not in ("-u", "-B", "-E", "-I", "-s", "-S", "-O")]
    if not args:
        return comm
    if args[0] == "-m" and len(args) > 1:
        return " ".join(["python -m", *args[1:3]])
    if args[0] == "-c" and len(args) > 1:
        return "python -c " + " ".join(args[1].split()[:2])[:40]
    return f"python {Path(args[0]).name}"


def read_all() -> dict[tuple[int, int], tuple[str, float, bool]]:
    """Every live process: (pid, start time) -> (kind, CPU-seconds so far, whether its
    command line was there: an exited process not yet reaped has none)."""
    seen = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
        words = [a.decode(errors="replace") for a in argv if a]
        seen[(int(entry), int(fields[19]))] = (kind(comm, words), cpu, bool(words))
    return seen


def merge(into: dict[tuple[int, int], tuple[str, float, bool]],
          read: dict[tuple[int, int], tuple[str, float, bool]]) -> None:
    """The latest CPU of each process, under the kind of its latest command line (a
    child's changes at its exec; a zombie's is gone: the one before is kept)."""
    for key, (name, cpu, named) in read.items():
        old = into.get(key)
        if old is not None and not named:
            name, named = old[0], old[2]
        into[key] = (name, cpu, named)


def run(command: list[str], interval: float) -> tuple[int, dict[str, float], float, float]:
    """Run ``command``; (its exit code, CPU-seconds by kind, the machine's busy
    CPU-seconds meanwhile, the wall seconds)."""
    before = read_all()  # what ran before counts from here, not since its start
    first = {key: cpu for key, (_, cpu, _) in before.items()}
    busy, started = busy_seconds(), time.monotonic()
    last = dict(before)
    proc = subprocess.Popen(command)
    while True:
        try:
            code = proc.wait(timeout=interval)
            break
        except subprocess.TimeoutExpired:
            merge(last, read_all())
    merge(last, read_all())
    used: dict[str, float] = defaultdict(float)
    for key, (name, cpu, _) in last.items():
        used[name] += cpu - first.get(key, 0.0)
    total = busy_seconds() - busy
    used[UNSEEN] = max(0.0, total - sum(used.values()))
    return code, used, total, time.monotonic() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interval", type=float, default=2.0, help="seconds between reads")
    p.add_argument("--top", type=int, default=25, help="kinds shown (the rest summed)")
    p.add_argument("--json", metavar="FILE", help="also write every kind's CPU-s there")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- and the command")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command: put it after --")
    if args.interval <= 0:
        p.error("--interval must be above 0")
    code, used, total, wall = run(command, args.interval)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"cpu_s": total, "wall_s": wall, "exit": code, "kinds": used}, indent=1))
    print(f"{total:9.1f} CPU-s in {wall:.1f} s, the whole machine; by kind:")
    shown = sorted(((k, v) for k, v in used.items() if k != UNSEEN and v >= 0.05),
                   key=lambda row: -row[1])[:args.top]
    for name, cpu in shown:
        print(f"{cpu:9.1f} {100 * cpu / total if total else 0:5.1f}%  {name}")
    rest = sum(v for k, v in used.items() if k != UNSEEN) - sum(v for _, v in shown)
    print(f"{rest:9.1f} {100 * rest / total if total else 0:5.1f}%  (the other kinds)")
    print(f"{used[UNSEEN]:9.1f} {100 * used[UNSEEN] / total if total else 0:5.1f}%  {UNSEEN}")
    return code


if __name__ == "__main__":
    sys.exit(main())
