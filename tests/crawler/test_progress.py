"""Progress of export, rank and report (crawler/cli/progress.py): a tqdm bar on a terminal
(the CLI run under a pseudo-terminal), log lines whose numbers add up elsewhere, nothing
with --quiet; the line format and the convergence estimate; rank's and report's errors.

The parsers here (``progress_lines``, ``wrote_lines``, ``export_cli``) are shared with
test_warc_export.py and test_jsonl_export.py."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import shlex
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawl_helpers import REPO, records, run_cli, run_crawl

from crawler.cli.progress import Convergence, Progress, duration, line, percent, rate
from tools.testweb import SiteConfig, TestWeb

TERMINAL_TIMEOUT = 120.0  # seconds for a command under the pseudo-terminal
_PROGRESS = re.compile(
    r"(?P<name>[a-z]+): (?P<pct>\d+)% \((?P<done>[\d,]+)/(?P<est>~?)(?P<total>[\d,]+) "
    r"(?P<unit>\w+)\)(?P<final> in )?")
_WROTE = re.compile(r"export: wrote (?P<path>.+) \((?P<n>[\d,]+) (?:records|lines), "
                    r"(?P<bytes>[\d,]+) bytes\)$")
# tqdm's bar: "export:  45%|####5     | 27/60 [00:00<00:00, 1234.56pages/s]"
_BAR = re.compile(r"(?P<name>[a-z]+): +(?P<pct>\d+)%\|[^|\r\n]*\| (?P<done>\d+)/(?P<total>\d+) "
                  r"\[[^\]\r\n]*(?P<unit>pages|iterations)/s\]")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def progress_lines(stderr: str, name: str = "export") -> list[tuple[int, int, int, bool]]:
    """(percent, done, total, final) of each progress line of phase ``name``."""
    out = []
    for text in stderr.splitlines():
        m = _PROGRESS.search(text)
        if m and m["name"] == name:
            out.append((int(m["pct"]), _int(m["done"]), _int(m["total"]), bool(m["final"])))
    return out


def assert_complete(lines: list[tuple[int, int, int, bool]], total: int) -> None:
    """Percent and count never go back, totals agree, and the last line is 100% of
    ``total``, marked final (and the only final one)."""
    assert lines, "no progress line"
    assert [p for p, *_ in lines] == sorted(p for p, *_ in lines)
    assert [d for _, d, _, _ in lines] == sorted(d for _, d, _, _ in lines)
    assert {t for _, _, t, _ in lines} == {total}
    assert lines[-1] == (100, total, total, True)
    assert [f for *_, f in lines].count(True) == 1
    for pct, done, t, _ in lines:
        assert pct == (100 * done // t if t else 100)


def wrote_lines(stderr: str) -> list[tuple[str, int, int]]:
    """(path, records or lines, bytes) of each 'export: wrote' log line, in order."""
    out = []
    for text in stderr.splitlines():
        m = _WROTE.search(text)
        if m:
            out.append((m["path"], _int(m["n"]), _int(m["bytes"])))
    return out


def listed_files(stdout: str) -> list[str]:
    """The files named by the last line of an export's stdout (``wrote A B...``)."""
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("wrote "), stdout
    return shlex.split(last[len("wrote "):])


def crawler_cli(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``python -m crawler ARGS`` as a subprocess, stderr not a terminal."""
    return run_cli([sys.executable, "-m", "crawler", *args], timeout=timeout)


def export_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return crawler_cli("export", *args)


def on_terminal(args: list[str], columns: int = 100) -> tuple[int, str, str]:
    """Run ``python -m crawler ARGS`` with stderr on a pseudo-terminal (stdout a pipe);
    (exit code, what the terminal showed, stdout)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(REPO), TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "crawler", *args], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + TERMINAL_TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the command closed the terminal (it ended)
                break
            if not data:
                break
            shown += data
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, shown.decode("utf-8", "replace"), out


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with TestWeb(SiteConfig(pages=60, hosts=2, seed=3, crawl_delay=0.0)) as web:
        data = tmp_path_factory.mktemp("progress") / "crawl"
        engine = run_crawl(web, data)
        assert engine.complete  # type: ignore[attr-defined]
        yield data


# -- the terminal: a tqdm bar -------------------------------------------------------------


def test_export_on_a_terminal_shows_a_bar_that_ends_full(crawl: Path, tmp_path: Path) -> None:
    n = len(records(crawl))
    out = tmp_path / "t.warc.gz"
    code, shown, stdout = on_terminal(["export", str(crawl), "--warc", str(out)])
    assert code == 0, shown[-3000:]
    bars = list(_BAR.finditer(shown))
    assert bars, shown[-3000:]
    assert {(b["name"], b["unit"], int(b["total"])) for b in bars} == {("export", "pages", n)}
    last = bars[-1]
    assert (int(last["pct"]), int(last["done"])) == (100, n)
    assert not progress_lines(shown)  # a bar, not log lines, on a terminal
    assert wrote_lines(shown) == [(str(out), len(list(_records(out))), out.stat().st_size)]
    assert listed_files(stdout) == [str(out)]


