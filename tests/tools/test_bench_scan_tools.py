"""Smoke tests of the scan benchmarks (tools/bench_status.py, tools/bench_headread.py,
tools/bench_outcomelog.py, tools/bench_commands.py, tools/bench_perrecord.py,
tools/bench_linesort.py): each runs end to end on a small synthetic crawl (or lines)
and reports what the crawler's own commands say of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)


def test_bench_status_counts_the_same_from_counters_and_a_scan(tmp_path: Path) -> None:
    done = run("tools/bench_status.py", "--pages", "1500", "--pending", "300", "--workdir",
               str(tmp_path), "--repeat", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["pages"] == 1500 and out["pending"] > 0
    assert out["same_numbers"] is True and out["counts_from"] == "counters"
    assert out["counters_s"] > 0 and out["recount_s"] > 0


def test_bench_headread_runs_both_dry_runs_in_every_checkout(tmp_path: Path) -> None:
    data = tmp_path / "crawl"
    built = run("tools/seedscale.py", "--pages", "1200", "--pending", "800", "--data", str(data),
                "--quiet")
    assert built.returncode == 0, built.stderr[-3000:]
    out = tmp_path / "result.json"
    done = run("tools/bench_headread.py", "--data", str(data), "--tree", f"a={REPO}", "--tree",
               f"b={REPO}", "--runs", "1", "--cold", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {(r["command"].split()[0], r["tree"]) for r in rows} == {
        ("retry", "a"), ("retry", "b"), ("recrawl", "a"), ("recrawl", "b")}
    for r in rows:  # each run is the real command: its own summary line, the same in both
        assert r["median_s"] > 0 and r["output"].startswith(r["command"].split()[0])
        assert r["peak_rss_mb"] > 10
        assert "would re-queue" in r["output"]
    by_command: dict[str, set[str]] = {}
    for r in rows:
        by_command.setdefault(r["command"], set()).add(r["output"])
    assert all(len(outputs) == 1 for outputs in by_command.values())


def test_bench_outcomelog_times_each_write_of_a_commit() -> None:
    done = run("tools/bench_outcomelog.py", "--records", "2000", "--repeat", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert [r[0] for r in rows] == ["put_flush_us", "outcome_log_us", "head_decode_us"]
    assert all(float(r[1].split()[1]) > 0 for r in rows)


def test_bench_commands_runs_each_read_command_to_its_end(tmp_path: Path) -> None:
    data = tmp_path / "crawl"
    built = run("tools/seedscale.py", "--pages", "1200", "--pending", "800", "--data", str(data),
                "--quiet")
    assert built.returncode == 0, built.stderr[-3000:]
    out = tmp_path / "result.json"
    done = run("tools/bench_commands.py", "--data", str(data), "--work", str(tmp_path / "w"),
               "--command", "rank", "--command", "export", "--keep", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["recorded"] == 1200 and list(result["runs"]) == ["rank", "export"]
    for m in result["runs"].values():
        assert m["returncode"] == 0 and not m["timed_out"]
        assert m["wall_s"] > 0 and m["peak_rss_bytes"] > 10 << 20
    jsonl = tmp_path / "w" / "export" / "pages.jsonl"
    assert result["runs"]["export"]["output_bytes"] == jsonl.stat().st_size
    assert len(jsonl.read_text().splitlines()) == 1200  # one object a page record
    assert (data / "rank" / "rank.json").is_file()  # rank stored its ranks in the crawl


def test_bench_perrecord_times_the_index_read_and_the_rank_lookups(tmp_path: Path) -> None:
    data = tmp_path / "crawl"
    built = run("tools/seedscale.py", "--pages", "1200", "--pending", "800", "--data", str(data),
                "--quiet")
    assert built.returncode == 0, built.stderr[-3000:]
    ranked = run("-m", "crawler", "rank", str(data), "--quiet")
    assert ranked.returncode == 0, ranked.stderr[-3000:]
    done = run("tools/bench_perrecord.py", "--data", str(data), "--records", "300", "--links",
               "2000", "--repeat", "1", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["records"] == 300 and out["links"] == 2000
    assert out["read_task_ms"] > 0 and out["url_lookup_us"] > 0 and out["rank_lookup_us"] > 0
    assert out["link_batch_us"] > 0


def test_bench_linesort_sorts_with_both_fan_ins_and_counts_the_passes() -> None:
    done = run("tools/bench_linesort.py", "--mb", "3", "--buffer-mb", "0.02", "--fan-in", "8",
               "--repeat", "1", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    few, default = out["fan_in_8"], next(v for k, v in out.items() if k.startswith("default_"))
    assert few["runs"] == default["runs"] > 64
    assert few["passes"] >= 2 and default["passes"] == 0
    assert few["bytes_written"] == default["bytes_written"] * (1 + few["passes"])

