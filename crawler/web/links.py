"""Link extraction from HTML with lxml: bytes + page URL in, normalized URLs out (pure, no I/O).

Theory of operation.

1. *Is it HTML at all?* :func:`is_html` trusts the Content-Type: only
   ``text/html`` and ``application/xhtml+xml`` are parsed. HTML served as
   ``text/plain`` (or anything else) is not parsed, as browsers do not render
   it either; a PNG labelled ``text/html`` is parsed and yields nothing.
   Only a missing or malformed type is sniffed (WHATWG MIME sniffing's HTML
   patterns).
2. *Charset* (:func:`sniff_charset`): a byte-order mark, else the header's
   ``charset=``, else a ``<meta charset>`` / ``http-equiv`` declaration in
   the first ``DEFAULT_PRESCAN_BYTES``, else UTF-8. Labels are mapped the
   WHATWG way (``iso-8859-1`` and ``ascii`` decode as windows-1252,
   ``shift_jis`` as cp932, ``gb2312`` as gb18030...; a meta claiming UTF-16
   means UTF-8). Python decodes with replacement characters and NULs become
   U+FFFD, so lxml always gets valid UTF-8 and never stops on an encoding
   error; bad bytes never raise. A page over 1 MiB is decoded in 64 KiB
   pieces (an incremental decoder, crawler.web._decode), each re-encoded to
   UTF-8 and fed on, so no whole copy of it is made as text; see *Memory*.
3. *Parsing*: lxml's HTML parser (libxml2) with ``recover=True``,
   ``no_network=True``, ``huge_tree=False``, no comments or PIs. Two ways,
   one answer. A tree loses every link after ``</html>`` (pages where a CMS
   or a server appends markup after the end tag, which browsers put in the
   body) and everything after 256 levels of nesting (unclosed ``<font>`` or
   ``<div>`` reach that on real pages), and a tree of a 10 MB page costs ~35
   bytes of RAM per byte. So the *streaming* parser drives a parser
   *target* that keeps only the few start tags we want: it sees both cases,
   holds memory in proportion to the links, and nothing recurses (100,000
   nested ``<div>`` are fine on a 256 KiB thread stack); the body is fed in
   64 KiB pieces (handed over whole, libxml2 gives up at the 10 MB mark of a
   long text run). But it makes a Python call per start tag under the GIL.
   The *fast path* parses pages up to ``_TREE_MAX_BYTES`` into a tree (libxml2
   runs without the GIL) and lets C code find the wanted tags; it is used
   only when it cannot differ: no wanted tag after ``</html>`` and no fatal
   parser error (the depth limit is one). Otherwise the streaming parser
   decides. A test checks that both agree on hostile and mangled pages.
4. *Links*: ``<a href>``, ``<area href>``, ``<frame src>`` and
   ``<iframe src>`` (frames hold HTML pages whose links a frameset site
   needs; iframes are pages too, and out-of-scope embeds are dropped by the
   scope check later). ``<link>`` is not followed: stylesheets, icons and
   feeds are not pages. The first ``<base href>`` is the base (resolved
   against the page URL; an unparsable one is ignored as WHATWG says; a
   non-http(s) one leaves relative links unresolvable). Anchors with
   ``rel="nofollow"`` are skipped unless ``follow_rel_nofollow`` (the same
   courtesy as meta robots nofollow; the engine can turn it on when it does
   not obey robots); they come back apart, in ``nofollow_links``, for the
   link graph. Every href goes through
   :func:`crawler.web.urls.normalize`; rejects (other schemes, bad hosts, too
   long) are counted, duplicates dropped, order kept, at most ``max_links``
   links.
5. *Meta robots*: ``<meta name="robots">`` (and any other name in
   ``robots_meta_names``, e.g. the crawler's own product token) with
   ``nofollow``/``noindex``/``none``. The links are returned even on a
   nofollow page: obeying it, and what ``noindex`` means for storage, is the
   caller's decision. The X-Robots-Tag header is the caller's too
   (:func:`robots_directives` parses its value).
6. *Memory*: what a parse holds besides the body. libxml2's push parser keeps
   every byte fed to it until the parse ends (2.14 never shrinks its input),
   so a streamed page costs its size in UTF-8: about the body for UTF-8 and
   ASCII pages, up to 3x for single-byte charsets whose letters take 3 UTF-8
   bytes (Thai, cp1252's euro sign). NULs and invalid bytes would cost 3x
   too (U+FFFD is 3 bytes), so a run of U+FFFD longer than any href
   :func:`normalize` accepts (``4 * max_url_length``, at least 4096) is fed
   cut to that length: a body of NULs or 0xff costs next to nothing. That
   changes no link: an href holding such a run is refused as too long either
   way, and names and directives compare equal or not either way. (Only
   pathological pages can tell: the ``base`` reported when ``<base href>``
   holds such a run, an attribute value past libxml2's 10 MB limit no longer
   stopping the parse, and hrefs that differ only in the length of such a
   run counting once.) A tree costs ~120 bytes per tag, so the fast path is
   taken only when ``len(data) + _NODE_BYTES * data.count(b"<")`` is at most
   ``_TREE_MAX_COST``. ``reserve``, if given, is called with each amount
   before the parse holds it (the pieces, the tree's estimate): a caller
   with a memory budget may make the thread wait there
   (crawler.run.budget). Not bounded here: libxml2 keeps a stack entry per
   open element (a page of unclosed ``<div>`` costs ~2.6x), and lxml keeps
   one dictionary of tag and attribute names per thread, for good.
   Measured by tools/measure_parse_memory.py (docs/HOSTILE.md, "Memory").

Thread safety: a streaming parse builds its own parser; a tree parse borrows an idle
parser from a free list (one parse per parser at a time).
"""

