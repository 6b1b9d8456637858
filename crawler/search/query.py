"""``python -m crawler search``: a query over a crawl's search index, every shard's,
ranked by BM25 blended with PageRank, near-duplicates folded, each hit with a snippet.

Theory of operation
-------------------
The query is parsed by tantivy's query language (words, ``"phrases"``, ``field:word``,
``AND``/``OR``/``-word``, ``word^2``), every word looked for in
crawler.search.schema's fields with their boosts; words are ANDed unless ``OR`` is
said. When no page has every word, or fewer pages than asked for and the query has at
most FEW_WORDS words, the query is asked again with its words ORed, and the pages with
every word come first (``any_word`` in the results).
A dotted name outside a phrase (``asyncio.Lock.release``, ``std::vector``) is looked
for as its words, anywhere on the page (Sphinx writes the class and, under it, the
method), and a page that has it as written scores more (an optional phrase clause,
boosted by PHRASE_BOOST). A query that is a name, or holds a dotted one, also asks each
shard for the pages that match it and define that name (crawler.search.names): those
come first, and for such a query a source listing comes after the pages that document
it. Each shard's index gives its best ``candidates`` by BM25
(tantivy's, over the fields); each candidate's score is then blended with the page's
PageRank from the last ``rank`` run (crawler.read.rankstore):

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

A search box takes any text (DESIGN section 8): a query that tantivy cannot parse
(``title:(granite``, ``"unclosed``, ``nosuchfield:word``), or that it parses but cannot
run on this schema (``title:*`` asks for a fast field), is searched as its words
(:func:`as_words`: each run of letters and digits, as a term). What stays a QueryError
(one line, no traceback): an empty query, one with no word at all to fall back to
(``((``), one longer than :data:`MAX_QUERY` characters, one with control characters.

Thread safety: a Searcher is for one thread.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tantivy

from ..exceptions import ConfigError, DataDirError
from ..read.rankstore import RankStore
from ..read.simhash import near
from ..state.shards import crawl_count, shard_dir
from . import names, schema

log = logging.getLogger(__name__)

MAX_QUERY = 1_000  # characters
DEFAULT_LIMIT = 10
DEFAULT_RANK_WEIGHT = 0.1
MIN_CANDIDATES = 50
# A query of up to this many words that fewer than --limit pages have every word of is
# asked again, ORed; a longer one only when no page has them all. A long query that found
# its page is specific, not a vocabulary mismatch, and its OR is costly: at 1M pages,
# nine-word titles took p50 24 / p95 54 ms with it, 6 / 18 without; the informational
# benchmarks' MRR (600 queries on each of 3 manuals) moved by 0.000 with it or not.
FEW_WORDS = 3
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
    matches: int  # pages matching (every word), every shard (near-duplicates included)
    hits: list[Hit]
    seconds: float
    # fewer pages than asked for had every word: the hits are the pages with any of them
    # (those with every word first), ``any_matches`` of them
    any_word: bool = False
    any_matches: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"query": self.query, "matches": self.matches, "any_word": self.any_word,
                "any_matches": self.any_matches, "seconds": self.seconds,
                "hits": [h.as_json() for h in self.hits]}


def summary_line(results: Results) -> str:
    """What the hits are, in words: "3 of 41 matching pages", or when few pages had every
    word, how many had every word and how many some."""
    if results.any_word:
        return (f"{len(results.hits)} shown: {results.matches:,} pages with every word, "
                f"{results.any_matches:,} with some")
    return f"{len(results.hits)} of {results.matches:,} matching pages"


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


_WORD = re.compile(r"\w+")
# A dotted name as code writes it (asyncio.Lock.release, os.path, std::vector, a->b): not
# inside a phrase, after a field name (``url:docs.python.org``) or after - or + (``-os.path``
# leaves out the phrase, not each word).
_CODE_NAME = re.compile(r'(?<![\w:."+-])\w+(?:(?:\.|::|->)\w+)+')
_PHRASE = re.compile(r'"[^"]*"?')
PHRASE_BOOST = 2.0  # a dotted name met as written counts twice its words met anywhere


def as_words(text: str, *, any_word: bool = False) -> str:
    """``text`` as tantivy reads plain words: each run of letters and digits quoted (so
    none is an operator, a field or a range), ANDed as any query's words are (ORed with
    ``any_word``). QueryError when it has none."""
    words = _WORD.findall(text)
    if not words:
        raise QueryError(f"search: cannot read the query {text[:80]!r}, and it has no "
                         "word to look for")
    return (" OR " if any_word else " ").join(f'"{w}"' for w in words)


def code_names(text: str) -> list[str]:
    """The dotted names of ``text`` outside its phrases (``asyncio.Lock.release``)."""
    return [m.group() for part in _PHRASE.split(text) for m in _CODE_NAME.finditer(part)]


def split_code_names(text: str) -> str:
    """``text`` with each dotted name outside a phrase written as its words, which a page
    may hold apart: Sphinx writes ``class asyncio.Lock`` and, under it, ``release()``.
    (tantivy reads ``asyncio.Lock.release`` as the phrase "asyncio lock release".)"""
    def words(name: re.Match[str]) -> str:
        return " ".join(_WORD.findall(name.group()))

    out, last = [], 0
    for m in _PHRASE.finditer(text):
        out += [_CODE_NAME.sub(words, text[last:m.start()]), m.group()]
        last = m.end()
    out.append(_CODE_NAME.sub(words, text[last:]))
    return "".join(out)


def _char_ranges(fragment: str, ranges: list[Any]) -> list[tuple[int, int]]:
    """tantivy's highlight ranges are UTF-8 byte offsets; ours are characters."""
    raw = fragment.encode("utf-8")
    return [(len(raw[:r.start].decode("utf-8", "ignore")),
             len(raw[:r.end].decode("utf-8", "ignore"))) for r in ranges]


