"""What a site owner looks for first, read from the crawl's search index: pages with no
title or description, titles and descriptions shared by several pages, canonical links
to a redirect or an error, and groups of near-duplicate pages (by SimHash).

The report (``python -m crawler report`` and ``serve``) shows these when the crawl has
a search index (``python -m crawler index``): the index already holds each page's title,
description, canonical target and SimHash, so nothing is parsed again.

Passes and memory: one pass over every document's stored fields, keeping per page
8-byte hashes of its title and description, its SimHash and its place in the index
(numpy arrays, ~40 bytes a page), plus the canonical targets that differ from the page
itself (a string each); each canonical target is then looked up in MainDB (in memory,
then one record read). Groups are counted with numpy; only the ``limit`` largest groups
get their URLs read back.

Near-duplicates: pages whose SimHashes are 3 bits or fewer apart. Equal hashes group at
once; for the rest, the 64 bits are cut into 4 bands of 16 bits (two hashes 3 bits apart
agree on at least one band), and hashes that share a band are compared; a band value
held by more than :data:`MAX_BUCKET` distinct hashes is not searched (said in
``bucket_skipped``). Groups are joined transitively (union-find).

Thread safety: one computation per thread; it opens its own readers.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from typing import Any

import numpy as np
import tantivy

from ..exceptions import CrawlerError, URLError
from ..read.listing import CrawlReader
from ..read.simhash import near
from ..state.shards import crawl_count, shard_dir
from ..web.urls import normalize
from . import schema

log = logging.getLogger(__name__)

MAX_BUCKET = 200
BANDS = 4


def _normal(url: str) -> str:
    try:
        return normalize(url)
    except URLError:
        return url


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(),
                          "little") >> 1


class _Docs:
    """Every document of every shard's index: per page the fields the checks need."""

    def __init__(self, data_dir: str) -> None:
        count = crawl_count(data_dir)
        self.searchers: list[Any] = []
        title, desc, sim, where = [], [], [], []
        self.canonical: list[tuple[int, str]] = []  # (page number, target) when not itself
        n = 0
        for i in range(count):
            index = schema.open_index(schema.search_dir(shard_dir(data_dir, i, count)),
                                      create=False)
            if index is None:
                continue
            searcher = index.searcher()
            self.searchers.append(searcher)
            total = searcher.num_docs
            if total == 0:
                continue
            for _, address in searcher.search(tantivy.Query.all_query(), limit=total).hits:
                doc = searcher.doc(address)
                url = str(doc.get_first("url"))
                t = str(doc.get_first("title") or "").strip()
                d = str(doc.get_first("description") or "").strip()
                title.append(_h(t) if t else 0)
                desc.append(_h(d) if d else 0)
                sim.append(int(doc.get_first("simhash") or 0))
                where.append((len(self.searchers) - 1, address))
                c = str(doc.get_first("canonical") or "")
                if c and _normal(c) != url:
                    self.canonical.append((n, c))
                n += 1
        self.title = np.array(title, dtype=np.int64)
        self.desc = np.array(desc, dtype=np.int64)
        self.sim = np.array(sim, dtype=np.uint64)
        self.where = where
        self.n = n

    def field(self, page: int, name: str) -> str:
        s, address = self.where[page]
        return str(self.searchers[s].doc(address).get_first(name) or "")


def _groups(values: np.ndarray, limit: int, per_group: int, docs: _Docs,
            show: str) -> dict[str, Any]:
    """Pages sharing a nonzero value: how many groups and pages, the largest groups."""
    present = np.flatnonzero(values != 0)
    uniq, inverse, counts = np.unique(values[present], return_inverse=True, return_counts=True)
    shared = np.flatnonzero(counts > 1)
    top = shared[np.argsort(-counts[shared], kind="stable")[:limit]]
    out = []
    for g in top.tolist():
        pages = present[inverse == g][:per_group].tolist()
        out.append({show: docs.field(pages[0], show), "count": int(counts[g]),
                    "urls": [docs.field(p, "url") for p in pages]})
    return {"groups": int(len(shared)), "pages": int(counts[shared].sum()), "top": out}


