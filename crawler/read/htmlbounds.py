"""Bounds on reading one stored HTML page, so that a hostile page costs what a normal one
does and a command that reads pages (``index``, ``export --markdown``, ``export --jsonl
--text``) reaches its end and stops at Ctrl-C (issue 42, docs/BOUNDS.md).

Where the time goes (measured with resiliparse 2.0; docs/BOUNDS.md): parsing a page into
lexbor's DOM, its plain-text rendering and its minimal-HTML rendering are linear in the
page (5 ms at 10,000 nested elements). Its *main-content* extraction is not: for each
``<div>`` and ``<article>`` it walks what is under it, so its cost is the sum, over
those elements, of their descendants: quadratic in their nesting (0.1 / 0.4 / 2.1 s for
2,500 / 5,000 / 10,000 nested ``<div>`` elements; a page of 200,000, 1 MB, would take
hours in one C call that no signal interrupts).
Nested ``<section>``, ``<span>``, ``<li>``, ``<table>``, ``<b>`` and unknown elements
stay linear.

So a reader asks :meth:`ReadBounds.plain_reason` before that call:

- :func:`nesting_work` estimates that sum from the HTML text: every element counted
  once for each ``<div>``/``<article>`` open around it (a stray end tag closes nothing,
  as in the parser). A quick bound first (the deepest such nesting times the number of
  ``<``: one regular-expression pass over the div tags, ~1 ms for 150 kB); the exact
  count, one pass over every tag, only for a page past that bound. A page whose count
  passes :data:`DEFAULT_MAX_NESTING_WORK` (about 0.1-0.3 s of extraction; real pages
  measure one to two orders below it) is read from its plain text: all its visible text
  instead of the main content.
- A time budget a page (:data:`DEFAULT_PAGE_SECONDS`): a page whose reading has already
  taken longer when the main content would be extracted is read from its plain text.
  It is checked between the steps of a read, never inside resiliparse; each step is
  linear in a page cut at crawler.read.pagetext's MAX_PARSE_BYTES, so a page overruns
  its budget by one step at most, and Ctrl-C (or SIGTERM, which the CLI turns into it)
  is seen when that step returns.

Such a page is counted by its reader (``index``'s and ``export``'s summaries), never
dropped. Pure functions; the bounds are a frozen value, safe to share between threads.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

DEFAULT_MAX_NESTING_WORK = 2_000_000  # elements x <div>/<article>s around them
DEFAULT_PAGE_SECONDS = 1.0  # reading one page, before its main content is extracted
NESTED = "nested too deeply"
OVER_BUDGET = "over its time budget"

# an open or end tag of the elements whose nesting costs (not <divx>, <div-x>)
_NESTING = re.compile(r"<(/?)(?:[dD][iI][vV]|[aA][rR][tT][iI][cC][lL][eE])(?=[\s/>])")
_TAG = re.compile(r"<(/?)([A-Za-z][^\s/>]*)")
_COSTLY = frozenset({"div", "article"})


def nesting_work(html: str, limit: int) -> int:
    """How much work main-content extraction does on ``html`` (see the module docstring):
    a bound at most ``limit`` when the quick bound is enough, else the exact count."""
    depth = deepest = 0
    for close in _NESTING.findall(html):
        if close:
            depth -= depth > 0
        else:
            depth += 1
            deepest = max(deepest, depth)
    bound = deepest * html.count("<")
    if bound <= limit:
        return bound
    depth = work = 0
    for close, name in _TAG.findall(html):
        costly = name.lower() in _COSTLY
        if close:
            depth -= costly and depth > 0
        else:
            work += depth
            depth += costly
    return work


@dataclass(frozen=True, slots=True)
class ReadBounds:
    """What one page's reading may cost before it is read from plain text."""

    max_nesting_work: int = DEFAULT_MAX_NESTING_WORK
    page_seconds: float = DEFAULT_PAGE_SECONDS

    def plain_reason(self, html: str, started: float, *, nesting: bool = True) -> str:
        """Why ``html``, whose reading began at ``started`` (time.monotonic), is read
        from its plain text rather than its main content; "" when it need not be.
        ``nesting=False`` for a reader whose main-content rule is linear in the page
        (crawler.read.mainblocks): its time budget alone."""
        if time.monotonic() - started >= self.page_seconds:
            return OVER_BUDGET
        if nesting and nesting_work(html, self.max_nesting_work) > self.max_nesting_work:
            return NESTED
        return ""


DEFAULT_BOUNDS = ReadBounds()

__all__ = ["DEFAULT_BOUNDS", "DEFAULT_MAX_NESTING_WORK", "DEFAULT_PAGE_SECONDS", "NESTED",
           "OVER_BUDGET", "ReadBounds", "nesting_work"]
