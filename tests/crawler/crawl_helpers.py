"""Running the crawler against a test web (in-process or as a subprocess); reading its results."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import kvstore
from crawler.config import CrawlerConfig
from crawler.run.engine import Engine
from crawler.state.pages import PageRecord, decode_page
from tools.measure_crawl import crawl_command
from tools.testweb import TestWeb

REPO = Path(__file__).resolve().parents[2]


def config_for(web: TestWeb, data_dir: Path, **overrides: Any) -> CrawlerConfig:
    settings: dict[str, Any] = dict(
        data_dir=str(data_dir),
        threads=16,
        delay=0.0,
        per_host=2,
        nameservers=(web.nameserver,),
        allow_private_ips=True,
        ca_bundle=str(web.ca_file),
        broad=True,
        status_interval=3600.0,
        sync_interval=3600.0,
        connect_timeout=5.0,
        read_timeout=5.0,
        total_timeout=10.0,
        backoff=0.05,
        max_retry_after=2.0,
    )
    settings.update(overrides)
    return CrawlerConfig(**settings)


def run_crawl(
    web: TestWeb, data_dir: Path, seeds: list[str] | None = None, **overrides: Any
) -> Engine:
    engine = Engine(config_for(web, data_dir, **overrides))
    engine.add_seeds(seeds or [web.seed_url])
    engine.complete = engine.run()  # type: ignore[attr-defined]
    return engine


def records(data_dir: Path) -> dict[str, PageRecord]:
    """Every page record of a crawl, by URL (bodies left out)."""
    out = {}
    with kvstore.open(data_dir / "main", readonly=True) as main:
        for key in main:
            rec = decode_page(main[key], with_body=False)
            out[rec.url] = rec
    return out


def fetched_urls(data_dir: Path) -> set[str]:
    """URLs that were answered over HTTP (any status)."""
    return {url for url, rec in records(data_dir).items() if rec.status > 0}


def cli_args(web: TestWeb, data_dir: Path, *extra: str) -> list[str]:
    return crawl_command(
        web,
        data_dir,
        "--delay",
        "0",
        "--per-host",
        "2",
        "--threads",
        "8",
        "--status-interval",
        "3600",
        "--timeout",
        "10",
        *extra,
    )


def start_cli(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs
    )


# -- helpers for the hostile-web tests ---------------------------------------------------


def record(data_dir: Path, url: str) -> PageRecord:
    """The page record of one URL, body included (KeyError if the URL was never recorded)."""
    from crawler.web.urls import url_key

    with kvstore.open(data_dir / "main", readonly=True) as main:
        return decode_page(main[url_key(url)])


def status_json(data_dir: Path) -> dict[str, Any]:
    """The status.json a crawl left in its data directory."""
    from crawler.run.status import read_status

    snap = read_status(str(data_dir))
    assert snap is not None, f"no status.json in {data_dir}"
    return snap


def bad_hosts(data_dir: Path) -> dict[str, dict[str, Any]]:
    """The persisted BadHosts entries, by host name."""
    import json

    with kvstore.open(data_dir / "badhosts", readonly=True) as bad:
        entries = [json.loads(bad[k]) for k in bad]
    return {e["host"]: e for e in entries}


def tries(web: TestWeb, url: str) -> list[Any]:
    """The request log's records of one URL (canonical form), in order of arrival."""
    return sorted((r for r in web.log.records() if r.url == url), key=lambda r: r.start)


def host_name(url: str) -> str:
    from tools.testweb.urls import split

    parts = split(url)
    assert parts is not None, url
    return parts.host
