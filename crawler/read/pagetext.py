"""What the search index reads from one stored page: its main content without boilerplate,
title, description, headings, language, links with their text, and a SimHash; and the
Markdown export's reading of a page.

resiliparse parses the page into lexbor's DOM and renders it once into minimal HTML (one
block a line, links and headings kept), leaving out what is boilerplate by its markup
wherever it is (:data:`BOILERPLATE`: nav, aside, footer, ARIA landmarks, the navigation
bars, sidebars and footers of DocBook and Sphinx). The index reads everything from that
one rendering: headings, links with their text, and the main content, chosen among its
blocks by crawler.read.mainblocks' rule (the run of blocks worth the most, prose paying
for the links and short lines among it). That rule replaced resiliparse's main-content
extraction for the index (issue 44): as good on the open web's articles, it keeps what
documentation is made of (lists, admonitions, DocBook's variable lists, which
resiliparse's rule dropped), and it costs one pass over the rendering instead of a
second, quadratic one over the DOM (docs/SEARCH.md has the numbers). A page whose blocks
are worth nothing (a page of short lines) is read from all of that rendering.

The Markdown export (:func:`read_markdown`) still uses resiliparse's main-content rule,
which writes the structure it keeps (lists, tables) as minimal HTML, with two guards for
documentation: :func:`deepen_lists` (its rule drops every list near the top of the body)
and :func:`main_or_whole` (when it kept less than :data:`MAIN_SHARE` of the page's text
without BOILERPLATE, and what it dropped is not mostly links, that text is used).

The names a page defines are its ``id`` attributes (and ``<a name>``): on a reference
page those are the names it documents (``asyncio.Lock.release``, ``GUC-WORK-MEM``), which
the index weighs as it weighs headings (crawler.search.schema).

Bounds, so a hostile page costs what a normal one does: at most
:data:`MAX_PARSE_BYTES` of the body are parsed (lexbor's DOM is several times the HTML
it holds: a page past that is indexed by its start), at most ``text_limit`` characters
of text kept, :data:`MAX_LINKS` links with text, each cut at :data:`MAX_ANCHOR_TEXT`;
the title, description, headings and names are cut too. A body that is not text
(crawler.read.listing.is_text) gives no document; a text body that is not HTML gives
its text alone. Every step of the index's reading is linear in the page; it stops at
crawler.read.htmlbounds' time budget a page, past which the page is read from all of
its rendering (``PageText.plain`` says why). The Markdown export's main-content
extraction is not linear (resiliparse's rule walks under every ``<div>``): it runs only
within the nesting bound too.

Thread safety: pure functions (resiliparse releases nothing shared).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from html import unescape
from typing import Any, NamedTuple
from urllib.parse import urljoin

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree
from resiliparse.parse.lang import detect_fast

from ..state.pages import PageRecord
from ..web.links import is_html, sniff_charset
from .htmlbounds import DEFAULT_BOUNDS, ReadBounds
from .mainblocks import LINK, TAG, code_share, main_blocks
from .mdrender import QUOTE_CLOSE, QUOTE_OPEN, mark_page, md_text, outline_markdown
from .simhash import simhash

log = logging.getLogger(__name__)

MAX_PARSE_BYTES = 2 << 20  # of a body parsed (decoded text, in characters)
# characters of main text kept a page: the whole of a long reference page (CPython's
# os.html says os.kill ~117,000 characters in; 100,000 cut it), within MAX_PARSE_BYTES
DEFAULT_TEXT_LIMIT = 1_000_000
MAX_TITLE = 1_000
MAX_DESCRIPTION = 2_000
MAX_HEADINGS = 4_000  # characters of h1-h3 text
# characters of the names a page defines (its id attributes): a reference page's every
# entry (CPython's os.html: ~9,000; Django's settings reference: ~7,000)
MAX_NAMES = 50_000
MAX_LINKS = 500  # links with text read from a page (for the pages they point to)
MAX_ANCHOR_TEXT = 200
# detect_fast's rank (a distance: lower is surer); its documentation: above 1200 is
# usually wrong. Texts shorter than MIN_LANG_TEXT are not guessed from.
LANG_CUTOFF = 1200
MIN_LANG_TEXT = 40
# What is boilerplate by its markup wherever it is (CSS selectors, resiliparse's
# skip_elements): left out of both readings of a page. DocBook's .navheader/.navfooter are
# its "Prev Up Home Next" bars; Sphinx's .sphinxsidebar/.related its sidebar and top bar,
# .headerlink its pilcrows.
BOILERPLATE = ["nav", "aside", "footer", "body > header", "[role=navigation]", "[role=banner]",
               "[role=contentinfo]", "[role=complementary]", "[role=search]", ".navheader",
               ".navfooter", ".sphinxsidebar", ".related", ".headerlink", ".footer", "#footer"]
# The main-content rule's text is used if it is at least this share of the whole text
# without BOILERPLATE; below it, the rule dropped content, not boilerplate (module doc).
# Chosen on tools/bench_search_info.py's two manuals (docs/SEARCH.md).
MAIN_SHARE = 0.5
# ...unless what it dropped is mostly links: a table of contents, an index (the rule is
# right to drop those, and a page of every name as a link ranks for all of them)
MAX_LINK_SHARE = 0.5
# The lists resiliparse's main-content rule drops for their depth alone (deepen_lists)
_SHALLOW_LISTS = "body > ul, body > * > ul, body > * > * > ul"
# Admonitions by their markup: Sphinx's (div.admonition: note, warning, seealso...) and
# DocBook's (div.note, div.tip...); the Markdown export writes them as block quotes
ADMONITIONS = ("div.admonition, div.note, div.tip, div.warning, div.caution, div.important, "
               "aside.admonition")
_TEXT_TYPES = ("application/xhtml+xml", "application/xml", "application/json")
# A heading of resiliparse's minimal HTML, (its text): it stops at the next heading tag,
# as crawler.read.mainblocks' LINK at the next link tag (TAG, LINK: any tag, a link)
_HEADING = re.compile(r"<h[1-3]>((?:[^<]|<(?!/?h[1-6]>))*)</h[1-3]>")
# An element's id (or an <a name>): the names a page defines. Documentation generators put
# the defined name there (Sphinx: id="asyncio.Lock.release", "module-os.path"; DocBook:
# id="LIBPQ-ENVARS", "GUC-WORK-MEM"; rustdoc, Javadoc, MDN alike). Found by their literal
# start in the source, then checked to be inside a tag: 0.1 ms a page (a pattern that
# reads each tag took 1 ms, a DOM walk tens of microseconds an element). Lowercase, as
# generators write them.
_ID_ATTR = re.compile(r"""id=(?:"([^"<>]{1,200})"|'([^'<>]{1,200})')""")
_NAME_ATTR = re.compile(r"""name=(?:"([^"<>]{1,200})"|'([^'<>]{1,200})')""")
# ids a generator numbers rather than names: "id3", "index-0", "footnote-2", "s1", "fn12"
# (DocBook: "id-1.7.3.22.2")
_NUMBERED = re.compile(r"(?:id|index|section|sec|footnote|fn|ref|s|n|p|toc|cite_note)[-_]?"
                       r"[\d.-]+", re.IGNORECASE)


