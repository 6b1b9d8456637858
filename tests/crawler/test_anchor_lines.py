"""The anchor lines a page's links give the index (crawler.search.reading.anchor_lines):
one per followed link with text to another page, to the shard that owns its target; a
link's target resolved once a page however many links name it (fragments aside)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.exceptions import URLError
from crawler.read.pagetext import PageText
from crawler.search.reading import anchor_lines
from crawler.state.pages import PageRecord
from crawler.state.shards import owner
from crawler.web.urls import host_of, normalize, url_key

URL = "http://a.test/dir/p.html"


def page(url: str = URL) -> PageRecord:
    return PageRecord(url, 200, 1.7e9, 0, final_url=url, content_type="text/html")


def lines(text: PageText, count: int = 1, url: str = URL) -> list[tuple[int, str, str]]:
    out = []
    for dest, line in anchor_lines(page(url), text, count, frozenset(range(count))):
        key, words = line.decode().rstrip("\n").split("\t")
        out.append((dest, key, words))
    return out


def key_of(url: str) -> str:
    return url_key(url).hex()


def test_fragments_name_the_page_they_are_in() -> None:
    text = PageText(links=[("#top", "Top"), ("q.html#one", "One"), ("q.html#two", "Two"),
                           ("http://b.test/#x", "Bee"), ("mailto:x@y.test", "Mail"),
                           ("p.html", "Self"), ("", "Empty")])
    q = key_of("http://a.test/dir/q.html")
    assert lines(text) == [(0, q, "One"), (0, q, "Two"), (0, key_of("http://b.test/"), "Bee")]


def test_a_base_element_moves_where_a_fragment_points() -> None:
    """``<base href>``: "#top" is the base's page, another page than this one."""
    text = PageText(links=[("#top", "Top"), ("#end", "End")], base="http://a.test/other.html")
    other = key_of("http://a.test/other.html")
    assert lines(text) == [(0, other, "Top"), (0, other, "End")]


HREFS = st.sampled_from([
    "#a", "#b", "", "q.html", "q.html#x", "Q.html", "../up.html#y", "?k=1", "?k=1#z",
    "http://b.test/", "http://b.test/#f", "//c.test/p", "https://d.test:8443/x#1",
    "mailto:m@x.test", "javascript:void(0)", "http://[bad", " q.html ", "p.html", "/dir/p.html"])


@given(st.lists(st.tuples(HREFS, st.sampled_from(["one", "two words"])), max_size=30),
       st.sampled_from([1, 3, 16]))
@settings(max_examples=200, deadline=None)
def test_each_link_is_resolved_as_alone(links: list[tuple[str, str]], count: int) -> None:
    """The lines are those of resolving every link by itself."""
    expected = []
    own = url_key(URL)
    for href, words in links:
        try:
            target = normalize(href, URL)
        except URLError:
            continue
        key = url_key(target)
        if key != own:
            dest = owner(host_of(target), count) if count > 1 else 0
            expected.append((dest, key.hex(), words))
    assert lines(PageText(links=links), count) == expected
