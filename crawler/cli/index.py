"""The ``index`` command: build or update a crawl's full-text search index."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from ..config import MAX_BODY_BYTES, MAX_COUNT, MAX_SECONDS
from ..exceptions import CrawlerError
from ..read.pagetext import DEFAULT_TEXT_LIMIT
from ..search.indexer import DEFAULT_BATCH, DEFAULT_MEMORY, MIN_MEMORY, index_crawl
from ..search.onray import index_on_ray
from ._common import count, log_to_stderr, number, size_in, stdout_gone
from .export import INTERRUPTED, write_error
from .progress import DEFAULT_INTERVAL, Progress
from .raystart import check_ray


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


COMMANDS = {"index": cmd_index}