def _missing(values: np.ndarray, limit: int, docs: _Docs) -> dict[str, Any]:
    pages = np.flatnonzero(values == 0)
    return {"count": int(len(pages)), "urls": [docs.field(p, "url") for p in
                                               pages[:limit].tolist()]}


def _near_groups(docs: _Docs, limit: int, per_group: int) -> dict[str, Any]:
    parent = list(range(docs.n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    first_of: dict[int, int] = {}
    for page, value in enumerate(docs.sim.tolist()):
        if value:
            if value in first_of:
                union(first_of[value], page)
            else:
                first_of[value] = page
    skipped = 0
    distinct = list(first_of)
    for band in range(BANDS):
        buckets: dict[int, list[int]] = defaultdict(list)
        for v in distinct:
            buckets[(v >> (16 * band)) & 0xFFFF].append(v)
        for members in buckets.values():
            if len(members) > MAX_BUCKET:
                skipped += 1
                continue
            for i, a in enumerate(members):
                for b in members[i + 1:]:
                    if near(a, b):
                        union(first_of[a], first_of[b])
    groups: dict[int, list[int]] = defaultdict(list)
    for page in range(docs.n):
        if docs.sim[page]:
            groups[find(page)].append(page)
    multi = sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))
    return {"groups": len(multi), "pages": sum(len(g) for g in multi),
            "bucket_skipped": skipped,
            "top": [{"count": len(g), "title": docs.field(g[0], "title"),
                     "urls": [docs.field(p, "url") for p in g[:per_group]]}
                    for g in multi[:limit]]}


def _canonical(docs: _Docs, data_dir: str, limit: int) -> dict[str, Any]:
    """Pages whose canonical target is a redirect, an error, not answered or not crawled."""
    bad: list[dict[str, Any]] = []
    count = 0
    with CrawlReader(data_dir) as reader:
        for page, target in docs.canonical:
            try:
                record = reader.get(target)
            except URLError:  # not a URL the crawler reads: never crawled
                record = None
            if record is not None and record.status == 200:
                continue
            count += 1
            if len(bad) < limit:
                problem = ("not crawled" if record is None else
                           "no answer" if record.status <= 0 else
                           "redirect" if 300 <= record.status < 400 else "error")
                bad.append({"url": docs.field(page, "url"), "canonical": target,
                            "status": None if record is None else record.status,
                            "problem": problem})
    return {"pages": len(docs.canonical), "bad": count, "top": bad}


def site_checks(data_dir: str, *, limit: int = 20, per_group: int = 5) -> dict[str, Any] | None:
    """The findings (see the module docstring) as plain data; None when the crawl has no
    search index."""
    docs = _Docs(data_dir)
    if not docs.searchers:
        return None
    return {
        "pages": docs.n,
        "missing_title": _missing(docs.title, limit, docs),
        "duplicate_titles": _groups(docs.title, limit, per_group, docs, "title"),
        "missing_description": _missing(docs.desc, limit, docs),
        "duplicate_descriptions": _groups(docs.desc, limit, per_group, docs, "description"),
        "canonical": _canonical(docs, data_dir, limit),
        "near_duplicates": _near_groups(docs, limit, per_group),
    }


def add_site_checks(data_dir: str, report: dict[str, Any], *, limit: int = 20) -> None:
    """Put the findings into a computed report (as ``site``), when there is an index. A
    damaged index costs the report this section (with a warning), not the report."""
    try:
        found = site_checks(data_dir, limit=limit)
    except (CrawlerError, OSError, ValueError) as exc:
        log.warning("the report's site section is left out: %s", exc)
        return
    if found is not None:
        report["site"] = found


__all__ = ["add_site_checks", "site_checks"]
