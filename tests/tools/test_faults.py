"""Every fault of the hostile web, checked from the client side (requests, raw sockets,
dnspython) and in the request log."""

from __future__ import annotations

import gzip
import socket
import time
import zlib

import dns.exception
import dns.message
import dns.query
import dns.rcode
import lxml.html
import pytest
import requests

from tools.testweb import SiteConfig, TestWeb, fault, hostile
from tools.testweb.site import Site
from tools.testweb.urls import REFUSED_IP

TIMEOUT = 5.0
PARAMS = {
    "slow_first_byte": {"delay": 0.5},
    "slow_drip": {"interval": 0.02, "size": 20},
    "reset": {"after": 300, "size": 5000},
    "huge_body": {"size": 64 << 20},
    "gzip_bomb": {"size": 32 << 20},
    "dns_slow": {"delay": 0.5},
    "robots_slow": {"delay": 0.5},
    "robots_huge": {"size": 700_000},
    "status_429": {"retry_after": 7, "times": 2},
}


@pytest.fixture(scope="module")
def web():
    with TestWeb(SiteConfig(pages=30, hosts=3, seed=4), faults=hostile(**PARAMS)) as w:
        yield w


@pytest.fixture
def http(web: TestWeb) -> requests.Session:
    web.reset()
    return web.session()


def get(web: TestWeb, http: requests.Session, path: str, host: str = "h0.test",
        **kw: object) -> requests.Response:
    return http.get(web.url(host, path), timeout=TIMEOUT, allow_redirects=False, **kw)


def wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Wait for an event the server records asynchronously (never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the server never recorded the event"
        time.sleep(0.01)


class TestResponseFaults:
    def test_slow_first_byte(self, web: TestWeb, http: requests.Session) -> None:
        with pytest.raises(requests.exceptions.ReadTimeout):
            http.get(web.url("h0.test", "/x/slow_first_byte/1"), timeout=(TIMEOUT, 0.05))
        r = get(web, http, "/x/slow_first_byte/1")
        assert r.status_code == 200
        rec = web.log.records(path="/x/slow_first_byte/1", done=True)[-1]
        assert rec.end - rec.start >= 0.5  # the delay is a floor, not a measurement

    def test_slow_drip(self, web: TestWeb, http: requests.Session) -> None:
        r = get(web, http, "/x/slow_drip/1", stream=True)
        chunks = list(r.iter_content(1))
        assert len(chunks) == 20 and all(len(c) == 1 for c in chunks)
        (rec,) = web.log.records(path="/x/slow_drip/1")
        assert rec.bytes == 20 and rec.outcome == "ok"
        assert rec.end - rec.start >= 19 * 0.02

    def test_reset_mid_body(self, web: TestWeb, http: requests.Session) -> None:
        with socket.create_connection(("127.0.0.1", web.http_port), TIMEOUT) as s:
            s.sendall(b"GET /x/reset/1 HTTP/1.1\r\nHost: h0.test\r\n\r\n")
            got = b""
            with pytest.raises(ConnectionResetError):
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        assert b"Content-Length: 5000" in head and 0 <= len(body) <= 300
        (rec,) = web.log.records(path="/x/reset/1")
        assert rec.outcome == "reset" and rec.bytes == 300
        broken = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)
        with pytest.raises(broken):
            get(web, http, "/x/reset/1").content  # noqa: B018

    def test_huge_body_stops_when_the_client_leaves(self, web: TestWeb,
                                                   http: requests.Session) -> None:
        r = get(web, http, "/x/huge_body/1", stream=True)
        assert int(r.headers["Content-Length"]) == 64 << 20
        read = 0
        for chunk in r.iter_content(65536):
            read += len(chunk)
            if read >= 1 << 20:
                break
        r.close()
        (rec,) = web.log.records(path="/x/huge_body/1")
        wait_for(lambda: rec.outcome == "aborted")
        assert (1 << 20) <= rec.bytes < 64 << 20

    def test_huge_body_chunked(self, make_testweb) -> None:  # type: ignore[no-untyped-def]
        w = make_testweb(pages=5, hosts=1, faults=[fault("huge_body", size=3 << 20, chunked=True)])
        r = w.session().get(w.url("h0.test", "/x/huge_body/1"), timeout=TIMEOUT)
        assert r.headers["Transfer-Encoding"] == "chunked" and len(r.content) == 3 << 20
        assert b"href" not in r.content

    def test_gzip_bomb(self, web: TestWeb, http: requests.Session) -> None:
        r = get(web, http, "/x/gzip_bomb/1", stream=True)
        assert r.headers["Content-Encoding"] == "gzip"
        wire = r.raw.read(decode_content=False)
        assert len(wire) == int(r.headers["Content-Length"]) < (32 << 20) // 500
        d = zlib.decompressobj(31)
        assert len(d.decompress(wire, 1 << 20)) == 1 << 20  # a limit is hit, not the end
        assert len(gzip.decompress(wire)) == 32 << 20

    @pytest.mark.parametrize("byte", [0, 255])
    def test_nul_body(self, make_testweb, byte: int) -> None:  # type: ignore[no-untyped-def]
        w = make_testweb(pages=5, hosts=1, faults=[fault("nul_body", size=3 << 20, byte=byte)])
        r = w.session().get(w.url("h0.test", "/x/nul_body/1"), timeout=TIMEOUT, stream=True)
        assert r.headers["Content-Encoding"] == "gzip"
        assert r.headers["Content-Type"].startswith("text/html")
        wire = r.raw.read(decode_content=False)
        assert len(wire) == int(r.headers["Content-Length"]) < (3 << 20) // 500
        assert gzip.decompress(wire) == bytes([byte]) * (3 << 20)

    def test_429_then_page(self, web: TestWeb, http: requests.Session) -> None:
        for _ in range(2):
            r = get(web, http, "/x/status_429/1")
            assert r.status_code == 429 and r.headers["Retry-After"] == "7"
        assert get(web, http, "/x/status_429/1").status_code == 200
        web.reset()
        assert get(web, http, "/x/status_429/1").status_code == 429  # counters reset

    def test_503_then_page(self, web: TestWeb, http: requests.Session) -> None:
        r = get(web, http, "/x/status_503/1")
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert get(web, http, "/x/status_503/1").status_code == 200
        assert [x.status for x in web.log.records(path="/x/status_503/1")] == [503, 200]

    def test_503_forever(self, make_testweb) -> None:  # type: ignore[no-untyped-def]
        w = make_testweb(pages=5, hosts=1, faults=[fault("status_503", times=-1)])
        s = w.session()
        assert {s.get(w.url("h0.test", "/x/status_503/1"), timeout=TIMEOUT).status_code
                for _ in range(3)} == {503}

    def test_500(self, web: TestWeb, http: requests.Session) -> None:
        r = get(web, http, "/x/status_500/1")
        assert r.status_code == 500 and b"href" not in r.content

    def test_wrong_type(self, web: TestWeb, http: requests.Session) -> None:
        r = get(web, http, "/x/wrong_type/1")
        assert r.headers["Content-Type"] == "text/plain" and b"<a href" in r.content
        assert web.oracle.describe(r.url).links == ()  # type: ignore[union-attr]

    def test_fault_on_a_prefix_of_a_site_host(self, make_testweb) -> None:  # type: ignore[no-untyped-def]
        w = make_testweb(pages=40, hosts=2, faults=[fault("status_500", host="h1.test",
                                                          prefix="/s")])
        s = w.session()
        assert s.get(w.url("h1.test"), timeout=TIMEOUT).status_code == 200
        pages = [u for u in w.oracle.crawl(obey_robots=False).fetched
                 if u.startswith(w.url("h1.test", "/s"))]
        assert pages and all(s.get(u, timeout=TIMEOUT).status_code == 500 for u in pages)


