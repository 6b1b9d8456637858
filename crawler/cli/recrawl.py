"""``python -m crawler recrawl``: re-queue fetched pages so the next ``start`` fetches them
again, each with a conditional GET (If-None-Match, If-Modified-Since) from its record."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from ..state.recrawl import RecrawlSelection, recrawl
from ._common import age
from .retry import _statuses, locked_requeue, plural, print_counts


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "recrawl",
        help="re-queue fetched pages so the next start fetches them again, conditionally",
        description="Re-queues the pages with an HTTP answer fetched at least --older-than "
        "ago (of --host, of --status), keeping each record aside: the next start asks the "
        "server with If-None-Match / If-Modified-Since from it. A 304 keeps the stored body "
        "and links and updates the fetch time (the record says revisit: not_modified, and "
        "the WARC export writes a revisit record); any other answer replaces the record. "
        "The crawl must be stopped. See docs/RETRY.md.",
        epilog="example: python -m crawler recrawl crawl1 --older-than 7d --host h0.test",
    )
    p.add_argument("data", metavar="DIR", help="crawl data directory (the crawl stopped)")
    p.add_argument("--older-than", type=age, required=True, metavar="AGE",
                   help="pages fetched at least this long ago: 90s, 30m, 12h, 7d, 2w (0: all)")
    p.add_argument("--host", action="append", default=[], metavar="HOST",
                   help="only this host's pages (repeatable)")
    p.add_argument("--status", type=_statuses, action="extend", default=[], metavar="CODE",
                   help="only pages of this HTTP status or class (200, 4xx); repeatable")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be re-queued, change nothing")


def cmd_recrawl(args: argparse.Namespace) -> int:
    data = args.data
    selection = RecrawlSelection(args.older_than, tuple(args.host), tuple(args.status))
    report = locked_requeue(data, args.dry_run,
                            lambda: recrawl(data, selection, dry_run=args.dry_run))
    if not report.requeued:
        print(f"recrawl {data}: no pages to re-queue")
        return 0
    verb = "would re-queue" if args.dry_run else "re-queued"
    shards = f" in {report.shards} shards" if report.shards > 1 else ""
    print(f"recrawl {data}: {verb} {plural(report.requeued, 'page')}{shards}")
    print_counts(report.counts)
    if not args.dry_run:
        print(f"resume: python -m crawler start --data {shlex.quote(data)}")
    return 0


COMMANDS = {"recrawl": cmd_recrawl}
