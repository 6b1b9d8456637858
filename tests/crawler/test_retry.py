"""``python -m crawler retry``: recorded failures re-queued, fetched by the next start; the
words of crawler.run.hints. Real crawls of the test web through the real CLI."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from crawl_helpers import (
    REPO,
    bad_hosts,
    read_lines,
    records,
    run_cli,
    shard_paths,
    start_cli,
    tries,
    wait_for,
)

import kvstore
from crawler.cli import main
from crawler.run.hints import HINTS, REASONS, explain, family, resume_flags
from crawler.run.shard import socket_paths
from crawler.state.admission import keys_array
from crawler.state.frontier import Frontier
from crawler.state.pages import PageRecord, Pending, decode_bulk, encode_bulk, encode_page
from crawler.state.retry import Selection, _Shard, is_failure
from crawler.state.robotsstore import store_key
from crawler.state.shards import owner
from crawler.web.urls import host_key, host_of, parse, url_key
from kvstore._format import HEADER_SIZE
from tools.testweb import SiteConfig, TestWeb, fault

Web = Callable[..., TestWeb]
TLSCrawl = tuple[TestWeb, Path, dict[str, int]]


def start_args(web: TestWeb, data: Path, *extra: str, seeds: tuple[str, ...] = ()) -> list[str]:
    """``crawler start`` on ``web`` with neither --allow-private-ips nor --ca-bundle
    (``extra`` adds them): the failures these tests retry."""
    host, port = web.nameserver
    return [sys.executable, "-m", "crawler", "start", *(seeds or (web.seed_url,)),
            "--data", str(data), "--nameserver", f"{host}:{port}", "--broad", "--delay", "0",
            "--threads", "8", "--status-interval", "3600", "--timeout", "10", "--processes", "1",
            *extra]


def crawl(args: list[str]) -> dict[str, int]:
    """Run a crawl to its end; the outcome counts of its summary line (a crawl whose
    every URL failed exits 1 and says so)."""
    done = run_cli(args)
    nothing = "crawler: nothing was crawled: " in done.stderr
    assert done.returncode == (1 if nothing else 0), done.stderr
    line = next(s for s in done.stdout.splitlines() if s.startswith("crawl complete: "))
    outcomes: dict[str, int] = json.loads(line.partition(": ")[2])["outcomes"]
    return outcomes


def retry(data: Path, *args: str) -> tuple[int, str, str]:
    done = run_cli([sys.executable, "-m", "crawler", "retry", str(data), *args])
    return done.returncode, done.stdout, done.stderr


def counts_of(out: str) -> dict[str, int]:
    """The per-reason lines of retry's output (``  KEY  N``)."""
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    return {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[1].isdigit()}


def store_bytes(data: Path) -> dict[str, bytes]:
    """Every file of a crawl directory, by relative path."""
    return {str(p.relative_to(data)): p.read_bytes() for p in sorted(data.rglob("*"))
            if p.is_file()}


def live_bulk_urls(data: Path) -> Counter[str]:
    """URLs in the live PendDB bulks of every shard, with how many bulks hold each."""
    out: Counter[str] = Counter()
    for shard in shard_paths(data):
        if (shard / "pend").is_dir():
            with kvstore.open(shard / "pend", readonly=True) as pend:
                for bk in pend:
                    out.update(e.url for e in decode_bulk(pend[bk]))
    return out


def outcome(rec: PageRecord) -> str:
    return rec.reason or rec.truncated or str(rec.status)


# -- the case: a seed refused for its private address --------------------------


def test_a_private_ip_seed_is_fetched_after_retry_and_the_flag(
    make_testweb: Web, tmp_path: Path
) -> None:
    web = make_testweb(pages=12, hosts=1, seed=2, crawl_delay=0.0)
    data = tmp_path / "crawl"
    first = crawl(start_args(web, data))
    assert first == {"private_ip": 1}
    lines = explain(first, str(data))
    assert len(lines) == 1 and lines[0].startswith("private_ip (1 URL): ")
    assert "--allow-private-ips" in lines[0]
    assert f"`python -m crawler retry {data} --reason private_ip`" in lines[0]

    # The flag alone fetches nothing: the outcome is recorded (what the issue saw).
    assert crawl(start_args(web, data, "--allow-private-ips")) == {}
    assert web.log.records() == []

    rc, out, err = retry(data)
    assert rc == 0, err
    assert out.splitlines()[0] == f"retry {data}: re-queued 1 failure, 1 bad host cleared"
    assert counts_of(out) == {"private_ip": 1}
    assert f"resume: python -m crawler start --data {data} --allow-private-ips" in out
    assert web.seed_url not in records(data) and live_bulk_urls(data) == {web.seed_url: 1}
    assert bad_hosts(data) == {}

    after = crawl(start_args(web, data, "--allow-private-ips"))
    assert records(data)[web.seed_url].status == 200
    assert len(tries(web, web.seed_url)) == 1
    assert after.get("200", 0) >= 12 - 1 and "private_ip" not in after
    assert {r.url for r in web.log.records()} >= web.oracle.crawl().fetched


