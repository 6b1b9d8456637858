"""The outcome log (crawler.state.outcomelog): dry runs select from it without reading a
record, and whatever it lacks or says wrongly is read around, never believed."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_retry import TLSCrawl, crawl, start_args

import kvstore
from crawler.state.outcomelog import DTYPE, OUTCOMES_NAME, VOCABULARY, host_prefix, standing
from crawler.state.pages import decode_page
from crawler.state.recrawl import RecrawlSelection
from crawler.state.retry import RetryReport, Selection, requeue
from crawler.web.urls import host_of
from tools.testweb import SiteConfig, TestWeb, fault


@pytest.fixture(scope="module")
def failures_crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSCrawl]:
    """As test_retry's: tls, bad_host:tls, dns_nxdomain, robots_disallowed and 200s."""
    config = SiteConfig(pages=40, hosts=3, seed=5, crawl_delay=0.0)
    with TestWeb(config, faults=[fault("nxdomain")]) as web:
        data = tmp_path_factory.mktemp("outcomes") / "crawl"
        outcomes = crawl(start_args(web, data, "--allow-private-ips"))
        yield web, data, outcomes


@pytest.fixture
def data(failures_crawl: TLSCrawl, tmp_path: Path) -> Path:
    copy = tmp_path / "crawl"
    shutil.copytree(failures_crawl[1], copy)
    return copy


def without_log(data: Path, tmp_path: Path) -> Path:
    """A copy of the crawl without its outcome log: every dry run reads every head."""
    bare = tmp_path / "bare"
    shutil.copytree(data, bare)
    (bare / OUTCOMES_NAME).unlink()
    return bare


def said(report: RetryReport) -> dict[str, Any]:
    """What a dry run reports, apart from how it found out."""
    out = dataclasses.asdict(report)
    del out["from_log"], out["heads_read"]
    return out


SELECTIONS = {
    "every failure": Selection(),
    "tls": Selection(reasons=("tls",)),
    "bad_host": Selection(reasons=("bad_host",)),
    "robots": Selection(reasons=("robots",)),
    "2xx": Selection(statuses=("2xx",)),
    "status 0": Selection(statuses=("0",)),
    "recrawl all": RecrawlSelection(older_than=0),
    "recrawl h1": RecrawlSelection(older_than=0, hosts=("H1.test.",)),
    "recrawl 2xx": RecrawlSelection(older_than=0, statuses=("2xx",)),
    "recrawl none": RecrawlSelection(older_than=3600),
}


def test_every_record_of_a_crawl_has_a_standing_row_that_says_what_it_does(data: Path) -> None:
    with kvstore.open(data / "main", readonly=True) as main:
        covered = kvstore.KeySet()
        rows = {k.tobytes(): f for keys, facts in standing(str(data), main, covered)
                for k, f in zip(keys, facts, strict=True)}
        assert len(rows) == len(main) == len(covered) > 40
        for key in main:
            page = decode_page(main[key], with_body=False)
            row = rows[key]
            assert (int(row["status"]), VOCABULARY[row["reason"]],
                    VOCABULARY[row["truncated"]], float(row["fetched"]), bytes(row["host"])) == (
                page.status, page.reason, page.truncated, page.fetched_at,
                host_prefix(host_of(page.url)))


@pytest.mark.parametrize("name", sorted(SELECTIONS))
def test_a_dry_run_from_the_log_reads_no_record_and_says_what_reading_every_head_says(
    name: str, data: Path, tmp_path: Path
) -> None:
    selection = SELECTIONS[name]
    bare = without_log(data, tmp_path)
    fast = requeue(str(data), selection, dry_run=True)
    slow = requeue(str(bare), selection, dry_run=True)
    assert said(fast) == said(slow)
    with kvstore.open(data / "main", readonly=True) as main:
        live = len(main)
    assert (slow.from_log, slow.heads_read) == (0, live)
    # robots_* records are read for their robots.txt origin; nothing else is
    robots = sum(n for k, n in fast.counts.items() if k.startswith("robots_"))
    assert (fast.from_log, fast.heads_read) == (live, robots)
    if name == "robots":
        assert robots > 0 and fast.robots_cleared > 0
    if name in ("every failure", "tls"):
        assert fast.hosts_cleared > 0


