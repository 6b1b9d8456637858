"""The anchor text of a crawl's pages: what the pages that link to a page say it is about,
gathered from the whole crawl in bounded memory (the search index's anchor field).

One pass reads every stored HTML page (crawler.web.pagemeta: its ``<a href>`` links with
their text, not rel=nofollow), resolves each href the way a browser does (against the
first ``<base href>``, else the URL that answered), normalizes it as the crawler does
(crawler.web.urls.normalize) and writes ``target key, text`` as a line to a
:class:`~crawler.read._linesort.LineSorter`, which spills sorted runs to ``workdir``
past its buffer. The merged lines come out grouped by target, so each page's anchor
text is gathered with one group in memory at a time: its distinct texts (a site's
"Home" link on every page counts once), in sorted order, at most
:data:`MAX_ANCHOR_BYTES` of UTF-8. A page's links to itself are left out.

Memory: the sorter's buffer (``buffer_bytes``) and one group; disk: the runs, about
the crawl's anchor texts once. Time: one parse of each HTML body (~1-3 ms a page).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from urllib.parse import urljoin

from ..exceptions import URLError
from ..state.pages import PageRecord
from ..web.urls import normalize, url_key
from ._linesort import DEFAULT_BUFFER, LineSorter
from .listing import page_meta

log = logging.getLogger(__name__)

MAX_ANCHOR_BYTES = 2048  # anchor text kept a page (UTF-8)
SEPARATOR = " | "  # between the distinct texts of a page's anchors


def anchor_lines(page: PageRecord) -> Iterator[bytes]:
    """``hex key \\t text \\n`` for each link of ``page`` with text, to another page."""
    if page.status != 200 or not page.body:
        return
    meta = page_meta(page, limit=0)  # the links and the head only: no text kept
    if meta is None or not meta.anchors:
        return
    base = page.final_url or page.url
    if meta.base:
        try:
            base = urljoin(base, meta.base)
        except ValueError:  # an unparsable <base>: ignored, as WHATWG says
            pass
    own = url_key(page.url)
    for href, text in meta.anchors:
        try:
            key = url_key(normalize(href, base))
        except URLError:
            continue  # another scheme, a bad host, too long: not a page of a crawl
        if key != own:
            clean = " ".join(text.split())  # no tab or newline: they frame the line
            yield key.hex().encode("ascii") + b"\t" + clean.encode("utf-8") + b"\n"


def anchor_texts(pages: Iterator[PageRecord], workdir: str, *,
                 buffer_bytes: int = DEFAULT_BUFFER) -> Iterator[tuple[bytes, str]]:
    """(url key, anchor text) of every page some other page links to with text, in key
    order (see the module docstring). ``workdir`` holds the sorted runs; the caller
    owns and removes it."""
    sorter = LineSorter(workdir, buffer_bytes=buffer_bytes)
    for page in pages:
        for line in anchor_lines(page):
            sorter.add(line)
    log.info("anchors: %s links with text gathered", f"{sorter.lines:,}")
    key = b""
    texts: list[bytes] = []
    size = 0
    for line in sorter.sorted():
        hex_key, _, text = line.rstrip(b"\n").partition(b"\t")
        if hex_key != key:
            if texts:
                yield bytes.fromhex(key.decode("ascii")), SEPARATOR.join(
                    t.decode("utf-8") for t in texts)
            key, texts, size = hex_key, [], 0
        if (not texts or text != texts[-1]) and size + len(text) <= MAX_ANCHOR_BYTES:
            texts.append(text)  # sorted: a repeat of a text follows it
            size += len(text) + len(SEPARATOR)
    if texts:
        yield bytes.fromhex(key.decode("ascii")), SEPARATOR.join(t.decode("utf-8") for t in texts)
