"""The request log: what it records, its queries, JSON lines round trip."""

from __future__ import annotations

import io
import json
import threading

import pytest

from tools.testweb import RequestLog, SiteConfig, TestWeb, fault
from tools.testweb.requestlog import Request

TIMEOUT = 5.0


@pytest.fixture(scope="module")
def web():
    with TestWeb(SiteConfig(pages=20, hosts=3, seed=3),
                 faults=[fault("slow_first_byte", delay=0.4)]) as w:
        yield w


def test_fields_of_a_record(web: TestWeb) -> None:
    web.reset()
    r = web.session().get(web.url("h1.test", "/robots.txt?x=1"), timeout=TIMEOUT)
    (rec,) = web.log.records()
    assert (rec.scheme, rec.host, rec.target, rec.path, rec.method) == \
        ("http", "h1.test", "/robots.txt?x=1", "/robots.txt", "GET")
    assert rec.port == web.http_port and rec.url == r.url
    assert rec.status == 200 and rec.bytes == len(r.content) and rec.outcome == "ok"
    assert rec.start <= rec.end and rec.conn >= 1 and rec.sni is None


def test_logged_before_the_client_sees_the_answer(web: TestWeb) -> None:
    """No waiting needed: the record is complete once the response is read."""
    web.reset()
    s = web.session()
    for i in range(30):
        s.get(web.url("h0.test", f"/missing/{i}"), timeout=TIMEOUT)
        assert web.log.records()[-1].status == 404


def test_concurrency_and_connections(web: TestWeb) -> None:
    web.reset()
    url = web.url("h0.test", "/x/slow_first_byte/1")
    barrier = threading.Barrier(4)

    def fetch() -> None:
        s = web.session()
        barrier.wait()
        s.get(url, timeout=TIMEOUT)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert web.log.max_concurrency("h0.test") == 4  # each holds 0.4 s; they overlap
    assert len(web.log.connections("h0.test")) == 4
    assert web.log.duplicates() == {url: 4}
    assert web.log.counts()[url] == 4


def test_sequential_requests_have_gaps_not_overlap(web: TestWeb) -> None:
    web.reset()
    s = web.session()
    for _ in range(3):
        s.get(web.url("h2.test"), timeout=TIMEOUT)
    assert web.log.max_concurrency("h2.test") == 1
    gaps = web.log.gaps("h2.test")
    assert len(gaps) == 2 and all(g >= 0 for g in gaps)
    assert all(g >= 0 for g in web.log.start_gaps("h2.test"))


def test_in_flight_requests_are_visible(web: TestWeb) -> None:
    web.reset()
    done = threading.Event()

    def slow() -> None:
        web.session().get(web.url("h0.test", "/x/slow_first_byte/1"), timeout=TIMEOUT)
        done.set()

    t = threading.Thread(target=slow)
    t.start()
    while not web.log.records(done=False) and not done.is_set():
        done.wait(0.01)
    seen = [(r.status, r.outcome, r.end) for r in web.log.records(done=False)]  # live objects
    t.join()
    assert seen == [(None, "pending", None)]
    assert web.log.records()[0].outcome == "ok"  # the same record, finished in place


def test_dump_and_load_round_trip(web: TestWeb, tmp_path) -> None:  # type: ignore[no-untyped-def]
    web.reset()
    s = web.session()
    s.get(web.url("h0.test"), timeout=TIMEOUT)
    s.get(web.url("h2.test"), timeout=TIMEOUT)
    path = tmp_path / "log.jsonl"
    assert web.log.dump(path) == 2
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert {x["url"] for x in lines} == web.log.urls()
    assert set(lines[0]) >= {"host", "target", "status", "start", "end", "conn", "bytes"}
    back = RequestLog.load(path)
    assert back.records() == web.log.records()
    buf = io.StringIO()
    back.dump(buf)
    assert buf.getvalue() == path.read_text()


def test_max_concurrency_counts_an_end_before_a_start_at_the_same_instant() -> None:
    log = RequestLog()
    log.add(Request(1, "http", 80, "a", "/1", "GET", start=1.0, end=2.0))
    log.add(Request(2, "http", 80, "a", "/2", "GET", start=2.0, end=3.0))
    log.add(Request(3, "http", 80, "b", "/3", "GET", start=2.5, end=None))
    assert log.max_concurrency("a") == 1
    assert log.max_concurrency() == 2
    assert log.gaps("a") == [0.0] and log.hosts() == {"a", "b"}
