"""The shard layout, the outbox, the link exchange, and their crash safety on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from crawl_helpers import REPO

import kvstore
from crawler.exceptions import DataDirError, ExchangeError, ShardCountError
from crawler.run.exchange import (
    DEFAULT_LINGER,
    MAX_LINGER,
    Forwarder,
    UnixExchange,
    linger_for,
)
from crawler.state.frontier import Frontier
from crawler.state.outbox import Outbox
from crawler.state.pages import Pending, decode_bulk
from crawler.state.shards import (
    SHARDS_NAME,
    Router,
    ShardPlace,
    open_layout,
    owner,
    read_count,
    shard_dir,
    shard_dirs,
)
from crawler.web.urls import host_of, url_key


def host_of_shard(index: int, count: int, prefix: str = "h") -> str:
    return next(f"{prefix}{i}.test" for i in range(1000) if owner(f"{prefix}{i}.test", count)
                == index)


class TestLayout:
    def test_a_new_crawl_records_its_count(self, tmp_path: Path) -> None:
        assert read_count(str(tmp_path / "c")) is None
        assert open_layout(str(tmp_path / "c"), 3) == 3
        assert json.loads((tmp_path / "c" / SHARDS_NAME).read_text()) == {
            "format": 1, "shards": 3}
        assert shard_dirs(str(tmp_path / "c")) == [
            str(tmp_path / "c" / f"shard-{i:02d}") for i in range(3)]
        assert open_layout(str(tmp_path / "c"), None) == 3

    def test_another_count_is_refused(self, tmp_path: Path) -> None:
        open_layout(str(tmp_path), 2)
        with pytest.raises(ShardCountError, match="--processes 2"):
            open_layout(str(tmp_path), 4)

    def test_a_crawl_from_before_shards_is_one_shard_in_place(self, tmp_path: Path) -> None:
        (tmp_path / "main").mkdir()
        assert read_count(str(tmp_path)) == 1 and shard_dirs(str(tmp_path)) == [str(tmp_path)]
        assert open_layout(str(tmp_path), None) == 1
        assert json.loads((tmp_path / SHARDS_NAME).read_text())["shards"] == 1
        with pytest.raises(ShardCountError):
            open_layout(str(tmp_path), 2)

    def test_a_newer_format_is_refused(self, tmp_path: Path) -> None:
        (tmp_path / SHARDS_NAME).write_text('{"format": 9, "shards": 2}')
        with pytest.raises(DataDirError, match="newer"):
            read_count(str(tmp_path))

    def test_owner_is_by_host_whatever_the_port_or_scheme(self) -> None:
        router = Router(ShardPlace(0, 7))
        for url in ("http://a.test/", "https://a.test:8443/x?y", "http://A.test:80/"):
            assert router.owner_of(url) == owner("a.test", 7)
        assert router.owner_of("http://[::1]:8080/") == owner(host_of("http://[::1]:8080/"), 7)
        spread = Counter(owner(f"h{i}.test", 4) for i in range(4000))
        assert min(spread.values()) > 900  # md5 spreads hosts evenly


def pending(url: str, depth: int = 1) -> tuple[bytes, Pending]:
    return url_key(url), Pending(url, depth)


class TestOutbox:
    def test_route_keeps_ours_and_stages_each_foreign_link_once(self, tmp_path: Path) -> None:
        ours, theirs = host_of_shard(0, 2), host_of_shard(1, 2)
        box = Outbox(str(tmp_path), Router(ShardPlace(0, 2)))
        links = [pending(f"http://{ours}/a"), pending(f"http://{theirs}/b"),
                 pending(f"http://{theirs}/b"), pending(f"http://{theirs}/c")]
        assert box.route(links) == [links[0]]
        assert box.route([pending(f"http://{theirs}/b")]) == []  # staged recently
        assert box.write() == 2 and box.urls() == 2 and not box.empty()
        box.close()
        again = Outbox(str(tmp_path), Router(ShardPlace(0, 2)))  # a restart: still there
        taken = again.take(1, 100)
        assert taken is not None and taken.urls == 2
        assert [e.url for e in decode_bulk(taken.payload)] == [
            f"http://{theirs}/b", f"http://{theirs}/c"]
        again.ack(taken)
        assert again.empty()
        again.close()
        with kvstore.open(tmp_path / "outbox", readonly=True) as store:
            assert len(store) == 0

    def test_take_batches_records_up_to_the_limit(self, tmp_path: Path) -> None:
        theirs = host_of_shard(1, 2)
        box = Outbox(str(tmp_path), Router(ShardPlace(0, 2)))
        for i in range(5):
            box.route([pending(f"http://{theirs}/{i}/{j}") for j in range(10)])
            box.write()
        taken = box.take(1, 25)
        assert taken is not None and taken.urls == 20 and len(taken.keys) == 2
        box.ack(taken)
        assert box.urls() == 30
        box.close()


# -- the exchange over real sockets -----------------------------------------------------------


def committer(frontier: Frontier, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            frontier.commit()
            time.sleep(0.002)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_forwarder_delivers_and_deletes_only_after_the_owner_wrote(tmp_path: Path) -> None:
    top = tmp_path / ("x" * 120)  # longer than a socket address: reached via /proc/self/fd
    open_layout(str(top), 2)
    dirs = [shard_dir(str(top), i, 2) for i in range(2)]
    addrs = [os.path.join(d, "inbox.sock") for d in dirs]
    for d in dirs:
        os.makedirs(d)
    theirs = host_of_shard(1, 2)
    sender = Frontier(dirs[0], router=Router(ShardPlace(0, 2)))
    receiver = Frontier(dirs[1], router=Router(ShardPlace(1, 2)))
    stop = threading.Event()
    committer(receiver, stop)
    out = UnixExchange(addrs)
    assert sender.outbox is not None
    fwd = Forwarder(sender.outbox, out, linger=0.0)
    sender.add_seeds([Pending(f"http://{theirs}/{i}") for i in range(3000)])
    sender.commit()  # routed: all three thousand wait in the outbox
    assert sender.outbox.urls() == 3000 and len(sender.pend) == 0
    fwd.forward()
    assert fwd.failures == 1 and fwd.sent_batches == 0  # nobody listens yet: kept, retried
    assert sender.outbox.urls() == 3000
    inbox = UnixExchange(addrs)
    inbox.serve(1, lambda payload: None if receiver.receive(decode_bulk(payload)).wait(10)
                else (_ for _ in ()).throw(RuntimeError("not in time")))
    fwd._retry_at.clear()  # no need to wait out the backoff
    assert fwd.forward() == 0.0 and fwd.sent_batches == 1
    assert sender.outbox.empty()
    keys = [url_key(f"http://{theirs}/{i}") for i in range(3000)]
    assert all(k in receiver.pend_set for k in keys)
    stop.set()
    inbox.close()
    out.close()
    with pytest.raises(ExchangeError):  # nobody listens now: the batch stays with its sender
        out2 = UnixExchange(addrs)
        out2.send(1, b"0\t0\t0\thttp://x.test/")
    sender.close()
    receiver.close()


SENDER = r"""
import os, signal, sys
from crawler.state.frontier import Frontier, Outcome
from crawler.state.pages import PageRecord, Pending, encode_page
from crawler.state.shards import Router, ShardPlace
from crawler.web.urls import url_key

