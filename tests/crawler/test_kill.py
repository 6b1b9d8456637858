"""Crash safety of a whole crawl: kill -9 at random moments, and SIGINT then resume."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import cli_args, fetched_urls, start_cli

from tools.testweb import TestWeb, fault

MakeWeb = Callable[..., TestWeb]
THREADS = 8


def page_refetches(web: TestWeb) -> dict[str, int]:
    """URLs (robots.txt aside: each run reads it again) requested more than once, and how often."""
    counts = Counter(
        f"{r.host}{r.target}" for r in web.log.records() if not r.target.endswith("/robots.txt")
    )
    return {url: n for url, n in counts.items() if n > 1}


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.communicate()  # reaps it and closes the pipes


# The server may read a request head the killed process sent just before it died
# a little after the kill: such a request still belongs to the killed run.
KILL_GRACE = 0.2


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    """Poll until ``condition()`` holds (the crawl reached a state), failing if the crawl
    ends first or nothing happens for a minute. Never a fixed sleep: machines differ."""
    deadline = time.monotonic() + 60
    while not condition():
        assert proc.poll() is None, f"the crawl ended before {what}: use a bigger site"
        assert time.monotonic() < deadline, f"no {what} within a minute"
        time.sleep(0.02)


# Outcomes reach the OS within milliseconds of a fetch (the committer writes
# continuously), so what a kill loses is what was in flight: requests still
# open at the kill or finished just before it. This bound is far below the
# seconds of finished work a buffered design would lose, and loose enough for
# a loaded machine.
IN_FLIGHT_WINDOW = 2.0


@pytest.mark.slow
def test_kill9_at_random_moments_loses_nothing(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=8000, hosts=6, seed=8, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    rng = random.Random(11)
    kill_times: list[float] = []
    while len(kill_times) < 10:
        proc = start_cli(cli_args(web, data, "--threads", str(THREADS)))
        time.sleep(rng.uniform(0.5, 1.5))
        if proc.poll() is not None:
            proc.communicate()
            break  # it finished before this kill
        kill(proc)
        kill_times.append(time.time() + KILL_GRACE)  # requests starting before: the killed run's
    assert len(kill_times) >= 10, (
        "the crawl finished too soon to be killed ten times: use a bigger site"
    )
    final = start_cli(cli_args(web, data, "--threads", str(THREADS)))
    out, err = final.communicate(timeout=240)
    assert final.returncode == 0, err.decode()[-2000:]
    assert fetched_urls(data) == want
    # Every refetch is of a URL that was in flight at a kill.
    by_url: dict[str, list[tuple[float, float | None]]] = {}
    for r in web.log.records():
        if not r.target.endswith("/robots.txt"):
            by_url.setdefault(f"{r.host}{r.target}", []).append((r.start, r.end))
    refetched = 0
    for url, reqs in by_url.items():
        for (start, end), (next_start, _) in zip(reqs, reqs[1:], strict=False):
            kills = [t for t in kill_times if start <= t <= next_start]
            assert kills, (f"{url} fetched twice within one run", reqs, kill_times)
            assert end is None or end >= kills[0] - IN_FLIGHT_WINDOW, (url, kills[0] - end)
            refetched += 1
    assert refetched <= len(kill_times) * 64, refetched


def test_sigint_then_resume_refetches_nothing(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=600, hosts=4, seed=9, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    proc = start_cli(cli_args(web, data, "--threads", str(THREADS)))
    wait_for(lambda: len(web.log.records(done=True)) >= 60, proc, "60 answered requests")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err.decode()[-2000:]
    assert b"interrupted" in out
    before = len(fetched_urls(data))
    assert 0 < before < len(want)
    final = start_cli(cli_args(web, data, "--threads", str(THREADS)))
    out, err = final.communicate(timeout=120)
    assert final.returncode == 0, err.decode()[-2000:]
    assert b"crawl complete" in out
    assert fetched_urls(data) == want
    assert page_refetches(web) == {}


def test_second_sigint_stops_at_once_and_is_safe(make_testweb: MakeWeb, tmp_path: Path) -> None:
    # h1's pages answer slowly, so the clean stop after the first Ctrl-C waits for fetches.
    slow = fault("slow_first_byte", host="h1.test", prefix="/", delay=3.0)
    web = make_testweb(pages=200, hosts=4, seed=10, crawl_delay=0.0, faults=[slow])
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    args = cli_args(web, data, "--threads", str(THREADS), "--per-host", str(THREADS))
    proc = start_cli(args)

    def inside_slow_fetches() -> bool:  # past start-up and robots.txt: h1's pages in flight
        in_flight = web.log.records(host="h1.test", done=False)
        return any(not r.target.endswith("/robots.txt") for r in in_flight)

    wait_for(inside_slow_fetches, proc, "a slow fetch in flight")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)  # signals are not queued: two at once would count as one
    assert proc.poll() is None, "the clean stop did not wait for the slow fetches"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT, err.decode()[-2000:]
    assert b"crawl " not in out  # no orderly shutdown, no summary: it stopped at once
    final = start_cli(args)
    out, err = final.communicate(timeout=180)
    assert final.returncode == 0, err.decode()[-2000:]
    assert fetched_urls(data) == want