# -- a crawl with several kinds of failure: only the selected ones go back ---------------


@pytest.fixture(scope="module")
def tls_crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSCrawl]:
    """h2.test is HTTPS and the crawl has no --ca-bundle: tls and bad_host:tls; nx.test
    does not resolve: dns_nxdomain; robots.txt forbids some pages. A stopped crawl that
    tests copy before changing it, and the outcomes of its summary line."""
    config = SiteConfig(pages=40, hosts=3, seed=5, crawl_delay=0.0)
    with TestWeb(config, faults=[fault("nxdomain")]) as web:
        data = tmp_path_factory.mktemp("tls") / "crawl"
        outcomes = crawl(start_args(web, data, "--allow-private-ips"))
        yield web, data, outcomes


def copy_of(crawl_dir: Path, tmp_path: Path) -> Path:
    data = tmp_path / "crawl"
    shutil.copytree(crawl_dir, data)
    return data


def test_only_the_selected_reasons_are_requeued_and_then_fetched(
    tls_crawl: TLSCrawl, tmp_path: Path
) -> None:
    web, pristine, _ = tls_crawl
    data = copy_of(pristine, tmp_path)
    before = records(data)
    kinds = Counter(outcome(r) for r in before.values())
    assert kinds["tls"] == 1 and kinds["bad_host:tls"] > 0 and kinds["dns_nxdomain"] == 1
    assert kinds["robots_disallowed"] > 0 and set(bad_hosts(data)) == {"h2.test", "nx.test"}
    chosen = {u for u, r in before.items() if outcome(r) in ("tls", "bad_host:tls")}

    rc, out, err = retry(data, "--reason", "tls")
    assert rc == 0, err
    assert counts_of(out) == {"tls": 1, "bad_host:tls": len(chosen) - 1}
    assert "--ca-bundle FILE" in out
    left = records(data)
    assert set(left) == set(before) - chosen
    assert all(left[u] == before[u] for u in left)  # the others untouched
    pending = live_bulk_urls(data)
    assert set(pending) == chosen and max(pending.values()) == 1
    assert all(before[u].depth == depth for u, depth in _bulk_depths(data).items())
    assert set(bad_hosts(data)) == {"nx.test"}  # only the re-queued hosts are cleared

    web.reset()
    after = crawl(start_args(web, data, "--allow-private-ips", "--ca-bundle", str(web.ca_file)))
    now = records(data)
    assert all(now[u].status > 0 and not now[u].reason for u in chosen)  # answered now
    assert now[web.url("h2.test", "/")].status == 200
    requested = {r.url for r in web.log.records() if r.path != "/robots.txt"}
    assert chosen <= requested
    assert not requested & (set(before) - chosen)  # nothing else was fetched again
    assert web.dns is not None and web.dns.queries("nx.test") == []  # nor looked up
    assert "tls" not in after and "bad_host:tls" not in after


def kept_robots(data: Path) -> set[bytes]:
    """The keys of the robots.txt answers the crawl keeps (robots/)."""
    with kvstore.open(data / "robots", readonly=True) as store:
        return set(store)


