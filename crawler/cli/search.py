"""The ``index`` and ``search`` commands: a crawl's full-text index, and queries on it."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from ..config import MAX_BODY_BYTES, MAX_COUNT, MAX_SECONDS
from ..exceptions import CrawlerError
from ..read.display import printable
from ..read.pagetext import DEFAULT_TEXT_LIMIT
from ..search.indexer import DEFAULT_BATCH, DEFAULT_MEMORY, MIN_MEMORY, index_crawl
from ..search.onray import RaySearcher, index_on_ray
from ..search.query import DEFAULT_LIMIT, DEFAULT_RANK_WEIGHT, Hit, Searcher
from ._common import count, log_to_stderr, number, size_in, stdout_gone
from .export import INTERRUPTED, write_error
from .progress import DEFAULT_INTERVAL, Progress
from .raystart import check_ray

MAX_LIMIT = 1_000
_BOLD, _PLAIN = "\033[1m", "\033[0m"


def add_parsers(sub: Any) -> None:
    index = sub.add_parser(
        "index",
        help="build or update the crawl's search index (DIR/search, one per shard)",
        description="Read the pages recorded since the last run (all of them the first "
        "time; read-only: works beside a running crawl) and index their main content "
        "(boilerplate removed), title, headings, description, URL words and the anchor text "
        "of the links to them, with each page's language and SimHash. Pages that went away "
        "or became errors or noindex are removed. A stop (Ctrl-C, kill -9) loses at most "
        "the 1,000 pages being read or the batch being written: the next run goes on from "
        "there (what was read waits in DIR/search/spill). See docs/SEARCH.md.",
        epilog="example: python -m crawler index crawl1 && python -m crawler search crawl1 "
        "'\"exact phrase\" word'",
    )
    index.add_argument("data", metavar="DIR", help="crawl data directory")
    index.add_argument("--rebuild", action="store_true",
                       help="index every page again from nothing (also drops anchor text "
                       "of links pages no longer have)")
    index.add_argument("--memory", type=size_in(MIN_MEMORY, 1 << 40), default=DEFAULT_MEMORY,
                       metavar="BYTES", help="the index writer's memory (K, M, G suffixes; "
                       "default 64M, at least 16M): what bounds the run's memory")
    index.add_argument("--batch", type=count(1, MAX_COUNT), default=DEFAULT_BATCH,
                       metavar="N", help="pages a commit (what a kill can lose)")
    index.add_argument("--workers", type=count(0, 1024), default=0, metavar="N",
                       help="processes reading pages (default 0: one a CPU this process "
                       "may use)")
    index.add_argument("--text-limit", type=count(1, MAX_BODY_BYTES), default=DEFAULT_TEXT_LIMIT,
                       metavar="CHARS", help="main text indexed a page")
    index.add_argument("--json", action="store_true", help="the summary as one JSON object")
    index.add_argument("--progress-interval", type=number(0, MAX_SECONDS),
                       default=DEFAULT_INTERVAL, metavar="S",
                       help="seconds between progress lines when stderr is not a terminal "
                       "(default: %(default)s)")
    index.add_argument("--quiet", action="store_true", help="no progress: only warnings")
    index.add_argument("--ray", metavar="ADDRESS",
                       help="a crawl that ran on Ray: index each shard on its node, in an "
                       "actor (local, auto or HOST:PORT; docs/SEARCH.md)")

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
    search.add_argument("query", help="what to look for (quote it for the shell)")
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


def cmd_index(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    try:
        if args.ray is not None:
            check_ray(args.ray)
            stats = index_on_ray(args.data, args.ray, batch=args.batch, memory=args.memory,
                                 rebuild=args.rebuild, text_limit=args.text_limit,
                                 workers=args.workers)
        else:
            with Progress(quiet=args.quiet, interval=args.progress_interval) as progress:
                stats = index_crawl(args.data, batch=args.batch, memory=args.memory,
                                    rebuild=args.rebuild, text_limit=args.text_limit,
                                    workers=args.workers,
                                    progress=progress.phase("index"))
    except OSError as exc:
        raise CrawlerError(write_error("cannot write the search index", exc)) from exc
    except KeyboardInterrupt:
        print("crawler: index interrupted: the pages read and the pages committed are kept; "
              "run it again to go on from there", file=sys.stderr)
        return INTERRUPTED
    try:
        if args.json:
            print(json.dumps({k: getattr(stats, k) for k in stats.__slots__}))
        else:
            print(stats.summary())
    except BrokenPipeError:
        return stdout_gone()
    return 0


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
    with (Searcher(args.data, rank_weight=args.rank_weight) if args.ray is None else
          RaySearcher(args.data, args.ray, rank_weight=args.rank_weight)) as searcher:
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
        print(f"{len(results.hits)} of {results.matches:,} matching pages "
              f"({results.seconds * 1000:.1f} ms)")
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


COMMANDS = {"index": cmd_index, "search": cmd_search}
