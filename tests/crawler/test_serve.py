"""``serve`` over real loopback connections: who it answers (the Host header, against DNS
rebinding), which methods (GET and HEAD, 405 for the rest), and its own HTML pages with
the data directory's name and error texts escaped. The report's numbers are
test_report.py's."""

from __future__ import annotations

import html
import http.client
import json
import re
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import ended, run_crawl, start_python

from crawler.cli import main
from crawler.read.serve import HostRule, ReportServer
from tools.testweb import SiteConfig, TestWeb

WAIT = 60.0  # seconds a connection or a report may take on a loaded machine
# A data directory name a browser would run, were it put into a page unescaped.
MARKUP_DIR = "<script>alert(1)<&\"'"
PATHS = ["/", "/index.html", "/report.json", "/report.json?x=1", "/nope"]
CRAWL_HOST = b".test"  # the test web's hosts: in every report of its crawl


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with TestWeb(SiteConfig(pages=30, hosts=2, seed=4, crawl_delay=0.0)) as web:
        path = tmp_path_factory.mktemp("serve") / MARKUP_DIR
        run_crawl(web, path)
        yield path


@pytest.fixture(scope="module")
def served(data: Path) -> Iterator[ReportServer]:
    server = ReportServer(str(data), port=0, interval=3600.0, rank=False).start()
    try:
        assert server.wait_ready(WAIT)
        yield server
    finally:
        server.stop()


@contextmanager
def http_only(data: Path, **options: Any) -> Iterator[ReportServer]:
    """A server whose report is never computed unless the test calls refresh_now()."""
    server = ReportServer(str(data), port=0, rank=False, **options)
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(timeout=WAIT)


def request(port: int, path: str, *, host: str | list[str] | None, method: str = "GET"
            ) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One HTTP/1.1 request with exactly the Host header lines given (None: none)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for value in [host] if isinstance(host, str) else host or []:
            conn.putheader("Host", value)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.headers, r.read()
    finally:
        conn.close()


