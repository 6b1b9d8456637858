"""The names a page defines, as exact terms: a query that *is* a name a page defines
(``django.core.files.storage``, ``QuerySet.filter``, ``os.path.join()``) finds the page
that defines it first, above pages that only say it.

A page's defined names are its ids (crawler.read.pagetext.defined_names: Sphinx writes
``id="module-django.core.files.storage"``, ``id="django.db.models.query.QuerySet.filter"``;
DocBook ``id="GUC-WORK-MEM"``; rustdoc, Javadoc and MDN alike). Their words are already
in the ``headings`` field, scored by BM25 like any words; what that cannot see is that
the query is the *whole* name: a source listing titled ``django.core.files.storage``
has every one of those words, in its title, and outranked the module's documentation
page (docs/SEARCH.md, issue 44). So each name is also indexed whole, lowercased, in the
``names`` field (one exact term each: split at whitespace alone), with each of its tails
after a separator (``.``, ``::``, ``-``, ``:``, ``/``): ``queryset.filter`` (and the
longer tails) for the method, ``django.core.files.storage`` for the module id (its
generator's prefix ``module-`` dropped by the same rule), ``work-mem`` for the setting.

Only names that read as code are terms: with a separator in them (a page's
``id="search"`` or ``id="content"`` names a part of its layout, not a thing it
documents, and a one-word query stays a query of words). So ``storage`` alone is not a
term of the module above, ``files.storage`` is.

A query asks for the names it may be (:func:`asked`): the whole query when it is one
token that reads as code (a call's parentheses and arguments left out:
``dict.get(key, default)`` is ``dict.get``), and each dotted name in it. The pages that
define one of them and match the query come first, best first among themselves, as
Sphinx's own search lists the objects a query names before its full-text matches
(crawler.search.query). For such a query, a source listing (:data:`LISTING`: Sphinx's
viewcode pages define every name of a module too, and are titled by it) comes after the
pages that document the name, among those that define it and among the rest.

Thread safety: pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A page whose main text is at least this share code blocks (percent) is a listing of
# a program; for a query that reads as code it comes after the pages in prose
LISTING = 80
MAX_NAME = 200  # characters of a name asked or indexed (longer: not a name)
MAX_TERMS = 20_000  # name terms a page (a reference page defines thousands)
_SEPARATOR = re.compile(r"::|[.\-:/]")
_CODE = re.compile(r"\w[.\-:/_]+\w")  # a separator between two word characters
_CALL = re.compile(r"\s*\(.*\)\s*$")  # "join()", "get(key, default)"


def is_code(name: str) -> bool:
    """Whether ``name`` reads as code: a separator between two of its word characters."""
    return _CODE.search(name) is not None


def terms(names: str) -> list[str]:
    """The exact terms of a page's defined names (space-separated, as PageText.names):
    each name lowercased, and each of its tails after a separator, those that read as
    code (:func:`is_code`), each term once."""
    out: dict[str, None] = {}
    for name in names.split():
        name = name.lower()
        if len(name) > MAX_NAME:
            continue
        for tail in (name, *(name[m.end():] for m in _SEPARATOR.finditer(name))):
            if is_code(tail):
                out[tail] = None
        if len(out) >= MAX_TERMS:
            break
    return list(out)[:MAX_TERMS]


def asked(text: str, dotted: Iterable[str] = ()) -> list[str]:
    """The names a query may be, lowercased: the whole query if it is one token that
    reads as code (without a call's parentheses; not an excluded or required word,
    ``-x``, ``+x``), and each of ``dotted`` (the query's dotted names outside phrases,
    crawler.search.query's); each once."""
    out: dict[str, None] = {}
    whole = _CALL.sub("", text.strip()).lower()
    if (len(whole) <= MAX_NAME and whole[:1] not in ("-", "+") and is_code(whole)
            and not any(c.isspace() or c == '"' for c in whole)):
        out[whole] = None
    for name in dotted:
        if len(name) <= MAX_NAME:
            out[name.lower()] = None
    return list(out)


__all__ = ["LISTING", "MAX_NAME", "MAX_TERMS", "asked", "is_code", "terms"]
