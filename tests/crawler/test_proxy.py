"""--proxy (crawler.net.proxy): crawls and fetches through a real tinyproxy (HTTP CONNECT)
and a real microsocks (SOCKS5) on loopback.

Each proxy connects out from its own loopback address (tinyproxy's Bind, microsocks -b),
which the test web logs as the request's peer: a request that went direct comes from
127.0.0.1, so "every request came from the proxy's address" is what proves the proxy
carried the crawl. tinyproxy's log shows what CONNECT asked for (the IP, never the name).
"""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import cli_args, fetched_urls, records, run_cli, run_crawl

from crawler.cli import main
from crawler.exceptions import ConfigError, FetchError
from crawler.net.fetch import Fetcher
from crawler.net.proxy import Proxy, parse_option, parse_proxy, proxy_map, redact
from tools import system_packages
from tools.testweb import TestWeb, fault

MakeWeb = Callable[..., TestWeb]
TINYPROXY_OUT = "127.0.0.7"  # the address tinyproxy connects out from (its Bind)
MICROSOCKS_OUT = "127.0.0.8"  # microsocks -b
DIRECT = "127.0.0.1"  # where the crawler's own connections come from
START_TIMEOUT = 30.0  # seconds a proxy may take to listen on a loaded machine
SECRET = "S3cret-pw"


# -- the proxies ---------------------------------------------------------------------------


@dataclass
class Running:
    """A proxy process listening on 127.0.0.1:``port``."""

    scheme: str
    port: int
    log: Path  # tinyproxy's log file; microsocks's output

    def url(self, scheme: str = "", auth: str = "") -> str:
        return f"{scheme or self.scheme}://{auth + '@' if auth else ''}127.0.0.1:{self.port}"

    def requests(self) -> list[str]:
        """tinyproxy's logged request lines ("CONNECT 127.0.0.1:8080 HTTP/1.1")."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line.split("): ", 1)[1] for line in text.splitlines() if "Request (file" in line]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Proxies:
    """Starts proxies for one test and stops them at its end."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.procs: list[subprocess.Popen[bytes]] = []

    def tinyproxy(self, *conf: str) -> Running:
        why = system_packages.missing("tinyproxy")
        if why is not None:
            pytest.skip(why)  # a failure in CI (tests/conftest.py)
        port = _free_port()
        log = self.dir / f"tinyproxy-{port}.log"
        path = self.dir / f"tinyproxy-{port}.conf"
        path.write_text("\n".join([
            f"Port {port}", "Listen 127.0.0.1", f"Bind {TINYPROXY_OUT}", "Timeout 30",
            "MaxClients 64", "Allow 127.0.0.1", "LogLevel Info", f'LogFile "{log}"',
            "DisableViaHeader Yes", *conf]) + "\n")
        return self._start(["tinyproxy", "-d", "-c", str(path)], Running("http", port, log))

    def microsocks(self, *args: str) -> Running:
        why = system_packages.missing("microsocks")
        if why is not None:
            pytest.skip(why)  # a failure in CI (tests/conftest.py)
        port = _free_port()
        out = self.dir / f"microsocks-{port}.out"
        argv = ["microsocks", "-i", "127.0.0.1", "-p", str(port), "-b", MICROSOCKS_OUT, *args]
        return self._start(argv, Running("socks5", port, out))

    def _start(self, argv: list[str], running: Running) -> Running:
        out = self.dir / f"{argv[0]}-{running.port}.stderr"
        with open(out, "wb") as sink:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
        self.procs.append(proc)
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # until it accepts (a probe connection: no request, nothing logged)
            try:
                socket.create_connection(("127.0.0.1", running.port), timeout=1.0).close()
                return running
            except OSError:
                assert proc.poll() is None, f"{argv[0]} ended: {out.read_text()}"
                assert time.monotonic() < deadline, f"{argv[0]} does not listen"
                time.sleep(0.02)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def proxies(tmp_path: Path) -> Iterator[Proxies]:
    p = Proxies(tmp_path)
    yield p
    p.stop()


