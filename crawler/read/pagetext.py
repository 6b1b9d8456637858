"""What the search index reads from one stored page: its main content without boilerplate,
title, description, headings, language, links with their text, and a SimHash.

resiliparse does the reading (chosen by measurement over trafilatura and
readability-lxml: docs/SEARCH.md, tools/bench_extract.py): one parse of the page into
lexbor's DOM, then its main-content extraction (navigation, footers and sidebars left
out) and its language detector over the text extracted. When the main-content rule
keeps nothing (a page that is all list or all table), the page's whole visible text is
used instead, so no page is indexed empty because a heuristic disliked it.

Bounds, so a hostile page costs what a normal one does: at most
:data:`MAX_PARSE_BYTES` of the body are parsed (lexbor's DOM is several times the HTML
it holds: a page past that is indexed by its start), at most ``text_limit`` characters
of text kept, :data:`MAX_LINKS` links with text, each cut at :data:`MAX_ANCHOR_TEXT`;
the title, description and headings are cut too. A body that is not text
(crawler.read.listing.is_text) gives no document; a text body that is not HTML gives
its text alone.

Thread safety: pure functions (resiliparse releases nothing shared).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import unescape
from urllib.parse import urljoin

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree
from resiliparse.parse.lang import detect_fast

from ..state.pages import PageRecord
from ..web.links import is_html, sniff_charset
from .simhash import simhash

MAX_PARSE_BYTES = 2 << 20  # of a body parsed (decoded text, in characters)
DEFAULT_TEXT_LIMIT = 100_000  # characters of main text kept a page
MAX_TITLE = 1_000
MAX_DESCRIPTION = 2_000
MAX_HEADINGS = 4_000  # characters of h1-h3 text
MAX_LINKS = 500  # links with text read from a page (for the pages they point to)
MAX_ANCHOR_TEXT = 200
# detect_fast's rank (a distance: lower is surer); its documentation: above 1200 is
# usually wrong. Texts shorter than MIN_LANG_TEXT are not guessed from.
LANG_CUTOFF = 1200
MIN_LANG_TEXT = 40
_TEXT_TYPES = ("application/xhtml+xml", "application/xml", "application/json")
# In resiliparse's minimal HTML: a heading, a link, any tag.
_HEADING = re.compile(r"<h[1-3]>(.*?)</h[1-3]>", re.S)
_LINK = re.compile(r'<a href="([^"]*)">(.*?)</a>', re.S)
_TAG = re.compile(r"<[^>]*>")


@dataclass(slots=True)
class PageText:
    """A page as the index sees it; "" (or empty) for what the page does not have."""

    title: str = ""
    description: str = ""
    headings: str = ""
    text: str = ""  # the main content (or all visible text: see the module docstring)
    lang: str = ""  # detected ("en", "de"...), else the page's <html lang>, else ""
    canonical: str = ""  # <link rel=canonical>'s target, absolute
    simhash: int = 0
    # (href as written, its text) of the links with text, each pair once, resolved
    # against ``base``; rel=nofollow is in the page record's links (crawler.state.pages),
    # which the indexer checks
    links: list[tuple[str, str]] = field(default_factory=list)
    base: str = ""  # what the links resolve against: <base href>, else the page's URL


def _one_line(text: str, limit: int) -> str:
    return " ".join(text[: limit * 2].split())[:limit]


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


def page_text(page: PageRecord, *, text_limit: int = DEFAULT_TEXT_LIMIT) -> PageText | None:
    """What the index reads from ``page``; None for a page with no text to index (no
    body, a binary body)."""
    body = _decoded(page)
    if body is None:
        return None
    decoded, html = body
    if not html:
        text = _one_line(decoded, text_limit)
        return PageText(text=text, lang=detect_language(text), simhash=simhash(text))
    return read_html(decoded, page.final_url or page.url, text_limit=text_limit)


def read_html(html: str, url: str, *, text_limit: int = DEFAULT_TEXT_LIMIT) -> PageText:
    """Read one HTML document (already decoded) found at ``url``.

    Headings and links come from resiliparse's minimal-HTML rendering of the page (its
    output is ours to parse: only a few tags, attributes escaped), not from walking the
    DOM: resiliparse's node collections cost tens of microseconds an element."""
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
    outline = extract_plain_text(tree, preserve_formatting="minimal_html", links=True,
                                 list_bullets=False, alt_texts=False)
    out.headings = _one_line(" ".join(
        unescape(_TAG.sub("", h)) for h in _HEADING.findall(outline)), MAX_HEADINGS)
    out.base = base
    seen: set[tuple[str, str]] = set()
    for m in _LINK.finditer(outline):  # (a page of a million links: read up to the cap)
        if len(seen) >= MAX_LINKS:
            break
        pair = (unescape(m.group(1)).strip(), _one_line(unescape(_TAG.sub("", m.group(2))),
                                                        MAX_ANCHOR_TEXT))
        if pair[0] and pair[1] and pair not in seen:  # a menu repeated: read once
            seen.add(pair)
            out.links.append(pair)
    main = extract_plain_text(tree, main_content=True, alt_texts=False, list_bullets=False)
    if not main.strip():
        main = extract_plain_text(tree, alt_texts=False, list_bullets=False)
    out.text = _one_line(main, text_limit)
    out.lang = detect_language(out.text, declared)
    out.simhash = simhash(out.text)
    return out


