"""The ``sitemaps`` command: every sitemap a crawl read, one line each (or JSON lines)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from ..exceptions import CrawlerError
from ..read.sitemaps import outcome, sitemap_records
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
    if not os.path.isdir(args.data):
        raise CrawlerError(f"{args.data}: no such crawl directory")
    try:
        for rec in sorted(sitemap_records(args.data), key=lambda r: r["url"]):
            if args.json:
                print(json.dumps(rec, ensure_ascii=False, sort_keys=True))
                continue
            print(f"{outcome(rec)}\t{rec['kind'] or '-'}\t{len(rec['urls'])}\t"
                  f"{rec['admitted']}\t{rec['url']}")
            if args.urls:
                for url, lastmod in rec["urls"]:
                    print(f"  {url}\t{lastmod or '-'}")
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


COMMANDS = {"sitemaps": cmd_sitemaps}
