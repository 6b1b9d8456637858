"""crawler.read.mdrender: Markdown of resiliparse's minimal HTML, on outlines written as
resiliparse writes them and on pages read through it: links, code, escapes, lists with
their markers and nesting, tables as GitHub's, and the export's index (issue 45)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from crawldir_helpers import ordinary_pages, write_crawl
from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree

from crawler.cli import main
from crawler.read.markdown import INDEX
from crawler.read.mdrender import mark_tables, outline_markdown
from crawler.read.pagetext import page_markdown
from crawler.state.pages import PageRecord


def page(body: str) -> str:
    """The Markdown export of a page whose main content is ``body``."""
    md = page_markdown(PageRecord(
        url="http://e.test/d/p.html", status=200, fetched_at=1.0, depth=0,
        content_type="text/html",
        body=f"<html><body><main><h1>Page</h1>{body}</main></body></html>".encode()))
    assert md is not None
    return md


''' + open('/tmp/old_md_test.py').read().rstrip() + '''


def test_lists_have_their_markers_numbers_and_nesting() -> None:
    md = page('<p>Steps:</p><ol><li>Install it</li><li>Configure <a href="c.html">it</a>'
              '<ul><li>the host</li><li>- the port</li></ul></li><li>Run it</li></ol>'
              '<ul><li><p>One paragraph.</p><p>A second one.</p></li><li>Two</li></ul>'
              '<p>After the lists.</p>')
    assert ("Steps:\n\n1. Install it\n2. Configure [it](http://e.test/d/c.html)\n"
            "   - the host\n   - \\- the port\n\n3. Run it\n") in md, md
    # an item's later paragraph is indented to its text, so it stays in the item
    assert "- One paragraph.\n\n  A second one.\n\n- Two\n\nAfter the lists.\n" in md, md


def test_text_after_a_nested_list_stays_in_its_item() -> None:
    md = page("<ul><li>outer<ul><li>inner</li></ul>more of outer</li></ul>")
    assert "- outer\n  - inner\n\n  more of outer\n" in md, md


def test_code_in_a_list_item_is_indented_with_it() -> None:
    md = page("<ul><li>run:<pre>make\n  install</pre></li></ul>")
    assert "- run:\n\n  ```\n  make\n    install\n  ```\n" in md, md


def test_tables_are_githubs_with_a_header_and_padded_rows() -> None:
    # PostgreSQL's "Table 8.2. Numeric Types", cut short; a cell with a pipe, an empty
    # one, one with a link
    md = page('<p>Table 8.2. Numeric Types</p><table><thead><tr><th>Name</th>'
              '<th>Storage Size</th><th>Range</th></tr></thead><tbody><tr><td>smallint</td>'
              '<td>2 bytes</td><td>-32768 to +32767</td></tr><tr><td><a href="int.html">'
              'integer</a></td><td></td><td>a | b</td></tr><tr><td>bigint</td></tr>'
              '</tbody></table><p>After.</p>')
    assert ("Table 8.2. Numeric Types\n\n| Name | Storage Size | Range |\n"
            "| --- | --- | --- |\n| smallint | 2 bytes | -32768 to +32767 |\n"
            "| [integer](http://e.test/d/int.html) |  | a \\| b |\n| bigint |  |  |\n\n"
            "After.\n") in md, md


def test_tabs_in_preformatted_text_are_no_table() -> None:
    outline = "<pre>a\t\tb\nc\t\td</pre>\n\nx\t\ty\nz\t\tw"
    marked = mark_tables(outline)
    assert marked.startswith("<pre>a\t\tb\nc\t\td</pre>") and "<table>" in marked
    md = outline_markdown(outline, "http://e.test/")
    assert "```\na\t\tb\nc\t\td\n```" in md and "| x | y |\n| --- | --- |\n| z | w |" in md
    # one line of cells is no table (a tab-separated line of prose)
    assert mark_tables("p\t\tq\n\nr") == "p\t\tq\n\nr"


def test_the_outline_resiliparse_writes_is_what_mark_tables_reads() -> None:
    """The table format this module reads is resiliparse's: kept honest against it."""
    tree = HTMLTree.parse("<html><body><table><tr><th>a</th><th>b</th></tr><tr><td>1</td>"
                          "<td>2</td></tr></table><ul><li>x</li></ul></body></html>")
    outline = extract_plain_text(tree, preserve_formatting="minimal_html", links=True,
                                 list_bullets=True)
    assert "a\t\tb\n1\t\t2" in outline and "<ul>" in outline and "<li>x</li>" in outline
    assert re.search(r"\| a \| b \|\n\| --- \| --- \|\n\| 1 \| 2 \|",
                     outline_markdown(outline, "http://e.test/"))


def test_the_export_has_an_index_from_each_url_to_its_file(tmp_path: Path) -> None:
    pages = ordinary_pages(5)
    data = write_crawl(tmp_path / "crawl", pages)
    assert main(["export", str(data), "--markdown", str(tmp_path / "md"), "--quiet"]) == 0
    lines = [json.loads(line) for line in
             (tmp_path / "md" / INDEX).read_text(encoding="utf-8").splitlines()]
    assert sorted(line["url"] for line in lines) == sorted(pages)
    for line in lines:
        text = (tmp_path / "md" / line["file"]).read_text(encoding="utf-8")
        assert f'url: "{line["url"]}"' in text and f'title: "{line["title"]}"' in text
        assert line["title"].startswith("About ")
    # an export with its index is still one --force may replace
    assert main(["export", str(data), "--markdown", str(tmp_path / "md"), "--force",
                 "--quiet"]) == 0
    assert len((tmp_path / "md" / INDEX).read_text().splitlines()) == len(pages)


