"""The ``search`` command: a query on a crawl's search index (``index`` makes it). It
imports only what a query needs, so the command starts fast."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from ..read.display import printable
from ..search.query import DEFAULT_LIMIT, DEFAULT_RANK_WEIGHT, Hit, Searcher, summary_line
from ._common import count, log_to_stderr, number, stdout_gone
from .raystart import check_ray

MAX_LIMIT = 1_000
_BOLD, _PLAIN = "\033[1m", "\033[0m"


def add_parsers(sub: Any) -> None:
    search = sub.add_parser(
        "search",
        help="search the crawl's pages (after python -m crawler index)",
        description="Ranked results: BM25 over title, headings, main text, anchor text, URL "
        "and description, blended with PageRank (after python -m crawler rank); "
        "near-duplicate pages shown once. The query language: words (all must match), "
        "\"a phrase\", word OR word, -word, title:word (fields: title, headings, body, "
        "anchors, url, description, host, lang), word^2. See docs/SEARCH.md.",
        epilog="example: python -m crawler search crawl1 'title:install \"exact phrase\"' "
        "--limit 5",
    )
    search.add_argument("data", metavar="DIR", help="crawl data directory")
    search.add_argument("query", help="what to look for (quote it for the shell; one that "
                        "starts with - goes after --)")
    search.dash_hint = ("a query that starts with - goes after --: python -m crawler "
                        "search DIR -- '-word other'")
    search.add_argument("--limit", type=count(1, MAX_LIMIT), default=DEFAULT_LIMIT,
                        metavar="N", help="results shown")
    search.add_argument("--host", metavar="HOST", help="only pages of this host")
    search.add_argument("--lang", metavar="CODE", help="only pages in this language (en, de...)")
    search.add_argument("--rank-weight", type=number(0, 100), default=DEFAULT_RANK_WEIGHT,
                        metavar="W", help="PageRank's weight in the score (0: BM25 alone)")
    search.add_argument("--json", action="store_true",
                        help="the results as one JSON object (score parts included)")
    search.add_argument("--ray", metavar="ADDRESS",
                        help="a crawl that ran on Ray: ask each shard's index on its node "
                        "(local, auto or HOST:PORT)")


def _marked(hit: Hit, tty: bool) -> str:
    """The snippet with the query's words marked: bold on a terminal, else **word**."""
    start, end = (_BOLD, _PLAIN) if tty else ("**", "**")
    out, last = [], 0
    for a, b in hit.highlights:
        out += [printable(hit.snippet[last:a]), start, printable(hit.snippet[a:b]), end]
        last = b
    out.append(printable(hit.snippet[last:]))
    return "".join(out)


def cmd_search(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING)
    if args.ray is not None:
        check_ray(args.ray)
    if args.ray is None:
        searcher = Searcher(args.data, rank_weight=args.rank_weight)
    else:
        from ..search.onray import RaySearcher  # Ray's client: only when asked for

        searcher = RaySearcher(args.data, args.ray, rank_weight=args.rank_weight)
    with searcher:
        results = searcher.search(args.query, limit=args.limit, host=args.host, lang=args.lang)
    try:
        if args.json:
            print(json.dumps(results.as_json()))
            return 0
        tty = sys.stdout.isatty()
        for n, hit in enumerate(results.hits, 1):
            print(f"{n}. {printable(hit.title) or '(no title)'}")
            print(f"   {printable(hit.url)}")
            if hit.snippet:
                print(f"   {_marked(hit, tty)}")
            rank = "not ranked" if hit.pagerank is None else f"PageRank {hit.pagerank:.3g}"
            same = f"; {len(hit.duplicates)} near-duplicate(s)" if hit.duplicates else ""
            print(f"   score {hit.score:.3f} = BM25 {hit.bm25:.3f} x {hit.score / hit.bm25:.3f} "
                  f"({rank}){same}" if hit.bm25 else f"   score {hit.score:.3f}")
        print(f"{summary_line(results)} ({results.seconds * 1000:.1f} ms)")
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


COMMANDS = {"search": cmd_search}
