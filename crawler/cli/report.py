"""The ``report`` and ``serve`` commands: the crawl report as one HTML file (or JSON), or live."""

from __future__ import annotations

import argparse
import functools
import ipaddress
import json
import logging
import sys
import time
from typing import Any

from ..config import MAX_REFERRERS, MAX_REPORT_ROWS, MAX_SECONDS
from ..exceptions import CrawlerError
from ..read import charts
from ..read._outfile import Outputs
from ..read.rank import DEFAULT_MAX_ITER, DEFAULT_TOL
from ..read.report import DEFAULT_LIMIT, DEFAULT_REFERRERS, compute
from ..read.reporthtml import render
from ..read.serve import DEFAULT_INTERVAL, DEFAULT_PORT, DEFAULT_REFRESH, HostRule, ReportServer
from ..search.page import search_page
from ..search.sitecheck import add_site_checks
from . import progress as progressmod
from ._common import count, exit_at_once, log_to_stderr, number
from .export import INTERRUPTED, existing, write_error


def _common(p: Any) -> None:
    p.add_argument("data", metavar="DIR", help="crawl data directory")
    p.add_argument("--limit", type=count(1, MAX_REPORT_ROWS), default=DEFAULT_LIMIT, metavar="N",
                   help="rows in each list (hosts, chains, broken links...)")
    p.add_argument("--referrers", type=count(0, MAX_REFERRERS), default=DEFAULT_REFERRERS,
                   metavar="N",
                   help="pages shown per broken link target")
    p.add_argument("--no-rank", action="store_true", help="skip PageRank")
    p.add_argument("--work", metavar="TMPDIR", help="where the temporary graph is built")


def add_parsers(sub: Any) -> None:
    report = sub.add_parser(
        "report",
        help="write the crawl report: one self-contained HTML file, or JSON",
        description="Outcomes, pages and errors over time, hosts, depth, redirect chains, "
        "broken links and who links to them, duplicate content, the slowest and largest "
        "pages, the top pages by PageRank: computed in streaming passes over the crawl "
        "(running or stopped: read-only). The HTML needs no network (inline CSS and SVG "
        "charts; charts need the [report] extra: matplotlib). See docs/REPORT.md.",
        epilog="example: python -m crawler report crawl1 --out report.html",
    )
    _common(report)
    report.add_argument("--out", metavar="FILE", help="output file (default: stdout)")
    report.add_argument("--force", action="store_true",
                        help="replace --out if it exists (without it the report refuses it)")
    report.add_argument("--format", choices=("html", "json"), default="html",
                        help="one HTML file with inline charts, or the numbers as JSON")
    report.add_argument("--progress-interval", type=number(0, MAX_SECONDS),
                        default=progressmod.DEFAULT_INTERVAL, metavar="S",
                        help="seconds between progress lines when stderr is not a terminal "
                        "(default: %(default)s)")
    report.add_argument("--quiet", action="store_true",
                        help="no progress: only warnings on stderr")

    serve = sub.add_parser(
        "serve",
        help="serve the crawl report live (read-only, loopback by default)",
        description="An HTTP server with the report of a running (or stopped) crawl: / is "
        "the HTML page, refreshing itself, /report.json its numbers, /metrics for "
        "Prometheus, /search the search page (after python -m crawler index). The report is "
        "recomputed in the background when the crawl changed, at most every --interval "
        "seconds. Nothing is ever written to the crawl. Ctrl-C stops it.",
        epilog="example: python -m crawler serve crawl1 --port 8765",
    )
    _common(serve)
    serve.add_argument("--port", type=count(0, 65535), default=DEFAULT_PORT,
                       help="TCP port (0: any free)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--allow-host", action="append", default=[], metavar="NAME[:PORT]",
                       help="also answer requests for this Host (repeatable): a name the "
                       "machine is reached by, or NAME:PORT for a tunnel's port. Requests for "
                       "other names get 421 (a guard against DNS rebinding); by default the "
                       "loopback names, --host and, bound to 0.0.0.0, any address are answered")
    serve.add_argument("--interval", type=number(0, MAX_SECONDS, above=True),
                       default=DEFAULT_INTERVAL, metavar="S",
                       help="seconds between recomputations")
    serve.add_argument("--refresh", type=count(1, int(MAX_SECONDS)), default=DEFAULT_REFRESH,
                       metavar="S",
                       help="seconds between reloads of the page")


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the types cannot check (each number's range is its type's: docs/BOUNDS.md)."""
    if args.command == "report" and args.format == "html" and args.out == "-":
        args.out = None
    if args.command == "serve":
        try:
            HostRule.for_server(args.host, args.port, args.allow_host)
        except ValueError as exc:
            parser.error(f"serve: {exc}")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"limit": args.limit, "referrers": args.referrers, "rank": not args.no_rank,
            "work_dir": args.work}


def cmd_report(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    if args.format == "html" and not charts.available():
        raise CrawlerError("the HTML report's charts need matplotlib: pip install "
                           "'kvcrawl[report]' (or use --format json)")
    existing("--out", args.out, args.force)  # before the long part
    out = None
    outputs = Outputs()
    try:
        if args.out is not None:  # an output that cannot be written fails before the long part
            out = outputs.create(args.out, "w")  # OUT.part: exclusive, never through a link
        with progressmod.Progress(quiet=args.quiet, interval=args.progress_interval) as progress:
            ranks = progress.phase("pagerank", "iterations", estimated=True)
            report = compute(args.data, **_options(args), progress=progress.phase("report"),
                             rank_progress=progressmod.Convergence(
                                 ranks, tol=DEFAULT_TOL, max_iter=DEFAULT_MAX_ITER))
            add_site_checks(args.data, report, limit=args.limit)
        text = render(report) if args.format == "html" else json.dumps(report, indent=1) + "\n"
        if out is None:
            sys.stdout.write(text)
            sys.stdout.flush()
            return 0
        out.write(text)
        outputs.publish(out, args.out)
        out = None
    except OSError as exc:
        raise CrawlerError(write_error("cannot write the report", exc)) from exc
    except KeyboardInterrupt:
        print("crawler: report interrupted: nothing written", file=sys.stderr)
        return INTERRUPTED
    finally:
        if not outputs.finished:  # not published (an error, Ctrl-C anywhere): the .part goes
            outputs.discard(out)
    logging.getLogger(__name__).info("report of %s written to %s", args.data, args.out)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    log_to_stderr(logging.INFO)
    if not charts.available():
        raise CrawlerError("the report's charts need matplotlib: pip install 'kvcrawl[report]'")
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    log = logging.getLogger(__name__)
    if not loopback:
        log.warning("serving on %s: the report (URLs, hosts) is visible to other machines",
                    args.host)
    try:
        server = ReportServer(args.data, host=args.host, port=args.port, interval=args.interval,
                              refresh=args.refresh, allow_hosts=args.allow_host,
                              search=functools.partial(search_page, args.data),
                              augment=functools.partial(add_site_checks, args.data,
                                                        limit=args.limit),
                              **_options(args))
    except OSError as exc:
        raise CrawlerError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    try:  # a Ctrl-C or SIGTERM from the start on stops the server
        server.start()
        print(f"serving the report of {args.data} at {server.url} (Ctrl-C stops)", flush=True)
        while True:  # timed: were a signal taken by another thread, the handler that
            time.sleep(1.0)  # stops the server still runs here within a second
    except KeyboardInterrupt:
        pass
    finally:
        if not server.stop():
            exit_at_once()  # a report still being computed: see exit_at_once
    return 0


COMMANDS = {"report": cmd_report, "serve": cmd_serve}