def test_a_robots_retry_forgets_the_kept_robots_answers_that_refused(
    tls_crawl: TLSCrawl, tmp_path: Path
) -> None:
    web, pristine, _ = tls_crawl
    data = copy_of(pristine, tmp_path)
    before = records(data)
    refused = {u for u, r in before.items() if r.reason == "robots_disallowed"}
    origins = {parse(u).robots_key for u in refused}
    kept = kept_robots(data)
    assert origins and {store_key(o) for o in origins} < kept  # others are kept too
    rc, out, _ = retry(data, "--reason", "robots_disallowed", "--dry-run")
    assert rc == 0 and f"{len(origins)} kept robots.txt answer" in out and "to forget" in out
    assert kept_robots(data) == kept
    rc, out, err = retry(data, "--reason", "robots_disallowed")
    assert rc == 0, err
    assert f"{len(origins)} kept robots.txt answer" in out and "forgotten" in out
    assert kept_robots(data) == kept - {store_key(o) for o in origins}
    web.reset()
    crawl(start_args(web, data, "--allow-private-ips"))
    # their robots.txt is read again (the site may have changed it), and only theirs
    again = {r.host for r in web.log.records() if r.path == "/robots.txt"}
    assert again == {host_of(u) for u in refused}
    assert {u for u, r in records(data).items() if r.reason == "robots_disallowed"} == refused