def _proxy_of(kind: str, proxies: Proxies) -> tuple[str, str]:
    """A running proxy of ``kind`` (http, socks5, socks5h): its URL and its out address."""
    if kind == "http":
        return proxies.tinyproxy().url(), TINYPROXY_OUT
    return proxies.microsocks().url(kind), MICROSOCKS_OUT


@pytest.fixture
def make_fetcher() -> Iterator[Callable[..., Fetcher]]:
    made: list[Fetcher] = []

    def make(web: TestWeb, *values: str, **kwargs: Any) -> Fetcher:
        hosts = web.records()
        kwargs.setdefault("ca_bundle", str(web.ca_file))
        kwargs.setdefault("total_timeout", 10.0)
        f = Fetcher(user_agent="kvcrawl-test", resolve=lambda host: hosts.get(host, DIRECT),
                    proxies=proxy_map(values), **kwargs)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def fetch_error(f: Fetcher, url: str) -> FetchError:
    with pytest.raises(FetchError) as info:
        f.fetch(url)
    return info.value


# -- parsing --------------------------------------------------------------------------------


class TestParse:
    def test_a_proxy_url_is_split_with_its_default_port(self) -> None:
        assert parse_proxy("http://proxy.example") == Proxy("http", "proxy.example", 80)
        assert parse_proxy("SOCKS5H://10.0.0.1/") == Proxy("socks5h", "10.0.0.1", 1080)
        assert parse_proxy("https://[::1]:8443") == Proxy("https", "::1", 8443)

    def test_credentials_are_read_and_never_shown(self) -> None:
        p = parse_proxy("socks5://bob:s%40cret@127.0.0.1:1080")
        assert (p.username, p.password) == ("bob", "s@cret")
        assert str(p) == "socks5://***@127.0.0.1:1080"
        assert "s@cret" not in repr(p) and "bob" not in repr(p)

    @pytest.mark.parametrize("value", [
        "ftp://u:hunter2@proxy:21", "proxy:3128", "http://", "http://u:hunter2@proxy:99999",
        "http://u:hunter2@proxy:1/path", "http://hunter2@proxy:1", "http://pro xy:1",
        "socks5://u:" + "hunter2" * 40 + "@proxy:1", "u:hunter2@proxy:3128",
        "http=u:hunter2@proxy:3128",
    ])
    def test_a_bad_proxy_is_a_config_error_without_its_credentials(self, value: str) -> None:
        with pytest.raises(ConfigError) as info:
            parse_option(value)
        assert "hunter2" not in str(info.value) and "\n" not in str(info.value)

    def test_options_name_targets_and_later_ones_win(self) -> None:
        socks = parse_proxy("socks5://127.0.0.1:1")
        assert parse_option("https=socks5://127.0.0.1:1") == (("https",), socks)
        assert proxy_map(["socks5://127.0.0.1:1", "http=none"]) == {"https": socks}
        assert proxy_map(["http=socks5://127.0.0.1:1", "none"]) == {}
        with pytest.raises(ConfigError, match="target scheme"):
            parse_option("ftp=http://127.0.0.1:1")

    def test_an_https_proxy_carries_http_targets_only(self) -> None:
        assert parse_option("http=https://p:443")[0] == ("http",)
        for value in ("https://p:443", "https=https://p:443"):
            with pytest.raises(ConfigError, match="http targets only"):
                parse_option(value)

    def test_redact_hides_what_a_url_parser_reads_as_credentials(self) -> None:
        assert redact("http=http://u:p@ss@h:1/") == "http=http://***@h:1/"
        assert redact("socks5://h:1") == "socks5://h:1"
        assert redact("none") == "none"

    def test_the_saved_form_asks_for_the_credentials_again(self) -> None:
        with pytest.raises(ConfigError, match="never saved: give --proxy again"):
            parse_proxy(redact("http://alice:pw@127.0.0.1:3128"))


# -- the handshakes, one fetch at a time -------------------------------------------------------


