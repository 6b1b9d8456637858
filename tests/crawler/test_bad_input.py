"""Bad input is one line, everywhere (issue 27, item 3): every number an option takes has
a range (docs/BOUNDS.md), header values carry no control characters, and every damaged
file a crawl directory holds is named in one line; nothing on disk changes."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawl_helpers import REPO

from crawler import config as cfgmod
from crawler.cli import app, build_parser, main
from crawler.config import CrawlerConfig
from crawler.exceptions import ConfigError
from crawler.state.depths import MAX_TRACKED_DEPTH
from tools.measure_crawl import crawl_command
from tools.testweb import SiteConfig, TestWeb

SEED = "http://127.0.0.1:9/"  # loopback, nothing listens: a crawl started by mistake goes nowhere


def one_error_line(err: str, *words: str) -> None:
    """``err`` is exactly one ``crawler: error:`` line holding each of ``words``."""
    assert err.count("\n") == 1 and err.startswith("crawler: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every file and directory under ``root``: kind and content (a link: its target)."""
    out: dict[str, tuple[str, str]] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            out[name] = ("link", os.readlink(path))
        elif path.is_dir():
            out[name] = ("dir", "")
        else:
            out[name] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return out


# -- numbers: every option has a range -------------------------------------------------------

# (flag, values refused, values accepted): the accepted ones are the bounds themselves.
START_RANGES = [
    ("--threads", ["0", "-1", "x", "10001"], ["1", "10000"]),
    ("--per-host", ["0", "10001"], ["1", "10000"]),
    ("--processes", ["0", "65", "99999999999"], ["1", "64"]),
    ("--max-pages", ["-1", str(10**12 + 1)], ["0", str(10**12)]),
    ("--max-pages-per-host", ["-1", str(10**12 + 1)], ["0", str(10**12)]),
    ("--max-depth", ["-1", "32768"], ["0", "32767"]),
    ("--delay", ["-1", "nan", "inf", "86401", "1e400"], ["0", "86400"]),
    ("--timeout", ["0", "-1", "nan", "inf", "86401"], ["0.001", "86400"]),
    ("--connect-timeout", ["0", "inf", "86401"], ["0.001", "86400"]),
    ("--read-timeout", ["0", "nan", "86401"], ["0.001", "86400"]),
    ("--dns-timeout", ["0", "inf", "86401"], ["0.001", "86400"]),
    ("--backoff", ["-1", "inf", "86401"], ["0", "86400"]),
    ("--max-retry-after", ["-1", "nan", "86401"], ["0", "86400"]),
    ("--max-crawl-delay", ["-1", "86401"], ["0", "86400"]),
    ("--bad-host-retry", ["-1", "86401"], ["0", "86400"]),
    ("--sync-interval", ["-1", "inf", "86401"], ["0", "86400"]),
    ("--status-interval", ["-1", "inf", "86401"], ["0", "86400"]),
    ("--max-retries", ["-1", "11"], ["0", "10"]),
    ("--max-redirects", ["-1", "21"], ["0", "20"]),
    ("--max-url-length", ["15", "65537", "99999999999"], ["16", "65536"]),
    ("--max-body-bytes", ["0", "33M", "99999999999999G"], ["1", "32M"]),
    ("--max-decoded-bytes", ["0", str((32 << 20) + 1)], ["1", str(32 << 20)]),
    ("--revisit-after", ["-1", "3651d", "1e300", "nan"], ["0", "3650d"]),
    ("--render-tabs", ["0", "65", "999999"], ["1", "64"]),
    ("--render-timeout", ["0", "inf", "86401"], ["0.001", "86400"]),
    ("--render-memory", ["15", "4097"], ["16", "4096"]),
    # Its upper bound is the memory budget's own business (issue 27, item 2): >= 1 here.
    ("--memory-budget", ["0", "-1", "x"], ["1", "165M"]),
]


def start_args(data: Path, *extra: str) -> list[str]:
    return ["start", SEED, "--data", str(data), *extra]


