"""Query latency of the crawler's own search path at a million pages (issue 30). Not a test.

Usage (from the repository root)::

    python tools/bench_search_scale.py --pages 1000000 --workdir /tmp/bench-search-scale
    python tools/bench_search_scale.py --crawl /tmp/seed20m --workdir /tmp/bss --titles 100

With ``--crawl DIR`` nothing is built: the crawl's own index (``python -m crawler index
DIR``) is queried with its pages' titles, their first two words and their first word.

tools/bench_index.py compared index libraries on their own; this one asks the question
a user of ``python -m crawler search`` has: how long does a query take through
crawler.search.query.Searcher (the query parsed over every field and the 18 stemmed
fields, each shard's best candidates, the PageRank blend, near-duplicate folding, the
stored documents read back, snippets made) on an index of that size?

The index (made once into ``--workdir``, reused while ``--pages``, ``--shards`` and
``--seed`` agree): bench_index's synthetic corpus (Zipf-drawn pseudo-words, lognormal
body lengths, median 250 words, ~2.1 KB of text a page; see its docstring), each page
written through crawler.search.indexer.document, the function ``python -m crawler
index`` writes with, to the shard that owns its host (crawler.state.shards.owner), in
a crawl directory of ``--shards`` shards (2, the default of this 2-core machine). Every
page is English (lang ``en``: its text goes to ``stem_en`` too, as a real English page
would); no anchor text; a SimHash drawn at random (so almost nothing folds: the cost of
folding is still paid); no rank run (a PageRank lookup is a dict get: left out). The
build is timed too, but it is not the crawler's indexing rate (no extraction: see
tools/bench_search.py for that).

Queries (``--query-runs`` timed runs each, after a warm-up run, in a fresh process):
bench_index's set (single words of ranks 1 to 100,000; two-word ANDs; phrases), and
``--titles`` titles of random pages (a navigational query: the words of one page's
title). Reported: p50 and p95 a query kind, and over all.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from tools import _benchutil as bu
    from tools import bench_index as corpora
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tools import _benchutil as bu
    from tools import bench_index as corpora

BUILD_VERSION = 1  # of the index this tool makes (a change makes it again)


def build(args: argparse.Namespace) -> dict[str, Any]:
    """Write the corpus's first ``--pages`` pages into a crawl directory's shard indexes."""
    from crawler.read.pagetext import PageText
    from crawler.search.indexer import document
    from crawler.search.schema import open_index, search_dir
    from crawler.state.shards import open_layout, owner, shard_dir
    from crawler.web.urls import host_of

    data = Path(args.data)
    count = open_layout(str(data), args.shards)
    writers = []
    for i in range(count):
        index = open_index(search_dir(shard_dir(str(data), i, count)), create=True)
        assert index is not None
        writers.append(index.writer(heap_size=args.writer_mb << 20, num_threads=1))
    rng = random.Random(args.seed)
    t0, cpu0 = time.monotonic(), time.process_time()
    n = 0
    for _i, url, title, body in corpora.read_corpus(Path(args.corpus), args.pages):
        text = PageText(title=title, text=body, lang="en", simhash=rng.getrandbits(64))
        writers[owner(host_of(url), count)].add_document(document(url, 0.0, text, ""))
        n += 1
        if n % args.batch == 0:
            for w in writers:
                w.commit()
            bu.log(f"build: {n:,} pages, {n / (time.monotonic() - t0):,.0f}/s")
    for w in writers:
        w.commit()
        w.wait_merging_threads()
    wall = time.monotonic() - t0
    return {"pages": n, "wall_s": wall, "pages_per_s": n / wall,
            "cpu_ms_a_page": 1e3 * (time.process_time() - cpu0) / max(1, n),
            "peak_rss_bytes": bu.peak_rss_bytes(),
            "index_bytes": sum(bu.disk_usage(search_dir(shard_dir(str(data), i, count)))[0]
                               for i in range(count))}


def queries(args: argparse.Namespace) -> dict[str, Any]:
    """Every query through Searcher.search, timed."""
    todo: list[tuple[str, str, str]] = [(q["kind"], q["text"], "")
                                        for q in corpora.query_set(args.vocab)]
    rng = random.Random(args.seed + 1)
    wanted = set(rng.sample(range(1, args.pages + 1), min(args.titles, args.pages)))
    for i, url, title, _body in corpora.read_corpus(Path(args.corpus), max(wanted)):
        if i in wanted:
            todo.append(("title", title, url))
    return timed(args.data, todo, lambda kind: args.query_runs if kind != "title" else 3)


def timed(data: str, todo: list[tuple[str, str, str]],
          runs: Callable[[str], int]) -> dict[str, Any]:
    """Each (kind, text, url) of ``todo`` through Searcher.search: a warm-up run, then
    ``runs(kind)`` timed ones; with a url, whether it came first."""
    from crawler.search.query import Searcher

    t0 = time.monotonic()
    out: list[dict[str, Any]] = []
    with Searcher(data) as searcher:
        open_s = time.monotonic() - t0
        for kind, text, url in todo:
            first = searcher.search(text, limit=10)  # the warm-up run
            ms = []
            for _ in range(runs(kind)):
                t = time.perf_counter()
                searcher.search(text, limit=10)
                ms.append(1e3 * (time.perf_counter() - t))
            item = {"kind": kind, "text": text, "matches": first.matches,
                    "returned": len(first.hits), "ms": ms}
            if url:
                item["first"] = bool(first.hits) and first.hits[0].url == url
            out.append(item)
    return {"open_s": open_s, "queries": out, "peak_rss_bytes": bu.peak_rss_bytes()}


def crawl_queries(args: argparse.Namespace) -> dict[str, Any]:
    """Queries made of an indexed crawl's own pages (``--crawl``): the titles of
    ``--titles`` HTML pages drawn from the first 20,000 records of each shard, each
    title whole, its first two words and its first word, timed through Searcher.search
    like the synthetic ones."""
    from crawler.read.listing import CrawlReader, page_meta

    seen: list[str] = []
    with CrawlReader(args.data) as reader:
        for shard, store in enumerate(reader.stores):
            for taken, key in enumerate(store or ()):
                if taken >= 20_000:
                    break
                page = reader.load(shard, key)
                meta = page_meta(page) if page is not None and page.status == 200 else None
                if meta is not None and meta.title:
                    seen.append(meta.title)
    rng = random.Random(args.seed + 1)
    todo: list[tuple[str, str, str]] = []
    for title in rng.sample(seen, min(args.titles, len(seen))):
        words = title.split()
        todo += [("title", title, ""), ("two_words", " ".join(words[:2]), ""),
                 ("word", words[0], "")]
    return timed(args.data, todo, lambda kind: args.query_runs)


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def summarize(q: dict[str, Any]) -> list[dict[str, Any]]:
    kinds: dict[str, list[float]] = {}
    for item in q["queries"]:
        kinds.setdefault(item["kind"], []).extend(item["ms"])
        kinds.setdefault("all", []).extend(item["ms"])
    return [{"kind": k, "timed": len(v), "p50_ms": round(_percentile(v, 50), 2),
             "p95_ms": round(_percentile(v, 95), 2), "max_ms": round(max(v), 2)}
            for k, v in kinds.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=1_000_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--batch", type=int, default=50_000, help="pages a commit while building")
    p.add_argument("--writer-mb", type=int, default=64, help="each shard writer's memory")
    p.add_argument("--query-runs", type=int, default=20)
    p.add_argument("--titles", type=int, default=200, help="title queries of random pages")
    p.add_argument("--vocab", type=int, default=300_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, required=True, help="corpus and the index")
    p.add_argument("--out", type=Path, help="JSON path (default bench-results/...)")
    p.add_argument("--crawl", help="query this indexed crawl (`python -m crawler index DIR` "
                   "done) with its own pages' titles instead of the synthetic index")
    p.add_argument("--phase", choices=("build", "query", "crawl"), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.phase:  # a worker process
        bu.emit({"build": build, "query": queries, "crawl": crawl_queries}[args.phase](args))
        return 0
    if args.crawl:
        return query_crawl(args)
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus, meta = corpora.corpus(args.workdir, args.pages, args.seed, args.vocab)
    data = args.workdir / f"crawl-{args.pages}-{args.shards}-{args.seed}-v{BUILD_VERSION}"
    done = data / "built.json"
    common = [__file__, "--workdir", str(args.workdir), "--data", str(data),
              "--corpus", str(corpus), "--pages", str(args.pages), "--shards",
              str(args.shards), "--seed", str(args.seed), "--vocab", str(args.vocab)]
    if done.exists():
        built = json.loads(done.read_text())
    else:
        if data.exists():  # a build that did not finish: start over
            import shutil
            shutil.rmtree(data)
        bu.log(f"building the index of {args.pages:,} pages into {data} ...")
        built = bu.run_worker([*common, "--phase", "build", "--batch", str(args.batch),
                               "--writer-mb", str(args.writer_mb)])
        done.write_text(json.dumps(built))
    bu.log("querying through Searcher ...")
    q = bu.run_worker([*common, "--phase", "query", "--query-runs", str(args.query_runs),
                       "--titles", str(args.titles)])
    table = summarize(q)
    titles = [x for x in q["queries"] if x["kind"] == "title"]
    result = {"machine": bu.machine_info(("numpy", "tantivy")), "loadavg": bu.loadavg(),
              "revision": bu.git_revision(Path(__file__).resolve().parent.parent),
              "args": {k: str(v) for k, v in vars(args).items()}, "corpus": meta,
              "build": built, "open_s": q["open_s"], "summary": table,
              "title_found_first": sum(x["first"] for x in titles) / max(1, len(titles)),
              "queries": q["queries"]}
    return report(args, "search-scale", result, table,
                  f"{built['pages']:,} pages in {args.shards} shards: built at "
                  f"{built['pages_per_s']:,.0f} pages/s, index "
                  f"{bu.fmt_bytes(built['index_bytes'])} "
                  f"({built['index_bytes'] / meta['text_bytes']:.2f}x the text); Searcher "
                  f"opened in {q['open_s']:.2f} s; title queries found first: "
                  f"{result['title_found_first']:.3f}")


def report(args: argparse.Namespace, name: str, result: dict[str, Any],
           table: list[dict[str, Any]], headline: str) -> int:
    """The JSON to ``--out`` (default bench-results/NAME-<ts>.json), then a headline
    and the latency table on stdout."""
    out = args.out or Path("bench-results") / f"{name}-{bu.timestamp()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(headline)
    print(bu.markdown_table(["queries", "timed", "p50 ms", "p95 ms", "max ms"],
                            [[t["kind"], str(t["timed"]), f"{t['p50_ms']:.1f}",
                              f"{t['p95_ms']:.1f}", f"{t['max_ms']:.1f}"] for t in table]))
    print(f"wrote {out}")
    return 0


def query_crawl(args: argparse.Namespace) -> int:
    """``--crawl DIR``: its index queried in a fresh process; a table, and JSON."""
    bu.log(f"querying the index of {args.crawl} through Searcher ...")
    q = bu.run_worker([__file__, "--workdir", str(args.workdir), "--data", args.crawl,
                       "--phase", "crawl", "--query-runs", str(args.query_runs), "--titles",
                       str(args.titles), "--seed", str(args.seed)])
    table = summarize(q)
    result = {"machine": bu.machine_info(("numpy", "tantivy")), "loadavg": bu.loadavg(),
              "revision": bu.git_revision(Path(__file__).resolve().parent.parent),
              "args": {k: str(v) for k, v in vars(args).items()}, "open_s": q["open_s"],
              "peak_rss_bytes": q["peak_rss_bytes"], "summary": table, "queries": q["queries"]}
    return report(args, "search-crawl", result, table,
                  f"{args.crawl}: Searcher opened in {q['open_s']:.2f} s, peak RSS "
                  f"{bu.fmt_bytes(q['peak_rss_bytes'])}")


if __name__ == "__main__":
    sys.exit(main())
