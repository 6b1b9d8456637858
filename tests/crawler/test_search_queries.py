"""What people type into a documentation search: dotted API names, code with brackets and
quotes, words no single page has all of, a query that starts with "-", and a long
reference page whose last section is what they look for. Each on pages made for it,
crawled and indexed for real (issue 44)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawl_helpers import META_PATHS, Answer, Hit, LocalServer, run_cli, run_crawl

from crawler.search import names
from crawler.search.indexer import index_crawl
from crawler.search.page import search_page
from crawler.search.query import Searcher, code_names, split_code_names
from tools.testweb import SiteConfig, TestWeb

FILLER = ("This section describes a function of the standard library in detail, with "
          "its parameters, its return value and the errors it raises. ")

# path -> (title, body HTML)
PAGES: dict[str, tuple[str, str]] = {
    # Sphinx's layout: the class's full name, and under it its methods by their own names
    "/asyncio-sync.html": ("Synchronization Primitives", (
        "<h2>Lock</h2><dl><dt>class asyncio.Lock</dt><dd><p>Implements a mutex lock for "
        "tasks.</p><dl><dt>coroutine acquire()</dt><dd>Acquire the lock.</dd>"
        "<dt>release()</dt><dd>Release the lock. When the lock is locked, reset it to "
        "unlocked.</dd></dl></dd></dl>")),
    "/asyncio-queue.html": ("Queues", "<p>asyncio queues are designed to be similar to "
                            "classes of the queue module; they have no lock.</p>"),
    # the name as written, and a page with its words far apart
    "/os-path.html": ("Common pathname manipulations", (
        "<dl><dt>os.path.join(path, *paths)</dt><dd>Join one or more path segments "
        "intelligently.</dd></dl>")),
    # (its words in its title too, and twice: without the name's phrase it ranks first)
    "/club.html": ("Join the path", "<p>The os of the club is old. Follow the garden path "
                   "to join the hall. Members who join this year walk the path.</p>"),
    "/json.html": ("json: JSON encoder and decoder", (
        "<dl><dt>json.dumps(obj, *, skipkeys=False)</dt><dd>Serialize obj to a JSON "
        "formatted str.</dd></dl>")),
    "/stdtypes.html": ("Built-in Types", (
        "<dl><dt>dict.get(key, default=None)</dt><dd>Return the value for key if key is "
        "in the dictionary, else default.</dd></dl>")),
    "/typing.html": ("typing: Support for type hints", (
        "<p>typing.Optional[int] is the same as int | None; Optional is for a value that "
        "may be None.</p>")),
    "/datatype-json.html": ("JSON Types", (
        "<p>SELECT '{}'::jsonb; casts an empty object to jsonb, the binary JSON "
        "type.</p>")),
    "/functions-aggregate.html": ("Aggregate Functions", (
        "<p>array_agg(x ORDER BY y) collects the input values, ordered, into an "
        "array.</p>")),
    "/books.html": ("Further reading", "<p>Learning SQL, O'Reilly Media, 2020.</p>"),
    "/libpq-connect.html": ("Database Connection Control Functions", (
        "<p>A connection URI such as http://localhost:5432 names the host and the "
        "port.</p>")),
    # a name defined (an id, as Sphinx and DocBook write one) on a page that writes the
    # method by its own name, and a page that mentions the whole name as written
    "/frob-api.html": ("API reference", (
        "<dl><dt id=\"frobnicate.Widget.spin\">spin(speed)</dt><dd>Turns the widget of "
        "frobnicate.</dd></dl>")),
    "/frob-whatsnew.html": ("What is new", (
        "<p>Changed: frobnicate.Widget.spin() now takes a speed.</p>")),
    # every word of the name in its title, and the name as written again and again
    "/frob-howto.html": ("How to spin a frobnicate widget", (
        "<p>Call frobnicate.Widget.spin to spin. frobnicate.Widget.spin spins a widget; "
        "frobnicate.Widget.spin is how a frobnicate widget spins.</p>")),
    # the module's documentation (Sphinx's id for a module: "module-" and its name), and
    # its source listing, titled by the module's name, every word of it code (Sphinx's
    # viewcode pages define the names of the module too)
    "/frob-widgets.html": ("Widgets", (
        '<section id="module-frobnicate.widget"><p>The widget module of frobnicate holds '
        "the widgets and how they turn.</p></section>")),
    "/frob-source.html": ("frobnicate.widget", (
        '<div class="highlight"><pre>"""frobnicate.widget: the widgets."""\n'
        '<div class="viewcode-block" id="Widget">class Widget:\n'
        '    """A widget of frobnicate."""</div>'
        '<div class="viewcode-block" id="Widget.spin">    def spin(self, speed):\n'
        "        return frobnicate.turn(self, speed)</div></pre></div>")),
    # an id that names a part of the layout, not a thing the page documents
    "/gallery.html": ("Gallery", '<div id="zircon"><p>Photos of zircon crystals.</p></div>'),
    "/zircon.html": ("Zircon", "<p>zircon crystals are tiny.</p>"),
    "/granite.html": ("Granite", "<p>granite is a coarse grained rock with quartz.</p>"),
    "/quartz.html": ("Quartz", "<p>quartz is a hard mineral.</p>"),
    # a long reference page: what is looked for comes ~150,000 characters in
    "/os.html": ("os: Miscellaneous operating system interfaces", (
        "".join(f"<p>{FILLER}</p>" for _ in range(1_100))
        + "<dl><dt>os.kill(pid, sig)</dt><dd>Send signal sig to the process pid: the "
        "zanzibarite section.</dd></dl>")),
}


def page_html(path: str) -> bytes:
    title, body = PAGES[path]
    return (f"<!DOCTYPE html><html lang=en><head><title>{title}</title></head><body>"
            f"<main><article><h1>{title}</h1>{body}</article></main></body></html>").encode()


def answer(path: str, hits: list[Hit]) -> Answer:
    if path == "/":  # the contents: links whose text is no word of the pages
        links = "".join(f'<p><a href="{p}">chapter {n}</a></p>' for n, p in enumerate(PAGES))
        return 200, [("Content-Type", "text/html; charset=utf-8")], (
            "<!DOCTYPE html><html lang=en><head><title>Manual</title></head><body><main>"
            f"<h1>Manual</h1>{links}</main></body></html>").encode()
    if path in META_PATHS or path not in PAGES:
        return 404, [("Content-Type", "text/plain")], b"not here"
    return 200, [("Content-Type", "text/html; charset=utf-8")], page_html(path)


@pytest.fixture(scope="module")
def manual(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    web = TestWeb(SiteConfig(hosts=1, pages=5, seed=3, crawl_delay=0.0)).start()
    try:  # (the test web only for the crawl's settings: DNS, CA; the pages are local)
        data = tmp_path_factory.mktemp("manual") / "crawl"
        with LocalServer(answer) as server:
            assert run_crawl(web, data, seeds=[server.url("/")]).complete
            base = server.url("")
    finally:
        web.stop()
    stats = index_crawl(str(data))
    assert stats.indexed == len(PAGES) + 1, stats
    yield data, base


def urls(data: Path, query: str, limit: int = 10) -> list[str]:
    with Searcher(str(data)) as s:
        return [h.url for h in s.search(query, limit=limit).hits]


def test_dotted_names_outside_phrases_are_their_words() -> None:
    assert code_names('asyncio.Lock.release "os.path.join" url:docs.python.org std::vector'
                      ) == ["asyncio.Lock.release", "std::vector"]
    assert (split_code_names('asyncio.Lock.release "os.path.join" url:docs.python.org')
            == 'asyncio Lock release "os.path.join" url:docs.python.org')
    assert split_code_names("a->b title:x.y") == "a b title:x.y"
    # left out as written, not word by word
    assert split_code_names("join -os.path +json.dumps") == "join -os.path +json.dumps"
    assert code_names("join -os.path") == []


def test_the_names_a_page_defines_are_its_code_names_and_their_tails() -> None:
    assert names.terms("module-frob.widget Widget.spin zircon main-content a.b.c") == [
        "module-frob.widget", "frob.widget", "widget.spin", "main-content", "a.b.c", "b.c"]
    assert names.terms("GUC-WORK-MEM std::vector") == [
        "guc-work-mem", "work-mem", "std::vector"]
    assert names.asked("os.path.join()") == ["os.path.join"]
    assert names.asked("dict.get(key, default)") == ["dict.get"]
    assert names.asked("zircon") == [] and names.asked("-os.path") == []
    assert names.asked("spin Widget.spin", ["Widget.spin"]) == ["widget.spin"]


def test_a_dotted_api_name_finds_its_method_under_its_class(manual: tuple[Path, str]) -> None:
    data, base = manual
    # the page never writes "asyncio.Lock.release": the class's name, then "release()"
    for query in ("asyncio.Lock.release", "asyncio.lock.release", "asyncio.Lock.release()"):
        assert urls(data, query)[:1] == [base + "/asyncio-sync.html"], query


def test_the_page_that_defines_a_name_ranks_first(manual: tuple[Path, str]) -> None:
    """An id is the name a reference page defines: its page comes before one that only
    mentions the name, as written."""
    data, base = manual
    for query in ("frobnicate.Widget.spin", "frobnicate.Widget.spin()", "Widget.spin"):
        got = urls(data, query)
        assert got[0] == base + "/frob-api.html", (query, got)
        assert {base + "/frob-whatsnew.html", base + "/frob-howto.html"} <= set(got)


def test_the_page_that_documents_a_name_comes_before_its_source_listing(
        manual: tuple[Path, str]) -> None:
    """The listing has every word of the name in its title; it defines the name too."""
    data, base = manual
    got = urls(data, "frobnicate.widget")
    assert got[0] == base + "/frob-widgets.html" and base + "/frob-source.html" in got, got
    for query in ("Widget.spin", "Widget.spin()", "frobnicate.Widget.spin"):
        got = urls(data, query)
        assert got.index(base + "/frob-api.html") < got.index(base + "/frob-source.html"), \
            (query, got)


def test_an_id_of_one_word_is_no_name(manual: tuple[Path, str]) -> None:
    """``id="zircon"`` is a box of the layout: a one-word query stays a query of words."""
    data, base = manual
    assert urls(data, "zircon") == [base + "/zircon.html", base + "/gallery.html"]


def test_a_name_as_written_ranks_above_its_words_far_apart(manual: tuple[Path, str]) -> None:
    data, base = manual
    got = urls(data, "os.path.join")
    assert got[0] == base + "/os-path.html"
    assert base + "/club.html" in got  # the words are all there, so it is found: below
    # the name left out: the page that has it as written goes, the other stays
    assert urls(data, "join -os.path.join") == [base + "/club.html"]


@pytest.mark.parametrize(("query", "page"), [
    ("os.path.join()", "/os-path.html"),
    ("json.dumps()", "/json.html"),
    ("dict.get(key, default)", "/stdtypes.html"),
    ("typing.Optional[int]", "/typing.html"),
    ("'{}'::jsonb", "/datatype-json.html"),
    ("array_agg(x ORDER BY y)", "/functions-aggregate.html"),
    ("O'Reilly", "/books.html"),
    ("http://localhost:5432", "/libpq-connect.html"),
])
def test_queries_with_code_in_them_are_answered(manual: tuple[Path, str], query: str,
                                                page: str) -> None:
    data, base = manual
    assert urls(data, query)[:1] == [base + page], query


def test_words_no_page_has_all_of_fall_back_to_any_of_them(manual: tuple[Path, str]) -> None:
    data, base = manual
    with Searcher(str(data)) as s:
        every = s.search("granite quartz")  # both on granite.html only: fewer than 10
        assert every.any_word is True
        assert [h.url for h in every.hits] == [base + "/granite.html", base + "/quartz.html"]
        assert every.matches == 1 and every.any_matches == 2  # every word; some of them
        some = s.search("granite unobtainium")  # no page has the second word
        assert some.any_word is True and [h.url for h in some.hits] == [base + "/granite.html"]
        assert some.matches == 0 and some.any_matches == 1
        enough = s.search("granite quartz", limit=1)  # as many as asked for: no fallback
        assert enough.any_word is False and enough.matches == 1  # the same count as above
        one = s.search("unobtainium")  # one word: nothing to fall back to
        assert one.any_word is False and one.hits == []
        # a long query that found its page is not asked again; one that found none is
        long = s.search("granite coarse grained rock quartz")
        assert long.any_word is False and [h.url for h in long.hits] == [
            base + "/granite.html"]
        none = s.search("granite coarse grained rock unobtainium")
        assert none.any_word is True and none.matches == 0
        assert [h.url for h in none.hits][:1] == [base + "/granite.html"]


def test_the_page_with_every_word_comes_before_those_with_some(
        manual: tuple[Path, str]) -> None:
    data, base = manual
    with Searcher(str(data)) as s:
        res = s.search("quartz hard mineral granite")  # no page has all four
        assert res.any_word is True
        got = [h.url for h in res.hits]
        assert set(got) == {base + "/quartz.html", base + "/granite.html"}
        res = s.search("quartz mineral")  # quartz.html has both, granite.html one
        assert [h.url for h in res.hits] == [base + "/quartz.html", base + "/granite.html"]


def test_a_long_reference_page_is_found_by_its_last_section(manual: tuple[Path, str]) -> None:
    data, base = manual
    assert len(PAGES["/os.html"][1]) > 150_000
    assert urls(data, "zanzibarite") == [base + "/os.html"]
    assert urls(data, "os.kill")[:1] == [base + "/os.html"]


def test_a_query_that_starts_with_a_dash(manual: tuple[Path, str]) -> None:
    data, base = manual
    for argv in (["-granite"], ["-granite", "quartz"], ["quartz", "-granite"]):
        done = run_cli(["python", "-m", "crawler", "search", str(data), *argv])
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "a query that starts with - goes after --" in lines[0], lines
    done = run_cli(["python", "-m", "crawler", "search", str(data), "--json", "--",
                    "-granite quartz"])
    assert done.returncode == 0, done.stderr
    hits = [h["url"] for h in json.loads(done.stdout)["hits"]]
    assert hits == [base + "/quartz.html"]  # quartz, not the page that also says granite


def test_the_command_and_the_page_say_when_any_word_was_enough(
        manual: tuple[Path, str]) -> None:
    data, base = manual
    done = run_cli(["python", "-m", "crawler", "search", str(data), "granite unobtainium"])
    assert done.returncode == 0, done.stderr
    assert "1. Granite" in done.stdout
    assert "1 shown: 0 pages with every word, 1 with some (" in done.stdout
    status, page = search_page(str(data), "q=granite+unobtainium")
    assert status == 200 and "1 shown: 0 pages with every word, 1 with some (" in page
    status, page = search_page(str(data), "q=granite")
    assert status == 200 and "pages with every word" not in page
    assert "1 of 1 matching pages (" in page
    # --json: matches counts the pages with every word whatever the limit
    for limit in ("1", "10"):
        done = run_cli(["python", "-m", "crawler", "search", str(data), "granite quartz",
                        "--json", "--limit", limit])
        got = json.loads(done.stdout)
        assert got["matches"] == 1 and got["any_word"] is (limit == "10"), got


# What a query does not need: the indexer and its readers, the exports, Ray's client.
# (`crawler search` as a command took 300-650 ms, nearly all of it these imports.)
NOT_FOR_A_QUERY = ("crawler.search.indexer", "crawler.read.pagetext", "crawler.read.export",
                   "resiliparse", "lxml", "ray", "requests")


def test_the_search_command_loads_only_what_a_query_needs(manual: tuple[Path, str]) -> None:
    data, _ = manual
    code = ("import sys\nfrom crawler.cli import main\n"
            f"assert main(['search', {str(data)!r}, 'granite']) == 0\n"
            f"print('loaded:', [m for m in {NOT_FOR_A_QUERY!r} if m in sys.modules])\n")
    done = run_cli(["python", "-c", code])
    assert done.returncode == 0, done.stderr
    assert "1. Granite" in done.stdout
    assert "loaded: []" in done.stdout, done.stdout.splitlines()[-1]
