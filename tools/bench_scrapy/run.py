"""Run the benchmark spider once and print one JSON line (runs in the Scrapy venv).

    python -m tools.bench_scrapy.run --seed URL --hosts h0.test,h1.test \
        --nameserver 127.0.0.1:PORT --concurrency 64 --per-host 16 --urls out.txt

Settings are the benchmark's "same rules for both crawlers": robots.txt
obeyed, no delay, no AutoThrottle, unlimited depth, the given total and
per-host concurrency, no cookies (our crawler keeps none), no proxies (the
benchmark never leaves loopback), HTTP errors passed to the spider so 404s
are counted like ours. ``--max-pages`` closes the spider after that many
responses (CLOSESPIDER_PAGECOUNT).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from scrapy.crawler import CrawlerProcess

from tools.bench_scrapy.spider import BenchSpider


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "BOT_NAME": "bench",
        "USER_AGENT": "scrapy-bench/1.0",
        "ROBOTSTXT_OBEY": True,
        "CONCURRENT_REQUESTS": args.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": args.per_host,
        "DOWNLOAD_DELAY": 0,
        "AUTOTHROTTLE_ENABLED": False,
        "DEPTH_LIMIT": 0,
        "COOKIES_ENABLED": False,
        "HTTPPROXY_ENABLED": False,
        "HTTPERROR_ALLOW_ALL": True,
        "TELNETCONSOLE_ENABLED": False,
        "MEMUSAGE_ENABLED": False,
        "LOG_LEVEL": args.log_level,
        "CLOSESPIDER_PAGECOUNT": args.max_pages or 0,
        "TWISTED_DNS_RESOLVER": "tools.bench_scrapy.spider.LoopbackResolver",
        "BENCH_NAMESERVER": args.nameserver,
        "DNS_TIMEOUT": 5,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", required=True)
    p.add_argument("--hosts", required=True, help="comma-separated hosts in scope")
    p.add_argument("--nameserver", required=True, help="IP:PORT of the loopback DNS server")
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--per-host", type=int, required=True)
    p.add_argument("--urls", required=True, help="write one fetched URL per line here")
    p.add_argument("--max-pages", type=int, default=0)
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args()
    process = CrawlerProcess(settings(args))
    crawler = process.create_crawler(BenchSpider)
    process.crawl(crawler, seed=args.seed, hosts=args.hosts, urls_path=args.urls)
    started = time.monotonic()
    process.start()
    wall = time.monotonic() - started
    stats = crawler.stats.get_stats() if crawler.stats else {}
    out = {
        "wall_s": round(wall, 2),
        "stats": {k: v if isinstance(v, (int, float, str)) else str(v) for k, v in stats.items()},
    }
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
