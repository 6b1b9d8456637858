"""The JSON shape of a page record: what ``export --jsonl`` writes a line of, and
``pages --json`` prints.

One object per page record: the record's fields as stored (:func:`page_object`),
its link graph (the fetch's ``elapsed`` and, by :func:`link_items`, every stored
link, followed ones first, then nofollow ones) and its PageRank
(:func:`rank_fields`). docs/EXPORT.md lists every field.

Pure: records in, dicts out (the link graph's URLs come from a Resolver the
caller asked). No WARC here: ``pages`` and ``show`` use this module and must
not load warcio (crawler.read.warc).
"""

from __future__ import annotations

from typing import Any

from ..state.pages import KEY_SIZE, LINK_SIZE, NOFOLLOW, PageRecord
from .htmlbounds import DEFAULT_BOUNDS, ReadBounds
from .listing import DEFAULT_MAX_TEXT_CHARS, iso_time, page_meta
from .pagetext import page_text
from .rankstore import Rank
from .simhash import simhash

__all__ = ["link_items", "page_object", "rank_fields", "read_text_fields", "text_fields"]


def page_object(page: PageRecord, *, text: bool = False,
                text_limit: int = DEFAULT_MAX_TEXT_CHARS) -> dict[str, Any]:
    """One JSONL object: the record's fields as stored, the fetch time in ISO 8601 UTC.
    ``text``: also what the page says about itself (text_fields), read from its body."""
    obj: dict[str, Any] = {
        "url": page.url, "final_url": page.final_url, "status": page.status,
        "reason": page.reason, "content_type": page.content_type,
        "fetched_at": iso_time(page.fetched_at), "ip": page.ip, "depth": page.depth,
        "outlinks": page.outlinks, "truncated": page.truncated, "noindex": page.noindex,
        "redirect": page.redirect, "size": len(page.body),
        "render": page.render, "dom_size": len(page.dom), "revisit": page.revisit,
    }
    if text:
        obj.update(text_fields(page, text_limit))
    return obj


def text_fields(page: PageRecord, limit: int = DEFAULT_MAX_TEXT_CHARS) -> dict[str, Any]:
    """The JSONL fields read from a page's body in one parse (crawler.web.pagemeta): its
    visible ``text`` (at most ``limit`` characters), its ``main_text`` (crawler.read.pagetext:
    boilerplate removed, as the search index reads it), ``title``, ``description``,
    ``canonical``, ``lang``, ``opengraph`` and ``jsonld`` (structured data, when the page
    has them), and ``simhash`` (64 bits as 16 hex digits: JSON numbers stop at 2**53).
    All null for a page with no text body."""
    return read_text_fields(page, limit)[0]


def read_text_fields(page: PageRecord, limit: int = DEFAULT_MAX_TEXT_CHARS,
                     bounds: ReadBounds = DEFAULT_BOUNDS) -> tuple[dict[str, Any], str]:
    """(:func:`text_fields`, why its ``main_text`` is the page's plain text: "" when it
    is the main content), the main content read within ``bounds``
    (crawler.read.htmlbounds)."""
    meta = page_meta(page, limit=limit)
    if meta is None:
        return dict.fromkeys(("text", "main_text", "title", "description", "canonical",
                              "lang", "opengraph", "jsonld", "simhash")), ""
    main = page_text(page, text_limit=limit, bounds=bounds)
    return ({"text": meta.text, "main_text": main.text if main is not None else meta.text,
             "title": meta.title, "description": meta.description,
             "canonical": meta.canonical, "lang": meta.lang, "opengraph": meta.opengraph,
             "jsonld": meta.jsonld, "simhash": f"{simhash(meta.text):016x}"},
            main.plain if main is not None else "")


def link_items(links: bytes, urls: list[str | None] | None) -> list[dict[str, object]]:
    """The JSONL ``links`` of a record's packed links (``PageRecord.links``): every stored
    link in order, as ``{"url": ..., "nofollow": ...}``, or ``{"key": HEX, ...}`` for a
    URL the crawl never recorded. ``urls``: the links' URLs in order, as a Resolver gave
    them; None gives keys only."""
    n = len(links) // LINK_SIZE
    flags = links[n * KEY_SIZE : n * LINK_SIZE]
    out = []
    for i in range(n):
        url = urls[i] if urls is not None else None
        item: dict[str, object] = ({"url": url} if url is not None
                                   else {"key": links[i * KEY_SIZE : (i + 1) * KEY_SIZE].hex()})
        item["nofollow"] = bool(flags[i] & NOFOLLOW)
        out.append(item)
    return out


def rank_fields(rank: Rank | None) -> dict[str, Any]:
    """The JSONL fields of a page's PageRank (None when the crawl has no rank for it)."""
    if rank is None:
        return {"rank": None, "rank_scaled": None}
    return {"rank": rank.raw, "rank_scaled": round(rank.scaled, 4)}
