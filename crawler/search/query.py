"""``python -m crawler search``: a query over a crawl's search index, every shard's,
ranked by BM25 blended with PageRank, near-duplicates folded, each hit with a snippet.

Theory of operation
-------------------
The query is parsed by tantivy's query language (words, ``"phrases"``, ``field:word``,
``AND``/``OR``/``-word``, ``word^2``), every word looked for in
crawler.search.schema's fields with their boosts; words are ANDed unless ``OR`` is
said. Each shard's index gives its best ``candidates`` by BM25 (tantivy's, over the
fields); each candidate's score is then blended with the page's PageRank from the last
``rank`` run (crawler.read.rankstore):

    score = bm25 * (1 + rank_weight * log2(1 + N * pagerank))

``N * pagerank`` is 1 for a page of average rank, so an average page's BM25 is
multiplied by ``1 + rank_weight``, a page 7 times stronger by ``1 + 3 * rank_weight``,
a page without a rank (not ranked yet) by 1. The weight is measured, not guessed
(tools/bench_search.py; docs/SEARCH.md): navigational queries lose with every weight
(MRR 0.989 at 0, 0.988 at 0.1, 0.982 at 0.25, 0.931 at 1 on 1,657 title queries), so
the default, 0.1, is the largest that costs them under 0.002 MRR: PageRank only breaks
near-ties. Shards are merged by that score (each shard's
BM25 uses its own word statistics: with hosts spread over shards by hash these agree
closely). Then, best first, a hit whose SimHash is within 3 bits of a better hit's is
folded into it (``duplicates`` counts them), and the first ``limit`` remain.

A query that tantivy cannot parse, one longer than :data:`MAX_QUERY` characters, or
one with control characters is a QueryError (one line, no traceback).

Thread safety: a Searcher is for one thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tantivy

from ..exceptions import ConfigError, DataDirError
from ..read.rankstore import RankStore
from ..read.simhash import near
from ..state.shards import crawl_count, shard_dir
from . import schema

MAX_QUERY = 1_000  # characters
DEFAULT_LIMIT = 10
DEFAULT_RANK_WEIGHT = 0.1
MIN_CANDIDATES = 50
SNIPPET_CHARS = 240


class QueryError(ConfigError):
    """A query the index cannot answer as written (syntax, length, characters)."""


@dataclass(slots=True)
class Hit:
    url: str
    title: str
    snippet: str  # a fragment of the main text (or the description)
    highlights: list[tuple[int, int]]  # character ranges of ``snippet`` the query matched
    score: float  # what the hits are ordered by
    bm25: float
    pagerank: float | None  # raw PageRank (the N ranked pages sum to 1), None: not ranked
    host: str
    lang: str
    fetched: float
    shard: int
    simhash: int = 0
    duplicates: list[str] = field(default_factory=list)  # URLs folded into this hit

    def as_json(self) -> dict[str, Any]:
        return {"url": self.url, "title": self.title, "snippet": self.snippet,
                "highlights": [list(r) for r in self.highlights], "score": self.score,
                "bm25": self.bm25, "pagerank": self.pagerank, "host": self.host,
                "lang": self.lang, "fetched": self.fetched, "shard": self.shard,
                "duplicates": self.duplicates}


@dataclass(slots=True)
class Results:
    query: str
    matches: int  # pages matching, every shard (near-duplicates included)
    hits: list[Hit]
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {"query": self.query, "matches": self.matches, "seconds": self.seconds,
                "hits": [h.as_json() for h in self.hits]}


def check_query(text: str) -> str:
    """``text`` if it can be a query; else QueryError saying why."""
    if not text.strip():
        raise QueryError("search: the query is empty")
    if len(text) > MAX_QUERY:
        raise QueryError(f"search: the query is {len(text):,} characters; at most "
                         f"{MAX_QUERY:,} are read")
    bad = next((c for c in text if ord(c) < 32 or 0x7F <= ord(c) < 0xA0), None)
    if bad is not None:
        raise QueryError(f"search: the query has a control character (U+{ord(bad):04X})")
    return text


def _char_ranges(fragment: str, ranges: list[Any]) -> list[tuple[int, int]]:
    """tantivy's highlight ranges are UTF-8 byte offsets; ours are characters."""
    raw = fragment.encode("utf-8")
    return [(len(raw[:r.start].decode("utf-8", "ignore")),
             len(raw[:r.end].decode("utf-8", "ignore"))) for r in ranges]