@dataclass(slots=True)
class PageText:
    """A page as the index sees it; "" (or empty) for what the page does not have."""

    title: str = ""
    description: str = ""
    headings: str = ""
    names: str = ""  # the names the page defines (its ids), space-separated
    text: str = ""  # the main content (or all visible text: see the module docstring)
    lang: str = ""  # detected ("en", "de"...), else the page's <html lang>, else ""
    canonical: str = ""  # <link rel=canonical>'s target, absolute
    simhash: int = 0
    code: float = 0.0  # the share of ``text`` in code blocks (<pre>): a listing's is ~1
    # (href as written, its text) of the links with text, each pair once, resolved
    # against ``base``; rel=nofollow is in the page record's links (crawler.state.pages),
    # which the indexer checks
    links: list[tuple[str, str]] = field(default_factory=list)
    base: str = ""  # what the links resolve against: <base href>, else the page's URL
    # why ``text`` is all the visible text, not the main content (crawler.read.htmlbounds:
    # nested too deeply, over its time budget); "" when it was read as usual
    plain: str = ""


def _one_line(text: str, limit: int) -> str:
    return " ".join(text[: limit * 2].split())[:limit]


def defined_names(html: str, limit: int = MAX_NAMES) -> str:
    """The names ``html`` defines: its elements' ``id`` attributes and its ``<a>``'s
    ``name``, each once, in order, without the ones a generator numbers, up to ``limit``
    characters."""
    found: list[tuple[int, str]] = []
    for pattern in (_ID_ATTR, _NAME_ATTR):
        for m in pattern.finditer(html):
            at = m.start()
            if at == 0 or not html[at - 1].isspace():  # "grid=", "data-id=": not this one
                continue
            tag = html.rfind("<", 0, at)
            if tag < 0 or html.find(">", tag, at) >= 0:  # in text, not in a tag
                continue
            if pattern is _NAME_ATTR and not (html[tag + 1:tag + 2] in "aA"
                                              and html[tag + 2:tag + 3].isspace()):
                continue  # <meta name>, <input name>: not a name the page defines
            found.append((at, m.group(1) or m.group(2)))
    found.sort()
    seen: set[str] = set()
    out: list[str] = []
    size = 0
    for _, raw in found:
        name = unescape(raw).strip()
        if not name or name in seen or _NUMBERED.fullmatch(name) or " " in name:
            continue
        size += len(name) + 1
        if size > limit:
            break
        seen.add(name)
        out.append(name)
    return " ".join(out)


