"""The ``links`` command: a page's outlinks (from its record) and inlinks (one pass)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from ..exceptions import CrawlerError, URLError
from ..read.display import printable, printable_json
from ..read.linkgraph import Link, inlinks, outlinks
from ..read.listing import CrawlReader
from ..web.urls import normalize, url_key
from ._common import log_to_stderr, stdout_gone


def add_parsers(sub: Any) -> None:
    links = sub.add_parser(
        "links",
        help="show a page's outlinks and inlinks",
        description="One tab-separated line per edge: direction (out/in), the other end's "
        "status (- when the crawl has no record of it), flags (nofollow, redirect, or -), "
        "and its URL (key:HEX when the crawl never recorded that URL). Outlinks come from "
        "the page's record, inlinks from one pass over every record. URL is normalized as "
        "the crawler does.",
        epilog="example: python -m crawler links crawl1 http://h0.test:8080/ --no-inlinks",
    )
    links.add_argument("data", metavar="DIR", help="crawl data directory")
    links.add_argument("url", metavar="URL")
    links.add_argument("--no-inlinks", action="store_true",
                       help="only the outlinks (no pass over the crawl)")
    links.add_argument("--json", action="store_true",
                       help="one JSON object: url, outlinks, inlinks")


def _line(direction: str, link: Link) -> str:
    flags = ",".join(f for f, on in (("redirect", link.redirect), ("nofollow", link.nofollow))
                     if on) or "-"
    status = "-" if link.status is None else str(link.status)
    where = printable(link.url) if link.url is not None else f"key:{link.key.hex()}"
    return f"{direction}\t{status}\t{flags}\t{where}"


def cmd_links(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    try:
        url = normalize(args.url)
    except URLError as exc:
        raise CrawlerError(f"bad URL: {exc}") from None
    key = url_key(url)
    try:
        with CrawlReader(args.data) as reader:
            page = reader.get_key(key, with_body=False)
            if page is None:
                raise CrawlerError(f"{url}: not in the crawl {args.data}")
            out = outlinks(reader, page)
            if args.json:
                found = [] if args.no_inlinks else list(inlinks(reader, key))
                print(printable_json(json.dumps({
                    "url": url, "status": page.status,
                    "outlinks": [link.as_dict() for link in out],
                    "inlinks": [link.as_dict() for link in found]}, ensure_ascii=False)))
            else:
                for link in out:
                    print(_line("out", link))
                if not args.no_inlinks:
                    for link in inlinks(reader, key):
                        print(_line("in", link))
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


COMMANDS = {"links": cmd_links}
