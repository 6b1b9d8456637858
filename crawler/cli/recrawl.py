"""``python -m crawler recrawl``: re-queue fetched pages so the next ``start`` fetches them
again, each with a conditional GET (If-None-Match, If-Modified-Since) from its record."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
from typing import Any

from ..exceptions import CrawlerError, DataDirError
from ..state.recrawl import RecrawlSelection, parse_age, recrawl
from ..state.shards import read_count
from ._common import log_to_stderr
from .retry import _count, _statuses, _supervisor_lock


def _age(value: str) -> float:
    try:
        return parse_age(value)
    except CrawlerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    p.add_argument("--older-than", type=_age, required=True, metavar="AGE",
                   help="pages fetched at least this long ago: 90s, 30m, 12h, 7d, 2w (0: all)")
    p.add_argument("--host", action="append", default=[], metavar="HOST",
                   help="only this host's pages (repeatable)")
    p.add_argument("--status", type=_statuses, action="extend", default=[], metavar="CODE",
                   help="only pages of this HTTP status or class (200, 4xx); repeatable")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be re-queued, change nothing")


def cmd_recrawl(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    data = args.data
    if not os.path.isdir(data):
        raise DataDirError(f"{data}: no such crawl directory")
    count = read_count(data)
    if count is None:
        raise DataDirError(f"{data}: not a crawl directory (it has no main/)")
    selection = RecrawlSelection(args.older_than, tuple(args.host), tuple(args.status))
    lock = _supervisor_lock(data) if count > 1 and not args.dry_run else None
    try:
        report = recrawl(data, selection, dry_run=args.dry_run)
    finally:
        if lock is not None:
            os.close(lock)
    if not report.requeued:
        print(f"recrawl {data}: no pages to re-queue")
        return 0
    verb = "would re-queue" if args.dry_run else "re-queued"
    shards = f" in {report.shards} shards" if report.shards > 1 else ""
    print(f"recrawl {data}: {verb} {_count(report.requeued, 'page')}{shards}")
    width = max(len(k) for k in report.counts)
    for key, n in sorted(report.counts.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {key:<{width}}  {n}")
    if not args.dry_run:
        print(f"resume: python -m crawler start --data {shlex.quote(data)}")
    return 0


COMMANDS = {"recrawl": cmd_recrawl}
