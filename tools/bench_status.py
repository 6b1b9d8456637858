"""``status DIR`` from the committer's counters against ``status DIR --recount`` (a scan of
every record and bulk), on a synthetic crawl built through the crawler's own frontier.

    python tools/bench_status.py --pages 200000 --workdir /tmp/bench-status --repeat 3

The crawl: ``--pages`` page records (a 2 KB body each, the outcomes a broad crawl
has: 200, 301, 404, robots_disallowed, dns_nxdomain) and ``--pending`` URLs left in
PendDB, written by a real Frontier (seeds, claims, submitted outcomes, commits), so
its counts.json is the committer's. Each status is a fresh ``python -m crawler
status DIR --json`` process (interpreter start included), timed wall-clock; the
median of ``--repeat``. The data stays under ``--workdir`` (never the repository).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crawler.state.frontier import Frontier, Outcome  # noqa: E402
from crawler.state.pages import PageRecord, Pending, encode_page  # noqa: E402
from tools._benchutil import machine_info, median  # noqa: E402

_OUTCOMES = [(200, ""), (200, ""), (200, ""), (200, ""), (301, ""), (404, ""),
             (0, "robots_disallowed"), (0, "dns_nxdomain")]
_BODY = os.urandom(1024).hex().encode()  # 2 KB that zlib cannot shrink much


def build(data: Path, pages: int, pending: int) -> None:
    """A crawl of ``pages`` records and ``pending`` URLs waiting, through the frontier."""
    frontier = Frontier(str(data), sync_interval=3600)
    try:
        urls = [Pending(f"http://h{i % 5000}.bench/p{i}") for i in range(pages + pending)]
        frontier.add_seeds(urls)
        frontier.commit()
        done = 0
        while done < pages:
            claimed = frontier.claim()
            if claimed is None:
                break
            for c in claimed:
                if done >= pages:
                    frontier.release(c)
                    continue
                status, reason = _OUTCOMES[done % len(_OUTCOMES)]
                page = PageRecord(url=c.entry.url, status=status, fetched_at=time.time(),
                                  depth=0, reason=reason, body=_BODY if status == 200 else b"")
                frontier.submit(Outcome(c, encode_page(page)))
                done += 1
            frontier.commit()
    finally:
        frontier.close()


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
