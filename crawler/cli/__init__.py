"""``python -m crawler``: start or resume a crawl, its status, and its pages: list, show, export.

One module per command group, each with ``add_parsers(sub)``, its
``cmd_<name>`` functions and a ``COMMANDS`` table: :mod:`.crawl` (start,
status), :mod:`.pages` (pages, show) and :mod:`.export` (export).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import kvstore

from ..exceptions import CrawlerError
from . import crawl, export, pages

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    **crawl.COMMANDS,
    **export.COMMANDS,
    **pages.COMMANDS,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m crawler", description="A single-PC web crawler on kvstore."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    crawl.add_parsers(sub)
    export.add_parsers(sub)
    pages.add_parsers(sub)
    return parser


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; parser.error exits 2."""
    export.check_usage(parser, args)
    pages.check_usage(parser, args)


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
