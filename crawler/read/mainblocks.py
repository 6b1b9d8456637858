"""The main content of a page, chosen among the blocks of its minimal-HTML rendering: the
index's own main-content rule (issue 44).

The index reads a page once: resiliparse renders it into minimal HTML (crawler.read.pagetext:
one block a line, its links kept, what is boilerplate by its markup left out), and the
page's headings, links and text all come from that one rendering. The main content is a
run of those blocks, chosen by a rule that costs one pass over them:

- each block is worth its visible characters, less :data:`LINK_WEIGHT` times those in
  links, less :data:`BLOCK_COST`: prose is worth its length; a menu, a tag cloud, a list
  of related links is worth less than nothing; a short line alone ("Share", "Log in",
  a date) a little less than nothing; a heading pays no cost (a short one, "Lock", is
  the start of what follows it);
- the main content is the run of consecutive blocks worth the most together (the
  maximum-sum run, one pass): an article's lists, short notes, headings, code lines and
  a paragraph with a link inside it are kept, because the prose around them pays for
  them; the navigation before it and the link lists after it are not, because no prose
  beyond them pays for their cost. A run does not end on a heading ("See also" before a
  list of links is that list's).

Measured against the index's reading before, resiliparse's main-content rule
(tools/bench_extract.py, docs/SEARCH.md): token F1 0.864 against 0.866 on 181 news pages
of the open web (Scrapinghub's article-extraction benchmark), 0.975 against 0.980 on the
content pages of two manuals (a chapter's table of contents, all links, is left out),
at a fifth of the cost; and it is linear in the page, so it needs no nesting bound
(crawler.read.htmlbounds).

What it gets wrong: a short line after the last prose (a last list item of one word, a
closing "Thanks.") pays for nothing after it and is left out; a run of teasers after an
article (related stories, each a linked title and a line of text) can be worth more than
the links between them and joins the article. Both are in the benchmark's figures.

Thread safety: pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# A block's worth: visible characters - LINK_WEIGHT x characters in links - BLOCK_COST.
# Chosen on the news benchmark and the two manuals of tools/bench_extract.py (weights
# 1.5-3 and costs 5-20 tried; docs/SEARCH.md): a block all links is worth minus its length.
LINK_WEIGHT = 2.0
BLOCK_COST = 10.0

# In resiliparse's minimal HTML (crawler.read.pagetext reads its headings and links with
# these too): any tag; a link, (href, text). A link's text stops at the next link tag: a
# lazy ".*?" would scan from every unclosed one to the end of the page (quadratic:
# 600,000 nested <a>s took minutes).
TAG = re.compile(r"<[^>]*>")
LINK = re.compile(r'<a href="([^"]*)">((?:[^<]|<(?!/?a[ >]))*)</a>')
# A <pre> block whole, from its tag to its end tag (resiliparse closes every one; one left
# open is read as lines like the others); it stops at the next <pre> tag: one pass
_PRE = re.compile(r"(<pre>(?:[^<]|<(?!/?pre>))*</pre>)")
_HEADING = re.compile(r"<h[1-6]>")  # a block that is a heading (it starts the line)


def _pieces(outline: str) -> Iterator[tuple[bool, str]]:
    """(is a ``<pre>`` block, text) in order: each ``<pre>`` whole, and the runs of lines
    between them without the line breaks that part them from a ``<pre>``."""
    pieces = _PRE.split(outline)
    last = len(pieces) - 1
    for n, piece in enumerate(pieces):
        if n % 2:
            yield True, piece
            continue
        if n > 0 and piece.startswith("\n"):
            piece = piece[1:]
        if n < last and piece.endswith("\n"):
            piece = piece[:-1]
        if piece or last == 0:
            yield False, piece


def blocks(outline: str) -> list[str]:
    """The blocks of a minimal-HTML rendering: its lines, a ``<pre>`` one block however
    many lines it has."""
    out: list[str] = []
    for pre, piece in _pieces(outline):
        if pre:
            out.append(piece)
        else:
            out += piece.split("\n")
    return out


def worth(block: str) -> float:
    """What ``block`` is worth to the main content (the module docstring's rule); 0 for a
    block with no visible text (it neither joins nor splits a run)."""
    if "<" not in block:
        shown = len(block.strip())
        return shown - BLOCK_COST if shown else 0.0
    shown = len(TAG.sub("", block).strip())
    if not shown:
        return 0.0
    linked = 0
    if "<a " in block:
        linked = sum(len(TAG.sub("", text)) for _, text in LINK.findall(block))
    cost = 0.0 if _HEADING.match(block) else BLOCK_COST
    return shown - LINK_WEIGHT * min(linked, shown) - cost


def best_run(values: list[float]) -> tuple[int, int]:
    """``(start, stop)`` of the consecutive values with the largest sum, the first such
    run; ``(0, 0)`` when no value is positive."""
    best = total = 0.0
    start, run = 0, (0, 0)
    for i, value in enumerate(values):
        if total <= 0:
            total, start = value, i
        else:
            total += value
        if total > best:
            best, run = total, (start, i + 1)
    return run


def worths(outline: str) -> tuple[list[str], list[float]]:
    """:func:`blocks` and each one's :func:`worth`, the same values, in fewer steps: the
    tags of a run of lines taken out at once (``<pre>`` blocks, rare, one by one)."""
    parts: list[str] = []
    values: list[float] = []
    for pre, piece in _pieces(outline):
        if pre:
            parts.append(piece)
            values.append(worth(piece))
            continue
        lines = piece.split("\n")
        shown = TAG.sub("", piece).split("\n")
        if len(shown) != len(lines):  # (a tag across lines: not in resiliparse's output)
            shown = [TAG.sub("", line) for line in lines]
        for line, text in zip(lines, shown, strict=True):
            size = len(text.strip())
            if not size:
                values.append(0.0)
            else:
                cost = 0.0 if line.startswith("<h") and _HEADING.match(line) else BLOCK_COST
                if "<a " in line:
                    linked = sum(len(TAG.sub("", t)) for _, t in LINK.findall(line))
                    values.append(size - LINK_WEIGHT * min(linked, size) - cost)
                else:
                    values.append(size - cost)
        parts += lines
    return parts, values


def code_share(html: str, shown: int | None = None) -> float:
    """The share of ``html``'s visible characters (a minimal-HTML rendering, or part of
    one; ``shown``: their count, when the caller has it) inside ``<pre>`` blocks: near 1
    for a source listing, 0 for prose."""
    if "<pre>" not in html:
        return 0.0
    shown = len(TAG.sub("", html)) if shown is None else shown
    code = sum(len(TAG.sub("", pre)) for pre in _PRE.findall(html))
    return min(1.0, code / shown) if shown else 0.0


def main_blocks(outline: str) -> str:
    """The main content of a page's minimal-HTML rendering, in the same form: its blocks
    worth the most together; "" when no block is worth anything."""
    parts, values = worths(outline)
    start, stop = best_run(values)
    while stop > start and _HEADING.match(parts[stop - 1]):  # a heading ends no run
        stop -= 1
    return "\n".join(parts[start:stop])


__all__ = ["BLOCK_COST", "LINK", "LINK_WEIGHT", "TAG", "best_run", "blocks", "code_share",
           "main_blocks", "worth", "worths"]