def log_rows(data: Path) -> np.ndarray:
    return np.fromfile(data / OUTCOMES_NAME, dtype=DTYPE)


def test_a_cut_log_a_log_written_twice_and_deleted_records_are_read_around(
    data: Path, tmp_path: Path
) -> None:
    rows = log_rows(data)
    # a kill cut the last three records and half of one more; then the log was appended
    # again whole (every row twice), and a real retry deleted the dns_nxdomain record
    cut = np.concatenate([rows[:-4], rows[:-4]]).tobytes() + rows[-4].tobytes()[:20]
    (data / OUTCOMES_NAME).write_bytes(cut)
    done = requeue(str(data), Selection(reasons=("dns_nxdomain",)))
    assert done.counts == {"dns_nxdomain": 1}
    bare = without_log(data, tmp_path)
    for selection in SELECTIONS.values():
        fast = requeue(str(data), selection, dry_run=True)
        assert said(fast) == said(requeue(str(bare), selection, dry_run=True))
        robots = sum(n for k, n in fast.counts.items() if k.startswith("robots_"))
        assert fast.heads_read - robots <= 4  # the cut rows' records, unless taken from the log


def test_a_compaction_is_read_around_and_a_real_run_logs_what_it_read(
    data: Path, tmp_path: Path
) -> None:
    with kvstore.open(data / "main") as main:
        main.compact()  # a new generation: no row stands
        live = len(main)
    before = requeue(str(data), Selection(), dry_run=True)
    assert (before.from_log, before.heads_read) == (0, live)
    done = requeue(str(data), Selection(reasons=("dns_nxdomain",)))  # reads every head
    assert done.counts == {"dns_nxdomain": 1} and done.heads_read == live
    after = requeue(str(data), Selection(), dry_run=True)
    assert (after.from_log, after.heads_read) == (live - 1, 0)
    assert said(after) == said(requeue(str(without_log(data, tmp_path)), Selection(),
                                       dry_run=True))


def test_every_reason_a_record_can_carry_has_a_code() -> None:
    """A reason without a code is read instead of selected from the log: a new reason
    must be appended to VOCABULARY (codes are on disk: never reordered)."""
    from crawler import outcomes

    reasons = {v for k, v in vars(outcomes).items()
               if k.isupper() and isinstance(v, str) and not v.endswith(":")
               and not k.startswith("RENDER_")}
    assert reasons - {"ok"} <= set(VOCABULARY)
    assert {outcomes.bad_host(r) for r in outcomes.HOST_FAILURES | set(
        outcomes.DNS_REASONS.values())} <= set(VOCABULARY)
    assert len(set(VOCABULARY)) == len(VOCABULARY) and VOCABULARY[0] == ""


def test_the_codes_on_disk_never_move() -> None:
    """A code is a position in VOCABULARY, written in outcomes.bin: a crawl directory
    written by an earlier release must read the same words. (Built as the reasons then
    their bad_host forms, a new reason appended to the first part would have moved
    every bad_host code: new words go at the end of crawler.outcomes.LOGGED.)"""
    on_disk = (
        "", "private_ip", "dns_nxdomain", "dns_nodata", "dns_servfail", "dns_timeout",
        "dns_error", "connect_refused", "connect_timeout", "connect_error", "tls",
        "read_timeout", "total_timeout", "reset", "protocol", "robots_unavailable",
        "robots_disallowed", "host_page_limit", "redirect_limit", "not_html", "bad_url",
        "internal_error", "too_large", "decompression_bomb", "aborted",
    )
    assert VOCABULARY[: len(on_disk)] == on_disk
    assert VOCABULARY[len(on_disk) : 2 * len(on_disk) - 1] == tuple(
        "bad_host:" + word for word in on_disk[1:])


