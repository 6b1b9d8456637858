"""The search benchmarks (tools/bench_extract.py, bench_index.py, bench_search.py) run end
to end at a tiny size and write the JSON their docstrings document.

Speed is never asserted (that is what the tools are for). What is asserted is that they
measure what they say: the quality reference is the marked main content (the plain
visible text finds all of it), the libraries count the same matching pages, and a
SIGKILLed index reopens. An extractor or index library that is not installed is skipped
by name; SQLite FTS5 (the standard library) always runs. The peers of setup.cfg's [bench]
extra (trafilatura, readability-lxml) are not in [test]: where that extra is not
installed they skip, allowed in CI (``ci_may_skip``), which runs them in a venv of
its own with [bench] (.ci/run).
"""

from __future__ import annotations

import configparser
import importlib.metadata
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tools import bench_extract

REPO = Path(__file__).resolve().parents[2]
TOOL_TIMEOUT = 120  # seconds for one tool run; a few here

SPHINX = """<!DOCTYPE html><html><head><title>json - JSON encoder</title></head><body>
<div class="related" role="navigation"><a href="index.html">Navigation</a> previous next</div>
<div class="document"><div class="body" role="main"><section><h1>json encoder</h1>
<p>The json module <b>encodes</b> objects; <code>dumps</code> returns a string.</p>
<table><tr><td>dict</td><td>object</td></tr></table></section></div></div>
<div class="sphinxsidebar" role="navigation"><h3>Table of Contents</h3><ul><li>sidebar</li></ul>
</div><div class="footer">Copyright foundation license</div></body></html>"""
DOCBOOK = """<?xml version="1.0" encoding="UTF-8"?><html xmlns="http://www.w3.org/1999/xhtml">
<head><title>SELECT</title></head><body><div class="navheader"><table><tr><td>Prev</td>
<td>Up</td><td>Home</td><td>Next</td></tr></table></div><div class="refentry"><h2>SELECT</h2>
<p>SELECT retrieves rows from zero or more tables.</p><pre>SELECT * FROM films;</pre></div>
<div class="navfooter"><table><tr><td>Prev</td><td>Home</td><td>Next: SELECT INTO</td></tr>
</table></div></body></html>"""
PLAIN = "<html><body><p>A page of no known generator: it counts for speed only.</p></body></html>"


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _bench_extra() -> set[str]:
    """The distributions of setup.cfg's [bench] extra."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    lines = cfg["options.extras_require"]["bench"].splitlines()
    return {m.group().lower() for line in lines if (m := re.match(r"[\w.-]+", line.strip()))}


BENCH = _bench_extra()


def _param(name: str, dist: str | None) -> Any:
    if dist is None or _installed(dist):
        return pytest.param(name)
    if dist.lower() in BENCH:
        why = (f"{dist} is not installed (the [bench] extra: python -m pip install "
               "--upgrade pip && pip install -e '.[bench]')")
        return pytest.param(name, marks=[pytest.mark.skip(reason=why), pytest.mark.ci_may_skip(
            "a benchmark peer of the [bench] extra: .ci/run runs it where [bench] is installed")])
    return pytest.param(name, marks=pytest.mark.skip(reason=f"{dist} is not installed"))


def _run(args: list[str], tmp_path: Path) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, *args, "--workdir", str(tmp_path / "work"),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def test_reference_is_the_marked_main_content() -> None:
    sphinx = bench_extract.reference(SPHINX.encode())
    docbook = bench_extract.reference(DOCBOOK.encode())
    assert bench_extract.reference(PLAIN.encode()) is None
    assert sphinx is not None and docbook is not None
    generator, ref, boiler, links = sphinx
    assert generator == "sphinx" and links == 0.0
    assert ref["encodes"] == 1 and ref["dict"] == 1 and ref["object"] == 1  # cells apart
    assert "sidebar" in boiler and "copyright" in boiler and "encodes" not in boiler
    generator, ref, boiler, links = docbook
    assert generator == "docbook" and ref["films"] == 1 and links == 0.0
    assert boiler["prev"] == 2 and "select" not in boiler  # the title is in the body too
    toc = SPHINX.replace("<p>The json", '<p><a href="a.html">one two three four five six</a>'
                         '<a href="b.html"> seven eight nine ten eleven twelve thirteen</a>'
                         + '<a href="c.html"> fourteen fifteen sixteen seventeen</a> The json')
    listing = bench_extract.reference(toc.encode())
    assert listing is not None and listing[3] > bench_extract.LINK_LIST_SHARE


def test_score_counts_tokens_and_boilerplate() -> None:
    ref, boiler = Counter({"a": 2, "b": 1}), Counter({"nav": 1, "home": 1})
    s = bench_extract.score(Counter({"a": 1, "b": 1, "nav": 1}), ref, boiler)
    assert s["p"] == pytest.approx(2 / 3) and s["r"] == pytest.approx(2 / 3)
    assert (s["leaked"], s["boiler"]) == (1, 2)
    assert bench_extract.score(Counter(), ref, boiler)["f1"] == 0.0


@pytest.mark.parametrize("extractor", [
    _param(name, dist) for name, dist in bench_extract.DISTRIBUTIONS.items()])
def test_bench_extract_reports_speed_and_quality(extractor: str, tmp_path: Path) -> None:
    html = tmp_path / "docs-sample"  # the doc set's label
    html.mkdir()
    for name, page in (("sphinx.html", SPHINX), ("docbook.html", DOCBOOK), ("plain.html", PLAIN)):
        (html / name).write_text(page, encoding="utf-8")
    stdout, res = _run(["tools/bench_extract.py", "--html-dir", str(html), "--repeat", "2",
                        "--extractors", ",".join(dict.fromkeys(["visible", extractor]))],
                       tmp_path)
    assert set(res) >= {"machine", "args", "corpus", "runs", "summary", "skipped"}
    assert res["corpus"]["docs-sample"]["files"] == 3
    assert res["corpus"]["docs-sample"]["with_reference"] == 2
    by_name = {s["extractor"]: s for s in res["summary"]}
    s = by_name[extractor]
    assert s["runs"] == 2 and s["pages"] == 3 and s["deterministic"]
    assert s["pages_per_s"] > 0 and s["cpu_ms_per_page"] > 0 and s["peak_rss_bytes"] > 1e6
    q = s["quality"]["all"]
    assert q["pages"] == 2
    assert all(0.0 <= q[k] <= 1.0 for k in ("p", "r", "f1", "f1_median", "leak"))
    visible = by_name["visible"]["quality"]["all"]
    assert visible["r"] == 1.0 and visible["leak"] == 1.0  # every word, boilerplate too
    assert "| extractor |" in stdout and "| doc set |" in stdout


def test_bench_extract_reads_the_article_benchmark(tmp_path: Path) -> None:
    """``--articles``: Scrapinghub's layout (html/NAME.html.gz, ground-truth.json with each
    page's articleBody), the reference a human wrote; the index's reader is measured."""
    import gzip

    root = tmp_path / "aeb"
    (root / "html").mkdir(parents=True)
    menu = "".join(f'<a href="/s{i}">Section number {i}</a> ' for i in range(12))
    body = ("The harbour reopened on Monday after a storm closed it for a week. "
            "Fishermen said the damage to the quay was smaller than they had feared.")
    page = (f"<html><head><title>Harbour</title></head><body><div>{menu}</div>"
            f"<h1>Harbour reopens</h1><p>{body}</p><div>{menu}</div></body></html>")
    (root / "html" / "one.html.gz").write_bytes(gzip.compress(page.encode()))
    (root / "ground-truth.json").write_text(json.dumps({"one": {"articleBody": body}}))
    _, res = _run(["tools/bench_extract.py", "--articles", str(root), "--repeat", "1",
                   "--extractors", "visible,ours"], tmp_path)
    assert res["corpus"]["articles"]["files"] == 1
    assert res["corpus"]["articles"]["html_bytes"] == len(page.encode())
    by_name = {s["extractor"]: s["quality"]["articles"] for s in res["summary"]}
    assert by_name["visible"]["r"] == 1.0 and by_name["visible"]["p"] < 0.6  # the menus
    assert by_name["ours"]["r"] == 1.0 and by_name["ours"]["p"] > 0.9  # without them


@pytest.mark.parametrize("library", [
    pytest.param("sqlite-fts5"), _param("tantivy", "tantivy")])
def test_bench_index_builds_queries_and_survives_kill(library: str, tmp_path: Path) -> None:
    stdout, res = _run(["tools/bench_index.py", "--pages", "2000", "--libraries", library,
                        "--repeat", "1", "--batch", "200", "--query-runs", "2",
                        "--crash-trials", "2", "--crash-pages", "2000"], tmp_path)
    assert set(res) >= {"machine", "corpus", "runs", "crash", "summary", "hits_agree"}
    corpus = res["corpus"]
    assert corpus["pages"] == 2000 and 300 < corpus["body_words"] / 2000 < 600
    s = res["summary"][0]
    assert s["library"] == library and s["count_ok"]
    assert s["build_pages_per_s"] > 0 and s["disk_bytes"] > 0 and s["size_vs_text"] > 0.1
    assert 0 < s["query_p50_ms"] <= s["query_p95_ms"]
    hits = {q["name"]: q["hits"] for q in s["queries"]}
    assert hits["word 1"] > hits["word 1000"] > 0 and len(hits) == 11
    killed = [t for t in res["crash"][library] if t["killed"]]
    assert killed  # a trial whose build ended before the kill (a starved reader) proves nothing
    for trial in killed:
        assert trial["intact"] and trial["at_a_commit"], trial
        assert trial["writable_after"] and trial["query_ok"], trial
    assert "| library |" in stdout and "kill -9" in stdout


def test_bench_index_corpus_is_deterministic_and_prefix_stable(tmp_path: Path) -> None:
    from tools import bench_index

    small, big = tmp_path / "small.tsv", tmp_path / "big.tsv"
    bench_index.generate(small, 50, seed=3, vocab=1000)
    bench_index.generate(big, 120, seed=3, vocab=1000)
    again = tmp_path / "again.tsv"
    bench_index.generate(again, 50, seed=3, vocab=1000)
    assert small.read_bytes() == again.read_bytes()
    assert big.read_bytes().startswith(small.read_bytes())
    assert bench_index.word(0) != bench_index.word(1) and len(bench_index.word(0)) == 4
    assert len({bench_index.word(i) for i in range(20_000)}) == 20_000


def test_bench_search_crawls_indexes_and_scores_title_queries(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "docs").mkdir(parents=True)
    names = [f"p{i}" for i in range(12)]
    minerals = ["quartz", "mica", "basalt", "granite", "pumice", "obsidian", "tuff",
                "gneiss", "slate", "marble", "chalk", "flint"]
    for i, name in enumerate(names):
        links = "".join(f'<li><a href="{n}.html">{m} notes</a></li>'
                        for n, m in zip(names, minerals, strict=True) if n != name)
        (site / "docs" / f"{name}.html").write_text(
            f"<html><head><title>All about {minerals[i]}</title></head><body>"
            f"<nav><ul>{links}</ul></nav><main><h1>{minerals[i]}</h1>"
            f"<p>{minerals[i]} is a rock or mineral; this page says what {minerals[i]} "
            f"is made of and where it is found.</p></main></body></html>")
    stdout, res = _run(["tools/bench_search.py", "--html-root", str(site), "--repeat", "1",
                        "--query-runs", "1", "--weights", "0,0.5"], tmp_path)
    s = res["summary"]
    assert s["pages_indexed"] == 12 and s["title_queries"] == 12
    assert res["site"]["seeds"] == 12 and s["stored_body_bytes"] > 0
    assert s["index_pages_per_s"] > 0 and 0 < s["index_vs_bodies"]
    q = s["quality"]
    assert set(q) == {"all fields, rank weight 0", "all fields, rank weight 0.5",
                      "no anchor text, rank weight 0", "no field boosts, rank weight 0"}
    assert q["all fields, rank weight 0"] == {"mrr": 1.0, "first": 1.0, "queries": 12}
    assert 0 < s["latency_title_queries"]["p50_ms"] <= s["latency_title_queries"]["p95_ms"]
    assert "| configuration | MRR |" in stdout


def test_bench_search_scale_builds_a_crawl_index_and_queries_it_through_searcher(
        tmp_path: Path) -> None:
    stdout, res = _run(["tools/bench_search_scale.py", "--pages", "3000", "--titles", "30",
                        "--query-runs", "2", "--vocab", "20000"], tmp_path)
    assert res["build"]["pages"] == 3000 and res["build"]["index_bytes"] > 0
    kinds = {row["kind"]: row for row in res["summary"]}
    assert {"word", "and", "phrase", "title", "all"} <= set(kinds)
    assert kinds["title"]["timed"] == 30 * 3 and kinds["word"]["timed"] > 0
    assert all(0 < row["p50_ms"] <= row["p95_ms"] <= row["max_ms"] for row in kinds.values())
    words = [q for q in res["queries"] if q["kind"] == "word"]
    # the vocabulary is Zipf-drawn: a commoner word matches more pages (the Searcher's
    # count), and every query asked returned hits
    assert [q["matches"] for q in words] == sorted((q["matches"] for q in words), reverse=True)
    assert all(q["returned"] > 0 for q in res["queries"] if q["kind"] == "word")
    # a page's own title finds it first nearly always (a title shared by two pages can
    # lose to its twin)
    assert res["title_found_first"] >= 0.9
    # the crawl directory is one the crawler reads: `search` finds the same first hit
    data = next((tmp_path / "work").glob("crawl-3000-2-*"))
    title = next(q for q in res["queries"] if q["kind"] == "title")
    proc = subprocess.run([sys.executable, "-m", "crawler", "search", str(data), title["text"],
                           "--json", "--limit", "1"], cwd=REPO, capture_output=True,
                          text=True, timeout=TOOL_TIMEOUT, check=True)
    assert json.loads(proc.stdout)["matches"] == title["matches"]
    assert "| queries | timed |" in stdout


def test_bench_search_scale_queries_an_indexed_crawl_with_its_own_titles(tmp_path: Path) -> None:
    data = tmp_path / "crawl"
    for args in (["tools/seedscale.py", "--pages", "1500", "--pending", "300", "--data",
                  str(data), "--quiet"], ["-m", "crawler", "index", str(data), "--quiet"]):
        done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
    stdout, res = _run(["tools/bench_search_scale.py", "--crawl", str(data), "--titles", "10",
                        "--query-runs", "2"], tmp_path)
    kinds = {row["kind"]: row for row in res["summary"]}
    assert set(kinds) == {"title", "two_words", "word", "all"}
    assert kinds["title"]["timed"] == kinds["word"]["timed"] == 10 * 2
    assert all(0 < row["p50_ms"] <= row["p95_ms"] <= row["max_ms"] for row in kinds.values())
    # every query is words of an indexed page's title: each finds that page at least,
    # and fewer words match at least as many pages
    by_kind: dict[str, list[int]] = {}
    for q in res["queries"]:
        assert q["returned"] > 0
        by_kind.setdefault(q["kind"], []).append(q["matches"])
    assert all(t <= w2 <= w for t, w2, w in zip(by_kind["title"], by_kind["two_words"],
                                                  by_kind["word"], strict=True))
    assert "| queries | timed |" in stdout and res["open_s"] > 0
