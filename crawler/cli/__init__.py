"""``python -m crawler``: a demo on loopback, start or resume a crawl, its status, retry
failures, recrawl pages, and its pages: list, show, export, links, rank, report, serve; the
sitemaps it read.

One module per command group, each with ``add_parsers(sub)``, its
``cmd_<name>`` functions and a ``COMMANDS`` table: :mod:`.demo` (demo, with the
site of :mod:`.demosite`), :mod:`.crawl` (start, with
:mod:`.startopts`; and status, from :mod:`.status`), :mod:`.retry` (retry),
:mod:`.recrawl` (recrawl), :mod:`.pages` (pages, show), :mod:`.export` (export),
:mod:`.links` (links), :mod:`.rank` (rank), :mod:`.report` (report, serve),
:mod:`.index` (index), :mod:`.search` (search: what a query needs only, so it starts
fast) and :mod:`.sitemaps` (sitemaps). :mod:`.app` puts them together.

This package imports nothing itself: ``start`` loads only its own module, so the
process that supervises a crawl for its whole length never holds numpy or lxml."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from .app import main

    return main(argv)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    from .app import build_parser

    return build_parser()
