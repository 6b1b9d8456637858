"""crawler.read.pagetext: what the search index and ``export --markdown`` read from a page
(resiliparse underneath): its fields and their bounds on hostile pages, the links with
their base, the language, and the Markdown of the main content."""

from __future__ import annotations

import re

from crawler.read.pagetext import (
    MAX_ANCHOR_TEXT,
    MAX_DESCRIPTION,
    MAX_LINKS,
    MAX_TITLE,
    detect_language,
    outline_markdown,
    page_markdown,
    read_html,
)
from crawler.state.pages import PageRecord

GERMAN = ("Die alten Häuser der Stadt stehen am Fluss, und die Kinder spielen in den "
          "Gärten hinter den Häusern bis zum späten Abend, wenn die Eltern sie rufen.")


def test_fields_base_and_canonical() -> None:
    page = read_html(
        '<html lang="fr-CA"><head><title>  A   title </title><base href="/docs/">'
        '<meta name="DESCRIPTION" content="the description">'
        '<link rel="alternate canonical" href="../c?x=1"></head><body><nav><a href="/">'
        'Home</a></nav><main><h1>Head one</h1><p>' + GERMAN + ' <a href="sub/p.html">a '
        '<b>sub</b> page</a> <a href="sub/p.html">a sub page</a> <a href="">empty</a></p>'
        '<h4>not read</h4></main><footer>zzfooter</footer></body></html>',
        "http://e.test/x/y.html")
    assert (page.title, page.description) == ("A title", "the description")
    assert page.base == "http://e.test/docs/" and page.canonical == "http://e.test/c?x=1"
    assert page.headings == "Head one" and page.lang == "de"  # the text's, not <html lang>
    assert "Häuser" in page.text and "zzfooter" not in page.text
    assert ("sub/p.html", "a sub page") in page.links  # as written, each pair once
    assert page.links.count(("sub/p.html", "a sub page")) == 1
    assert all(href for href, _ in page.links)


def test_a_short_text_takes_the_declared_language() -> None:
    assert detect_language("ok", "pt-BR") == "pt" and detect_language("ok", "") == ""
    assert detect_language("ok", "not a tag!") == ""
    assert detect_language(GERMAN, "en") == "de"


def test_a_hostile_page_costs_the_bounds() -> None:
    links = "".join(f'<p><a href="/p{i}">link {i}</a></p>' for i in range(60_000))
    page = read_html(f"<html><head><title>{'t' * 50_000}</title><meta name=description "
                     f"content='{'d' * 50_000}'></head><body><main>{links}"
                     f"<p><a href='/long'>{'w ' * 10_000}</a></p></main></body></html>",
                     "http://e.test/", text_limit=1_000)
    assert len(page.links) == MAX_LINKS and len(page.title) == MAX_TITLE
    assert len(page.description) == MAX_DESCRIPTION and len(page.text) <= 1_000
    assert all(len(text) <= MAX_ANCHOR_TEXT for _, text in page.links)
    deep = read_html("<html><body>" + "<b>" * 200_000 + "deep</body></html>", "http://e.test/")
    assert deep.text == "deep"


def test_markdown_of_an_outline() -> None:
    outline = ('<h1>Title &amp; more</h1>\n\n<p>Para with <a href="/x?a=1&amp;b=2">a *link*'
               '</a> and <a href="">no target</a><br>\nnew line</p>\n\n'
               '<pre>code &lt;x&gt; ```\n  indented\n</pre>\n\n<h3>Sub</h3>\n\n'
               '<p># not a heading</p><p>- not a list</p><p>1. not a list</p>'
               '<p><a href="(x)">unclosed')
    md = outline_markdown(outline, "http://e.test/d/")
    assert md.startswith("# Title & more\n\n")
    assert "Para with [a \\*link\\*](http://e.test/x?a=1&b=2) and no target\\\nnew line" in md
    fence = re.search(r"^(`{4,})\ncode <x> ```\n  indented\n\1$", md, re.M)
    assert fence, md  # longer than any run of backticks inside, the code as it is
    assert "\n### Sub\n" in md
    assert "\\# not a heading" in md and "\\- not a list" in md and "1\\. not a list" in md
    assert md.rstrip().endswith("unclosed") and "[unclosed" not in md  # a cut link: text


def test_markdown_of_a_page_and_of_a_text_body() -> None:
    html = PageRecord(url="http://e.test/a.html", status=200, fetched_at=1.0, depth=0,
                      content_type="text/html", body=(
                          "<html><body><nav>menu words</nav><article><h2>Heading</h2><p>"
                          f"{GERMAN}</p></article></body></html>").encode())
    md = page_markdown(html)
    assert md is not None and md.startswith("## Heading\n\n") and "menu words" not in md
    text = PageRecord(url="http://e.test/a.txt", status=200, fetched_at=1.0, depth=0,
                      content_type="text/plain", body=b"# plain *text*\n\nsecond")
    assert page_markdown(text) == "\\# plain \\*text\\* second\n"
    binary = PageRecord(url="http://e.test/a.bin", status=200, fetched_at=1.0, depth=0,
                        content_type="application/octet-stream", body=b"\x00\x01")
    assert page_markdown(binary) is None
