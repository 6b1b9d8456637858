"""PageRank on disk: the graph build and the out-of-core iterations against networkx.pagerank
(random graphs with dangling pages, self-links, nofollow and unrecorded targets, over many
blocks and buckets; a crawl of the test web, its graph taken from the site itself), the
stored ranks in pages/show/export, convergence reporting, and memory flat as the graph grows."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from crawl_helpers import REPO, run_crawl

import kvstore
from crawler.cli import main
from crawler.read.graph import REDIRECT, GraphBuilder, match, split_keys
from crawler.read.listing import CrawlReader
from crawler.read.rank import pagerank, write_order
from crawler.read.rankstore import RankStore
from crawler.state.pages import NOFOLLOW, PageRecord, encode_page
from crawler.web.urls import url_key
from tools.testweb import SiteConfig, TestWeb, fault

TOL = 1e-6  # max abs error allowed against networkx (the ranks sum to 1)


def random_graph(tmp: Path, n: int, *, seed: int, block: int, chunk: int,
                 bucket_nodes: int) -> tuple[np.ndarray, dict[int, float], np.ndarray]:
    """A random crawl graph through GraphBuilder.add, the same graph in networkx; returns
    (our ranks by rid, networkx's by rid, statuses)."""
    rng = random.Random(seed)
    keys = [url_key(f"http://g{seed}.test/{i}") for i in range(n)]
    status = [rng.choice((200,) * 6 + (301, 404, 500, 0)) for _ in range(n)]
    g = nx.DiGraph()
    g.add_nodes_from(i for i in range(n) if status[i] > 0)
    builder = GraphBuilder(str(tmp), expected=n, block=block, chunk=chunk,
                           bucket_nodes=bucket_nodes)
    for i in range(n):
        targets: list[int] = []
        flags: list[int] = []
        if status[i] == 200:
            targets = rng.sample(range(n + 10), rng.choice((0, 0, 1, 3, 8, 20)))  # i itself too
            flags = [NOFOLLOW if rng.random() < 0.15 else 0 for _ in targets]
        elif status[i] == 301:
            targets, flags = [rng.randrange(n + 3)], [REDIRECT]
        packed = b"".join(keys[t] if t < n else url_key(f"http://off.test/{t}") for t in targets)
        builder.add(keys[i], f"http://g{seed}.test/{i}", status[i], packed, bytes(flags))
        for t, f in zip(targets, flags, strict=True):
            if t < n and status[t] > 0 and not f & NOFOLLOW:
                g.add_edge(i, t)
    graph = builder.finish()
    result = pagerank(graph, tol=1e-12, max_iter=1000)
    assert result.converged and result.delta < 1e-12
    ours = np.fromfile(graph.path("rank.f8"))
    want = nx.pagerank(g, alpha=0.85, tol=1e-14, max_iter=10_000)
    return ours, want, np.array(status)


@pytest.mark.parametrize(("n", "seed", "block", "chunk", "bucket_nodes"), [
    (1, 0, 1, 1, 1),  # one page, alone
    (40, 1, 7, 5, 8),  # many blocks, tiles, buckets and tiny chunks
    (300, 2, 64, 97, 50),
    (2000, 3, 1 << 21, 1 << 20, 1 << 20),  # the defaults: one block, one bucket
    (1500, 4, 500, 256, 300),
])
def test_random_graphs_match_networkx(tmp_path: Path, n: int, seed: int, block: int,
                                      chunk: int, bucket_nodes: int) -> None:
    ours, want, status = random_graph(tmp_path / "g", n, seed=seed, block=block, chunk=chunk,
                                      bucket_nodes=bucket_nodes)
    assert set(want) == {i for i in range(n) if status[i] > 0}
    err = max(abs(ours[i] - want.get(i, 0.0)) for i in range(n))
    assert err < TOL, err
    assert (ours[status <= 0] == 0).all() and abs(ours.sum() - 1) < 1e-9


def test_a_graph_of_dangling_pages_only(tmp_path: Path) -> None:
    builder = GraphBuilder(str(tmp_path / "g"), block=2)
    for i in range(5):
        builder.add(url_key(f"http://d.test/{i}"), f"http://d.test/{i}", 200)
    result = pagerank(builder.finish(), max_iter=10)
    assert result.converged and result.iterations == 1
    ranks = np.fromfile(tmp_path / "g" / "rank.f8")
    assert np.allclose(ranks, 0.2)


def test_an_empty_graph(tmp_path: Path) -> None:
    graph = GraphBuilder(str(tmp_path / "g")).finish()
    assert pagerank(graph).iterations == 0
    write_order(graph)
    assert (tmp_path / "g" / "order.u8").stat().st_size == 0


def test_key_matching_is_exact_when_high_halves_collide() -> None:
    nhi = np.array([1, 5, 5, 5, 9], dtype=np.uint64)
    nlo = np.array([0, 1, 2, 7, 0], dtype=np.uint64)
    qhi = np.array([5, 5, 5, 9, 9, 0, 10], dtype=np.uint64)
    qlo = np.array([7, 2, 3, 0, 1, 0, 0], dtype=np.uint64)
    pos, found = match(nhi, nlo, qhi, qlo)
    assert found.tolist() == [True, True, False, True, False, False, False]
    assert pos[found].tolist() == [3, 2, 4]
    hi, lo = split_keys(b"\x00" * 7 + b"\x01" + b"\xff" * 8)
    assert hi.tolist() == [1] and lo.tolist() == [2**64 - 1]


# -- a crawl of the test web -------------------------------------------------------------


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path]]:
    faults = [fault("redirects"), fault("meta_robots"), fault("nxdomain"), fault("status_500")]
    with TestWeb(SiteConfig(pages=150, hosts=3, seed=8, crawl_delay=0.0), faults=faults) as web:
        data = tmp_path_factory.mktemp("rank") / "crawl"
        run_crawl(web, data)
        assert main(["rank", str(data), "--tol", "1e-12", "--quiet", "--top", "0"]) == 0
        yield web, data


