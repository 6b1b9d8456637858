"""Build a crawl directory the size of the original's (issue 31): 20.4M page records over
~1M hosts and 27.6M pending URLs in 2 shards, through the crawler's own state layer.

    python tools/seedscale.py --data /tmp/seedscale              # the original's size
    python tools/seedscale.py --pages 1000000 --pending 1350000 --data /tmp/seed1m

Each shard is written by a real Frontier (add_seeds, claim, submit, commit) with
page records from encode_page, one process a shard, in parallel (tools/_seedbuild.py;
the synthetic web is tools/_seedweb.py). What the records hold:

- outcomes in broad-crawl shares, in the crawler's vocabulary (crawler/outcomes.py):
  200 (77 %), not_html, too_large, 301/302/307/308 (8.5 %), redirect_limit, 404, 403,
  410, 401, 500, 503, robots_disallowed/unavailable, read/total timeouts, reset,
  protocol; and hosts that never answered (dns_*, connect_*/tls, then bad_host:*);
- hosts Zipf-like (``h0.test`` the largest), ~1M for 20.4M pages (scaled with --pages);
- a 200 HTML page has 20-40 links (70 % to its own host), each a recorded or pending
  URL: its record's link list and its body's anchors; every pending URL is listed
  by at least one page;
- bodies: a small HTML page (title, ~20 words of text, the links as <a> elements;
  1.7 KB on average, 0.6 KB compressed); 3xx/4xx/5xx keep no body, as the crawler does;
- depth (0 for the seeds, the largest hosts' home pages), fetch times over --weeks.

The directory is resumable with ``python -m crawler start --data DIR`` (shards.json,
settings.json with --broad, seeds.txt) and ``status DIR`` reads its counters. The
data stays where --data says (keep it in /tmp, never in the repository).
Progress goes to stderr; a JSON summary to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crawler.outcomes import by_class  # noqa: E402
from tools._benchutil import machine_info  # noqa: E402
from tools._seedbuild import build_crawl  # noqa: E402
from tools._seedweb import Shape  # noqa: E402

ORIGINAL_PAGES = 20_400_000
ORIGINAL_PENDING = 27_600_000
ORIGINAL_HOSTS = 1_000_000


def disk_bytes(path: str) -> int:
    """Bytes the directory takes on disk (du: blocks, not file sizes)."""
    out = subprocess.run(["du", "-sB1", path], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def summarize(shape: Shape, data: str, shards: list[dict[str, Any]], seconds: float
              ) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    for s in shards:
        outcomes.update(s["outcomes"])
    recorded = sum(s["recorded"] for s in shards)
    disk = disk_bytes(data)
    return {
        "data": data,
        "shape": {"pages": shape.pages, "pending": shape.pending, "hosts": shape.hosts,
                  "shards": shape.shards, "seed": shape.seed},
        "seconds": round(seconds, 1),
        "pages_per_s": round(recorded / seconds, 1),
        "recorded": recorded,
        "pending": sum(s["pending"] for s in shards),
        "outcomes": dict(sorted(outcomes.items())),
        "classes": by_class(dict(outcomes)),
        "disk_bytes": disk,
        "disk_bytes_per_page": round(disk / recorded, 1),
        "peak_rss_mb": max(s["peak_rss_mb"] for s in shards),
        "per_shard": [{k: v for k, v in s.items() if k != "outcomes"} for s in shards],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=ORIGINAL_PAGES, help="page records")
    p.add_argument("--pending", type=int, default=ORIGINAL_PENDING, help="pending URLs")
    p.add_argument("--hosts", type=int, default=None,
                   help=f"hosts (default: {ORIGINAL_HOSTS:,} x pages / {ORIGINAL_PAGES:,})")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--jobs", type=int, default=None,
                   help="builder processes at once (default: one a shard, up to the CPUs)")
    p.add_argument("--data", "--workdir", dest="data", default="/tmp/seedscale",
                   help="the crawl directory to create (must not hold a crawl)")
    p.add_argument("--seed", type=int, default=1, help="same seed, same records")
    p.add_argument("--port", type=int, default=None,
                   help="a port in every URL (a loopback test web's); default none")
    p.add_argument("--weeks", type=float, default=6.0, help="fetch times span this")
    p.add_argument("--pad", type=int, default=0, metavar="BYTES",
                   help="incompressible text added to each HTML body (default 0: 0.6 KB "
                   "compressed bodies; 16000 gives ~8 KB, a realistic compressed page)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hosts = args.hosts or max(1, round(ORIGINAL_HOSTS * args.pages / ORIGINAL_PAGES))
    shape = Shape(pages=args.pages, pending=args.pending, hosts=hosts, shards=args.shards,
                  seed=args.seed, port=args.port, weeks=args.weeks, pad=args.pad)
    started = time.perf_counter()
    shards = build_crawl(shape, args.data, jobs=args.jobs, verbose=not args.quiet)
    summary = summarize(shape, args.data, shards, time.perf_counter() - started)
    summary["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    summary["machine"] = machine_info()
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
