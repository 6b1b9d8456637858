"""tools/bench_markdown.py runs end to end on three small hand-written pages (DocBook-like,
Sphinx-like, HTML5; no apt package): the structure it counts in their HTML is what they
hold outside navigation, ours keeps all of it, and trafilatura is measured beside it when
installed. Its Markdown counting is checked on a hand-written text too."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tools.bench_markdown import KINDS, code_spans, count_markdown

REPO = Path(__file__).resolve().parents[2]
TOOL_TIMEOUT = 120

# DocBook XSL's shape: the navheader/navfooter bars are tables of links (not counted)
DOCBOOK = """<!DOCTYPE html><html><head><title>Widgets</title></head><body>
<div class="navheader"><table width="100%" summary="Navigation header">
<tr><th colspan="3" align="center">Chapter 2. Widgets</th></tr>
<tr><td width="20%"><a accesskey="p" href="intro.html">Prev</a></td><th width="60%">Part I.
Tutorial</th><td width="20%"><a accesskey="n" href="api.html">Next</a></td></tr>
</table><hr /></div>
<div class="chapter"><div class="titlepage"><div><div><h2 class="title"><a id="widgets"></a>
Chapter 2. Widgets</h2></div></div></div>
<p>Call <code class="function">widget_new</code> to make a widget and
<code class="literal">widget_free</code> to drop it.</p>
<div class="table"><p class="title"><strong>Table 2.1. Widget sizes</strong></p>
<div class="table-contents"><table class="table" summary="Widget sizes" border="1">
<thead><tr><th>Name</th><th>Size</th></tr></thead>
<tbody><tr><td>small</td><td>1 kB</td></tr><tr><td>large</td><td>8 kB</td></tr></tbody>
</table></div></div>
<ul class="itemizedlist"><li class="listitem"><p>Widgets are cheap to make.</p></li>
<li class="listitem"><p>Gadgets hold widgets:</p><ul><li>a box of them</li>
<li>a crate of them</li></ul></li>
<li class="listitem"><p>Both can be freed at any time.</p></li></ul>
<pre class="programlisting">widget_t *w = widget_new();
widget_free(w);</pre>
<div class="sect1"><h3 class="title">Freeing widgets</h3>
<p>A freed widget is gone for good, and so are the gadgets that held it.</p></div></div>
<div class="navfooter"><hr /><table width="100%">
<tr><td><a href="intro.html">Prev</a></td><td><a href="index.html">Up</a></td>
<td><a href="api.html">Next</a></td></tr>
<tr><td>Introduction</td><td><a href="index.html">Home</a></td><td>API reference</td></tr>
</table></div></body></html>"""

# Sphinx's shape: the related bar, the sidebar and the footer are not counted
SPHINX = """<!DOCTYPE html><html><head><title>API reference</title></head><body>
<div class="related" role="navigation" aria-label="related navigation"><h3>Navigation</h3>
<ul><li><a href="genindex.html">index</a></li><li><a href="guide.html">previous</a> |</li>
</ul></div>
<div class="document"><div class="documentwrapper"><div class="bodywrapper">
<div class="body" role="main"><section id="api">
<h1>API reference<a class="headerlink" href="#api" title="Permalink">¶</a></h1>
<p>The module <code class="docutils literal notranslate"><span class="pre">widgets</span></code>
has two calls, and both of them are documented on this page of the manual.</p>
<section id="calls"><h2>Calls<a class="headerlink" href="#calls">¶</a></h2>
<ol class="arabic simple">
<li><p><code class="xref py py-func docutils literal notranslate"><span class="pre">make()</span>
</code> makes one widget.</p></li>
<li><p><code class="xref py py-func docutils literal notranslate"><span class="pre">drop()</span>
</code> drops one widget.</p></li></ol>
<div class="highlight-python3 notranslate"><div class="highlight"><pre><span></span><span
class="kn">import</span> <span class="nn">widgets</span>
<span class="n">widgets</span><span class="o">.</span><span class="n">make</span>()
</pre></div></div>
<p>Or from the shell, where the command does the same:</p>
<div class="highlight-shell notranslate"><div class="highlight"><pre><span></span>$ widgets --make
</pre></div></div>
</section></section></div></div></div>
<div class="sphinxsidebar" role="navigation" aria-label="main navigation">
<h3>This page</h3><ul><li><a href="#calls">Calls</a></li></ul><p><code>search</code></p></div>
</div>
<div class="footer">&#169; Copyright 2024. Version <code>v1.0</code>.</div>
</body></html>"""

# HTML5 landmarks: header (with its own h1 and nav), aside and footer are not counted; a
# table of one row, or of one column, is not a table
HTML5 = """<!DOCTYPE html><html><head><title>Widget docs</title></head><body>
<header><h1>Widget docs</h1><nav><ul><li><a href="guide.html">Guide</a></li>
<li><a href="api.html">API</a></li></ul></nav></header>
<main><h1>Welcome</h1><p>Start with <code>widgets.make()</code>, the call that makes a
widget, and read on.</p>
<table><tr><td>make</td><td>makes a widget</td></tr><tr><td>drop</td><td>drops a widget</td>
</tr><tr><td>size</td><td>says how big a widget is</td></tr></table>
<table><tr><td>one row only</td><td>so not a table</td></tr></table>
<table><tr><td>one cell a row</td></tr><tr><td>so not a table either</td></tr></table>
<h2>Next steps</h2><ul><li>Read the guide.</li><li>Read the API reference.</li></ul>
</main>
<aside><h2>Related</h2><ul><li>nothing at all</li></ul></aside>
<footer><p>Made with <code>care</code></p><table><tr><td>a</td><td>b</td></tr>
<tr><td>c</td><td>d</td></tr></table></footer>
</body></html>"""

PAGES = {"guide.html": DOCBOOK, "sub/api.html": SPHINX, "index.html": HTML5}
# by hand, outside the navigation: DocBook, Sphinx, HTML5
EXPECTED = {"tables": 1 + 0 + 1, "list_items": 5 + 2 + 2, "code_blocks": 1 + 2 + 0,
            "headings": 2 + 2 + 2, "inline_code": 2 + 3 + 1}


def write_site(root: Path) -> None:
    for name, html in PAGES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")


def run_tool(args: list[str], env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "tools/bench_markdown.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False,
                          env=env)


def run_on_site(tmp_path: Path, env: dict[str, str] | None = None,
                ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    site, out = tmp_path / "site", tmp_path / "out.json"
    write_site(site)
    proc = run_tool(["--html-root", str(site), "--out", str(out)], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_counts_the_pages_structure_and_ours_keeps_it(tmp_path: Path) -> None:
    proc, res = run_on_site(tmp_path)
    assert res["pages"] == len(PAGES)
    assert {k: res["kinds"][k]["html"] for k in KINDS} == EXPECTED
    for kind in KINDS:
        assert res["kinds"][kind]["ours"]["kept_share"] == 1.0, (kind, res["kinds"][kind])
    assert res["packages"]["site"]["pages"] == len(PAGES)
    timing = res["timing"]["ours"]
    assert timing["pages"] == len(PAGES) and timing["empty_pages"] == 0
    assert timing["errors"] == 0 and timing["ms_per_page_median"] > 0
    assert "| kind | HTML count | ours: kept share |" in proc.stdout
    assert "| list_items | 9 | 1.000 |" in proc.stdout
    if importlib.util.find_spec("trafilatura") is not None:
        assert res["converters"] == ["ours", "trafilatura"]
        assert "trafilatura: kept share |" in proc.stdout
        for kind in KINDS:
            share = res["kinds"][kind]["trafilatura"]["kept_share"]
            assert 0.0 <= share <= 1.0
        assert res["timing"]["trafilatura"]["pages"] == len(PAGES)
        assert set(res["ours_below_peer"]["pages"]) == set(KINDS)
    else:  # the peer is not installed: said in one line, ours measured alone
        assert res["converters"] == ["ours"]
        assert "trafilatura is not installed" in proc.stdout


def test_without_trafilatura_only_ours_is_measured(tmp_path: Path) -> None:
    stub = tmp_path / "stub" / "trafilatura"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('raise ImportError("not installed (a test stub)")\n')
    env = {**os.environ, "PYTHONPATH": str(stub.parent)}
    proc, res = run_on_site(tmp_path, env)
    assert res["converters"] == ["ours"] and res["skipped"] == {"trafilatura": "not installed"}
    assert "trafilatura: kept share" not in proc.stdout
    said = [ln for ln in proc.stdout.splitlines() if "trafilatura is not installed" in ln]
    assert len(said) == 1
    assert res["kinds"]["headings"]["html"] == EXPECTED["headings"]
    assert res["kinds"]["headings"]["ours"]["kept_share"] == 1.0


def test_a_missing_html_root_is_one_line(tmp_path: Path) -> None:
    proc = run_tool(["--html-root", str(tmp_path / "nothing"), "--out",
                     str(tmp_path / "out.json")])
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("bench_markdown: --html-root")
    assert not (tmp_path / "out.json").exists()


MARKDOWN = """# Title with `code`