class TestFeatures:
    def test_redirect_loop_and_chain(self, web: TestWeb, http: requests.Session) -> None:
        http.max_redirects = 30
        with pytest.raises(requests.TooManyRedirects):
            http.get(web.url("h0.test", "/x/redirects/loop-a"), timeout=TIMEOUT)
        r = http.get(web.url("h0.test", "/x/redirects/chain/0"), timeout=TIMEOUT)
        assert r.status_code == 200 and len(r.history) == 10
        assert r.url.endswith("/x/redirects/chain/end")

    def test_redirects_to_other_hosts_and_relative(self, web: TestWeb,
                                                   http: requests.Session) -> None:
        r = get(web, http, "/x/redirects/to-host")
        assert r.status_code == 301 and r.headers["Location"] == web.url("h1.test")
        assert get(web, http, "/x/redirects/to-out").headers["Location"] == web.url("out.test")
        assert get(web, http, "/x/redirects/relative").headers["Location"] == "rel-target"
        for code in (303, 307, 308):
            r = http.get(web.url("h0.test", f"/x/redirects/{code}"), timeout=TIMEOUT)
            assert r.history[0].status_code == code and r.status_code == 200
        assert http.get(web.url("h0.test", "/x/redirects/to-out"),
                        timeout=TIMEOUT).url == web.url("out.test")

    def test_binary_types(self, web: TestWeb, http: requests.Session) -> None:
        img = get(web, http, "/x/binary/image")
        assert img.headers["Content-Type"] == "image/png" and img.content[:4] == b"\x89PNG"
        pdf = get(web, http, "/x/binary/pdf")
        assert pdf.headers["Content-Type"] == "application/pdf" and pdf.content[:5] == b"%PDF-"
        fake = get(web, http, "/x/binary/png-as-html")
        assert fake.headers["Content-Type"] == "text/html" and fake.content[:4] == b"\x89PNG"

    @pytest.mark.parametrize(
        ("page", "codec", "word"),
        [("header", "latin-1", "café"), ("meta", "koi8-r", "привет"),
         ("sjis", "shift_jis", "日本"), ("conflict", "latin-1", "señal")],
    )
    def test_charsets(self, web: TestWeb, http: requests.Session, page: str, codec: str,
                      word: str) -> None:
        r = get(web, http, f"/x/charsets/{page}")
        assert f"/x/charsets/{word}".encode(codec) in r.content
        with pytest.raises(UnicodeDecodeError):
            r.content.decode("utf-8")
        from urllib.parse import quote
        assert get(web, http, "/x/charsets/" + quote(word)).status_code == 200
        bad = quote(word.encode(codec).decode("utf-8", "replace"))  # decoded as UTF-8: wrong
        assert get(web, http, "/x/charsets/" + bad).status_code == 404

    def test_malformed_and_deep_parse(self, web: TestWeb, http: requests.Session) -> None:
        for page in ("broken", "deep"):
            r = get(web, http, f"/x/malformed/{page}")
            doc = lxml.html.document_fromstring(r.content)
            hrefs = {a.get("href") for a in doc.iter("a")}
            assert "/x/malformed/ok-1" in hrefs or "/x/malformed/ok-4" in hrefs
        assert get(web, http, "/x/malformed/deep").content.count(b"<div>") == 20_000

    def test_base_href(self, web: TestWeb, http: requests.Session) -> None:
        r = get(web, http, "/x/base_href/rel")
        assert b'<base href="/x/base_href/dir/">' in r.content
        assert get(web, http, "/x/base_href/dir/a.html").status_code == 200
        assert get(web, http, "/x/base_href/a.html").status_code == 404  # base ignored

    def test_link_schemes_are_not_links(self, web: TestWeb, http: requests.Session) -> None:
        body = get(web, http, "/x/link_schemes/page").text
        for scheme in ("javascript:", "mailto:", "data:", "tel:", "ftp:"):
            assert f'href="{scheme}' in body
        links = web.oracle.describe(web.url("h0.test", "/x/link_schemes/page")).links  # type: ignore[union-attr]
        assert all(u.startswith("http://h0.test") for u in links)
        assert get(web, http, "/x/link_schemes/upper").status_code == 404  # path case kept

    def test_long_urls(self, web: TestWeb, http: requests.Session) -> None:
        for n, status in ((2000, 200), (8000, 200), (70_000, 414)):
            path = "/x/long_urls/a/"
            assert get(web, http, path + "x" * (n - len(path))).status_code == status

    def test_spider_trap_never_ends(self, web: TestWeb, http: requests.Session) -> None:
        r = get(web, http, "/x/spider_trap/2099-12")
        assert b"/x/spider_trap/2100-01" in r.content and b"/x/spider_trap/2099-11" in r.content
        assert get(web, http, "/x/spider_trap/9999-12").status_code == 200
        assert get(web, http, "/x/spider_trap/2024-13").status_code == 404

    def test_meta_robots(self, web: TestWeb, http: requests.Session) -> None:
        assert b'content="nofollow"' in get(web, http, "/x/meta_robots/nofollow").content
        assert get(web, http, "/x/meta_robots/header").headers["X-Robots-Tag"] == "nofollow"

    def test_idn_host(self, web: TestWeb) -> None:
        page = web.session().get(web.url("h0.test", "/x/idn/"), timeout=TIMEOUT)
        assert "http://bücher.test:" in page.text
        s = web.session(via_dns=True)
        assert s.get(web.url("xn--bcher-kva.test"), timeout=TIMEOUT).status_code == 200
        assert web.dns.queries("xn--bcher-kva.test")  # type: ignore[union-attr]


