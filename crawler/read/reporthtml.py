"""The crawl report as one self-contained HTML page: inline CSS, charts as inline SVG.

Nothing in the page refers to anything outside it (no script, font, image or
style sheet to fetch), so it opens the same with no network, from a file or
from ``serve``. ``refresh`` adds a meta refresh (``serve``'s live page).
Every value from the crawl is escaped. Pure: data in, text out.
"""

from __future__ import annotations

import html
import time
from typing import Any

from . import charts
from .report import LONG_CHAIN

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;
background:#fafafa}
header{background:#263238;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#cfd8dc}
main{max-width:1100px;margin:0 auto;padding:8px 24px 40px}
section{background:#fff;border:1px solid #e0e0e0;border-radius:6px;margin:16px 0;padding:12px 16px}
h2{font-size:16px;margin:4px 0 10px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eee;vertical-align:top}
th{background:#f5f5f5}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
td.u{word-break:break-all}.flag{color:#b3282d;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{flex:1 1 130px;background:#f5f7f8;
border-radius:6px;padding:8px 12px}.card b{display:block;font-size:20px}
figure{margin:8px 0}figure svg{max-width:100%;height:auto}
.muted{color:#777}nav a{color:#cfd8dc;margin-right:12px;font-size:13px}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _n(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if digits else f"{int(value):,}"


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset(),  # type: ignore[assignment]
           url_cols: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    if not rows:
        return '<p class="muted">None.</p>'
    head = "".join(f'<th class="n">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = ' class="n"' if i in numeric else ' class="u"' if i in url_cols else ""
            cells.append(f"<td{cls}>{cell}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure(name: str, svg: str) -> str:
    if not svg:
        return f'<p class="muted">No data for this chart.</p><!-- chart {name}: empty -->'
    return f'<figure id="chart-{name}" class="chart">{svg}</figure>'


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{_e(title)}</h2>{body}</section>'


def render(report: dict[str, Any], *, refresh: int | None = None) -> str:
    """The report page. Raises CrawlerError when matplotlib is missing."""
    c = report["crawl"]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(c["generated_at"]))
    span = (c["last"] - c["first"]) if c["first"] is not None else 0
    cards = [("records", _n(c["records"])), ("with an answer", _n(c["fetched"])),
             ("hosts", _n(report["hosts"]["count"])), ("bytes", _bytes(c["bytes"])),
             ("links", _n(c["links"])),
             ("crawl span", f"{span:,.1f} s" if span < 120 else f"{span / 60:,.1f} min"),
             ("broken targets", _n(report["broken"]["targets"])),
             ("redirect chains", _n(report["redirects"]["chains"]))]
    parts = [_section("summary", "Summary", '<div class="cards">' + "".join(
        f"<div class=\"card\"><b>{v}</b>{_e(k)}</div>" for k, v in cards) + "</div>")]
    o = report["outcomes"]
    parts.append(_section("outcomes", "Outcomes", _figure("outcomes", charts.outcomes(
        o["by_class"])) + _table(["outcome", "records"], [[_e(k), _n(v)] for k, v in
                                                          o["by_key"].items()], {1})))
    t = report["timeline"]
    parts.append(_section("timeline", "Pages and errors over time",
                          _figure("timeline", charts.timeline(t["bins"], t["bin_seconds"]))))
    h = report["hosts"]
    parts.append(_section("hosts", f"Hosts ({h['count']:,}; the largest {len(h['top'])})",
                          _figure("hosts", charts.hosts(h["top"])) + _table(
        ["host", "pages", "errors", "bytes", "median fetch s", "robots-blocked"],
        [[_e(r["host"]), _n(r["pages"]), _n(r["errors"]), _bytes(r["bytes"]),
          _n(r["median_fetch_s"], 3), _n(r["robots_blocked"])] for r in h["top"]],
        {1, 2, 3, 4, 5})))
    parts.append(_section("depth", "Depth", _figure("depth", charts.depth(report["depth"]))))
    parts.append(_section("redirects", "Redirect chains", _chains(report["redirects"])))
    parts.append(_section("broken", "Broken links", _broken(report["broken"])))
    d = report["duplicates"]
    parts.append(_section("duplicates", "Duplicate content", (
        f"<p>{d['groups']:,} payloads served under more than one URL: {d['pages']:,} pages, "
        f"{_bytes(d['wasted_bytes'])} repeated (stored 200 bodies, SHA-1).</p>") + _table(
        ["copies", "bytes", "URLs"], [[_n(g["count"]), _bytes(g["bytes"]), "<br>".join(
            _e(u) for u in g["urls"])] for g in d["top"]], {0, 1}, {2})))
    parts.append(_section("slowest", "Slowest pages", _table(
        ["seconds", "URL"], [[_n(r["elapsed"], 3), _e(r["url"])] for r in report["slowest"]],
        {0}, {1})))
    parts.append(_section("largest", "Largest pages", _table(
        ["bytes", "URL"], [[_bytes(r["bytes"]), _e(r["url"])] for r in report["largest"]],
        {0}, {1})))
    parts.append(_section("rank", "Top pages by PageRank", _rank(report["rank"])))
    sections = ["outcomes", "timeline", "hosts", "depth", "redirects", "broken", "duplicates",
                "slowest", "largest", "rank"]
    if "site" in report:  # from the search index, when the crawl has one
        parts.append(_section("site", "Titles, descriptions, canonicals, near-duplicates",
                              _site(report["site"])))
        sections.append("site")
    meta = f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh else ""
    nav = "".join(f'<a href="#{s}">{s}</a>' for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{meta}'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>Crawl report: {_e(c['dir'])}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>Crawl report</h1><p>{_e(c['dir'])} &middot; {when} &middot; "
            f"{_n(c['records'])} records</p><nav>{nav}</nav></header>"
            f"<main>{''.join(parts)}</main></body></html>\n")


def _chains(r: dict[str, Any]) -> str:
    intro = (f"<p>{r['chains']:,} chains over {r['redirects']:,} redirects; "
             f'<span class="flag">{r["loops"]:,} loops</span>, '
             f'<span class="flag">{r["long"]:,} longer than {LONG_CHAIN} hops</span>.</p>')
    rows = []
    for ch in r["list"]:
        flags = [f for f, on in (("loop", ch["loop"]), (f"> {LONG_CHAIN} hops", ch["long"]))
                 if on]
        if ch["loop"]:
            final = "loop"
        elif ch["final_status"] is None:
            final = "not crawled"
        else:
            final = str(ch["final_status"])
        rows.append([_n(ch["hops"]), _e(final), f'<span class="flag">{_e(", ".join(flags))}'
                     "</span>", " &rarr;<br>".join(_e(u) for u in ch["urls"])])
    return intro + _table(["hops", "final", "flags", "chain"], rows, {0}, {3})


def _broken(r: dict[str, Any]) -> str:
    intro = (f"<p>{r['links']:,} links to {r['targets']:,} targets that answered 4xx/5xx or "
             "could not be fetched.</p>")
    rows = []
    for t in r["list"]:
        what = str(t["status"]) if t["status"] else (t["reason"] or "failed")
        refs = "<br>".join(_e(f["url"]) + (" (nofollow)" if f["nofollow"] else "")
                           + (" (redirect)" if f["redirect"] else "") for f in t["from"])
        more = t["referrers"] - len(t["from"])
        if more > 0:
            refs += f'<br><span class="muted">and {more:,} more</span>'
        rows.append([_e(t["url"]), _e(what), _n(t["referrers"]), refs])
    return intro + _table(["target", "answer", "linked from", "pages linking to it"], rows,
                          {2}, {0, 3})


def _site(r: dict[str, Any]) -> str:
    """The search index's findings (crawler.search.sitecheck)."""
    def urls(items: list[str]) -> str:
        return "<br>".join(_e(u) for u in items)

    mt, md = r["missing_title"], r["missing_description"]
    dt, dd, c, nd = (r["duplicate_titles"], r["duplicate_descriptions"], r["canonical"],
                     r["near_duplicates"])
    return "".join([
        f"<p>Of {r['pages']:,} indexed pages: {mt['count']:,} have no title, "
        f"{md['count']:,} no description; {dt['pages']:,} pages share {dt['groups']:,} "
        f"titles, {dd['pages']:,} share {dd['groups']:,} descriptions; {c['bad']:,} of "
        f"{c['pages']:,} canonical links point to a redirect, an error or a page not "
        f"crawled; {nd['pages']:,} pages fall in {nd['groups']:,} near-duplicate groups "
        f"(SimHash, 3 bits).</p>",
        "<h3>Shared titles</h3>", _table(["pages", "title", "URLs"], [
            [_n(g["count"]), _e(g["title"]), urls(g["urls"])] for g in dt["top"]], {0}, {2}),
        "<h3>Shared descriptions</h3>", _table(["pages", "description", "URLs"], [
            [_n(g["count"]), _e(g["description"]), urls(g["urls"])] for g in dd["top"]],
            {0}, {2}),
        "<h3>Canonical links to a redirect or an error</h3>", _table(
            ["page", "canonical", "status", "problem"],
            [[_e(b["url"]), _e(b["canonical"]), _e(b["status"] if b["status"] is not None
                                                    else "-"), _e(b["problem"])]
             for b in c["top"]], set(), {0, 1}),
        "<h3>Near-duplicate groups</h3>", _table(["pages", "title", "URLs"], [
            [_n(g["count"]), _e(g["title"]), urls(g["urls"])] for g in nd["top"]], {0}, {2}),
        "<h3>Pages with no title</h3>", f"<p>{urls(mt['urls']) or 'none'}</p>",
    ])


def _rank(r: dict[str, Any]) -> str:
    if not r.get("computed"):
        return '<p class="muted">Not computed (--no-rank).</p>'
    state = "converged" if r["converged"] else "did NOT converge"
    intro = (f"<p>Damping {r['damping']}, {state} after {r['iterations']} iterations "
             f"(L1 change {r['delta']:.2g}). Scaled so the strongest page is 100.</p>")
    return intro + _figure("rank", charts.ranks(r["top"])) + _table(
        ["rank", "raw", "status", "URL"],
        [[_n(t["rank_scaled"], 2), f"{t['rank']:.3g}", str(t["status"]), _e(t["url"])]
         for t in r["top"]], {0, 1}, {3})


__all__ = ["render"]
