"""What an HTML page says about itself, read in one bounded pass: its visible text, title,
meta description, canonical URL, language, OpenGraph properties, JSON-LD blocks, and the
text of its links (what it says about the pages it links to: anchor text).

One lxml parser *target* (no tree is built) is fed the page in 64 KiB pieces, so memory
is the text kept plus the bounds below, whatever the page: a page of a million
``<meta>`` tags or of one 20 MiB ``<script type="application/ld+json">`` costs what the
bounds allow. The search index and the JSONL export read pages through here.

Bounds (a value past one is cut, a block past one dropped): the title and each
OpenGraph value at :data:`MAX_VALUE` characters, the description at
:data:`MAX_DESCRIPTION`, :data:`MAX_OPENGRAPH` OpenGraph properties (the first of each
name), :data:`MAX_JSONLD_BLOCKS` JSON-LD blocks of at most :data:`MAX_JSONLD_BYTES`
characters each (a longer one, or one that is not JSON, is skipped, not an error),
:data:`MAX_ANCHORS` links with text (``<a href>`` not rel=nofollow, the first
``<base href>`` kept to resolve them), each text cut at :data:`MAX_ANCHOR_TEXT`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

from lxml import etree

FEED_BYTES = 64 << 10  # lxml is fed in pieces (whole, libxml2 stops at 10 MB of text)
MAX_VALUE = 1_000
MAX_DESCRIPTION = 2_000
MAX_OPENGRAPH = 32
MAX_JSONLD_BLOCKS = 8
MAX_JSONLD_BYTES = 64 << 10
MAX_ANCHORS = 500
MAX_ANCHOR_TEXT = 200
# Elements whose text no reader sees; elements that end a run of words.
INVISIBLE = frozenset({"script", "style", "noscript", "template"})
BLOCKS = frozenset({"p", "div", "br", "li", "tr", "td", "th", "h1", "h2", "h3", "h4", "h5",
                    "h6", "title", "section", "article", "header", "footer", "nav", "table",
                    "ul", "ol", "dl", "dt", "dd", "pre", "blockquote", "form", "hr", "body"})
_JSONLD = "application/ld+json"


@dataclass(slots=True)
class PageMeta:
    """What :func:`read_html` found; "" (or empty) for what the page does not say."""

    text: str = ""  # the visible text, whitespace collapsed, at most the limit asked for
    title: str = ""
    description: str = ""
    canonical: str = ""  # absolute (resolved against the page's URL)
    lang: str = ""  # <html lang>, lowercase
    opengraph: dict[str, str] = field(default_factory=dict)  # og:title -> value
    jsonld: list[Any] = field(default_factory=list)  # each block's JSON value
    base: str = ""  # the first <base href>, as written
    anchors: list[tuple[str, str]] = field(default_factory=list)  # (href as written, text)


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


class _Target:
    """The parser target: collects the visible text and the head's statements."""

    def __init__(self, url: str, text_limit: int) -> None:
        self.url, self.limit = url, text_limit
        self.meta = PageMeta()
        self.size = self.hidden = 0
        self.parts: list[str] = []
        self.title: list[str] | None = None  # collecting the first <title>
        self.got_title = False
        self.jsonld: list[str] | None = None  # collecting a JSON-LD block
        self.jsonld_size = 0
        self.anchor: tuple[str, list[str]] | None = None  # the open <a>: href, text

    def start(self, tag: str, attrib: Any) -> None:
        if tag in INVISIBLE:
            self.hidden += 1
            if (tag == "script" and self.jsonld is None
                    and len(self.meta.jsonld) < MAX_JSONLD_BLOCKS
                    and attrib.get("type", "").strip().lower() == _JSONLD):
                self.jsonld, self.jsonld_size = [], 0
            return
        if tag in BLOCKS:
            self.parts.append(" ")
        if tag == "title" and not self.got_title:
            self.title = []
        elif tag == "meta":
            self._meta(attrib)
        elif tag == "link" and not self.meta.canonical:
            rel = attrib.get("rel", "").lower().split()
            href = attrib.get("href", "").strip()
            if "canonical" in rel and href:
                try:
                    self.meta.canonical = urljoin(self.url, href)[:MAX_VALUE * 2]
                except ValueError:  # a broken IPv6 literal and the like
                    pass
        elif tag == "html" and not self.meta.lang:
            self.meta.lang = attrib.get("lang", "").strip().lower()[:35]  # BCP 47's longest
        elif tag == "a":
            self._end_anchor()  # <a> does not nest: a new one ends the open one
            href = attrib.get("href")
            if (href is not None and len(self.meta.anchors) < MAX_ANCHORS
                    and "nofollow" not in attrib.get("rel", "").lower().split()):
                self.anchor = (href.strip()[:4096], [])
        elif tag == "base" and not self.meta.base:
            self.meta.base = attrib.get("href", "").strip()[:4096]

    def _meta(self, attrib: Any) -> None:
        content = attrib.get("content")
        if content is None:
            return
        name = attrib.get("name", "").strip().lower()
        prop = attrib.get("property", "").strip().lower() or name
        if name == "description" and not self.meta.description:
            self.meta.description = _one_line(content, MAX_DESCRIPTION)
        if (prop.startswith("og:") and prop not in self.meta.opengraph
                and len(self.meta.opengraph) < MAX_OPENGRAPH):
            self.meta.opengraph[prop[:64]] = _one_line(content, MAX_VALUE)

    def end(self, tag: str) -> None:
        if tag in INVISIBLE:
            self.hidden = max(0, self.hidden - 1)
            if tag == "script" and self.jsonld is not None:
                self._end_jsonld()
            return
        if tag in BLOCKS:
            self.parts.append(" ")
        if tag == "title" and self.title is not None:
            self.meta.title = _one_line("".join(self.title), MAX_VALUE)
            self.title, self.got_title = None, True
        elif tag == "a":
            self._end_anchor()

    def _end_anchor(self) -> None:
        if self.anchor is None:
            return
        href, parts = self.anchor
        self.anchor = None
        text = _one_line("".join(parts), MAX_ANCHOR_TEXT)
        if text and href:
            self.meta.anchors.append((href, text))

    def _end_jsonld(self) -> None:
        block, self.jsonld = self.jsonld, None
        if block is None or self.jsonld_size > MAX_JSONLD_BYTES:
            return
        try:
            self.meta.jsonld.append(json.loads("".join(block)))
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            pass

    def data(self, text: str) -> None:
        if self.jsonld is not None:
            self.jsonld_size += len(text)
            if self.jsonld_size <= MAX_JSONLD_BYTES:
                self.jsonld.append(text)
            return
        if self.title is not None and sum(map(len, self.title)) < MAX_VALUE * 4:
            self.title.append(text)
        if not self.hidden:
            if self.size < self.limit:
                self.parts.append(text)
                self.size += len(text)
            if self.anchor is not None and sum(map(len, self.anchor[1])) < MAX_ANCHOR_TEXT * 4:
                self.anchor[1].append(text)

    def close(self) -> PageMeta:
        self._end_anchor()
        if self.title is not None:  # a <title> the page never closed
            self.meta.title = _one_line("".join(self.title), MAX_VALUE)
        self.meta.text = " ".join("".join(self.parts).split())[: self.limit]
        return self.meta


def read_html(data: bytes, url: str = "", *, text_limit: int = 100_000) -> PageMeta:
    """What the HTML page ``data`` (UTF-8: decode it first, crawler.web.links.sniff_charset)
    says about itself; ``url`` resolves a relative canonical link. Never raises for what
    the page holds: libxml2 recovers from any markup, and what it gives up on is kept."""
    target = _Target(url, text_limit)
    parser = etree.HTMLParser(target=target, encoding="utf-8", recover=True, no_network=True,
                              remove_comments=True, remove_pis=True)
    try:
        for i in range(0, len(data), FEED_BYTES):
            parser.feed(data[i : i + FEED_BYTES])
        result = parser.close()
    except etree.LxmlError:  # recover=True rarely gives up; keep what was collected
        result = target.close()
    assert isinstance(result, PageMeta)
    return result