Some `inline` text, ``a `tick` inside``, an escaped \\`not code\\` and a lone ` here.

- one
- two
  1. nested
  2) nested too
* star
+ plus

* * *

-not an item
\\- escaped, not an item

| a | b |
|---|:---:|
| 1 | 2 |

a | b
--- | ---

```python
- x
# y
| --- | --- |
`not counted`
```

~~~~
code
```
still code
~~~~

    indented code is not counted

## Second `one` and `two`
####### seven hashes is not a heading
#no space is not a heading
"""


def test_count_markdown_reads_structure_outside_fences() -> None:
    assert count_markdown(MARKDOWN) == {"tables": 2, "list_items": 6, "code_blocks": 2,
                                        "headings": 2, "inline_code": 5}
    assert count_markdown(None) == dict.fromkeys(KINDS, 0)
    # an unclosed fence runs to the end, as in CommonMark
    assert count_markdown("```\n- a\n# b\n") == {**dict.fromkeys(KINDS, 0), "code_blocks": 1}
    # in a block quote (an admonition), nested, and in a list item: still counted
    assert count_markdown("> ### Note\n>\n> > ```\n> > x\n> > ```\n- item\n\n  ## Sub\n") == {
        **dict.fromkeys(KINDS, 0), "headings": 2, "code_blocks": 1, "list_items": 1}
    # a fence opened on a list item's line (trafilatura's way with an item's leading code)
    assert count_markdown("1. ```\nmake()\n```\nmakes one.\n2. ```\ndrop()\n```\n") == {
        **dict.fromkeys(KINDS, 0), "list_items": 2, "code_blocks": 2}


def test_code_spans_pair_backtick_runs_as_commonmark_does() -> None:
    assert code_spans("`a` and `b`") == 2
    assert code_spans("``a ` b``") == 1
    assert code_spans("`os.``kill`") == 1  # the double run does not close the single one
    assert code_spans("a ` lone backtick") == 0
    assert code_spans("\\`escaped\\` and `real`") == 1
    assert code_spans("` ` and ``") == 0  # only spaces, or nothing, inside
