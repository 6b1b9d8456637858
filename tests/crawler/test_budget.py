"""crawler.run.budget: a shard's bytes in flight never pass the limit, the oldest lease
never waits, a lease larger than the whole budget proceeds alone, nothing deadlocks;
the fetcher counts a body on its lease as it arrives; a crawl with a budget smaller than
one page still fetches every page, one at a time, and says how often it waited."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import fetched_urls, run_crawl, status_json

from crawler.config import CrawlerConfig
from crawler.exceptions import ConfigError
from crawler.net.fetch import READ_CHUNK, Fetcher
from crawler.run.budget import BUDGET_QUANTUM, Lease, MemoryBudget, return_large_blocks
from crawler.run.engine import largest_lease
from tools.testweb import TestWeb, fault

KIB = 1 << 10
MIB = 1 << 20
JOIN_TIMEOUT = 60.0  # seconds; a thread still alive after this is deadlocked
WAIT_TIMEOUT = 30.0


def in_thread(fn: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


def finished(t: threading.Thread) -> bool:
    t.join(JOIN_TIMEOUT)
    return not t.is_alive()


class TestMemoryBudget:
    def test_grants_in_quanta_and_close_gives_everything_back(self) -> None:
        budget = MemoryBudget(MIB, 256 * KIB)
        lease = budget.lease()
        lease.grow(10)
        assert lease.granted == BUDGET_QUANTUM and budget.in_use == BUDGET_QUANTUM
        lease.grow(BUDGET_QUANTUM)  # 10 + 64 KiB: one more quantum
        assert budget.in_use == 2 * BUDGET_QUANTUM
        lease.hold(BUDGET_QUANTUM)  # already holds more: nothing changes
        assert budget.in_use == 2 * BUDGET_QUANTUM
        lease.close()
        lease.close()
        assert budget.in_use == 0 and budget.peak == 2 * BUDGET_QUANTUM
        with pytest.raises(ValueError, match="closed"):
            lease.grow(1)

    def test_the_oldest_lease_never_waits(self) -> None:
        budget = MemoryBudget(MIB, 512 * KIB)
        oldest, young = budget.lease(), budget.lease()
        young.grow(512 * KIB)  # all the others may hold
        t = in_thread(lambda: oldest.grow(512 * KIB))
        assert finished(t)
        assert budget.in_use == MIB and budget.waits == 0

    def test_a_younger_lease_waits_until_an_older_one_gives_back(self) -> None:
        budget = MemoryBudget(MIB, 512 * KIB)
        oldest, young = budget.lease(), budget.lease()
        oldest.grow(512 * KIB)
        young.grow(256 * KIB)
        t = in_thread(lambda: young.grow(512 * KIB))  # the others' share is 512 KiB
        wait_until(lambda: budget.snapshot()["waits"] == 1, "the young lease waits")
        assert t.is_alive() and budget.in_use == 768 * KIB
        oldest.close()  # young is the oldest now
        assert finished(t)
        assert budget.in_use == 768 * KIB and budget.peak <= MIB

    def test_a_lease_larger_than_the_whole_budget_proceeds_alone(self) -> None:
        budget = MemoryBudget(MIB, 2 * MIB)  # one lease may need more than the limit
        big, small = budget.lease(), budget.lease()
        big.grow(5 * MIB)  # the oldest: past the limit, alone
        t = in_thread(lambda: small.grow(1))
        wait_until(lambda: budget.snapshot()["waits"] == 1, "the small lease waits")
        assert t.is_alive()
        big.close()
        assert finished(t)
        assert budget.in_use == BUDGET_QUANTUM

    def test_no_overtaking_an_older_lease_that_waits(self) -> None:
        budget = MemoryBudget(MIB, 512 * KIB)
        oldest, middle, young = budget.lease(), budget.lease(), budget.lease()
        oldest.grow(512 * KIB)
        middle.grow(448 * KIB)
        order: list[str] = []

        def grow(lease: Lease, n: int, name: str) -> None:
            lease.grow(n)
            order.append(name)

        t1 = in_thread(lambda: grow(middle, 128 * KIB, "middle"))
        wait_until(lambda: budget.snapshot()["waits"] == 1, "the middle lease waits")
        # 64 KiB would fit beside middle's 448 KiB, but middle asked first
        t2 = in_thread(lambda: grow(young, 1, "young"))
        wait_until(lambda: budget.snapshot()["waits"] == 2, "the young lease waits")
        oldest.close()
        assert finished(t1) and finished(t2)
        assert order == ["middle", "young"]

    def test_many_threads_never_pass_the_limit_and_all_finish(self) -> None:
        limit, largest = 2 * MIB, 768 * KIB
        budget = MemoryBudget(limit, largest)
        lock = threading.Lock()
        held = [0, 0]  # bytes granted now, the most seen

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(30):
                with budget.lease() as lease:
                    for _ in range(rng.randint(1, 8)):  # grows while it holds bytes
                        before = lease.granted
                        lease.grow(rng.randint(1, largest // 8))
                        with lock:
                            held[0] += lease.granted - before
                            held[1] = max(held[1], held[0])
                        time.sleep(rng.random() / 2000)
                    with lock:
                        held[0] -= lease.granted

        threads = [in_thread(lambda s=s: worker(s)) for s in range(24)]  # type: ignore[misc]
        assert all(finished(t) for t in threads)
        assert held[1] <= limit and budget.peak <= limit
        assert budget.in_use == 0
        assert budget.waits > 0  # 24 threads of up to 768 KiB against 2 MiB

    def test_refuses_a_budget_of_nothing(self) -> None:
        with pytest.raises(ValueError):
            MemoryBudget(0, 1)


def test_return_large_blocks_sets_glibcs_threshold_unless_the_user_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert return_large_blocks() is True  # this machine runs glibc
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert return_large_blocks() is False


class CountingLease:
    """A lease that records what the fetcher asks for (a real MemoryBudget behind it)."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.lease: Lease = budget.lease()
        self.asked: list[int] = []

    def grow(self, n: int) -> None:
        self.asked.append(n)
        self.lease.grow(n)


