"""The search index's layout: where a shard's index lives, its tantivy schema, and how a
query's words are weighed across its fields (docs/SEARCH.md).

A shard's index is the directory ``search/`` beside its MainDB (``DIR/search`` for a
one-shard crawl, ``DIR/shard-NN/search`` for each shard of a sharded one: a shard owns
its pages and indexes them). In it: ``tantivy/`` (the index), ``versions.npy`` and
``journal.bin`` (crawler.search.versions), ``anchors/`` (a kvstore: url_key -> the
anchor text of the links pointing to that page), ``state.json`` and ``lock``.

Fields. Text fields use tantivy's ``default`` analyzer (words split at non-letters and
non-digits, lowercased, words over 40 bytes dropped): the same for every language, so a
query finds a page in any of them by its exact words; the ``stem_<lang>`` fields add the
page's language's stemmer where tantivy has one (STEMMERS). ``key``, ``host``
and ``lang`` are exact terms (the ``raw`` tokenizer), for deletes and filters; ``names``
holds the names the page defines as exact terms too (crawler.search.names: lowercased
there, split at whitespace alone).
"""

from __future__ import annotations

import os

import tantivy

from ..exceptions import DataDirError

FORMAT = 5  # of the index directory: a different one is rebuilt, never read
SEARCH_DIR = "search"
TANTIVY_DIR = "tantivy"
ANCHORS_DIR = "anchors"
STATE = "state.json"
LOCK = "lock"

# The fields a query's words are looked for in, and their boosts: a word in the title
# counts five times one in the main text. Set by hand, then checked by
# tools/bench_search.py's MRR runs: 0.989 with them, 0.981 with every boost 1
# (docs/SEARCH.md gives the numbers).
QUERY_FIELDS = ("title", "headings", "body", "anchors", "url", "description")
BOOSTS = {"title": 5.0, "headings": 2.0, "body": 1.0, "anchors": 2.0, "url": 2.0,
          "description": 1.5}


# Snowball stemmers tantivy has, by the language codes the detector gives. A page in one
# of these languages has its title and main text indexed a second time, stemmed, in
# ``stem_<code>`` (with the language's analyzer: "Häuser" is found by "Haus"); a query's
# words are stemmed by each such field's analyzer as they are looked up there.
STEMMERS = {"ar": "arabic", "da": "danish", "de": "german", "el": "greek", "en": "english",
            "es": "spanish", "fi": "finnish", "fr": "french", "hu": "hungarian",
            "it": "italian", "nl": "dutch", "no": "norwegian", "pt": "portuguese",
            "ro": "romanian", "ru": "russian", "sv": "swedish", "ta": "tamil",
            "tr": "turkish"}
STEM_BOOST = 0.5  # a stemmed match counts half an exact one (the exact field scores too)


def stem_field(lang: str) -> str | None:
    """The stemmed field of a language code, or None if tantivy has no stemmer for it."""
    return f"stem_{lang}" if lang in STEMMERS else None


def _analyzer(language: str) -> tantivy.TextAnalyzer:
    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.remove_long(40)).filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.stemmer(language)).build())


def register(index: tantivy.Index) -> tantivy.Index:
    """The stemming analyzers, which tantivy keeps in memory only: registered at every
    open, before any document is written or query parsed."""
    for code, language in STEMMERS.items():
        index.register_tokenizer(f"stem_{code}", _analyzer(language))
    return index


def build_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("key", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("url", stored=True)  # the default analyzer splits it into its words
    sb.add_text_field("host", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("title", stored=True)
    sb.add_text_field("description", stored=True)
    sb.add_text_field("headings")
    sb.add_text_field("body", stored=True)  # stored: snippets are cut from it
    sb.add_text_field("anchors")
    # the names the page defines, whole and by their tails (crawler.search.names; FORMAT 5)
    sb.add_text_field("names", tokenizer_name="whitespace", index_option="basic")
    sb.add_text_field("lang", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("canonical", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_unsigned_field("simhash", stored=True, fast=True)
    # the share of the main text in code blocks, percent (FORMAT 5): a source listing's
    # is near 100 (crawler.search.names)
    sb.add_unsigned_field("code", stored=True)
    sb.add_float_field("fetched", stored=True)
    for code in STEMMERS:
        sb.add_text_field(f"stem_{code}", tokenizer_name=f"stem_{code}")
    return sb.build()


def search_dir(shard_dir: str) -> str:
    return os.path.join(shard_dir, SEARCH_DIR)


def index_exists(directory: str) -> bool:
    """Whether a shard's search directory holds a tantivy index (its meta.json)."""
    path = os.path.join(directory, TANTIVY_DIR)
    return os.path.isdir(path) and bool(tantivy.Index.exists(path))


# what a damaged file of a search directory needs (--rebuild starts from nothing)
REBUILD = "rebuild the search index: python -m crawler index DIR --rebuild"


def open_index(directory: str, *, create: bool) -> tantivy.Index | None:
    """The tantivy index of a shard's search directory; None if there is none and
    ``create`` is false."""
    path = os.path.join(directory, TANTIVY_DIR)
    if index_exists(directory):
        try:
            return register(tantivy.Index.open(path))
        except (ValueError, OSError) as exc:  # a file of it cut, removed, not tantivy's
            message = " ".join(str(exc).split())[:300]
            raise DataDirError(f"{path}: the search index is damaged ({message}); "
                               f"{REBUILD}") from None
    if not create:
        return None
    os.makedirs(path, exist_ok=True)
    return register(tantivy.Index(build_schema(), path=path))


__all__ = ["ANCHORS_DIR", "BOOSTS", "FORMAT", "LOCK", "QUERY_FIELDS", "REBUILD", "SEARCH_DIR",
           "STATE", "STEMMERS", "STEM_BOOST", "build_schema", "index_exists", "open_index",
           "register", "search_dir", "stem_field"]
