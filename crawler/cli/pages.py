"""The page commands: ``pages`` (list a crawl's page records) and ``show`` (one of them)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

from ..config import MAX_COUNT
from ..exceptions import CrawlerError, URLError
from ..read.display import printable, printable_json
from ..read.linkgraph import inlink_counts
from ..read.listing import CrawlReader, describe, host_filter, matches, page_line
from ..read.pagejson import page_object, rank_fields
from ..read.rankstore import Rank, RankStore
from ..state.pages import PageRecord
from ..web.urls import normalize, url_key
from ._common import count, log_to_stderr, stdout_gone


def add_parsers(sub: Any) -> None:
    pages = sub.add_parser(
        "pages",
        help="list a crawl's pages: status, content type, body size, URL",
        description="One tab-separated line per page record (in store order): status "
        "(0: no HTTP answer), content type (or [outcome]), stored body bytes, URL.",
        epilog="example: python -m crawler pages crawl1 --status 404 --host h0.test --limit 20",
    )
    pages.add_argument("data", metavar="DIR", help="crawl data directory")
    pages.add_argument("--status", type=count(0, 999), metavar="CODE",
                       help="only this status (0: failures)")
    pages.add_argument("--host", metavar="HOST", help="only this host (or HOST:PORT)")
    pages.add_argument("--limit", type=count(0, MAX_COUNT), metavar="N", help="at most N lines")
    pages.add_argument("--inlinks", action="store_true",
                       help="add a column before the URL: how many records link or redirect "
                       "to the page (one extra pass over the crawl)")
    pages.add_argument("--sort", choices=("store", "rank"), default="store",
                       help="store order (default), or by PageRank, strongest first, with a "
                       "column of the rank scaled to 0..100 before the URL (needs "
                       "python -m crawler rank DIR; pages recorded since come last)")
    pages.add_argument("--json", action="store_true",
                       help="one JSON object per page (the export's fields, rank, "
                       "rank_scaled and, with --inlinks, inlinks)")

    show = sub.add_parser(
        "show",
        help="show one page record: fields, headers and body (or rendered DOM)",
        description="Print a page record's fields and stored headers, then its body: as text "
        "when it is text, else a size and hex note. A page rendered in a browser also shows "
        "its render status and DOM size. URL is normalized as the crawler does.",
        epilog="example: python -m crawler show crawl1 http://h0.test:8080/",
    )
    show.add_argument("data", metavar="DIR", help="crawl data directory")
    show.add_argument("url", metavar="URL")
    show.add_argument(
        "--body-only", action="store_true", help="write only the stored body bytes to stdout"
    )
    show.add_argument(
        "--dom", action="store_true",
        help="the rendered DOM (UTF-8 HTML) in place of the body, with --body-only its bytes "
        "only; an error (exit 1) for a page that has none",
    )


def cmd_pages(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    try:
        host = host_filter(args.host) if args.host is not None else None
    except URLError as exc:
        raise CrawlerError(f"bad --host: {exc}") from None
    shown = 0
    try:
        with CrawlReader(args.data) as reader:
            store = RankStore.open(reader.data_dir)
            if args.sort == "rank" and store is None:
                raise CrawlerError(f"{args.data} has no ranks: run python -m crawler rank "
                                   f"{args.data} first")
            counts = inlink_counts(reader) if args.inlinks else None
            for page, rank in _listed(reader, store, by_rank=args.sort == "rank"):
                if args.limit is not None and shown >= args.limit:
                    break
                if not matches(page, status=args.status, host=host):
                    continue
                n = counts.get(url_key(page.url), 0) if counts is not None else None
                if args.json:
                    obj = {**page_object(page), **rank_fields(rank)}
                    obj["elapsed"] = page.elapsed
                    if n is not None:
                        obj["inlinks"] = n
                    print(printable_json(json.dumps(obj, ensure_ascii=False)))
                else:
                    line = page_line(page)
                    extra = [] if n is None else [str(n)]
                    if args.sort == "rank":
                        extra.append("-" if rank is None else f"{rank.scaled:.2f}")
                    if extra:  # the URL stays the last column (no column holds a raw tab)
                        head, _, url = line.rpartition("\t")
                        line = "\t".join([head, *extra, url])
                    print(line)
                shown += 1
            if store is not None:
                store.close()
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


def _listed(reader: CrawlReader, store: RankStore | None, *,
            by_rank: bool) -> Iterator[tuple[PageRecord, Rank | None]]:
    """The records with their ranks: in store order, or by rank (then the unranked ones)."""
    if not by_rank or store is None:
        for page in reader.pages():
            yield page, store.get(url_key(page.url)) if store is not None else None
        return
    for rid, _, _ in store.ordered():
        ranked = reader.get_key(store.key_of(rid))
        if ranked is not None:
            yield ranked, store.get(store.key_of(rid))
    for page in reader.pages():
        if store.get(url_key(page.url)) is None:
            yield page, None


def cmd_show(args: argparse.Namespace) -> int:
    try:
        url = normalize(args.url)
    except URLError as exc:
        raise CrawlerError(f"bad URL: {exc}") from None
    with CrawlReader(args.data, strict=True) as reader:
        page = reader.get(url)
        store = RankStore.open(reader.data_dir)
    if page is None:
        raise CrawlerError(f"{url}: not in the crawl {args.data}")
    rank = None
    if store is not None:
        with store:
            rank = store.get(url_key(url))
    if args.dom and not page.dom:
        raise CrawlerError(f"{url}: no rendered DOM in the record (render: "
                           f"{page.render or 'not rendered'})")
    try:
        if args.body_only:
            sys.stdout.flush()
            sys.stdout.buffer.write(page.dom if args.dom else page.body)
            sys.stdout.buffer.flush()
        else:
            text = describe(page)
            head, sep, rest = text.partition("\nheaders:")
            if page.render:  # after the record's fields, before its headers
                head += (f"\n{'render:':<14}{printable(page.render)}"
                         f"\n{'dom_bytes:':<14}{len(page.dom)}")
            if args.dom:  # the headers end at the first blank line (values hold no newline)
                headers, _, _ = rest.partition("\n\n")
                dom = page.dom.decode("utf-8", "replace")
                rest = headers + "\n\n" + printable(dom, keep="\n\t")
            if rank is not None:
                head += (f"\n{'rank:':<14}{rank.scaled:.2f} (raw {rank.raw:.6g})"
                         f"\n{'inlinks:':<14}{rank.inlinks}")
            print(head + sep + rest)
            sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


COMMANDS = {"pages": cmd_pages, "show": cmd_show}