def raw(port: int, data: bytes) -> tuple[int, bytes]:
    """Status and whole answer of a request written byte for byte (HTTP/1.0 here)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def assert_no_crawl_data(body: bytes, data: Path) -> None:
    assert CRAWL_HOST not in body and b"records" not in body, body
    assert str(data).encode() not in body and html.escape(str(data)).encode() not in body


# -- the Host header ---------------------------------------------------------------------


@pytest.mark.parametrize("host", [
    "attacker.example",
    "attacker.example:{port}",
    "ATTACKER.example",
    "127.0.0.1.attacker.example:{port}",
    "localhost.attacker.example",
    "localhost.",
    "127.0.0.2:{port}",
    "0.0.0.0:{port}",
    "127.0.0.1:{other}",  # our names, but another port: a page served elsewhere
    "localhost:{other}",
    "[::1]:{other}",
])
def test_a_foreign_host_gets_421_and_no_crawl_data(served: ReportServer, data: Path,
                                                   host: str) -> None:
    port = served.address[1]
    value = host.format(port=port, other=port + 1 if port < 65535 else 1)
    for path in PATHS:
        for method in ("GET", "HEAD", "POST"):
            status, headers, body = request(port, path, host=value, method=method)
            assert status == 421, (value, path, method)
            assert headers["Content-Type"].startswith("text/plain")
            assert_no_crawl_data(body, data)
            assert (body == b"") == (method == "HEAD")


@pytest.mark.parametrize("host", [None, "", " ", ["127.0.0.1", "attacker.example"],
                                  ["127.0.0.1", "127.0.0.1"], "[::1", "a b", "localhost:x",
                                  "localhost:99999", "[::1]x", "[nope]:1", "user@localhost"])
def test_no_host_or_a_malformed_one_under_http11_gets_400(
        served: ReportServer, data: Path, host: str | list[str] | None) -> None:
    for path in PATHS:
        status, _, body = request(served.address[1], path, host=host)
        assert status == 400, (host, path)
        assert_no_crawl_data(body, data)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:{port}", "localhost",
                                  "LocalHost:{port}", "[::1]", "[::1]:{port}", "localhost:"])
def test_the_names_it_is_reachable_by_are_answered(served: ReportServer, host: str) -> None:
    port = served.address[1]
    value = host.format(port=port)
    status, headers, body = request(port, "/report.json", host=value)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["crawl"]["records"] > 0
    status, headers, body = request(port, "/", host=value)
    assert status == 200 and b'id="chart-hosts"' in body
    status, headers, body = request(port, "/", host=value, method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def test_http10_without_host_is_answered_with_a_foreign_one_is_not(
        served: ReportServer, data: Path) -> None:
    port = served.address[1]
    status, answer = raw(port, b"GET /report.json HTTP/1.0\r\n\r\n")
    assert status == 200 and CRAWL_HOST in answer
    status, answer = raw(port, b"GET /report.json HTTP/1.0\r\nHost: attacker.example\r\n\r\n")
    assert status == 421
    assert_no_crawl_data(answer, data)


def test_allowed_hosts_are_answered_with_their_port_or_ours(data: Path) -> None:
    with http_only(data, allow_hosts=("crawl-box.lan", "LOCALHOST:9000")) as server:
        port = server.address[1]
        for host in ("crawl-box.lan", f"crawl-box.lan:{port}", "Crawl-Box.LAN",
                     "localhost:9000", "localhost", "127.0.0.1"):
            assert request(port, "/", host=host)[0] == 200, host
        for host in ("crawl-box.lan:9000", "localhost:9001", "other.lan", "box.lan"):
            assert request(port, "/", host=host)[0] == 421, host


def test_the_host_rule_of_each_binding() -> None:
    loopback = HostRule.for_server("127.0.0.1", 8765)
    assert loopback.accepts("localhost:8765") and loopback.accepts("[::1]")
    assert not loopback.accepts("192.168.1.20:8765") and not loopback.accepts("10.0.0.1")
    named = HostRule.for_server("crawl-box.lan", 8765)  # --host NAME: that name too
    assert named.accepts("crawl-box.lan") and named.accepts("127.0.0.1:8765")
    assert not named.accepts("crawl-box.lan:80") and not named.accepts("192.168.1.20")
    address = HostRule.for_server("192.168.1.20", 8765)  # --host ADDRESS: that address
    assert address.accepts("192.168.1.20:8765") and not address.accepts("192.168.1.21")
    # Bound to every address: any address literal (a rebinding page's Host is always its
    # own name, never an address), the machine's name, the allowed names; no other name.
    anywhere = HostRule.for_server("0.0.0.0", 8765, ("crawl-box.lan",))
    for host in ("192.168.1.20:8765", "10.0.0.1", "[fe80::1]:8765", "[2001:db8::1]",
                 socket.gethostname(), "crawl-box.lan:8765", "localhost"):
        assert anywhere.accepts(host), host
    for host in ("attacker.example", "192.168.1.20:80", "1.2.3", "[fe80::1", "crawl-box.la"):
        assert not anywhere.accepts(host), host
    v6 = HostRule.for_server("::1", 8765)
    assert v6.accepts("[::1]:8765") and not v6.accepts("::1")
    with pytest.raises(ValueError, match="allow"):
        HostRule.for_server("127.0.0.1", 8765, ("bad name",))


@pytest.mark.parametrize("value", ["", "a b", "a/b", "host:0", "host:70000", "host:x", "[::1"])
def test_a_bad_allow_host_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    assert main(["serve", "d", "--allow-host", "ok.lan", "--allow-host", value]) == 2
    err = capsys.readouterr().err
    assert "usage:" in err and f"serve: --allow-host {value!r}: not a NAME or NAME:PORT" in err


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 0), (signal.SIGTERM, 143)])
def test_the_serve_command_answers_an_allowed_host(data: Path, signum: signal.Signals,
                                                    code: int) -> None:
    """...and stops on Ctrl-C, or on a service manager's SIGTERM as on Ctrl-C (no
    traceback) with the status that says so: 143, as for ``start`` (killed: -15)."""
    proc = start_python(["-m", "crawler", "serve", str(data), "--port", "0", "--no-rank",
                         "--allow-host", "crawl-box.lan"])
    try:
        assert proc.stdout is not None
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
        assert m is not None
        port = int(m.group(1))
        assert request(port, "/", host="crawl-box.lan")[0] == 200
        assert request(port, "/", host="attacker.example")[0] == 421
    finally:
        proc.send_signal(signum)
        err = ended(proc, WAIT)
    assert proc.returncode == code, err[-2000:]
    assert "refused a request for Host 'attacker.example'" in err
    assert "Traceback" not in err


# -- methods -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
                                    "CONNECT", "PROPFIND", "BREW"])
def test_methods_other_than_get_and_head_get_405(served: ReportServer, data: Path,
                                                  method: str) -> None:
    for path in PATHS:
        status, headers, body = request(served.address[1], path, host="127.0.0.1",
                                        method=method)
        assert status == 405, (method, path)
        assert headers["Allow"] == "GET, HEAD"
        assert_no_crawl_data(body, data)


# -- the server's own pages --------------------------------------------------------------


def test_the_data_directory_and_error_texts_are_escaped(data: Path, tmp_path: Path) -> None:
    work = tmp_path / "<img src=x onerror=alert(2)>" / "missing"  # the report's mkdtemp fails
    with http_only(data, work_dir=str(work)) as server:
        port = server.address[1]
        status, _, page = request(port, "/", host="127.0.0.1")  # before any report
        assert status == 200 and b"Computing the report of" in page
        assert b"<script>" not in page
        assert html.escape(str(data)).encode() in page
        server.refresh_now()
        status, _, page = request(port, "/", host="127.0.0.1")
        assert status == 200 and b"report failed" in page
        assert b"<img" not in page
        assert html.escape(str(work)).encode() in page
        status, headers, body = request(port, "/report.json", host="127.0.0.1")
        assert status == 503 and headers["Content-Type"] == "application/json"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert str(work) in json.loads(body)["error"]


def test_a_client_that_sends_nothing_is_dropped(data: Path) -> None:
    """Each connection holds a thread: one that never sends a request is closed after
    the request timeout instead of holding its thread for ever."""
    with http_only(data, request_timeout=0.5) as server:
        with socket.create_connection(("127.0.0.1", server.address[1]), timeout=WAIT) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n")  # and never the rest
            assert sock.recv(65536) == b""  # the server closed it (a timeout would raise)
        assert request(server.address[1], "/", host="127.0.0.1")[0] == 200  # still serving


def test_stop_does_not_wait_for_a_report_being_computed(data: Path) -> None:
    """Ctrl-C on ``serve`` stops it at once, even while a report (of a large crawl, on a
    loaded machine) is being computed: the computation is dropped, not waited for."""
    computing, release = threading.Event(), threading.Event()

    def slow_augment(report: dict[str, Any]) -> None:
        computing.set()
        release.wait(WAIT)

    server = ReportServer(str(data), port=0, rank=False, augment=slow_augment).start()
    ended: list[bool] = []
    try:
        assert computing.wait(WAIT)
        stopper = threading.Thread(target=lambda: ended.append(server.stop(wait=0.2)),
                                   daemon=True)
        stopper.start()
        stopper.join(timeout=WAIT / 2)
        assert not stopper.is_alive() and not release.is_set()  # stopped mid-computation
        assert ended == [False]  # ...and says so: the process must not finalize (below)
    finally:
        release.set()


def test_stop_says_whether_a_search_is_still_being_answered(data: Path) -> None:
    """A request's thread is a daemon too: a search under way (in tantivy's native code)
    makes stop() answer False, as a report does; once it is answered, True."""
    searching, release = threading.Event(), threading.Event()

    def slow_search(query: str) -> tuple[int, str]:
        searching.set()
        release.wait(WAIT)
        return 200, "<p>found</p>"

    server = ReportServer(str(data), port=0, rank=False, search=slow_search).start()
    try:
        assert server.wait_ready(WAIT)
        asker = threading.Thread(target=request, args=(server.address[1], "/search?q=x"),
                                 kwargs={"host": "127.0.0.1"}, daemon=True)
        asker.start()
        assert searching.wait(WAIT)
        assert server.stop(wait=0.2) is False
        release.set()
        asker.join(WAIT)
        assert server.stop(wait=WAIT) is True
    finally:
        release.set()


def test_stop_with_nothing_under_way_says_so(data: Path) -> None:
    server = ReportServer(str(data), port=0, rank=False).start()
    try:
        assert server.wait_ready(WAIT)
        assert request(server.address[1], "/", host="127.0.0.1")[0] == 200
    finally:
        assert server.stop(wait=WAIT) is True


# serve as ``python -m crawler`` runs it, with stop() waiting for nothing (so a report
# under way is left to the exit) and a line the interpreter's shutdown would print.
SERVE_NOW = """
import atexit, runpy, sys
import crawler.read.serve
crawler.read.serve.STOP_WAIT = 0.0
atexit.register(lambda: print("interpreter shutdown ran", file=sys.stderr, flush=True))
sys.argv[0] = "crawler"
runpy.run_module("crawler", run_name="__main__", alter_sys=True)
"""


# serve with a SIGTERM that lands inside ReportServer.start (after its threads started,
# before the command's loop), and a line each time the server is stopped
SERVE_SIGTERM_IN_START = """
import os, runpy, signal, sys, time
import crawler.read.serve as serve
start, stop = serve.ReportServer.start, serve.ReportServer.stop
def start_then_sigterm(self):
    start(self)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # its handler raises here
    return self
