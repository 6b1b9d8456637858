"""The ``export`` command: a crawl's pages to WARC and/or JSON lines."""

from __future__ import annotations

import argparse
import io
import logging
import sys
from typing import Any

from .. import config as cfgmod
from ..exceptions import CrawlerError
from ..read.export import DEFAULT_PROGRESS_INTERVAL, export
from ..read.listing import DEFAULT_MAX_TEXT_CHARS
from ._common import log_to_stderr, size, stdout_gone


def add_parsers(sub: Any) -> None:
    export_p = sub.add_parser(
        "export",
        help="export a crawl's pages to WARC and/or JSON lines",
        description="Write every page record of a crawl (running or stopped: read-only, "
        "streaming) as WARC (warcinfo, then request/response records, revisits for repeated "
        "payloads, metadata records for URLs with no answer) and/or JSON lines. "
        "The formats are described in docs/EXPORT.md.",
        epilog="example: python -m crawler export crawl1 --warc crawl1.warc.gz --max-size 1G "
        "--jsonl crawl1.jsonl --text",
    )
    export_p.add_argument("data", metavar="DIR", help="crawl data directory")
    export_p.add_argument(
        "--warc", metavar="OUT.warc.gz", help="WARC output (gzip per record if it ends in .gz)"
    )
    export_p.add_argument(
        "--max-size",
        type=size,
        metavar="BYTES",
        help="split the WARC: OUT-00000.warc.gz, OUT-00001... a new file once one reaches "
        "BYTES (K, M, G suffixes)",
    )
    export_p.add_argument(
        "--jsonl", metavar="OUT.jsonl", help="JSON lines output, one object per page (- = stdout)"
    )
    export_p.add_argument(
        "--text", action="store_true", help="add each page's visible text to the JSONL objects"
    )
    export_p.add_argument(
        "--text-limit",
        type=int,
        default=DEFAULT_MAX_TEXT_CHARS,
        metavar="CHARS",
        help="visible text kept per page",
    )
    export_p.add_argument(
        "--user-agent",
        default=cfgmod.DEFAULT_USER_AGENT,
        help="User-Agent of the rebuilt WARC request records (a crawl does not record the one "
        "it used; default: the crawler's default)",
    )
    export_p.add_argument(
        "--no-revisits", action="store_true", help="write repeated payloads in full"
    )
    export_p.add_argument(
        "--skip-failures",
        action="store_true",
        help="no WARC metadata records for URLs that got no HTTP answer",
    )
    export_p.add_argument(
        "--strict",
        action="store_true",
        help="stop at a damaged record (exit 1) instead of skipping it with a warning",
    )
    export_p.add_argument(
        "--progress-interval",
        type=float,
        default=DEFAULT_PROGRESS_INTERVAL,
        metavar="S",
        help="seconds between progress lines on stderr",
    )
    export_p.add_argument("--quiet", action="store_true", help="only warnings on stderr")


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; parser.error exits 2."""
    if args.command == "export":
        if not (args.warc or args.jsonl):
            parser.error("export: give --warc OUT.warc.gz and/or --jsonl OUT.jsonl")
        if args.warc == "-":
            parser.error("export: --warc needs a file name (WARC is not written to stdout)")
        if args.max_size is not None and not args.warc:
            parser.error("export: --max-size splits the WARC output: give --warc")
        if args.text and not args.jsonl:
            parser.error("export: --text adds text to the JSONL output: give --jsonl")
        if args.text_limit <= 0:
            parser.error("export: --text-limit must be > 0")


def cmd_export(args: argparse.Namespace) -> int:
    log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    stream: io.TextIOWrapper | None = None
    jsonl: str | io.TextIOWrapper | None = args.jsonl
    if args.jsonl == "-":
        sys.stdout.flush()
        stream = jsonl = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    try:
        export(
            args.data,
            warc=args.warc,
            jsonl=jsonl,
            max_size=args.max_size,
            text=args.text,
            text_limit=args.text_limit,
            user_agent=args.user_agent,
            revisits=not args.no_revisits,
            skip_failures=args.skip_failures,
            strict=args.strict,
            progress_interval=args.progress_interval,
        )
    except BrokenPipeError:
        return stdout_gone()
    except OSError as exc:
        raise CrawlerError(f"cannot write the export: {exc}") from exc
    finally:
        if stream is not None:
            try:
                stream.flush()
            except BrokenPipeError:
                pass
            stream.detach()  # sys.stdout keeps its buffer
    return 0


COMMANDS = {"export": cmd_export}
