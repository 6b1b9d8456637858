"""Sharded crawls (--processes N): the oracle, the layout, kills of shards and supervisor, reads."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import (
    META_PATHS,
    REPO,
    cli_args,
    fetched_urls,
    page_refetches,
    records,
    run_crawl,
    shard_paths,
    start_cli,
)

import kvstore
from crawler.cli import main
from crawler.run import pagelimit
from crawler.run.pagelimit import SharedPageLimit
from crawler.state.shards import SHARDS_NAME, owner, read_count
from crawler.web.urls import host_of
from tools.rayenv import alive
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
THREADS = 8


def crawl(web: TestWeb, data: Path, processes: int, *extra: str, timeout: float = 180) -> str:
    """Run ``crawler start`` to its end; its stdout."""
    done = subprocess.run(
        cli_args(web, data, "--processes", str(processes), *extra),
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def summary(stdout: str) -> dict[str, object]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("crawl "))
    return dict(json.loads(line.split(": ", 1)[1]))


def assert_owned(data: Path, count: int) -> None:
    """Every record lives in the shard that owns its host."""
    for i, shard in enumerate(shard_paths(data)):
        with kvstore.open(shard / "main", readonly=True) as main_db:
            from crawler.state.pages import decode_page

            for key in main_db:
                url = decode_page(main_db[key], with_body=False).url
                assert owner(host_of(url), count) == i, (url, i)


@pytest.mark.parametrize("processes", [2, 3])
def test_sharded_crawl_matches_the_oracle_once_and_politely(
    make_testweb: MakeWeb, tmp_path: Path, processes: int
) -> None:
    web = make_testweb(pages=600, hosts=7, seed=3, crawl_delay=0.02)
    want = web.oracle.crawl()
    data = tmp_path / "c"
    out = crawl(web, data, processes, "--per-host", "1", "--delay", "0.01")
    got = summary(out)
    assert got["complete"] is True and got["shards"] == processes
    assert fetched_urls(data) == set(want.fetched)
    assert web.log.urls() == set(want.requests)
    assert not web.log.duplicates()  # each page (and robots.txt) requested once
    recs = records(data)
    assert {u for u, r in recs.items() if r.reason == "robots_disallowed"} == set(want.blocked)
    assert_owned(data, processes)
    assert len({owner(h, processes) for h in web.log.hosts()}) == processes  # all did work
    for host in web.log.hosts():  # one owner per host: its politeness is exact
        assert web.log.max_concurrency(host) <= 1, host
        delay = max(0.01, want.crawl_delay.get(host, 0.0))
        assert all(g >= delay - 0.01 for g in web.log.gaps(host)), host


# What the supervisor must not load: it lives as long as the crawl, and these are
# ~30 MB resident that only the shards use.
SHARD_ONLY = ("numpy", "lxml", "kvstore", "requests", "urllib3", "dns")


@pytest.mark.parametrize(("hosts", "processes", "limit"), [(1, 3, 20), (6, 2, 30)])
def test_max_pages_is_one_count_for_all_the_shards(
    make_testweb: MakeWeb, tmp_path: Path, hosts: int, processes: int, limit: int
) -> None:
    """--max-pages N fetches N pages whichever shards have the work: a site of one host
    is one shard's (its even share was 7 of 20), hosts of several shards share the
    count; the next run counts afresh and the crawl then ends as the oracle's."""
    web = make_testweb(pages=120, hosts=hosts, seed=8, crawl_delay=0.0)
    data = tmp_path / "c"
    out = crawl(web, data, processes, "--max-pages", str(limit))
    assert out.startswith("crawl stopped (limit reached): ")
    assert summary(out)["fetched"] == limit
    pages = [r.url for r in web.log.records() if r.path not in META_PATHS]
    assert len(pages) == limit and len(fetched_urls(data)) == limit
    assert int.from_bytes((data / "pages.count").read_bytes(), "little") == limit
    again = crawl(web, data, processes, "--max-pages", "5")
    assert summary(again)["fetched"] == 5  # this run's count, from zero
    crawl(web, data, processes)
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)
    assert page_refetches(web) == {}