def _bulk_depths(data: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with kvstore.open(data / "pend", readonly=True) as pend:
        for bk in pend:
            out.update((e.url, e.depth) for e in decode_bulk(pend[bk]))
    return out


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--reason", "dns_"], {"dns_nxdomain"}),  # a prefix
        (["--reason", "dns"], {"dns_nxdomain"}),
        (["--reason", "bad_host"], {"bad_host:tls"}),  # every URL of a bad host
        (["--reason", "bad_host:tls"], {"bad_host:tls"}),
        (["--reason", "tls,dns_nxdomain"], {"tls", "bad_host:tls", "dns_nxdomain"}),
        (["--reason", "tls", "--reason", "robots_disallowed"],
         {"tls", "bad_host:tls", "robots_disallowed"}),
        (["--status", "0"], {"tls", "bad_host:tls", "dns_nxdomain", "robots_disallowed"}),
        (["--status", "2xx"], {"200"}),
        ([], {"tls", "bad_host:tls", "dns_nxdomain"}),  # every failure: not robots_disallowed
    ],
)
def test_dry_run_counts_what_the_selection_takes_and_changes_nothing(
    tls_crawl: TLSCrawl, tmp_path: Path, args: list[str], want: set[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = copy_of(tls_crawl[1], tmp_path)
    kinds = Counter(outcome(r) for r in records(data).values())
    before = store_bytes(data)

    def retry_here(*extra: str) -> tuple[int, str, str]:  # the CLI in-process: 9 cases
        capsys.readouterr()
        rc = main(["retry", str(data), *extra])
        out, err = capsys.readouterr()
        return rc, out, err

    rc, out, err = retry_here("--dry-run", *args)
    assert rc == 0, err
    assert counts_of(out) == {k: kinds[k] for k in want}
    assert "would re-queue" in out.splitlines()[0] and "resume:" not in out
    assert store_bytes(data) == before  # not a byte changed, no file added

    rc, real, err = retry_here(*args)  # the real run does what the dry run said
    assert rc == 0, err
    assert counts_of(real) == counts_of(out)
    assert Counter(outcome(r) for r in records(data).values()) == kinds - Counter(counts_of(out))


def test_status_selection_and_nothing_to_retry(
    tls_crawl: TLSCrawl, tmp_path: Path
) -> None:
    data = copy_of(tls_crawl[1], tmp_path)
    rc, out, _ = retry(data, "--status", "5xx")
    assert (rc, out) == (0, f"retry {data}: no records to re-queue\n")
    rc, out, _ = retry(data, "--reason", "total_timeout")
    assert (rc, out) == (0, f"retry {data}: no records to re-queue\n")
    with kvstore.open(data / "main") as main:  # an HTTP error next to the crawl's records
        url = "http://h0.test/gone.html"
        main[url_key(url)] = encode_page(PageRecord(url, 410, 1.7e9, 3))
    for status in ("410", "4xx", "4XX"):
        rc, out, _ = retry(data, "--status", status, "--dry-run")
        assert counts_of(out) == {"410": 1}, status
    rc, out, _ = retry(data, "--status", "410")
    assert counts_of(out) == {"410": 1} and live_bulk_urls(data) == {url: 1}
    assert _bulk_depths(data) == {url: 3}
    rc, out, _ = retry(data, "--status", "410")  # already done: nothing twice
    assert out == f"retry {data}: no records to re-queue\n" and live_bulk_urls(data) == {url: 1}


# -- a running crawl is left alone ---------------------------------------------------------


@pytest.mark.parametrize("processes", [1, 2])
def test_retry_while_a_crawl_runs_refuses_in_one_line_and_changes_nothing(
    make_testweb: Web, tmp_path: Path, processes: int
) -> None:
    slow = fault("slow_first_byte", host="h1.test", prefix="/", delay=120.0)
    web = make_testweb(pages=10, hosts=2, seed=3, crawl_delay=0.0, faults=[slow])
    data = tmp_path / "crawl"
    procs = ["--processes", str(processes)]
    assert crawl(start_args(web, data, *procs)) == {"private_ip": 1}
    inboxes = [Path(p) for p in socket_paths(str(data), processes)] if processes > 1 else []
    for inbox in inboxes:
        inbox.unlink(missing_ok=True)  # a shard binds its inbox once its stores are open
    hanging = web.url("h1.test", "/")
    proc = start_cli(start_args(web, data, "--allow-private-ips", "--ca-bundle", str(web.ca_file),
                                "--timeout", "300", *procs, seeds=(hanging,)))
    errors = read_lines(proc.stderr)
    try:
        # The crawl is waiting for its one fetch: it writes nothing until the answer.
        wait_for(lambda: any(r.url == hanging and r.end is None for r in web.log.records()),
                 proc, "the slow fetch")
        # Its robots.txt answer is stored as that fetch begins, and the other shard, slow to
        # start on a busy machine, may still be opening: the snapshot waits for both.
        wait_for(lambda: any(p.stat().st_size > HEADER_SIZE for p in data.glob("**/robots/*.key")),
                 proc, "the robots.txt answer stored")
        wait_for(lambda: all(inbox.exists() for inbox in inboxes), proc, "every shard's inbox")
        before = {k: v for k, v in store_bytes(data).items() if not k.endswith("status.json")}
        rc, out, err = retry(data)
        assert rc == 1 and out == ""
        assert err.count("\n") == 1 and err.startswith(f"crawler: error: {data}")
        assert "a crawl is running on this data directory: stop it" in err
        rc, out, err = retry(data, "--dry-run")  # reading beside it is fine
        assert rc == 0 and counts_of(out) == {"private_ip": 1}, err
        after = {k: v for k, v in store_bytes(data).items() if not k.endswith("status.json")}
        assert after == before
    finally:
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: any("stopping" in line for line in errors) or proc.poll() is not None,
                 None, "the crawl to begin stopping")
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the second Ctrl-C: stop at once
        proc.wait(timeout=60)
        assert proc.stdout is not None
        proc.stdout.close()


# -- a sharded crawl: each shard re-queues its own ----------------------------------------


def test_a_sharded_crawl_requeues_each_failure_in_its_own_shard(
    make_testweb: Web, tmp_path: Path
) -> None:
    web = make_testweb(pages=16, hosts=4, seed=1, crawl_delay=0.0)
    hosts = [f"h{i}.test" for i in range(4)]
    seeds = tuple(web.url(h, "/") for h in hosts)
    assert {owner(h, 2) for h in hosts} == {0, 1}  # both shards have a seed
    data = tmp_path / "crawl"
    assert crawl(start_args(web, data, "--processes", "2", seeds=seeds)) == {"private_ip": 4}
    rc, out, err = retry(data, "--reason", "private_ip")
    assert rc == 0, err
    assert out.splitlines()[0] == (
        f"retry {data}: re-queued 4 records in 2 shards, 4 bad hosts cleared")
    for index, shard in enumerate(shard_paths(data)):
        with kvstore.open(shard / "pend", readonly=True) as pend:
            urls = [e.url for bk in pend for e in decode_bulk(pend[bk])]
        assert urls and all(owner(host_of(u), 2) == index for u in urls)
    assert records(data) == {} and bad_hosts(data) == {}
    crawl(start_args(web, data, "--processes", "2", "--allow-private-ips", "--ca-bundle",
                     str(web.ca_file), seeds=seeds))
    got = records(data)  # one record per URL across shards (records() checks it)
    assert all(got[s].status == 200 for s in seeds)
    assert all(len(tries(web, s)) == 1 for s in seeds)


# -- a kill -9 in the middle of a retry loses nothing ---------------------------------------


FAILURES = 40_000  # enough for several write rounds (crawler.state.retry.DEFAULT_CHUNK)


def _big_crawl(data: Path) -> tuple[set[bytes], dict[bytes, bytes], set[str], set[bytes]]:
    """A crawl directory of many failures over many hosts (in BadHosts), some pages and
    some URLs pending: (failed url_keys, page records by key, pending URLs, bad host keys)."""
    rng = random.Random(7)
    kinds = [(0, "tls"), (0, "bad_host:tls"), (0, "dns_nxdomain"), (404, ""), (500, ""),
             (0, "total_timeout")]
    failed, fine = {}, {}
    for i in range(FAILURES):
        url = f"http://f{i % 400}.test/p/{i}.html"
        status, reason = rng.choice(kinds)
        failed[url_key(url)] = encode_page(PageRecord(url, status, 1.7e9, i % 7, reason=reason))
    for i in range(3000):
        url = f"http://ok{i % 50}.test/p/{i}.html"
        fine[url_key(url)] = encode_page(PageRecord(url, 200, 1.7e9, 1, body=b"x" * 100))
    pending = [Pending(f"http://ok{i % 50}.test/next/{i}.html", 2) for i in range(2000)]
    with kvstore.open(data / "main") as main:
        main.put_many(list(failed) + list(fine), list(failed.values()) + list(fine.values()))
    with kvstore.open(data / "pend") as pend:
        keys = [i.to_bytes(16, "big") for i in range(0, 80)]
        pend.put_many(keys, [encode_bulk(pending[i * 25 : i * 25 + 25]) for i in range(80)])
    bad = {host_key(f"f{i}.test"): f"f{i}.test" for i in range(400)}
    with kvstore.open(data / "badhosts") as store:
        for k, host in bad.items():
            store[k] = json.dumps({"host": host, "reason": "tls", "retry_at": 2e9}).encode()
    return set(failed), fine, {e.url for e in pending}, set(bad)


def _size(store: Path, ext: str) -> int:
    return sum(p.stat().st_size for p in store.glob(f"*.{ext}"))


def _check_nothing_lost(data: Path, failed: set[bytes], fine: dict[bytes, bytes],
                        pending: set[str]) -> int:
    """Every failed URL in MainDB or in a live bulk, every page and pending URL kept;
    returns how many failures are re-queued so far."""
    with kvstore.open(data / "main", readonly=True) as main:
        in_main = {k for k in main}
        assert all(main[k] == v for k, v in fine.items())
    live = live_bulk_urls(data)
    assert pending <= set(live)
    queued = {url_key(u) for u in live}
    lost = failed - in_main - queued
    assert not lost, f"{len(lost)} failed URLs in neither MainDB nor a live bulk"
    return len(failed - in_main)


def test_a_kill_9_during_retry_loses_nothing(tmp_path: Path) -> None:
    data = tmp_path / "crawl"
    data.mkdir()
    failed, fine, pending, bad = _big_crawl(data)
    rng = random.Random(11)
    main_dir, pend_dir = data / "main", data / "pend"
    # Where to kill: once the first bulks are written, once the first records are
    # deleted, then at random depths into the deletions (each round resumes the last).
    points = [("pend", 0.0), ("main", 0.0)] + [("main", rng.uniform(0.05, 0.5)) for _ in range(3)]
    killed_mid_way = 0
    for store, fraction in points:
        watched = pend_dir if store == "pend" else main_dir
        start = _size(watched, "key")
        todo = len(failed & _main_keys(data))
        goal = start + 1 + int(fraction * todo * 24)  # KEY records are 24 bytes
        proc = start_cli([sys.executable, "-m", "crawler", "retry", str(data), "--reason",
                          "tls,dns_,total_timeout,bad_host", "--status", "4xx,5xx"])
        while _size(watched, "key") < goal and proc.poll() is None:
            time.sleep(0.0005)
        proc.kill()
        proc.communicate()
        done = _check_nothing_lost(data, failed, fine, pending)
        killed_mid_way += 0 < done < len(failed)
    assert killed_mid_way >= 3  # the kills did land in the middle
    rc, out, err = retry(data)  # a last, whole run finishes the job
    assert rc == 0, err
    assert _check_nothing_lost(data, failed, fine, pending) == len(failed)
    live = live_bulk_urls(data)
    assert max(live.values()) == 1 and len(live) == len(failed) + len(pending)  # none twice
    with kvstore.open(data / "badhosts", readonly=True) as hosts:
        assert not set(hosts) & bad
    frontier = Frontier(str(data))  # what the next start sees
    try:
        assert frontier.counts()["pending"] == len(failed) + len(pending)
        assert frontier.counts()["done"] == len(fine)
    finally:
        frontier.close()


def _main_keys(data: Path) -> set[bytes]:
    with kvstore.open(data / "main", readonly=True) as main:
        return set(main)


# -- the selection and the words, as units -------------------------------------------------


def page(status: int, reason: str = "", truncated: str = "") -> PageRecord:
    return PageRecord("http://a.test/", status, 1.7e9, 0, reason=reason, truncated=truncated)


def test_what_counts_as_a_failure() -> None:
    failures = [page(0, "tls"), page(0, "bad_host:dns_nxdomain"), page(0, "robots_unavailable"),
                page(404), page(503), page(0, "internal_error")]
    answers = [page(200), page(200, "not_html"), page(200, truncated="too_large"), page(301),
               page(302, "redirect_limit"), page(0, "robots_disallowed"),
               page(0, "host_page_limit")]
    assert all(is_failure(p) for p in failures)
    assert not any(is_failure(p) for p in answers)
    everything = Selection()
    assert [everything.matches(p) for p in failures + answers] == [True] * 6 + [False] * 7
    assert Selection(reasons=("host_page_limit",)).matches(page(0, "host_page_limit"))
    assert Selection(reasons=("too_large",)).matches(page(200, truncated="too_large"))
    assert not Selection(reasons=("tls",)).matches(page(0, "bad_host:dns_nxdomain"))


def test_usage_errors_exit_2_and_data_errors_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["retry", str(tmp_path), "--reason", "tsl"], ["retry", str(tmp_path),
                 "--status", "600"], ["retry", str(tmp_path), "--status", "ok"], ["retry"]):
        assert main(argv) == 2, argv
        assert "usage:" in capsys.readouterr().err
    assert main(["retry", str(tmp_path / "none")]) == 1
    none = tmp_path / "none"
    assert capsys.readouterr().err == f"crawler: error: {none}: no such crawl directory\n"
    assert main(["retry", str(tmp_path)]) == 1
    assert "not a crawl directory" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing made in a directory that holds no crawl


