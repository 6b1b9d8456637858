"""tools/bench_search_info.py runs end to end on a tiny Sphinx-like site (its own
objects.inv, no apt package): the judged set is the inventory's, each query's relevant
page is the page the inventory names, and the three systems are scored on it."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOOL_TIMEOUT = 120

# (path, title, body); every page links to the index, the index to every page
PAGES = [
    ("api/thing.html", "Thing reference",
     '<dl class="py class"><dt id="mypkg.Thing">class mypkg.Thing</dt><dd><p>A container of '
     'widgets.</p><dl class="py method"><dt id="mypkg.Thing.method">method()</dt><dd><p>'
     "Returns the widgets sorted by weight.</p></dd></dl></dd></dl>"),
    ("api/other.html", "Other helpers",
     '<dl class="py class"><dt id="mypkg.Other">class mypkg.Other</dt><dd><p>Keeps gadgets '
     'in a queue.</p></dd></dl><dl class="py function"><dt id="mypkg.helper">mypkg.helper()'
     "</dt><dd><p>Formats a gadget as text.</p></dd></dl>"),
    ("guide/install.html", "Installation",
     '<section id="installing"><h2>Installing the package</h2><p>Run pip in a fresh '
     "virtual environment, then import the package.</p></section>"),
    ("ref/settings.html", "Settings",
     '<section id="std-setting-WIDGET_LIMIT"><h2>WIDGET_LIMIT</h2><p>Default: 100. The '
     "most widgets a container keeps.</p></section>"),
    ("ref/tags.html", "Built-in template tags",
     '<section id="std-templatetag-loopit"><h2>loopit</h2><p>Repeats a block of the '
     "template for each item.</p></section>"),
    ("topics/intro.html", "Introduction",
     "<p>This manual explains widgets, gadgets and containers in plain words.</p>"),
    ("genindex.html", "Index", "<p>Thing method Other helper loopit WIDGET_LIMIT</p>"),
    ("search.html", "Search", "<p>Search the manual.</p>"),
]
INVENTORY = [  # name domain:role priority uri dispname
    "mypkg py:module 0 api/thing.html#module-$ -",
    "mypkg.Thing py:class 1 api/thing.html#$ -",
    "mypkg.Thing.method py:method 1 api/thing.html#$ -",
    "mypkg.Other py:class 1 api/other.html#$ -",
    "mypkg.helper py:function 1 api/other.html#$ -",
    "installing std:label -1 guide/install.html#installing Installing the package",
    "intro std:label -1 topics/intro.html -",  # no title of its own: not a query
    "WIDGET_LIMIT std:setting 1 ref/settings.html#std-setting-$ -",
    "loopit std:templatetag 1 ref/tags.html#std-templatetag-$ -",
    "mypkg.Missing py:class 1 api/missing.html#$ -",  # a page not crawled: dropped
    "everything std:label -1 genindex.html Index of everything",  # an index page: dropped
]


def write_site(root: Path) -> None:
    nav = "".join(f'<li><a href="/{p}">{t}</a></li>' for p, t, _ in PAGES)
    for path, title, body in PAGES:
        file = root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(f'<!DOCTYPE html><html lang="en"><head><title>{title} - MyPkg '
                        f'docs</title></head><body><div class="related" role="navigation">'
                        f'<ul>{nav}</ul></div><div class="body" role="main"><h1>{title}</h1>'
                        f'{body}</div></body></html>', encoding="utf-8")
    header = b"# Sphinx inventory version 2\n# Project: MyPkg\n# Version: 1.0\n" \
             b"# The remainder of this file is compressed using zlib.\n"
    (root / "objects.inv").write_bytes(
        header + zlib.compress("\n".join(INVENTORY).encode() + b"\n"))


def run_tool(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "tools/bench_search_info.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False)


def test_judges_the_inventory_and_scores_three_systems(tmp_path: Path) -> None:
    site, out = tmp_path / "site", tmp_path / "out.json"
    write_site(site)
    proc = run_tool(["--html-root", str(site), "--workdir", str(tmp_path / "w"), "--queries",
                     "20", "--command-runs", "2", "--compare-tree", str(REPO), "--out",
                     str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["pages_indexed"] == len(PAGES)
    judged: dict[str, dict[str, Any]] = {q["name"]: q for q in res["judged"]}
    # every usable entry, once; the missing page, the index page, the untitled label dropped
    assert set(judged) == {"mypkg", "mypkg.Thing", "mypkg.Thing.method", "mypkg.Other",
                           "mypkg.helper", "installing", "WIDGET_LIMIT", "loopit"}
    assert judged["mypkg.Thing.method"]["relevant"] == ["api/thing.html"]
    assert judged["mypkg.helper"]["relevant"] == ["api/other.html"]
    assert judged["installing"]["query"] == "Installing the package"
    assert judged["installing"]["relevant"] == ["guide/install.html"]
    assert judged["WIDGET_LIMIT"]["query"] == "WIDGET_LIMIT setting"
    assert judged["loopit"]["query"] == "loopit template tag"
    assert judged["mypkg.Thing.method"]["query"] in ("mypkg.Thing.method", "Thing.method")
    for system in ("ours", "sqlite-fts5", "tantivy"):
        overall = res["results"][system]["all"]
        assert overall["queries"] == len(judged)
        assert 0.0 <= overall["mrr"] <= 1.0 and 0.0 <= overall["recall"] <= 1.0
        assert 0 <= overall["no_answer"] <= len(judged)
    # a dotted name documented as class, then method under it, is found by ours
    assert 1 <= judged["mypkg.Thing.method"]["ranks"]["ours"] <= 10
    assert judged["installing"]["ranks"]["ours"] == 1
    assert res["command"]["runs"] == 2 and res["command"]["p50_s"] > 0
    assert len(res["command"]["other"]["times_s"]) == 2  # --compare-tree: timed alternately
    assert "| kind | queries |" in proc.stdout and "| all |" in proc.stdout


def test_a_directory_without_objects_inv_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    proc = run_tool(["--html-root", str(tmp_path / "site"), "--workdir", str(tmp_path / "w")])
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "objects.inv" in lines[0], proc.stderr
