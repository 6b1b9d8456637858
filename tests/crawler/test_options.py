"""The options of ``python -m crawler start`` that change what a crawl does, each seen
working end to end (the server's log, the records, the oracle), and the crawl's
lifecycle from outside: SIGTERM, ``status`` while it runs, new seeds on resume."""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from crawl_helpers import (
    META_PATHS,
    REPO,
    Answer,
    Hit,
    LocalServer,
    cli_args,
    fetched_urls,
    host_name,
    html_links,
    page_refetches,
    record,
    records,
    run_cli,
    start_cli,
    wait_for,
)

from crawler.state.statusfile import read_status
from tools.testweb import TestWeb, fault

MakeWeb = Callable[..., TestWeb]
EPS = 0.02  # clock granularity between the server's log and the crawler's timers
# Upper bounds on waits: the setting plus this. Other test runs share the machine's two
# cores, so a thread may wait for a CPU for a good part of a second.
SLACK = 1.5


def scoped(args: list[str]) -> list[str]:
    """A command without --broad: the crawl keeps to its seeds' hosts unless told more."""
    return [a for a in args if a != "--broad"]


def local_args(seed: str, data: Path, *extra: str) -> list[str]:
    """``crawler start`` aimed at a LocalServer (an IP literal: no DNS)."""
    return [
        sys.executable,
        "-m",
        "crawler",
        "start",
        seed,
        "--data",
        str(data),
        "--allow-private-ips",
        "--delay",
        "0",
        "--threads",
        "4",
        "--status-interval",
        "3600",
        "--processes",
        "1",
        *extra,
    ]


def with_seeds(args: list[str], seeds: list[str]) -> list[str]:
    """``args`` (a ``crawler start`` command) with more seeds beside its first."""
    at = args.index("start") + 2
    return [*args[:at], *seeds, *args[at:]]


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# -- robots ------------------------------------------------------------------------------


def test_ignore_robots_fetches_no_robots_txt_and_ignores_meta_robots(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=60, hosts=4, seed=0, crawl_delay=0.0, faults=[fault("meta_robots")])
    want = web.oracle.crawl(obey_robots=False)
    obeying = web.oracle.crawl()
    # Pages robots.txt blocks, and pages reached only through those or a meta nofollow.
    blocked = set(obeying.blocked)
    behind = set(want.fetched) - set(obeying.fetched) - blocked
    assert blocked and behind, "the site must have robots.txt rules and meta robots"
    data = tmp_path / "c"
    ok(run_cli(cli_args(web, data, "--ignore-robots")))
    assert not web.log.records(path="/robots.txt")
    assert fetched_urls(data) == set(want.fetched)  # blocked ones and nofollowed ones too
    recs = records(data)
    assert not [u for u, r in recs.items() if r.reason.startswith("robots_") or r.noindex]
    noindex = web.url("h0.test", "/x/meta_robots/noindex")
    assert noindex in want.noindex and recs[noindex].status == 200
    assert record(data, noindex).body  # a noindex page keeps its body when robots are ignored


def test_user_agent_is_sent_and_picks_its_robots_txt_group(tmp_path: Path) -> None:
    agent = "TestBot/2.0 (+http://example.invalid/bot)"
    robots = (
        b"User-agent: *\nDisallow: /\n\n"
        b"User-agent: testbot\nDisallow: /private/\n\n"
        b"User-agent: otherbot\nDisallow: /\n"
    )

    def answer(path: str, hits: list[Hit]) -> Answer:
        if path == "/robots.txt":
            return 200, [("Content-Type", "text/plain")], robots
        if path == "/":
            return html_links(["/open.html", "/private/closed.html"])
        return html_links([])

    with LocalServer(answer) as server:
        ok(run_cli(local_args(server.url("/"), tmp_path / "ours", "--user-agent", agent)))
        ours = list(server.hits)
        ok(run_cli(local_args(server.url("/"), tmp_path / "default")))
        default = server.hits[len(ours) :]
    assert {h.headers.get("user-agent") for h in ours} == {agent}  # robots.txt and pages
    assert [h.path for h in ours if h.path not in ("/robots.txt", "/sitemap.xml")] == [
        "/", "/open.html"]
    assert "/sitemap.xml" in {h.path for h in ours}  # read: robots.txt allows it to testbot
    got = records(tmp_path / "ours")
    assert got[server.url("/private/closed.html")].reason == "robots_disallowed"
    # Under the default agent the "*" group applies: nothing but robots.txt is fetched
    # (not even /sitemap.xml: robots.txt disallows it too).
    assert [h.path for h in default] == ["/robots.txt"]
    assert default[0].headers["user-agent"].startswith("kvcrawl/")
    assert records(tmp_path / "default")[server.url("/")].reason == "robots_disallowed"


