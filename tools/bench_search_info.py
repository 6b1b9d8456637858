"""Benchmark informational queries on a real Sphinx manual: our search against SQLite FTS5
and plain tantivy, on the same crawled pages, judged by the manual's own index. Not a test.

Usage (from the repository root)::

    python tools/bench_search_info.py --fetch-debian-docs --workdir /tmp/bench-info
    python tools/bench_search_info.py --html-root DIR --workdir /tmp/bench-info --queries 300
    python tools/bench_search_info.py --fetch-debian-docs --workdir /tmp/bench-info --skip-crawl
    git worktree add /tmp/before 66beef2    # the commit before issue 44's query rules
    python tools/bench_search_info.py --fetch-debian-docs --workdir /tmp/bench-info \
        --skip-crawl --compare-tree /tmp/before

Measured, for each system and for each kind of query: MRR over the top 10 (the reciprocal
rank of the first relevant page, 0 when absent), recall@10 (the share of queries with a
relevant page in the top 10) and the queries answered with nothing at all; then the wall
time of ``python -m crawler search DIR QUERY`` as a command (p50 over ``--command-runs``
runs: a number for a quiet machine, and the load average is recorded beside it; with
``--compare-tree`` another checkout's command too, the two alternating).

Theory of operation. The pages: Django's documentation from the Debian package
python-django-doc (``--fetch-debian-docs``; ``apt-get download`` and ``dpkg-deb -x`` as
tools/bench_extract.py does, nothing installed), or any Sphinx HTML directory with an
``objects.inv`` (``--html-root``). They are served on 127.0.0.1 and crawled, ranked and
indexed by the crawler's own commands (as tools/bench_search.py does: every HTML file a
seed; the crawl kept to the served origin). The judged set is written from the manual's
index, ``objects.inv``, before any result is seen: Python objects (query: the dotted name,
half of them, seeded, cut to its last two parts, ``QuerySet.filter``), labelled sections
(query: the section's title) and Django's settings, template tags and filters, field
lookups and django-admin commands (query: the name and the kind's word, ``DATABASES
setting``). Kinds are sampled in turn (``--seed``), so a small kind is not drowned by the
labels. A query's relevant pages are the pages of every entry the same text names
(``Field.null`` is documented on several); entries on a page not crawled, or on an index
page, are dropped. The baselines index each page's title and text as our indexer reads it
(crawler.search.reading.indexable, over crawler.read.pagetext), so the three see the same
words; ours also has its headings, URL, anchor text and PageRank, which is what is being
judged. A hit of ours counts when its URL or a near-duplicate folded into it is relevant.

Results: a table on stdout and JSON (``--out``, default bench-results/search-info-<ts>.json)
with the judged set, each query's rank in each system and our first hit.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))
from tools import _benchutil as bu  # noqa: E402
from tools.bench_extract import fetch_debian_docs  # noqa: E402
from tools.bench_search import _Quiet  # noqa: E402

TOOL = "bench_search_info"
PY_KINDS = ("py:class", "py:method", "py:function", "py:attribute", "py:exception", "py:module")
# the std roles and the word a reader adds to the name
STD_WORDS = {"std:setting": "setting", "std:templatetag": "template tag",
             "std:templatefilter": "filter", "std:fieldlookup": "field lookup",
             "std:django-admin": "django-admin"}
KINDS = (*PY_KINDS, "std:label", *STD_WORDS)
INDEX_PAGES = ("genindex", "py-modindex", "search")  # lists of everything: never an answer
SYSTEMS = ("ours", "sqlite-fts5", "tantivy")
# Sphinx's own reading of an inventory line (sphinx.util.inventory)
_LINE = re.compile(r"(.+?)\s+(\S+)\s+(-?\d+)?\s+?(\S*)\s+(.*)")
_WORD = re.compile(r"\w+")
Entry = tuple[str, str, str, str]  # name, domain:role, page (served path), display title


def read_inventory(path: Path, prefix: str) -> list[Entry]:
    """The entries of a Sphinx objects.inv (version 2); pages as paths under the served
    root (``prefix``: the inventory's directory there, "" or ending in /)."""
    head = path.read_bytes().split(b"\n", 4)
    if len(head) < 5 or head[0].rstrip() != b"# Sphinx inventory version 2":
        raise SystemExit(f"{TOOL}: {path}: not a Sphinx inventory of version 2")
    try:
        text = zlib.decompress(head[4]).decode("utf-8")
    except (zlib.error, UnicodeDecodeError) as exc:
        raise SystemExit(f"{TOOL}: {path}: its compressed part is damaged ({exc})") from None
    out = []
    for line in text.splitlines():
        m = _LINE.match(line.rstrip("\r"))
        if m is None:
            continue
        name, role, _, uri, disp = m.groups()
        if uri.endswith("$"):
            uri = uri[:-1] + name
        page = unquote(uri.partition("#")[0])
        page = page + "index.html" if page.endswith("/") or not page else page
        out.append((name, role, prefix + page, name if disp == "-" else disp))
    return out


def page_path(url: str, base: str) -> str:
    """A crawled URL as a path under the served root (a directory's URL is its index.html)."""
    path = unquote(urlsplit(url).path)[len(urlsplit(base).path) + 1:]
    return path + "index.html" if path.endswith("/") or not path else path


def query_of(entry: Entry, shorten: bool) -> str:
    name, role, _, disp = entry
    if role in PY_KINDS:
        return ".".join(name.split(".")[-2:]) if shorten else name
    if role == "std:label":
        return disp
    word = STD_WORDS[role]
    name = name.rpartition(".")[2]  # a field lookup's "arrayfield." is a namespace
    return f"{word} {name}" if role == "std:django-admin" else f"{name} {word}"


def answers(entry: Entry, query: str) -> bool:
    """Whether ``entry`` documents what ``query`` (of the same kind family) names."""
    name, role, _, disp = entry
    if role in PY_KINDS:
        return name == query or name.endswith("." + query)
    if role == "std:label":
        return disp.casefold() == query.casefold()
    return query_of(entry, False) == query


def judged_set(entries: list[Entry], crawled: set[str], n: int, seed: int) -> list[dict[str, Any]]:
    """Up to ``n`` queries, the kinds taken in turn, each with its relevant pages."""
    def eligible(e: Entry) -> bool:
        name, role, page, disp = e
        if role not in KINDS or page not in crawled:
            return False
        if Path(page).stem in INDEX_PAGES:
            return False
        return role != "std:label" or (disp != name and _WORD.search(disp) is not None)

    pool = [e for e in entries if eligible(e)]
    rng = random.Random(seed)
    by_kind = {k: [e for e in pool if e[1] == k] for k in KINDS}
    for k in KINDS:
        rng.shuffle(by_kind[k])
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(out) < n and any(by_kind.values()):
        for kind in KINDS:
            if not by_kind[kind] or len(out) >= n:
                continue
            entry = by_kind[kind].pop()
            shorten = kind in PY_KINDS and rng.random() < 0.5 and entry[0].count(".") >= 2
            q = query_of(entry, shorten)
            if q.casefold() in seen or not _WORD.search(q):
                continue
            seen.add(q.casefold())
            family = PY_KINDS if kind in PY_KINDS else (kind,)
            relevant = sorted({e[2] for e in pool if e[1] in family and answers(e, q)})
            out.append({"kind": kind, "name": entry[0], "query": q, "page": entry[2],
                        "shortened": shorten, "relevant": relevant})
    return out


def serve(root: Path, port: int) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(root))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise SystemExit(f"{TOOL}: cannot serve on 127.0.0.1:{port}: {exc.strerror}; "
                         "try --port 0") from None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def crawl(root: Path, base: str, data: Path, work: Path) -> dict[str, Any]:
    """tools/bench_search.py's crawl (every HTML file a seed, then rank), kept to the
    served origin: Django's manual links to http://127.0.0.1:8000/, whose refused
    connection would mark host 127.0.0.1 bad and stop the crawl of the rest."""
    files = sorted(p for p in root.rglob("*.html") if p.is_file())
    seeds = work / "seeds.txt"
    seeds.write_text("".join(f"{base}/{p.relative_to(root).as_posix()}\n" for p in files))
    started = time.monotonic()
    for cmd in (["start", "--data", str(data), "--seeds-file", str(seeds), "--allow-private-ips",
                 "--allow-regex", "^" + re.escape(base) + "/", "--delay", "0", "--per-host",
                 "8", "--threads", "16", "--sitemaps", "off", "--quiet"],
                ["rank", str(data), "--quiet", "--top", "0"]):
        done = subprocess.run([sys.executable, "-m", "crawler", *cmd], cwd=REPO,
                              env=bu.child_env(), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{TOOL}: crawler {cmd[0]} failed: {done.stderr[-2000:]}")
    return {"seeds": len(files), "html_bytes": sum(p.stat().st_size for p in files),
            "crawl_s": time.monotonic() - started}


def crawled_pages(data: Path) -> list[tuple[str, str, str]]:
    """(URL, title, text) of every page the index holds, read as the indexer reads it."""
    from crawler.read.listing import CrawlReader
    from crawler.read.pagetext import DEFAULT_TEXT_LIMIT
    from crawler.search.reading import indexable

    out = []
    with CrawlReader(str(data)) as reader:
        for page in reader.pages():
            text = indexable(page, DEFAULT_TEXT_LIMIT)
            if text is not None:
                out.append((page.url, text.title, text.text))
    return out


Ranker = Callable[[str], list[list[str]]]  # query -> the top 10, each hit's URLs


def ours(data: Path) -> tuple[Ranker, Callable[[], None], dict[str, str]]:
    from crawler.search.query import QueryError, Searcher

    searcher = Searcher(str(data))
    firsts: dict[str, str] = {}  # query -> our first hit, "URL (title)"

    def rank(q: str) -> list[list[str]]:
        try:
            hits = searcher.search(q, limit=10).hits
        except QueryError:
            return []
        if hits:
            firsts[q] = f"{hits[0].url} ({hits[0].title})"
        return [[h.url, *h.duplicates] for h in hits]
    return rank, searcher.close, firsts


def fts5(docs: list[tuple[str, str, str]]) -> Ranker:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE docs USING fts5(url UNINDEXED, title, body)")
    db.executemany("INSERT INTO docs VALUES (?, ?, ?)", docs)

    def rank(q: str) -> list[list[str]]:
        match = " OR ".join(f'"{w}"' for w in _WORD.findall(q))
        rows = db.execute("SELECT url FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) "
                          "LIMIT 10", (match,)).fetchall()
        return [[str(r[0])] for r in rows]
    return rank


def plain_tantivy(docs: list[tuple[str, str, str]]) -> Ranker:
    import tantivy

    builder = tantivy.SchemaBuilder()
    for name in ("url", "title", "body"):
        builder.add_text_field(name, stored=name == "url")
    index = tantivy.Index(builder.build())  # in memory
    writer = index.writer()
    for url, title, body in docs:
        writer.add_document(tantivy.Document(url=url, title=title, body=body))
    writer.commit()
    index.reload()
    searcher = index.searcher()

    def rank(q: str) -> list[list[str]]:
        # each word quoted: "and", "or", "not" stay words, not operators
        query = index.parse_query(" ".join(f'"{w}"' for w in _WORD.findall(q)),
                                  ["title", "body"], conjunction_by_default=False)
        return [[str(searcher.doc(a).get_first("url"))]
                for _, a in searcher.search(query, limit=10).hits]
    return rank


def scores(judged: list[dict[str, Any]], system: str) -> dict[str, dict[str, Any]]:
    """MRR@10, recall@10 and unanswered queries of ``system``, by kind and over all."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for q in judged:
        groups[q["kind"]].append(q)
        groups["all"].append(q)
    out = {}
    for kind, qs in groups.items():
        ranks = [q["ranks"][system] for q in qs]
        out[kind] = {"queries": len(qs), "mrr": statistics.fmean(1 / r if r else 0.0
                                                                 for r in ranks),
                     "recall": sum(r > 0 for r in ranks) / len(qs),
                     "no_answer": sum(q["hits"][system] == 0 for q in qs)}
    return out


def command_p50(data: Path, queries: list[str], runs: int,
                other: Path | None = None) -> dict[str, Any]:
    """Wall times of ``python -m crawler search`` as a command; with ``other`` (another
    checkout) that tree's too, the two alternating run by run (a ratio in one run)."""
    trees = {"this": REPO, **({"other": other} if other is not None else {})}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for i in range(runs):
        for name, tree in trees.items():
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "crawler", "search", str(data), "--",
                                   queries[i % len(queries)]], cwd=tree,
                                  env={**bu.child_env(), "PYTHONPATH": str(tree)},
                                  capture_output=True, check=False)
            times[name].append(time.perf_counter() - started)
            if done.returncode != 0:
                raise SystemExit(f"{TOOL}: crawler search ({tree}) failed: "
                                 f"{done.stderr[-500:]!r}")
    out = {"runs": runs, "p50_s": bu.median(times["this"]), "times_s": times["this"],
           "queries": sorted(set(queries[:runs])),
           "note": "wall time of a fresh process: meaningful on a quiet machine "
                   "(see loadavg)", "loadavg": bu.loadavg()}
    if other is not None:
        out["other"] = {"tree": str(other), "p50_s": bu.median(times["other"]),
                        "times_s": times["other"]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fetch-debian-docs", action="store_true")
    p.add_argument("--debian-packages", default="python-django-doc")
    p.add_argument("--html-root", type=Path, help="a Sphinx HTML directory with objects.inv")
    p.add_argument("--workdir", type=Path, help="downloads and the crawl (default: temp)")
    p.add_argument("--queries", type=int, default=600, help="judged queries at most")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=0, help="the server's port (0: any)")
    p.add_argument("--skip-crawl", action="store_true", help="reuse the crawl in --workdir")
    p.add_argument("--command-runs", type=int, default=20, help="runs of crawler search")
    p.add_argument("--compare-tree", type=Path, help="another checkout (git worktree) whose "
                   "search command is timed too, alternating with this one's")
    p.add_argument("--out", type=Path,
                   help="JSON path (default bench-results/search-info-<ts>.json)")
    args = p.parse_args(argv)
    if args.queries < 1 or args.command_runs < 1:
        raise SystemExit(f"{TOOL}: --queries and --command-runs must be at least 1")
    if (args.html_root is None) == (not args.fetch_debian_docs):
        raise SystemExit(f"{TOOL}: give one of --fetch-debian-docs or --html-root DIR")
    if args.compare_tree is not None and not (args.compare_tree / "crawler").is_dir():
        raise SystemExit(f"{TOOL}: --compare-tree {args.compare_tree}: not a checkout "
                         "(no crawler/ in it)")
    if args.skip_crawl and args.workdir is None:
        raise SystemExit(f"{TOOL}: --skip-crawl reuses the crawl in --workdir: give it")
    temp = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="bench-search-info-")) if temp else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    loadavg_start = bu.loadavg()
    try:
        if args.html_root is not None:
            root = args.html_root.resolve()
            if not (root / "objects.inv").is_file():
                raise SystemExit(f"{TOOL}: {args.html_root}: no objects.inv; --html-root "
                                 "needs a Sphinx HTML directory")
            inventories = [root / "objects.inv"]
        else:
            root = work / "root"  # every package under it, served as one site
            try:
                fetched = fetch_debian_docs(work, args.debian_packages.split(","))
            except subprocess.CalledProcessError as exc:
                raise SystemExit(f"{TOOL}: {' '.join(exc.cmd)} failed "
                                 f"(exit {exc.returncode})") from None
            inventories = []
            for pkg, pkg_root in fetched:
                found = sorted(pkg_root.rglob("objects.inv"), key=lambda x: len(x.parts))
                if not found:
                    raise SystemExit(f"{TOOL}: {pkg} has no objects.inv (not Sphinx HTML)")
                inventories.append(found[0])
        entries = [e for inv in inventories for e in read_inventory(
            inv, "" if inv.parent == root else inv.parent.relative_to(root).as_posix() + "/")]
        data = work / "crawl"
        if args.skip_crawl:
            if not (work / "site.json").is_file():
                raise SystemExit(f"{TOOL}: {work}: no finished crawl to reuse (no site.json)")
        else:
            shutil.rmtree(data, ignore_errors=True)
            (work / "site.json").unlink(missing_ok=True)
            server, base = serve(root, args.port)
            try:
                bu.log(f"crawling {root} from {base} ...")
                site = crawl(root, base, data, work)
            finally:
                server.shutdown()
                server.server_close()
            (work / "site.json").write_text(json.dumps({**site, "base": base}))
        site = json.loads((work / "site.json").read_text())
        done = subprocess.run([sys.executable, "-m", "crawler", "index", str(data), "--quiet",
                               "--json"], cwd=REPO, env=bu.child_env(), capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{TOOL}: crawler index failed: {done.stderr[-2000:]}")
        docs = crawled_pages(data)
        paths = {page_path(url, site["base"]) for url, _, _ in docs}
        judged = judged_set(entries, paths, args.queries, args.seed)
        if not judged:
            raise SystemExit(f"{TOOL}: no entry of objects.inv is on a crawled page")
        bu.log(f"{len(docs)} pages indexed, {len(judged)} queries judged")
        rank_ours, close, firsts = ours(data)
        rankers = {"ours": rank_ours, "sqlite-fts5": fts5(docs), "tantivy": plain_tantivy(docs)}
        for q in judged:
            q["ranks"], q["hits"] = {}, {}
            relevant = set(q["relevant"])
            for name, rank in rankers.items():
                top = rank(q["query"])
                q["hits"][name] = len(top)
                q["ranks"][name] = next((i + 1 for i, urls in enumerate(top) if any(
                    page_path(u, site["base"]) in relevant for u in urls)), 0)
            q["ours_first"] = firsts.get(q["query"], "")
        close()
        command = command_p50(data, [q["query"] for q in judged], args.command_runs,
                              args.compare_tree)
    finally:
        if temp:
            shutil.rmtree(work, ignore_errors=True)
    results = {s: scores(judged, s) for s in SYSTEMS}

    def rr(q: dict[str, Any], s: str) -> float:
        return 1 / q["ranks"][s] if q["ranks"][s] else 0.0
    worse = [q for q in judged if rr(q, "ours") < min(rr(q, "sqlite-fts5"), rr(q, "tantivy"))]
    kinds = [k for k in (*KINDS, "all") if k in results["ours"]]
    table = bu.markdown_table(
        ["kind", "queries", *(f"{s}: MRR@10 / R@10 / none" for s in SYSTEMS)],
        [[k, str(results["ours"][k]["queries"]), *(
            f"{results[s][k]['mrr']:.3f} / {results[s][k]['recall']:.3f} / "
            f"{results[s][k]['no_answer']}" for s in SYSTEMS)] for k in kinds])
    text = (f"{table}\n\n{len(docs):,} pages indexed; {len(judged)} queries; ours worse than "
            f"both baselines on {len(worse)}; crawler search as a command: p50 "
            f"{command['p50_s']:.2f} s over {command['runs']} runs"
            + (f", {command['other']['tree']}'s {command['other']['p50_s']:.2f} s"
               if "other" in command else "")
            + f" (load average {command['loadavg']}: a number for a quiet machine)")
    out_path = args.out or REPO / "bench-results" / f"search-info-{bu.timestamp()}.json"
    bu.write_results(out_path, {
        "revision": bu.git_revision(REPO),
        "machine": {**bu.machine_info(("tantivy", "resiliparse")), "load_start": loadavg_start},
        "sqlite": sqlite3.sqlite_version,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "site": site, "pages_indexed": len(docs), "results": results, "command": command,
        "ours_worse_than_both": [q["query"] for q in worse], "judged": judged}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
