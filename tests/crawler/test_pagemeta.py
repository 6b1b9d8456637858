"""crawler.web.pagemeta (what a page says about itself, in one bounded pass) and
crawler.read.simhash (near-duplicates): their rules, their bounds against hostile pages,
and SimHash's stability across processes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.read.simhash import NEAR, distance, near, simhash
from crawler.web.pagemeta import (
    MAX_ANCHOR_TEXT,
    MAX_ANCHORS,
    MAX_DESCRIPTION,
    MAX_JSONLD_BLOCKS,
    MAX_JSONLD_BYTES,
    MAX_OPENGRAPH,
    MAX_VALUE,
    read_html,
)

PAGE = b"""<!doctype html><html lang="EN-gb"><head>
<title>  The   Title </title>
<meta name="description" content="  What it
is about ">
<meta property="og:title" content="OG title"><meta property="og:type" content="article">
<meta property="og:title" content="second, ignored">
<link rel="alternate stylesheet" href="/x.css"><link rel="Canonical" href="../c/page.html">
<script type="application/ld+json">{"@type": "Article", "headline": "H"}</script>
<script type="application/ld+json">{not json</script>
<script>var hidden = "not text";</script>
</head><body><nav>Home</nav><p>Body <b>words</b></p><title>late title</title></body></html>"""


def test_a_page_says_its_title_description_canonical_lang_og_and_jsonld() -> None:
    meta = read_html(PAGE, "http://a.test/dir/sub/p.html")
    assert meta.title == "The Title"
    assert meta.description == "What it is about"
    assert meta.canonical == "http://a.test/dir/c/page.html"
    assert meta.lang == "en-gb"
    assert meta.opengraph == {"og:title": "OG title", "og:type": "article"}
    assert meta.jsonld == [{"@type": "Article", "headline": "H"}]
    assert "not text" not in meta.text and "Body words" in meta.text
    assert "Article" not in meta.text  # JSON-LD is data, not text


def test_a_page_that_says_nothing_gives_empty_values() -> None:
    meta = read_html(b"<p>only text</p>")
    assert (meta.title, meta.description, meta.canonical, meta.lang) == ("", "", "", "")
    assert (meta.opengraph, meta.jsonld, meta.text) == ({}, [], "only text")


def test_an_unclosed_title_is_kept_and_cut() -> None:
    meta = read_html(b"<html><head><title>" + b"word " * 10_000)
    assert meta.title.startswith("word word") and len(meta.title) <= MAX_VALUE


def test_every_value_and_count_is_bounded() -> None:
    og = b"".join(b'<meta property="og:p%d" content="%s">' % (i, b"v" * 5000)
                  for i in range(1000))
    blocks = b"".join(b'<script type="application/ld+json">{"n": %d}</script>' % i
                      for i in range(100))
    huge = b'<script type="application/ld+json">{"big": "' + b"x" * (2 * MAX_JSONLD_BYTES) \
        + b'"}</script>'
    page = (b"<html><head><title>" + b"t" * 50_000 + b"</title>"
            b'<meta name="description" content="' + b"d" * 50_000 + b'">'
            + huge + og + blocks + b"</head><body>text</body></html>")
    meta = read_html(page)
    assert len(meta.title) == MAX_VALUE and len(meta.description) == MAX_DESCRIPTION
    assert len(meta.opengraph) == MAX_OPENGRAPH
    assert all(len(v) == MAX_VALUE for v in meta.opengraph.values())
    assert meta.jsonld == [{"n": i} for i in range(MAX_JSONLD_BLOCKS)]  # the huge one skipped


def test_a_hostile_page_costs_its_bounds_not_its_size() -> None:
    # 20 MiB inside one JSON-LD block and 200,000 meta tags: kept data stays small
    page = (b'<script type="application/ld+json">' + b"[" * (20 << 20) + b"</script>"
            + b'<meta property="og:x" content="y">' * 200_000 + b"<p>end</p>")
    tracemalloc.start()
    try:
        meta = read_html(page, text_limit=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert meta.jsonld == [] and meta.opengraph == {"og:x": "y"} and meta.text == "end"
    assert peak < 4 << 20, peak  # Python-side allocations; the body itself is the caller's


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_give_a_result_never_an_error(data: bytes) -> None:
    meta = read_html(data, "http://a.test/")
    assert len(meta.title) <= MAX_VALUE and isinstance(meta.jsonld, list)


def test_links_say_what_their_targets_are_about() -> None:
    meta = read_html(b"""<html><head><base href="/docs/"><base href="/other/"></head><body>
        <a href="intro.html">Read the <b>introduction</b></a>
        <a href="x.html" rel="nofollow">paid</a> <a href="empty.html"> </a>
        <a href="a.html">first<a href="b.html">second</a>
        <script>document.write('<a href="s.html">scripted</a>')</script>
        <a name="anchor-only">no href</a><a href="last.html">unclosed""")
    assert meta.base == "/docs/"
    assert meta.anchors == [("intro.html", "Read the introduction"), ("a.html", "first"),
                            ("b.html", "second"), ("last.html", "unclosed")]


def test_anchors_are_bounded() -> None:
    many = b"".join(b'<a href="/p%d">%s</a>' % (i, b"w " * 500) for i in range(MAX_ANCHORS + 50))
    meta = read_html(many)
    assert len(meta.anchors) == MAX_ANCHORS
    assert all(len(text) <= MAX_ANCHOR_TEXT for _, text in meta.anchors)


# -- SimHash ----------------------------------------------------------------------------


def corpus(seed: int, words: int = 600) -> str:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(3000)]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


def test_the_same_text_the_same_hash_and_case_and_spacing_do_not_matter() -> None:
    text = corpus(1)
    assert simhash(text) == simhash("  " + text.upper().replace(" ", "\n  "))
    assert simhash("") == 0 and simhash("one") == simhash("ONE") != 0


def test_pages_differing_in_boilerplate_are_near_and_different_pages_are_not() -> None:
    # 7 words of 600 differ (about 2% of the shingles): a few bits flip, by chance (the
    # bits whose shingle count was near half), so this holds for about half the bodies;
    # unrelated pages are ~32 bits apart
    close = []
    for seed in range(2, 32):
        body = corpus(seed)
        a = simhash("Home About Contact " + body + " (c) 2026 Example Inc")
        b = simhash("Start Team Jobs Blog " + body + " all rights reserved")
        close.append(distance(a, b))
        assert distance(a, simhash(corpus(seed + 100))) > 3 * NEAR
    assert sum(d <= NEAR for d in close) >= len(close) // 2, close
    assert max(close) <= 3 * NEAR, close


def test_the_hash_is_the_same_in_every_process() -> None:
    # stored in indexes and exports: it must not depend on PYTHONHASHSEED or the process
    text = corpus(3)
    code = ("import sys; from crawler.read.simhash import simhash; "
            "print(simhash(sys.stdin.read()))")
    for seed in ("0", "12345"):
        done = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True,
                              text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert int(done.stdout) == simhash(text)


# Hashes of the release that stored them (indexes, exports): a faster simhash must give
# the same. The large text is past simhash.KEEP_POWERS, the medium one grows its tables.
RELEASED = [
    ("Granite quarries of the north", 15809253759431754296),
    (" ".join(f"w{i % 997}x{i % 13}" for i in range(3000)), 12682803820898552827),
    (" ".join(f"tok{i}" for i in range(20000)) + " " + "z" * 200_000, 6246254062022904803),
]


def test_hashes_are_the_released_ones_whatever_came_before() -> None:
    for order in (RELEASED, RELEASED[::-1], RELEASED + RELEASED):
        for text, value in order:
            assert simhash(text) == value, text[:40]


def test_distance_counts_differing_bits() -> None:
    assert distance(0, 0) == 0 and distance(0, (1 << 64) - 1) == 64
    assert distance(0b1011, 0b0001) == 2 and near(0b111, 0) and not near(0b1111, 0)


@pytest.mark.parametrize("words", [1, 2, 3, 4])
def test_short_texts_hash_to_64_bits(words: int) -> None:
    value = simhash(" ".join(f"x{i}" for i in range(words)))
    assert 0 < value < 1 << 64
    assert json.loads(json.dumps(f"{value:016x}")) == f"{value:016x}"
