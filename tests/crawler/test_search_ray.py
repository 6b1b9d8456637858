"""``index --ray`` and ``search --ray`` on a crawl that ran on Ray: each shard's work in an
actor on its node (a real local cluster), equal to the same crawl indexed and searched
in one process."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from crawl_helpers import REPO
from test_ray import MakeWeb, ray_args, ray_head  # noqa: F401 (ray_head: the fixture)
from test_search_index import anchors, documents

import kvstore
from crawler.state.shards import open_layout, shard_dir

pytest.importorskip("ray", reason="the [ray] extra is not installed")  # CI installs it

SHARDS = 2


def shard_documents(data: Path, shard: int) -> dict[str, tuple[object, ...]]:
    """Every document of one shard's index, by key: its stored fields."""
    return documents(Path(shard_dir(str(data), shard, SHARDS)))


def shard_anchors(data: Path, shard: int) -> dict[bytes, bytes]:
    """One shard's anchor store: target key -> the texts of the links to it."""
    return anchors(Path(shard_dir(str(data), shard, SHARDS)))


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python", "-m", "crawler", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240, check=False)


@pytest.mark.slow
def test_index_and_search_on_ray_equal_one_process(
        make_testweb: MakeWeb, tmp_path: Path, ray_head: tuple[str, dict[str, str]]) -> None:  # noqa: F811
    web = make_testweb(pages=300, hosts=6, seed=5, crawl_delay=0.0)
    data = tmp_path / "c"
    head, env = ray_head
    done = subprocess.run(ray_args(web, data, head, SHARDS, "--per-host", "2", "--delay", "0"),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    here = tmp_path / "here"
    shutil.copytree(data, here)  # the same crawl, indexed and searched in one process

    ran = cli(["index", str(data), "--ray", head, "--json", "--workers", "2"], env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    on_ray = json.loads(ran.stdout)
    ran = cli(["index", str(here), "--json", "--workers", "1"], env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    local = json.loads(ran.stdout)
    for name in ("shards", "read", "indexed", "documents", "rebuilt", "removed", "skipped"):
        assert on_ray[name] == local[name], name
    assert on_ray["documents"] > 100 and on_ray["shards"] == SHARDS
    for shard in range(SHARDS):
        assert shard_documents(data, shard) == shard_documents(here, shard)
        # the texts of links to its pages, from the other shard's pages too
        mine = shard_anchors(data, shard)
        assert mine == shard_anchors(here, shard) and len(mine) > 50
    # the anchors field is indexed, not stored: a page found by the words of the links
    # to it, on both, equally (checked with the queries below)

    # queries: two pages' titles, a word, a phrase; every answer equal, scores included
    # (each search --ray joins the cluster, a few seconds: four kinds, one of each)
    titles = sorted({str(d[1]) for d in shard_documents(here, 0).values() if d[1]})[:2]
    assert len(titles) == 2
    for text in titles + [titles[0].split()[0], f'"{titles[1]}"']:
        a = cli(["search", str(data), text, "--ray", head, "--json", "--limit", "20"], env)
        b = cli(["search", str(here), text, "--json", "--limit", "20"], env)
        assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
        got, want = json.loads(a.stdout), json.loads(b.stdout)
        assert got["matches"] == want["matches"] > 0
        for x, y in zip(got["hits"], want["hits"], strict=True):
            x.pop("shard"), y.pop("shard")
            assert x == y
        assert {h["shard"] for h in json.loads(a.stdout)["hits"]} <= set(range(SHARDS))

    # a bad query is one line, parsed on the driver; a second index run reads nothing
    bad = cli(["search", str(data), "((", "--ray", head], env)  # (no word to search)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "cannot read the query" in bad.stderr
    again = cli(["index", str(data), "--ray", head, "--json"], env)
    assert again.returncode == 0 and json.loads(again.stdout)["read"] == 0, again.stderr[-2000:]


def test_ray_options_on_a_crawl_that_did_not_run_on_ray_are_one_line(
        tmp_path: Path, ray_head: tuple[str, dict[str, str]]) -> None:  # noqa: F811
    head, env = ray_head
    data = tmp_path / "c"
    (data / "main").mkdir(parents=True)  # a crawl directory of one process, never on Ray
    for command in (["index", str(data)], ["search", str(data), "word"]):
        ran = cli([*command, "--ray", head], env)
        assert ran.returncode != 0
        assert ran.stderr.strip().splitlines() == [
            f"crawler: error: {data}: not a crawl that ran on Ray (no ray.json); leave out --ray"]


def test_a_placement_of_another_count_is_one_line_naming_ray_json(
        tmp_path: Path, ray_head: tuple[str, dict[str, str]]) -> None:  # noqa: F811
    head, env = ray_head
    data = tmp_path / "c"
    open_layout(str(data), SHARDS)
    (data / "ray.json").write_text(json.dumps({"format": 1, "nodes": ["127.0.0.1"] * 3}))
    for command in (["index", str(data)], ["search", str(data), "word"]):
        ran = cli([*command, "--ray", head], env)
        assert ran.returncode != 0
        assert ran.stderr.strip().splitlines() == [
            f"crawler: error: {data}/ray.json: 3 shards placed, not {SHARDS}"]


def test_a_shard_without_an_index_is_one_line_naming_it(
        tmp_path: Path, ray_head: tuple[str, dict[str, str]]) -> None:  # noqa: F811
    """The actor that cannot open its shard's index dies in its constructor, on its node:
    the driver says which shard and what to do, in one line (not the actor's traceback)."""
    head, env = ray_head
    data = tmp_path / "c"
    open_layout(str(data), SHARDS)
    for shard in range(SHARDS):
        kvstore.open(Path(shard_dir(str(data), shard, SHARDS)) / "main").close()
    (data / "ray.json").write_text(json.dumps({"format": 1, "nodes": ["127.0.0.1"] * SHARDS}))
    ran = cli(["search", str(data), "word", "--ray", head], env)
    assert ran.returncode != 0
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith(f"crawler: error: {data}/shard-0") and "no search index" in lines[0]