from __future__ import annotations

import codecs
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lxml import etree

from ..exceptions import URLError
from ._decode import MIN_RUN, Reserve, to_utf8, utf8_pieces
from .urls import _INPUT_SLACK, DEFAULT_MAX_URL_LENGTH, normalize

__all__ = [
    "DEFAULT_MAX_LINKS",
    "DEFAULT_PRESCAN_BYTES",
    "DEFAULT_ROBOTS_META_NAMES",
    "HTML_TYPES",
    "PageLinks",
    "Reserve",
    "extract",
    "is_html",
    "parse_bound",
    "robots_directives",
    "sniff_charset",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_LINKS = 10_000
DEFAULT_PRESCAN_BYTES = 4096  # WHATWG scans 1,024; a little more finds late metas
DEFAULT_ROBOTS_META_NAMES = ("robots",)
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})

_RAW_FACTOR = 4  # distinct raw tags kept per allowed link: bounds memory on stuffed pages
# Fed in pieces: libxml2 reading one whole buffer stops ("Buffer size limit
# exceeded") once a single text run or element passes 10 MB without huge_tree.
_CHUNK = 1 << 16
_TAGS = ("a", "area", "base", "meta", "frame", "iframe")
_UNLIMITED = 1 << 40
# Pages up to this size are parsed into a tree first (the GIL is released while
# libxml2 parses; ~2x less CPU than the target). Larger ones always stream.
_TREE_MAX_BYTES = 1 << 20
# A tree costs about this much per tag (libxml2's nodes, attributes, text nodes;
# measured ~125 on a page of <br>s); a page whose estimate passes _TREE_MAX_COST
# streams instead (a 1 MiB page of bare tags would cost ~33 MB as a tree).
_NODE_BYTES = 128
_TREE_MAX_COST = 8 << 20
# A small body decoded whole holds its text (up to 4 bytes a character, one copy
# replaced) and then its UTF-8 (3): reserved as this many times the body.
_SMALL_DECODE = 8
# A wanted tag after </html>: a tree drops it, the target parser keeps it.
_AFTER_END = re.compile(rb"</html.*<(?:a|area|base|meta|frame|iframe)[\s/>]", re.I | re.S)
# Idle tree parsers (a parser serves one parse at a time; list pop/append are atomic).
_TREE_PARSERS: list[etree.HTMLParser] = []

