"""The page commands: ``pages`` (list a crawl's page records) and ``show`` (one of them)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from ..exceptions import CrawlerError, URLError
from ..read.listing import CrawlReader, describe, host_filter, matches, page_line
from ..web.urls import normalize
from ._common import log_to_stderr, stdout_gone


def add_parsers(sub: Any) -> None:
    pages = sub.add_parser(
        "pages",
        help="list a crawl's pages: status, content type, body size, URL",
        description="One tab-separated line per page record (in store order): status "
        "(0: no HTTP answer), content type (or [outcome]), stored body bytes, URL.",
        epilog="example: python -m crawler pages crawl1 --status 404 --host h0.test --limit 20",
    )
    pages.add_argument("data", metavar="DIR", help="crawl data directory")
    pages.add_argument("--status", type=int, metavar="CODE", help="only this status (0: failures)")
    pages.add_argument("--host", metavar="HOST", help="only this host (or HOST:PORT)")
    pages.add_argument("--limit", type=int, metavar="N", help="at most N lines")

    show = sub.add_parser(
        "show",
        help="show one page record: fields, headers and body",
        description="Print a page record's fields and stored headers, then its body: as text "
        "when it is text, else a size and hex note. URL is normalized as the crawler does.",
        epilog="example: python -m crawler show crawl1 http://h0.test:8080/",
    )
    show.add_argument("data", metavar="DIR", help="crawl data directory")
    show.add_argument("url", metavar="URL")
    show.add_argument(
        "--body-only", action="store_true", help="write only the stored body bytes to stdout"
    )


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; parser.error exits 2."""
    if args.command == "pages" and args.limit is not None and args.limit < 0:
        parser.error("pages: --limit cannot be negative")


def cmd_pages(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    try:
        host = host_filter(args.host) if args.host is not None else None
    except URLError as exc:
        raise CrawlerError(f"bad --host: {exc}") from None
    shown = 0
    try:
        with CrawlReader(args.data) as reader:
            for page in reader.pages():
                if args.limit is not None and shown >= args.limit:
                    break
                if matches(page, status=args.status, host=host):
                    print(page_line(page))
                    shown += 1
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        url = normalize(args.url)
    except URLError as exc:
        raise CrawlerError(f"bad URL: {exc}") from None
    with CrawlReader(args.data, strict=True) as reader:
        page = reader.get(url)
    if page is None:
        raise CrawlerError(f"{url}: not in the crawl {args.data}")
    try:
        if args.body_only:
            sys.stdout.flush()
            sys.stdout.buffer.write(page.body)
            sys.stdout.buffer.flush()
        else:
            print(describe(page))
            sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


COMMANDS = {"pages": cmd_pages, "show": cmd_show}