def test_inline_code_is_code_as_written() -> None:
    """Sphinx writes inline code as <code><span class="pre">...</span></code>; code is not
    escaped (the issue's `a\\[len(a):\\] = \\[x\\]`), a backtick in it takes a longer fence,
    code in a link or a heading or a table's cell stays code; a page's own RS characters
    are no code marks."""
    md = page('<h2>The <code>os</code> module</h2><p>Use <code class="docutils literal">'
              '<span class="pre">a[len(a):]</span> <span class="pre">=</span> '
              '<span class="pre">[x]</span></code> now, or <code>x`y</code>, or '
              '<a href="l.html"><code>link()</code></a>.</p><table><tr><th>op</th>'
              '<th>means</th></tr><tr><td><code>a|b</code></td><td>or</td></tr></table>'
              '<pre><code>print(1)\n</code></pre><p>*not* code \x1e here</p>')
    assert "## The `os` module\n" in md, md
    assert ("Use `a[len(a):] = [x]` now, or ``x`y``, or "
            "[`link()`](http://e.test/d/l.html).") in md, md
    assert "| `a\\|b` | or |" in md and "```\nprint(1)\n```" in md, md
    assert "\\*not\\* code here" in md and "\x1e" not in md, md


def test_a_table_whose_cells_hold_paragraphs_is_still_a_table() -> None:
    """Sphinx writes each cell as <td><p>...</p></td>; resiliparse wrote those as
    paragraphs, one a cell."""
    md = page('<p>Conversion table</p><table><tr><th><p>TOML</p></th><th><p>Python</p></th>'
              '</tr><tr><td><p>table</p><p>or <a href="t.html">inline table</a></p></td>'
              '<td><p>dict</p></td></tr><tr><td><p>string</p></td><td><p>str</p></td></tr>'
              '</table>')
    assert ("| TOML | Python |\n| --- | --- |\n"
            "| table or [inline table](http://e.test/d/t.html) | dict |\n| string | str |"
            ) in md, md


def test_two_code_spans_side_by_side_stay_two() -> None:
    # (resiliparse drops the text node " -> " between them: the arrow is lost, not the
    # spans' bounds)
    md = page("<p>cast <code>inet '192.168.1.5'</code> \u2192 <code>t</code> now</p>")
    assert "cast `inet '192.168.1.5'` `t` now" in md, md


def test_blocks_without_paragraph_tags_are_paragraphs() -> None:
    """resiliparse ends a <div>, <dt> or <dd> with a line break and no tag: each is a
    paragraph, not one run-on line; a link holding blocks stays one link; links one a
    line (a contents list of <a>s) stay one a line; <br> stays a line break."""
    md = page('<div>First block of text.</div><div>Second, with <a href="x">a <b>link</b>'
              '</a> in it.</div><a href="c"><div>Card title</div><div>card text</div></a>'
              '<dl><dt>term one</dt><dd>its definition</dd></dl><div><a href="a1">one</a>'
              '</div><div><a href="a2">two</a></div><p>a<br>b</p>')
    assert ("First block of text.\n\nSecond, with [a link](http://e.test/d/x) in it.\n\n"
            "[Card title card text](http://e.test/d/c)\n\nterm one\n\nits definition\n\n"
            "[one](http://e.test/d/a1)\n\n[two](http://e.test/d/a2)\n\na\\\nb\n") in md, md


def test_images_are_written_with_their_source_made_absolute() -> None:
    md = page('<p>See <img src="../img/a b.png" alt="the [big] diagram"> here and '
              '<a href="z.html"><img src=logo.svg alt=Logo></a>.</p><p>'
              '<img src="data:image/png;base64,AAAA" alt="inline one"> <img alt="no source">'
              " <IMG SRC='/x.gif'></p><table><tr><th>a</th><th>b</th></tr><tr><td>"
              '<img src="c.png" alt="x|y"></td><td>2</td></tr></table>')
    assert ("See ![the \\[big\\] diagram](http://e.test/img/a%20b.png) here and "
            "[![Logo](http://e.test/d/logo.svg)](http://e.test/d/z.html).") in md, md
    # a data: URI is bytes, not an address: its alt text stays
    assert "inline one no source ![](http://e.test/x.gif)" in md, md
    assert "| ![x\\|y](http://e.test/d/c.png) | 2 |" in md, md


def test_admonitions_are_block_quotes() -> None:
    """Sphinx's and DocBook's notes and warnings: quoted, nested in one another or in a
    list item; the page's own control characters are no marks."""
    md = page('<p>Before.</p><div class="admonition note"><p class="admonition-title">Note'
              '</p><p>The note.</p><ul><li>a point</li></ul><div class="admonition warning">'
              '<p>Nested warning.</p></div><p>back in the note</p></div><p>After.</p><ul>'
              '<li>item<div class="note"><h3 class="title">Note</h3><p>DocBook note.</p>'
              '</div></li><li>next</li></ul><p>End \x1d\x1a.</p>')
    assert ("Before.\n\n> Note\n>\n> The note.\n>\n> - a point\n>\n> > Nested warning.\n>\n"
            "> back in the note\n\nAfter.\n\n- item\n\n  > ### Note\n  >\n"
            "  > DocBook note.\n\n- next\n\nEnd .\n") in md, md
