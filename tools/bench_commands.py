"""The read commands on a whole crawl: `rank`, `report`, `export --jsonl`, `index`
(issue 31 §2: each runs to completion in bounded memory; its time and peak RSS).

    python tools/seedscale.py --data /tmp/seed20m --port 8391        # or any crawl
    python tools/bench_commands.py --data /tmp/seed20m --work /tmp/cmds20m \\
        --command rank --command report --command export

Each command is one ``python -m crawler`` process, one after the other in the order
given, measured by ``_benchutil.run_measured``: wall and CPU seconds, the peak RSS of
the process and of its tree (``index`` reads pages in worker processes), and the
anonymous part of the RSS when it was highest (RSS also counts the pages of the
stores' mapped files, which the kernel drops when memory is short: anonymous memory is
what the command itself holds). What each command writes goes under ``--work`` (the
report, the JSONL, scratch space for the graph): its size is reported, then it is
removed unless ``--keep``. ``rank`` stores its ranks in the crawl directory and
``index`` builds the crawl's search index there (as a user's run would). A command
past ``--timeout`` seconds is stopped and reported as such: ``index`` at 20M pages
takes hours; it keeps what it read and committed, and the next run goes on from there.
Results: ``--out`` (JSON) and a table on stdout; each command's stderr in ``--work``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import _benchutil as bu  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# Each command's arguments after ``python -m crawler``; {data} and {work} filled in.
COMMANDS: dict[str, list[str]] = {
    "rank": ["rank", "{data}", "--work", "{work}", "--top", "0", "--quiet"],
    "report": ["report", "{data}", "--work", "{work}", "--out", "{work}/report.html",
               "--quiet"],
    "export": ["export", "{data}", "--jsonl", "{work}/pages.jsonl", "--quiet"],
    "index": ["index", "{data}", "--quiet"],
}


def measure(name: str, data: str, work: Path, timeout: float | None) -> dict[str, Any]:
    """Run one command on ``data`` and return its measures."""
    scratch = work / name
    scratch.mkdir(parents=True, exist_ok=True)
    argv = [arg.format(data=data, work=scratch) for arg in COMMANDS[name]]
    bu.log(f"{name}: python -m crawler {' '.join(argv)}")
    m = bu.run_measured([sys.executable, "-m", "crawler", *argv], cwd=REPO,
                        env=bu.child_env(), timeout=timeout, poll=0.1,
                        stderr_path=work / f"{name}.stderr")
    # a command over before the first poll saw its peak: ru_maxrss then (floored at this
    # script's ~20 MB, which a fork carries over; no command uses less)
    m["peak_rss_bytes"] = max(m["peak_rss_bytes"], m["ru_maxrss_bytes"])
    m["tree_peak_rss_bytes"] = max(m["tree_peak_rss_bytes"], m["peak_rss_bytes"])
    m["argv"] = argv
    m["output_bytes"] = bu.disk_usage(scratch)[0]
    if m["returncode"] not in (0, None) and not m["timed_out"]:
        bu.log(f"{name}: exit {m['returncode']}; see {work / f'{name}.stderr'}")
    return m


def recorded(data: str) -> int | None:
    """The crawl's page records, from ``status --json`` (its counters: no scan)."""
    done = subprocess.run([sys.executable, "-m", "crawler", "status", data, "--json"],
                          cwd=REPO, env=bu.child_env(), capture_output=True, text=True)
    try:
        return int(json.loads(done.stdout)["recorded"])
    except (ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="crawl directory")
    p.add_argument("--work", required=True, type=Path,
                   help="a directory for the commands' output and scratch space")
    p.add_argument("--command", action="append", choices=sorted(COMMANDS),
                   help="a command to run (repeat; default: rank, report, export)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a command may run before it is stopped (default: none)")
    p.add_argument("--keep", action="store_true", help="keep what the commands wrote")
    p.add_argument("--out", type=Path, default=Path("results/bench_commands.json"))
    args = p.parse_args(argv)
    if not os.path.isdir(args.data):
        p.error(f"--data {args.data}: not a directory")
    names = args.command or ["rank", "report", "export"]
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"data": args.data, "machine": bu.machine_info(),
                              "data_bytes": bu.disk_usage(args.data)[0],
                              "recorded": recorded(args.data), "runs": {}}
    for name in names:
        result["runs"][name] = measure(name, args.data, args.work, args.timeout)
        if not args.keep:
            shutil.rmtree(args.work / name, ignore_errors=True)
    rows = []
    for name, m in result["runs"].items():
        state = "timed out" if m["timed_out"] else f"exit {m['returncode']}"
        rows.append([name, state, f"{m['wall_s']:.0f}", f"{m['cpu_s']:.0f}",
                     bu.fmt_bytes(m["peak_rss_bytes"]), bu.fmt_bytes(m["tree_peak_rss_bytes"]),
                     bu.fmt_bytes(m["rss_anon_at_peak_bytes"]),
                     bu.fmt_bytes(m["output_bytes"])])
    table = bu.markdown_table(["command", "end", "wall s", "cpu s", "peak RSS",
                               "tree peak RSS", "anon at peak", "output"], rows)
    bu.write_results(args.out, result, f"{result['recorded']} page records, "
                     f"{bu.fmt_bytes(result['data_bytes'])}\n\n{table}")
    return 0 if all(m["returncode"] == 0 for m in result["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