# WHATWG Encoding Standard: labels that browsers decode with a superset codec.
_SUPERSETS = {
    "ascii": "cp1252", "latin-1": "cp1252", "iso8859-1": "cp1252",
    "iso8859-9": "cp1254", "tis-620": "cp874", "iso8859-11": "cp874",
    "gb2312": "gb18030", "gbk": "gb18030", "shift_jis": "cp932",
    "euc_kr": "cp949", "big5": "big5hkscs",
}
# Python text codecs that are no web charset (UTF-7 is banned by WHATWG: an XSS vector).
_NOT_WEB = frozenset({"utf-7", "unicode-escape", "raw-unicode-escape", "punycode", "idna",
                      "undefined", "charmap"})
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
         (codecs.BOM_UTF16_BE, "utf-16-be"))
_CT_CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([^\s;"',]+)""", re.I)
_COMMENT = re.compile(rb"<!--.*?(?:-->|\Z)", re.S)
_META_CHARSET = re.compile(rb"""<meta[\s/][^>]{0,512}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:+-]+)""",
                           re.I)
# WHATWG MIME sniffing: HTML signatures, each followed by a space or '>'.
_SNIFF = re.compile(
    rb"(?:<!doctype html|<html|<head|<script|<iframe|<h1|<div|<font|<table|<a|<style"
    rb"|<title|<b|<body|<br|<p)[ \t\n\r>]|<!--", re.I)

# libxml2's XML_ERR_RESOURCE_LIMIT (a size limit of the parser was passed). lxml names
# it only from 6.1 (6.0 with the same libxml2 2.14 reports the code unnamed).
RESOURCE_LIMIT = getattr(etree.ErrorTypes, "ERR_RESOURCE_LIMIT", 114)


@dataclass(frozen=True, slots=True)
class PageLinks:
    """What one HTML page links to."""

    links: tuple[str, ...]  # normalized absolute http(s) URLs, unique, document order
    nofollow: bool  # meta robots nofollow/none (the links are still listed)
    noindex: bool  # meta robots noindex/none
    base: str  # the effective base URL ("" when <base> named a non-http(s) URL)
    charset: str  # the Python codec the body was decoded with
    rejected: int  # hrefs dropped by rule (scheme, invalid, too long, rel=nofollow)
    truncated: bool = False  # more than max_links links (or 4x as many distinct raw hrefs)
    # rel=nofollow anchors skipped above (normalized, unique, not in ``links``), at most
    # max_links: the link graph keeps them, flagged, though they are not followed.
    nofollow_links: tuple[str, ...] = ()


def is_html(content_type: str | None, body_head: bytes = b"") -> bool:
    """Whether a response is parsed for links: by its type; sniffed only when the type is missing.

    ``body_head`` is the first bytes of the body (512 are plenty). Thread-safe.
    """
    if content_type:
        essence = content_type.partition(";")[0].strip().lower()
        if "/" in essence:
            return essence in HTML_TYPES
    head = body_head[:512]
    if head.startswith(codecs.BOM_UTF8):
        head = head[3:]
    return _SNIFF.match(head.lstrip(b" \t\n\r\f")) is not None


def sniff_charset(content_type: str | None, body: bytes, *,
                  prescan: int = DEFAULT_PRESCAN_BYTES) -> str:
    """The codec to decode ``body`` with: BOM, header, meta, else ``utf-8``. Thread-safe."""
    for bom, bom_codec in _BOMS:
        if body.startswith(bom):
            return bom_codec
    if content_type:
        param = _CT_CHARSET.search(content_type)
        if param is not None:
            name = _codec(param.group(1))
            if name is not None:
                return name
    head = body[:prescan]
    if b"<!--" in head:
        head = _COMMENT.sub(b"", head)
    for meta in _META_CHARSET.finditer(head):
        name = _codec(meta.group(1).decode("ascii"))
        if name is not None:
            return "utf-8" if name.startswith("utf-16") else name  # WHATWG: ASCII bytes here
    return "utf-8"


def _codec(label: str) -> str | None:
    try:
        name = codecs.lookup(label.strip()).name
        b"\0\0\0\0".decode(name, "replace")  # rejects non-text codecs such as base64
    except (LookupError, ValueError):
        return None
    if name in _NOT_WEB:
        return None
    return _SUPERSETS.get(name, name)


_ROBOTS_NAMED = frozenset({"unavailable_after", "max-snippet", "max-image-preview",
                           "max-video-preview"})


def robots_directives(value: str, names: Iterable[str] = ()) -> tuple[bool, bool]:
    """(nofollow, noindex) from a meta robots ``content`` or an X-Robots-Tag value.

    A directive list may be prefixed ``agent:`` (X-Robots-Tag); it then counts
    only when the agent is in ``names`` (compared lowercase). Thread-safe.
    """
    wanted = {n.lower() for n in names}
    agent: str | None = None
    nofollow = noindex = False
    for raw in value.split(","):
        token = raw.strip().lower()
        key, colon, rest = token.partition(":")
        if colon and key.strip() not in _ROBOTS_NAMED:
            agent, token = key.strip(), rest.strip()
        if agent is not None and agent not in wanted:
            continue
        if token in ("nofollow", "none"):
            nofollow = True
        if token in ("noindex", "none"):
            noindex = True
    return nofollow, noindex


def extract(
    body: bytes,
    url: str,
    *,
    content_type: str | None = None,
    max_links: int = DEFAULT_MAX_LINKS,
    max_url_length: int = DEFAULT_MAX_URL_LENGTH,
    follow_rel_nofollow: bool = False,
    robots_meta_names: Iterable[str] = DEFAULT_ROBOTS_META_NAMES,
    reserve: Reserve | None = None,
) -> PageLinks:
    """The links of the HTML page ``body`` fetched from ``url``.

    ``url`` is the page's (final) URL; an invalid one raises URLError. Any
    body gives a result, possibly empty. ``reserve(n)`` is called before the
    parse holds ``n`` more bytes (module doc, *Memory*); it may block.
    Thread-safe (a parser per call).
    """
    page = normalize(url, max_length=_UNLIMITED)
    charset = sniff_charset(content_type, body)
    cap = max(max_links * _RAW_FACTOR, 64)
    # U+FFFD runs are cut past any href normalize() accepts (it refuses raw input longer
    # than that at once): no link changes (module doc, Memory)
    run = max(_INPUT_SLACK * max_url_length + 1, MIN_RUN)
    reserve = reserve or _no_reserve
    if len(body) <= _TREE_MAX_BYTES:  # small: whole, so the tree may be tried
        reserve(_SMALL_DECODE * len(body))  # its text and UTF-8 copies, for a moment
        data = to_utf8(body, charset, run)
        items, truncated, complete = _scan(data, cap, reserve)
    else:
        items, truncated, complete = _scan_target(utf8_pieces(body, charset, run, reserve), cap)
    if not complete:
        log.debug("%s: parse stopped at a libxml2 resource limit; later links are lost", page)
    return _collect(items, page, charset, max_links=max_links,
                    max_url_length=max_url_length, follow_rel_nofollow=follow_rel_nofollow,
                    meta_names={n.lower() for n in robots_meta_names}, truncated=truncated)


def parse_bound(size: int) -> int:
    """The most :func:`extract` asks ``reserve`` for in all, for a body of ``size``
    bytes: UTF-8 is at most 3 bytes a body byte; a small body is decoded whole
    (``_SMALL_DECODE``) and tried as a tree (``_TREE_MAX_COST``) before it may
    stream (3x more)."""
    if size > _TREE_MAX_BYTES:
        return 3 * size
    return (_SMALL_DECODE + 3) * size + _TREE_MAX_COST


def _no_reserve(n: int) -> None:
    return None


# An item is (tag, first, second): base -> href; meta -> name, content;
# a/area -> href, rel; frame/iframe -> src.
Item = tuple[str, str | None, str | None]


def _item(tag: str, get: Any) -> Item:
    if tag == "meta":
        return tag, get("name"), get("content")
    if tag in ("frame", "iframe"):
        return tag, get("src"), None
    return tag, get("href"), get("rel")


class _Collector:
    """Parser target: keeps the distinct wanted start tags, in order, at most ``cap``; no tree."""

    __slots__ = ("items", "cap", "overflow")

    def __init__(self, cap: int) -> None:
        self.items: dict[Item, None] = {}
        self.cap = cap
        self.overflow = False

    def start(self, tag: str, attrib: Any) -> None:
        if tag in _TAGS:
            item = _item(tag, attrib.get)
            if len(self.items) < self.cap:
                self.items[item] = None
            elif item not in self.items:
                self.overflow = True

    def close(self) -> None:
        return None


def _scan(data: bytes, cap: int,
          reserve: Reserve = _no_reserve) -> tuple[list[Item], bool, bool]:
    """(distinct wanted start tags in document order, over ``cap``, read to the end)."""
    if len(data) <= _TREE_MAX_BYTES:
        cost = len(data) + _NODE_BYTES * data.count(b"<")
        if cost <= _TREE_MAX_COST:
            reserve(cost)
            found = _scan_tree(data, cap)
            if found is not None:
                return found
    reserve(len(data))  # libxml2's copy of what it is fed
    return _scan_target(data, cap)


def _scan_tree(data: bytes, cap: int) -> tuple[list[Item], bool, bool] | None:
    """The fast path: libxml2 builds a small tree without the GIL and C code finds the
    wanted tags. None when the tree may have lost links (nesting past libxml2's depth
    limit, any error, or a wanted tag after ``</html>``): the target parser then decides."""
    if _AFTER_END.search(data) is not None:
        return None
    try:
        parser = _TREE_PARSERS.pop()
    except IndexError:
        parser = etree.HTMLParser(encoding="utf-8", recover=True, no_network=True,
                                  huge_tree=False, remove_comments=True, remove_pis=True,
                                  collect_ids=False)
    try:
        root = etree.fromstring(data, parser)
        if parser.error_log.filter_from_level(etree.ErrorLevels.FATAL):
            return None
        items: dict[Item, None] = {}
        overflow = False
        if root is not None:
            for el in root.iter(_TAGS):
                item = _item(el.tag, el.get)
                if len(items) < cap:
                    items[item] = None
                elif item not in items:
                    overflow = True
        return list(items), overflow, True
    except (etree.LxmlError, ValueError):
        return None
    finally:
        _TREE_PARSERS.append(parser)


def _scan_target(data: bytes | Iterable[bytes], cap: int) -> tuple[list[Item], bool, bool]:
    """The streaming parser over ``data``: a whole UTF-8 page, or its pieces."""
    collector = _Collector(cap)
    parser = etree.HTMLParser(encoding="utf-8", recover=True, no_network=True, huge_tree=False,
                              remove_comments=True, remove_pis=True, collect_ids=False,
                              target=collector)
    if isinstance(data, bytes):
        whole = data
        data = (whole[i:i + _CHUNK] for i in range(0, len(whole), _CHUNK))
    try:
        for piece in data:
            parser.feed(piece)
        parser.close()
    except (etree.LxmlError, ValueError):
        pass  # "no element found" on an empty body; recover=True covers the rest
    err = parser.error_log.last_error
    complete = err is None or err.type != RESOURCE_LIMIT
    return list(collector.items), collector.overflow, complete


def _collect(items: list[Item], page: str, charset: str, *, max_links: int, max_url_length: int,
             follow_rel_nofollow: bool, meta_names: set[str], truncated: bool) -> PageLinks:
    base: str | None = page
    base_href = next((first for tag, first, _ in items if tag == "base" and first is not None),
                     None)
    if base_href is not None:
        try:
            base = normalize(base_href, page, max_length=_UNLIMITED)
        except URLError as exc:
            base = None if exc.reason == "scheme" else page
    nofollow = noindex = False
    seen: dict[str, None] = {}
    skipped: dict[str, None] = {}  # rel=nofollow
    rejected = 0
    full = False
    for tag, first, second in items:
        if tag == "meta":
            if first is not None and second is not None and first.strip().lower() in meta_names:
                nf, ni = robots_directives(second)
                nofollow, noindex = nofollow or nf, noindex or ni
            continue
        if tag == "base" or first is None or full:
            continue
        rel_nofollow = (second is not None and not follow_rel_nofollow
                        and "nofollow" in second.lower().split())
        try:
            link = normalize(first, base, max_length=max_url_length)
        except URLError:
            rejected += 1
            continue
        if rel_nofollow:
            rejected += 1
            if len(skipped) < max_links:
                skipped[link] = None
            continue
        if link not in seen:
            if len(seen) >= max_links:
                truncated = full = True  # later hrefs are not even normalized; metas still count
                continue
            seen[link] = None
    return PageLinks(links=tuple(seen), nofollow=nofollow, noindex=noindex, base=base or "",
                     charset=charset, rejected=rejected, truncated=truncated,
                     nofollow_links=tuple(u for u in skipped if u not in seen))
