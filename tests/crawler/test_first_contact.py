"""What a newcomer met first (issue 43, section 4): a crawl that crawled nothing and said
it was complete, a resume that quietly did nothing, a Ctrl-C through ``| tee`` that left
a crawl "killed or crashed", ``status | head`` printing an error, ``--dat`` taken as
``--data``, and an export that overwrote a file without a word."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from crawl_helpers import REPO, cli_args, run_cli, wait_for_answers

from crawler.cli import build_parser
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
STOP_WAIT = 120.0  # seconds a stopped start may take to exit (a busy 2-core machine)
# A seed the crawler refuses without --allow-private-ips, and that no DNS is asked for.
PRIVATE_SEED = "http://127.0.0.1:1/"


def crawler(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``python -m crawler ARGS`` run to its end (in ``cwd``)."""
    return subprocess.run([sys.executable, "-m", "crawler", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=STOP_WAIT,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


# -- a crawl that crawled nothing ---------------------------------------------------


class TestNothingCrawled:
    def test_every_seed_refused_exits_1_saying_why_and_what_would(self, tmp_path: Path) -> None:
        data = tmp_path / "c"
        done = crawler("start", PRIVATE_SEED, "--data", str(data), "--processes", "1",
                       "--quiet")
        assert done.returncode == 1, done.stderr
        assert done.stdout.startswith("crawl complete: ")  # the summary stays as it was
        line = last_line(done.stderr)
        assert line.startswith("crawler: nothing was crawled: every seed was refused or "
                               "failed (1 private_ip); add --allow-private-ips"), line
        assert (f"python -m crawler retry {data} --reason private_ip && python -m crawler "
                f"start --data {data} --allow-private-ips") in line
        assert "Traceback" not in done.stderr

    def test_a_name_not_in_dns_on_shards_exits_1(self, make_testweb: MakeWeb,
                                                 tmp_path: Path) -> None:
        web = make_testweb(pages=10, hosts=1, seed=1, crawl_delay=0.0)
        host, port = web.nameserver
        done = crawler("start", "http://nosuch.test/", "--data", str(tmp_path / "c"),
                       "--processes", "2", "--nameserver", f"{host}:{port}", "--quiet")
        assert done.returncode == 1, done.stderr
        line = last_line(done.stderr)
        assert line.startswith("crawler: nothing was crawled: every seed was refused or "
                               "failed (1 dns_nxdomain); check the URL"), line

    def test_a_crawl_that_fetched_exits_0(self, make_testweb: MakeWeb, tmp_path: Path) -> None:
        web = make_testweb(pages=10, hosts=1, seed=1, crawl_delay=0.0)
        done = run_cli(cli_args(web, tmp_path / "c", "--quiet"))
        assert done.returncode == 0, done.stderr
        assert "nothing was crawled" not in done.stderr


class TestResumeAfterTheFix:
    def test_the_resume_names_retry_and_the_retry_it_names_works(self, tmp_path: Path) -> None:
        data = tmp_path / "c"
        crawler("start", PRIVATE_SEED, "--data", str(data), "--processes", "1", "--quiet")
        done = crawler("start", "--data", str(data), "--allow-private-ips", "--quiet")
        assert done.returncode == 0, done.stderr  # nothing to do is no failure
        said = [ln for ln in done.stderr.splitlines() if "stay as recorded" in ln]
        assert len(said) == 1, done.stderr
        assert said[0].startswith("crawler: --allow-private-ips changed, but the URLs "
                                  "recorded before as private_ip (1 URL) stay as recorded")
        command = said[0].split("`")[1]
        assert command == f"python -m crawler retry {data} --reason private_ip"
        retried = crawler(*shlex.split(command)[3:])
        assert retried.returncode == 0, retried.stderr
        again = crawler("start", "--data", str(data), "--quiet")
        # now the seed is fetched: nothing listens on port 1
        assert '"connect_refused": 1' in again.stdout, again.stdout
        assert "stay as recorded" not in again.stderr

    def test_a_change_that_addresses_nothing_recorded_says_nothing(self,
                                                                   tmp_path: Path) -> None:
        data = tmp_path / "c"
        crawler("start", PRIVATE_SEED, "--data", str(data), "--processes", "1", "--quiet")
        done = crawler("start", "--data", str(data), "--ca-bundle", os.devnull, "--quiet")
        assert "stay as recorded" not in done.stderr


# -- closed pipes ---------------------------------------------------------------------


def status_of(data: Path) -> str:
    done = crawler("status", str(data))
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("processes", [1, 2])
def test_ctrl_c_through_tee_stops_cleanly_and_records_it(
    processes: int, make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """``start ... 2>&1 | tee log`` and Ctrl-C: the terminal sends SIGINT to the whole
    pipeline, so tee is gone when the crawler says it is stopping and prints its summary.
    tee goes first here, so every one of those writes meets the closed pipe."""
    web = make_testweb(pages=400, hosts=2, seed=6, crawl_delay=0.0)
    data = tmp_path / "c"
    read_end, write_end = os.pipe()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cli_args(web, data, "--processes", str(processes), "--delay",
                                     "0.2", "--status-interval", "0.5"),
                            cwd=REPO, env=env, stdout=write_end, stderr=subprocess.STDOUT,
                            process_group=0)
    tee = subprocess.Popen(["tee", str(tmp_path / "log")], stdin=read_end,
                           stdout=subprocess.DEVNULL, process_group=proc.pid)
    os.close(read_end)
    os.close(write_end)
    try:
        wait_for_answers(web, proc, 5)
        tee.send_signal(signal.SIGINT)
        assert tee.wait(timeout=STOP_WAIT) == -signal.SIGINT
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends (tee is gone by now)
        assert proc.wait(timeout=STOP_WAIT) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    status = status_of(data)
    assert "interrupted (Ctrl-C or SIGTERM)" in status.splitlines()[0], status
    assert "killed or crashed" not in status


@pytest.fixture
def refused_crawl(tmp_path: Path) -> Path:
    data = tmp_path / "c"
    crawler("start", PRIVATE_SEED, "--data", str(data), "--processes", "1", "--quiet")
    return data


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_status_into_a_closed_pipe_ends_quietly(refused_crawl: Path, extra: tuple[str, ...]
                                                ) -> None:
    """``status DIR | head -3``, with head gone before status writes: no error, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "crawler", "status", str(refused_crawl),
                             *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=STOP_WAIT) == 0, err
    assert err == ""


# -- no abbreviations --------------------------------------------------------------------


def every_parser() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    parser = build_parser()
    yield "python -m crawler", parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_no_parser_takes_an_abbreviation() -> None:
    parsers = dict(every_parser())
    assert len(parsers) > 15
    for name, parser in parsers.items():
        assert parser.allow_abbrev is False, name
        for option in (s for a in parser._actions for s in a.option_strings):
            shorter = option[:-1]
            if option.startswith("--") and len(shorter) > 2 \
                    and shorter not in parser._option_string_actions:
                # with abbreviations on, argparse would take ``shorter`` as ``option``
                assert parser._parse_optional(shorter) in (None, [(None, shorter, None)],
                                                           (None, shorter, None)), \
                    (name, shorter)


def test_dat_is_not_data(tmp_path: Path) -> None:
    done = crawler("start", PRIVATE_SEED, "--dat", str(tmp_path / "c"))
    assert done.returncode == 2
    assert not (tmp_path / "c").exists()


# -- existing outputs ----------------------------------------------------------------------


OUTPUTS = {
    "--warc": ("export", "--warc", "out.warc.gz"),
    "--warc --max-size": ("export", "--warc", "out.warc.gz", "--max-size", "1M"),
    "--wacz": ("export", "--wacz", "out.wacz"),
    "--jsonl": ("export", "--jsonl", "out.jsonl"),
    "--markdown": ("export", "--markdown", "md"),
    "report --out": ("report", "--format", "json", "--out", "report.json"),
}
WRITES = {"--warc": "out.warc.gz", "--warc --max-size": "out-00000.warc.gz",
          "--wacz": "out.wacz", "--jsonl": "out.jsonl", "--markdown": "md",
          "report --out": "report.json"}


@pytest.mark.slow
@pytest.mark.parametrize("output", list(OUTPUTS))
def test_an_existing_output_is_refused_unless_force(
    output: str, refused_crawl: Path, tmp_path: Path
) -> None:
    command, *options = OUTPUTS[output]
    run = [command, str(refused_crawl), *options, "--quiet"]
    out = tmp_path / "out"
    out.mkdir()
    first = crawler(*run, cwd=out)
    assert first.returncode == 0, first.stderr
    target = out / WRITES[output]
    before = sorted(p.name for p in out.rglob("*"))
    stamp = os.stat(target).st_mtime_ns
    again = crawler(*run, cwd=out)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "give --force to replace" in again.stderr
    assert sorted(p.name for p in out.rglob("*")) == before
    assert os.stat(target).st_mtime_ns == stamp  # not touched
    forced = crawler(*run, "--force", cwd=out)
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in out.rglob("*")) == before  # replaced, nothing left over


def test_a_split_export_forced_over_a_longer_one_leaves_no_old_file(
    refused_crawl: Path, tmp_path: Path
) -> None:
    old = tmp_path / "out-00001.warc.gz"
    (tmp_path / "out-00000.warc.gz").write_bytes(b"old")
    old.write_bytes(b"old")
    done = crawler("export", str(refused_crawl), "--warc", "out.warc.gz", "--max-size", "1M",
                   "--force", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not old.exists()
    assert (tmp_path / "out-00000.warc.gz").read_bytes() != b"old"


def test_force_leaves_a_directory_that_is_no_markdown_export(
    refused_crawl: Path, tmp_path: Path
) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    done = crawler("export", str(refused_crawl), "--markdown", "mine", "--force", "--quiet",
                   cwd=tmp_path)
    assert done.returncode == 1
    assert "not a Markdown export" in done.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
