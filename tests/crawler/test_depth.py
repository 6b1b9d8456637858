"""BFS-exact depth under --max-depth: a URL met again by a shorter path gets the shorter
depth, and the pages the limit had cut below it are crawled (crawler.state.depths).

The site: testweb's ``shortcut`` feature on h1.test. Its index links a fast chain of
four pages and a slow page (a 3 s first byte); both lead to ``trap/1``, the head of a
line of twelve pages. The chain reaches ``trap/1`` first, at the depth limit, so its
line is cut; the slow page then offers it three links shallower.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from crawl_helpers import (
    cli_args,
    fetched_urls,
    records,
    run_crawl,
    shard_paths,
    start_cli,
    status_json,
    wait_for,
)

from crawler.state.admission import keys_array
from crawler.state.depths import DEPTHS_NAME, Depths
from crawler.state.frontier import Claimed, Frontier, Outcome
from crawler.state.pages import PageRecord, Pending, decode_page, encode_page
from crawler.web.urls import url_key
from tools.testweb import CrawlResult, TestWeb, fault

MakeWeb = Callable[..., TestWeb]
SLOW = 3.0  # seconds the short path's page takes to answer


def shortcut_web(make_testweb: MakeWeb) -> TestWeb:
    return make_testweb(
        pages=30, hosts=3, seed=1, crawl_delay=0.0,
        faults=[fault("shortcut", host="h1.test"),
                fault("slow_first_byte", host="h1.test", prefix="/x/shortcut/slow", delay=SLOW)],
    )


def limit_and_oracle(web: TestWeb) -> tuple[int, CrawlResult]:
    """The depth limit that cuts the line when it is met by the chain, and the oracle."""
    deep = web.oracle.crawl(max_depth=64)
    limit = deep.depth[web.url("h1.test", "/x/shortcut/chain/4")] + 1
    return limit, web.oracle.crawl(max_depth=limit)


def trap(web: TestWeb, i: int) -> str:
    return web.url("h1.test", f"/x/shortcut/trap/{i}")


def test_a_shorter_path_found_later_gives_the_smaller_depth(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = shortcut_web(make_testweb)
    limit, want = limit_and_oracle(web)
    assert trap(web, 2) in want.fetched  # the limit does not cut the line at its head
    engine = run_crawl(web, tmp_path, max_depth=limit, per_host=2)
    assert engine.complete  # type: ignore[attr-defined]
    recs = records(tmp_path)
    assert {u for u, r in recs.items() if r.status} == set(want.fetched)
    assert {u: r.depth for u, r in recs.items() if r.status} == dict(want.depth)
    assert not web.log.duplicates()  # nothing fetched twice: the stored page is read again
    snap = status_json(tmp_path)
    assert snap["depth_improved"] >= 1 and snap["depth_not_reread"] == 0
    # the chain did reach the head first (else this crawl did not test the improvement)
    heads = web.log.records(host="h1.test")
    first = {r.path: r.start for r in reversed(heads)}
    assert first["/x/shortcut/trap/1"] < first["/x/shortcut/slow"] + SLOW - 0.5


def test_without_a_depth_limit_depths_are_logged_but_not_kept(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=25, hosts=2, seed=3, crawl_delay=0.0)
    engine = run_crawl(web, tmp_path)
    assert not engine.frontier.depths.tracking
    size = (tmp_path / DEPTHS_NAME).stat().st_size
    assert size == 18 * len(records(tmp_path)) == 18 * engine.frontier.admitted


def test_kill_between_the_long_and_the_short_path_then_resume(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """Killed after the chain reached the line's head and before the slow page answered:
    the resumed crawl learns the head's depth from depths.bin and reads it again when
    the slow page (fetched again: it was in flight) offers it."""
    web = shortcut_web(make_testweb)
    limit, want = limit_and_oracle(web)
    args = cli_args(web, tmp_path, "--max-depth", str(limit), "--per-host", "2",
                    "--processes", "1", "--sync-interval", "0.2")
    proc = start_cli(args)
    try:
        wait_for(lambda: any(r.path == "/x/shortcut/trap/1" and r.end is not None
                             for r in web.log.records(host="h1.test")), proc, "the line's head")
        time.sleep(0.8)  # committed and synced (0.2 s) well before the slow page answers
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=30)
    slow = [r for r in web.log.records(host="h1.test") if r.path == "/x/shortcut/slow"]
    assert slow and slow[0].end is None  # still in flight at the kill
    assert records(tmp_path)[trap(web, 1)].depth == limit  # met by the long path only
    assert trap(web, 2) not in fetched_urls(tmp_path)
    done = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    recs = records(tmp_path)
    assert {u for u, r in recs.items() if r.status} == set(want.fetched)
    assert recs[trap(web, 1)].depth == want.depth[trap(web, 1)]
    assert status_json(tmp_path)["depth_improved"] >= 1
    pages = [r for r in web.log.records(host="h1.test") if "/trap/" in r.path]
    assert len(pages) == len({r.path for r in pages})  # the line's pages once each


def test_two_shards(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = shortcut_web(make_testweb)
    limit, want = limit_and_oracle(web)
    args = cli_args(web, tmp_path, "--max-depth", str(limit), "--per-host", "2",
                    "--processes", "2")
    done = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert len(shard_paths(tmp_path)) == 2
    recs = records(tmp_path)
    assert {u for u, r in recs.items() if r.status} == set(want.fetched)
    assert {u: r.depth for u, r in recs.items() if r.status} == dict(want.depth)
    assert not web.log.duplicates()


# -- the depth log -------------------------------------------------------------------------


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def entry(depth: int) -> Pending:
    return Pending("http://a.test/", depth)


def test_the_log_keeps_the_last_depth_of_each_key_and_drops_a_cut_record(tmp_path: Path) -> None:
    d = Depths(str(tmp_path), track=True)
    d.admit([key(1), key(2), key(3)], [entry(5), entry(4), entry(7)])
    d.write()
    reduced, won = d.improve([(key(1), entry(6)), (key(2), entry(2)), (key(2), entry(3)),
                              (key(9), entry(1))])
    assert won == [(key(2), entry(2))]  # only a smaller depth of a known key
    assert [k for k, _ in reduced] == [key(1), key(2), key(9)]
    assert dict(reduced)[key(2)] == entry(2)
    d.write()
    d.log.close()
    with open(tmp_path / DEPTHS_NAME, "ab") as f:
        f.write(key(3) + b"\x01")  # a record cut by a kill: 17 of 18 bytes
    again = Depths(str(tmp_path), track=True)
    assert [again.get(key(i)) for i in (1, 2, 3, 9)] == [5, 2, 7, -1]
    assert (tmp_path / DEPTHS_NAME).stat().st_size == 4 * 18  # the cut record is gone
    again.admit([key(4)], [entry(1)])
    again.write()
    again.log.close()
    third = Depths(str(tmp_path), track=True)
    assert third.get(key(4)) == 1 and third.get(key(3)) == 7
    third.log.close()


def test_fold_only_lowers_and_untracked_maps_nothing(tmp_path: Path) -> None:
    d = Depths(str(tmp_path), track=True)
    d.admit([key(1)], [entry(3)])
    d.fold(keys_array([key(1), key(2)]), [5, 4])
    assert (d.get(key(1)), d.get(key(2))) == (3, 4)
    d.fold(keys_array([key(1)]), [1])
    assert d.get(key(1)) == 1
    d.log.close()
    os.makedirs(tmp_path / "p")
    plain = Depths(str(tmp_path / "p"), track=False)
    plain.admit([key(1)], [entry(3)])
    offers: list[Any] = [(key(1), entry(0))]
    assert plain.improve(offers) == (offers, []) and plain.get(key(1)) == -1
    plain.write()
    plain.log.close()
    raw = np.fromfile(tmp_path / "p" / DEPTHS_NAME, dtype=np.uint8)
    assert raw.size == 18 and raw[:16].tobytes() == key(1) and raw[16] == 3


# -- the frontier's part -------------------------------------------------------------------


def url(name: str) -> str:
    return f"http://a.test/{name}"


def offer(name: str, depth: int) -> tuple[bytes, Pending]:
    return url_key(url(name)), Pending(url(name), depth)


def stored(c: Claimed) -> bytes:
    return encode_page(PageRecord(url=c.entry.url, status=200, fetched_at=1.0,
                                  depth=c.entry.depth, body=b"<a href=x>"))


class Rereads:
    """An ``expand`` for the frontier: each page links ``<name>+`` one level down."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []  # (url, record's depth, entry's depth)

    def __call__(self, record: bytes, e: Pending) -> tuple[bytes, list[tuple[bytes, Pending]]]:
        page = decode_page(record)
        self.calls.append((e.url, page.depth, e.depth))
        child = e.url + "+"
        return (encode_page(replace(page, depth=e.depth)),
                [(url_key(child), Pending(child, e.depth + 1))])


