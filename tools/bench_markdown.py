"""Benchmark HTML-to-Markdown conversion on real documentation: how much of each page's
document structure (tables, list items, code blocks, headings, inline code) our converter
keeps, against trafilatura's Markdown, and how fast each is. Not a test.

Usage (from the repository root; trafilatura comes with the bench extra,
``python -m pip install --upgrade pip && pip install -e '.[bench]'``: without it only ours
is measured, and the tool says so in one line)::

    python tools/bench_markdown.py --fetch-debian-docs --workdir /tmp/bench-md --limit 400
    python tools/bench_markdown.py --html-root /usr/share/doc/python3.11/html --limit 0

``--fetch-debian-docs`` downloads Debian documentation packages with ``apt-get download``
(``--debian-packages``; default postgresql-doc-15 and python3.11-doc: HTML made by the
DocBook XSL stylesheets and by Sphinx, written by nobody here) and unpacks each with
``dpkg-deb -x`` into ``--workdir`` (tools/bench_extract.py's ``fetch_debian_docs``; kept
there when given, so a second run reuses it; else a temp dir, removed at the end). That is
the only network use. ``--html-root DIR`` takes any directory of ``*.html``/``*.htm``
instead. ``--limit N`` pages a package (default 400; 0: all): an even, deterministic
spread over its files sorted by path (every len/N-th).

Theory of operation. Each page's structure is counted in its HTML (lxml), outside the
regions that are navigation or boilerplate by their markup (:data:`BOILERPLATE_XPATH`:
nav, aside, footer, header, the ARIA landmarks navigation, banner, contentinfo,
complementary and search, DocBook's navheader/navfooter bars, Sphinx's sphinxsidebar,
related bar and footer; a table of contents, ``toctree-wrapper``, is content). Counted:
tables (``<table>`` of two rows or more, one of them with two cells or more, not inside
another table), list items (``<li>`` of a ``<ul>``/``<ol>``), code blocks (``<pre>``,
not inside another), headings (``<h1>``-``<h6>``) and inline code (``<code>`` not in a
``<pre>`` or another ``<code>``); an element with no text is not counted (no Markdown can
say it). The same kinds are counted in each converter's Markdown (:func:`count_markdown`):
GFM tables by their header separator line (``| --- | --- |``), list items by their marker
(``-``, ``*``, ``+``, ``1.``, ``1)``; a thematic break ``* * *`` is not one), fenced code
blocks (```` ``` ```` or ``~~~``, also opened on a list item's line, as trafilatura
writes ``1. `````; indented code blocks are not counted), ATX headings
(``#`` to ``######``), each also in a block quote (``> ``) or a list item, and inline
code spans (backtick runs matched as CommonMark does, on one line, a backslash-escaped
backtick opening none); nothing inside a fence but the fence counts. Per page and kind,
kept = min(Markdown count, HTML count): a converter gets no credit for more items than
the page has (trafilatura, for one, writes a list
item's leading ``<code>`` as a fenced block). A kind's kept share is the sum of kept over
the sum of the HTML count, over all pages (and per package).

The converters: ours, ``crawler.read.pagetext.page_markdown`` of a PageRecord holding the
page's bytes (it decodes them itself); trafilatura, ``trafilatura.extract(html,
output_format="markdown", include_tables=True, include_formatting=True,
include_links=True, url=...)`` of the page decoded as ours decodes it (outside its clock).
Each page goes through both, in turn (which one first alternates page by page), after
one untimed warm-up page each; the time is ``time.process_time`` around each call (CPU of
the process, every thread). Reported: ms a page (mean and median), pages/s (pages over
the summed time) and the pages a converter returned nothing (or only whitespace) for, or
raised on (counted as nothing).

Results: a table on stdout (kinds as rows), one per package, the timing line, and JSON
(``--out``, default bench-results/markdown-<ts>.json) with per-kind and per-package
numbers, timing, the machine, the revision, the arguments, and the pages where ours kept
less of a kind than trafilatura (the first few a kind).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))
from tools import _benchutil as bu  # noqa: E402
from tools.bench_extract import fetch_debian_docs, html_files, spread  # noqa: E402

TOOL = "bench_markdown"
DEBIAN_PACKAGES = "postgresql-doc-15,python3.11-doc"
KINDS = ("tables", "list_items", "code_blocks", "headings", "inline_code")
CONVERTERS = ("ours", "trafilatura")
BELOW_PEER_EXAMPLES = 10  # pages a kind where ours kept less than trafilatura, in the JSON


def _has_word(attr: str, word: str) -> str:
    return f"contains(concat(' ', normalize-space(@{attr}), ' '), ' {word} ')"


# An element is boilerplate when it or an ancestor matches this (XPath: lxml's cssselect
# is optional).
BOILERPLATE_XPATH = " or ".join([
    *(f"self::{tag}" for tag in ("nav", "aside", "footer", "header")),
    *(_has_word("role", r) for r in ("navigation", "banner", "contentinfo", "complementary",
                                      "search")),
    *(_has_word("class", c) for c in ("navheader", "navfooter", "sphinxsidebar", "related",
                                      "footer")),
])
_CONTENT = f"[not(ancestor-or-self::*[{BOILERPLATE_XPATH}])]"
_HTML_XPATH = {
    "tables": f"//table{_CONTENT}[not(ancestor::table)]",
    "list_items": f"//li{_CONTENT}[parent::ul or parent::ol]",
    "code_blocks": f"//pre{_CONTENT}[not(ancestor::pre)]",
    "headings": "//*[self::h1 or self::h2 or self::h3 or self::h4 or self::h5 or self::h6]"
                + _CONTENT,
    "inline_code": f"//code{_CONTENT}[not(ancestor::pre) and not(ancestor::code)]",
}
_ROWS = "./tr | ./thead/tr | ./tbody/tr | ./tfoot/tr"


def _is_table(table: Any) -> bool:
    """Two rows or more (its own, not a nested table's), one of them with two cells."""
    rows = table.xpath(_ROWS)
    return len(rows) >= 2 and any(len(row.xpath("./td | ./th")) >= 2 for row in rows)


def count_html(body: bytes, charset: str = "utf-8") -> dict[str, int]:
    """Each kind's elements in a page's content (outside boilerplate), as the module says."""
    import lxml.html
    from lxml import etree

    counts = dict.fromkeys(KINDS, 0)
    try:
        parser = lxml.html.HTMLParser(encoding=charset)
        doc = lxml.html.document_fromstring(body, parser=parser)
    except (etree.ParserError, ValueError, LookupError):
        return counts
    for kind, xpath in _HTML_XPATH.items():
        found = doc.xpath(xpath)
        if kind == "tables":
            counts[kind] = sum(_is_table(t) for t in found)
        else:
            counts[kind] = sum(1 for el in found if el.text_content().strip())
    return counts


# a fence, maybe opened on a list item's line (trafilatura writes "1. ```")
_FENCE = re.compile(r"^\s*((?:[-*+]|\d+[.)])\s+)?(`{3,}|~{3,})(.*)$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")
_THEMATIC_BREAK = re.compile(r"^\s*([-*_])(?:\s*\1){2,}\s*$")
_HEADING = re.compile(r"^\s*#{1,6}\s")  # (up to 3 spaces; in a list item, its indentation)
_QUOTE = re.compile(r"^\s*(?:>\s?)+")  # a block quote's markers, at every level


def code_spans(line: str) -> int:
    """Inline code spans on one line, as CommonMark finds them: a run of n backticks
    opens one that the next run of exactly n closes (no backslash escapes inside); an
    opener with no closer is literal text, and a backslash-escaped backtick opens none.
    A span of only spaces does not count."""
    spans = i = 0
    n = len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c != "`":
            i += 1
            continue
        j = i
        while j < n and line[j] == "`":
            j += 1
        width = j - i
        k = j
        close = -1
        while k < n:
            if line[k] != "`":
                k += 1
                continue
            m = k
            while m < n and line[m] == "`":
                m += 1
            if m - k == width:
                close = k
                break
            k = m
        if close < 0:
            i = j  # no closer: the run is text
            continue
        spans += bool(line[j:close].strip())
        i = close + width
    return spans


def count_markdown(md: str | None) -> dict[str, int]:
    """Each kind in a Markdown text, as the module says (fenced code is code and nothing
    else; an unclosed fence runs to the end of the text, as in CommonMark)."""
    counts = dict.fromkeys(KINDS, 0)
    fence = ""  # the open fence's characters, "" outside one
    for line in (md or "").splitlines():
        line = _QUOTE.sub("", line)  # (a block quote's lines hold the same structures)
        m = _FENCE.match(line)
        if fence:
            if m and not m.group(1) and m.group(2)[0] == fence[0] \
                    and len(m.group(2)) >= len(fence) and not m.group(3).strip():
                fence = ""
            continue
        if m and not (m.group(2)[0] == "`" and "`" in m.group(3)):  # info string: no `
            fence = m.group(2)
            counts["code_blocks"] += 1
            counts["list_items"] += bool(m.group(1))
            continue
        if _TABLE_SEP.match(line):
            counts["tables"] += 1
        elif _HEADING.match(line):
            counts["headings"] += 1
        elif _LIST_ITEM.match(line) and not _THEMATIC_BREAK.match(line):
            counts["list_items"] += 1
        counts["inline_code"] += code_spans(line)
    return counts


# -- the converters ------------------------------------------------------------------------

Converter = Callable[[str, bytes, str], str | None]  # (url, body, decoded) -> Markdown


def ours() -> Converter:
    from crawler.read.pagetext import page_markdown
    from crawler.state.pages import PageRecord

    def convert(url: str, body: bytes, _decoded: str) -> str | None:
        return page_markdown(PageRecord(url=url, status=200, fetched_at=1.0, depth=0,
                                        content_type="text/html", body=body))
    return convert


def peer() -> Converter | None:
    """trafilatura's Markdown, or None when trafilatura is not installed."""
    try:
        import trafilatura
    except ImportError:
        return None

    def convert(url: str, _body: bytes, decoded: str) -> str | None:
        out: str | None = trafilatura.extract(decoded, output_format="markdown",
                                              include_tables=True, include_formatting=True,
                                              include_links=True, url=url)
        return out
    return convert


# -- the run -------------------------------------------------------------------------------


class Tally:
    """One group's (a package's, or all pages') HTML counts and each converter's kept and
    written counts."""

    def __init__(self, converters: list[str]) -> None:
        self.pages = 0
        self.html = dict.fromkeys(KINDS, 0)
        self.kept = {c: dict.fromkeys(KINDS, 0) for c in converters}
        self.written = {c: dict.fromkeys(KINDS, 0) for c in converters}

    def add(self, html: dict[str, int], md: dict[str, dict[str, int]]) -> None:
        self.pages += 1
        for kind in KINDS:
            self.html[kind] += html[kind]
            for c, counts in md.items():
                self.kept[c][kind] += min(counts[kind], html[kind])
                self.written[c][kind] += counts[kind]

    def share(self, converter: str, kind: str) -> float | None:
        return self.kept[converter][kind] / self.html[kind] if self.html[kind] else None

    def as_json(self) -> dict[str, Any]:
        return {"pages": self.pages, "kinds": {kind: {
            "html": self.html[kind],
            **{c: {"kept": self.kept[c][kind], "written": self.written[c][kind],
                   "kept_share": self.share(c, kind)} for c in self.kept}} for kind in KINDS}}


def measure(files: list[tuple[str, Path, str]], converters: dict[str, Converter],
            ) -> dict[str, Any]:
    """Every page through every converter: the tallies (all and per package), the per-page
    times, the pages with nothing, and where ours kept less than the peer."""
    from crawler.web.links import sniff_charset

    names = list(converters)
    total = Tally(names)
    groups: dict[str, Tally] = {}
    times: dict[str, list[float]] = {c: [] for c in names}
    empty: dict[str, list[str]] = {c: [] for c in names}
    errors: dict[str, list[str]] = {c: [] for c in names}
    below: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    below_pages = dict.fromkeys(KINDS, 0)

    def page_input(label: str, path: Path, url: str) -> tuple[bytes, str, str]:
        body = path.read_bytes()
        charset = sniff_charset("text/html", body)
        return body, charset, body.decode(charset, "replace")

    if files:  # one untimed page each first: imports and caches warmed alike
        label, path, url = files[0]
        body, _, decoded = page_input(label, path, url)
        for convert in converters.values():
            try:
                convert(url, body, decoded)
            except Exception:  # a failure is timed and recorded below
                pass
    for i, (label, path, url) in enumerate(files):
        body, charset, decoded = page_input(label, path, url)
        html = count_html(body, charset)
        md: dict[str, dict[str, int]] = {}
        for name in names if i % 2 == 0 else reversed(names):
            c0 = time.process_time()
            try:
                text = converters[name](url, body, decoded)
            except Exception as exc:  # a converter's failure on a page is a result
                text = None
                errors[name].append(f"{path}: {exc!r}"[:300])
            times[name].append(time.process_time() - c0)
            if not (text or "").strip():
                empty[name].append(str(path))
            md[name] = count_markdown(text)
        total.add(html, md)
        groups.setdefault(label, Tally(names)).add(html, md)
        if "trafilatura" in md:
            for kind in KINDS:
                mine = min(md["ours"][kind], html[kind])
                theirs = min(md["trafilatura"][kind], html[kind])
                if mine < theirs:
                    below_pages[kind] += 1
                    if len(below[kind]) < BELOW_PEER_EXAMPLES:
                        below[kind].append({"page": str(path), "html": html[kind],
                                            "ours": md["ours"][kind],
                                            "trafilatura": md["trafilatura"][kind]})
        if (i + 1) % 200 == 0:
            bu.log(f"{i + 1}/{len(files)} pages")
    timing = {}
    for name in names:
        t = times[name]
        spent = sum(t)
        timing[name] = {"pages": len(t), "cpu_s": spent,
                        "ms_per_page_mean": 1e3 * spent / len(t) if t else None,
                        "ms_per_page_median": 1e3 * bu.median(t) if t else None,
                        "pages_per_s": len(t) / spent if spent > 0 else None,
                        "empty_pages": len(empty[name]), "first_empty": empty[name][:10],
                        "errors": len(errors[name]), "first_errors": errors[name][:5]}
    return {"all": total, "groups": groups, "timing": timing,
            "ours_below_peer": {"pages": below_pages, "examples": below}}


def _fmt_share(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def report(res: dict[str, Any], names: list[str]) -> str:
    total: Tally = res["all"]
    heads = ["kind", "HTML count", *(f"{c}: kept share" for c in names)]
    out = [bu.markdown_table(heads, [[k, f"{total.html[k]:,}",
                                      *(_fmt_share(total.share(c, k)) for c in names)]
                                     for k in KINDS])]
    groups: dict[str, Tally] = res["groups"]
    if len(groups) > 1:
        rows = [[label, str(g.pages), k, f"{g.html[k]:,}", *(_fmt_share(g.share(c, k))
                                                            for c in names)]
                for label, g in groups.items() for k in KINDS]
        out.append(bu.markdown_table(["package", "pages", "kind", "HTML count",
                                      *(f"{c}: kept share" for c in names)], rows))
    parts = []
    for c in names:
        t = res["timing"][c]
        mean = t["ms_per_page_mean"] or 0.0
        median = t["ms_per_page_median"] or 0.0
        rate = f"{t['pages_per_s']:.1f}" if t["pages_per_s"] else "-"
        parts.append(f"{c}: {mean:.2f} ms/page mean, {median:.2f} median, {rate} pages/s, "
                     f"{t['pages']} pages, {t['empty_pages']} empty, {t['errors']} errors")
    out.append("CPU time (process_time): " + "; ".join(parts))
    return "\n\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--fetch-debian-docs", action="store_true",
                   help="apt-get download and unpack --debian-packages into --workdir")
    p.add_argument("--debian-packages", default=DEBIAN_PACKAGES,
                   help=f"comma-separated (default {DEBIAN_PACKAGES})")
    p.add_argument("--html-root", type=Path, help="any directory of HTML files instead")
    p.add_argument("--workdir", type=Path, help="downloads (default: a temp dir, removed)")
    p.add_argument("--limit", type=int, default=400,
                   help="pages a package, evenly spread over its files (0: all; default 400)")
    p.add_argument("--out", type=Path, help="JSON path (default bench-results/markdown-<ts>.json)")
    return p.parse_args(argv)


def corpus(args: argparse.Namespace, work: Path) -> list[tuple[str, Path, str]]:
    """(package, file, its URL) of every page measured."""
    if args.html_root is not None:
        root = args.html_root.resolve()
        if not root.is_dir():
            raise SystemExit(f"{TOOL}: --html-root {args.html_root}: not a directory")
        sets = [(root.name or "html-root", root)]
    else:
        packages = [x.strip() for x in args.debian_packages.split(",") if x.strip()]
        if not packages:
            raise SystemExit(f"{TOOL}: --debian-packages names no package")
        try:
            sets = fetch_debian_docs(work, packages)
        except subprocess.CalledProcessError as exc:
            cmd = " ".join(str(x) for x in exc.cmd)
            raise SystemExit(f"{TOOL}: {cmd} failed (exit {exc.returncode})") from None
        except FileNotFoundError as exc:
            raise SystemExit(f"{TOOL}: {exc.filename} not found (apt-get and dpkg-deb "
                             "are needed: a Debian or Ubuntu system)") from None
    files = []
    for label, root in sets:
        found = spread(html_files(root), args.limit)
        if not found:
            raise SystemExit(f"{TOOL}: {label}: no *.html files under {root}")
        files += [(label, f, f"http://{TOOL}.invalid/{label}/{f.relative_to(root).as_posix()}")
                  for f in found]
    return files


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.limit < 0:
        raise SystemExit(f"{TOOL}: --limit must be 0 (all) or more")
    if (args.html_root is None) == (not args.fetch_debian_docs):
        raise SystemExit(f"{TOOL}: give one of --fetch-debian-docs or --html-root DIR")
    converters = {"ours": ours()}
    other = peer()
    if other is None:
        bu.log(f"{TOOL}: trafilatura is not installed: only ours is measured "
               "(pip install -e '.[bench]' adds it)")
    else:
        converters["trafilatura"] = other
    names = list(converters)
    revision = bu.git_revision(REPO)
    loadavg_start = bu.loadavg()
    temp = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="bench-markdown-")) if temp else args.workdir
    try:
        work.mkdir(parents=True, exist_ok=True)
        files = corpus(args, work)
        bu.log(f"{len(files)} pages; converting with {', '.join(names)} ...")
        started = time.monotonic()
        res = measure(files, converters)
        wall = time.monotonic() - started
    finally:
        if temp:
            shutil.rmtree(work, ignore_errors=True)
    text = report(res, names)
    if other is None:
        text += "\n\ntrafilatura is not installed: only ours was measured."
    out_path = args.out or REPO / "bench-results" / f"markdown-{bu.timestamp()}.json"
    bu.write_results(out_path, {
        "revision": revision,
        "machine": {**bu.machine_info(("lxml", "resiliparse", "trafilatura")),
                    "load_start": loadavg_start},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "converters": names,
        "skipped": {} if other is not None else {"trafilatura": "not installed"},
        "pages": len(files), "wall_s": wall,
        "kinds": res["all"].as_json()["kinds"],
        "packages": {label: g.as_json() for label, g in res["groups"].items()},
        "timing": res["timing"],
        "ours_below_peer": res["ours_below_peer"] if other is not None else None}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