def _textual(content_type: str, body: bytes) -> bool:
    mime = content_type.partition(";")[0].strip().lower()
    if mime:
        return mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith("+xml")
    return b"\0" not in body[:1024]


def detect_language(text: str, declared: str = "") -> str:
    """The language of ``text`` as a two- or three-letter code: resiliparse's guess when
    it is sure enough, else the declared one (``<html lang>``'s primary subtag), else ""."""
    if len(text) >= MIN_LANG_TEXT:
        lang, rank = detect_fast(text[:5000], cutoff=LANG_CUTOFF)
        if lang != "unknown" and rank <= LANG_CUTOFF:
            return str(lang)
    primary = declared.strip().lower().partition("-")[0].partition("_")[0]
    return primary if primary.isalpha() and len(primary) <= 3 else ""


def _decoded(page: PageRecord) -> tuple[str, bool] | None:
    """(the first MAX_PARSE_BYTES characters of the body, decoded by its charset, NULs
    replaced; whether it is HTML), or None for no body or one that is not text."""
    body = page.body
    if not body or not _textual(page.content_type, body):
        return None
    decoded = body.decode(sniff_charset(page.content_type, body), "replace")
    return (decoded[:MAX_PARSE_BYTES].replace("\0", "\ufffd"),
            is_html(page.content_type, body[:512]))


def page_text(page: PageRecord, *, text_limit: int = DEFAULT_TEXT_LIMIT,
              bounds: ReadBounds = DEFAULT_BOUNDS) -> PageText | None:
    """What the index reads from ``page``; None for a page with no text to index (no
    body, a binary body)."""
    started = time.monotonic()
    body = _decoded(page)
    if body is None:
        return None
    decoded, html = body
    if not html:
        text = _one_line(decoded, text_limit)
        return PageText(text=text, lang=detect_language(text), simhash=simhash(text))
    return read_html(decoded, page.final_url or page.url, text_limit=text_limit,
                     bounds=bounds, started=started)


def _visible(text: str) -> int:
    """Characters of text, without the tags of resiliparse's minimal HTML (links' hrefs
    are no part of what a page says)."""
    return len(TAG.sub("", text).strip())