def test_the_fetcher_counts_a_bomb_on_its_lease_64_kib_at_a_time(
    make_testweb: Callable[..., TestWeb],
) -> None:
    web = make_testweb(pages=4, hosts=1, faults=[fault("gzip_bomb", size=8 * MIB)])
    budget = MemoryBudget(64 * MIB, 32 * MIB)
    lease = CountingLease(budget)
    with Fetcher(user_agent="t", resolve=lambda host: "127.0.0.1",
                 max_decoded_bytes=3 * MIB) as fetcher:
        r = fetcher.fetch(web.url("h0.test", "/x/gzip_bomb/1"), lease=lease)
    assert r.truncate_reason == "decompression_bomb" and len(r.body) == 3 * MIB
    body_asks = lease.asked[1:]  # the first covers the read in hand
    assert lease.asked[0] == 2 * READ_CHUNK
    assert max(body_asks) <= READ_CHUNK + READ_CHUNK // 8  # never the body in one piece
    assert len(r.body) <= sum(body_asks) <= len(r.body) * 9 // 8 + READ_CHUNK
    assert budget.in_use == lease.lease.granted >= sum(lease.asked)
    lease.lease.close()


def test_a_budget_smaller_than_one_page_still_crawls_everything(
    make_testweb: Callable[..., TestWeb], tmp_path: Path,
) -> None:
    """Every lease is larger than the budget: they run one at a time, none deadlocks."""
    web = make_testweb(pages=40, hosts=3, seed=2, crawl_delay=0.0)
    engine = run_crawl(web, tmp_path / "c", memory_budget=1, threads=8)
    assert engine.complete  # type: ignore[attr-defined]
    assert fetched_urls(tmp_path / "c") == web.oracle.crawl().fetched
    memory = status_json(tmp_path / "c")["memory"]
    assert memory["limit"] == 1 and memory["in_use"] == 0
    assert memory["peak"] >= BUDGET_QUANTUM  # each lease went past the limit, alone


def test_the_default_budget_is_twice_the_largest_lease(
    make_testweb: Callable[..., TestWeb], tmp_path: Path,
) -> None:
    web = make_testweb(pages=10, hosts=1, seed=1, crawl_delay=0.0)
    run_crawl(web, tmp_path / "c", max_decoded_bytes=3 * MIB)
    memory = status_json(tmp_path / "c")["memory"]
    assert memory["limit"] == 2 * largest_lease(3 * MIB)
    assert 0 < memory["peak"] <= memory["limit"] and memory["waits"] == 0
    # the largest lease: a 20 MiB body as kept (+1/8), and 3 bytes of UTF-8 a byte parsed
    assert largest_lease(20 * MIB) >= 20 * MIB * 9 // 8 + 60 * MIB
    with pytest.raises(ConfigError, match="--memory-budget"):
        CrawlerConfig(data_dir=str(tmp_path), memory_budget=0)
