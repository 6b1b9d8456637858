"""``status`` from the counters the committer keeps (crawler.state.tally), and its
fallback to reading every record (``status --recount``) whenever they might be wrong.

The oracle is ``status --recount``: the counters must give the same numbers, field by
field, after every way the stores change (a crawl, a retry and its resume, revisits that
replace records, a kill -9, a sharded crawl), or ``status`` must notice and count."""

from __future__ import annotations

import json
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import (
    META_PATHS,
    Answer,
    Hit,
    LocalServer,
    answered_pages,
    cli_args,
    config_for,
    run_crawl,
    start_cli,
    wait_for,
    wait_for_answers,
)

import kvstore
from crawler.cli import main
from crawler.run.engine import Engine
from crawler.state import tally
from crawler.state.frontier import Frontier
from crawler.state.outcomelog import OUTCOMES_NAME
from crawler.state.statusfile import read_status
from crawler.state.tally import COUNTS_NAME
from kvstore.cli import main as kvstore_main
from tools.testweb import SiteConfig, TestWeb

MakeWeb = Callable[..., TestWeb]
Capsys = pytest.CaptureFixture[str]


def status(data: Path, capsys: Capsys, *flags: str) -> dict[str, Any]:
    """``status DIR --json`` (and ``flags``), parsed."""
    capsys.readouterr()
    assert main(["status", str(data), "--json", *flags]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    info: dict[str, Any] = json.loads(out)
    return info


def same_as_recount(data: Path, capsys: Capsys) -> dict[str, Any]:
    """status from wherever it counts, checked equal to --recount in every field; the
    first (with its ``counts_from``)."""
    fast = status(data, capsys)
    slow = status(data, capsys, "--recount")
    assert slow["counts_from"] == "scan" and "counts_why" not in slow
    assert {k: v for k, v in fast.items() if k not in ("counts_from", "counts_why")} == {
        k: v for k, v in slow.items() if k != "counts_from"}
    return fast


def from_counters(data: Path, capsys: Capsys) -> dict[str, Any]:
    info = same_as_recount(data, capsys)
    assert info["counts_from"] == "counters", info.get("counts_why")
    return info


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A finished crawl of a test web with redirects, 404s and robots.txt refusals."""
    with TestWeb(SiteConfig(pages=200, hosts=4, seed=3, crawl_delay=0.0)) as web:
        data = tmp_path_factory.mktemp("counters") / "crawl"
        assert run_crawl(web, data).complete  # type: ignore[attr-defined]
        yield data


def test_a_crawl_leaves_counters_that_are_the_recount(crawled: Path, capsys: Capsys) -> None:
    info = from_counters(crawled, capsys)
    assert info["recorded"] > 200 and len(info["outcomes"]) >= 4  # 200, 3xx, 404, robots
    assert info["recorded"] == sum(info["outcomes"].values())
    capsys.readouterr()
    assert main(["status", str(crawled)]) == 0
    assert "counted by reading every record" not in capsys.readouterr().out


DAMAGE = {
    "absent": None,  # a crawl written before the counters were kept
    "cut": "{\"fetched\": 2",
    "empty": "",
    "not an object": "[1, 2]",
    "a count that is text": None,  # filled in below from the real file
    "a stamp of the wrong shape": None,
    "binary": "\udcff\udcfe\0",
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_or_absent_counters_are_a_scan_then_rewritten(
    damage: str, crawled: Path, tmp_path: Path, capsys: Capsys
) -> None:
    data = tmp_path / "c"
    shutil.copytree(crawled, data)
    path = data / COUNTS_NAME
    doc = json.loads(path.read_text())
    if damage == "absent":
        path.unlink()
    elif damage == "a count that is text":
        path.write_text(json.dumps({**doc, "recorded": str(doc["recorded"])}))
    elif damage == "a stamp of the wrong shape":
        path.write_text(json.dumps({**doc, "stamp": {"main": [1], "pend": None}}))
    else:
        path.write_bytes(str(DAMAGE[damage]).encode("utf-8", "surrogateescape"))
    capsys.readouterr()
    assert main(["status", str(data)]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and err == ""
    why = "no counters" if damage == "absent" else "the counters file is damaged"
    lines = [ln for ln in out.splitlines() if ln.startswith("  counted by reading every")]
    assert len(lines) == 1 and lines[0].startswith(f"  counted by reading every record: {why}")
    # that scan, of a crawl no run holds, wrote them anew: the next status reads them
    assert json.loads(path.read_text()) == doc
    from_counters(data, capsys)


def test_counters_behind_the_stores_are_a_scan(crawled: Path, tmp_path: Path,
                                               capsys: Capsys) -> None:
    """A store written by something else than the committer (kvstore's own CLI, as any
    tool would): the stamp no longer matches, so the counters are not believed."""
    data = tmp_path / "c"
    shutil.copytree(crawled, data)
    before = status(data, capsys)
    with kvstore.open(data / "main", readonly=True) as main_db:
        key = next(iter(main_db)).hex()
    assert kvstore_main(["delete", str(data / "main"), key]) == 0
    info = status(data, capsys)
    assert info["counts_from"] == "scan" and "behind the stores" in info["counts_why"]
    assert info["recorded"] == before["recorded"] - 1
    from_counters(data, capsys)  # the scan rewrote them


def test_the_next_run_mends_counters_whose_pend_db_moved(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys
) -> None:
    """A kill -9 between a commit's bulks (or tombstones) and its counters leaves MainDB as
    counted and PendDB moved on: status counts by reading, and the next open of the
    frontier takes PendDB's numbers from its rebuild and keeps the counters again."""
    web = make_testweb(pages=200, hosts=3, seed=4, crawl_delay=0.0)
    data = tmp_path / "c"
    run_crawl(web, data, max_pages=30)
    path = data / COUNTS_NAME
    doc = json.loads(path.read_text())
    assert doc["pending"] > 0
    path.write_text(json.dumps({**doc, "pending": 1, "pending_bulks": 1,
                                "stamp": {**doc["stamp"], "pend": [1, 24, 24]}}))
    assert status(data, capsys)["counts_from"] == "scan"
    path.write_text(json.dumps({**doc, "pending": 1, "pending_bulks": 1,
                                "stamp": {**doc["stamp"], "pend": [1, 24, 24]}}))
    Frontier(str(data)).close()
    assert json.loads(path.read_text()) == doc
    from_counters(data, capsys)
    main_moved = {**doc, "recorded": 1, "stamp": {**doc["stamp"], "main": [1, 24, 24]}}
    path.write_text(json.dumps(main_moved))  # MainDB not as counted: recounted (below)
    Frontier(str(data)).close()
    assert json.loads(path.read_text()) == doc


def test_counters_behind_main_db_are_recounted_at_open_from_the_outcome_log(
    crawled: Path, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a kill -9 between a commit's MainDB flush and its counters leaves: the next
    open recounts MainDB's part from the outcome log's standing rows and the heads of
    the records the log does not stand for, so status is exact from that run on."""
    data = tmp_path / "c"
    shutil.copytree(crawled, data)
    path = data / COUNTS_NAME
    doc = json.loads(path.read_text())
    stale = {**doc, "outcomes": {"200": 1}, "recorded": 1, "fetched": 1,
             "stamp": {**doc["stamp"], "main": [1, 24, 24]}}
    path.write_text(json.dumps(stale))
    Frontier(str(data)).close()
    assert json.loads(path.read_text()) == doc  # from the log alone
    log_file = data / OUTCOMES_NAME
    rows = log_file.stat().st_size // 48
    with open(log_file, "r+b") as f:
        f.truncate(rows // 2 * 48)  # half the records now have no standing row
    path.write_text(json.dumps(stale))
    Frontier(str(data)).close()
    assert json.loads(path.read_text()) == doc  # and their heads
    from_counters(data, capsys)
    monkeypatch.setattr(tally, "RECOUNT_HEADS", rows // 4)  # too many heads to read
    path.write_text(json.dumps(stale))
    Frontier(str(data)).close()
    assert json.loads(path.read_text()) == stale  # none kept this run
    assert status(data, capsys)["counts_from"] == "scan"


def test_retry_keeps_the_counters_and_so_does_the_resume(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys
) -> None:
    """A crawl that cannot check the TLS host's certificate records ``tls`` failures;
    retry deletes those records and re-queues their URLs (updating the counters), and
    the resume with the CA fetches them."""
    web = make_testweb(pages=80, hosts=3, seed=1, crawl_delay=0.0, tls_hosts=(2,))
    data = tmp_path / "c"
    run_crawl(web, data, ca_bundle=None)
    first = from_counters(data, capsys)
    assert first["classes"].get("tls") or first["outcomes"].get("tls")
    capsys.readouterr()
    assert main(["retry", str(data), "--reason", "tls"]) == 0
    after = from_counters(data, capsys)
    assert after["pending"] > 0 and after["recorded"] < first["recorded"]
    assert not any(k.endswith("tls") for k in after["outcomes"])
    assert run_crawl(web, data).complete  # type: ignore[attr-defined]
    done = from_counters(data, capsys)
    assert done["pending"] == 0 and done["recorded"] > first["recorded"] - 1


def flapping(path: str, hits: list[Hit]) -> Answer:
    """A page that is there, then gone, then there again...: each revisit changes its
    outcome (200, 404, 200...), so each record replaces one of another outcome."""
    if path in META_PATHS:
        return 404, [], b""
    n = sum(1 for h in hits if h.path == path)
    if n % 2:
        return 404, [("Content-Type", "text/html")], b"<html><body>gone</body></html>"
    return 200, [("Content-Type", "text/html")], b"<html><body>here</body></html>"


def test_revisits_move_each_count_from_the_old_outcome_to_the_new(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys
) -> None:
    web = make_testweb(pages=6, hosts=1, seed=2, crawl_delay=0.0)
    with LocalServer(flapping) as local:
        engine = Engine(config_for(web, tmp_path, revisit_after=0.5, per_host=2))
        engine.add_seeds([web.seed_url, local.url("/"), local.url("/b")])
        runner = threading.Thread(target=engine.run)
        runner.start()
        try:
            wait_for(lambda: sum(1 for h in local.hits if h.path == "/b") >= 4, None,
                     "three revisits", timeout=60)
        finally:
            engine.stop()
            runner.join(60)
        assert not runner.is_alive()
    info = from_counters(tmp_path, capsys)
    assert info["recorded"] == sum(info["outcomes"].values())


def test_a_kill_9_is_the_recount_or_a_scan_then_counters_again(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys
) -> None:
    web = make_testweb(pages=600, hosts=6, seed=5, crawl_delay=0.0)
    data = tmp_path / "c"
    args = cli_args(web, data, "--threads", "16")
    proc = start_cli(args)
    try:
        wait_for_answers(web, proc, 150)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate(timeout=30)
    snap = read_status(str(data))
    assert snap is None or snap.get("running") is not False  # killed, not stopped
    looked = tmp_path / "looked"  # status on a copy: the resume must not need its scan
    shutil.copytree(data, looked)
    info = same_as_recount(looked, capsys)  # the counters if they were current, else a scan
    assert info["pending"] > 0
    from_counters(looked, capsys)  # a scan, if there was one, rewrote them
    proc = start_cli(args)
    try:
        wait_for(lambda: proc.poll() is not None, None, "the resumed crawl's end", 120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    done = from_counters(data, capsys)
    assert done["pending"] == 0 and done["recorded"] >= answered_pages(web) // 2


def test_a_sharded_crawl_keeps_counters_per_shard(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys
) -> None:
    web = make_testweb(pages=150, hosts=5, seed=2, crawl_delay=0.0)
    data = tmp_path / "c"
    proc = start_cli(cli_args(web, data, "--processes", "2"))
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-2000:]
    info = from_counters(data, capsys)
    assert info["shards"] == 2
    assert all((Path(s["data"]) / COUNTS_NAME).exists() for s in info["per_shard"])
    shards = [json.loads((Path(s["data"]) / COUNTS_NAME).read_text()) for s in info["per_shard"]]
    assert all(s["recorded"] > 0 for s in shards)
    assert sum(s["recorded"] for s in shards) == info["recorded"]
    assert [s["recorded"] for s in shards] == [s["recorded"] for s in info["per_shard"]]


def test_status_beside_a_running_crawl_writes_no_counters(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crawl resumed without counters and without the outcome log (an older
    version's), too big to recount at open, keeps none this run, so status counts by
    reading; beside the running crawl it must not write them."""
    web = make_testweb(pages=300, hosts=2, seed=7, crawl_delay=0.0)
    data = tmp_path / "c"
    run_crawl(web, data, max_pages=40)
    (data / COUNTS_NAME).unlink()
    (data / OUTCOMES_NAME).unlink()
    monkeypatch.setattr(tally, "RECOUNT_HEADS", 10)  # fewer than the 40 records
    engine = Engine(config_for(web, data, delay=0.3, per_host=1, status_interval=0.2))
    engine.add_seeds([web.seed_url])
    runner = threading.Thread(target=engine.run)
    runner.start()
    try:
        wait_for(lambda: bool((read_status(str(data)) or {}).get("running")), None,
                 "the resumed run's status.json")
        goal = answered_pages(web) + 2
        wait_for(lambda: answered_pages(web) >= goal, None, "2 more answers")
        info = status(data, capsys)
        assert info["running"] and info["counts_from"] == "scan"
        assert not (data / COUNTS_NAME).exists()
    finally:
        engine.stop()
        runner.join(60)
    assert not runner.is_alive()
    assert not (data / COUNTS_NAME).exists()  # the run kept none either
    assert status(data, capsys)["counts_from"] == "scan"  # stopped now: this scan keeps them
    from_counters(data, capsys)


@pytest.mark.parametrize("torn", ["key", "val", "both"])
def test_counters_counted_around_a_torn_tail_hold_after_the_open_cuts_it(
    torn: str, crawled: Path, tmp_path: Path, capsys: Capsys
) -> None:
    """A kill -9 in the middle of MainDB's append leaves a torn tail: status's read-only
    scan leaves it out and rewrites the counters; the next run's writable open cuts it
    (the files shrink to what was counted), and must keep those counters all run."""
    data = tmp_path / "c"
    shutil.copytree(crawled, data)
    key_file = next(p for p in (data / "main").iterdir() if p.name.endswith(".key"))
    val_file = key_file.with_suffix(".val")
    if torn in ("val", "both"):
        with open(val_file, "ab") as f:
            f.write(b"\x02" * 100)  # a value whose KEY record was never written
    if torn in ("key", "both"):
        with open(key_file, "ab") as f:
            f.write(b"\x01" * 10)  # a partial KEY record
    sizes = key_file.stat().st_size, val_file.stat().st_size
    info = status(data, capsys)
    assert info["counts_from"] == "scan" and "behind the stores" in info["counts_why"]
    from_counters(data, capsys)  # the scan rewrote them, the tail left out
    Frontier(str(data)).close()  # cuts the tail
    assert (key_file.stat().st_size, val_file.stat().st_size) < sizes
    from_counters(data, capsys)


@pytest.mark.parametrize("batch", [2, 1 << 16])
def test_a_scan_counts_a_pending_url_once_and_none_with_a_record(
    crawled: Path, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch,
    batch: int,
) -> None:
    from crawler.read import counting
    from crawler.state.pages import Pending, decode_page, encode_bulk

    data = tmp_path / "crawl"
    shutil.copytree(crawled, data)
    with kvstore.open(str(data / "main"), readonly=True) as db:
        recorded = decode_page(db[next(iter(db))], with_body=False).url
    new_a, new_b = "http://elsewhere.test/a", "http://elsewhere.test/b"
    with kvstore.open(str(data / "pend")) as pend:  # as a requeue or a crash may leave them
        before = len(pend)
        for i, urls in enumerate([[recorded, new_a], [new_a, new_b, new_a], [recorded]]):
            pend[(10**9 + i).to_bytes(16, "big")] = encode_bulk([Pending(u) for u in urls])
    monkeypatch.setattr(counting, "_PENDING_BATCH", batch)  # lookups across batches too
    info = status(data, capsys, "--recount")
    assert info["pending_bulks"] == before + 3
    assert info["pending"] == 2  # new_a and new_b; the recorded URL is not pending


def test_a_scan_of_the_pending_urls_holds_their_fingerprints_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan tells a pending URL seen twice by its 8-byte fingerprint, as PendSet
    does: ~19 B a URL at its peak (the fingerprints, the sort's marks), where a KeySet
    of the 16-byte keys held ~30-40 (1.7 GB at 27.6M pending)."""
    import tracemalloc

    from crawler.read import counting
    from crawler.state.pages import Pending, encode_bulk

    n = 300_000
    with kvstore.open(str(tmp_path / "pend")) as pend:
        for b in range(n // 100):
            urls = [f"http://h{b % 97}.test/p{b}-{i}" for i in range(100)]
            pend[b.to_bytes(16, "big")] = encode_bulk([Pending(u) for u in urls])
        pend[n.to_bytes(16, "big")] = encode_bulk([Pending("http://h0.test/p0-0")])
    monkeypatch.setattr(counting, "_PENDING_BATCH", 4096)
    tracemalloc.start()
    try:
        bulks, pending = counting._pending(str(tmp_path), None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (bulks, pending) == (n // 100 + 1, n)
    assert peak / n < 22, f"{peak / n:.1f} B a pending URL"