def deepen_lists(tree: HTMLTree) -> None:
    """Wrap each ``<ul>`` fewer than four elements below ``<body>`` in three plain
    ``<div>``s: resiliparse's main-content rule drops every such list, whatever it says
    (its rule for the open web: a list near the top of the body is a menu; a menu's
    links still drop it, by the rule's link share). Found by one selector: a walk up
    from each list cost ~24 us a step (os.html: 12 ms)."""
    body = tree.body
    if body is None:
        return
    for ul in body.query_selector_all(_SHALLOW_LISTS):
        parent = ul.parent
        if parent is None:
            continue
        outer = tree.create_element("div")
        middle = tree.create_element("div")
        inner = tree.create_element("div")
        if outer is None or middle is None or inner is None:  # (lexbor out of memory)
            return
        parent.insert_before(outer, ul)
        outer.append_child(middle)
        middle.append_child(inner)
        inner.append_child(ul)


def flatten_cells(tree: HTMLTree) -> None:
    """Take the ``<p>``s out of table cells, keeping what they hold (a space between two):
    resiliparse writes a table whose cells hold paragraphs as paragraphs, not rows
    (Sphinx writes every cell so). For the Markdown export only: a DOM edit costs tens
    of microseconds."""
    body = tree.body
    if body is None:
        return
    for para in body.query_selector_all("td > p, th > p"):
        cell = para.parent
        if cell is None:
            continue
        if para.previous_sibling is not None:
            space = tree.create_text_node(" ")
            if space is not None:
                cell.insert_before(space, para)
        while (child := para.first_child) is not None:
            cell.insert_before(child, para)
        cell.remove_child(para)


def mark_admonitions(tree: HTMLTree) -> None:
    """Put QUOTE_OPEN first and QUOTE_CLOSE last in each admonition (:data:`ADMONITIONS`:
    Sphinx's and DocBook's notes, tips, warnings), for the Markdown export to write it
    as a block quote (crawler.read.mdrender)."""
    body = tree.body
    if body is None:
        return
    for box in body.query_selector_all(ADMONITIONS):
        first = tree.create_text_node(QUOTE_OPEN)
        last = tree.create_text_node(QUOTE_CLOSE)
        if first is None or last is None:
            return
        if box.first_child is not None:
            box.insert_before(first, box.first_child)
        else:
            box.append_child(first)
        box.append_child(last)


def main_or_whole(main: str, whole: str) -> str:
    """The module docstring's rule: ``main`` (the main-content rule's text of a page)
    unless it kept less than MAIN_SHARE of ``whole`` (the page's text without
    BOILERPLATE, in resiliparse's minimal HTML with links) and ``whole`` is not mostly
    links; then ``whole``. Neither when both are empty: ""."""
    shown = _visible(whole)
    if main.strip() and _visible(main) >= MAIN_SHARE * shown:
        return main
    linked = sum(len(text) for _, text in LINK.findall(whole))  # (a tag in one: counted)
    if main.strip() and linked > MAX_LINK_SHARE * shown:
        return main
    return whole if shown else main


def _plain_reason(html: str, url: str, bounds: ReadBounds, started: float, *,
                  nesting: bool = True) -> str:
    why = bounds.plain_reason(html, started, nesting=nesting)
    if why:
        log.debug("%s: read from its plain text (%s)", url, why)
    return why


