"""SIGTERM and Ctrl-C while ``start`` is still starting (settings written, stores opening,
shards starting, thread pools being made): a prompt, clean stop, and a resume that
finishes the crawl (issue 27, item 3)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import REPO, cli_args, fetched_urls, run_cli, start_cli, wait_for

from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
STOP_WAIT = 120.0  # seconds a stopped start may take to exit (a busy 2-core machine)


def status_of(data: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "crawler", "status", str(data), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    info: dict[str, object] = json.loads(done.stdout)
    return info


def stopped_cleanly(proc: subprocess.Popen[bytes], sig: int, data: Path) -> None:
    """``proc`` exits 128 + ``sig`` with the stop's words and no traceback, and the
    crawl's status says it was interrupted."""
    out, err = proc.communicate(timeout=STOP_WAIT)
    text = err.decode()
    assert proc.returncode == 128 + sig, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert out.decode().startswith("crawl interrupted"), out.decode()
    info = status_of(data)
    assert info["running"] is False
    assert str(info["state"]).startswith("interrupted"), info["state"]


def resume_finishes(web: TestWeb, data: Path, *extra: str) -> None:
    done = run_cli(cli_args(web, data, *extra))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("crawl complete")
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)


@pytest.mark.parametrize(
    ("processes", "sig"),
    [(1, signal.SIGTERM), (2, signal.SIGTERM), (1, signal.SIGINT)],
)
def test_a_signal_as_the_settings_are_written_stops_cleanly(
    processes: int, sig: int, make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """The signal lands just after settings.json appears: while the layout is written,
    the engine or the supervisor loads and the stores open."""
    web = make_testweb(pages=60, hosts=3, seed=3, crawl_delay=0.0)
    data = tmp_path / "c"
    proc = start_cli(cli_args(web, data, "--processes", str(processes)))
    wait_for(lambda: (data / "settings.json").exists(), proc, "settings.json", timeout=STOP_WAIT)
    proc.send_signal(sig)
    stopped_cleanly(proc, sig, data)
    resume_finishes(web, data, "--processes", str(processes))


def test_sigterm_while_the_shards_start_their_threads_stops_cleanly(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """Two shards of 2,000 threads each: the signal lands as the supervisor has started
    them (its first status.json), while they open their stores and make their pools."""
    web = make_testweb(pages=60, hosts=3, seed=4, crawl_delay=0.0)
    data = tmp_path / "c"
    proc = start_cli(cli_args(web, data, "--processes", "2", "--threads", "4000"))
    wait_for(lambda: (data / "status.json").exists(), proc, "status.json", timeout=STOP_WAIT)
    proc.send_signal(signal.SIGTERM)
    stopped_cleanly(proc, signal.SIGTERM, data)
    resume_finishes(web, data, "--processes", "2", "--threads", "8")