def site_graph(web: TestWeb, pages: dict[str, PageRecord]) -> nx.DiGraph:
    """The fetched graph from the site's own description of each URL (the records only say
    which pages link to themselves: the site's graph leaves #top links out)."""
    fetched = {u for u, p in pages.items() if p.status > 0}
    assert fetched == set(web.oracle.crawl().fetched)
    g = nx.DiGraph()
    g.add_nodes_from(fetched)
    for url in fetched:
        node = web.oracle.describe(url)
        assert node is not None
        if node.status in (301, 302, 303, 307, 308) and node.location in fetched:
            g.add_edge(url, node.location)
        elif node.status == 200 and node.html and not node.nofollow:
            targets = set(node.links)
            if url_key(url) in pages[url].link_keys():
                targets.add(url)
            g.add_edges_from((url, t) for t in targets if t in fetched)
    return g


def test_testweb_crawl_ranks_match_networkx(crawl: tuple[TestWeb, Path]) -> None:
    web, data = crawl
    with CrawlReader(data) as reader:
        pages = {p.url: p for p in reader.pages(with_body=False)}
    g = site_graph(web, pages)
    assert any(1 for u in g if 300 <= pages[u].status < 400)  # redirects are nodes
    assert any(g.out_degree(u) == 0 for u in g)  # so are dangling pages
    want = nx.pagerank(g, alpha=0.85, tol=1e-14, max_iter=10_000)
    with RankStore(str(data)) as store:
        err = max(abs(store.get(url_key(u)).raw - r) for u, r in want.items())  # type: ignore[union-attr]
        assert err < TOL, err
        assert all(store.get(url_key(u)) is None for u, p in pages.items() if p.status <= 0)
        top = max(want, key=want.__getitem__)
        assert store.get(url_key(top)).scaled == 100.0  # type: ignore[union-attr]
        assert store.meta["converged"] and store.meta["delta"] < 1e-12


