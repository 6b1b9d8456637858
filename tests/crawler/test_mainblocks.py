"""The index's main-content rule (crawler.read.mainblocks): the run of blocks worth the
most, on resiliparse's minimal-HTML rendering of real markup, and on hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.read.mainblocks import (
    BLOCK_COST,
    LINK_WEIGHT,
    best_run,
    blocks,
    code_share,
    main_blocks,
    worth,
    worths,
)
from crawler.read.pagetext import read_html

PROSE = ("The harbour reopened on Monday after a storm closed it for a week; fishermen said "
         "the damage to the quay was smaller than they had feared, and the ferries run again.")


def menu(n: int, prefix: str = "menu") -> str:
    return "".join(f'<a href="/{prefix}{i}">{prefix} entry {i}</a> ' for i in range(n))


def test_a_block_is_worth_its_text_less_its_links_less_a_cost() -> None:
    assert worth("word " * 10) == len(("word " * 10).strip()) - BLOCK_COST
    linked = '<p>see <a href="/x">the manual</a> now</p>'
    assert worth(linked) == len("see the manual now") - LINK_WEIGHT * len("the manual") \
        - BLOCK_COST
    assert worth('<a href="/a">all of it a link</a>') < -len("all of it a link") + 1
    assert worth("") == 0.0 and worth("<p> </p>") == 0.0  # empty: neither joins nor splits


def test_the_best_run_is_the_largest_sum_of_consecutive_blocks() -> None:
    assert best_run([-5.0, 10.0, -3.0, 8.0, -20.0, 6.0]) == (1, 4)
    assert best_run([-1.0, -2.0]) == (0, 0)
    assert best_run([]) == (0, 0)
    assert best_run([5.0, -10.0, 5.0]) == (0, 1)  # two equal runs: the first


def test_a_pre_is_one_block_however_many_lines() -> None:
    outline = "<h2>Use</h2>\n<pre>a = 1\nb = 2\n\nc = 3</pre>\nafter"
    assert blocks(outline) == ["<h2>Use</h2>", "<pre>a = 1\nb = 2\n\nc = 3</pre>", "after"]
    assert blocks("<pre>x</pre>\n<pre>y\nz</pre>") == ["<pre>x</pre>", "<pre>y\nz</pre>"]
    assert blocks("one\n\ntwo") == ["one", "", "two"] and blocks("") == [""]
    # (resiliparse closes every <pre>: one left open is lines like the others)
    assert blocks("<pre>never closed\nstill code") == ["<pre>never closed", "still code"]


# fragments of resiliparse's minimal HTML, and what it never writes (a tag across lines)
FRAGMENTS = st.sampled_from([
    "word", "a longer line of plain prose for the main content", "<p>a paragraph</p>",
    '<a href="/x">a link</a>', '<p>see <a href="/y">here</a> and <a href="/z">there</a></p>',
    "<h2>A heading</h2>", "<pre>code = 1\nmore = 2</pre>", "<pre>", "</pre>", "\n", "\n\n",
    " ", '<a href="/q">unclosed', "<br>", '<a href="/c">two<br>lines</a>',
    '<a href="/w\nx">split tag</a>', "&amp; é 日本"])


@given(st.lists(FRAGMENTS, max_size=40).map("".join))
@settings(max_examples=300, deadline=None)
def test_worths_are_each_blocks_worth(outline: str) -> None:
    """The batch (the tags of many lines at once) gives what block by block gives."""
    parts, values = worths(outline)
    assert parts == blocks(outline)
    assert values == [worth(block) for block in parts]


def test_menus_and_link_lists_around_an_article_are_left_out() -> None:
    """No markup names them (no nav, no class): their links do."""
    page = (f"<html><head><title>Harbour</title></head><body><div>{menu(8)}</div>"
            f"<div><div>Share</div><div>Log in</div></div><article><h1>Harbour reopens</h1>"
            f"<p>{PROSE}</p><ul><li>Quay: repaired</li><li>Ferries: running</li></ul>"
            f'<p>Timetables are on <a href="/t">the port\'s page</a>, as before.</p>'
            f"<p>{PROSE}</p></article><div><h3>Related</h3>{menu(10, 'story')}</div>"
            "<div>Copyright the Harbour Times</div></body></html>")
    text = read_html(page, "http://news.test/harbour").text
    assert "Harbour reopens" in text and "Quay: repaired" in text  # heading, list items
    assert "the port's page" in text  # a paragraph with a link inside the article
    assert text.count("fishermen") == 2
    assert "menu entry" not in text and "story entry" not in text and "Log in" not in text
    assert "Related" not in text


def test_a_heading_starts_a_run_and_ends_none() -> None:
    """A short heading costs nothing: the article's own comes with it; one that a list of
    links follows ("See also", "Related") is left out with its list."""
    page = (f"<html><body><h1>Lock</h1><p>{PROSE}</p><h2>See also</h2>"
            f"<div>{menu(8, 'other')}</div></body></html>")
    text = read_html(page, "http://docs.test/lock.html").text
    assert text.startswith("Lock The harbour") and "See also" not in text, text
    assert worth("<h1>Lock</h1>") == 4.0 and worth("<p>Lock</p>") == 4 - BLOCK_COST


def test_documentation_keeps_its_lists_notes_and_code() -> None:
    """What resiliparse's rule dropped (docs/SEARCH.md): a DocBook variable list whose
    items link, an admonition, a code listing, a release note's short items."""
    items = "".join(f'<dt><span class="term"><code class="envar">PGVAR{i}</code></span></dt>'
                    f'<dd><p>behaves the same as the <a href="#p{i}">param{i}</a> '
                    "connection parameter.</p></dd>" for i in range(8))
    page = ('<html><body><div class="navheader">Prev Up Home Next</div>'
            f'<div class="sect1"><h2>Environment Variables</h2><p>{PROSE}</p>'
            f'<div class="variablelist"><dl>{items}</dl></div>'
            '<div class="note"><h3>Note</h3><p>Short, but part of it.</p></div>'
            "<ul><li>Fixed a crash.</li><li>Faster.</li></ul>"
            f"<pre>export PGVAR0=1\nexport PGVAR1=2</pre><p>{PROSE}</p></div>"
            '<div class="navfooter">Prev Home Next</div></body></html>')
    text = read_html(page, "http://docs.test/envars.html").text
    for kept in ("PGVAR7", "param3 connection parameter", "Short, but part of it",
                 "export PGVAR1=2", "Fixed a crash.", "Faster."):
        assert kept in text, kept
    assert "Prev" not in text and "Home" not in text