def test_a_real_run_reads_every_record_the_log_does_not_stand_for(
    data: Path, tmp_path: Path
) -> None:
    """Records it takes from the log and deletes must not hide the ones it must read."""
    rows = log_rows(data)
    (data / OUTCOMES_NAME).write_bytes(rows[:-3].tobytes())  # three records not logged
    bare = without_log(data, tmp_path)
    selection = Selection(reasons=("bad_host", "robots"))
    # chunks of 2: records are deleted while the walk goes on, as at any real size
    done, slow = requeue(str(data), selection, chunk=2), requeue(str(bare), selection)
    assert said(done) == said(slow)
    assert sum(done.counts.values()) > 3 and done.heads_read >= 3
    after = requeue(str(data), Selection(), dry_run=True)  # the real run logged the three
    robots = sum(n for k, n in after.counts.items() if k.startswith("robots_"))
    assert after.heads_read == robots


def test_crawler_compact_carries_the_log_over_the_new_generation(data: Path) -> None:
    """``crawler compact`` (a new MainDB generation, every version new) rewrites the log
    with each row's new version: the next dry run still reads no record."""
    from crawler.cli import main as crawler_main

    before = requeue(str(data), Selection(), dry_run=True)
    with kvstore.open(data / "main", readonly=True) as main:
        live, generation = len(main), main.versions()[0]
    assert crawler_main(["compact", str(data)]) == 0
    with kvstore.open(data / "main", readonly=True) as main:
        assert main.versions()[0] == generation + 1
    after = requeue(str(data), Selection(), dry_run=True)
    assert said(after) == said(before)
    robots = sum(n for k, n in after.counts.items() if k.startswith("robots_"))
    assert (after.from_log, after.heads_read) == (live, robots)
    assert len(log_rows(data)) == live  # rewritten: one row a record, no dead rows
    assert not list(data.glob("*.tmp"))


def test_the_files_of_a_compaction_killed_midway_go_at_the_next_open(data: Path) -> None:
    """A kill between a compaction's carry and its remap leaves the carried rows (and
    maybe a part-written log) beside the log, each as big as it: the next writer's open
    removes them and leaves the log itself as it was."""
    from crawler.state.frontier import Frontier

    log_before = (data / OUTCOMES_NAME).read_bytes()
    stale = [data / (OUTCOMES_NAME + ".carry.tmp"), data / (OUTCOMES_NAME + ".remap.tmp")]
    for path in stale:
        path.write_bytes(log_before[: len(log_before) // 2])
    Frontier(str(data)).close()
    assert [p for p in stale if p.exists()] == []
    assert (data / OUTCOMES_NAME).read_bytes() == log_before


def test_a_remap_keeps_the_last_row_of_a_key_logged_during_the_compaction(data: Path) -> None:
    """A record rewritten while the compaction ran (logged past the carried size): its
    carried row describes the old record and must not stand for the new one."""
    from crawler.state.outcomelog import OutcomeLog, carry
    from crawler.state.pages import PageRecord

    with kvstore.open(data / "main") as main:
        carried, size = carry(str(data), main)
        key = next(iter(main))
        old = decode_page(main[key], with_body=False)
        main.compact()
        new = dataclasses.replace(old, status=418, reason="", truncated="")
        assert isinstance(new, PageRecord)
        main[key] = main[key]  # a rewrite of the record: a new version
        outcomes = OutcomeLog(str(data))
        outcomes.note(main, [key], [new])  # what the committer logs with a put
        outcomes.write()
        kept = outcomes.remap(main, carried, size)
        outcomes.close()
        live = len(main)
        covered = kvstore.KeySet()
        rows = {k.tobytes(): f for keys, facts in standing(str(data), main, covered)
                for k, f in zip(keys, facts, strict=True)}
    assert kept == live == len(rows)
    assert int(rows[key]["status"]) == 418  # the row logged since, not the carried one
