"""Sitemap parsing (sitemaps.org): bytes + the sitemap's URL in, entries out (pure, no I/O).

Theory of operation: one pipeline of 64 KiB pieces, holding one piece of decompressed
data at a time, that stops at the first fatal problem.

1. *Bytes.* A body starting with the gzip magic ``1f 8b`` is gunzipped whatever its type
   or name: ``zlib.decompressobj`` takes 64 KiB of input and gives at most 64 KiB of
   output (``max_length``) per call, and stops one byte past ``max_bytes`` (a gzip bomb
   costs one piece of memory). Concatenated members are read in turn, as gunzip does;
   bytes after a member that start no member are ignored. A call that meets a corrupt
   byte returns nothing, so it is redone in smaller steps to keep the output before it.
2. *Sniffing.* After an optional UTF-8 BOM and ASCII blanks, ``<`` means XML (fed from
   that ``<``, so blanks before ``<?xml`` are forgiven), anything else a text sitemap.
3. *XML*: a ``lxml.etree.XMLPullParser`` per call, entities unresolved, no DTD, no
   network, libxml2's default limits (10 MB per text node, depth 256, entity
   amplification; a resource limit passed is "too_large", others "bad_xml"): XXE
   yields nothing, billion laughs stops.
   Names match by local name (any namespace, none, an undeclared prefix). The root
   decides the kind, else "not_sitemap" at once. An entry is a root child ``url``
   (urlset) or ``sitemap`` (index); its first child ``loc`` and ``lastmod`` count (not an
   ``image:loc`` deeper down); the other kind's entries are dropped. Each element below
   the root is cleared, with its earlier siblings, once its end is handled, so the tree
   holds the open path and little more. On a syntax error the events libxml2 made before
   it (in the same piece too) are handled; it makes none after it.
4. *Text*: lines end at CR or LF, decoded as UTF-8 with replacement; a stripped line
   that is an http(s) URL without blanks is an entry, other non-blank lines are dropped,
   one longer than 4 * max_url_length + 4 KiB bytes (stripped) without being held.
5. *Entries*: a stripped ``loc`` without a scheme is resolved against ``url`` with
   ``urljoin``, one with a scheme is kept as written; it must be http(s) with a host and
   at most ``max_url_length`` long. The first ``max_urls`` good entries are kept, later
   ones dropped (reading goes on to count them). ``lastmod``: stripped, at most 64 chars.

An entry counts only when its ``</url>`` (``</sitemap>``) is in the document: a
document that ends inside an entry is "bad_xml" and that entry is dropped, with any lxml
release (6.2 invents the missing end tags on close; those events are not read).
Input that ends early (truncated, too_large, bad_gzip) keeps the entries completed
before the end: a cut document is no "bad_xml" (nor is a syntax error in its last few
bytes, which libxml2 has not judged yet), a cut last text line is dropped.

==============  ==========================================================  ============
error           the first problem met in stream order ("" if all was read)  entries kept
==============  ==========================================================  ============
too_large       over max_bytes uncompressed, ``truncated=True``, or a       the prefix's
                libxml2 resource limit (a text node over 10 MB)
too_many_urls   over max_urls good entries                                  the first N
bad_gzip        gzip magic, then a corrupt or unfinished stream             the prefix's
bad_xml         a syntax error, or another libxml2 limit                    before it
not_sitemap     XML whose root is neither urlset nor sitemapindex           none
empty           no bytes, or only a BOM and blanks                          none
==============  ==========================================================  ============

Thread safety: pure; each call builds its own decompressor and parser.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from lxml import etree

from .links import RESOURCE_LIMIT

__all__ = ["MAX_SITEMAP_BYTES", "MAX_SITEMAP_URLS", "Sitemap", "SitemapEntry", "parse_sitemap"]

MAX_SITEMAP_URLS = 50_000
MAX_SITEMAP_BYTES = 50 * 1024 * 1024  # uncompressed

_CHUNK = 1 << 16
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_MAX_LASTMOD = 64
_ROOTS = {"urlset": ("urlset", "url"), "sitemapindex": ("index", "sitemap")}
_NEWLINE = re.compile(rb"[\r\n]")
_TEXT_URL = re.compile(r"https?://\S+\Z", re.I)  # cheap filter before urlsplit
# libxml2's namespace error codes (XML_NS_ERR_*): a prefix nobody declared, and the like.
_NAMESPACE_ERRORS = frozenset(
    getattr(etree.ErrorTypes, name) for name in dir(etree.ErrorTypes) if name.startswith("NS_ERR_")
)


@dataclass(frozen=True, slots=True)
class SitemapEntry:
    """One ``<url>`` or ``<sitemap>`` (or text line) of a sitemap."""

    url: str  # absolute http(s) URL as written (stripped; a relative loc resolved); not normalized
    lastmod: str = ""  # the <lastmod> text as written (stripped, at most 64 chars, else "")


@dataclass(frozen=True, slots=True)
class Sitemap:
    """What one sitemap file holds; see the module docstring for ``error``."""

    kind: str  # "urlset", "index", "text", or "" (nothing usable)
    urls: tuple[SitemapEntry, ...]  # page URLs (urlset / text), in file order
    sitemaps: tuple[SitemapEntry, ...]  # child sitemaps (index), in file order
    error: str  # "" if the whole file was read, else the first problem
    dropped: int  # entries seen but not returned (blank text lines not counted)
    size: int  # uncompressed bytes read


class _Unfinished(Exception):
    """The gzip input ended inside a member."""


def _gunzip(body: bytes, limit: int) -> Iterator[bytes]:
    """Decompressed pieces, at most ``limit`` + 1 bytes in all; raises zlib.error or
    _Unfinished. Input goes in 64 KiB slices: a big ``unconsumed_tail`` is copied per call."""
    pos, produced, tail, step = 0, 0, b"", _CHUNK
    inflater = zlib.decompressobj(wbits=31)  # gzip wrapper only, CRC checked
    while produced <= limit:
        if inflater.eof:
            pos -= len(inflater.unused_data)  # the member ended there
            if body[pos:pos + 2] != _GZIP_MAGIC:
                return  # trailing bytes that start no member are ignored, as gunzip does
            inflater, tail = zlib.decompressobj(wbits=31), b""
        if not tail and pos < len(body):
            tail = body[pos:pos + step]
            pos += len(tail)
        saved = inflater.copy() if step > 1 else None
        try:
            out = inflater.decompress(tail, min(_CHUNK, limit + 1 - produced))
        except zlib.error:
            if saved is None:
                raise
            # A failed call returns nothing: redo it in steps 64 times smaller (down to
            # one byte) to salvage the output before the break; it fails at the same byte.
            inflater, pos, tail, step = saved, pos - len(tail), b"", step // 64 or 1
            continue
        tail = inflater.unconsumed_tail
        if out:
            produced += len(out)
            yield out
        elif not tail and pos >= len(body) and not inflater.eof:
            raise _Unfinished


def _local(tag: Any) -> str:  # "{ns}url" and (undeclared prefix) "sm:url" -> "url"
    return tag.rpartition("}")[2].rpartition(":")[2] if isinstance(tag, str) else ""


class _Parse:
    """The state of one parse: sniffing, then an XML or a text reader, and the entries."""

    def __init__(self, base: str, max_urls: int, max_url_length: int) -> None:
        self.base, self.max_urls, self.max_len = base, max_urls, max_url_length
        self.max_line = 4 * max_url_length + 4096
        self.kind = self.error = self.want = ""
        self.mode = ""  # "" while sniffing, then "xml" or "text"
        self.entries: list[SitemapEntry] = []
        self.dropped = self.size = self.depth = 0
        self.done, self.at_start = False, True  # done: a fatal problem, read no further
        self.head = self.line = b""  # a possible BOM start (sniffing); the open text line
        self.skip = self.entry = False  # in an over-long text line; in a wanted entry
        self.parser: Any = None
        self.loc: str | None = None
        self.lastmod: str | None = None

    def fail(self, error: str) -> None:
        if not self.error:
            self.error = error

    def feed(self, data: bytes) -> None:
        if not self.mode:
            data = self._sniff(data, final=False)
        if not data:
            return
        if self.mode == "xml":
            self._feed_xml(data)
        else:
            self._feed_text(data)

    def finish(self, cut: bool) -> None:
        """End of input; ``cut`` if the input stopped before its end."""
        if not self.mode and self.head:
            self.feed(self._sniff(b"", final=True))
        if self.mode == "xml" and not self.done and not cut:
            try:
                self.parser.close()
            except etree.XMLSyntaxError as exc:
                # An undeclared prefix ("sm:url") is only a namespace error, told at the end.
                if any(e.type not in _NAMESPACE_ERRORS for e in exc.error_log):
                    self.fail("bad_xml")
                    self.done = True
            except etree.LxmlError:
                self.fail("bad_xml")
                self.done = True
            # A broken end: lxml 6.2 (libxml2 2.14.6) then makes "end" events for the
            # elements left open, which no byte of the document closed; lxml 6.0 makes
            # none. Every real end came from a feed (libxml2 parses an end tag once its
            # ">" has arrived), so the events of a failed close are dropped: an entry
            # counts only if its </url> or </sitemap> is in the document.
            if not self.done:
                self._events()
        elif self.mode == "text" and not self.skip and self.line.strip():
            if cut:
                self.dropped += 1  # a line cut short is no URL
            else:
                self._text_line(self.line)
        elif not self.mode:
            self.fail("empty")

    def result(self) -> Sitemap:
        found, index = tuple(self.entries), self.kind == "index"
        return Sitemap(self.kind, () if index else found, found if index else (), self.error,
                       self.dropped, self.size)

    def _sniff(self, data: bytes, final: bool) -> bytes:
        data, self.head = self.head + data, b""
        if self.at_start:
            if not final and len(data) < 3 and _BOM.startswith(data):
                self.head = data  # wait: a BOM may be split across pieces
                return b""
            self.at_start = False
            if data.startswith(_BOM):
                data = data[3:]
        data = data.lstrip()
        if data:
            self.mode = "xml" if data[:1] == b"<" else "text"
            if self.mode == "xml":
                # Not collect_ids=False: with lxml 6.1 / libxml2 2.14 it reads external DTDs.
                # The error log is the thread's: cleared, it holds this document's only.
                etree.clear_error_log()
                self.parser = etree.XMLPullParser(
                    events=("start", "end"), resolve_entities=False, no_network=True,
                    load_dtd=False, huge_tree=False, remove_comments=True, remove_pis=True)
            else:
                self.kind = "text"
        return data

    def _feed_xml(self, data: bytes) -> None:
        try:
            self.parser.feed(data)
        except etree.LxmlError as exc:
            self._events()  # the events before the error in this piece are still queued
            # libxml2's own size limits (a text node over 10 MB: whitespace padding, a
            # bomb) say the file is too large, not that it is broken.
            limit = getattr(exc, "code", None) == RESOURCE_LIMIT
            self.fail("too_large" if limit else "bad_xml")
            self.done = True
        else:
            self._events()

    def _events(self) -> None:
        for event, el in self.parser.read_events():
            if self.done:
                return
            if event == "start":
                self.depth += 1
                if self.depth == 1:
                    self.kind, self.want = _ROOTS.get(_local(el.tag), ("", ""))
                    if not self.kind:
                        self.fail("not_sitemap")
                        self.done = True
                elif self.depth == 2:
                    self.entry = _local(el.tag) == self.want
                    self.loc = self.lastmod = None
                continue
            level, self.depth = self.depth, self.depth - 1
            if level == 3 and self.entry:
                name = _local(el.tag)
                if name == "loc" and self.loc is None:
                    self.loc = el.text or ""
                elif name == "lastmod" and self.lastmod is None:
                    self.lastmod = (el.text or "").strip()
            elif level == 2:
                if self.entry:
                    lastmod = self.lastmod or ""
                    self._add(None if self.loc is None else self._resolve(self.loc),
                              lastmod if len(lastmod) <= _MAX_LASTMOD else "")
                elif _local(el.tag) in ("url", "sitemap"):
                    self.dropped += 1  # the other kind's entry
                self.entry = False
            if level >= 2:  # finished: free it and its earlier siblings (never open ones)
                el.clear(keep_tail=False)
                parent = el.getparent()
                while parent is not None and el.getprevious() is not None:
                    del parent[0]

    def _feed_text(self, data: bytes) -> None:
        lines = _NEWLINE.split(self.line + data)
        self.line = lines.pop()
        if self.skip and lines:
            lines.pop(0)  # the end of the over-long line
            self.skip = False
        elif self.skip:
            self.line = b""
        for line in lines:
            self._text_line(line)
        if len(self.line) > self.max_line:  # bound it: only the stripped line counts
            core = self.line.strip()
            if len(core) > self.max_line:
                self.dropped += 1
                self.line, self.skip = b"", True
            else:  # a blank run inside would make it no URL anyway: one space keeps that
                self.line = core + b" " if core and core != self.line.lstrip() else core

    def _text_line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").strip()
        if text:
            ok = len(text) <= self.max_len and _TEXT_URL.match(text) is not None
            self._add(self._resolve(text, relative=False) if ok else None, "")

    def _resolve(self, loc: str, relative: bool = True) -> str | None:
        loc = loc.strip()
        if not loc:
            return None  # urljoin would make the sitemap's own URL of it
        try:
            parts = urlsplit(loc)
            if relative and not parts.scheme:
                loc = urljoin(self.base, loc)
                parts = urlsplit(loc)
            good = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:  # e.g. an unclosed IPv6 bracket
            return None
        return loc if good and len(loc) <= self.max_len else None

    def _add(self, url: str | None, lastmod: str) -> None:
        if url is None:
            self.dropped += 1
        elif len(self.entries) >= self.max_urls:
            self.dropped += 1
            self.fail("too_many_urls")
        else:
            self.entries.append(SitemapEntry(url, lastmod))


def parse_sitemap(body: bytes, url: str, *, truncated: bool = False,
                  max_bytes: int = MAX_SITEMAP_BYTES, max_urls: int = MAX_SITEMAP_URLS,
                  max_url_length: int = 2048) -> Sitemap:
    """The entries of the sitemap ``body`` fetched from ``url`` (the base of relative locs).

    ``truncated``: the fetcher cut the body (then error "too_large" unless an earlier
    one). Never raises on any body; raises TypeError/ValueError on bad arguments only.
    Thread-safe.
    """
    if not isinstance(body, (bytes, bytearray, memoryview)) or not isinstance(url, str):
        raise TypeError("parse_sitemap(body: bytes, url: str)")
    if min(max_bytes, max_urls, max_url_length) < 0:
        raise ValueError("max_bytes, max_urls and max_url_length must be >= 0")
    data = bytes(body)
    state = _Parse(url, max_urls, max_url_length)
    end = min(len(data), max_bytes + 1)  # one byte past the limit tells "too_large"
    pieces = (_gunzip(data, max_bytes) if data[:2] == _GZIP_MAGIC
              else (data[i:min(i + _CHUNK, end)] for i in range(0, end, _CHUNK)))
    cut = truncated
    try:
        for piece in pieces:
            over = len(piece) > max_bytes - state.size
            piece = piece[:max_bytes - state.size] if over else piece
            state.size += len(piece)
            state.feed(piece)
            if over:
                state.fail("too_large")  # after the feed: an error inside the prefix is first
                cut = True
            if over or state.done:
                break
    except zlib.error:
        state.fail("bad_gzip")
        cut = True
    except _Unfinished:
        if not truncated:
            state.fail("bad_gzip")
        cut = True
    if truncated:
        state.fail("too_large")
    state.finish(cut)
    return state.result()