def test_help_has_an_example_and_the_command_is_documented(
    capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["retry", "--help"]) == 0
    assert "example: python -m crawler retry " in capsys.readouterr().out
    doc = (REPO / "docs" / "RETRY.md").read_text()
    assert "python -m crawler retry DIR" in doc
    for reason in REASONS:  # every reason is described in the docs
        assert f"`{reason}`" in doc, reason


def test_every_reason_of_the_outcome_table_has_words() -> None:
    """The reasons docs/HOSTILE.md lists under the outcome classes: each one is explained
    (none falls into "other"), so the words cannot lag behind the crawler's reasons."""
    text = (REPO / "docs" / "HOSTILE.md").read_text().partition("## Outcome classes")[2]
    keys = set()
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and cells[1].strip().startswith("`"):
            keys.update(cells[2].split("`")[1::2])  # the backquoted names
    keys = {k for k in keys if k.replace("_", "").isalnum()}  # not bad_host:<reason>
    assert {"tls", "dns_nodata", "robots_unavailable", "internal_error"} <= keys
    assert {k for k in keys if family(k) == "other"} == set()
    assert all(k in HINTS for k in keys)


def test_explain_orders_by_count_and_folds_bad_host_records_into_their_cause() -> None:
    outcomes = {"200": 50, "301": 4, "retry:total_timeout": 9, "tls": 1, "bad_host:tls": 5,
                "dns_nxdomain": 2, "404": 3, "410": 1, "robots_disallowed": 2, "not_html": 1}
    lines = explain(outcomes, "my crawl")
    assert [line.partition(" (")[0] for line in lines] == [
        "tls", "4xx", "dns_nxdomain", "robots_disallowed", "not_html"]
    assert lines[0].startswith("tls (6 URLs, 5 of them not requested as their host was marked "
                               "bad): ")
    assert "--ca-bundle FILE" in lines[0]
    assert lines[0].endswith("then `python -m crawler retry 'my crawl' --reason tls`")
    assert lines[1].endswith("`python -m crawler retry 'my crawl' --status 4xx`")
    assert "--nameserver" in lines[2]
    assert "not a failure" in lines[3] and "--ignore-robots" in lines[3]
    assert "impolite" in lines[3]
    assert "retry" not in lines[4]  # nothing to do about a page that is not HTML
    assert explain({"200": 3, "302": 1}, "d") == []
    assert explain({"something_new": 2}, "d")[0].startswith("other (2 URLs): ")
    assert resume_flags(outcomes) == ["--ca-bundle FILE", "--nameserver IP[:PORT]",
                                      "--ignore-robots"]
    assert all(not explain({k: 1}, "d", retry=False)[0].count("python -m crawler retry")
               for k in HINTS)