def test_user_agent_picks_the_group_of_the_test_web_robots_txt(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """h3.test's robots.txt shuts out "badbot" only: as badbot the crawl finds it shut."""
    web = make_testweb(pages=80, hosts=4, seed=1, crawl_delay=0.0)
    want, as_us = web.oracle.crawl(user_agent="badbot"), web.oracle.crawl()
    assert any(host_name(u) == "h3.test" for u in as_us.fetched)
    assert not any(host_name(u) == "h3.test" for u in want.fetched)
    data = tmp_path / "c"
    ok(run_cli(cli_args(web, data, "--user-agent", "BadBot/1.0")))
    assert fetched_urls(data) == set(want.fetched)
    assert {r.path for r in web.log.records(host="h3.test")} == {"/robots.txt"}


def test_max_crawl_delay_caps_a_robots_txt_crawl_delay(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """h1.test asks for Crawl-delay: 5; --max-crawl-delay 0.2 holds it to 0.2 s (still a
    delay: never less)."""
    cap = 0.2
    web = make_testweb(pages=60, hosts=3, seed=2, crawl_delay=5.0)
    want = web.oracle.crawl()
    assert want.crawl_delay == {"h1.test": 5.0}
    # Every URL a seed: h1 has work from the start, so its gaps are its delay alone.
    seeds = sorted(want.fetched)
    data = tmp_path / "c"
    args = with_seeds(cli_args(web, data, "--per-host", "1", "--max-crawl-delay", str(cap)), seeds)
    ok(run_cli(args))
    assert fetched_urls(data) == set(want.fetched)
    gaps = web.log.gaps("h1.test")
    assert len(gaps) >= 5
    assert cap - EPS <= min(gaps) and max(gaps) <= cap + SLACK, gaps


# -- scope ---------------------------------------------------------------------------------


def test_allow_domain_adds_hosts_to_the_seed_hosts(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=60, hosts=4, seed=3, crawl_delay=0.0)
    # A host by its name: the seed host and h1, nothing else.
    want = web.oracle.crawl(scope={"h0.test", "h1.test"})
    ok(run_cli(scoped(cli_args(web, tmp_path / "one", "--allow-domain", "h1.test"))))
    assert fetched_urls(tmp_path / "one") == set(want.fetched)
    assert web.log.hosts() == {"h0.test", "h1.test"}
    # A domain: every host under .test, as a broad crawl.
    ok(run_cli(scoped(cli_args(web, tmp_path / "all", "--allow-domain", "test"))))
    assert fetched_urls(tmp_path / "all") == set(web.oracle.crawl().fetched)


def test_allow_and_deny_regex_decide_which_links_are_followed(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    allow = r"^https?://[^/]+/(s[01]/.*)?$"  # home pages and sections 0 and 1 only
    deny = r"/p\d*7\.html"  # but no page whose number ends in 7

    def in_scope(url: str) -> bool:
        return bool(re.search(allow, url)) and not re.search(deny, url)

    web = make_testweb(pages=120, hosts=3, seed=4, crawl_delay=0.0)
    want = web.oracle.crawl(scope=in_scope)
    everything = web.oracle.crawl()
    assert len(want.fetched) < len(everything.fetched)
    assert any(re.search(deny, u) for u in everything.fetched)
    data = tmp_path / "c"
    ok(run_cli(cli_args(web, data, "--allow-regex", allow, "--deny-regex", deny)))
    assert fetched_urls(data) == set(want.fetched)
    pages = {r.url for r in web.log.records() if r.path != "/robots.txt"}
    assert pages and all(in_scope(u) for u in pages)


# -- limits and settings ---------------------------------------------------------------------


def test_max_pages_stops_after_that_many_fetches_then_resume_finishes(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=120, hosts=3, seed=5, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    done = ok(run_cli(cli_args(web, data, "--max-pages", "25")))
    assert done.stdout.startswith("crawl stopped (limit reached): ")
    assert json.loads(done.stdout.split(": ", 1)[1])["fetched"] == 25
    assert len([r for r in web.log.records() if r.path not in META_PATHS]) == 25
    assert len(fetched_urls(data)) == 25
    ok(run_cli(cli_args(web, data)))
    assert fetched_urls(data) == want
    assert page_refetches(web) == {}


# Run the real CLI with os.fsync watched: each call goes to the real fsync, then its
# time and file go to a log. (kvstore calls os.fsync through the module.)
FSYNC_SPY = textwrap.dedent(
    """
    import os, sys, time
    real = os.fsync
    log = open(sys.argv[1], "a", buffering=1)
    def fsync(fd):
        fd = fd if isinstance(fd, int) else fd.fileno()
        real(fd)
        log.write(f"{time.time()} {os.readlink(f'/proc/self/fd/{fd}')}\\n")
    os.fsync = fsync
    from crawler.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


def test_sync_interval_fsyncs_the_stores_that_often(make_testweb: MakeWeb, tmp_path: Path) -> None:
    interval = 0.2
    web = make_testweb(pages=60, hosts=3, seed=6, crawl_delay=0.0)
    data, spy_log = tmp_path / "c", tmp_path / "fsyncs.log"
    # --delay 0.05: the crawl lasts over a second, several intervals.
    args = cli_args(web, data, "--delay", "0.05", "--per-host", "1", "--sync-interval", "0.2")
    args = [sys.executable, "-c", FSYNC_SPY, str(spy_log), *args[3:]]  # after "-m crawler"
    ok(run_cli(args))
    last_page = max(r.start for r in web.log.records())
    first_page = min(r.start for r in web.log.records())
    assert last_page - first_page >= 5 * interval
    syncs = []
    for line in spy_log.read_text().splitlines():
        at, path = line.split(" ", 1)
        if Path(path).parent.name in ("main", "pend"):
            syncs.append((float(at), Path(path).parent.name))
    # fsyncs while pages were still being fetched: the interval at work, not the close.
    during = sorted(t for t, _ in syncs if t < last_page)
    assert {name for t, name in syncs if t < last_page} == {"main", "pend"}
    # A round fsyncs both stores' files back to back; rounds come an interval apart
    # (measured after an fsync returned, whose own time varies: hence the half).
    rounds = during[:1] + [b for a, b in itertools.pairwise(during) if b - a > interval / 2]
    assert len(rounds) >= 3, rounds  # the 5 s default would give none
    assert all(b - a <= interval + SLACK for a, b in itertools.pairwise(rounds)), rounds


# -- stopping, watching, resuming --------------------------------------------------------------


def test_sigterm_stops_cleanly_then_resume_refetches_nothing(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=600, hosts=4, seed=9, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    proc = start_cli(cli_args(web, data))
    wait_for(lambda: len(web.log.records(done=True)) >= 60, proc, "60 answered requests")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
    assert out.startswith(b"crawl interrupted: ")
    assert 0 < len(fetched_urls(data)) < len(want)
    assert b"crawl complete" in ok(run_cli(cli_args(web, data))).stdout.encode()
    assert fetched_urls(data) == want
    assert page_refetches(web) == {}  # the clean stop wrote every fetched page


def test_status_reads_a_running_crawl(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=200, hosts=3, seed=7, crawl_delay=0.0)
    data = tmp_path / "c"
    # --delay 0.05 on three hosts: a crawl of a few seconds, a status file every 0.2 s.
    proc = start_cli(
        cli_args(web, data, "--delay", "0.05", "--per-host", "1", "--status-interval", "0.2")
    )
    status = [sys.executable, "-m", "crawler", "status", str(data)]

    def fetched() -> int:
        snap = read_status(str(data))
        return int(snap["fetched"]) if snap else 0

    try:
        wait_for(lambda: fetched() >= 10, proc, "a status file with ten fetches")
        live = subprocess.run(
            [*status, "--json"], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        text = subprocess.run(status, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.poll() is None, "the crawl ended before its status was read"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert live.returncode == 0 and text.returncode == 0, live.stderr + text.stderr
    info = json.loads(live.stdout)
    assert info["running"] is True and info["last_status"]["pid"] == proc.pid
    assert info["last_status"]["running"] is True
    assert 10 <= info["recorded"] < len(web.oracle.crawl().fetched)  # the live stores, read-only
    assert info["pending_bulks"] > 0
    assert text.stdout.startswith(f"crawl {data}: running\n")
    stopped = json.loads(
        subprocess.run(
            [*status, "--json"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )
    assert stopped["running"] is False and stopped["recorded"] >= info["recorded"]


def test_new_seeds_given_on_resume_are_crawled(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=80, hosts=3, seed=8, crawl_delay=0.0)
    data = tmp_path / "c"
    first = web.oracle.crawl(scope={"h0.test"})  # no --broad: the seed's host only
    ok(run_cli(scoped(cli_args(web, data))))
    assert fetched_urls(data) == set(first.fetched)
    new_seed = web.url("h1.test", "/")
    assert new_seed not in first.fetched
    ok(run_cli(scoped(with_seeds(cli_args(web, data), [new_seed]))))
    # The resume's scope is both seeds' hosts; it walks on from the new seed, and the
    # pages done in the first run are neither fetched again nor walked through again.
    done = set(first.fetched)
    second = web.oracle.crawl(
        seeds=[new_seed],
        scope=lambda u: host_name(u) in {"h0.test", "h1.test"} and u not in done,
    )
    assert fetched_urls(data) == done | set(second.fetched)
    assert {host_name(u) for u in second.fetched} >= {"h1.test"}
    assert page_refetches(web) == {}
    seeds = (data / "seeds.txt").read_text().split()
    assert seeds == [web.seed_url, new_seed]


def test_store_types_keeps_the_bodies_of_those_types_only(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """An archiving crawl: --store-types keeps PDF and PNG bodies byte for byte; the
    octet-stream one (not named) is still recorded without its body, and nothing that
    is not HTML is parsed for links."""
    web = make_testweb(pages=20, hosts=1, crawl_delay=0.0, faults=[fault("binary")])
    data = tmp_path / "c"
    args = cli_args(web, data, "--store-types", "application/pdf,image/*")
    ok(run_cli(args))
    m = "/x/binary/"
    served = {
        r.path: r.bytes for r in web.log.records() if r.path.startswith(m) and r.status == 200
    }
    pdf, png, octet = (record(data, web.url("h0.test", m + n)) for n in ("pdf", "image", "octet"))
    assert pdf.body.startswith(b"%PDF-") and len(pdf.body) == served[m + "pdf"]
    assert png.body.startswith(b"\x89PNG") and len(png.body) == served[m + "image"]
    assert (octet.body, octet.reason) == (b"", "not_html")
    assert all(r.reason == "not_html" and r.outlinks == 0 for r in (pdf, png, octet))