def claim_one(f: Frontier, name: str) -> Claimed:
    got = [c for c in (f.claim() or []) if c.entry.url == url(name)]
    assert len(got) == 1
    return got[0]


def test_a_pending_url_is_claimed_at_its_smaller_depth(tmp_path: Path) -> None:
    f = Frontier(str(tmp_path), track_depth=True, expand=Rereads())
    f.add_seeds([Pending(url("a"), 5)])
    f.commit()
    f.add_seeds([Pending(url("a"), 2)])  # known (pending) at 5: offered at 2
    f.commit()
    assert f.depths.improved == 1 and len(f.pend) == 1  # nothing new in PendDB
    assert claim_one(f, "a").entry.depth == 2
    f.close()


def test_a_url_improved_while_in_flight_is_read_again_when_committed(tmp_path: Path) -> None:
    rereads = Rereads()
    f = Frontier(str(tmp_path), track_depth=True, expand=rereads)
    f.add_seeds([Pending(url("a"), 5)])
    f.commit()
    c = claim_one(f, "a")
    f.add_seeds([Pending(url("a"), 1)])
    f.commit()  # a is in flight: nothing to read yet
    assert rereads.calls == []
    f.submit(Outcome(c, stored(c), links=[offer("a+", 6)]))
    f.commit()
    assert rereads.calls == [(url("a"), 5, 1)]
    assert decode_page(f.main[url_key(url("a"))]).depth == 1
    assert claim_one(f, "a+").entry.depth == 2  # the reread's link, not the fetch's (6)
    f.close()


def test_a_done_url_is_read_again_and_the_improvement_cascades(tmp_path: Path) -> None:
    rereads = Rereads()
    f = Frontier(str(tmp_path), track_depth=True, expand=rereads)
    f.add_seeds([Pending(url("a"), 4)])
    f.commit()
    c = claim_one(f, "a")
    f.submit(Outcome(c, stored(c), links=[offer("a+", 5)]))
    f.commit()
    c2 = claim_one(f, "a+")
    f.submit(Outcome(c2, stored(c2), links=[]))  # the limit: a+ offered nothing
    f.commit()
    f.add_seeds([Pending(url("a"), 0)])
    f.commit()
    # a read again at 0 offers a+ at 1: known (done) at 5, read again too, offering a++ at 2
    assert rereads.calls == [(url("a"), 4, 0), (url("a+"), 5, 1)]
    assert [decode_page(f.main[url_key(url(n))]).depth for n in ("a", "a+")] == [0, 1]
    assert claim_one(f, "a++").entry.depth == 2
    assert f.depths.improved == 2
    f.close()
    again = Frontier(str(tmp_path), track_depth=True)
    assert [again.depths.get(url_key(url(n))) for n in ("a", "a+", "a++")] == [0, 1, 2]
    again.close()
