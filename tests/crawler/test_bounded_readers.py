"""Every reader of stored HTML is bounded (issue 42, item 4; crawler.read.htmlbounds): a
page of deeply nested ``<div>`` elements, whose main-content extraction by resiliparse is
quadratic in that nesting, is exported to Markdown from its plain text and counted; the
index's (and JSONL's) own main-content rule is linear (crawler.read.mainblocks), so it
reads that page for its main content, fast; a page over its time budget is read from its
plain text by every reader; ``index`` stops on Ctrl-C or SIGTERM without waiting for its
workers' tasks. Behaviour is asserted (outputs, counters, exit statuses), never a duration: the
"finishes" bounds are pytest-timeout's and a wait's, far above what a bounded run
takes and far below what an unbounded one would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from crawl_helpers import REPO
from crawldir_helpers import HOST, deep_page, html_page, ordinary_pages, page_record, write_crawl

from crawler.cli import main
from crawler.read.export import export
from crawler.read.htmlbounds import (
    DEFAULT_MAX_NESTING_WORK,
    NESTED,
    OVER_BUDGET,
    ReadBounds,
    nesting_work,
)
from crawler.read.markdown import markdown_file
from crawler.read.pagejson import read_text_fields
from crawler.read.pagetext import page_text, read_html, read_markdown
from crawler.search import reading
from crawler.search.indexer import index_crawl
from crawler.search.query import Searcher
from crawler.search.reading import CHUNK
from crawler.web.urls import url_key

DEEP_URL = f"{HOST}/deep.html"
# just past the default bound: sum over the <div>s of the elements under them
DEPTH = 2_100
FAR = 40_000  # an unbounded read of this takes minutes: pytest-timeout fails it
WAIT = 60  # seconds a subprocess of these tests may take, at most


# -- the bound itself ------------------------------------------------------------------------


class TestNestingWork:
    def test_a_chain_of_divs_costs_its_depth_squared(self) -> None:
        html = "<body>" + "<div><p>x</p>" * 100 + "</div>" * 100
        # each <p> and <div> counted once for each <div> open around it
        assert nesting_work(html, 0) == sum(2 * d + 1 for d in range(100))

    def test_siblings_cost_little(self) -> None:
        html = "<body>" + "<div><p>x</p></div>" * 10_000
        assert nesting_work(html, 0) == 10_000  # each <p> under one <div>
        # under the bound, the quick one: the deepest nesting times the tags
        assert nesting_work(html, DEFAULT_MAX_NESTING_WORK) == 40_001

    def test_articles_count_and_other_elements_do_not(self) -> None:
        assert nesting_work("<article>" * 50, 0) == sum(range(50))
        for tag in ("section", "span", "li", "table", "divx", "div-x"):
            assert nesting_work(f"<{tag}>" * 50, 0) == 0, tag

    def test_stray_end_tags_close_nothing(self) -> None:
        """The parser ignores an end tag with nothing open: so does the count."""
        assert nesting_work("</div>" * 100 + "<div>" * 100, 0) == sum(range(100))

    def test_case_and_attributes_are_seen(self) -> None:
        assert nesting_work('<DIV class="a">' * 10 + "<Div\n>" * 10, 0) == sum(range(20))

    def test_the_deep_page_of_the_tests_is_past_the_default_bound(self) -> None:
        assert nesting_work(deep_page(DEPTH), DEFAULT_MAX_NESTING_WORK) \
            > DEFAULT_MAX_NESTING_WORK
        assert nesting_work(html_page(3), DEFAULT_MAX_NESTING_WORK) < 1_000


class TestReaders:
    def test_an_ordinary_page_is_read_for_its_main_content(self) -> None:
        text = read_html(html_page(1), f"{HOST}/p1.html")
        assert text.plain == "" and "granite" in text.text
        assert "page 2" not in text.text  # the navigation left out

    def test_a_deep_page_is_indexed_for_its_main_content_and_exported_from_plain_text(
            self) -> None:
        """The index's rule needs no nesting bound; resiliparse's (Markdown) does."""
        small = ReadBounds(max_nesting_work=1_000)
        text = read_html(deep_page(DEPTH), DEEP_URL, bounds=small)
        assert text.plain == ""
        assert "abyssal bottom" in text.text and "abyssal intro" in text.text
        assert text.title == "Deep abyssal"
        page = page_record(DEEP_URL, deep_page(60))
        md = read_markdown(page, bounds=small)
        assert md is not None and md.plain == NESTED and "abyssal bottom" in md.text
        md = read_markdown(page_record(DEEP_URL, deep_page(40)), bounds=small)
        assert md is not None and md.plain == ""

    def test_a_page_over_its_time_budget_is_read_from_its_plain_text(self) -> None:
        none = ReadBounds(page_seconds=0.0)
        # a menu no markup names: the main-content rule leaves it out, plain text keeps it
        menu = "<div>" + " ".join(f'<a href="/m{i}">menu entry {i}</a>' for i in range(9))
        html = html_page(1).replace("<main>", menu + "</div><main>")
        page = page_record(f"{HOST}/p1.html", html)
        usual = page_text(page)
        assert usual is not None and usual.plain == "" and "menu entry" not in usual.text
        text = page_text(page, bounds=none)
        assert text is not None and text.plain == OVER_BUDGET
        assert "granite" in text.text and "menu entry 3" in text.text  # all the text
        assert "page 2" not in text.text  # (a <nav> is boilerplate by its markup: left out)
        md = read_markdown(page, bounds=none)
        assert md is not None and md.plain == OVER_BUDGET and "Granite 1" in md.text

    def test_markdown_and_jsonl_say_when_they_read_plain_text(self) -> None:
        page = page_record(DEEP_URL, deep_page(DEPTH))
        made = markdown_file(page)
        assert made is not None
        file, plain, _ = made
        assert plain == NESTED and "abyssal bottom" in file and 'title: "Deep abyssal"' in file
        fields, plain = read_text_fields(page, 10_000)  # (the index's rule: not bounded)
        assert plain == "" and "abyssal bottom" in fields["main_text"]
        ordinary = page_record(f"{HOST}/p1.html", html_page(1))
        assert read_text_fields(ordinary, 10_000)[1] == ""
        made = markdown_file(ordinary)
        assert made is not None and made[1] == ""


# -- whole commands ---------------------------------------------------------------------------


def crawl_with(tmp_path: Path, deep: str) -> Path:
    pages = {**ordinary_pages(), DEEP_URL: deep}
    return write_crawl(tmp_path / "crawl", pages)


def test_index_reads_a_deep_page_for_its_main_content(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = crawl_with(tmp_path, deep_page(DEPTH))
    assert main(["index", str(data), "--quiet", "--workers", "1", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["plain"] == 0 and stats["documents"] == len(ordinary_pages()) + 1
    with Searcher(str(data)) as searcher:
        assert [h.url for h in searcher.search("abyssal bottom").hits] == [DEEP_URL]


def test_index_counts_the_pages_read_past_their_time_budget(tmp_path: Path) -> None:
    data = crawl_with(tmp_path, deep_page(30))
    stats = index_crawl(str(data), workers=1, bounds=ReadBounds(max_nesting_work=200))
    assert stats.plain == 0 and stats.indexed == len(ordinary_pages()) + 1
    data2 = crawl_with(tmp_path / "b", deep_page(30))
    stats = index_crawl(str(data2), workers=1, bounds=ReadBounds(page_seconds=0.0))
    assert stats.plain == len(ordinary_pages()) + 1
    assert f"{len(ordinary_pages()) + 1} read from their plain text (over the time" \
        in stats.summary()


def test_export_writes_a_deep_page_and_counts_it(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    data = crawl_with(tmp_path, deep_page(DEPTH))
    out = tmp_path / "out"
    out.mkdir()
    stats = export(str(data), jsonl=str(out / "pages.jsonl"), markdown=str(out / "md"),
                   text=True)
    assert stats.plain == 1 and stats.pages == len(ordinary_pages()) + 1
    assert "1 page(s) read from their plain text" in stats.summary()
    lines = [json.loads(line) for line in (out / "pages.jsonl").read_text().splitlines()]
    deep = next(line for line in lines if line["url"] == DEEP_URL)
    assert "abyssal bottom" in deep["main_text"]
    md = out / "md" / "pages.test" / (url_key(DEEP_URL).hex() + ".md")
    assert "abyssal bottom" in md.read_text()
    # and through the command line, to the end
    assert main(["export", str(data), "--markdown", str(tmp_path / "md2"), "--jsonl",
                 str(tmp_path / "p2.jsonl"), "--text", "--quiet"]) == 0
    assert len((tmp_path / "p2.jsonl").read_text().splitlines()) == len(lines)
    assert len(list((tmp_path / "md2").rglob("*.md"))) == len(lines)


@pytest.mark.timeout(120)
def test_a_page_nested_far_past_the_bound_is_indexed_and_exported_to_the_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """40,000 nested <div>s: read unbounded, each of resiliparse's main-content
    extractions (Markdown 2) takes tens of seconds; bounded, the page costs what its size
    does. The index's and JSONL's rule is linear: read for its main content."""
    data = crawl_with(tmp_path, deep_page(FAR))
    assert main(["index", str(data), "--quiet", "--workers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plain"] == 0
    with Searcher(str(data)) as searcher:
        assert [h.url for h in searcher.search("abyssal bottom").hits] == [DEEP_URL]
    stats = export(str(data), jsonl=str(tmp_path / "p.jsonl"), markdown=str(tmp_path / "md"),
                   text=True)
    assert stats.plain == 1  # (its Markdown)
    assert "abyssal bottom" in (tmp_path / "p.jsonl").read_text()


# -- stopping -----------------------------------------------------------------------------------


def slow_crawl(data: Path) -> Path:
    """Pages of 2 MB of HTML each (what the reader parses of a page at most): read as
    usual, and slowly (a quarter of a second or so each), so that a task of the reading
    workers (1,000 pages) takes minutes. (Stored compressed: a few kB each.)"""
    def slow(i: int) -> str:
        return ("<!DOCTYPE html><html><head><title>Slow</title></head><body>"
                + f"<p>the slow w{i} page, read for a while</p>" * 50_000 + "</body></html>")

    return write_crawl(data, {f"{HOST}/slow{i}.html": slow(i) for i in range(CHUNK + 1)},
                       level=1)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_index_stops_at_once_with_its_workers(signum: signal.Signals, code: int,
                                              tmp_path: Path) -> None:
    """Without stopping its workers, the run waits for their tasks under way (minutes
    here) before it exits: the wait below fails it. Ctrl-C goes to the process group
    (the workers ignore it: the run stops them), SIGTERM to the command alone."""
    data = slow_crawl(tmp_path / "crawl")
    proc = subprocess.Popen([sys.executable, "-m", "crawler", "index", str(data),
                             "--workers", "2"], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)),
                            start_new_session=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the reading has begun
            if "records to read" in line:
                break
        wait_for_reading_workers(proc.pid, data / "main")
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        err = proc.communicate(timeout=WAIT)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "index interrupted" in err, err[-3000:]
    # no worker left behind (one that is exiting gets its moment: a worker left to finish
    # its task would run on for minutes)
    for _ in range(WAIT * 20):
        if not living(proc.pid):
            break
        time.sleep(0.05)
    assert living(proc.pid) == []


def test_a_stop_taken_by_another_thread_waits_for_a_worker_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM the kernel hands to another thread (tantivy's, the pool's) still runs
    the CLI's handler in the main thread: blocking it in the main thread alone let that
    KeyboardInterrupt cut a worker's start between its spawn and its data (the worker's
    EOFError traceback, seen under CI's load). The start runs to its end, then the stop
    comes."""
    assert threading.current_thread() is threading.main_thread()
    other_ready, other_done = threading.Event(), threading.Event()

    def idle() -> None:
        other_ready.set()
        other_done.wait(30)

    other = threading.Thread(target=idle, daemon=True)
    other.start()
    other_ready.wait(30)
    ident = other.ident
    assert ident is not None
    finished = []

    def submit(fn: object, task: object) -> str:  # a start the signal must not cut
        signal.pthread_kill(ident, signal.SIGTERM)
        for _ in range(50):  # bytecodes: where the main thread runs a Python handler
            time.sleep(0.002)
        finished.append(task)
        return "future"

    pool = SimpleNamespace(submit=submit)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # as the CLI does with SIGTERM

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            reading._submit(pool, "task")  # type: ignore[arg-type]
    finally:
        signal.signal(signal.SIGTERM, old)
        other_done.set()
    assert finished == ["task"]  # the start ran whole, and the stop was not lost
    assert signal.getsignal(signal.SIGTERM) is old


def wait_for_reading_workers(group: int, store: Path) -> None:
    """Until a worker process of ``group`` holds MainDB's files open: it has started
    and reads its task (a worker opens them at its start, then takes a task at once)."""
    for _ in range(WAIT * 20):
        for stat in living(group):
            pid = stat.split()[0]
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
            except OSError:
                continue
            if int(pid) != group and any(t.startswith(str(store)) for t in targets):
                return
        time.sleep(0.05)
    raise AssertionError("no worker began reading")


def living(group: int) -> list[str]:
    """The processes of a process group that still run (a zombie, dead and not yet reaped
    by init, does not count)."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, pgrp, ...
        if fields and int(fields[2]) == group and fields[0] != "Z":
            out.append(stat)
    return out


def test_the_deep_page_helper_nests_what_it_says() -> None:
    assert len(re.findall("<div>", deep_page(7))) == 7