def test_a_page_of_short_lines_is_read_whole() -> None:
    """No block pays for its cost (a poem, a list of names): all of the page's text."""
    lines = "".join(f"<p>line {i}</p>" for i in range(20))
    text = read_html(f"<html><body>{lines}</body></html>", "http://p.test/").text
    assert "line 0" in text and "line 19" in text


@pytest.mark.timeout(60)
def test_hostile_renderings_cost_what_their_size_does() -> None:
    """Unclosed links, a million short lines, one line of a megabyte: each one pass (a
    quadratic step would take hours here; pytest-timeout fails it)."""
    links = "<p>" + '<a href="/x">word</a> ' * 200_000 + "</p>"
    assert main_blocks(links) == ""  # all of it in links: worth nothing
    unclosed = "<html><body><p>" + '<a href="/x">word ' * 200_000 + "</p></body></html>"
    assert "word word" in read_html(unclosed, "http://p.test/").text
    lines = "\n".join(["x"] * 1_000_000)
    assert main_blocks(lines) == ""
    long_line = "word " * 200_000
    heading = "<h1>The title of it</h1>"
    assert main_blocks("\n".join([heading, long_line, '<a href="/">home</a>'])) \
        == heading + "\n" + long_line


def test_the_code_share_of_a_listing_and_of_prose() -> None:
    assert code_share("<p>abc</p>\n<pre>defghi</pre>") == pytest.approx(6 / 10)  # (a \n)
    assert code_share("<p>prose only</p>") == 0.0 and code_share("") == 0.0
    listing = "<pre>class Widget:\n    def spin(self): ...</pre>"
    assert code_share(listing) == 1.0
    text = read_html(f"<html><body><h1>widget.py</h1>{listing * 40}</body></html>",
                     "http://p.test/_modules/widget.html")
    assert text.code > 0.9
    assert read_html(f"<html><body><p>{PROSE}</p></body></html>", "http://p.test/").code == 0