def test_explain_on_a_real_crawl_summary(tls_crawl: TLSCrawl) -> None:
    web, data, summary = tls_crawl
    assert {"tls", "bad_host:tls", "dns_nxdomain", "robots_disallowed"} <= set(summary)
    lines = explain(summary, str(data))
    assert [line.partition(" (")[0] for line in lines][:1] == ["tls"]
    named = {line.partition(" (")[0] for line in lines}
    assert named == {"tls", "dns_nxdomain", "robots_disallowed"}
    assert any(os.fspath(data) in line and "--reason dns_nxdomain" in line for line in lines)


def test_a_damaged_record_is_left_alone_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "crawl"
    with kvstore.open(data / "main") as db:
        db[url_key("http://a.test/")] = encode_page(PageRecord("http://a.test/", 0, 1.7e9, 2,
                                                               reason="connect_refused"))
        db[url_key("http://a.test/bad")] = b"KVCP\x01\x05\x00\x00\x00{not json"
    assert main(["retry", str(data)]) == 0
    out = capsys.readouterr().out
    assert counts_of(out) == {"connect_refused": 1}
    assert "(1 damaged record left alone: python -m kvstore verify names them)" in out
    assert "resume: python -m crawler start --data " in out
    assert live_bulk_urls(data) == {"http://a.test/": 1}
    with kvstore.open(data / "main", readonly=True) as db:
        assert list(db) == [url_key("http://a.test/bad")]