def dns_query(web: TestWeb, name: str, timeout: float = 2.0) -> dns.message.Message:
    ip, port = web.nameserver
    return dns.query.udp(dns.message.make_query(name, "A"), ip, port=port, timeout=timeout)


class TestHostFaults:
    def test_refused_host_resolves_but_refuses(self, web: TestWeb) -> None:
        answer = dns_query(web, "refused.test")
        assert answer.answer[0][0].address == REFUSED_IP
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((REFUSED_IP, web.http_port), TIMEOUT)
        with pytest.raises(requests.exceptions.ConnectionError):
            web.session(via_dns=True).get(web.url("refused.test"), timeout=TIMEOUT)

    def test_nxdomain(self, web: TestWeb) -> None:
        assert dns_query(web, "nx.test").rcode() == dns.rcode.NXDOMAIN
        assert dns_query(web, "example.com").rcode() == dns.rcode.NXDOMAIN

    def test_servfail(self, web: TestWeb) -> None:
        assert dns_query(web, "servfail.test").rcode() == dns.rcode.SERVFAIL

    def test_dns_timeout(self, web: TestWeb) -> None:
        with pytest.raises(dns.exception.Timeout):
            dns_query(web, "dnstimeout.test", timeout=0.3)

    def test_dns_slow(self, web: TestWeb) -> None:
        started = time.monotonic()
        assert dns_query(web, "dnsslow.test").answer
        assert time.monotonic() - started >= 0.5  # the delay is a floor

    def test_bad_cert(self, web: TestWeb) -> None:
        s = web.session()
        with pytest.raises(requests.exceptions.SSLError):
            s.get(web.url("badcert.test"), timeout=TIMEOUT)
        s.verify = False  # without the check the host answers: only the certificate is bad
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert s.get(web.url("badcert.test"), timeout=TIMEOUT).status_code == 200

    def test_robots_faults(self, web: TestWeb, http: requests.Session) -> None:
        assert get(web, http, "/robots.txt", host="robots5xx.test").status_code == 503
        huge = get(web, http, "/robots.txt", host="robotshuge.test")
        assert len(huge.content) == 700_000 and huge.text.startswith("User-agent: *\nDisallow:")
        garbage = get(web, http, "/robots.txt", host="robotsgarbage.test")
        assert garbage.status_code == 200 and b":" not in garbage.content
        slow = get(web, http, "/robots.txt", host="robotsslow.test")
        assert slow.status_code == 200
        (rec,) = web.log.records(host="robotsslow.test")
        assert rec.end - rec.start >= 0.5

    def test_robots_fault_on_a_site_host(self) -> None:
        from tools.testweb.graph import Graph

        site = Site(Graph(SiteConfig(pages=20, hosts=2)), [fault("robots_5xx", host="h1.test")],
                    http_port=8080, https_port=8443)
        assert site.lookup("h1.test", "/robots.txt").status == 503
        assert not site.robots_rules("h1.test").allowed("/")
