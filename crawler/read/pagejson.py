"""The JSON shape of a page record: what ``export --jsonl`` writes a line of, and
``pages --json`` prints.

One object per page record: the record's fields as stored (:func:`page_object`),
its link graph (:func:`graph_fields`: the fetch's ``elapsed`` and every stored
link, followed ones first, then nofollow ones) and its PageRank
(:func:`rank_fields`). docs/EXPORT.md lists every field.

Pure: records in, dicts out (the link graph's URLs come from a Resolver the
caller opened). No WARC here: ``pages`` and ``show`` use this module and must
not load warcio (crawler.read.warc).
"""

from __future__ import annotations

from typing import Any

from ..state.pages import NOFOLLOW, PageRecord
from .linkgraph import Resolver
from .listing import DEFAULT_MAX_TEXT_CHARS, iso_time, page_meta
from .pagetext import page_text
from .rankstore import Rank
from .simhash import simhash

__all__ = ["graph_fields", "page_object", "rank_fields", "text_fields"]


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
    meta = page_meta(page, limit=limit)
    if meta is None:
        return dict.fromkeys(("text", "main_text", "title", "description", "canonical",
                              "lang", "opengraph", "jsonld", "simhash"))
    main = page_text(page, text_limit=limit)
    return {"text": meta.text, "main_text": main.text if main is not None else meta.text,
            "title": meta.title, "description": meta.description,
            "canonical": meta.canonical, "lang": meta.lang, "opengraph": meta.opengraph,
            "jsonld": meta.jsonld, "simhash": f"{simhash(meta.text):016x}"}


def graph_fields(page: PageRecord, resolver: Resolver | None) -> dict[str, Any]:
    """The JSONL fields of the link graph: the fetch time and every stored link, as
    ``{"url": ..., "nofollow": ...}`` (``{"key": HEX, ...}`` for a URL the crawl never
    recorded; keys only when there is no resolver)."""
    if resolver is not None:
        links = resolver.links(page)
    else:
        links = [{"key": k.hex(), "nofollow": bool(f & NOFOLLOW)} for k, f in page.link_list()]
    return {"elapsed": page.elapsed, "links": links}


def rank_fields(rank: Rank | None) -> dict[str, Any]:
    """The JSONL fields of a page's PageRank (None when the crawl has no rank for it)."""
    if rank is None:
        return {"rank": None, "rank_scaled": None}
    return {"rank": rank.raw, "rank_scaled": round(rank.scaled, 4)}