def _failures_crawl(data: Path, per_shard: list[int]) -> None:
    """A crawl directory of len(per_shard) shards, each MainDB holding that many
    dns_nxdomain records (one record's bytes under every key: a dry run reads heads)."""
    data.mkdir()
    (data / "shards.json").write_text(json.dumps({"format": 1, "shards": len(per_shard)}))
    value = encode_page(PageRecord("http://gone.test/", 0, 1.0e9, 0, reason="dns_nxdomain"))
    for index, n in enumerate(per_shard):
        with kvstore.open(str(data / f"shard-{index:02d}" / "main")) as main:
            keys = [url_key(f"http://s{index}-{i}.test/") for i in range(n)]
            main.put_many(keys, [value] * n)


def _dry_run_peak(data: Path) -> tuple[int, int]:
    import tracemalloc

    from crawler.state.retry import requeue

    tracemalloc.start()
    try:  # small chunks: the records a chunk holds would hide the indexes
        report = requeue(str(data), Selection(), dry_run=True, chunk=100)
        return report.requeued, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_a_dry_run_holds_one_shard_in_memory_at_a_time(tmp_path: Path) -> None:
    """Its memory is one shard's indexes, not the crawl's: two shards of 50,000 records
    peak as one shard of 50,000 beside one of 1 (numpy's arrays are traced)."""
    _failures_crawl(tmp_path / "two", [50_000, 50_000])
    _failures_crawl(tmp_path / "one", [50_000, 1])
    both, peak_two = _dry_run_peak(tmp_path / "two")
    single, peak_one = _dry_run_peak(tmp_path / "one")
    assert (both, single) == (100_000, 50_001)
    assert peak_two < 1.15 * peak_one, (peak_two, peak_one)  # both at once: 1.32x


def test_a_real_run_knows_the_live_bulks_urls_at_9_bytes_a_url(tmp_path: Path) -> None:
    """A real run keeps the URLs of the live bulks (to requeue none twice) as a PendSet:
    every one of them known, 9 bytes a URL (a KeySet of their keys held ~30)."""
    urls = [[f"http://h{b}.test/p{i}" for i in range(100)] for b in range(500)]
    with kvstore.open(str(tmp_path / "pend")) as pend:
        for b, bulk in enumerate(urls):
            pend[b.to_bytes(16, "big")] = encode_bulk([Pending(u) for u in bulk])
    shard = _Shard(str(tmp_path), readonly=False)
    try:
        keys = keys_array([url_key(u) for bulk in urls for u in bulk])
        assert shard.live.contains_many(keys).all()
        assert not shard.live.contains_many(keys_array([url_key("http://h0.test/x")])).any()
        assert (len(shard.live), shard.counter) == (50_000, 500)
        assert shard.live.nbytes() <= 9 * 50_000
    finally:
        shard.close()