def test_pages_sort_rank_show_and_jsonl_carry_the_ranks(
    crawl: tuple[TestWeb, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web, data = crawl
    assert main(["pages", str(data), "--sort", "rank", "--json"]) == 0
    objs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ranked = [o for o in objs if o["rank"] is not None]
    assert [o["rank"] for o in ranked] == sorted((o["rank"] for o in ranked), reverse=True)
    assert ranked[0]["rank_scaled"] == 100.0 and all(o["status"] > 0 for o in ranked)
    assert objs[len(ranked):] and all(o["status"] == 0 for o in objs[len(ranked):])
    assert {o["url"] for o in objs} == set(web.oracle.crawl().fetched) | {
        o["url"] for o in objs if o["status"] == 0}

    assert main(["pages", str(data), "--sort", "rank", "--limit", "3"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [r[4] for r in rows] == [o["url"] for o in ranked[:3]]
    assert rows[0][3] == "100.00"

    top = ranked[0]["url"]
    assert main(["show", str(data), top]) == 0
    out = capsys.readouterr().out
    assert "rank:         100.00 (raw " in out and "inlinks:" in out

    jsonl = tmp_path / "c.jsonl"
    assert main(["export", str(data), "--jsonl", str(jsonl), "--quiet"]) == 0
    exported = {o["url"]: o for o in map(json.loads, jsonl.read_text().splitlines())}
    for o in objs:
        assert exported[o["url"]]["rank"] == o["rank"]
        assert exported[o["url"]]["rank_scaled"] == o["rank_scaled"]


def test_rank_summary_and_convergence_report(crawl: tuple[TestWeb, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _, data = crawl
    before = (data / "rank" / "rank.json").read_text()
    assert main(["rank", str(data), "--max-iter", "2", "--json", "--quiet", "--top", "2"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["iterations"] == 2 and not obj["converged"] and obj["delta"] > obj["tol"]
    assert len(obj["top"]) == 2 and obj["top"][0]["rank_scaled"] == 100.0
    assert main(["rank", str(data), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "converged after" in text and "L1 change" in text
    assert json.loads((data / "rank" / "rank.json").read_text())["converged"]
    assert before != (data / "rank" / "rank.json").read_text()  # replaced
    assert not list(data.glob("rank.*"))  # no temporary directory left


@pytest.mark.parametrize("argv", [["rank", "d", "--damping", "1"], ["rank", "d", "--tol", "0"],
                                  ["rank", "d", "--max-iter", "0"], ["rank", "d", "--top", "-1"],
                                  ["pages", "d", "--sort", "size"]])
def test_rank_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_sort_by_rank_without_ranks_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c").mkdir()
    with kvstore.open(tmp_path / "c" / "main") as db:
        db[url_key("http://a.test/")] = encode_page(PageRecord("http://a.test/", 200, 0, 0))
    assert main(["pages", str(tmp_path / "c"), "--sort", "rank"]) == 1
    assert "run python -m crawler rank" in capsys.readouterr().err


def test_help_and_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rank", "--help"]) == 0
    assert "example: python -m crawler rank" in capsys.readouterr().out
    text = (REPO / "docs" / "REPORT.md").read_text()
    assert "python -m crawler rank DIR" in text


# -- memory --------------------------------------------------------------------------------


def peak_rss(nodes: int, links: int, work: Path) -> dict[str, int]:
    """Build and rank a synthetic graph in a fresh process with small blocks and chunks;
    its peak RSS while building and (VmHWM reset) while iterating."""
    argv = [sys.executable, "tools/bench_rank.py", "--worker", "--nodes", str(nodes),
            "--links", str(links), "--iterations", "2", "--block-nodes", "65536", "--chunk",
            "32768", "--bucket-nodes", "16384", "--gen-batch", "2048", "--workdir", str(work)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240,
                          check=True)
    out: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return out


@pytest.mark.slow
def test_memory_is_flat_as_the_graph_grows(tmp_path: Path) -> None:
    small = peak_rss(300_000, 600_000, tmp_path)
    big = peak_rss(1_200_000, 2_400_000, tmp_path)
    assert big["edges"] > 3.5 * small["edges"] and big["blocks"] > 3 * small["blocks"]
    assert big["iterate_peak_rss"] is not None, "VmHWM could not be reset"
    for phase in ("build_peak_rss", "iterate_peak_rss"):
        grew = (big[phase] - big["baseline_rss"]) - (small[phase] - small["baseline_rss"])
        # Four times the graph: one float64 per node would be 7 MB more, its edges 14 MB
        # more (8 B each); what the blocks, chunks and buckets hold does not grow.
        assert grew < 4 << 20, (phase, small, big)


def test_rank_crawl_builds_in_a_directory_of_its_own_inside_work_dir(
    crawl: tuple[TestWeb, Path], tmp_path: Path
) -> None:
    """work_dir is the caller's (a /tmp): rank_crawl must not empty it, nor leave its
    graph behind there."""
    from crawler.read.rank import rank_crawl

    _, data = crawl
    work = tmp_path / "scratch"
    work.mkdir()
    (work / "mine.txt").write_text("keep me")
    with CrawlReader(data) as reader:
        result = rank_crawl(reader, work_dir=str(work))
    assert result.graph["fetched"] > 0
    assert [p.name for p in work.iterdir()] == ["mine.txt"]
    assert (work / "mine.txt").read_text() == "keep me"
    with RankStore(data) as store:
        assert len(list(store.ordered(5))) == 5