class Searcher:
    """The search indexes of a crawl (every shard's that exists), read-only. A context
    manager."""

    def __init__(self, data_dir: str, *, rank_weight: float = DEFAULT_RANK_WEIGHT,
                 fields: Sequence[str] = schema.QUERY_FIELDS,
                 boosts: Mapping[str, float] | None = None, stemmed: bool = True) -> None:
        """``fields`` and ``boosts``: where a query's words are looked for and their
        weights (crawler.search.schema's by default; tools/bench_search.py varies them);
        ``stemmed``: also in the stemmed fields (every language's, or ``lang``'s)."""
        self.data_dir = data_dir
        self.rank_weight = rank_weight
        self.fields = list(fields)
        self.boosts = {f: b for f, b in (boosts or schema.BOOSTS).items() if f in self.fields}
        self.stemmed = stemmed
        count = crawl_count(data_dir)
        self.indexes: list[tuple[int, tantivy.Index]] = []
        for i in range(count):
            index = schema.open_index(schema.search_dir(shard_dir(data_dir, i, count)),
                                      create=False)
            if index is not None:
                self.indexes.append((i, index))
        if not self.indexes:
            raise DataDirError(f"{data_dir}: no search index; make one with: python -m "
                               f"crawler index {data_dir}")
        self.ranks = RankStore.open(data_dir)
        # N: the pages the last rank run ranked (their PageRanks sum to 1)
        self.ranked = int(self.ranks.graph["fetched"]) if self.ranks is not None else 0

    def close(self) -> None:
        if self.ranks is not None:
            self.ranks.close()

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prior(self, pagerank: float | None) -> float:
        """The factor BM25 is multiplied by (see the module docstring)."""
        if pagerank is None or self.ranked <= 0:
            return 1.0
        return 1.0 + self.rank_weight * math.log2(1.0 + self.ranked * pagerank)

    def _parse(self, index: tantivy.Index, text: str, host: str | None,
               lang: str | None) -> tantivy.Query:
        fields, boosts = list(self.fields), dict(self.boosts)
        if self.stemmed:
            stems = ([f] if lang and (f := schema.stem_field(lang.lower())) else
                     [] if lang else [f"stem_{code}" for code in schema.STEMMERS])
            fields += stems
            boosts.update(dict.fromkeys(stems, schema.STEM_BOOST))
        try:
            query = index.parse_query(text, fields, field_boosts=boosts,
                                      conjunction_by_default=True)
        except ValueError as exc:
            message = " ".join(str(exc).split())
            raise QueryError(f"search: cannot read the query: {message}") from None
        must = [(tantivy.Occur.Must, query)]
        s = index.schema
        if host:
            must.append((tantivy.Occur.Must, tantivy.Query.term_query(s, "host", host.lower())))
        if lang:
            must.append((tantivy.Occur.Must, tantivy.Query.term_query(s, "lang", lang.lower())))
        return query if len(must) == 1 else tantivy.Query.boolean_query(must)

    def search(self, text: str, *, limit: int = DEFAULT_LIMIT, host: str | None = None,
               lang: str | None = None) -> Results:
        started = time.perf_counter()
        check_query(text)
        candidates = max(limit * 5, MIN_CANDIDATES)
        pool: list[tuple[float, float, int, Any, Any]] = []
        matches = 0
        for shard, index in self.indexes:
            query = self._parse(index, text, host, lang)
            searcher = index.searcher()
            result = searcher.search(query, candidates, count=True)
            matches += getattr(result, "count", None) or 0  # (not in tantivy's stubs)
            for bm25, address in result.hits:
                doc = searcher.doc(address)
                key = bytes.fromhex(str(doc.get_first("key")))
                rank = self.ranks.get(key) if self.ranks is not None else None
                pr = rank.raw if rank is not None else None
                pool.append((bm25 * self.prior(pr), bm25, shard, doc, pr))
        pool.sort(key=lambda c: -c[0])
        hits: list[Hit] = []
        docs: list[Any] = []
        for score, bm25, shard, doc, pr in pool:
            sim = int(doc.get_first("simhash") or 0)
            twin = next((h for h in hits if sim and h.simhash and near(sim, h.simhash)), None)
            if twin is not None:
                twin.duplicates.append(doc.get_first("url"))
            elif len(hits) < limit:
                hits.append(Hit(
                    url=doc.get_first("url"), title=doc.get_first("title") or "",
                    snippet="", highlights=[], score=score, bm25=bm25, pagerank=pr,
                    host=doc.get_first("host") or "", lang=doc.get_first("lang") or "",
                    fetched=float(doc.get_first("fetched") or 0.0), shard=shard,
                    simhash=sim))
                docs.append(doc)
        self._snippets(hits, docs, text, host, lang)
        return Results(text, matches, hits, time.perf_counter() - started)

    def _snippets(self, hits: list[Hit], docs: list[Any], text: str, host: str | None,
                  lang: str | None) -> None:
        generators: dict[int, Any] = {}
        by_shard = dict(self.indexes)
        for hit, doc in zip(hits, docs, strict=True):
            gen = generators.get(hit.shard)
            if gen is None:
                index = by_shard[hit.shard]
                gen = tantivy.SnippetGenerator.create(
                    index.searcher(), self._parse(index, text, host, lang), index.schema,
                    "body")
                gen.set_max_num_chars(SNIPPET_CHARS)
                generators[hit.shard] = gen
            snippet = gen.snippet_from_doc(doc)
            fragment = snippet.fragment()
            if fragment.strip():
                hit.snippet = fragment
                hit.highlights = _char_ranges(fragment, snippet.highlighted())
            else:  # no query word in the text (a title, URL or anchor match)
                body = doc.get_first("description") or doc.get_first("body") or ""
                hit.snippet = body[:SNIPPET_CHARS]


__all__ = ["DEFAULT_LIMIT", "DEFAULT_RANK_WEIGHT", "Hit", "QueryError", "Results",
           "Searcher", "check_query"]
