"""``python -m crawler``: start or resume a crawl, its status, retry failures, recrawl
pages, and its pages: list, show, export, links, rank, report, serve; the sitemaps it read.

One module per command group, each with ``add_parsers(sub)``, its
``cmd_<name>`` functions and a ``COMMANDS`` table: :mod:`.crawl` (start, with
:mod:`.startopts`; and status, from :mod:`.status`), :mod:`.retry` (retry),
:mod:`.recrawl` (recrawl), :mod:`.pages` (pages, show), :mod:`.export` (export),
:mod:`.links` (links), :mod:`.rank` (rank), :mod:`.report` (report, serve) and
:mod:`.sitemaps` (sitemaps)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import kvstore

from ..exceptions import CrawlerError
from . import crawl, export, links, pages, rank, recrawl, report, retry, sitemaps
from ._common import DefaultsFormatter

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    **crawl.COMMANDS,
    **export.COMMANDS,
    **pages.COMMANDS,
    **links.COMMANDS,
    **rank.COMMANDS,
    **report.COMMANDS,
    **retry.COMMANDS,
    **recrawl.COMMANDS,
    **sitemaps.COMMANDS,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m crawler", description="A single-PC web crawler on kvstore."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    crawl.add_parsers(sub)
    export.add_parsers(sub)
    pages.add_parsers(sub)
    links.add_parsers(sub)
    rank.add_parsers(sub)
    report.add_parsers(sub)
    retry.add_parsers(sub)
    recrawl.add_parsers(sub)
    sitemaps.add_parsers(sub)
    for command in sub.choices.values():  # every command's --help shows its defaults
        command.formatter_class = DefaultsFormatter
    return parser


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; parser.error exits 2."""
    export.check_usage(parser, args)
    pages.check_usage(parser, args)
    rank.check_usage(parser, args)
    report.check_usage(parser, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_usage(parser, args)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return _COMMANDS[args.command](args)
    except (CrawlerError, kvstore.exceptions.KVStoreError) as exc:
        print(f"crawler: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # what no command foresaw (a disk error...): one line, not a trace
        print(f"crawler: error: {exc}", file=sys.stderr)
        return 1