shard_dir, seed, link, when = sys.argv[1:5]
f = Frontier(shard_dir, router=Router(ShardPlace(0, 2)))
f.add_seeds([Pending(seed)])
f.commit()
(c,) = f.claim()


class DiesAtFirstTombstone:  # the PendDB, killed mid-commit: after step 1, at step 3
    def __init__(self, store):
        self.store = store

    def __delitem__(self, key):
        os.kill(os.getpid(), signal.SIGKILL)

    def __getattr__(self, name):
        return getattr(self.store, name)


if when == "at-tombstone":
    f.pend = DiesAtFirstTombstone(f.pend)
page = encode_page(PageRecord(url=seed, status=200, fetched_at=0.0, depth=0))
f.submit(Outcome(c, page, links=[(url_key(link), Pending(link, 1))]))
f.commit()
os.kill(os.getpid(), signal.SIGKILL)  # after the whole commit, before any forwarding
"""

RECEIVER = r"""
import os, signal, sys, threading, time
from crawler.run.exchange import UnixExchange
from crawler.state.frontier import Frontier
from crawler.state.pages import decode_bulk
from crawler.state.shards import Router, ShardPlace

shard_dir, addr0, addr1, die = sys.argv[1:5]
f = Frontier(shard_dir, router=Router(ShardPlace(1, 2)))


