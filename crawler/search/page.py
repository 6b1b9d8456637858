"""The search page of ``python -m crawler serve``: ``/search?q=...`` (and ``host``, ``lang``,
``limit``): a form and the ranked results, with snippets.

One self-contained HTML page: no script at all, no style or image from anywhere (the
server sends it with a Content-Security-Policy, crawler.read.serve.SEARCH_POLICY, that
allows nothing but its own inline style and a form sent to itself), every text the
crawl or the query brings escaped. Each request opens the indexes anew (so a finished
``index`` run is seen at once) and answers from them; a bad query is the form again with
the error, status 400.

Thread safety: a function of its arguments (each call has its own Searcher).
"""

from __future__ import annotations

import html
from urllib.parse import parse_qs

from ..exceptions import CrawlerError
from .query import DEFAULT_LIMIT, QueryError, Results, Searcher, summary_line

MAX_PAGE_LIMIT = 100
_STYLE = """body{font:15px/1.45 system-ui,sans-serif;margin:2em auto;max-width:52em;padding:0 1em}
form{display:flex;gap:.5em;flex-wrap:wrap}input[name=q]{flex:1;min-width:16em;font-size:1.1em}
ol{padding-left:1.4em}li{margin:1em 0}.url{color:#060;word-break:break-all;font-size:.9em}
.score,.note{color:#666;font-size:.85em}mark{background:#ff6;font-weight:600}
.error{color:#a00}"""


def _snippet(text: str, ranges: list[tuple[int, int]]) -> str:
    out, last = [], 0
    for a, b in ranges:
        out += [html.escape(text[last:a]), "<mark>", html.escape(text[a:b]), "</mark>"]
        last = b
    out.append(html.escape(text[last:]))
    return "".join(out)


def _results(results: Results) -> str:
    items = []
    for hit in results.hits:
        same = (f' <span class="note">({len(hit.duplicates)} near-duplicate'
                f'{"s" if len(hit.duplicates) > 1 else ""} not shown)</span>'
                if hit.duplicates else "")
        rank = "not ranked" if hit.pagerank is None else f"PageRank {hit.pagerank:.3g}"
        items.append(
            f'<li><a href="{html.escape(hit.url, quote=True)}">'
            f"{html.escape(hit.title) or '(no title)'}</a>{same}"
            f'<div class="url">{html.escape(hit.url)}</div>'
            f"<div>{_snippet(hit.snippet, hit.highlights)}</div>"
            f'<div class="score">score {hit.score:.3f} (BM25 {hit.bm25:.3f}, {rank}; '
            f"{html.escape(hit.lang) or 'language unknown'})</div></li>")
    head = (f'<p class="note">{html.escape(summary_line(results))} '
            f"({results.seconds * 1000:.1f} ms)</p>")
    return head + (f"<ol>{''.join(items)}</ol>" if items else "<p>No page matches.</p>")


def render(query: str, body: str, *, host: str = "", lang: str = "") -> str:
    def value(v: str) -> str:
        return html.escape(v, quote=True)

    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(query) + ' - ' if query else ''}search</title>"
            f"<style>{_STYLE}</style></head><body><h1>Search the crawl</h1>"
            '<form method=get action="/search">'
            f'<input name=q value="{value(query)}" autofocus aria-label=query>'
            f'<input name=host value="{value(host)}" placeholder=host size=14 aria-label=host>'
            f'<input name=lang value="{value(lang)}" placeholder=lang size=4 aria-label=language>'
            "<button type=submit>Search</button></form>"
            f'{body}<p class="note"><a href="/">the crawl report</a></p></body></html>')


def search_page(data_dir: str, query_string: str) -> tuple[int, str]:
    """(HTTP status, HTML) for ``/search?<query_string>``."""
    try:
        params = parse_qs(query_string, keep_blank_values=True, max_num_fields=8)
    except ValueError:  # more fields than the form has
        return 400, render("", '<p class="error">too many parameters</p>')
    q = params.get("q", [""])[0]
    host = params.get("host", [""])[0].strip()
    lang = params.get("lang", [""])[0].strip()
    try:
        limit = min(MAX_PAGE_LIMIT, max(1, int(params.get("limit", [DEFAULT_LIMIT])[0])))
    except ValueError:
        limit = DEFAULT_LIMIT
    if not q.strip():
        return 200, render("", "", host=host, lang=lang)
    try:
        with Searcher(data_dir) as searcher:
            results = searcher.search(q, limit=limit, host=host or None, lang=lang or None)
    except QueryError as exc:
        return 400, render(q, f'<p class="error">{html.escape(str(exc))}</p>', host=host,
                           lang=lang)
    except (CrawlerError, OSError) as exc:  # no index yet, a damaged one
        return 503, render(q, f'<p class="error">{html.escape(str(exc))}</p>', host=host,
                           lang=lang)
    return 200, render(q, _results(results), host=host, lang=lang)


__all__ = ["render", "search_page"]