@pytest.mark.parametrize(
    ("flag", "value"), [(f, v) for f, bad, _ in START_RANGES for v in bad]
)
def test_start_refuses_a_number_out_of_its_range(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "c"
    assert main(start_args(data, "--processes", "1", f"{flag}={value}")) == 2
    one_error_line(capsys.readouterr().err, flag)
    assert not data.exists()


@pytest.mark.parametrize(
    ("flag", "value"), [(f, v) for f, _, good in START_RANGES for v in good]
)
def test_the_bounds_themselves_are_accepted(flag: str, value: str, tmp_path: Path) -> None:
    build_parser().parse_args(start_args(tmp_path / "c", f"{flag}={value}"))


def test_shards_bound_with_ray(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(start_args(tmp_path / "c", "--ray", "local", "--shards", "1025")) == 2
    one_error_line(capsys.readouterr().err, "--shards")
    build_parser().parse_args(start_args(tmp_path / "c", "--ray", "local", "--shards", "1024"))


def test_threads_are_bounded_per_shard_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """10,000 threads a process: 20,000 over two shards pass (the crawl then stops at
    its missing seeds), 20,001 do not; a resume counts the shards recorded."""
    data = tmp_path / "c"
    assert main(["start", "--data", str(data), "--processes", "2", "--threads", "20001"]) == 2
    one_error_line(capsys.readouterr().err, "--threads", "10,000")
    assert not data.exists()
    assert main(["start", "--data", str(data), "--processes", "2", "--threads", "20000"]) == 1
    one_error_line(capsys.readouterr().err, "no seeds")
    data.mkdir()
    (data / "shards.json").write_text('{"format": 1, "shards": 2}\n')
    before = snapshot(data)
    assert main(["start", SEED, "--data", str(data), "--threads", "20001"]) == 2
    one_error_line(capsys.readouterr().err, "--threads")
    assert snapshot(data) == before


def test_the_default_shard_count_is_within_its_bound() -> None:
    from crawler.state.shards import default_count

    assert 1 <= default_count() <= min(os.cpu_count() or 1, cfgmod.MAX_PROCESSES)


def test_the_depth_bound_is_what_the_depth_map_holds() -> None:
    assert cfgmod.MAX_DEPTH == MAX_TRACKED_DEPTH


def test_the_threads_of_the_issue_are_refused_at_once(tmp_path: Path) -> None:
    """``--threads 99999999999`` over two shards: a usage error before anything starts.
    (The child's address space is capped so that a regression cannot eat the machine.)"""
    data = tmp_path / "c"

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    proc = subprocess.Popen(
        [sys.executable, "-m", "crawler", "start", SEED, "--data", str(data),
         "--processes", "2", "--threads", "99999999999"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # a regression: its shards (own sessions) go too
        for pid in children(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 2, err[-2000:]
    one_error_line(err, "--threads")
    assert not data.exists()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rpartition(")")[2].split()[1]) == pid:
                    out.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return out


# The other commands' numbers: (argv, the flag named in the error). No directory is needed:
# a usage error comes before the crawl is looked at.
OTHER_RANGES = [
    (["export", "d", "--jsonl", "o", "--text", "--text-limit", "0"], "--text-limit"),
    (["export", "d", "--jsonl", "o", "--text", "--text-limit", str((32 << 20) + 1)],
     "--text-limit"),
    (["export", "d", "--jsonl", "o", "--progress-interval", "nan"], "--progress-interval"),
    (["export", "d", "--jsonl", "o", "--progress-interval", "86401"], "--progress-interval"),
    (["export", "d", "--warc", "o.warc", "--max-size", "1025G"], "--max-size"),
    (["pages", "d", "--status", "1000"], "--status"),
    (["pages", "d", "--status", "-1"], "--status"),
    (["pages", "d", "--limit", "-1"], "--limit"),
    (["pages", "d", "--limit", str(10**12 + 1)], "--limit"),
    (["rank", "d", "--tol", "nan"], "--tol"),
    (["rank", "d", "--tol", "0"], "--tol"),
    (["rank", "d", "--tol", "1.5"], "--tol"),
    (["rank", "d", "--damping", "nan"], "--damping"),
    (["rank", "d", "--damping", "1"], "--damping"),
    (["rank", "d", "--max-iter", "10001"], "--max-iter"),
    (["rank", "d", "--top", "-1"], "--top"),
    (["rank", "d", "--top", str(10**12 + 1)], "--top"),
    (["rank", "d", "--block-nodes", str((1 << 27) + 1)], "--block-nodes"),
    (["rank", "d", "--chunk", str((1 << 24) + 1)], "--chunk"),
    (["rank", "d", "--progress-interval", "inf"], "--progress-interval"),
    (["report", "d", "--limit", "0"], "--limit"),
    (["report", "d", "--limit", "10001"], "--limit"),
    (["report", "d", "--referrers", "10001"], "--referrers"),
    (["report", "d", "--progress-interval", "nan"], "--progress-interval"),
    (["serve", "d", "--limit", "10001"], "--limit"),
    (["serve", "d", "--referrers", "-1"], "--referrers"),
    (["serve", "d", "--interval", "nan"], "--interval"),
    (["serve", "d", "--interval", "86401"], "--interval"),
    (["serve", "d", "--refresh", "0"], "--refresh"),
    (["serve", "d", "--refresh", "86401"], "--refresh"),
    (["serve", "d", "--port", "65536"], "--port"),
    (["index", "d", "--memory", "15M"], "--memory"),
    (["index", "d", "--batch", "0"], "--batch"),
    (["index", "d", "--workers", "1025"], "--workers"),
    (["index", "d", "--text-limit", "0"], "--text-limit"),
    (["index", "d", "--progress-interval", "nan"], "--progress-interval"),
    (["search", "d", "q", "--limit", "0"], "--limit"),
    (["search", "d", "q", "--limit", "1001"], "--limit"),
    (["search", "d", "q", "--rank-weight", "nan"], "--rank-weight"),
    (["search", "d", "q", "--rank-weight", "-1"], "--rank-weight"),
    (["recrawl", "d", "--older-than", "3651d"], "--older-than"),
    (["recrawl", "d", "--older-than", "nan"], "--older-than"),
]


@pytest.mark.parametrize(("argv", "flag"), OTHER_RANGES)
def test_other_commands_refuse_numbers_out_of_range(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    one_error_line(capsys.readouterr().err, flag)
    assert list(tmp_path.iterdir()) == []


def test_every_number_option_is_in_the_tables() -> None:
    """A new option that takes a number must get a range (and a row above)."""
    listed: set[str | tuple[str, str]] = {"--shards"}
    listed |= {f for f, _, _ in START_RANGES}
    listed |= {(argv[0], flag) for argv, flag in OTHER_RANGES}
    parser = build_parser()
    for command, sub in parser._subparsers._group_actions[0].choices.items():  # type: ignore[union-attr]
        for action in sub._actions:
            if not action.option_strings or action.type in (None, str) or action.choices:
                continue
            if getattr(action.type, "__name__", "") in ("nameserver", "header_value", "_reasons",
                                                        "_statuses", "sitemap_mode",
                                                        "request_header", "proxy_value"):
                continue
            flag = action.option_strings[0]
            assert flag in listed or (command, flag) in listed, (command, flag)


# -- header values ---------------------------------------------------------------------------

BAD_AGENTS = ["bot\r\nX-Injected: 1", "bot\n", "bot\r", "bot\0", "bot\x01", "bot\tx",
              "bot\x7f", "bot\x1b[31m", "bot\x9b", "bot\u202e", "b\u00f6t", ""]


@pytest.mark.parametrize("agent", BAD_AGENTS)
def test_a_user_agent_with_control_characters_is_refused(
    agent: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = tmp_path / "c"
    assert main(start_args(data, "--user-agent", agent)) == 2
    one_error_line(capsys.readouterr().err, "--user-agent")
    assert not data.exists()
    monkeypatch.chdir(tmp_path)
    assert main(["export", "d", "--jsonl", "o", "--user-agent", agent]) == 2
    one_error_line(capsys.readouterr().err, "--user-agent")
    with pytest.raises(ConfigError, match="user.agent"):
        CrawlerConfig(data_dir=str(data), user_agent=agent)


def test_a_printable_user_agent_is_accepted() -> None:
    agent = "ExampleBot/1.0 (+https://example.org/bot; ops@example.org)"
    args = build_parser().parse_args(start_args(Path("c"), "--user-agent", agent))
    assert args.user_agent == agent
    CrawlerConfig(data_dir="c", user_agent=agent)


# -- damaged files of a crawl directory ---------------------------------------------------------


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path]]:
    """A finished crawl made by the command line: every file a crawl directory holds."""
    with TestWeb(SiteConfig(pages=20, hosts=2, seed=5, crawl_delay=0.0)) as web:
        data = tmp_path_factory.mktemp("bad-input") / "crawl"
        argv = crawl_command(web, data, "--processes", "1", "--threads", "8", "--delay", "0",
                             "--status-interval", "3600", "--quiet")[3:]
        assert main(argv) == 0
        assert {"settings.json", "seeds.txt", "shards.json", "status.json"} <= {
            p.name for p in data.iterdir()}
        yield web, data


@pytest.fixture
def copy(crawl: tuple[TestWeb, Path], tmp_path: Path) -> Path:
    """A copy of the module's crawl, to damage."""
    target = tmp_path / "crawl"
    shutil.copytree(crawl[1], target)
    return target


def every_command(data: Path, url: str, out: Path) -> dict[str, list[str]]:
    """Each command run on ``data`` (a resume for start), writing only under ``out``."""
    d = str(data)
    return {
        "start": ["start", "--data", d],
        "status": ["status", d],
        "export": ["export", d, "--jsonl", str(out / "o.jsonl"), "--quiet"],
        "pages": ["pages", d],
        "show": ["show", d, url],
        "links": ["links", d, url],
        "rank": ["rank", d, "--quiet", "--work", str(out)],
        "report": ["report", d, "--format", "json", "--quiet", "--work", str(out)],
        "serve": ["serve", d, "--port", "0", "--work", str(out)],
        "retry": ["retry", d],
        "recrawl": ["recrawl", d, "--older-than", "0"],
        "sitemaps": ["sitemaps", d],
        "index": ["index", d, "--quiet"],
        "search": ["search", d, "granite"],
        "move-shard": ["move-shard", d, "0", "198.18.0.12"],
        "reshard": ["reshard", d, "--shards", "2"],
        "compact": ["compact", d],
    }


# Commands that never read an existing crawl directory: demo makes a new crawl and
# refuses a --data that is not empty, with one line (tests/crawler/test_demo.py).
NEW_CRAWL_ONLY = {"demo"}
READERS = sorted(set(app.MODULE_OF) - NEW_CRAWL_ONLY)


def test_every_command_is_tried_on_damaged_files() -> None:
    assert sorted(every_command(Path("d"), SEED, Path("o"))) == READERS


SHARDS_DAMAGE = {
    "format x": '{"format": "x", "shards": 1}',
    "format null": '{"format": null, "shards": 1}',
    "null": "null",
    "a list": "[1]",
    "shards a string": '{"format": 1, "shards": "1"}',
    "shards true": '{"format": 1, "shards": true}',
    "no shards": '{"format": 1}',
    "shards 0": '{"format": 1, "shards": 0}',
    "shards 10**9": '{"format": 1, "shards": 1000000000}',
    "newer format": '{"format": 2, "shards": 1}',
    "deeply nested": "[" * 100_000 + "]" * 100_000,
    "binary": "\udcff\udcfe\0\1",
    "not json": "{",
}


@pytest.mark.parametrize("damage", ["format x", "format null"])
@pytest.mark.parametrize("command", READERS)
def test_a_damaged_shards_json_is_one_line_in_every_command(
    command: str, damage: str, copy: Path, crawl: tuple[TestWeb, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_damage(copy / "shards.json", SHARDS_DAMAGE[damage])
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(tmp_path)
    assert main(every_command(copy, crawl[0].seed_url, out)[command]) == 1
    one_error_line(capsys.readouterr().err, str(copy / "shards.json"))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["start", "status", "pages"])
@pytest.mark.parametrize("damage", sorted(SHARDS_DAMAGE))
def test_every_kind_of_shards_json_damage_is_one_line(
    command: str, damage: str, copy: Path, crawl: tuple[TestWeb, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_damage(copy / "shards.json", SHARDS_DAMAGE[damage])
    before = snapshot(tmp_path)
    assert main(every_command(copy, crawl[0].seed_url, tmp_path)[command]) == 1
    one_error_line(capsys.readouterr().err, str(copy / "shards.json"))
    assert snapshot(tmp_path) == before


def write_damage(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", "surrogateescape"))


SETTINGS_DAMAGE: dict[str, dict[str, object]] = {
    "threads a string": {"threads": "x"},
    "threads a float": {"threads": 4.5},
    "threads true": {"threads": True},
    "threads out of range": {"threads": 99999999999},
    "delay a string": {"delay": "1"},
    "delay null": {"delay": None},
    "delay nan": {"delay": float("nan")},
    "nameserver a number": {"nameserver": 5},
    "nameserver a bad entry": {"nameserver": ["1.2.3.4:port"]},
    "allow_regex not strings": {"allow_regex": [1, 2]},
    "broad a string": {"broad": "yes"},
    "user_agent a number": {"user_agent": 7},
    "user_agent with CR LF": {"user_agent": "bot\r\nX-Injected: 1"},
    "revisit_after a string": {"revisit_after": "7d"},
    "max_depth out of range": {"max_depth": 40000},
    "sitemaps unknown": {"sitemaps": "some"},
}


@pytest.mark.parametrize("damage", sorted(SETTINGS_DAMAGE))
def test_settings_of_the_wrong_type_are_one_line_on_resume(
    damage: str, copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = copy / "settings.json"
    doc = json.loads(path.read_text())
    doc["settings"].update(SETTINGS_DAMAGE[damage])
    path.write_text(json.dumps(doc))
    before = snapshot(tmp_path)
    assert main(["start", "--data", str(copy)]) == 1
    name = next(iter(SETTINGS_DAMAGE[damage]))
    one_error_line(capsys.readouterr().err, str(path), name)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "text",
    ["[]", '{"format": 1, "settings": []}', '{"format": "1", "settings": {}}',
     "[" * 100_000 + "]" * 100_000, "\udcff\udcfe", "{"],
)
def test_a_damaged_settings_file_is_one_line(
    text: str, copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_damage(copy / "settings.json", text)
    before = snapshot(tmp_path)
    assert main(["start", "--data", str(copy)]) == 1
    one_error_line(capsys.readouterr().err, str(copy / "settings.json"))
    assert snapshot(tmp_path) == before


RANK_DAMAGE = {
    "rank.json a list": ("rank.json", "[]"),
    "max_rank a string": ("rank.json", '{"max_rank": "big"}'),
    "max_rank not finite": ("rank.json", '{"max_rank": NaN}'),
    "graph.json records negative": ("graph.json", '{"records": -5}'),
    "graph.json records a float": ("graph.json", '{"records": 2.5}'),
    "graph.json nested": ("graph.json", '{"records": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "graph.json binary": ("graph.json", "\udcff\0"),
    "rank.f8 cut": ("rank.f8", ""),
    "rank.json gone": ("rank.json", None),
}


@pytest.mark.parametrize("damage", sorted(RANK_DAMAGE))
def test_a_damaged_rank_store_is_one_line(
    damage: str, copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rank store (DIR/rank, written by rank) read by pages --sort rank: damage is
    one line that says to run rank again."""
    assert main(["rank", str(copy), "--quiet"]) == 0
    capsys.readouterr()
    name, text = RANK_DAMAGE[damage]
    target = copy / "rank" / name
    if text is None:
        target.unlink()
    else:
        write_damage(target, text)
    before = snapshot(tmp_path)
    assert main(["pages", str(copy), "--sort", "rank", "--limit", "3"]) == 1
    err = capsys.readouterr().err
    if damage == "rank.json gone":  # no rank store at all, as before any rank run
        one_error_line(err, f"{copy} has no ranks", "crawler rank")
    else:
        one_error_line(err, str(copy / "rank"), "crawler rank")
    assert snapshot(tmp_path) == before


RAY_DAMAGE = {
    "a list": "[]",
    "nodes a string": '{"format": 1, "nodes": "n1"}',
    "nodes numbers": '{"format": 1, "nodes": [1, 2]}',
    "no nodes": '{"format": 1, "nodes": []}',
    "deeply nested": '{"nodes": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "binary": "\udcff\0",
    "not json": "{",
}


@pytest.mark.parametrize("command", [["start", "--data", "{d}"], ["move-shard", "{d}", "0", "::1"]])
@pytest.mark.parametrize("damage", sorted(RAY_DAMAGE))
def test_a_damaged_ray_placement_is_one_line_not_a_local_resume(
    damage: str, command: list[str], copy: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ray.json says which Ray node holds each shard's files: damaged, it must not read as
    "never on Ray" (a resume without --ray would then crawl on with empty shards), nor be
    rewritten by move-shard."""
    write_damage(copy / "ray.json", RAY_DAMAGE[damage])
    before = snapshot(tmp_path)
    assert main([arg.format(d=copy) for arg in command]) == 1
    one_error_line(capsys.readouterr().err, str(copy / "ray.json"))
    assert snapshot(tmp_path) == before


STATUS_DAMAGE = {
    "a list": "[]",
    "null": "null",
    "no time": '{"running": false, "fetched": 3}',
    "time a string": '{"time": "yesterday", "running": false}',
    "pid not a number": '{"time": 1.0, "running": true, "pid": "abc"}',
    "pid a float": '{"time": 1.0, "running": true, "pid": 1.5}',
    "running a string": '{"time": 1.0, "running": "no", "pid": 1}',
    "fetched a string": '{"time": 1.0, "running": false, "fetched": "3"}',
    "outcomes a list": '{"time": 1.0, "running": false, "outcomes": [1]}',
    "deeply nested": '{"time": 1.0, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "binary": "\udcff\0",
    "not json": "{",
}


@pytest.mark.parametrize("command", ["status", "start"])
@pytest.mark.parametrize("damage", sorted(STATUS_DAMAGE))
def test_a_damaged_status_json_is_one_line(
    damage: str, command: str, copy: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_damage(copy / "status.json", STATUS_DAMAGE[damage])
    before = snapshot(tmp_path)
    argv = ["status", str(copy)] if command == "status" else ["start", "--data", str(copy)]
    assert main(argv) == 1
    one_error_line(capsys.readouterr().err, str(copy / "status.json"))
    assert snapshot(tmp_path) == before


def test_a_status_json_that_only_says_how_the_run_ended_is_read(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a run that failed before its first report leaves (time, fetched, state)."""
    (copy / "status.json").write_text('{"time": 1.0, "fetched": 0, "state": "interrupted", '
                                      '"running": false}')
    assert main(["status", str(copy)]) == 0
    assert "interrupted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "where"),
    [(b"\xff\xfe\x00\x01binary", "seeds.txt"), (b"http://a.test/\nnot a url\n", "seeds.txt:2")],
)
def test_a_damaged_seeds_file_is_one_line(
    text: bytes, where: str, copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (copy / "seeds.txt").write_bytes(text)
    before = snapshot(tmp_path)
    assert main(["start", "--data", str(copy)]) == 1
    one_error_line(capsys.readouterr().err, str(copy / where))
    assert snapshot(tmp_path) == before


# -- sitemaps on a directory that is not a crawl ---------------------------------------------


def test_sitemaps_of_a_directory_that_is_no_crawl_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("another program's files\n")
    assert main(["sitemaps", str(other)]) == 1
    one_error_line(capsys.readouterr().err, str(other), "not a crawl directory")
    assert main(["sitemaps", str(tmp_path / "none")]) == 1
    one_error_line(capsys.readouterr().err, "no such crawl directory")


def test_sitemaps_of_a_crawl_lists_them(
    crawl: tuple[TestWeb, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sitemaps", str(crawl[1])]) == 0
    assert "/sitemap.xml" in capsys.readouterr().out
