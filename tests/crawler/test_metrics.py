"""``serve``'s ``/metrics``: a real two-shard crawl of the test web, served, scraped over
loopback and read back with prometheus_client's own parser; the numbers are the shards'
status files and the crawl's records; a damaged status file is one shard marked, not
an error; docs/STATUS.md lists exactly the metrics there are."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import REPO, cli_args, records, run_cli
from prometheus_client.parser import text_string_to_metric_families
from test_serve import WAIT, http_only, request

from crawler.outcomes import outcome_key
from crawler.read.metrics import CONTENT_TYPE, LABELLED, METRICS, PREFIX, STATUS_OK
from crawler.state.shards import shard_dir
from crawler.state.statusfile import read_status
from tools.testweb import SiteConfig, TestWeb


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with TestWeb(SiteConfig(pages=80, hosts=4, seed=9, crawl_delay=0.0)) as web:
        data = tmp_path_factory.mktemp("metrics") / "crawl"
        done = run_cli(cli_args(web, data, "--processes", "2"))
        assert done.returncode == 0, done.stderr[-2000:]
        yield data


def scrape(data: Path) -> tuple[dict[str, Any], str]:
    """{family name: family} of /metrics, and its Content-Type."""
    with http_only(data) as server:
        port = server.address[1]
        status, headers, body = request(port, "/metrics", host=f"127.0.0.1:{port}")
    assert status == 200, body[:500]
    families = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
    return families, headers["Content-Type"]


def by_shard(family: Any, **labels: str) -> dict[str, float]:
    return {s.labels["shard"]: s.value for s in family.samples
            if all(s.labels.get(k) == v for k, v in labels.items())
            and not s.name.endswith("_created")}


def test_metrics_are_the_shards_status_and_the_crawls_records(crawl: Path) -> None:
    families, ctype = scrape(crawl)
    assert ctype == CONTENT_TYPE
    snaps = {str(i): read_status(shard_dir(str(crawl), i, 2)) for i in range(2)}
    assert all(snaps.values())
    p = PREFIX
    assert by_shard(families[p + "up"]) == {"0": 0.0, "1": 0.0}  # the crawl ended
    assert by_shard(families[p + "snapshot_ok"]) == {"0": 1.0, "1": 1.0}
    for name, field in (("fetched", "fetched"), ("pending", "pending"),
                        ("recorded", "done"), ("downloaded_bytes", "bytes"),
                        ("bad_hosts", "bad_hosts"), ("uncommitted", "uncommitted")):
        assert by_shard(families[p + name]) == {
            i: float(s[field]) for i, s in snaps.items()}, name  # type: ignore[index]
    assert families[p + "fetched"].type == "counter"
    assert families[p + "pending"].type == "gauge"
    # outcomes by shard and by outcome: what the records say, shard by shard summed
    got: Counter[str] = Counter()
    for sample in families[p + "outcomes"].samples:
        got[sample.labels["outcome"]] += int(sample.value)
    recorded = Counter(outcome_key(r.status, r.reason, r.truncated)
                       for r in records(crawl).values())
    assert got == recorded and sum(got.values()) > 60
    classes = {s.labels["class"]: s.value for s in families[p + "pages"].samples
               if s.labels["shard"] == "0"}
    assert classes == {k: float(v) for k, v in snaps["0"]["classes"].items()}  # type: ignore[index]


def test_a_damaged_status_file_marks_its_shard_only(crawl: Path, tmp_path: Path) -> None:
    status = Path(shard_dir(str(crawl), 1, 2)) / "status.json"
    saved = status.read_bytes()
    status.write_text("{not json")
    try:
        families, _ = scrape(crawl)
    finally:
        status.write_bytes(saved)
    assert by_shard(families[PREFIX + "snapshot_ok"]) == {"0": 1.0, "1": 0.0}
    assert set(by_shard(families[PREFIX + "fetched"])) == {"0"}


def test_docs_list_every_metric(crawl: Path) -> None:
    names = {m.name for m in METRICS} | {n for n, *_ in LABELLED} | {STATUS_OK[0]}
    doc = (REPO / "docs" / "STATUS.md").read_text()
    documented = set(re.findall(r"`kvcrawl_([a-z_]+)`", doc))  # the table's names
    assert documented == names
    families, _ = scrape(crawl)  # what a crawl without rendering shows is all documented
    shown = {name.removeprefix(PREFIX) for name in families}
    assert shown <= {n.removesuffix("_total") for n in names}
    assert WAIT > 0