@dataclass(slots=True)
class Candidate:
    """One shard's answer to a query, before the PageRank blend and folding: what the
    merger needs of a document (plain data: it crosses processes on Ray)."""

    bm25: float
    key: bytes
    url: str
    title: str
    host: str
    lang: str
    fetched: float
    simhash: int
    number: int  # its place in the shard's last answer (what ``snippets`` is asked by)
    defines: bool = False  # it defines a name the query may be (crawler.search.names)
    code: int = 0  # percent of its main text in code blocks (a listing: near 100)


class ShardSearcher:
    """One shard's index: the best candidates of a query and their snippets. Local, or
    in a Ray actor on the shard's node (crawler.search.onray)."""

    def __init__(self, index: tantivy.Index, *, fields: Sequence[str] = schema.QUERY_FIELDS,
                 boosts: Mapping[str, float] | None = None, stemmed: bool = True) -> None:
        self.index = index
        self.fields = list(fields)
        self.boosts = {f: b for f, b in (boosts or schema.BOOSTS).items() if f in self.fields}
        self.stemmed = stemmed
        self._docs: list[Any] = []  # the documents of the last answer
        self._searcher: Any = None  # the index snapshot they came from
        self._query: tantivy.Query | None = None  # the query that answered

    def parse(self, text: str, host: str | None, lang: str | None, *,
              words: bool = False, any_word: bool = False) -> tantivy.Query:
        """``text`` as a query of this index (the words of it, :func:`as_words`, when
        ``words`` is true or tantivy cannot parse it): its words ANDed, or ORed with
        ``any_word``; a dotted name's words anywhere on the page, and a page that has the
        name as written (a phrase) scores more."""
        fields, boosts = list(self.fields), dict(self.boosts)
        if self.stemmed:
            stems = ([f] if lang and (f := schema.stem_field(lang.lower())) else
                     [] if lang else [f"stem_{code}" for code in schema.STEMMERS])
            fields += stems
            boosts.update(dict.fromkeys(stems, schema.STEM_BOOST))
        # (as_words: QueryError when there is no word at all)
        written = (as_words(text, any_word=any_word) if words else split_code_names(text))
        try:
            query = self.index.parse_query(written, fields, field_boosts=boosts,
                                           conjunction_by_default=not any_word)
        except ValueError as exc:
            if words:  # (quoted words always parse: not expected)
                message = " ".join(str(exc).split())
                raise QueryError(f"search: cannot read the query: {message}") from None
            log.debug("search: %r read as words (%s)", text, exc)
            return self.parse(text, host, lang, words=True, any_word=any_word)
        phrases = []
        for name in code_names(text):  # each name as written: a clause that adds to the score
            try:
                phrases.append((tantivy.Occur.Should, tantivy.Query.boost_query(
                    self.index.parse_query(f'"{name}"', fields, field_boosts=boosts),
                    PHRASE_BOOST)))
            except ValueError as exc:  # (a phrase of word characters: not expected)
                log.debug("search: %r: no phrase for %r (%s)", text, name, exc)
        if phrases:
            query = tantivy.Query.boolean_query([(tantivy.Occur.Must, query), *phrases])
        must = [(tantivy.Occur.Must, query)]
        s = self.index.schema
        if host:
            must.append((tantivy.Occur.Must, tantivy.Query.term_query(s, "host", host.lower())))
        if lang:
            must.append((tantivy.Occur.Must, tantivy.Query.term_query(s, "lang", lang.lower())))
        return query if len(must) == 1 else tantivy.Query.boolean_query(must)

    def candidates(self, text: str, host: str | None, lang: str | None,
                   n: int, any_word: bool = False) -> tuple[int, list[Candidate]]:
        """(pages matching, the best ``n`` of them by BM25); ``any_word``: pages with
        any of the query's words, not only those with all."""
        query = self.parse(text, host, lang, any_word=any_word)
        self._searcher = self.index.searcher()
        try:
            result = self._searcher.search(query, n, count=True)
        except ValueError as exc:  # parsed, but not runnable here (title:*: a fast field)
            log.debug("search: %r read as words (%s)", text, exc)
            query = self.parse(text, host, lang, words=True, any_word=any_word)
            result = self._searcher.search(query, n, count=True)
        self._query = query  # what the snippets of this answer highlight
        hits = list(result.hits)
        defining = self._defining(query, text, n)
        seen = {(a.segment_ord, a.doc) for _, a in hits}
        hits += [(bm25, a) for bm25, a in defining.values() if (a.segment_ord, a.doc) not in seen]
        out: list[Candidate] = []
        self._docs = []
        for bm25, address in hits:
            doc = self._searcher.doc(address)
            out.append(Candidate(
                bm25=bm25, key=bytes.fromhex(str(doc.get_first("key"))),
                url=doc.get_first("url"), title=doc.get_first("title") or "",
                host=doc.get_first("host") or "", lang=doc.get_first("lang") or "",
                fetched=float(doc.get_first("fetched") or 0.0),
                simhash=int(doc.get_first("simhash") or 0), number=len(out),
                defines=(address.segment_ord, address.doc) in defining,
                code=int(doc.get_first("code") or 0)))
            self._docs.append(doc)
        return getattr(result, "count", None) or 0, out  # (count: not in tantivy's stubs)

    def _defining(self, query: tantivy.Query, text: str,
                  n: int) -> dict[tuple[int, int], tuple[float, tantivy.DocAddress]]:
        """The best ``n`` pages matching ``query`` that define a name ``text`` may be
        (crawler.search.names), by their (segment, document): (their score, address)."""
        asked = names.asked(text, code_names(text))
        if not asked:
            return {}
        s = self.index.schema
        named = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(s, "names", name))
             for name in asked])
        both = tantivy.Query.boolean_query(  # (scored as ``query`` alone)
            [(tantivy.Occur.Must, query),
             (tantivy.Occur.Must, tantivy.Query.const_score_query(named, 0.0))])
        return {(a.segment_ord, a.doc): (score, a)
                for score, a in self._searcher.search(both, n).hits}

    def snippets(self, text: str, host: str | None, lang: str | None,
                 numbers: list[int]) -> list[tuple[str, list[tuple[int, int]]]]:
        """(snippet, highlighted character ranges) of candidates of the last answer."""
        if not numbers:
            return []
        query = self._query if self._query is not None else self.parse(text, host, lang)
        gen = tantivy.SnippetGenerator.create(self._searcher, query, self.index.schema, "body")
        gen.set_max_num_chars(SNIPPET_CHARS)
        out = []
        for number in numbers:
            doc = self._docs[number]
            snippet = gen.snippet_from_doc(doc)
            fragment = snippet.fragment()
            if fragment.strip():
                out.append((fragment, _char_ranges(fragment, snippet.highlighted())))
            else:  # no query word in the text (a title, URL or anchor match)
                body = doc.get_first("description") or doc.get_first("body") or ""
                out.append((body[:SNIPPET_CHARS], []))
        return out


