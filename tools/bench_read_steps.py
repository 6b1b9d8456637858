"""Where the index's reading of a page spends its CPU, step by step: the main-content rule
of crawler.read.mainblocks against resiliparse's, which the index used before (issue 44).
Not a test.

Usage (from the repository root; the pages: any directories of HTML, e.g. the Debian
manuals tools/bench_extract.py downloads)::

    python tools/bench_extract.py --fetch-debian-docs --workdir /tmp/extract-docs \\
        --debian-packages python3.11-doc,postgresql-doc-15 --extractors visible --repeat 1
    python tools/bench_read_steps.py --html-dir /tmp/extract-docs/root --rounds 3

Each page is decoded before any clock starts, then read step by step as
crawler.read.pagetext.read_html does (parse, the minimal-HTML rendering, headings and
links from it, the names the page defines, the main content, SimHash, language), each
step timed with ``time.process_time``. The main-content step is timed twice on the same
tree, the two rules alternating page by page: ``blocks`` (crawler.read.mainblocks: one
pass over the rendering already made) and ``resiliparse`` (the rule before: the lists
deepened, resiliparse's extraction, then crawler.read.pagetext.main_or_whole against the
rendering). Reported: CPU ms a page for each step, the median over ``--rounds`` rounds,
and each reading's total. Tantivy's indexing of the text comes after and is not here
(tools/bench_search.py times whole ``index`` runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from html import unescape
from pathlib import Path
from typing import Any

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.encoding import detect_encoding
from resiliparse.parse.html import HTMLTree

from crawler.read import pagetext
from crawler.read.mainblocks import LINK, TAG, main_blocks
from crawler.read.simhash import simhash

SHARED = ("parse", "rendering", "headings and links", "names", "simhash", "language")


def _blocks(tree: HTMLTree, outline: str) -> str:
    return unescape(TAG.sub("", main_blocks(outline)))


def _resiliparse(tree: HTMLTree, outline: str) -> str:
    pagetext.deepen_lists(tree)
    main = extract_plain_text(tree, main_content=True, skip_elements=pagetext.BOILERPLATE,
                              alt_texts=False, list_bullets=False)
    if pagetext.main_or_whole(main, outline) is outline:
        main = unescape(TAG.sub("", outline))
    return main


RULES: dict[str, Callable[[HTMLTree, str], str]] = {"blocks": _blocks,
                                                    "resiliparse": _resiliparse}


def read_once(html: str, times: dict[str, float], rule_order: list[str]) -> None:
    """Read one page, adding each step's CPU seconds to ``times``."""
    clock = time.process_time
    t = clock()
    tree = HTMLTree.parse(html)
    times["parse"] += clock() - t
    t = clock()
    outline = extract_plain_text(tree, preserve_formatting="minimal_html", links=True,
                                 list_bullets=False, alt_texts=False,
                                 skip_elements=pagetext.BOILERPLATE)
    times["rendering"] += clock() - t
    t = clock()
    " ".join(pagetext._HEADING.findall(outline))
    for m in LINK.finditer(outline):
        unescape(TAG.sub("", m.group(2)))
    times["headings and links"] += clock() - t
    t = clock()
    pagetext.defined_names(html)
    times["names"] += clock() - t
    text = ""
    for name in rule_order:  # (resiliparse's edits the tree: the blocks rule reads none)
        t = clock()
        main = RULES[name](tree, outline)
        times[f"main content: {name}"] += clock() - t
        if name == "blocks":
            text = " ".join(main.split())
    t = clock()
    simhash(text)
    times["simhash"] += clock() - t
    t = clock()
    pagetext.detect_language(text)
    times["language"] += clock() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--html-dir", type=Path, action="append", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-files", type=int, default=0, help="at most this many (0: all)")
    args = p.parse_args(argv)
    files = sorted(f for d in args.html_dir for f in d.rglob("*.htm*") if f.is_file())
    if args.max_files:
        files = files[:: max(1, len(files) // args.max_files)][: args.max_files]
    if not files:
        raise SystemExit("bench_read_steps: no HTML files under --html-dir")
    pages = []
    for f in files:
        data = f.read_bytes()
        pages.append(data.decode(detect_encoding(data) or "utf-8", "replace"))
    steps = [*SHARED, *(f"main content: {r}" for r in RULES)]
    rounds: list[dict[str, float]] = []
    for n in range(args.rounds):
        times = dict.fromkeys(steps, 0.0)
        for i, html in enumerate(pages):
            order = list(RULES) if (i + n) % 2 == 0 else list(reversed(RULES))
            read_once(html, times, order)
        rounds.append({k: 1e3 * v / len(pages) for k, v in times.items()})
        bu.log(f"round {n + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in rounds[-1].items()))
    median = {k: statistics.median(r[k] for r in rounds) for k in steps}
    shared = sum(median[k] for k in SHARED)
    rows: list[list[Any]] = [[k, f"{median[k]:.3f}"] for k in steps]
    for rule in RULES:
        rows.append([f"reading with {rule}", f"{shared + median[f'main content: {rule}']:.3f}"])
    print(f"{len(pages)} pages, CPU ms a page (median of {args.rounds} rounds)")
    print(bu.markdown_table(["step", "CPU ms a page"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
