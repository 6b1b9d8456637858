"""Measure a crawl of the test web: pages/s and the crawler's peak RSS. Not a test.

    python tools/measure_crawl.py --pages 50000 --hosts 20 --threads 64 --per-host 8
    python tools/measure_crawl.py --pages 20000 --hosts 1000 --threads 5000 --slow 1

The test web runs in this process (its server threads); the crawler runs as
``python -m crawler start`` in a child process, so its peak RSS is the child's
``ru_maxrss``. ``--slow S`` makes every page of every host answer after S
seconds (the slow-site case: it measures threads and memory, not the engine).
Prints one JSON object; loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.testweb import SiteConfig, TestWeb, fault

REPO = Path(__file__).resolve().parents[1]


def crawl_command(web: TestWeb, data: str | os.PathLike[str], *options: str) -> list[str]:
    """``python -m crawler start`` aimed at ``web``: its seed, its DNS server and CA,
    loopback allowed, every host in scope; ``options`` come after (and win)."""
    host, port = web.nameserver
    return [
        sys.executable,
        "-m",
        "crawler",
        "start",
        web.seed_url,
        "--data",
        str(data),
        "--nameserver",
        f"{host}:{port}",
        "--allow-private-ips",
        "--ca-bundle",
        str(web.ca_file),
        "--broad",
        *options,
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=50_000)
    p.add_argument("--hosts", type=int, default=20)
    p.add_argument("--threads", type=int, default=64)
    p.add_argument("--per-host", type=int, default=8)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--slow", type=float, default=0.0, help="seconds before every page's first byte")
    p.add_argument("--max-pages", type=int, help="stop the crawl after this many fetches")
    p.add_argument("--processes", type=int, default=1,
                   help="shard processes (a sharded crawl splits --max-pages over its shards)")
    p.add_argument("--ignore-robots", action="store_true")
    p.add_argument("--data", help="crawl directory (default: a temporary one)")
    args = p.parse_args()

    faults = []
    if args.slow:
        faults = [
            fault("slow_first_byte", host=f"h{i}.test", prefix="/", delay=args.slow)
            for i in range(args.hosts)
        ]
    config = SiteConfig(pages=args.pages, hosts=args.hosts, seed=0, crawl_delay=0.0)
    with TestWeb(config, faults=faults) as web, tempfile.TemporaryDirectory() as tmp:
        data = args.data or os.path.join(tmp, "crawl")
        host, port = web.nameserver
        cmd = crawl_command(
            web,
            data,
            "--delay",
            str(args.delay),
            "--per-host",
            str(args.per_host),
            "--threads",
            str(args.threads),
            "--status-interval",
            "5",
            "--timeout",
            "30",
            "--processes",
            str(args.processes),
        )
        if args.max_pages:
            cmd += ["--max-pages", str(args.max_pages)]
        if args.ignore_robots:
            cmd += ["--ignore-robots"]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        summary = json.loads(proc.stdout.split(": ", 1)[1])
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = {
            "pages": args.pages,
            "hosts": args.hosts,
            "threads": args.threads,
            "per_host": args.per_host,
            "slow": args.slow,
            "fetched": summary["fetched"],
            "complete": summary["complete"],
            "wall_s": round(elapsed, 1),  # includes interpreter start-up and the store opens
            "crawl_s": summary["seconds"],
            "pages_per_s": summary["pages_per_s"],
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "server_requests": len(web.log.records()),
        }
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
