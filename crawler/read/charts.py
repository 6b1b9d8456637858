"""The report's charts: matplotlib figures rendered to inline SVG (no network, no files).

matplotlib is the optional ``[report]`` extra: it is imported when a chart is
drawn, and its absence is one clear error. The Agg backend is chosen before
pyplot is imported (no display is needed), text is drawn as paths (the SVG
needs no font), and the SVG ids are salted with a fixed string so the same
numbers give the same bytes.

Each function takes the report's plain data (crawler.read.report) and
returns an ``<svg>`` element as text, or "" when there is nothing to draw.
"""

from __future__ import annotations

import io
import re
from typing import Any

from ..exceptions import CrawlerError

_INSTALL = "the report's charts need matplotlib: pip install 'kvcrawl[report]'"
_SIZE = (7.5, 3.0)  # inches: 720 x 288 px at 96 dpi
_COLORS = {"ok": "#3a7d44", "redirect": "#4c78a8", "http_4xx": "#e45756", "http_5xx": "#b3282d",
           "not_html": "#9d755d", "truncated": "#bab0ac", "robots": "#f2a541", "limit": "#eeca3b",
           "dns": "#7b4173", "connect": "#a05195", "timeout": "#d45087", "broken": "#f95d6a",
           "bad_host": "#665191", "retry": "#72b7b2", "other": "#888888"}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise CrawlerError(_INSTALL) from None
    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "path", "svg.hashsalt": "kvcrawl-report",
                                "font.size": 9, "axes.spines.top": False,
                                "axes.spines.right": False})
    import matplotlib.pyplot as plt

    return plt


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML declaration and DOCTYPE: inline SVG


def _text(svg: str, label: str) -> str:
    """Give the chart an accessible name (its title is drawn as paths)."""
    return re.sub(r"<svg ", f'<svg role="img" aria-label="{label}" ', svg, count=1)


def outcomes(by_class: dict[str, int]) -> str:
    if not by_class:
        return ""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    names = list(by_class)
    ax.bar(names, [by_class[n] for n in names], color=[_COLORS.get(n, "#888") for n in names])
    ax.set_ylabel("records")
    ax.set_title("Outcomes by class")
    ax.tick_params(axis="x", labelrotation=30)
    return _text(_svg(fig), "Outcomes by class")


def timeline(bins: list[dict[str, float]], width: float) -> str:
    if not bins:
        return ""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    t0 = bins[0]["t"]
    span = bins[-1]["t"] + width - t0
    unit, scale = ("s", 1.0) if span < 120 else ("min", 60.0) if span < 3 * 3600 else ("h", 3600.0)
    xs = [(b["t"] - t0) / scale for b in bins] + [span / scale]  # the last bin's right edge
    pages = [b["pages_per_s"] for b in bins]
    errors = [b["errors"] / width for b in bins]
    ax.fill_between(xs, pages + pages[-1:], step="post", color="#3a7d44", alpha=0.35,
                    label="pages/s")
    ax.step(xs, pages + pages[-1:], where="post", color="#3a7d44")
    ax.step(xs, errors + errors[-1:], where="post", color="#e45756", label="errors/s")
    ax.set_xlim(0, span / scale)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"{unit} since the first record ({width:g} s bins)")
    ax.set_ylabel("per second")
    ax.set_title("Pages and errors over the crawl")
    ax.legend(frameon=False)
    return _text(_svg(fig), "Pages and errors over the crawl")


def depth(hist: dict[str, int]) -> str:
    if not hist:
        return ""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.bar([int(d) for d in hist], list(hist.values()), color="#4c78a8")
    ax.set_xlabel("depth (links from a seed)")
    ax.set_ylabel("records")
    ax.set_title("Depth distribution")
    return _text(_svg(fig), "Depth distribution")


def hosts(top: list[dict[str, Any]], shown: int = 15) -> str:
    rows = top[:shown]
    if not rows:
        return ""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(_SIZE[0], max(1.6, 0.28 * len(rows) + 0.8)))
    names = [r["host"] for r in rows][::-1]
    ok = [r["pages"] - r["errors"] for r in rows][::-1]
    err = [r["errors"] for r in rows][::-1]
    ax.barh(names, ok, color="#3a7d44", label="pages")
    ax.barh(names, err, left=ok, color="#e45756", label="errors")
    ax.set_xlabel("records")
    ax.set_title(f"Largest hosts (top {len(rows)})")
    ax.legend(frameon=False, loc="lower right")
    return _text(_svg(fig), "Largest hosts")


def ranks(top: list[dict[str, Any]]) -> str:
    if not top:
        return ""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.plot(range(1, len(top) + 1), [r["rank_scaled"] for r in top], marker=".",
            color="#7b4173")
    ax.set_xlabel("pages by rank")
    ax.set_ylabel("rank (strongest = 100)")
    ax.set_title("PageRank of the strongest pages")
    return _text(_svg(fig), "PageRank of the strongest pages")


__all__ = ["available", "depth", "hosts", "outcomes", "ranks", "timeline"]
