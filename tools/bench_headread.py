"""`retry --dry-run` and `recrawl --dry-run` on crawl directories, one checkout against
another (issue 31: a selection that reads no body; give a copy of a crawl without its
``outcomes.bin`` as a second ``--data`` to see what the outcome log saves).

Each run is a fresh ``python -m crawler`` in the checkout's directory, alternating
between the checkouts; a table of the median wall time, the bytes the process read
through read()/pread() (``rchar`` of /proc/self/io: the kvstore reads of the old path
go through an mmap and do not count there) and from the disk (``read_bytes``). With
``--cold`` the crawl's files are dropped from the page cache before each run
(posix_fadvise DONTNEED on each file: nothing else on the machine is touched).

    python tools/bench_headread.py --data /tmp/seed1m --tree before=/tmp/before \\
        --tree after=. --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Runs the CLI, then prints the process's I/O counters as the last line of stderr.
_RUNNER = ("import resource, sys, crawler.cli as c; rc = c.main(sys.argv[1:]); "
           "print('IO', open('/proc/self/io').read().replace(chr(10), ' '), 'maxrss_kb:', "
           "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); "
           "sys.exit(rc)")
COMMANDS = {
    "retry": ["retry", "{data}", "--dry-run"],
    "recrawl": ["recrawl", "{data}", "--older-than", "7d", "--dry-run"],
}


def drop_cache(data: str) -> None:
    for root, _, files in os.walk(data):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run(tree: str, argv: list[str]) -> tuple[float, dict[str, int], str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _RUNNER, *argv], cwd=tree, env=env,
                          capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - started
    line = [x for x in done.stderr.splitlines() if x.startswith("IO ")][-1].split()[1:]
    io = {line[i].rstrip(":"): int(line[i + 1]) for i in range(0, len(line), 2)}
    return seconds, io, done.stdout.splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, action="append", help="crawl directory (repeat)")
    p.add_argument("--tree", required=True, action="append", metavar="NAME=DIR",
                   help="a checkout to run (repeat; runs alternate between them)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--command", choices=sorted(COMMANDS), action="append")
    p.add_argument("--cold", action="store_true", help="drop the crawl from the page cache first")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    results = []
    for data in args.data:
        for command in args.command or sorted(COMMANDS):
            cli = [a.format(data=data) for a in COMMANDS[command]]
            got: dict[str, list[tuple[float, dict[str, int], str]]] = {n: [] for n in trees}
            for _ in range(args.runs):
                for name, tree in trees.items():
                    if args.cold:
                        drop_cache(data)
                    got[name].append(run(tree, cli))
            for name, runs in got.items():
                row = {
                    "data": data, "command": " ".join(cli), "tree": name, "cold": args.cold,
                    "seconds": [round(r[0], 2) for r in runs],
                    "median_s": round(statistics.median(r[0] for r in runs), 2),
                    "rchar_mb": round(statistics.median(r[1]["rchar"] for r in runs) / 1e6, 1),
                    "disk_mb": round(statistics.median(r[1]["read_bytes"] for r in runs) / 1e6, 1),
                    "peak_rss_mb": round(max(r[1]["maxrss_kb"] for r in runs) / 1e3),
                    "output": runs[0][2],
                }
                results.append(row)
                print(f"{data}\t{command}\t{name}\t{row['median_s']} s {row['seconds']}\t"
                      f"rchar {row['rchar_mb']} MB\tdisk {row['disk_mb']} MB\t"
                      f"peak RSS {row['peak_rss_mb']} MB\t{row['output']}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
