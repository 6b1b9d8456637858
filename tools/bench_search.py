"""Benchmark the search index on real HTML crawled by the crawler itself (issue 30). Not a test.

Usage (from the repository root)::

    python tools/bench_search.py --fetch-debian-docs --workdir /tmp/bench-search
    python tools/bench_search.py --html-root DIR --workdir /tmp/bench-search --repeat 3

The pages: Debian documentation packages (``--debian-packages``; by default
python3.11-doc and postgresql-doc-15, ~1,700 pages of HTML written by nobody here,
downloaded with ``apt-get download`` as tools/bench_extract.py does), or any directory
of HTML (``--html-root``). They are served on 127.0.0.1 by a threaded
``http.server`` in this process and crawled by ``python -m crawler start`` (every HTML
file a seed, so every page is crawled whatever links it has; the links found give the
anchor text and PageRank), then ranked (``python -m crawler rank``).

Measured:

- **indexing**: ``python -m crawler index DIR --rebuild`` run ``--repeat`` times (each in
  a fresh process, extraction included): pages/s, CPU ms a page, peak RSS; the index's
  size on disk against the stored bodies' bytes (and against the pages' HTML as served);
- **navigational quality**: every indexed page whose title no other page has is looked
  for by its title's words (punctuation dropped, all words required); its reciprocal
  rank in the top 10 (0 when absent) is averaged: MRR, and the share found first. Run
  with the default fields, without the anchor field, without the title field's boost,
  and with PageRank weights 0, 0.1, 0.25, 0.5, 1 (``--weights``): the numbers that
  choose the blend's weight (docs/SEARCH.md);
- **query latency**: those title queries and one-word queries (the corpus's words of
  document frequency ranks 1, 10, 100, 1,000), through ``Searcher.search`` (candidates,
  PageRank lookups, near-duplicate folding and snippets included): p50 and p95, after a
  warm-up pass.

Results: a table on stdout and JSON (``--out``, default bench-results/search-<ts>.json).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))
from tools import _benchutil as bu  # noqa: E402
from tools.bench_extract import fetch_debian_docs  # noqa: E402

DEBIAN_PACKAGES = "python3.11-doc,postgresql-doc-15"
WEIGHTS = "0,0.1,0.25,0.5,1"
_WORD = re.compile(r"\w+")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's
        pass


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def crawl(root: Path, base: str, data: Path, work: Path) -> dict[str, Any]:
    files = sorted(p for p in root.rglob("*.html") if p.is_file())
    seeds = work / "seeds.txt"
    seeds.write_text("".join(f"{base}/{p.relative_to(root).as_posix()}\n" for p in files))
    cmd = [sys.executable, "-m", "crawler", "start", "--data", str(data), "--seeds-file",
           str(seeds), "--allow-private-ips", "--delay", "0", "--per-host", "8",
           "--threads", "16", "--sitemaps", "off", "--quiet"]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=bu.child_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_search: the crawl failed: {done.stderr[-2000:]}")
    rank = subprocess.run([sys.executable, "-m", "crawler", "rank", str(data), "--quiet",
                           "--top", "0"], cwd=REPO, env=bu.child_env(), capture_output=True,
                          text=True)
    if rank.returncode != 0:
        raise SystemExit(f"bench_search: rank failed: {rank.stderr[-2000:]}")
    return {"seeds": len(files), "html_bytes": sum(p.stat().st_size for p in files),
            "crawl_s": time.monotonic() - started}


def index_runs(data: Path, repeat: int, work: Path) -> list[dict[str, Any]]:
    runs = []
    for i in range(repeat):
        out = work / f"index-{i}.json"
        r = bu.run_measured([sys.executable, "-m", "crawler", "index", str(data), "--rebuild",
                             "--quiet", "--json"], cwd=REPO, env=bu.child_env(),
                            stdout_path=out, stderr_path=work / f"index-{i}.err")
        if r["returncode"] != 0:
            raise SystemExit(f"bench_search: index failed: "
                             f"{(work / f'index-{i}.err').read_text()[-2000:]}")
        stats = json.loads(out.read_text())
        r.update(stats=stats, pages_per_s=stats["read"] / r["wall_s"],
                 cpu_ms_per_page=1000 * r["cpu_s"] / max(1, stats["read"]))
        runs.append(r)
        bu.log(f"index run {i + 1}: {r['pages_per_s']:.0f} pages/s, "
               f"{r['cpu_ms_per_page']:.2f} CPU ms/page, peak {r['peak_rss_bytes'] / 1e6:.0f} MB")
    return runs


def corpus_facts(data: Path) -> tuple[dict[str, str], int, Counter[str]]:
    """(URL -> title of the pages whose title is unique, stored body bytes, document
    frequency of each word of the indexed pages' titles and text)."""
    import tantivy

    from crawler.read.listing import CrawlReader
    from crawler.search import schema

    body_bytes = 0
    with CrawlReader(str(data)) as reader:
        for page in reader.pages():
            body_bytes += len(page.body)
    titles: dict[str, list[str]] = {}
    df: Counter[str] = Counter()
    for directory in index_dirs(data):
        index = schema.open_index(directory, create=False)
        assert index is not None, directory
        searcher = index.searcher()
        for _, address in searcher.search(tantivy.Query.all_query(), limit=10_000_000).hits:
            doc = searcher.doc(address)
            title = str(doc.get_first("title") or "")
            titles.setdefault(title, []).append(str(doc.get_first("url")))
            df.update(set(_WORD.findall(
                (title + " " + str(doc.get_first("body") or "")).lower())))
    unique = {urls[0]: t for t, urls in titles.items() if len(urls) == 1 and _WORD.search(t)}
    return unique, body_bytes, df


def index_dirs(data: Path) -> list[str]:
    """The search directory of every shard of the crawl in ``data``."""
    from crawler.search import schema
    from crawler.state.shards import shard_dirs

    return [schema.search_dir(d) for d in shard_dirs(str(data))]


def title_query(title: str) -> str:
    return " ".join(_WORD.findall(title))


def mrr(data: Path, targets: dict[str, str], **searcher_kw: Any) -> dict[str, float]:
    from crawler.search.query import Searcher

    rr, first = [], 0
    with Searcher(str(data), **searcher_kw) as s:
        for url, title in targets.items():
            hits = [h.url for h in s.search(title_query(title), limit=10).hits]
            rank = hits.index(url) + 1 if url in hits else 0
            rr.append(1.0 / rank if rank else 0.0)
            first += rank == 1
    return {"mrr": statistics.fmean(rr) if rr else 0.0,
            "first": first / max(1, len(rr)), "queries": len(rr)}


def latency(data: Path, queries: list[str], runs: int) -> dict[str, float]:
    from crawler.search.query import Searcher

    times = []
    with Searcher(str(data)) as s:
        for q in queries:  # warm-up: the index in the page cache
            s.search(q)
        for _ in range(runs):
            for q in queries:
                t = time.perf_counter()
                s.search(q)
                times.append(1000 * (time.perf_counter() - t))
    times.sort()
    return {"p50_ms": times[len(times) // 2], "p95_ms": times[int(len(times) * 0.95)],
            "queries": len(queries), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fetch-debian-docs", action="store_true")
    p.add_argument("--debian-packages", default=DEBIAN_PACKAGES)
    p.add_argument("--html-root", type=Path, help="a directory of HTML to serve and crawl")
    p.add_argument("--repeat", type=int, default=3, help="index builds measured")
    p.add_argument("--weights", default=WEIGHTS, help="PageRank weights tried for MRR")
    p.add_argument("--query-runs", type=int, default=5)
    p.add_argument("--workdir", type=Path, help="downloads and the crawl (default: temp)")
    p.add_argument("--out", type=Path, help="JSON path (default bench-results/search-<ts>.json)")
    args = p.parse_args(argv)
    temp = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="bench-search-")) if temp else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.html_root is not None:
            root = args.html_root
        elif args.fetch_debian_docs:
            root = work / "site"
            if not root.is_dir():
                tmp = work / "site.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                for pkg, pkg_root in fetch_debian_docs(work, args.debian_packages.split(",")):
                    shutil.copytree(pkg_root, tmp / pkg, symlinks=False,
                                    ignore_dangling_symlinks=True)
                tmp.rename(root)
        else:
            raise SystemExit("bench_search: give --fetch-debian-docs or --html-root DIR")
        data = work / "crawl"
        if not (work / "site.json").exists():  # written once the crawl and rank are done
            shutil.rmtree(data, ignore_errors=True)
            server, base = serve(root)
            try:
                bu.log(f"crawling {root} from {base} ...")
                (work / "site.json").write_text(json.dumps(crawl(root, base, data, work)))
            finally:
                server.shutdown()
        site = json.loads((work / "site.json").read_text())
        runs = index_runs(data, args.repeat, work)
        index_bytes = sum(bu.disk_usage(Path(d) / "tantivy")[0] for d in index_dirs(data))
        targets, body_bytes, df = corpus_facts(data)
        by_df = [w for w, _ in df.most_common()]
        words = [by_df[i] for i in (0, 9, 99, 999) if i < len(by_df)]
        quality: dict[str, Any] = {}
        for w in (float(x) for x in args.weights.split(",")):
            quality[f"all fields, rank weight {w:g}"] = mrr(data, targets, rank_weight=w)
        from crawler.search.schema import BOOSTS, QUERY_FIELDS
        quality["no anchor text, rank weight 0"] = mrr(
            data, targets, rank_weight=0.0, fields=[f for f in QUERY_FIELDS if f != "anchors"])
        quality["no field boosts, rank weight 0"] = mrr(
            data, targets, rank_weight=0.0, boosts={f: 1.0 for f in BOOSTS})
        lat_titles = latency(data, [title_query(t) for t in list(targets.values())[:300]],
                             args.query_runs)
        lat_words = latency(data, words, args.query_runs * 20)
    finally:
        if temp:
            shutil.rmtree(work, ignore_errors=True)
    pages = runs[0]["stats"]["indexed"]
    summary = {
        "pages_indexed": pages, "records_read": runs[0]["stats"]["read"],
        "index_pages_per_s": bu.median([r["pages_per_s"] for r in runs]),
        "index_cpu_ms_per_page": bu.median([r["cpu_ms_per_page"] for r in runs]),
        "index_peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
        "index_bytes": index_bytes, "stored_body_bytes": body_bytes,
        "index_vs_bodies": index_bytes / max(1, body_bytes),
        "index_vs_html": index_bytes / max(1, site["html_bytes"]),
        "title_queries": len(targets), "quality": quality,
        "latency_title_queries": lat_titles, "latency_word_queries": lat_words,
        "words": words}
    print(bu.markdown_table(
        ["pages", "index pages/s", "CPU ms/page", "peak RSS", "index / bodies",
         "title p50 / p95 ms", "word p50 / p95 ms"],
        [[f"{pages:,}", f"{summary['index_pages_per_s']:,.0f}",
          f"{summary['index_cpu_ms_per_page']:.2f}", bu.fmt_bytes(summary["index_peak_rss_bytes"]),
          f"{summary['index_vs_bodies']:.2f}",
          f"{lat_titles['p50_ms']:.1f} / {lat_titles['p95_ms']:.1f}",
          f"{lat_words['p50_ms']:.1f} / {lat_words['p95_ms']:.1f}"]]))
    print()
    print(bu.markdown_table(["configuration", "MRR", "found first", "queries"], [
        [name, f"{q['mrr']:.3f}", f"{q['first']:.3f}", str(q["queries"])]
        for name, q in quality.items()]))
    out_path = args.out or REPO / "bench-results" / f"search-{bu.timestamp()}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({
        "machine": bu.machine_info(("tantivy", "resiliparse", "numpy")),
        "loadavg": bu.loadavg(), "revision": bu.git_revision(REPO),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "site": site, "runs": runs, "summary": summary}, indent=1, default=str))
    bu.log(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
