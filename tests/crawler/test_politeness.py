"""The per-host scheduler, with a clock the tests move."""

from __future__ import annotations

import threading

from crawler.run.politeness import Scheduler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock, **kw: int | float) -> Scheduler:
    settings: dict[str, int | float] = dict(
        per_host=1, delay=1.0, max_waiting=100, max_waiting_per_host=10
    )
    settings.update(kw)
    return Scheduler(clock=clock, **settings)  # type: ignore[arg-type]


def test_one_connection_per_host_and_the_delay_after_each_request() -> None:
    clock = Clock()
    s = make(clock)
    for i in range(3):
        assert s.offer("a", f"a{i}")
    assert s.offer("b", "b0")
    first = s.next(timeout=0)
    second = s.next(timeout=0)
    assert first is not None and second is not None
    assert {first[1], second[1]} == {"a0", "b0"}
    assert s.next(timeout=0) is None  # a is busy
    slot_a = first[0] if first[1] == "a0" else second[0]
    s.release(slot_a)
    assert s.next(timeout=0) is None  # a must wait its delay
    clock.now += 0.99
    assert s.next(timeout=0) is None
    clock.now += 0.02
    got = s.next(timeout=0)
    assert got is not None and got[1] == "a1"


def test_per_host_limit_allows_k_at_once() -> None:
    clock = Clock()
    s = make(clock, per_host=3, delay=0.0)
    for i in range(5):
        s.offer("a", i)
    taken = [s.next(timeout=0) for _ in range(4)]
    assert [t[1] for t in taken if t] == [0, 1, 2]
    assert taken[3] is None
    assert s.active == 3


def test_not_before_holds_the_host() -> None:
    clock = Clock()
    s = make(clock, delay=0.0)
    s.offer("a", 1)
    s.offer("a", 2)
    slot, _ = s.next(timeout=0)  # type: ignore[misc]
    s.release(slot, not_before=clock.now + 30)
    clock.now += 29
    assert s.next(timeout=0) is None
    clock.now += 1.5
    assert s.next(timeout=0) is not None


def test_wait_lists_are_bounded_but_front_offers_always_fit() -> None:
    clock = Clock()
    s = make(clock, max_waiting=4, max_waiting_per_host=2)
    assert s.offer("a", 1) and s.offer("a", 2)
    assert not s.offer("a", 3)  # per host
    assert s.offer("b", 1) and s.offer("c", 1)
    assert not s.offer("d", 1)  # global
    assert s.offer("a", 0, front=True)  # a URL handed back by a worker is never dropped
    assert s.waiting == 5
    assert not s.has_room()


def test_drain_returns_every_waiting_url() -> None:
    clock = Clock()
    s = make(clock)
    for h in "abc":
        for i in range(2):
            s.offer(h, h + str(i))
    assert sorted(s.drain()) == ["a0", "a1", "b0", "b1", "c0", "c1"]
    assert s.idle() and s.next(timeout=0) is None


def test_a_blocked_worker_wakes_when_a_host_becomes_ready() -> None:
    s = Scheduler(per_host=1, delay=0.0, max_waiting=10, max_waiting_per_host=10)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(s.next(timeout=5)))
    t.start()
    s.offer("a", "x")
    t.join(timeout=5)
    assert not t.is_alive()
    assert got and got[0] is not None and got[0][1] == "x"  # type: ignore[index]


def test_close_releases_blocked_workers() -> None:
    s = Scheduler(per_host=1, delay=0.0, max_waiting=10, max_waiting_per_host=10)
    got: list[object] = ["not yet"]
    t = threading.Thread(target=lambda: got.__setitem__(0, s.next()))
    t.start()
    s.close()
    t.join(timeout=5)
    assert not t.is_alive() and got == [None]


def test_a_host_becoming_ready_later_is_served_on_time() -> None:
    clock = Clock()
    s = make(clock, delay=0.5)
    s.offer("a", 1)
    s.offer("a", 2)
    slot, _ = s.next(timeout=0)  # type: ignore[misc]
    s.release(slot)
    assert s.next(timeout=0) is None
    clock.now += 0.5
    assert s.next(timeout=0) is not None


def test_delayed_counts_the_hosts_politeness_holds_now() -> None:
    clock = Clock()
    s = make(clock)
    for host in ("a", "b", "c"):
        s.offer(host, host + "0")
        s.offer(host, host + "1")
    s.offer("d", "d0")
    assert s.delayed() == 0  # every host may go now
    taken = [s.next(timeout=0) for _ in range(4)]
    assert all(taken)
    for slot, _ in taken[:3]:  # a, b and c are asked once and owe their delay
        s.release(slot)
    assert s.delayed() == 3  # their second URLs wait their turn; d has none left
    clock.now += 1.01
    assert s.delayed() == 0