# -- Markdown ---------------------------------------------------------------------------

# The tags of resiliparse's minimal HTML, and what Markdown says specially in text.
_MD_TAG = re.compile(r'<(/?)(h[1-6]|p|ul|ol|li|pre|br|a)(?: href="([^"]*)")?>')
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>])")
_MD_LINE_START = re.compile(r"^([#>+-]|\d+[.)])", re.M)


def _escape_start(m: re.Match[str]) -> str:
    mark = m.group(1)  # "#", ">", "+", "-", or "12." / "12)": its punctuation escaped
    return "\\" + mark if not mark[0].isdigit() else mark[:-1] + "\\" + mark[-1]


def _md_text(raw: str, line_start: bool) -> str:
    """Text of the outline as Markdown text: whitespace collapsed (one space kept at
    each end), Markdown's characters escaped, and what would start a block at the start
    of a line (``#``, ``-``, ``1.``) too."""
    words = unescape(raw).split()
    if not words:
        return "" if line_start or not raw else " "
    text = _MD_SPECIAL.sub(r"\\\1", " ".join(words))
    if line_start or raw[0].isspace():  # a new line may follow a space once wrapped
        text = _MD_LINE_START.sub(_escape_start, text)
    lead = " " if raw[0].isspace() and not line_start else ""
    return lead + text + (" " if raw[-1].isspace() else "")


def _fence(code: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def outline_markdown(outline: str, base: str) -> str:
    """Markdown of resiliparse's minimal HTML: headings, paragraphs, preformatted text
    (fenced), line breaks, links (resolved against ``base``); list items come out of
    resiliparse as lines of text, and stay so."""
    out: list[str] = []

    def at_line_start() -> bool:
        return not out or out[-1].endswith("\n")

    pos, link, pre_start = 0, "", -1
    opened = -1  # where the open link's "[" is in out, or -1

    def drop_link() -> None:  # a link with no text, or one a block cuts: its text stays
        nonlocal opened
        if opened >= 0:
            out[opened] = ""
            opened = -1

    for m in _MD_TAG.finditer(outline):
        raw, pos = outline[pos:m.start()], m.end()
        closing, tag, href = m.group(1) == "/", m.group(2), m.group(3)
        if tag != "a" and opened >= 0 and tag != "br":
            drop_link()
        if pre_start >= 0:  # inside <pre>: its text as it is, up to its end
            if tag == "pre" and closing:
                code = unescape(outline[pre_start:m.start()]).strip("\n")
                fence = _fence(code)
                out.append(f"\n\n{fence}\n{code}\n{fence}\n\n")
                pre_start = -1
            continue
        out.append(_md_text(raw, at_line_start()))
        if tag == "pre" and not closing:
            pre_start = pos
        elif tag[0] == "h":
            out.append("\n\n" if closing else "\n\n" + "#" * int(tag[1]) + " ")
        elif tag in ("p", "ul", "ol"):
            out.append("\n\n")
        elif tag in ("br", "li"):
            out.append("\\\n" if tag == "br" else "\n")
        elif tag == "a" and not closing:
            drop_link()
            written = unescape(href or "").strip()  # "": an <a> with no href, too
            try:
                link = urljoin(base, written) if written else ""
            except ValueError:  # a bad href: its text stays, without a link
                link = ""
            opened = len(out)
            out.append("[")
        elif tag == "a" and opened >= 0:
            target = link.replace(" ", "%20").replace("(", "%28").replace(")", "%29")
            if target and "".join(out[opened + 1:]).strip():
                out.append(f"]({target})")
                opened = -1
            else:
                drop_link()
    if pre_start < 0:
        out.append(_md_text(outline[pos:], at_line_start()))
    drop_link()
    lines = "".join(out).split("\n")
    return re.sub(r"\n{3,}", "\n\n", "\n".join(ln.rstrip(" ") for ln in lines)).strip() + "\n"


def page_markdown(page: PageRecord) -> str | None:
    """The main content of a stored HTML page as Markdown; None for a page with no text
    body (a text body that is not HTML is its text, as one paragraph)."""
    body = _decoded(page)
    if body is None:
        return None
    decoded, html = body
    if not html:
        return _md_text(decoded, True) + "\n"
    tree = HTMLTree.parse(decoded)
    outline = extract_plain_text(tree, preserve_formatting="minimal_html", main_content=True,
                                 links=True, list_bullets=False, alt_texts=False)
    if not outline.strip():
        outline = extract_plain_text(tree, preserve_formatting="minimal_html", links=True,
                                     list_bullets=False, alt_texts=False)
    return outline_markdown(outline, page.final_url or page.url)


__all__ = ["DEFAULT_TEXT_LIMIT", "PageText", "detect_language", "outline_markdown",
           "page_markdown", "page_text", "read_html"]
