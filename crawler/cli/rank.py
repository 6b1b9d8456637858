"""The ``rank`` command: PageRank of the crawl's pages, stored in ``DIR/rank``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from ..config import (
    MAX_BLOCK_NODES,
    MAX_CHUNK,
    MAX_COUNT,
    MAX_RANK_ITERATIONS,
    MAX_SECONDS,
)
from ..exceptions import CrawlerError
from ..read.display import printable
from ..read.graph import DEFAULT_BLOCK_NODES, DEFAULT_CHUNK
from ..read.listing import CrawlReader
from ..read.rank import DEFAULT_DAMPING, DEFAULT_MAX_ITER, DEFAULT_TOL, rank_crawl
from ..read.rankstore import RankStore
from ..state.pages import PageRecord
from ._common import count, log_to_stderr, number, stdout_gone
from .export import INTERRUPTED, write_error
from .progress import DEFAULT_INTERVAL, Callback, Convergence, Progress


def add_parsers(sub: Any) -> None:
    rank = sub.add_parser(
        "rank",
        help="compute PageRank over the crawl's links and store it in DIR/rank",
        description="Build the link graph of the fetched pages (links marked nofollow and "
        "links to URLs without an HTTP answer left out; a redirect passes its rank to its "
        "target; dangling pages spread theirs uniformly), iterate PageRank out of core until "
        "the L1 change is below --tol, and store the ranks for pages --sort rank, show and "
        "export. Works on a running crawl (the records flushed when it starts). "
        "See docs/REPORT.md.",
        epilog="example: python -m crawler rank crawl1 --top 20",
    )
    rank.add_argument("data", metavar="DIR", help="crawl data directory")
    rank.add_argument("--damping", type=number(0, 1, above=True), default=DEFAULT_DAMPING,
                      help="damping factor, less than 1")
    rank.add_argument("--tol", type=number(0, 1, above=True), default=DEFAULT_TOL,
                      help="stop when the L1 change of an iteration is below this")
    rank.add_argument("--max-iter", type=count(1, MAX_RANK_ITERATIONS), default=DEFAULT_MAX_ITER,
                      metavar="N", help="stop after N iterations even if --tol is not reached")
    rank.add_argument("--top", type=count(0, MAX_COUNT), default=10, metavar="N",
                      help="print the N strongest pages (0: none)")
    rank.add_argument("--block-nodes", type=count(1, MAX_BLOCK_NODES), default=DEFAULT_BLOCK_NODES,
                      metavar="N", help="nodes per block: the memory bound is ~35 B x N "
                      "+ 24 B x --chunk")
    rank.add_argument("--chunk", type=count(1, MAX_CHUNK), default=DEFAULT_CHUNK, metavar="N",
                      help="edges per vectorized step")
    rank.add_argument("--work", metavar="TMPDIR",
                      help="an existing directory to build the graph in (a new directory "
                      "inside it, removed at the end; default: inside DIR)")
    rank.add_argument("--json", action="store_true", help="the summary as one JSON object")
    rank.add_argument("--progress-interval", type=number(0, MAX_SECONDS), default=DEFAULT_INTERVAL,
                      metavar="S",
                      help="seconds between progress lines when stderr is not a terminal "
                      "(default: %(default)s)")
    rank.add_argument("--quiet", action="store_true",
                      help="no progress: only warnings on stderr")


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.command == "rank" and args.damping >= 1:  # its type takes 1 (the bound is open)
        parser.error("rank: --damping must be less than 1")


class _Counted:
    """The reader as rank_crawl reads it (``data_dir``, ``len``, ``pages``), reporting
    the records read, damaged ones included, to ``progress(done, total)``."""

    def __init__(self, reader: CrawlReader, progress: Callback) -> None:
        self.reader, self.progress, self.data_dir = reader, progress, reader.data_dir

    def __len__(self) -> int:
        return len(self.reader)

    def pages(self, *, with_body: bool = True) -> Iterator[PageRecord]:
        total, n = len(self.reader), 0
        for page in self.reader.pages(with_body=with_body):
            n += 1
            self.progress(n + self.reader.skipped, total)
            yield page
        self.progress(n + self.reader.skipped, total)


def cmd_rank(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    if args.work is not None and not os.path.isdir(args.work):
        raise CrawlerError(f"--work {args.work}: no such directory: create it first")
    try:
        with CrawlReader(args.data) as reader, \
                Progress(quiet=args.quiet, interval=args.progress_interval) as progress:
            iterations = Convergence(progress.phase("pagerank", "iterations", estimated=True),
                                     tol=args.tol, max_iter=args.max_iter)
            result = rank_crawl(_Counted(reader, progress.phase("rank")), damping=args.damping,
                                tol=args.tol, max_iter=args.max_iter, block=args.block_nodes,
                                chunk=args.chunk, work_dir=args.work, progress=iterations)
    except OSError as exc:
        raise CrawlerError(write_error("cannot store the ranks", exc)) from exc
    except KeyboardInterrupt:
        print("crawler: rank interrupted: the ranks stored before are unchanged",
              file=sys.stderr)
        return INTERRUPTED
    g = result.graph
    try:
        with RankStore(args.data) as store:
            top = [(url, raw, 100.0 * raw / store.max_rank)
                   for _, url, raw in store.ordered(args.top)] if args.top else []
        if args.json:
            print(json.dumps({**{k: v for k, v in vars(result).items() if k != "graph"},
                              "graph": g, "top": [{"url": u, "rank": r, "rank_scaled": s}
                                                  for u, r, s in top]}))
        else:
            print(f"ranked {g['fetched']} pages of {g['records']} records: {g['edges']} "
                  f"links between them ({g['links']} links in all, {g['unrecorded']} to "
                  f"unrecorded URLs), {g['dangling']} dangling")
            state = "converged" if result.converged else "NOT converged"
            print(f"{state} after {result.iterations} iterations: L1 change "
                  f"{result.delta:.3g} (tolerance {result.tol:g}), "
                  f"{result.seconds_per_iteration:.3f} s per iteration")
            for url, raw, scaled in top:
                print(f"{scaled:7.2f}\t{raw:.6g}\t{printable(url)}")
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_gone()
    return 0


COMMANDS = {"rank": cmd_rank}
