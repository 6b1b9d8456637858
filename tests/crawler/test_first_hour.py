"""A new user's first hour with ``python -m crawler``: saved settings, a status that
says how the crawl ended, help that shows defaults, a seeds file, and every mistake
one line on stderr that leaves nothing behind (issue 16)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import (
    REPO,
    cli_args,
    fetched_urls,
    help_entries,
    page_refetches,
    records,
    start_cli,
    wait_for_answers,
)
from warcio.archiveiterator import ArchiveIterator

import kvstore
from crawler import config as cfgmod
from crawler.state.settings import load_settings
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
CRAWLER = [sys.executable, "-m", "crawler"]


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def status(data: Path) -> tuple[str, dict]:
    text = ok(run([*CRAWLER, "status", str(data)])).stdout
    info = json.loads(ok(run([*CRAWLER, "status", str(data), "--json"])).stdout)
    return text, info


# -- settings ----------------------------------------------------------------------------


def test_a_resume_with_no_options_runs_with_the_saved_settings(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """Without the saved --nameserver, --allow-private-ips, --ca-bundle and --broad the
    resume could not reach the test web at all; without --user-agent it would crawl
    h3.test, whose robots.txt shuts out only badbot."""
    web = make_testweb(pages=120, hosts=4, seed=1, crawl_delay=0.0)
    want = set(web.oracle.crawl(user_agent="badbot").fetched)
    data = tmp_path / "c"
    first = ok(run(cli_args(web, data, "--user-agent", "BadBot/1.0", "--max-pages", "15")))
    assert first.stdout.startswith("crawl stopped (limit reached): ")
    assert f"to resume: python -m crawler start --data {data}" in first.stderr
    assert len(fetched_urls(data)) == 15
    resumed = ok(run([*CRAWLER, "start", "--data", str(data)]))
    assert resumed.stdout.startswith("crawl complete: "), resumed.stdout
    assert "resuming with the settings saved in" in resumed.stderr
    assert fetched_urls(data) == want  # --max-pages was for the first run only
    assert page_refetches(web) == {}
    assert {r.path for r in web.log.records(host="h3.test")} == {"/robots.txt"}

    saved = load_settings(str(data))
    assert saved is not None and saved["user_agent"] == "BadBot/1.0" and saved["broad"] is True
    warc = tmp_path / "c.warc.gz"  # the export writes the User-Agent the crawl sent
    ok(run([*CRAWLER, "export", str(data), "--warc", str(warc), "--quiet"]))
    with warc.open("rb") as f:
        agents = {
            r.http_headers.get_header("User-Agent")
            for r in ArchiveIterator(f)
            if r.rec_type == "request"
        }
    assert agents == {"BadBot/1.0"}
    changed = ok(run([*CRAWLER, "start", "--data", str(data), "--delay", "0.5", "--no-broad"]))
    assert "setting changed: --delay 0.0 -> 0.5 (saved)" in changed.stderr
    assert "setting changed: --broad True -> False (saved)" in changed.stderr
    again = load_settings(str(data))
    assert again is not None
    assert (again["delay"], again["broad"], again["user_agent"]) == (0.5, False, "BadBot/1.0")


def test_start_help_shows_the_defaults_and_the_resume() -> None:
    text = ok(run([*CRAWLER, "start", "--help"])).stdout
    entries = help_entries(text)
    for flag, default in (
        ("--threads", cfgmod.DEFAULT_THREADS),
        ("--delay", cfgmod.DEFAULT_DELAY),
        ("--per-host", cfgmod.DEFAULT_PER_HOST),
        ("--timeout", cfgmod.DEFAULT_TOTAL_TIMEOUT),
        ("--max-retries", cfgmod.DEFAULT_MAX_RETRIES),
        ("--max-body-bytes", cfgmod.DEFAULT_MAX_BODY_BYTES),
    ):
        assert f"(default: {default})" in entries[flag], entries[flag]
    assert "(default: off)" in entries["--broad"]
    assert "system's resolvers" in entries["--nameserver"]
    flat = " ".join(text.split())
    assert "settings.json" in flat and "example: python -m crawler start" in flat
    status_help = " ".join(ok(run([*CRAWLER, "status", "--help"])).stdout.split())
    assert "docs/STATUS.md" in status_help and "example: python -m crawler status" in status_help


# -- status ------------------------------------------------------------------------------


@pytest.mark.slow
def test_status_tells_how_each_run_ended_with_totals_over_every_run(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=300, hosts=3, seed=4, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    args = cli_args(web, data, "--delay", "0.02", "--per-host", "1")  # a few seconds long

    proc = start_cli(args)  # killed: not a clean stop
    wait_for_answers(web, proc, 40)
    proc.kill()
    proc.communicate()
    text, info = status(data)
    assert info["state"].startswith("killed or crashed") and not info["running"]
    assert f"to resume: python -m crawler start --data {data}" in text

    proc = start_cli(args)  # Ctrl-C: a clean stop
    wait_for_answers(web, proc, 40)
    settings = (data / "settings.json").read_bytes()
    second = run([*args, "--delay", "3"])  # on a crawl that runs: refused, nothing saved
    proc.send_signal(signal.SIGINT)
    one_line_error(second, 1, "a crawl is running on it", f"pid {proc.pid}")
    assert (data / "settings.json").read_bytes() == settings
    proc.communicate(timeout=60)
    text, info = status(data)
    assert text.startswith(f"crawl {data}: interrupted (Ctrl-C or SIGTERM)\n")
    got = records(data)
    assert info["recorded"] == len(got)  # every run's records, not the last run's
    assert info["fetched"] == len(fetched_urls(data)) == sum(r.status > 0 for r in got.values())
    assert info["fetched"] > info["last_status"]["fetched"]  # the last run did only part
    assert 0 < info["pending"] and info["pending_bulks"] > 0

    ok(run(args))
    text, info = status(data)
    assert text.startswith(f"crawl {data}: finished: nothing is left to fetch\n")
    assert info["fetched"] == len(want) and info["pending"] == 0
    assert info["recorded"] == info["fetched"] + info["not_fetched"] == len(records(data))
    assert sum(info["classes"].values()) == info["recorded"]
    assert "to resume" not in text


# -- seeds -------------------------------------------------------------------------------


def test_seeds_file_adds_its_urls_and_skips_comments(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=60, hosts=3, seed=2, crawl_delay=0.0)
    seeds = tmp_path / "seeds.txt"
    h1 = web.url("h1.test", "/")
    seeds.write_text(f"# my seeds\n\n  {web.seed_url}  \n{h1}\n")
    data = tmp_path / "c"
    args = cli_args(web, data)
    args.remove(web.seed_url)
    ok(run([*args, "--seeds-file", str(seeds), "--no-broad"]))
    assert (data / "seeds.txt").read_text().split() == [web.seed_url, h1]
    hosts = {u.split("/")[2].split(":")[0] for u in fetched_urls(data)}
    assert hosts == {"h0.test", "h1.test"}


# -- mistakes ----------------------------------------------------------------------------


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("crawler: error: "), lines
    for word in words:
        assert word in lines[-1], (word, lines)


def tree(path: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*"))


@pytest.mark.parametrize(
    "case",
    ["data_is_a_file", "data_under_a_file", "data_is_a_kvstore", "data_in_a_kvstore",
     "data_holds_other_files",
     "zero_threads", "relative_seed", "ftp_seed", "missing_seeds_file", "bad_seeds_file_line",
     "unreadable_ca_bundle", "bad_store_type"],
)
def test_a_users_mistake_is_one_line_and_leaves_nothing_behind(
    case: str, tmp_path: Path
) -> None:
    data = tmp_path / "c"
    seed = "http://h0.test/"
    extra: list[str] = []
    code, words = 1, [str(data)]
    if case == "data_is_a_file":
        data.write_text("mine")
        words += ["not a directory"]
    elif case == "data_under_a_file":
        (tmp_path / "f").write_text("mine")
        data = tmp_path / "f" / "c"
        words = [str(data), "cannot create it"]
    elif case == "data_is_a_kvstore":
        with kvstore.open(data) as db:
            db[b"k" * 16] = b"v"
        words += ["kvstore store"]
    elif case == "data_in_a_kvstore":
        with kvstore.open(tmp_path / "store") as db:
            db[b"k" * 16] = b"v"
        data = tmp_path / "store" / "c"
        words = [str(data), "is a kvstore store"]
    elif case == "data_holds_other_files":
        data.mkdir()
        (data / "thesis.tex").write_text("precious")
        words += ["holds other files"]
    elif case == "zero_threads":
        extra, code, words = ["--threads", "0"], 2, ["--threads", "at least 1"]
    elif case == "relative_seed":
        seed, words = "not-a-url", ["'not-a-url'", "not a full URL", "http://"]
    elif case == "ftp_seed":
        seed, words = "ftp://h0.test/", ["'ftp://h0.test/'", "only http:// and https://"]
    elif case == "missing_seeds_file":
        extra, words = ["--seeds-file", str(tmp_path / "none.txt")], ["none.txt", "cannot read"]
    elif case == "bad_seeds_file_line":
        (tmp_path / "s.txt").write_text("http://h0.test/\nmailto:me@h0.test\n")
        extra, words = ["--seeds-file", str(tmp_path / "s.txt")], ["s.txt:2", "mailto:"]
    elif case == "bad_store_type":
        extra, words = ["--store-types", "pdf"], ["--store-types 'pdf'", "image/*"]
    elif case == "unreadable_ca_bundle":
        extra, words = ["--ca-bundle", str(tmp_path / "no.pem")], ["no.pem", "--ca-bundle"]
    before = tree(tmp_path)
    done = run([*CRAWLER, "start", seed, "--data", str(data), *extra], timeout=60)
    one_line_error(done, code, *words)
    assert tree(tmp_path) == before, "the mistake left something behind"


def test_data_in_an_unwritable_place_is_one_line(tmp_path: Path) -> None:
    """File modes hold: root writes anywhere, so as root the child runs without the
    capabilities that bypass them (still uid 0: it can read the venv and the checkout,
    which may be private to root, as CI's are)."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    cmd = [*CRAWLER, "start", "http://h0.test/", "--data", str(locked / "c")]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]
    done = run(cmd, timeout=60)
    one_line_error(done, 1, str(locked / "c"), "not writable")
    assert list(locked.iterdir()) == []
