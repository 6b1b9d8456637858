"""``crawler compact``: MainDB and PendDB rewritten without their dead records, by the
command on a stopped crawl and by the crawl itself while it runs, nothing else changed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import (
    REPO,
    cli_args,
    fetched_urls,
    page_refetches,
    records,
    run_crawl,
    shard_paths,
    start_cli,
    wait_for_answers,
)

import kvstore
from crawler.cli import main
from crawler.state import compaction
from crawler.state.retry import Selection, requeue
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
Capsys = pytest.CaptureFixture[str]


def contents(data: Path) -> dict[bytes, bytes]:
    """Every live MainDB record of every shard, key -> value (bodies included)."""
    out: dict[bytes, bytes] = {}
    for shard in shard_paths(data):
        with kvstore.open(shard / "main", readonly=True) as main:
            out.update((k, main[k]) for k in main)
    return out


def generation(store: Path) -> int:
    found = kvstore.stamp(str(store))
    assert found is not None
    return found[0]


def status(data: Path, capsys: Capsys, *flags: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["status", str(data), "--json", *flags]) == 0
    info: dict[str, Any] = json.loads(capsys.readouterr().out)
    return info


def test_a_stopped_crawl_is_compacted_here_and_keeps_every_live_record(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys
) -> None:
    web = make_testweb(pages=120, hosts=3, seed=7, crawl_delay=0.0)
    data = tmp_path / "c"
    assert run_crawl(web, data).complete  # type: ignore[attr-defined]
    capsys.readouterr()
    assert main(["retry", str(data), "--status", "404"]) == 0  # deletes the 404 records
    kept = contents(data)
    before = kvstore.stamp(str(data / "main"))
    assert before is not None and status(data, capsys)["counts_from"] == "counters"
    capsys.readouterr()
    assert main(["compact", str(data)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and re.fullmatch(
        rf"compact {data}: main [\d.,]+ MB -> [\d.,]+ MB in [\d.]+ s, pend [\d.,]+ MB -> "
        r"[\d.,]+ MB in [\d.]+ s \(here\)\n", out), out
    after = kvstore.stamp(str(data / "main"))
    assert after is not None and after[0] == before[0] + 1
    assert after[1] < before[1] and after[2] < before[2]  # tombstones and dead values gone
    assert contents(data) == kept
    fast = status(data, capsys)
    assert fast["counts_from"] == "counters"  # stamped again: no scan needed
    slow = status(data, capsys, "--recount")
    assert {k: v for k, v in fast.items() if k != "counts_from"} == {
        k: v for k, v in slow.items() if k != "counts_from"}
    assert not (data / compaction.REQUEST_NAME).exists()


def test_a_running_crawl_compacts_when_asked_and_ends_at_the_oracle(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """Two shards, each asked while it crawls: each compacts on its own syncer thread,
    answers, and crawls on; the crawl ends with every page once."""
    web = make_testweb(pages=400, hosts=4, seed=11, crawl_delay=0.0)
    data = tmp_path / "c"
    proc = start_cli(cli_args(web, data, "--processes", "2", "--delay", "0.01",
                              "--per-host", "1", "--sync-interval", "0.2"))
    try:
        wait_for_answers(web, proc, 40)
        done = subprocess.run([sys.executable, "-m", "crawler", "compact", str(data)],
                              cwd=REPO, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        still = proc.poll() is None
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert still, "the crawl ended before the compactions: make the test web bigger"
    lines = done.stdout.splitlines()
    asked = [ln for ln in lines if ln.endswith(": asked the running crawl")]
    answered = [ln for ln in lines if "(by the running crawl)" in ln]
    assert len(asked) == len(answered) == 2, done.stdout
    for shard in shard_paths(data):
        assert generation(shard / "main") == 2 and generation(shard / "pend") >= 2
        result = compaction.read_result(str(shard))
        assert result is not None and "error" not in result and result["main"]["seconds"] >= 0
        assert not compaction.asked(str(shard))
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)
    assert not page_refetches(web)
    # the outcome log was carried over each new generation: a dry run reads no record
    # but the robots_* ones (their robots.txt origin is in the URL)
    dry = requeue(str(data), Selection(), dry_run=True)
    robots = sum(n for k, n in dry.counts.items() if k.startswith("robots_"))
    assert dry.from_log == len(records(data)) and dry.heads_read == robots


def test_a_request_the_run_did_not_reach_is_done_by_the_next_run(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=60, hosts=2, seed=3, crawl_delay=0.0)
    data = tmp_path / "c"
    run_crawl(web, data, max_pages=20)
    compaction.request(str(data))  # as a run that stopped before its upkeep leaves it
    assert compaction.asked(str(data))
    assert run_crawl(web, data, sync_interval=0.05).complete  # type: ignore[attr-defined]
    assert not compaction.asked(str(data))
    result = compaction.read_result(str(data))
    assert result is not None and "main" in result and "pend" in result
    assert generation(data / "main") == 2
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)


def test_the_command_does_a_request_left_by_a_run_that_stopped(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys
) -> None:
    """A request outstanding on a shard no run holds (the run stopped first): the
    command compacts the shard itself and answers the request."""
    web = make_testweb(pages=40, hosts=2, seed=4, crawl_delay=0.0)
    data = tmp_path / "c"
    run_crawl(web, data, max_pages=10)
    compaction.request(str(data))
    waiter = threading.Thread(target=main, args=(["compact", str(data)],))
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive()
    assert "(here)" in capsys.readouterr().out
    assert not compaction.asked(str(data)) and compaction.read_result(str(data)) is not None
    assert generation(data / "main") == 2


def test_compact_of_no_crawl_is_one_line(tmp_path: Path, capsys: Capsys) -> None:
    assert main(["compact", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("crawler: error: ") and "nothing" in err[0]
    assert not (tmp_path / "nothing").exists()


def test_a_damaged_maindb_is_left_as_it_was_and_named(
    make_testweb: MakeWeb, tmp_path: Path, capsys: Capsys
) -> None:
    """Issue 42: one flipped bit in MainDB's KEY file, far from its end (the index a
    clean close saved is still trusted), made compaction drop a page; now it stops on
    that store with one line naming repair, and the crawl's files are as they were."""
    web = make_testweb(pages=300, hosts=2, seed=11, crawl_delay=0.0)
    data = tmp_path / "c"
    assert run_crawl(web, data).complete  # type: ignore[attr-defined]
    kept = contents(data)
    store = data / "main"
    (key_file,) = store.glob("data-*.key")
    raw = bytearray(key_file.read_bytes())
    assert len(raw) > 24 + 8192  # the saved index's stamp covers the last 4 KiB only
    with kvstore.open(store, readonly=True) as main_db:  # the first live KEY record
        first = next(i for i in range(100) if main_db.versions_of(
            [bytes(raw[24 + 24 * i : 40 + 24 * i])])[1][0] == int.from_bytes(
            raw[40 + 24 * i : 48 + 24 * i], "little", signed=True))
    raw[24 + 24 * first + 3] ^= 0x08  # a key byte
    key_file.write_bytes(bytes(raw))
    files = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["compact", str(data)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert re.fullmatch(rf"compact {data}: .*compaction stopped, nothing changed.*"
                        rf"python -m kvstore repair {store}.*\n", out), out
    assert {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()} == files
    assert contents(data) == kept


def test_a_full_disk_is_one_line_and_changes_nothing(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """Issue 42: `crawler compact` on a full disk let kvstore's `BufferError: cannot
    close exported pointers exist` through. A file size limit plays the full disk
    (writes past it fail with EFBIG, SIGXFSZ ignored) in the command's own process."""
    import resource
    import signal

    web = make_testweb(pages=300, hosts=2, seed=5, crawl_delay=0.0)
    data = tmp_path / "c"
    assert run_crawl(web, data).complete  # type: ignore[attr-defined]
    kept = contents(data)
    (val_file,) = (data / "main").glob("data-*.val")
    limit = val_file.stat().st_size // 2
    before = {p.name: p.read_bytes() for p in (data / "main").glob("data-*")}

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run([sys.executable, "-m", "crawler", "compact", str(data)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          preexec_fn=small_disk)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "BufferError" not in done.stderr
    assert re.fullmatch(rf"compact {data}: nothing done \(here\); not finished: main: "
                        r".*File too large\n", done.stdout), done.stdout
    assert {p.name: p.read_bytes() for p in (data / "main").glob("data-*")
            if not p.name.endswith(".idx")} == {
        n: b for n, b in before.items() if not n.endswith(".idx")}
    assert contents(data) == kept
