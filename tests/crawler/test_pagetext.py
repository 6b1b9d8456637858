"""crawler.read.pagetext: what the search index and ``export --markdown`` read from a page
(resiliparse underneath): its fields and their bounds on hostile pages, the links with
their base, the language, and the Markdown of the main content."""

from __future__ import annotations

from crawler.read.pagetext import (
    MAX_ANCHOR_TEXT,
    MAX_DESCRIPTION,
    MAX_LINKS,
    MAX_TITLE,
    defined_names,
    detect_language,
    main_or_whole,
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


def test_the_names_a_page_defines_are_its_ids() -> None:
    """Sphinx's and DocBook's definitions, an <a name>, each once; not a <meta name>, a
    form field's name, an id a generator numbers, a value with a space, a data-id, or
    an id written in the text (a code sample)."""
    html = ('<html><head><meta name="description" content="x"><meta name=viewport></head>'
            '<body><section id="module-os.path"><h1 id=\'s1\'>os.path</h1>'
            '<dl class="py function"><dt class="sig" id="os.path.join">join()</dt></dl>'
            '<div class=sect2 id="LIBPQ-ENVARS"><a name="GUC-WORK-MEM"></a>'
            '<p id="index-0">x</p><span id="id12"></span><input name="q">'
            '<p id="two words">y</p><dt id="os.path.join">again</dt>'
            '<img alt="a id=&quot;fake&quot;"> <dd id="a&amp;b"></dd><p data-id="data">z</p>'
            '<pre>&lt;div id="in-text"&gt;</pre></div></body></html>')
    assert defined_names(html) == "module-os.path os.path.join LIBPQ-ENVARS GUC-WORK-MEM a&b"
    assert read_html(html, "http://e.test/").names == defined_names(html)
    # bounded: names up to the limit, whole ones only
    many = "".join(f'<dt id="mod.name{i:04d}">n</dt>' for i in range(5_000))
    cut = defined_names(many, limit=1_000)
    assert cut.split() == [f"mod.name{i:04d}" for i in range(len(cut.split()))]
    assert 950 <= len(cut) <= 1_000


# DocBook's layout (PostgreSQL's manual, libpq-envars.html): a navigation bar, then a
# section whose content is a list near the top of the body, each item with a link: the
# main-content rule drops such a list (its depth; its links) and keeps the bar.
DOCBOOK = (
    '<html><head><title>Environment Variables</title></head><body><div class="navheader">'
    '<table><tr><td><a href="p.html">Prev</a></td><td><a href="u.html">Up</a></td>'
    '<td><a href="index.html">Home</a></td><td><a href="n.html">Next</a></td></tr></table>'
    '</div><div class="sect1" id="LIBPQ-ENVARS"><h2>Environment Variables</h2><p>These '
    'variables select default connection parameter values.</p><div class="itemizedlist">'
    '<ul class="itemizedlist">' + "".join(
        f'<li><p><code>{name}</code> behaves the same as the <a href="c.html#{param}">'
        f'{param}</a> connection parameter, and {more}.</p></li>'
        for name, param, more in (
            ("PGHOST", "host", "names the server's host or its socket directory"),
            ("PGPORT", "port", "names the port number the server listens on"),
            ("PGDATABASE", "dbname", "names the database to connect to by default"),
            ("PGUSER", "user", "names the role to connect as when none is given"),
            ("PGPASSFILE", "passfile", "names the file the passwords are read from")))
    + '</ul></div></div><div class="navfooter"><a href="p.html">Prev</a> '
    '<a href="n.html">Next</a></div></body></html>')


def test_a_list_the_main_content_rule_drops_is_kept_and_the_nav_bars_are_not() -> None:
    page = read_html(DOCBOOK, "http://e.test/libpq-envars.html")
    for name in ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSFILE"):
        assert name in page.text, page.text
    assert "connection parameter values" in page.text
    assert not {"Prev", "Up", "Home", "Next"} & set(page.text.split()), page.text
    assert "LIBPQ-ENVARS" in page.names.split()
    # its Markdown too
    md = page_markdown(PageRecord(url="http://e.test/libpq-envars.html", status=200,
                                  fetched_at=1.0, depth=0,
                                  content_type="text/html", body=DOCBOOK.encode()))
    assert md is not None and "PGPASSFILE" in md and "Prev" not in md, md


def test_a_table_of_contents_the_rule_drops_stays_dropped() -> None:
    """What the rule drops is mostly links (a contents page): the rule was right."""
    contents = "".join(f'<li><a href="ch{i}.html">Chapter {i}: the {word} module</a></li>'
                       for i, word in enumerate(("granite", "basalt", "quartz", "mica",
                                                 "feldspar", "gneiss", "schist", "slate")))
    html = ('<html><body><div class="body"><h1>Data types</h1><p>The modules described in '
            f'this chapter provide a variety of data types.</p><ul>{contents}</ul></div>'
            '</body></html>')
    page = read_html(html, "http://e.test/datatypes.html")
    assert "variety of data types" in page.text
    assert "feldspar" not in page.text, page.text


def test_main_or_whole() -> None:
    prose = "<p>" + "word " * 100 + "</p>"
    links = "".join(f'<a href="/{i}">a link of its own {i}</a>' for i in range(30))
    most = "<p>" + "word " * 60 + "</p>"
    assert main_or_whole(most, prose) == most  # it kept most: kept
    assert main_or_whole("<p>word word</p>", prose) == prose  # it dropped the prose
    assert main_or_whole("<p>word word</p>", prose + links) == "<p>word word</p>"  # links
    assert main_or_whole("", links) == links and main_or_whole("", "") == ""


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
