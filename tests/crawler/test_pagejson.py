"""The JSON shape of a page (crawler.read.pagejson) is one module, apart from the WARC
writer: ``pages`` and ``show`` print it without loading warcio, and ``pages --json``
prints the fields ``export --jsonl`` writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawl_helpers import REPO, run_crawl

from crawler.cli import main
from tools.testweb import SiteConfig, TestWeb

# What only the WARC and WACZ export need.
WARC_ONLY = ("warcio", "crawler.read.warc", "crawler.read.wacz", "crawler.read.export")


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path]]:
    with TestWeb(SiteConfig(pages=12, hosts=2, seed=3, crawl_delay=0.0)) as web:
        data = tmp_path_factory.mktemp("pagejson") / "crawl"
        run_crawl(web, data)
        yield web, data


def loaded_after(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``python -m crawler ARGV`` in a fresh interpreter; which of WARC_ONLY it loaded."""
    code = ("import sys; from crawler.cli import main; rc = main(sys.argv[1:]); "
            f"print('loaded:', [m for m in {WARC_ONLY!r} if m in sys.modules], "
            "file=sys.stderr); raise SystemExit(rc)")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("loaded: ")]
    assert done.returncode == 0 and line, done.stderr[-2000:]
    return done, json.loads(line[-1].removeprefix("loaded: ").replace("'", '"'))


@pytest.mark.parametrize("command", ["show", "pages", "pages --json"])
def test_show_and_pages_do_not_load_the_warc_writer(
    command: str, crawl: tuple[TestWeb, Path]
) -> None:
    web, data = crawl
    argv = {"show": ["show", str(data), web.seed_url], "pages": ["pages", str(data)],
            "pages --json": ["pages", str(data), "--json"]}[command]
    done, loaded = loaded_after(argv)
    assert done.stdout  # it printed the page(s)
    assert loaded == []


def test_export_loads_the_warc_writer(crawl: tuple[TestWeb, Path], tmp_path: Path) -> None:
    """The check above can see warcio loaded: the export loads it."""
    _, data = crawl
    _, loaded = loaded_after(["export", str(data), "--warc", str(tmp_path / "c.warc.gz"),
                              "--quiet"])
    assert "warcio" in loaded and "crawler.read.warc" in loaded


def test_pages_json_prints_the_fields_the_export_writes(
    crawl: tuple[TestWeb, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, data = crawl
    out = tmp_path / "c.jsonl"
    assert main(["export", str(data), "--jsonl", str(out), "--quiet"]) == 0
    exported = {o["url"]: o for o in map(json.loads, out.read_text().splitlines())}
    capsys.readouterr()
    assert main(["pages", str(data), "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(listed) == len(exported) > 5
    for obj in listed:
        # pages --json: the record's fields, its rank and elapsed; no links (a second
        # pass over the crawl to resolve them)
        whole = exported[obj["url"]]
        assert obj == {k: v for k, v in whole.items() if k != "links"}