def commit_loop():
    while True:
        f.commit()
        time.sleep(0.002)


threading.Thread(target=commit_loop, daemon=True).start()


def admit(payload):
    assert f.receive(decode_bulk(payload)).wait(30)
    if die == "before-ack":  # durable here, but the sender never hears it
        os.kill(os.getpid(), signal.SIGKILL)


ex = UnixExchange([addr0, addr1])
ex.serve(1, admit)
print("ready", flush=True)
sys.stdin.read()  # until the test closes our stdin
ex.close()
f.close()
"""


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def start_receiver(shard: str, addrs: list[str], die: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, shard, *addrs, die], cwd=REPO,
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def url_log(shard: str) -> list[str]:
    with open(os.path.join(shard, "urls.log"), encoding="utf-8") as f:
        return f.read().split()


def live_urls(store_dir: str) -> list[str]:
    with kvstore.open(store_dir, readonly=True) as store:
        return [e.url for k in store for e in decode_bulk(store[k])]


@pytest.mark.parametrize("when", ["at-tombstone", "after-commit"])
def test_a_link_for_another_shard_survives_kill9_of_sender_and_of_receiver(
    tmp_path: Path, when: str
) -> None:
    top = str(tmp_path / "c")
    open_layout(top, 2)
    a, b = shard_dir(top, 0, 2), shard_dir(top, 1, 2)
    addrs = [os.path.join(d, "inbox.sock") for d in (a, b)]
    seed = f"http://{host_of_shard(0, 2)}/"
    link = f"http://{host_of_shard(1, 2)}/found-on-a"
    # 1. A commits the page that found the link, and is killed (mid-commit or after).
    done = run_script(SENDER, a, seed, link, when)
    assert done.returncode == -9, done.stderr
    assert live_urls(os.path.join(a, "outbox")) == [link]  # durable before the tombstone
    assert live_urls(os.path.join(a, "pend")) == ([seed] if when == "at-tombstone" else [])
    # 2. B admits the batch durably and is killed before it can acknowledge it.
    box = Outbox(a, Router(ShardPlace(0, 2)))
    taken = box.take(1, 5000)
    assert taken is not None
    dying = start_receiver(b, addrs, "before-ack")
    with pytest.raises(ExchangeError):
        UnixExchange(addrs).send(1, taken.payload)
    dying.communicate(timeout=30)
    assert dying.returncode == -9
    assert live_urls(os.path.join(b, "pend")) == [link] and url_log(b) == [link]
    box.close()
    # 3. Both restart: A sends again, B drops the duplicate and acknowledges, A deletes.
    box = Outbox(a, Router(ShardPlace(0, 2)))
    taken = box.take(1, 5000)
    assert taken is not None and taken.urls == 1
    receiver = start_receiver(b, addrs, "no")
    sender = UnixExchange(addrs)
    sender.send(1, taken.payload)
    box.ack(taken)
    sender.close()
    box.close()
    receiver.communicate(timeout=30)  # stdin closed: it closes its stores and exits
    assert receiver.returncode == 0
    assert live_urls(os.path.join(a, "outbox")) == []
    assert live_urls(os.path.join(b, "pend")) == [link]  # once: admission deduplicated
    assert url_log(b) == [link]


# -- completion ---------------------------------------------------------------------------------


def test_completion_needs_two_identical_idle_rounds() -> None:
    from crawler.run.supervisor import quiescent

    idle = [(1, 7, True), (1, 3, True)]
    assert quiescent(idle, list(idle))
    assert not quiescent(None, idle)  # one round proves nothing
    assert not quiescent(idle, [(1, 7, True), (1, 4, True)])  # shard 1 committed between
    assert not quiescent(idle, [(1, 7, True), (2, 3, True)])  # shard 1 restarted between
    busy = [(1, 7, True), (1, 3, False)]
    assert not quiescent(busy, list(busy))


def test_a_shard_with_links_to_hand_over_is_not_idle(tmp_path: Path) -> None:
    from crawler.config import CrawlerConfig
    from crawler.run.engine import Engine

    engine = Engine(CrawlerConfig(data_dir=str(tmp_path), broad=True), place=ShardPlace(0, 2))
    try:
        assert engine.idle()
        theirs = f"http://{host_of_shard(1, 2)}/x"
        engine.add_seeds([theirs])  # another shard's seed: left to its owner
        engine.frontier.commit()
        assert engine.idle() and engine.frontier.outbox is not None
        engine.frontier.receive([Pending(theirs)])  # sent here by mistake: passed on
        assert not engine.idle()
        engine.frontier.commit()
        assert engine.frontier.outbox.urls() == 1 and len(engine.frontier.pend) == 0
        assert not engine.idle()  # until its owner has it
    finally:
        engine.close()


class _Collecting(UnixExchange):
    """An exchange that keeps what it is handed (the sink of a Forwarder under test), with
    a message cap of its own, as RayExchange has."""

    max_batch_urls = 100

    def __init__(self) -> None:
        super().__init__([])
        self.payloads: list[bytes] = []

    def send(self, dest: int, payload: bytes) -> None:
        self.payloads.append(payload)


def test_a_message_never_carries_more_than_its_exchange_takes(tmp_path: Path) -> None:
    open_layout(str(tmp_path), 2)
    theirs = host_of_shard(1, 2)
    sender = Frontier(shard_dir(str(tmp_path), 0, 2), router=Router(ShardPlace(0, 2)))
    assert sender.outbox is not None
    sink = _Collecting()
    fwd = Forwarder(sender.outbox, sink, batch_urls=5000, linger=0.0)
    for part in range(5):  # five records of 40: messages of at most 100 URLs each
        sender.add_seeds([Pending(f"http://{theirs}/{part}/{i}") for i in range(40)])
        sender.commit()
    while not sender.outbox.empty():
        fwd.forward()
    sizes = [len(decode_bulk(p)) for p in sink.payloads]
    assert sum(sizes) == 200 and max(sizes) <= 100 and len(sizes) >= 2, sizes
    sender.close()


def test_the_linger_grows_with_the_shard_count_and_is_bounded() -> None:
    assert linger_for(1) == linger_for(8) == DEFAULT_LINGER
    assert DEFAULT_LINGER < linger_for(16) < linger_for(64) < linger_for(400) == MAX_LINGER
    assert linger_for(100_000) == MAX_LINGER


def test_the_ray_driver_probes_many_shards_less_often(tmp_path: Path) -> None:
    from crawler.config import CrawlerConfig
    from crawler.run.raydriver import RayDriver
    from crawler.run.supervisor import PROBE_INTERVAL

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    few = RayDriver(CrawlerConfig(data_dir=str(tmp_path / "a")), 4, [], "local")
    os.close(few._lock_fd)
    many = RayDriver(CrawlerConfig(data_dir=str(tmp_path / "b")), 800, [], "local")
    os.close(many._lock_fd)
    assert few.probe_interval == PROBE_INTERVAL and many.probe_interval == pytest.approx(2.0)
