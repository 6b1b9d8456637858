"""start --revisit-after D: a crawl that keeps going (crawler.state.due).

The test web's generated pages answer a conditional GET with 304 (they never
change); a local server's page changes at every request. With D = 1 s, the rule
says: an unchanged page comes back after 1, 2, 4, 8, 8... s, a changed one after
1, 0.5, 0.25, 0.25... s. Each request's gap to the one before is at least the
interval the earlier fetch got (the crawler never revisits early), and the
record's interval is exactly the rule's for the number of fetches the server saw.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import (
    META_PATHS,
    Answer,
    Hit,
    LocalServer,
    cli_args,
    config_for,
    html_links,
    records,
    run_cli,
    start_cli,
    status_json,
    wait_for,
)

from crawler.run.engine import Engine
from crawler.state.due import MAX_FACTOR, MIN_FACTOR, next_interval
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
D = 1.0
EPS = 0.01  # the server's and the crawler's clocks are the same; this is rounding


def unchanged(n: int) -> float:
    """The interval after the n-th fetch of a page that never changes."""
    return min(D * 2 ** (n - 1), D * MAX_FACTOR)


def changing(n: int) -> float:
    return max(D / 2 ** (n - 1), D * MIN_FACTOR)


def changing_page(path: str, hits: list[Hit]) -> Answer:
    if path in META_PATHS:
        return 404, [], b""
    n = sum(1 for h in hits if h.path == path)
    status, headers, body = html_links([])
    return status, headers, body.replace(b"<body>", f"<body>visit {n}".encode())


def starts(web: TestWeb) -> dict[str, list[float]]:
    """Page URL -> the start times of its requests (robots.txt and sitemap aside)."""
    out: dict[str, list[float]] = defaultdict(list)
    for r in web.log.records():
        if r.path not in META_PATHS:
            out[r.url].append(r.start)
    return out


def test_the_rule() -> None:
    assert next_interval(60, 0, None) == 60  # a first fetch
    assert [next_interval(60, 60, False), next_interval(60, 240, False),
            next_interval(60, 480, False)] == [120, 480, 480]
    assert [next_interval(60, 60, True), next_interval(60, 30, True),
            next_interval(60, 15, True)] == [30, 15, 15]
    assert next_interval(60, 480, True) == 240  # one change: twice as often


@pytest.mark.slow
def test_unchanged_pages_come_back_later_and_changed_ones_sooner(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=6, hosts=1, seed=2, crawl_delay=0.0)
    with LocalServer(changing_page) as local:
        engine = Engine(config_for(web, tmp_path, revisit_after=D, per_host=2))
        engine.add_seeds([web.seed_url, local.url("/")])
        runner = threading.Thread(target=engine.run)
        runner.start()
        time.sleep(9.0)  # static pages: fetched at about 0, 1, 3 and 7 s
        engine.stop()
        runner.join(60)
        assert not runner.is_alive()
        hits = [h for h in local.hits if h.path == "/"]
    recs = records(tmp_path)
    pages = starts(web)
    assert set(pages) == {u for u, r in recs.items() if r.status and "127.0.0.1" not in u}
    for url, times in pages.items():
        assert len(times) >= 3, (url, times)  # two revisits at least
        for i in range(1, len(times)):
            assert times[i] - times[i - 1] >= unchanged(i) - EPS, (url, i, times)
        assert recs[url].revisit_interval == unchanged(len(times))
        statuses = [r.status for r in web.log.records() if r.url == url]
        if statuses[0] == 200:  # a page: the 304s kept it
            assert set(statuses[1:]) == {304} and recs[url].revisit == "not_modified"
        else:  # a redirect, a 404: the same answer again
            assert set(statuses) == {statuses[0]}, (url, statuses)
    robots_decided = [r for r in recs.values() if r.reason == "robots_disallowed"]
    assert robots_decided and all(r.revisit_interval > D for r in robots_decided)
    assert len(hits) > max(len(t) for t in pages.values()) + 3  # the changing page: sooner
    for i in range(1, len(hits)):
        assert hits[i].start - hits[i - 1].start >= changing(i) - EPS, (i, hits)
    home = recs[local.url("/")]
    assert home.revisit_interval == changing(len(hits)) and home.revisit == ""
    snap = status_json(tmp_path)
    assert snap["revisits"] >= sum(len(t) - 1 for t in pages.values()) + len(hits) - 1
    assert 1 <= snap["revisits_waiting"] <= len(recs)
    shown = run_cli([sys.executable, "-m", "crawler", "status", str(tmp_path)])
    assert shown.returncode == 0, shown.stderr
    assert (
        f"  revisits (last run): {snap['revisits']} pages re-queued as due, "
        f"{snap['revisits_waiting']} waiting for their time\n"
    ) in shown.stdout


def test_a_killed_revisiting_crawl_resumes_on_time(make_testweb: MakeWeb, tmp_path: Path) -> None:
    """The due times survive a kill -9 (due.bin): the resumed crawl fetches no page
    before its time, and does come back to them."""
    d = 2.0
    web = make_testweb(pages=3, hosts=1, seed=4, crawl_delay=0.0)
    args = cli_args(web, tmp_path, "--revisit-after", f"{d:g}s", "--per-host", "2",
                    "--processes", "1", "--sync-interval", "0.2")
    proc = start_cli(args)
    try:
        wait_for(lambda: len(starts(web)[web.seed_url]) >= 2, proc, "a revisit", timeout=60)
        time.sleep(0.5)
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=30)
    before = {u: list(t) for u, t in starts(web).items()}
    proc = start_cli(args)  # the saved settings: --revisit-after again
    try:
        wait_for(lambda: len(starts(web)[web.seed_url]) > len(before[web.seed_url]), proc,
                 "a revisit after the restart", timeout=60)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130  # stopped by Ctrl-C (docs/CLI.md)
    # A fetch still open (or not yet committed) at the kill is made again at once: that
    # is what a kill costs. Every other gap keeps the rule, across the kill too.
    open_at_kill = {(r.url, r.start) for r in web.log.records()
                    if r.end is None or r.end > killed_at - 0.3}
    for url, times in starts(web).items():
        fetches = 0  # completed fetches before this request: the interval it waits out
        for i in range(1, len(times)):
            if (url, times[i - 1]) in open_at_kill and times[i - 1] <= killed_at:
                continue
            fetches += 1
            want = min(d * 2 ** (fetches - 1), d * MAX_FACTOR)
            assert times[i] - times[i - 1] >= want - EPS, (url, i, times)
    assert len(starts(web)[web.seed_url]) > len(before[web.seed_url])