class TestConnect:
    def test_the_tunnel_goes_to_the_checked_ip_for_http_and_https(
        self, testweb: TestWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        tiny = proxies.tinyproxy()
        f = make_fetcher(testweb, tiny.url())
        for host, scheme in (("h0.test", "http"), ("h2.test", "https")):
            r = f.fetch(testweb.url(host))
            assert (r.status, r.ip) == (200, testweb.records()[host])
            [rec] = testweb.log.records(host=host)
            assert (rec.scheme, rec.peer) == (scheme, TINYPROXY_OUT)
        assert testweb.log.records(host="h2.test")[0].sni == "h2.test"
        asked = tiny.requests()  # CONNECT to the IP: the proxy never saw a name to resolve
        assert asked == [f"CONNECT 127.0.0.1:{testweb.http_port} HTTP/1.1",
                         f"CONNECT 127.0.0.1:{testweb.https_port} HTTP/1.1"]

    def test_the_target_certificate_is_checked_inside_the_tunnel(
        self, make_testweb: MakeWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        web = make_testweb(pages=20, hosts=3, faults=[fault("bad_cert")])
        url = proxies.tinyproxy().url()
        assert fetch_error(make_fetcher(web, url), web.url("badcert.test")).reason == "tls"
        untrusting = make_fetcher(web, url, ca_bundle=None)  # certifi's roots, not the web's CA
        assert fetch_error(untrusting, web.url("h2.test")).reason == "tls"
        assert web.log.records() == []

    def test_proxy_credentials_go_as_basic_auth(
        self, testweb: TestWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        tiny = proxies.tinyproxy(f"BasicAuth alice {SECRET}")
        url = testweb.url("h0.test")
        assert make_fetcher(testweb, tiny.url(auth=f"alice:{SECRET}")).fetch(url).status == 200
        wrong = fetch_error(make_fetcher(testweb, tiny.url(auth="alice:nope")), url)
        assert wrong.reason == "connect_error" and "refused the credentials" in wrong.detail
        none = fetch_error(make_fetcher(testweb, tiny.url()), url)
        assert none.reason == "connect_error" and "wants credentials" in none.detail
        assert "407" in none.detail and "nope" not in wrong.detail
        assert len(testweb.log.records()) == 1

    def test_a_proxy_refusing_connect_to_the_port_is_connect_error(
        self, testweb: TestWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        tiny = proxies.tinyproxy("ConnectPort 443")  # what real proxies allow: not port 80
        err = fetch_error(make_fetcher(testweb, tiny.url()), testweb.url("h0.test"))
        assert err.reason == "connect_error" and "403" in err.detail
        assert testweb.log.records() == []

    def test_an_https_proxy_is_spoken_to_in_tls(
        self, testweb: TestWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        tiny = proxies.tinyproxy()
        assert testweb.tls is not None
        with TLSFront(testweb.tls.ca.issue_cert("127.0.0.1"), tiny.port) as front:
            f = make_fetcher(testweb, f"http=https://127.0.0.1:{front.port}")
            assert f.fetch(testweb.url("h0.test")).status == 200
            assert front.handshakes == 1
            f.close()  # its kept connection ends, and with it the relay's threads
        assert [r.peer for r in testweb.log.records()] == [TINYPROXY_OUT]
        assert tiny.requests() == [f"CONNECT 127.0.0.1:{testweb.http_port} HTTP/1.1"]


class TestSocks5:
    def test_socks5h_sends_the_checked_ip_never_the_name(
        self, testweb: TestWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        # A label of 64 characters: no resolver looks it up (refused before any query),
        # so the proxy could not have reached the server had it been given the name.
        name = "a" * 64 + ".test"
        f = make_fetcher(testweb, proxies.microsocks().url("socks5h"))
        r = f.fetch(f"http://{name}:{testweb.http_port}/")
        assert r.ip == DIRECT and r.status == 421  # the test web does not serve that name
        [rec] = testweb.log.records()
        assert (rec.host, rec.peer) == (name, MICROSOCKS_OUT)

    def test_user_and_password_rfc1929(
        self, testweb: TestWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        socks = proxies.microsocks("-u", "bob", "-P", SECRET)
        url = testweb.url("h2.test")  # https inside the SOCKS tunnel
        assert make_fetcher(testweb, socks.url(auth=f"bob:{SECRET}")).fetch(url).status == 200
        wrong = fetch_error(make_fetcher(testweb, socks.url(auth="bob:nope")), url)
        assert wrong.reason == "connect_error" and "refused the user name" in wrong.detail
        none = fetch_error(make_fetcher(testweb, socks.url()), url)
        assert none.reason == "connect_error" and "USER:PASSWORD@" in none.detail
        assert [r.peer for r in testweb.log.records()] == [MICROSOCKS_OUT]

    def test_a_target_refusing_behind_the_proxy_is_connect_refused(
        self, testweb: TestWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        f = make_fetcher(testweb, proxies.microsocks().url())
        err = fetch_error(f, f"http://h0.test:{_free_port()}/")
        assert err.reason == "connect_refused" and "SOCKS5 reply 5" in err.detail

    def test_one_scheme_through_the_proxy_the_other_direct(
        self, testweb: TestWeb, proxies: Proxies, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        f = make_fetcher(testweb, "https=" + proxies.microsocks().url())
        for _ in range(2):  # the second ones on pooled connections: never the other kind
            f.fetch(testweb.url("h0.test"))
            f.fetch(testweb.url("h2.test"))
        peers = {(r.scheme, r.peer) for r in testweb.log.records()}
        assert peers == {("http", DIRECT), ("https", MICROSOCKS_OUT)}


class TestDeadProxies:
    def test_a_closed_port_is_connect_refused_naming_the_proxy(
        self, testweb: TestWeb, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        port = _free_port()
        for scheme in ("http", "socks5"):
            f = make_fetcher(testweb, f"{scheme}://127.0.0.1:{port}")
            err = fetch_error(f, testweb.url("h0.test"))
            assert err.reason == "connect_refused" and f"127.0.0.1:{port}" in err.detail

    def test_a_silent_proxy_is_connect_timeout_not_a_hang(
        self, testweb: TestWeb, make_fetcher: Callable[..., Fetcher]
    ) -> None:
        with socket.socket() as silent:  # accepts (the kernel does), never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            for scheme in ("http", "socks5"):
                f = make_fetcher(testweb, f"{scheme}://127.0.0.1:{silent.getsockname()[1]}",
                                 connect_timeout=0.3)
                assert fetch_error(f, testweb.url("h0.test")).reason == "connect_timeout"


# -- crawls ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["http", "socks5", "socks5h"])
def test_a_crawl_through_the_proxy_is_the_oracle_crawl(
    kind: str, make_testweb: MakeWeb, proxies: Proxies, tmp_path: Path
) -> None:
    web = make_testweb(pages=60, hosts=3, seed=0, crawl_delay=0.0, faults=[fault("bad_cert")])
    url, out = _proxy_of(kind, proxies)
    engine = run_crawl(web, tmp_path / "c", proxy=(url,))
    assert engine.complete
    want = web.oracle.crawl()
    assert fetched_urls(tmp_path / "c") == set(want.fetched)
    assert web.log.urls() == set(want.requests)  # robots.txt and sitemaps included
    assert {r.peer for r in web.log.records()} == {out}  # every one through the proxy
    assert {r.scheme for r in web.log.records()} == {"http", "https"}
    assert {r.reason for u, r in records(tmp_path / "c").items() if "badcert" in u} == {"tls"}


@pytest.mark.parametrize("kind", ["http", "socks5h"])
def test_a_private_target_is_refused_through_the_proxy(
    kind: str, testweb: TestWeb, proxies: Proxies, tmp_path: Path
) -> None:
    url, _ = _proxy_of(kind, proxies)  # the proxy itself is on loopback: that is allowed
    engine = run_crawl(testweb, tmp_path / "c", proxy=(url,), allow_private_ips=False)
    assert engine.complete
    assert [r.reason for r in records(tmp_path / "c").values()] == ["private_ip"]
    assert testweb.log.records() == []
    if kind == "http":  # nothing was asked of the proxy either
        assert Running("http", 0, next(proxies.dir.glob("tinyproxy-*.log"))).requests() == []


def test_a_crawl_through_a_dead_proxy_ends_with_connect_refused(
    testweb: TestWeb, tmp_path: Path
) -> None:
    engine = run_crawl(testweb, tmp_path / "c", proxy=(f"http://127.0.0.1:{_free_port()}",))
    assert engine.complete
    assert [r.reason for r in records(tmp_path / "c").values()] == ["connect_refused"]
    assert testweb.log.records() == []


# -- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["gopher://u:hunter2@127.0.0.1:1", "http://u:hunter2@",
                                   "ftp=http://127.0.0.1:1", "https://u:hunter2@127.0.0.1:1"])
def test_a_bad_proxy_is_one_line_exit_2_and_writes_nothing(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "c"
    assert main(["start", "http://a.test/", "--data", str(data), "--proxy", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crawler: error: argument --proxy: ") and err.count("\n") == 1
    assert "hunter2" not in err and "Traceback" not in err
    assert not data.exists()


def test_a_damaged_saved_proxy_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "c"
    data.mkdir()
    (data / "seeds.txt").write_text("http://a.test/\n")
    settings = data / "settings.json"
    settings.write_text('{"format": 1, "settings": {"proxy": ["gopher://127.0.0.1:1"]}}')
    before = settings.read_bytes()
    assert main(["start", "--data", str(data), "--proxy", "none"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"crawler: error: {settings}: setting 'proxy': ") and err.count("\n") == 1
    assert settings.read_bytes() == before


def test_proxy_credentials_are_never_written_or_logged(
    make_testweb: MakeWeb, proxies: Proxies, tmp_path: Path
) -> None:
    web = make_testweb(pages=30, hosts=3, seed=1, crawl_delay=0.0)
    tiny = proxies.tinyproxy(f"BasicAuth alice {SECRET}")
    data = tmp_path / "c"
    given = tiny.url(auth=f"alice:{SECRET}")
    first = run_cli(cli_args(web, data, "--proxy", given))
    assert first.returncode == 0, first.stderr
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)
    assert {r.peer for r in web.log.records()} == {TINYPROXY_OUT}
    assert f"through the proxy http://***@127.0.0.1:{tiny.port}" in first.stderr
    # A resume without --proxy cannot use it (its credentials were not saved): it says so.
    bare = run_cli([*cli_args(web, data)[:3], "start", "--data", str(data)])
    assert bare.returncode == 2
    assert "never saved: give --proxy again" in bare.stderr
    again = run_cli([*cli_args(web, data)[:3], "start", "--data", str(data), "--proxy", given])
    assert again.returncode == 0, again.stderr
    token = base64.b64encode(f"alice:{SECRET}".encode())
    for out in (first, bare, again):
        assert SECRET not in out.stdout + out.stderr
    written = [p for p in data.rglob("*") if p.is_file()]
    assert len(written) > 5
    for path in written:
        blob = path.read_bytes()
        assert SECRET.encode() not in blob and token not in blob, path
    assert f"http://***@127.0.0.1:{tiny.port}" in (data / "settings.json").read_text()


# -- an https:// proxy: TLS in front of tinyproxy ---------------------------------------------


class TLSFront:
    """A TLS listener on 127.0.0.1 relaying each connection to 127.0.0.1:``port`` in
    plain TCP: with tinyproxy behind it, an https:// proxy (a context manager)."""

    def __init__(self, cert: Any, port: int) -> None:
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(self._ctx)
        self._to = port
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.handshakes = 0
        self._threads = [threading.Thread(target=self._serve, daemon=True)]

    def __enter__(self) -> TLSFront:
        self._threads[0].start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:  # wakes the accept() (a close alone does not, on Linux)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for t in self._threads:
            t.join(timeout=10)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed: the test is over
                return
            try:
                tls = self._ctx.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                continue
            self.handshakes += 1
            t = threading.Thread(target=_relay, args=(tls,), kwargs={"port": self._to},
                                 daemon=True)
            t.start()
            self._threads.append(t)


def _relay(tls: socket.socket, *, port: int) -> None:
    """Bytes both ways between ``tls`` and a new connection to ``port``, then both closed."""
    back = socket.create_connection(("127.0.0.1", port))
    there = threading.Thread(target=_pump, args=(tls, back), daemon=True)
    there.start()
    _pump(back, tls)
    there.join()
    tls.close()
    back.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):  # the other direction ends too
        try:
            socket.socket.shutdown(s, socket.SHUT_RDWR)
        except OSError:
            pass