def read_html(html: str, url: str, *, text_limit: int = DEFAULT_TEXT_LIMIT,
              bounds: ReadBounds = DEFAULT_BOUNDS, started: float | None = None) -> PageText:
    """Read one HTML document (already decoded) found at ``url``; ``started``: when its
    reading began (time.monotonic(); default now), what ``bounds``' time budget counts
    from.

    Headings and links come from resiliparse's minimal-HTML rendering of the page (its
    output is ours to parse: only a few tags, attributes escaped), not from walking the
    DOM: resiliparse's node collections cost tens of microseconds an element."""
    started = time.monotonic() if started is None else started
    tree = HTMLTree.parse(html)
    out = PageText(title=_one_line(tree.title or "", MAX_TITLE))
    root = tree.document.first_element_child if tree.document is not None else None
    declared = (root.getattr("lang") or "") if root is not None else ""
    base = url
    head = tree.head
    if head is not None:
        meta = head.query_selector('meta[name="description" i]')
        if meta is not None:
            out.description = _one_line(meta.getattr("content") or "", MAX_DESCRIPTION)
        tag = head.query_selector("base[href]")
        if tag is not None:
            try:
                base = urljoin(url, (tag.getattr("href") or "").strip())
            except ValueError:  # an unparsable <base>: ignored, as WHATWG says
                pass
        tag = head.query_selector('link[rel~="canonical" i][href]')
        if tag is not None:
            try:
                out.canonical = urljoin(base, (tag.getattr("href") or "").strip())[:MAX_TITLE * 8]
            except ValueError:
                pass
    if tree.body is None:
        return out
    # (BOILERPLATE left out: a navigation bar's headings and links are not the page's)
    outline = extract_plain_text(tree, preserve_formatting="minimal_html", links=True,
                                 list_bullets=False, alt_texts=False,
                                 skip_elements=BOILERPLATE)
    out.headings = _one_line(" ".join(
        unescape(TAG.sub("", h)) for h in _HEADING.findall(outline)), MAX_HEADINGS)
    out.names = defined_names(html)
    out.base = base
    seen: set[tuple[str, str]] = set()
    for m in LINK.finditer(outline):  # (a page of a million links: read up to the cap)
        if len(seen) >= MAX_LINKS:
            break
        pair = (unescape(m.group(1)).strip(), _one_line(unescape(TAG.sub("", m.group(2))),
                                                        MAX_ANCHOR_TEXT))
        if pair[0] and pair[1] and pair not in seen:  # a menu repeated: read once
            seen.add(pair)
            out.links.append(pair)
    # (the main-content rule is linear in the page: the time budget alone bounds it)
    out.plain = _plain_reason(html, url, bounds, started, nesting=False)
    chosen = "" if out.plain else main_blocks(outline)
    main = unescape(TAG.sub("", chosen))
    if not main.strip():  # no block worth a main content (or past the bounds): all of it
        chosen, main = outline, unescape(TAG.sub("", outline))
    out.code = code_share(chosen, len(main))
    if not main.strip():  # nothing but boilerplate: that, rather than nothing
        main = extract_plain_text(tree, alt_texts=False, list_bullets=False)
    out.text = _one_line(main, text_limit)
    out.lang = detect_language(out.text, declared)
    out.simhash = simhash(out.text)
    return out


# -- Markdown ---------------------------------------------------------------------------


class Markdown(NamedTuple):
    text: str
    plain: str  # why it is the whole page's, not its main content's (PageText.plain)


def read_markdown(page: PageRecord, *, bounds: ReadBounds = DEFAULT_BOUNDS) -> Markdown | None:
    """The main content of a stored HTML page as Markdown, within ``bounds`` (past them:
    the whole page's text, with its structure); None for a page with no text body (a
    text body that is not HTML is its text, as one paragraph)."""
    started = time.monotonic()
    body = _decoded(page)
    if body is None:
        return None
    decoded, html = body
    if not html:
        return Markdown(md_text(decoded, True) + "\n", "")
    url = page.final_url or page.url
    tree = HTMLTree.parse(mark_page(decoded))
    flatten_cells(tree)
    mark_admonitions(tree)
    plain = _plain_reason(decoded, url, bounds, started)
    # (list_bullets: in minimal HTML, the lists' <ul>/<ol>/<li>: crawler.read.mdrender)
    options: dict[str, Any] = {"preserve_formatting": "minimal_html", "links": True,
                               "list_bullets": True, "alt_texts": False}
    outline = ""
    if not plain:
        deepen_lists(tree)
        outline = main_or_whole(
            extract_plain_text(tree, main_content=True, skip_elements=BOILERPLATE, **options),
            extract_plain_text(tree, skip_elements=BOILERPLATE, **options))
    if not outline.strip():
        outline = extract_plain_text(tree, **options)
    return Markdown(outline_markdown(outline, url), plain)


def page_markdown(page: PageRecord, *, bounds: ReadBounds = DEFAULT_BOUNDS) -> str | None:
    """:func:`read_markdown`'s Markdown alone."""
    read = read_markdown(page, bounds=bounds)
    return None if read is None else read.text


__all__ = ["BOILERPLATE", "DEFAULT_TEXT_LIMIT", "MAIN_SHARE", "Markdown", "PageText",
           "defined_names", "detect_language", "main_or_whole", "page_markdown", "page_text",
           "read_html", "read_markdown"]
