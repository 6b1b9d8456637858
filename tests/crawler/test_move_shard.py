"""``crawler move-shard``: a Ray crawl's shard pointed at another node, offline and atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crawler.cli import main
from crawler.run.supervisor import take_lock
from crawler.state.shards import write_placement

NODES = ["198.18.0.11", "198.18.0.12", "198.18.0.13"]


@pytest.fixture
def ray_crawl(tmp_path: Path) -> Path:
    """A crawl directory as a 3-shard Ray crawl leaves it on the driver's node."""
    data = tmp_path / "crawl"
    data.mkdir()
    (data / "shards.json").write_text('{"format": 1, "shards": 3}\n')
    write_placement(str(data), list(NODES), [True, False, True])
    return data


def nodes(data: Path) -> list[str]:
    doc = json.loads((data / "ray.json").read_text())
    assert doc["format"] == 1
    return doc["nodes"]


def one_line(err: str, *parts: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crawler: error: "), err
    for part in parts:
        assert part in lines[0], (part, err)


def test_the_shard_is_recorded_on_its_new_node_and_no_other_moves(
    ray_crawl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["move-shard", str(ray_crawl), "1", "198.18.0.21"]) == 0
    assert nodes(ray_crawl) == [NODES[0], "198.18.0.21", NODES[2]]
    # which shards have run is kept: a moved shard that ran must be found on its new node
    assert json.loads((ray_crawl / "ray.json").read_text())["started"] == [True, False, True]
    out = capsys.readouterr().out
    assert "shard 1 moved from 198.18.0.12 to 198.18.0.21" in out
    assert str(ray_crawl / "shard-01") in out
    assert sorted(os.listdir(ray_crawl)) == ["ray.json", "shards.json", "supervisor.lock"]


def test_an_address_is_written_as_ray_names_it(ray_crawl: Path) -> None:
    assert main(["move-shard", str(ray_crawl), "2", "fd00:0:0::7"]) == 0
    assert nodes(ray_crawl)[2] == "fd00::7"


def test_moving_a_shard_to_its_own_node_changes_nothing(
    ray_crawl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (ray_crawl / "ray.json").stat()
    assert main(["move-shard", str(ray_crawl), "0", NODES[0]]) == 0
    assert "already on 198.18.0.11" in capsys.readouterr().out
    after = (ray_crawl / "ray.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_running_crawl_keeps_its_placement(
    ray_crawl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = take_lock(str(ray_crawl))  # what a running driver holds
    try:
        assert main(["move-shard", str(ray_crawl), "1", "198.18.0.21"]) == 1
    finally:
        os.close(lock)
    one_line(capsys.readouterr().err, "a crawl is running", "stop it")
    assert nodes(ray_crawl) == NODES


@pytest.mark.parametrize(
    ("args", "code", "parts"),
    [
        (["1", "node-7"], 2, ["'node-7' is not a node address"]),
        (["3", "198.18.0.21"], 2, ["shards 0 to 2, not 3"]),
        (["-1", "198.18.0.21"], 2, ["not -1"]),
    ],
)
def test_a_mistake_is_one_line_and_changes_nothing(
    ray_crawl: Path, args: list[str], code: int, parts: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["move-shard", str(ray_crawl), *args]) == code
    one_line(capsys.readouterr().err, *parts)
    assert nodes(ray_crawl) == NODES


def test_a_crawl_that_never_ran_on_ray_has_nothing_to_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "crawl"
    data.mkdir()
    (data / "shards.json").write_text('{"format": 1, "shards": 2}\n')
    assert main(["move-shard", str(data), "1", "198.18.0.21"]) == 1
    one_line(capsys.readouterr().err, "did not run on Ray", "ray.json")
    assert sorted(os.listdir(data)) == ["shards.json"]


def test_a_placement_of_another_shard_count_is_refused(
    ray_crawl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_placement(str(ray_crawl), NODES[:2], [True, True])
    assert main(["move-shard", str(ray_crawl), "1", "198.18.0.21"]) == 1
    one_line(capsys.readouterr().err, "2 shards placed, not 3")
    assert nodes(ray_crawl) == NODES[:2]