def test_a_shared_page_count_never_passes_its_limit_across_processes(tmp_path: Path) -> None:
    """Four processes reserving at once (from the same moment) from one count of
    30,000, 20,000 tries each: exactly 30,000 granted, and the count says so."""
    path = str(tmp_path / "pages.count")
    pagelimit.create(path)
    code = ("import sys, time; from crawler.run.pagelimit import SharedPageLimit; "
            "c = SharedPageLimit(sys.argv[1], 30000); t = float(sys.argv[2]); "
            "time.sleep(max(0.0, t - time.time())); "
            "print(sum(c.reserve() for _ in range(20000)))")
    at = str(time.time() + 2.0)  # they start together, once all are up
    procs = [subprocess.Popen([sys.executable, "-c", code, path, at], cwd=REPO, text=True,
                              stdout=subprocess.PIPE) for _ in range(4)]
    granted = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert sum(granted) == 30000 and all(0 <= g <= 20000 for g in granted)
    assert SharedPageLimit(path, 30000).count() == 30000


def test_the_supervisor_process_loads_no_shard_library(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=80, hosts=3, seed=5, crawl_delay=0.0)
    want = web.oracle.crawl()
    data = tmp_path / "c"
    report = (f"import sys; from crawler.cli import main; rc = main(sys.argv[1:]); "
              f"print('loaded:', [m for m in {SHARD_ONLY!r} if m in sys.modules]); "
              f"raise SystemExit(rc)")
    command = cli_args(web, data, "--processes", "2")
    assert command[1:3] == ["-m", "crawler"]
    done = subprocess.run(
        [command[0], "-c", report, *command[3:]], cwd=REPO, capture_output=True, text=True,
        timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(done.stdout)["complete"] is True
    assert fetched_urls(data) == set(want.fetched)
    assert "loaded: []" in done.stdout.splitlines(), done.stdout[-500:]


def test_the_shard_count_is_recorded_and_another_is_refused(
    make_testweb: MakeWeb, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = make_testweb(pages=60, hosts=3, seed=0, crawl_delay=0.0)
    data = tmp_path / "c"
    crawl(web, data, 2)
    assert json.loads((data / SHARDS_NAME).read_text()) == {"format": 1, "shards": 2}
    assert sorted(p.name for p in data.glob("shard-*")) == ["shard-00", "shard-01"]
    assert not (data / "main").exists()
    n = len(web.log.records())
    capsys.readouterr()
    assert main(["start", "--data", str(data), "--processes", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 shard(s)" in err[0] and "--processes 2" in err[0], err
    # without --processes, a resume keeps the recorded count: nothing is left to fetch
    again = summary(crawl(web, data, 2))
    assert again["complete"] is True
    assert [r for r in web.log.records()[n:] if not r.target.endswith("/robots.txt")] == []


def test_a_crawl_from_before_shards_opens_as_one_shard(
    make_testweb: MakeWeb, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = make_testweb(pages=120, hosts=3, seed=1, crawl_delay=0.0)
    data = tmp_path / "old"
    engine = run_crawl(web, data, max_pages=40)  # the in-process engine: DIR/main, no shards.json
    assert not engine.complete and not (data / SHARDS_NAME).exists()
    assert read_count(str(data)) == 1
    assert main(["start", "--data", str(data), "--processes", "2"]) == 2
    assert "1 shard(s)" in capsys.readouterr().err
    done = subprocess.run(  # no --processes: it resumes as it is, in place
        [a for a in cli_args(web, data) if a not in ("--processes", "1")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "shards" not in summary(done.stdout)  # the one-process path
    assert json.loads((data / SHARDS_NAME).read_text())["shards"] == 1
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)
    assert not {u for u in web.log.duplicates() if not u.endswith("/robots.txt")}


def test_status_pages_show_and_export_read_every_shard(
    make_testweb: MakeWeb, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = make_testweb(pages=150, hosts=5, seed=2, crawl_delay=0.0)
    data = tmp_path / "c"
    got = summary(crawl(web, data, 3))
    recs = records(data)
    capsys.readouterr()
    assert main(["status", str(data), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["shards"] == 3 and info["running"] is False
    assert info["recorded"] == len(recs) and info["pending_bulks"] == info["pending"] == 0
    assert info["last_status"]["fetched"] == got["fetched"]
    assert [s["recorded"] for s in info["per_shard"]] == [
        sum(1 for u in recs if owner(host_of(u), 3) == i) for i in range(3)
    ]
    assert main(["status", str(data), "--shards"]) == 0
    text = capsys.readouterr().out
    assert "(3 shards)" in text and all(f"shard {i} " in text for i in range(3))
    assert main(["pages", str(data)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(ln.split("\t")[3] for ln in lines) == sorted(recs)
    for url in recs:  # show finds each URL in its owner's shard
        if recs[url].status == 200:
            assert main(["show", str(data), url]) == 0
            assert f"url:          {url}" in capsys.readouterr().out
    out = tmp_path / "c.jsonl"
    assert main(["export", str(data), "--jsonl", str(out), "--quiet"]) == 0
    exported = [json.loads(ln)["url"] for ln in out.read_text().splitlines()]
    assert sorted(exported) == sorted(recs)


# -- kills ---------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def shard_index(pid: int) -> int | None:
    """Which shard a shard process is (its command line says ``shard-NN``); None before
    its exec or after its end."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode().split("\0")
    except OSError:
        return None
    return next((int(a[6:]) for a in args if a.startswith("shard-")), None)


def shards_up(sup: int, count: int) -> bool:
    pids = children(sup)
    return len(pids) == count and all(shard_index(p) is not None for p in pids)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.02)


def answered(web: TestWeb) -> int:
    return sum(1 for r in web.log.records(done=True) if not r.target.endswith("/robots.txt"))


def kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.communicate()


def launch(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``start_cli`` with stderr appended to ``log`` (shards log there too: a pipe
    nobody reads could fill up and stall them)."""
    with open(log, "ab") as err:
        return subprocess.Popen(args, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                                stdout=subprocess.PIPE, stderr=err)


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def environment(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [kv.partition("=") for kv in f.read().decode().split("\0") if kv]
    return {k: v for k, _, v in pairs}


@pytest.mark.parametrize("given", [None, "8"])
def test_shards_run_with_two_malloc_arenas_unless_the_user_set_it(
    make_testweb: MakeWeb, tmp_path: Path, given: str | None
) -> None:
    web = make_testweb(pages=40, hosts=2, seed=6, crawl_delay=0.0)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MALLOC_ARENA_MAX", None)
    if given is not None:
        env["MALLOC_ARENA_MAX"] = given
    # a revisiting crawl runs until stopped: its shards are there to be looked at
    args = cli_args(web, tmp_path / "c", "--processes", "2", "--revisit-after", "1h")
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        wait_until(lambda: shards_up(proc.pid, 2), "shards up")
        arenas = [environment(pid).get("MALLOC_ARENA_MAX") for pid in children(proc.pid)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert arenas == [given or "2"] * 2


# (kill time, all killed processes gone, shards hit, a moment when no replacement had
# fetched yet: a request the server logged before it was the killed ones', however late
# the server read it)
Kill = tuple[float, float, set[int], float]


def kill_loop(
    web: TestWeb, args: list[str], log: Path, count: int, kills: list[Kill],
    every_shard: set[int], rng: random.Random, times: int,
) -> None:
    """Start the crawl and kill -9 a shard or the supervisor, alternately, ``times`` times,
    each after a random amount of progress."""
    proc = launch(args, log)
    try:
        while len(kills) < times:
            sup = proc.pid
            wait_until(lambda s=sup: shards_up(s, count), "shards up")
            shards = children(sup)
            every_shard.update(shards)
            index_of = {p: shard_index(p) for p in shards}
            target = answered(web) + rng.randint(40, 300)
            wait_until(lambda n=target, p=proc: answered(web) >= n or p.poll() is not None,
                       "progress")
            assert proc.poll() is None, f"the crawl ended before the kills:\n{tail(log)}"
            if len(kills) % 2 == 0:  # a shard: the supervisor starts it again
                victim = rng.choice(shards)
                t = time.time()
                os.kill(victim, signal.SIGKILL)
                wait_until(lambda v=victim: not alive(v), "the shard's death")
                gone = time.time()
                # the replacement seen within a poll of its exec, long before it can fetch
                # (its imports alone take a few tenths of a second)
                wait_until(lambda v=victim, s=sup: v not in children(s) and shards_up(s, count),
                           "the shard's restart")
                kills.append((t, gone, {index_of[victim] or 0}, time.time()))
            else:  # the supervisor: its shards notice and exit on their own
                t = time.time()
                kill_and_reap(proc)
                wait_until(lambda ps=shards: not any(alive(p) for p in ps), "orphans exiting",
                           20.0)
                gone = time.time()
                kills.append((t, gone, set(range(count)), gone))  # relaunched after this
                if len(kills) < times:
                    proc = launch(args, log)
    finally:
        if proc.poll() is None:  # a failed wait: leave nothing running
            kill_and_reap(proc)


@pytest.mark.slow
def test_kill9_of_shards_and_supervisor_loses_nothing(
    make_testweb: MakeWeb, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = make_testweb(pages=5000, hosts=8, seed=8, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    args = cli_args(web, data, "--processes", "2", "--threads", str(THREADS))
    count = 2
    kills: list[Kill] = []
    every_shard: set[int] = set()
    log = tmp_path / "crawl.log"
    first = subprocess.run([*args, "--max-pages", "20"], cwd=REPO, capture_output=True,
                           timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert first.returncode == 0 and b"crawl stopped (limit reached)" in first.stdout
    kill_loop(web, args, log, count, kills, every_shard, random.Random(5), 6)  # last: supervisor
    wait_until(lambda: not any(alive(p) for p in every_shard), "orphans exiting", 20.0)
    capsys.readouterr()  # a killed crawl says so (an earlier run's clean end is forgotten)
    assert main(["status", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"].startswith("killed or crashed")
    final = launch(args, log)
    final_out, _ = final.communicate(timeout=300)
    assert final.returncode == 0, tail(log)
    assert summary(final_out.decode())["complete"] is True
    assert fetched_urls(data) == want
    assert not any(alive(p) for p in every_shard)
    # Each refetch is of a URL its killed owner had in flight: requested before a kill
    # of its shard (or the supervisor) and not committed by the time that shard was gone.
    by_url: dict[str, list[tuple[float, float | None]]] = {}
    hosts: dict[str, str] = {}
    for r in web.log.records():
        if not r.target.endswith("/robots.txt"):
            url = f"{r.host}{r.target}"
            by_url.setdefault(url, []).append((r.start, r.end))
            hosts[url] = r.host
    per_kill: Counter[int] = Counter()
    for url, reqs in by_url.items():
        reqs.sort()
        for (start, _end), (next_start, _) in zip(reqs, reqs[1:], strict=False):
            shard = owner(hosts[url], count)
            # the earlier request was the killed incarnation's: the server logged it
            # before any replacement could fetch (a request sent just before the kill
            # can be read by a busy server after the process is gone)
            cause = [i for i, (t, _gone, affected, back) in enumerate(kills)
                     if shard in affected and start <= back and t <= next_start]
            assert cause, (url, reqs, kills)
            per_kill[cause[0]] += 1
    for i, (t, _gone, affected, back) in enumerate(kills):
        open_then = sum(  # fetches of the affected shards' hosts open during the kill
            1 for r in web.log.records()  # (read by the server before a replacement ran)
            if not r.target.endswith("/robots.txt") and owner(r.host, count) in affected
            and r.start <= back and (r.end is None or r.end >= t)
        )
        # the committer holds at most a thread count of finished outcomes (frontier)
        assert per_kill[i] <= open_then + THREADS, (i, per_kill[i], open_then)
    print("refetches per kill:", [per_kill[i] for i in range(len(kills))],
          "seconds to exit:", [round(gone - t, 2) for t, gone, _, _ in kills])


def test_sigint_stops_every_shard_cleanly_and_resume_refetches_nothing(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=800, hosts=6, seed=9, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    args = cli_args(web, data, "--processes", "2", "--threads", str(THREADS),
                    "--per-host", "1")
    proc = start_cli(args)
    wait_until(lambda: answered(web) >= 80, "80 answered requests")
    shards = children(proc.pid)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err.decode()[-2000:]
    assert b"crawl interrupted" in out
    assert not any(alive(p) for p in shards)
    before = len(fetched_urls(data))
    assert 0 < before < len(want)
    final = start_cli(args)
    out, err = final.communicate(timeout=120)
    assert final.returncode == 0, err.decode()[-2000:]
    assert fetched_urls(data) == want
    pages = Counter(f"{r.host}{r.target}" for r in web.log.records()
                    if not r.target.endswith("/robots.txt"))
    assert [u for u, n in pages.items() if n > 1] == []


def test_a_second_supervisor_on_the_same_directory_is_refused(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=400, hosts=4, seed=4, crawl_delay=0.0)
    data = tmp_path / "c"
    args = cli_args(web, data, "--processes", "2", "--per-host", "1", "--delay", "0.05")
    first = start_cli(args)
    try:
        wait_until(lambda: answered(web) >= 5, "a running crawl")
        second = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert second.returncode == 1
        assert f"a crawl is running on it (pid {first.pid})" in second.stderr  # status.json
        (data / "status.json").unlink()  # as for a start racing the first one's first write:
        third = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert third.returncode == 1
        assert "another crawl is running" in third.stderr  # the supervisor's lock
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM


_BARRIER: Any = None  # a pool worker's: every worker opens its directory together


def _set_barrier(barrier: Any) -> None:
    global _BARRIER
    _BARRIER = barrier


def _open_layout(data: str) -> int:  # in a pool's worker process
    from crawler.state.shards import open_layout

    _BARRIER.wait(60)
    return open_layout(data, 4)


def test_shards_of_one_node_create_its_layout_at_once_and_none_fails(tmp_path: Path) -> None:
    """Ray actors on a node that has no shards.json yet each write it at start (several
    shards on one node: at the same moment). Each writer has its own temporary file: with
    one shared name, a rename found it already renamed away and the shard failed."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    workers = 4
    dirs = [str(tmp_path / f"c{i}") for i in range(20)]
    tasks = [d for d in dirs for _ in range(workers)]  # every worker on each new directory
    with ctx.Pool(workers, _set_barrier, (ctx.Barrier(workers),)) as pool:
        assert pool.map(_open_layout, tasks, chunksize=1) == [4] * len(tasks)
    assert all(read_count(d) == 4 for d in dirs)
    assert not [n for d in dirs for n in os.listdir(d) if n.endswith(".tmp")]


@pytest.mark.parametrize("per_shard, down", [
    ([{"shard": 0, "up": True}, {"shard": 1, "up": False}], [1]),
    ([{"shard": 0}, {"shard": 1}], []),  # a run from before "up": none said down
    (7, []),  # damaged: nothing said, no traceback
])
def test_status_names_the_shards_a_running_crawl_has_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], per_shard: object, down: list[int],
) -> None:
    """The running supervisor's or Ray driver's status.json says which shards did not
    answer its last round (a lost Ray node's): status lists them."""
    (tmp_path / SHARDS_NAME).write_text('{"format": 1, "shards": 2}\n')
    for i in range(2):
        (tmp_path / f"shard-{i:02d}").mkdir()
    (tmp_path / "status.json").write_text(json.dumps(
        {"running": True, "pid": os.getpid(), "time": time.time(), "fetched": 0,
         "per_shard": per_shard}))
    assert main(["status", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shards_down"] == down
    assert main(["status", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert ("  shards down: 1 (" in text) == bool(down), text
