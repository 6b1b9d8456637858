"""The benchmark tools run end to end at a tiny size and write the JSON their docstrings document.

Speed is never asserted here (that is what the tools are for); what is asserted is
that each tool measures what it says: the frontier simulation keeps every admitted
URL (done + pending), and both crawlers fetch the whole oracle of a tiny nginx-served
site. The Scrapy part runs only when the benchmark venv exists (``bench_crawl.py``
creates it on first use; the test never installs anything).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRAPY_VENV = Path.home() / ".cache" / "kvcrawl-bench" / "scrapy-venv"
TOOL_TIMEOUT = 120  # seconds for one tool run; they take a few seconds here


def _run(args: list[str], tmp_path: Path) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, *args, "--workdir", str(tmp_path), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def test_bench_frontier_keeps_every_admitted_url(tmp_path: Path) -> None:
    stdout, res = _run(
        [
            "tools/bench_frontier.py",
            "--urls",
            "20000",
            "--checkpoints",
            "5000,20000",
            "--hosts",
            "1000",
            "--batch",
            "200",
            "--repeat",
            "1",
        ],
        tmp_path,
    )
    assert set(res) >= {"machine", "config", "runs", "checkpoints", "projection"}
    points = res["checkpoints"]
    assert [p["urls"] >= mark for p, mark in zip(points, (5000, 20000), strict=True)] == [
        True,
        True,
    ]
    for p in points:
        # After each commit nothing is in flight: every admitted URL is done or pending.
        assert p["done"] + p["pending"] == p["urls"]
        assert p["done"] > 0 and p["admit_per_s"] > 0 and p["claim_per_s"] > 0
        assert p["disk_bytes"] > 0 and p["rss_bytes"] > p["base_rss_bytes"] > 0
    proj = res["projection"]
    assert proj["urls"] == 280_000_000 and proj["disk_bytes_per_url"] > 0
    assert "| URLs so far |" in stdout and "admit/s" in stdout
    assert not list(tmp_path.glob("frontier-*"))  # the data directory was removed


@pytest.mark.system_packages("nginx-light")
def test_bench_crawl_fetches_the_oracle_and_reports(tmp_path: Path) -> None:
    crawlers = "ours,scrapy" if (SCRAPY_VENV / "bin" / "python").exists() else "ours"
    stdout, res = _run(
        [
            "tools/bench_crawl.py",
            "--pages",
            "120",
            "--hosts",
            "3",
            "--concurrency",
            "4",
            "--repeat",
            "1",
            "--crawlers",
            crawlers,
            "--processes",
            "1",  # --max-pages is then exact (shards split it: see docs/SHARDS.md)
            "--no-install",
            "--flatness-points",
            "40,120",
            "--threads-test",
            "--tt-threads",
            "40",
            "--tt-pages",
            "80",
            "--tt-hosts",
            "8",
            "--tt-slow",
            "0.2",
            "--tt-max-pages",
            "40",
        ],
        tmp_path,
    )
    assert set(res) >= {
        "machine",
        "config",
        "oracle",
        "runs",
        "summary",
        "ratios",
        "flatness",
        "threads_test",
        "profile",
    }
    oracle = res["oracle"]["fetched"]
    assert oracle > 120  # pages plus 404s, redirects and query variants
    by = {s["crawler"]: s for s in res["summary"] if s["max_pages"] is None}
    assert set(by) == set(crawlers.split(","))
    ours = by["ours"]
    assert ours["fetched"] == oracle and ours["oracle_share"] == 1.0
    assert (
        ours["pages_per_s"] > 0 and ours["peak_rss_bytes"] > 10 << 20 and ours["cpu_s_per_page"] > 0
    )
    if "scrapy" in by:
        assert by["scrapy"]["oracle_share"] == 1.0
        assert [r["concurrency"] for r in res["ratios"]] == [4]
    flat = res["flatness"]
    assert [p["max_pages"] for p in flat["points"]] == [40, 120]
    assert flat["points"][0]["fetched"] == 40 and flat["ratio"] > 0
    tt = res["threads_test"]
    assert tt["threads"] == 40 and tt["fetched"] >= 40 and tt["peak_rss_bytes"] > 0
    assert tt["ideal_pages_per_s"] <= 40 / 0.2
    assert "| crawler | processes | concurrency |" in stdout and "RSS(120) / RSS(40)" in stdout
    assert not list(tmp_path.glob("crawl-work-*"))  # site and crawl directories removed


def test_peak_rss_of_a_worker_is_its_own_not_its_parents() -> None:
    """A worker started by a parent holding 300 MB reports its own peak: Linux carries
    the parent's high-water mark into ru_maxrss across fork and exec, so the tools'
    peak is VmHWM."""
    ballast = bytearray(300 << 20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1  # every page resident
    code = "from tools import _benchutil as bu; print(bu.peak_rss_bytes(), bu.rss_bytes())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
        timeout=TOOL_TIMEOUT,
    ).stdout.split()
    peak, now = int(out[0]), int(out[1])
    assert now <= peak < 200 << 20, (peak, now)


@pytest.mark.system_packages("nginx-light")
def test_bench_fetchers_fetches_every_page_and_reports(tmp_path: Path) -> None:
    """Our fetcher only: pycurl and httpx are the bench extra's, not the tests'."""
    stdout, res = _run(["tools/bench_fetchers.py", "--pages", "50", "--fetches", "300",
                        "--threads", "4", "--repeat", "1", "--clients", "ours",
                        "--protocols", "http1,https1"], tmp_path)
    rows = {(r["client"], r["protocol"]): r for r in res["results"]}
    assert set(rows) == {("ours", "http1"), ("ours", "https1")}
    for r in rows.values():
        assert r["errors"] == 0 and r["versions"] == ["HTTP/1.1"]
        assert r["pages_per_s"] > 0 and 0 < r["cpu_ms_per_fetch"] < 1000
    assert "| ours | https1 |" in stdout


def test_a_benchmark_records_its_revision_without_git(tmp_path: Path) -> None:
    """A machine without git (a fresh Debian, a tarball's checkout) still runs the
    benchmarks: the revision is unknown, not a FileNotFoundError."""
    code = ("import json, sys; from tools import _benchutil as bu; "
            "print(json.dumps(bu.git_revision(sys.argv[1])))")
    found = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True,
                           text=True, timeout=60, cwd=REPO,
                           env={"PATH": str(tmp_path), "PYTHONPATH": str(REPO)})  # no git
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {"commit": None, "dirty": [], "diff_sha1": None}
    with_git = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True,
                              text=True, timeout=60, cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert with_git.returncode == 0, with_git.stderr
    if shutil.which("git") and (REPO / ".git").exists():  # a clone, and git: it is read
        assert json.loads(with_git.stdout)["commit"]
