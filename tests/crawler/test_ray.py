"""Crawls on Ray (--ray): shard actors on a real local cluster, kills of actors and driver."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from crawl_helpers import REPO, cli_args, fetched_urls, records, status_json
from test_shards import alive, answered, assert_owned, summary, tail, wait_until

from crawler.cli import main
from crawler.state.shards import owner
from crawler.web.urls import host_of
from tools.rayenv import new_token, ray_env, stop_cluster
from tools.testweb import TestWeb

pytest.importorskip("ray", reason="the [ray] extra is not installed")  # CI installs it

MakeWeb = Callable[..., TestWeb]
THREADS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_head() -> Iterator[tuple[str, dict[str, str]]]:
    """A head-only Ray cluster on this machine: (its address, the env to reach it)."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    token = new_token()
    env = ray_env(token)
    temp = tempfile.mkdtemp(prefix="kvray-", dir="/tmp")  # short: Ray's socket paths
    port = _free_port()
    started = subprocess.run(
        [ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2",
         "--disable-usage-stats", "--include-dashboard=false",
         f"--object-store-memory={100 << 20}", f"--temp-dir={temp}"],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield f"127.0.0.1:{port}", env
    finally:
        stop_cluster(token)
        shutil.rmtree(temp, ignore_errors=True)


def ray_args(web: TestWeb, data: Path, address: str, shards: int, *extra: str) -> list[str]:
    base = [a for a in cli_args(web, data) if a not in ("--processes", "1")]
    return [*base, "--ray", address, "--shards", str(shards), *extra]


def launch(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as err:  # the actors log there too, through the driver
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err)


@pytest.mark.slow
@pytest.mark.parametrize("shards, cluster", [(2, "head"), (3, "head"), (2, "local")])
def test_a_crawl_on_ray_matches_the_oracle_once_and_politely(
    make_testweb: MakeWeb, tmp_path: Path, ray_head: tuple[str, dict[str, str]],
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    shards: int, cluster: str,
) -> None:
    web = make_testweb(pages=500, hosts=7, seed=3, crawl_delay=0.02)
    want = web.oracle.crawl()
    data = tmp_path / "c"
    head, env = ray_head
    address = head if cluster == "head" else "local"  # local: a private cluster of its own
    done = subprocess.run(
        ray_args(web, data, address, shards, "--per-host", "1", "--delay", "0.01"),
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = summary(done.stdout)
    assert got["complete"] is True and got["shards"] == shards and got["ray"] == address
    assert fetched_urls(data) == set(want.fetched)
    assert web.log.urls() == set(want.requests)
    assert not web.log.duplicates()  # each page (and robots.txt) requested once
    assert_owned(data, shards)
    assert len({owner(h, shards) for h in web.log.hosts()}) == shards  # every actor worked
    for host in web.log.hosts():  # one owner per host: its politeness is exact
        assert web.log.max_concurrency(host) <= 1, host
        delay = max(0.01, want.crawl_delay.get(host, 0.0))
        assert all(g >= delay - 0.01 for g in web.log.gaps(host)), host
    # every shard on the one node there is, recorded for the next run
    assert json.loads((data / "ray.json").read_text())["nodes"] == ["127.0.0.1"] * shards
    # the final status.json keeps each shard's last exchange counts: every link handed
    # to another shard was taken by it (not only those of the last status written). At
    # least once: a batch whose answer was lost under load is sent again and counted
    # again where it arrives (the owner's admission dedups it), so received >= sent.
    final = status_json(data)["per_shard"]
    sent = sum(s["sent_urls"] for s in final)
    assert sum(s["received_urls"] for s in final) >= sent and (sent > 0) == (shards > 1)
    capsys.readouterr()
    assert main(["status", str(data), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["shards"] == shards and info["running"] is False
    recs = records(data)
    assert info["recorded"] == len(recs) and info["pending"] == 0 and info["absent_shards"] == []
    # On a node that holds only some shards, readers say which are absent and read the rest
    (data / "shard-01").rename(tmp_path / "elsewhere")
    assert main(["status", str(data), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    here = {u for u in recs if owner(host_of(u), shards) != 1}
    assert info["absent_shards"] == [1] and info["recorded"] == len(here)
    assert main(["pages", str(data)]) == 0
    assert {ln.split("\t")[3] for ln in capsys.readouterr().out.splitlines()} == here
    assert f"1 of {shards} shards are not on this machine (no shard-01)" in caplog.text


# The exchange's contract, against a real actor: send returns only after the owner's
# admit returned (durable there), and every failure is an ExchangeError the sender keeps
# its batch for. Run as a driver of its own (Ray's settings are read at import).
EXCHANGE_PROBE = r"""
import json, sys, time
import ray
from crawler.exceptions import ExchangeError
from crawler.net.raycluster import NAMESPACE
from crawler.run.rayshard import RayExchange

ray.init(address=sys.argv[1], namespace=NAMESPACE, configure_logging=False)

@ray.remote(max_concurrency=4)
class Inbox:
    def __init__(self):
        self.got = []
    def admit(self, payload):
        time.sleep(0.3)  # a slow fsync
        if payload == b"refuse":
            raise RuntimeError("the committer did not write the batch in time")
        self.got.append((payload, time.time()))
    def received(self):
        return self.got

inbox = Inbox.options(name="probe-run-00").remote()
ray.get(inbox.received.remote())
ex = RayExchange(["probe-run-00", "probe-run-01"], timeout=5)
out = {}
ex.send(0, b"one")
returned = time.time()
got = ray.get(inbox.received.remote())
out["admitted"] = [p.decode() for p, _ in got]
out["durable_before_return"] = all(t <= returned for _, t in got)
def failure(dest, payload):
    try:
        ex.send(dest, payload)
    except ExchangeError as exc:
        return str(exc)
    return None
out["refused"] = failure(0, b"refuse")
out["no_actor"] = failure(1, b"two")
ray.kill(inbox, no_restart=True)
time.sleep(0.5)
out["dead"] = failure(0, b"three")
print(json.dumps(out))
"""


def test_send_returns_once_the_owner_admitted_and_failures_are_exchange_errors(
    ray_head: tuple[str, dict[str, str]],
) -> None:
    address, env = ray_head
    done = subprocess.run([sys.executable, "-c", EXCHANGE_PROBE, address], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["admitted"] == ["one"] and out["durable_before_return"] is True
    assert out["refused"] and out["refused"].startswith("shard 0: ")
    assert out["no_actor"] and "no actor probe-run-01" in out["no_actor"]
    assert out["dead"] and out["dead"].startswith("shard 0: ")


def shard_pids(data: Path, count: int) -> dict[int, int]:
    """The worker pid of each shard actor, from the driver's status.json (absent until
    every shard answered once)."""
    try:
        snap = status_json(data)
    except (AssertionError, ValueError):
        return {}
    pids = {s["shard"]: s.get("pid") for s in snap.get("per_shard", [])}
    return {i: p for i, p in pids.items() if p} if len(pids) == count else {}


def refetches_by_shard(web: TestWeb, count: int) -> dict[int, int]:
    urls: dict[str, int] = {}
    for r in web.log.records():
        if not r.target.endswith("/robots.txt"):
            key = f"{r.host}{r.target}"
            urls[key] = urls.get(key, 0) + 1
    out: dict[int, int] = {}
    for key, n in urls.items():
        if n > 1:
            shard = owner(key.split("/", 1)[0].rsplit(":", 1)[0], count)
            out[shard] = out.get(shard, 0) + n - 1
    return out


def open_during(web: TestWeb, shards: set[int], count: int, t0: float, t1: float) -> int:
    """Fetches of those shards' hosts open at some moment in [t0, t1]."""
    return sum(
        1 for r in web.log.records()
        if not r.target.endswith("/robots.txt") and owner(r.host, count) in shards
        and r.start <= t1 and (r.end is None or r.end >= t0)
    )


@pytest.mark.slow
def test_kill9_of_actors_ray_restarts_them_and_nothing_is_lost(
    make_testweb: MakeWeb, tmp_path: Path, ray_head: tuple[str, dict[str, str]]
) -> None:
    web = make_testweb(pages=3000, hosts=6, seed=8, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data, log = tmp_path / "c", tmp_path / "crawl.log"
    address, env = ray_head
    count = 2
    proc = launch(ray_args(web, data, address, count, "--threads", str(THREADS),
                           "--status-interval", "0.2"), env, log)
    kills: list[tuple[int, float, float]] = []  # (shard, kill instant, its death seen)
    try:
        for shard in (0, 1):
            wait_until(lambda: len(shard_pids(data, count)) == count, "every actor up", 120)
            pid = shard_pids(data, count)[shard]
            target = answered(web) + 150
            wait_until(lambda n=target: answered(web) >= n or proc.poll() is not None,
                       "progress", 120)
            assert proc.poll() is None, f"the crawl ended before the kills:\n{tail(log)}"
            t = time.time()
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda p=pid: not alive(p), "the actor's death")
            kills.append((shard, t, time.time()))
            # Ray starts it again: a new worker process answers for that shard
            wait_until(lambda s=shard, p=pid: shard_pids(data, count).get(s) not in (None, p),
                       "the actor's restart", 120)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, tail(log)
    assert summary(out.decode())["complete"] is True
    assert fetched_urls(data) == want
    assert "was restarted by Ray" in log.read_text()
    # A refetch is of a URL the killed actor had in flight; bounded per shard by its
    # fetches open while it died plus the committer's bound (the thread count).
    refetched = refetches_by_shard(web, count)
    for shard in range(count):
        bound = sum(open_during(web, {s}, count, t, gone) + THREADS
                    for s, t, gone in kills if s == shard)
        assert refetched.get(shard, 0) <= bound, (shard, refetched, kills)
    print("refetches by shard:", refetched)


@pytest.mark.slow
def test_the_driver_killed_takes_its_actors_and_a_restart_resumes(
    make_testweb: MakeWeb, tmp_path: Path, ray_head: tuple[str, dict[str, str]]
) -> None:
    web = make_testweb(pages=2000, hosts=6, seed=4, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data, log = tmp_path / "c", tmp_path / "crawl.log"
    address, env = ray_head
    count = 2
    args = ray_args(web, data, address, count, "--threads", str(THREADS),
                    "--status-interval", "0.2")
    proc = launch(args, env, log)
    try:
        wait_until(lambda: len(shard_pids(data, count)) == count, "every actor up", 120)
        actors = set(shard_pids(data, count).values())
        target = answered(web) + 200
        wait_until(lambda: answered(web) >= target or proc.poll() is not None, "progress", 120)
        assert proc.poll() is None, f"the crawl ended before the kill:\n{tail(log)}"
        t = time.time()
        proc.kill()
        proc.communicate()
        # the actors are the driver's: Ray ends them with it
        wait_until(lambda: not any(alive(p) for p in actors), "the actors' end", 60)
        gone = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    before = len(fetched_urls(data))
    assert 0 < before < len(want)
    again = launch(args, env, log)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, tail(log)
    assert summary(out.decode())["complete"] is True
    assert fetched_urls(data) == want
    refetched = sum(refetches_by_shard(web, count).values())
    assert refetched <= open_during(web, set(range(count)), count, t, gone) + count * THREADS


def test_a_shard_that_cannot_open_its_directory_fails_the_crawl_and_is_not_restarted(
    testweb: TestWeb, tmp_path: Path, ray_head: tuple[str, dict[str, str]]
) -> None:
    data = tmp_path / "c"
    data.mkdir()
    (data / "shards.json").write_text('{"format": 1, "shards": 2}\n')
    (data / "shard-01").write_text("a file where the shard's directory goes\n")
    address, env = ray_head
    done = subprocess.run(ray_args(testweb, data, address, 2), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("crawler: error: shard 1: "), done.stderr[-3000:]
    assert "was restarted by Ray" not in done.stderr
    assert status_json(data)["running"] is False


def test_one_shard_on_ray_crawls_the_site_with_nothing_to_exchange(
    make_testweb: MakeWeb, tmp_path: Path, ray_head: tuple[str, dict[str, str]]
) -> None:
    # --shards 1: its one actor has no other shard to send links to (it crashed in its
    # constructor, and the driver created it again forever, before)
    web = make_testweb(pages=150, hosts=3, seed=4, crawl_delay=0.02)
    want = web.oracle.crawl()
    data = tmp_path / "c"
    address, env = ray_head
    done = subprocess.run(ray_args(web, data, address, 1, "--per-host", "1"), cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = summary(done.stdout)
    assert got["complete"] is True and got["shards"] == 1
    assert fetched_urls(data) == set(want.fetched)
    assert not web.log.duplicates()
    assert json.loads((data / "ray.json").read_text())["nodes"] == ["127.0.0.1"]
    assert "created again" not in done.stderr and "restarted" not in done.stderr


def test_a_shard_that_ran_is_never_started_empty_where_its_directory_is_missing(
    make_testweb: MakeWeb, tmp_path: Path, ray_head: tuple[str, dict[str, str]]
) -> None:
    # as after a reshard or a move-shard whose copy was forgotten on the shard's node
    web = make_testweb(pages=300, hosts=6, seed=9, crawl_delay=0.0)
    data = tmp_path / "c"
    address, env = ray_head
    first = subprocess.run(ray_args(web, data, address, 2, "--max-pages", "40"), cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((data / "ray.json").read_text())["started"] == [True, True]
    shutil.move(data / "shard-01", tmp_path / "elsewhere")
    again = subprocess.run(ray_args(web, data, address, 2), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=240)
    assert again.returncode == 1, again.stderr[-3000:]
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("crawler: error: shard 1: ") and "is not on this node" in last, last
    assert not (data / "shard-01").exists()  # not made empty
    shutil.move(tmp_path / "elsewhere", data / "shard-01")  # the copy made: it resumes
    done = subprocess.run(ray_args(web, data, address, 2), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(done.stdout)["complete"] is True
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)


# A driver whose actor class fails in its constructor with a bug (not a bad directory,
# which the actor reports itself): Ray lets go of it on a node that is alive.
BROKEN_ACTOR = r"""
import sys
from crawler.cli import main
from crawler.run import raydriver

class Broken(raydriver.ShardActor):  # defined in __main__: Ray ships it by value
    def __init__(self, *args, **kwargs):
        raise RuntimeError("a bug in the shard's start")

raydriver.ShardActor = Broken
sys.exit(main(sys.argv[1:]))
"""


def test_an_actor_that_fails_for_good_on_a_live_node_ends_the_crawl(
    testweb: TestWeb, tmp_path: Path, ray_head: tuple[str, dict[str, str]]
) -> None:
    data = tmp_path / "c"
    address, env = ray_head
    argv = ray_args(testweb, data, address, 2)[3:]  # after python -m crawler
    done = subprocess.run([sys.executable, "-c", BROKEN_ACTOR, *argv], cwd=REPO,
                          env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("crawler: error: shard ") and "failed for good" in last, last
    assert "created again" not in done.stderr
    assert status_json(data)["running"] is False


def test_ray_options_are_checked_before_anything_is_written(
    testweb: TestWeb, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "c"
    seed = testweb.seed_url
    cases: list[tuple[list[str], str]] = [
        (["--shards", "2"], "--shards goes with --ray"),
        (["--ray", "local", "--processes", "2"], "with --ray use --shards"),
        (["--ray", f"127.0.0.1:{_free_port()}"], "nothing answers there"),
    ]
    for extra, words in cases:
        capsys.readouterr()
        code = main(["start", seed, "--data", str(data), *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(err) == 1 and words in err[0], (extra, err)
        assert not data.exists(), extra
    # Without Ray installed: what to install, in one line
    hide_ray = ("import sys; sys.modules['ray'] = None; from crawler.cli import main; "
                f"sys.exit(main(['start', {seed!r}, '--data', {str(data)!r}, '--ray', 'auto']))")
    done = subprocess.run([sys.executable, "-c", hide_ray], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    err_lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(err_lines) == 1, done.stderr
    assert "pip install 'kvcrawl[ray]'" in err_lines[0]
    assert not data.exists()


def test_a_shard_is_logged_down_at_once_when_lost_and_not_while_its_actor_starts() -> None:
    from crawler.run.raydriver import WAIT_LOG_EVERY, _RayShard

    s = _RayShard(0)
    assert not s.is_down(0.0)  # its actor has not answered yet: starting, not down
    assert not s.is_down(WAIT_LOG_EVERY - 1)
    assert s.is_down(WAIT_LOG_EVERY)  # silent that long: said
    s.is_up(WAIT_LOG_EVERY)
    assert s.new_incarnation("one")
    assert s.is_down(100.0)  # up, then lost (a node's power cut): said at once
    assert not s.is_down(101.0)
    assert s.is_down(100.0 + WAIT_LOG_EVERY)  # and again every WAIT_LOG_EVERY
    s.is_up(135.0)
    assert s.is_down(140.0)  # the next outage: at once again, not 30 s after the last line


def test_a_shard_slow_to_answer_is_late_before_it_is_down() -> None:
    """A round without its answer soon after one with it is a loaded machine's delay,
    not a loss (the driver does not log it down, and keeps its last report)."""
    from crawler.run.raydriver import SLOW_GRACE, _RayShard

    s = _RayShard(0)
    assert not s.late(0.0)  # never answered: a starting actor, handled as before
    s.is_up(10.0)
    assert s.late(10.2) and s.late(10.0 + SLOW_GRACE - 0.1)
    assert not s.late(10.0 + SLOW_GRACE)  # silent that long: down
    s.is_up(20.0)
    assert s.late(21.0)  # each answer starts the grace again


def test_a_lost_incarnations_fetches_are_counted_from_its_last_report() -> None:
    from crawler.run.raydriver import _RayShard

    s = _RayShard(0)
    s.new_incarnation("one")
    s.report = s.last = {"fetched": 7, "outcomes": {"ok": 7}}
    s.report = None  # lost with its node: no answer, no final
    assert not s.new_incarnation("one")  # the same actor answering again is not new
    assert s.new_incarnation("two")  # a new actor on the node back (or Ray's restart)
    assert s.fetched_before == 7 and s.outcomes_before == {"ok": 7} and s.incarnation == 2


# An owner that does not answer (an actor on a node that lost its power: Ray holds the
# call until it declares the node dead, a minute with its defaults) must not hold the
# sender's forwarder, which sends one message at a time, from the other shards.
SILENT_PROBE = r"""
import json, sys, time
import ray
from crawler.exceptions import ExchangeError
from crawler.net.raycluster import NAMESPACE
from crawler.run.rayshard import RayExchange

ray.init(address=sys.argv[1], namespace=NAMESPACE, configure_logging=False)

@ray.remote(max_concurrency=4)
class Inbox:
    def __init__(self, silent):
        self.silent, self.got = silent, []
    def admit(self, payload):
        if self.silent:
            time.sleep(3600)
        self.got.append(payload)
    def received(self):
        return self.got

silent = Inbox.options(name="silent-run-00").remote(True)
live = Inbox.options(name="silent-run-01").remote(False)
ray.get([silent.received.remote(), live.received.remote()])
ex = RayExchange(["silent-run-00", "silent-run-01"], timeout=3600, patience=1)
out = {}
def failure(dest, payload):
    try:
        ex.send(dest, payload)
    except ExchangeError as exc:
        return str(exc)
    return None
out["first"] = failure(0, b"one")
out["again"] = failure(0, b"one")  # the first call is still out: no second one
out["live"] = failure(1, b"two")
out["admitted"] = [p.decode() for p in ray.get(live.received.remote())]
print(json.dumps(out))
"""


def test_a_silent_owner_is_given_up_on_after_the_patience_and_others_are_served(
    ray_head: tuple[str, dict[str, str]],
) -> None:
    address, env = ray_head
    done = subprocess.run([sys.executable, "-c", SILENT_PROBE, address], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first"] == "shard 0: no answer in 1 s"
    assert out["again"] and out["again"].startswith("shard 0: an earlier batch is unanswered")
    assert out["live"] is None and out["admitted"] == ["two"]
