"""``python -m crawler``: help, errors, a crawl through the command line, and status."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import META_PATHS, help_entries

from crawler.cli import build_parser, main
from tools.testweb import TestWeb

REPO = Path(__file__).resolve().parents[2]


COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def test_each_command_loads_the_module_that_adds_it() -> None:
    from crawler.cli import app

    for module in app.command_modules():
        name = module.__name__.rsplit(".", 1)[1]
        alone = app.build_parser([module])._subparsers._group_actions[0].choices  # type: ignore[union-attr]
        named = {command for command, of in app.MODULE_OF.items() if of == name}
        assert set(alone) == set(module.COMMANDS) == named, name
    assert sorted(app.MODULE_OF) == COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "example: python -m crawler " + command in out
    assert command in (REPO / "README.md").read_text()
    # Every option with a default worth saying shows it (argparse wraps: join lines).
    entries = help_entries(out)
    parser = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
            entry = entries[action.option_strings[0]]
            assert "default" in entry, (command, entry)


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["start", "http://a.test/"]) == 2  # --data is required
    assert main(["start", "--data", "x", "--nameserver", "1.2.3.4:port"]) == 2


def test_bad_seed_and_missing_seeds_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["start", "ftp://a.test/", "--data", str(tmp_path / "c")]) == 1
    assert "crawler: error: bad seed URL" in capsys.readouterr().err
    assert main(["start", "--data", str(tmp_path / "d")]) == 1
    assert "no seeds" in capsys.readouterr().err


def test_status_of_a_missing_crawl_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", str(tmp_path / "none")]) == 1
    assert "no such crawl directory" in capsys.readouterr().err


def test_a_crawl_from_the_command_line_then_status(
    make_testweb: Callable[..., TestWeb], tmp_path: Path
) -> None:
    testweb = make_testweb(pages=60, hosts=3, seed=0, crawl_delay=0.0)
    data = tmp_path / "c"
    host, port = testweb.nameserver
    args = [
        sys.executable,
        "-m",
        "crawler",
        "start",
        testweb.seed_url,
        "--data",
        str(data),
        "--nameserver",
        f"{host}:{port}",
        "--allow-private-ips",
        "--delay",
        "0",
        "--threads",
        "8",
        "--ca-bundle",
        str(testweb.ca_file),
        "--broad",
        "--status-interval",
        "0.2",
    ]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("crawl complete: ")
    summary = json.loads(done.stdout.split(": ", 1)[1])
    pages = [r for r in testweb.log.records() if r.path not in META_PATHS]
    assert summary["complete"] and summary["fetched"] == len(pages)
    assert "fetched" in done.stderr and "rss" in done.stderr  # the status line
    status = subprocess.run(
        [sys.executable, "-m", "crawler", "status", str(data), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["running"] is False
    assert info["recorded"] == len(testweb.oracle.crawl().fetched) + summary["outcomes"].get(
        "robots_disallowed", 0
    )
    assert info["fetched"] == summary["fetched"] and info["state"].startswith("finished")
    assert info["pending_bulks"] == 0 and info["pending"] == 0
    assert info["last_status"]["fetched"] == summary["fetched"]


def test_limits_from_the_command_line_reach_the_crawl(
    make_testweb: Callable[..., TestWeb], tmp_path: Path
) -> None:
    """--max-body-bytes cuts a huge body and --max-redirects stops a chain: the flags are
    not just parsed but used."""
    from crawl_helpers import cli_args, records

    from tools.testweb import fault

    web = make_testweb(pages=20, hosts=1, crawl_delay=0.0,
                       faults=[fault("huge_body", size=1 << 20), fault("redirects")])
    data = tmp_path / "c"
    args = cli_args(web, data, "--max-body-bytes", "64K", "--max-redirects", "1")
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = records(data)
    huge = got[web.url("h0.test", "/x/huge_body/1")]
    assert (huge.status, huge.truncated) == (200, "too_large")
    assert any(r.reason == "redirect_limit" for r in got.values())
    want = web.oracle.crawl(max_redirects=1, max_url_length=2048)
    assert {u for u, r in got.items() if r.status > 0} == set(want.fetched)