def test_log_lines_print_above_the_bar_not_into_it(tmp_path: Path) -> None:
    """A warning in the middle of the pass (a damaged record) starts its own line: tqdm's
    logging redirect clears the bar first, instead of the message being glued to it."""
    from test_warc_export import _store_with_damage

    data = tmp_path / "damaged"
    _store_with_damage(data)
    code, shown, _ = on_terminal(["export", str(data), "--warc", str(tmp_path / "d.warc")])
    assert code == 0, shown[-3000:]
    assert _BAR.search(shown), shown[-3000:]
    warnings = [m.start() for m in re.finditer(r"\d{4}-\d\d-\d\d [\d:,]+ WARNING ", shown)]
    assert len(warnings) == 2, shown
    for at in warnings:
        assert at == 0 or shown[at - 1] in "\r\n", repr(shown[max(0, at - 80):at + 40])


def test_quiet_on_a_terminal_shows_nothing(crawl: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.warc.gz"
    code, shown, stdout = on_terminal(["export", str(crawl), "--warc", str(out), "--quiet"])
    assert code == 0 and shown == "", shown
    assert listed_files(stdout) == [str(out)]  # the result still goes to stdout


def test_rank_on_a_terminal_shows_its_two_passes(crawl: Path) -> None:
    code, shown, stdout = on_terminal(["rank", str(crawl), "--top", "0"])
    assert code == 0, shown[-3000:]
    names = {(b["name"], b["unit"]) for b in _BAR.finditer(shown)}
    assert names == {("rank", "pages"), ("pagerank", "iterations")}, shown[-3000:]
    assert "converged after" in stdout


# -- not a terminal: log lines that add up --------------------------------------------------


def test_rank_progress_lines_cover_the_records_then_the_iterations(crawl: Path) -> None:
    done = crawler_cli("rank", str(crawl), "--json", "--top", "0", "--progress-interval", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    n = len(records(crawl))
    assert_complete(progress_lines(done.stderr, "rank"), n)
    iterations = progress_lines(done.stderr, "pagerank")
    assert [d for _, d, _, _ in iterations] == list(range(1, result["iterations"] + 1))
    assert iterations[-1] == (100, result["iterations"], result["iterations"], True)
    text = done.stderr
    assert text.index("rank: 100%") < text.index("pagerank: ")  # one pass after the other


def test_report_progress_lines_cover_the_records(crawl: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = crawler_cli("report", str(crawl), "--format", "json", "--out", str(out),
                       "--progress-interval", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert_complete(progress_lines(done.stderr, "report"), report["crawl"]["records"])
    iterations = progress_lines(done.stderr, "pagerank")
    assert iterations[-1][1:3] == (report["rank"]["iterations"],) * 2


def test_quiet_and_interval(crawl: Path, tmp_path: Path) -> None:
    quiet = export_cli(str(crawl), "--warc", str(tmp_path / "a.warc"), "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    default = export_cli(str(crawl), "--warc", str(tmp_path / "b.warc"))
    n = len(records(crawl))
    # A pass shorter than the 10 s interval: its one last line only.
    assert progress_lines(default.stderr) == [(100, n, n, True)], default.stderr


# -- errors of rank and report --------------------------------------------------------------


def test_rank_work_directory_is_never_emptied(crawl: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    done = crawler_cli("rank", str(crawl), "--work", str(work), "--quiet", "--top", "0")
    assert done.returncode == 0, done.stderr
    assert [p.name for p in work.iterdir()] == ["keep.txt"]  # nothing removed, nothing left
    assert (crawl / "rank" / "rank.json").exists()
    missing = crawler_cli("rank", str(crawl), "--work", str(tmp_path / "none"), "--quiet")
    assert (missing.returncode, missing.stderr) == (
        1, f"crawler: error: --work {tmp_path / 'none'}: no such directory: create it first\n")


def test_report_into_a_missing_directory_fails_at_once(crawl: Path, tmp_path: Path) -> None:
    out = tmp_path / "no" / "r.json"
    done = crawler_cli("report", str(crawl), "--format", "json", "--out", str(out))
    assert done.returncode == 1
    assert done.stderr == (f"crawler: error: cannot write the report: {out}: the directory "
                           f"{out.parent} does not exist: create it first\n")
    assert not progress_lines(done.stderr, "report")  # failed before reading anything
    (tmp_path / "dir.json").mkdir()
    done = crawler_cli("report", str(crawl), "--format", "json", "--out",
                       str(tmp_path / "dir.json"))
    assert done.returncode == 1 and "is a directory: give a file name" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json"]


# -- the pure parts ---------------------------------------------------------------------------


class TestFormat:
    def test_duration_rate_percent(self) -> None:
        assert [duration(s) for s in (0, 4.4, 59.6, 200, 3599, 7500)] == [
            "0 s", "4 s", "1 min 00 s", "3 min 20 s", "59 min 59 s", "2 h 05 min"]
        assert duration(0.123, precise=True) == "0.1 s" and duration(12, precise=True) == "12 s"
        assert rate(1230.4, "pages") == "1,230 pages/s" and rate(2.25, "x") == "2.2 x/s"
        assert [percent(d, 10_000) for d in (0, 4_599, 9_999, 10_000)] == [0, 45, 99, 100]
        assert percent(0, 0) == 100

    def test_lines(self) -> None:
        assert line("export", 4_500, 10_000, 3.66) == (
            "export: 45% (4,500/10,000 pages), 1,230 pages/s, 4 s left")
        assert line("export", 10_000, 10_000, 8.13, final=True) == (
            "export: 100% (10,000/10,000 pages) in 8.1 s, 1,230 pages/s")
        assert line("pagerank", 8, 20, 4.0, unit="iterations", estimated=True) == (
            "pagerank: 40% (8/~20 iterations), 2.0 iterations/s, ~6 s left")
        assert line("export", 0, 5, 1.0) == "export: 0% (0/5 pages), time left unknown"


class TestProgress:
    def _progress(self, **kw: object) -> tuple[Progress, list[float]]:
        now = [0.0]
        stream = io.StringIO()  # not a terminal
        return Progress(stream=stream, clock=lambda: now[0], **kw), now  # type: ignore[arg-type]

    def test_a_line_per_interval_then_the_last(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level("INFO", logger="crawler.cli.progress")
        progress, now = self._progress(interval=10.0)
        with progress:
            phase = progress.phase("export")
            for done in range(1, 101):
                now[0] = done * 0.5  # 2 pages/s: a line every 20 pages
                phase(done, 100)
            phase(100, 100)  # a repeated last call adds nothing
        got = [r.getMessage() for r in caplog.records]
        assert [p for p, *_ in progress_lines("\n".join(got))] == [20, 40, 60, 80, 100]
        assert got[0] == "export: 20% (20/100 pages), 2.0 pages/s, 40 s left"
        assert got[-1] == "export: 100% (100/100 pages) in 50 s, 2.0 pages/s"

    def test_short_of_its_total_the_last_line_says_where(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level("INFO", logger="crawler.cli.progress")
        progress, now = self._progress(interval=100.0)
        with progress:
            phase = progress.phase("export")
            now[0] = 1.0
            phase(7, 10)
        assert [r.getMessage() for r in caplog.records] == [
            "export: 70% (7/10 pages) in 1.0 s, 7.0 pages/s"]

    def test_after_an_error_no_last_line_and_quiet_is_silent(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level("INFO", logger="crawler.cli.progress")
        progress, _ = self._progress(interval=100.0)
        with pytest.raises(OSError), progress:
            progress.phase("export")(1, 10)
            raise OSError("disk full")
        quiet, _ = self._progress(quiet=True, interval=0.0)
        with quiet:
            for done in range(1, 11):
                quiet.phase("export")(done, 10)
        assert caplog.records == []

    def test_convergence_estimates_the_iterations_left(self) -> None:
        calls: list[tuple[int, int]] = []
        conv = Convergence(lambda d, t: calls.append((d, t)), tol=1e-9, max_iter=200)
        for it in range(1, 8):
            conv(it, 3 * 0.1 ** it)  # a tenth per iteration: below 1e-9 at iteration 10
        assert calls[0] == (1, 200)  # one point: no ratio yet
        assert all(t == 10 for _, t in calls[1:]), calls
        conv(10, 3e-10)
        assert calls[-1] == (10, 10)  # converged: the phase is complete
        stuck: list[tuple[int, int]] = []
        flat = Convergence(lambda d, t: stuck.append((d, t)), tol=1e-9, max_iter=5)
        for it in range(1, 6):
            flat(it, 0.5)  # no progress: the estimate is max_iter, reached at the end
        assert stuck[-1] == (5, 5) and all(t == 5 for _, t in stuck)


def _records(path: Path) -> Iterator[object]:
    from warcio.archiveiterator import ArchiveIterator

    with open(path, "rb") as f:
        yield from ArchiveIterator(f)
