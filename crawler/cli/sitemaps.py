"""The ``sitemaps`` command: every sitemap a crawl read, one line each (or JSON lines)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from ..read.display import printable, printable_json
from ..read.sitemaps import outcome, sitemap_records
from ..state.shards import crawl_count
from ._common import log_to_stderr, stdout_gone


def add_parsers(sub: Any) -> None:
    sitemaps = sub.add_parser(
        "sitemaps",
        help="list the sitemaps a crawl read",
        description="One tab-separated line per sitemap the crawl read: how it ended (ok, "
        "http_404, too_large, bad_xml, ...), its kind (urlset, index, text, or -), the URLs "
        "it listed, how many went to the frontier (in scope, within --max-depth; the "
        "frontier then drops the ones it knows), and its URL. docs/SITEMAPS.md says what "
        "is read and what each outcome means.",
        epilog="example: python -m crawler sitemaps crawl1 --urls",
    )
    sitemaps.add_argument("data", metavar="DIR", help="crawl data directory")
    sitemaps.add_argument("--urls", action="store_true",
                          help="also each listed URL, indented, with its lastmod")
    sitemaps.add_argument("--json", action="store_true",
                          help="one JSON object per sitemap: the whole record")


def cmd_sitemaps(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    crawl_count(args.data)  # a directory that holds no crawl is an error, not an empty list
    try:
        for rec in sorted(sitemap_records(args.data), key=lambda r: r["url"]):
            if args.json:
                print(printable_json(json.dumps(rec, ensure_ascii=False, sort_keys=True)))
                continue
            print(printable(f"{outcome(rec)}") + f"\t{printable(rec['kind'] or '-')}\t"
                  f"{len(rec['urls'])}\t{rec['admitted']}\t{printable(rec['url'])}")
            if args.urls:  # what the sitemap said, escaped (crawler.read.display)
                for url, lastmod in rec["urls"]:
                    print(f"  {printable(url)}\t{printable(lastmod or '-')}")
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


COMMANDS = {"sitemaps": cmd_sitemaps}