class Searcher:
    """The search indexes of a crawl (every shard's that exists here, or on Ray every
    shard's through its actor), read-only. A context manager."""

    def __init__(self, data_dir: str, *, rank_weight: float = DEFAULT_RANK_WEIGHT,
                 fields: Sequence[str] = schema.QUERY_FIELDS,
                 boosts: Mapping[str, float] | None = None, stemmed: bool = True,
                 shards: Sequence[tuple[int, Any]] | None = None) -> None:
        """``fields`` and ``boosts``: where a query's words are looked for and their
        weights (crawler.search.schema's by default; tools/bench_search.py varies them);
        ``stemmed``: also in the stemmed fields (every language's, or ``lang``'s).
        ``shards``: (shard, searcher) pairs to ask instead of this machine's indexes
        (crawler.search.onray gives Ray actors)."""
        self.data_dir = data_dir
        self.rank_weight = rank_weight
        if shards is None:
            count = crawl_count(data_dir)
            found = []
            for i in range(count):
                index = schema.open_index(schema.search_dir(shard_dir(data_dir, i, count)),
                                          create=False)
                if index is not None:
                    found.append((i, _Local(ShardSearcher(index, fields=fields, boosts=boosts,
                                                          stemmed=stemmed))))
            shards = found
        self.shards = list(shards)
        if not self.shards:
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

    def search(self, text: str, *, limit: int = DEFAULT_LIMIT, host: str | None = None,
               lang: str | None = None) -> Results:
        started = time.perf_counter()
        check_query(text)
        candidates = max(limit * 5, MIN_CANDIDATES)
        matches, found = self._ask(text, host, lang, candidates, any_word=False)
        every_word: set[bytes] = set()  # the pages with every word, when fewer than limit
        words = len(_WORD.findall(text))
        any_word = words > 1 and (matches == 0 or (matches < limit and words <= FEW_WORDS))
        any_matches = 0
        if any_word:  # few or none have every word: a ranked OR, those pages first
            every_word = {c.key for _, c in found}
            any_matches, found = self._ask(text, host, lang, candidates, any_word=True)
        pool: list[tuple[float, float | None, int, Candidate]] = []
        for shard, c in found:
            rank = self.ranks.get(c.key) if self.ranks is not None else None
            pr = rank.raw if rank is not None else None
            pool.append((c.bm25 * self.prior(pr), pr, shard, c))
        # the pages with every word first, then those that define the name asked; for a
        # query that reads as code, a listing of code after the pages that document it;
        # ties by URL: the same order on any build
        code = bool(names.asked(text, code_names(text)))
        pool.sort(key=lambda c: (c[3].key not in every_word, not c[3].defines,
                                 code and c[3].code >= names.LISTING, -c[0], c[3].url))
        hits: list[Hit] = []
        numbers: dict[int, list[int]] = {}
        for score, pr, shard, c in pool:
            twin = next((h for h in hits if c.simhash and h.simhash
                         and near(c.simhash, h.simhash)), None)
            if twin is not None:
                twin.duplicates.append(c.url)
            elif len(hits) < limit:
                hits.append(Hit(url=c.url, title=c.title, snippet="", highlights=[],
                                score=score, bm25=c.bm25, pagerank=pr, host=c.host,
                                lang=c.lang, fetched=c.fetched, shard=shard,
                                simhash=c.simhash))
                numbers.setdefault(shard, []).append(c.number)
        by_shard = dict(self.shards)
        asked = [(shard, by_shard[shard].ask_snippets(text, host, lang, nums))
                 for shard, nums in numbers.items()]
        for shard, answer in asked:
            mine = [h for h in hits if h.shard == shard]
            for hit, (snippet, ranges) in zip(mine, answer(), strict=True):
                hit.snippet, hit.highlights = snippet, ranges
        return Results(text, matches, hits, time.perf_counter() - started, any_word=any_word,
                       any_matches=any_matches)

    def _ask(self, text: str, host: str | None, lang: str | None, n: int, *,
             any_word: bool) -> tuple[int, list[tuple[int, Candidate]]]:
        """(pages matching on every shard, each shard's best ``n``: (shard, candidate))."""
        answers = [(shard, s.ask_candidates(text, host, lang, n, any_word))
                   for shard, s in self.shards]  # on Ray: every shard asked at once
        matches, found = 0, []
        for shard, answer in answers:
            count, got = answer()
            matches += count
            found += [(shard, c) for c in got]
        return matches, found


class _Local:
    """A ShardSearcher asked in this process. A shard is asked through ``ask_*``, which
    return a function giving the answer: here at once; on Ray (crawler.search.onray)
    when the actor's answer arrives, so every shard works at the same time."""

    def __init__(self, searcher: ShardSearcher) -> None:
        self.searcher = searcher

    def ask_candidates(self, text: str, host: str | None, lang: str | None,
                       n: int, any_word: bool) -> Callable[[], tuple[int, list[Candidate]]]:
        answer = self.searcher.candidates(text, host, lang, n, any_word)
        return lambda: answer

    def ask_snippets(self, text: str, host: str | None, lang: str | None, numbers: list[int],
                     ) -> Callable[[], list[tuple[str, list[tuple[int, int]]]]]:
        answer = self.searcher.snippets(text, host, lang, numbers)
        return lambda: answer


__all__ = ["DEFAULT_LIMIT", "DEFAULT_RANK_WEIGHT", "Candidate", "Hit", "QueryError",
           "Results", "Searcher", "ShardSearcher", "as_words", "check_query", "code_names",
           "split_code_names", "summary_line"]