def stop_and_say(self, wait=None):
    print("server stopped", file=sys.stderr, flush=True)
    return stop(self, wait)
serve.ReportServer.start, serve.ReportServer.stop = start_then_sigterm, stop_and_say
sys.argv[0] = "crawler"
runpy.run_module("crawler", run_name="__main__", alter_sys=True)
"""


# serve with its SIGTERM taken by another thread (the kernel may hand a process's signal
# to any thread that does not block it): the C handler runs there, the main thread only
# learns of it when it runs Python again
SERVE_SIGTERM_TO_A_THREAD = """
import runpy, signal, sys, threading
import crawler.read.serve as serve
start = serve.ReportServer.start
def start_then_sigterm_a_thread(self):
    start(self)
    http = next(t for t in self._threads if t.name == "serve-http")
    threading.Timer(0.5, signal.pthread_kill, (http.ident, signal.SIGTERM)).start()
    return self
serve.ReportServer.start = start_then_sigterm_a_thread
sys.argv[0] = "crawler"
runpy.run_module("crawler", run_name="__main__", alter_sys=True)
"""


def test_a_sigterm_taken_by_another_thread_stops_serve(data: Path) -> None:
    """The command waited on an untimed lock, which such a signal does not wake: serve
    went on forever (the oldest leg of stop 52's CI: 60 s after SIGTERM, still serving)."""
    proc = start_python(["-c", SERVE_SIGTERM_TO_A_THREAD, "serve", str(data), "--port", "0",
                         "--no-rank"])
    err = ended(proc, WAIT)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err, err[-2000:]


def test_a_sigterm_as_serve_starts_stops_the_server(data: Path, tmp_path: Path) -> None:
    """A signal between the server's start and the command's wait (stop 50's CI: the
    test below hung 60 s when its SIGTERM came just after the first line) stops the
    server too: its threads are not left to the interpreter's shutdown."""
    proc = start_python(["-c", SERVE_SIGTERM_IN_START, "serve", str(data), "--port", "0",
                         "--no-rank"], MPLCONFIGDIR=str(tmp_path))
    err = ended(proc, WAIT)
    assert proc.returncode == 143, err[-2000:]
    assert err.count("server stopped") == 1 and "Traceback" not in err, err[-2000:]


@pytest.mark.slow
def test_sigterm_while_the_first_report_is_computed_exits_143(data: Path,
                                                              tmp_path: Path) -> None:
    """The first report builds matplotlib's font cache (C++) in a daemon thread; a SIGTERM
    then aborted the interpreter's shutdown ("terminate called without an active
    exception", SIGABRT or SIGSEGV; 7 of 10 times by hand on a 692-page crawl) or hung it.
    serve now ends without that shutdown while a thread is still at work: 143 each time."""
    left_at_work = 0  # stops that found the report still under way (the case here)
    for attempt in range(8):
        fresh = tmp_path / f"mpl{attempt}"  # no font cache: the first report takes a while
        fresh.mkdir()
        proc = start_python(["-c", SERVE_NOW, "serve", str(data), "--port", "0", "--no-rank"],
                            MPLCONFIGDIR=str(fresh))
        try:
            assert proc.stdout is not None
            assert "serving the report" in proc.stdout.readline()
        finally:
            proc.send_signal(signal.SIGTERM)
            err = ended(proc, WAIT)
        assert proc.returncode == 143, (attempt, err[-2000:])
        assert "terminate called" not in err and "Traceback" not in err, err[-2000:]
        # A loaded machine may finish the report before the signal lands: then the
        # ordinary shutdown runs, rightly. os._exit is for a report still under way.
        left_at_work += "interpreter shutdown ran" not in err
        if left_at_work == 3:
            break
    assert left_at_work >= 1
