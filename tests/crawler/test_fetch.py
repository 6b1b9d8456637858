"""crawler.net.fetch against real loopback servers: the testweb (with its faults) and,
for answers the testweb never gives (garbage, deflate, dripped headers, a dropped
keep-alive connection), a tiny raw-socket server defined here."""

from __future__ import annotations

import email.utils
import gzip
import socket
import ssl
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crawler.exceptions import ConfigError, DNSError, FetchError, URLError
from crawler.net import watchdog
from crawler.net.answer import FetchResult, content_type, parse_content_type, parse_retry_after
from crawler.net.fetch import READ_CHUNK, Fetcher
from crawler.web.urls import normalize, parse
from tools.testweb import fault
from tools.testweb.harness import TestWeb
from tools.testweb.tls import TLS

CONNECT_TIMEOUT = 1.0
READ_TIMEOUT = 1.5
TOTAL_TIMEOUT = 4.0
MARGIN = 2.0  # seconds a timed-out fetch may take beyond its total_timeout on a busy machine
LIMIT = 1 << 20
UA = "kvcrawl-test/1.0"

MakeFetcher = Callable[..., Fetcher]


@pytest.fixture
def make_fetcher() -> Iterator[Callable[..., Fetcher]]:
    """``make_fetcher(web_or_records, **Fetcher kwargs)``; closed after the test."""
    made: list[Fetcher] = []

    def make(where: TestWeb | dict[str, str], **kwargs: Any) -> Fetcher:
        if isinstance(where, TestWeb):
            records = where.records()
            kwargs.setdefault("ca_bundle", str(where.ca_file))
        else:
            records = where
        kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT)
        kwargs.setdefault("read_timeout", READ_TIMEOUT)
        kwargs.setdefault("total_timeout", TOTAL_TIMEOUT)
        kwargs.setdefault("max_body_bytes", LIMIT)
        kwargs.setdefault("max_decoded_bytes", LIMIT)
        f = Fetcher(user_agent=UA, resolve=lambda host: records[host], **kwargs)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def reference_body(web: TestWeb, url: str) -> bytes:
    """The body as the testweb's own client (an independent requests session) gets it."""
    with web.session() as s:
        return s.get(url, allow_redirects=False, timeout=10).content


def fetch_error(f: Fetcher, url: str) -> FetchError:
    with pytest.raises(FetchError) as info:
        f.fetch(url)
    assert info.value.url == url
    return info.value


# -- plain HTTP, keep-alive, virtual hosts ---------------------------------------------------


class TestPlainHTTP:
    def test_200_body_headers_and_metadata(self, testweb: TestWeb, make_fetcher: MakeFetcher):
        f = make_fetcher(testweb)
        before = time.time()
        r = f.fetch(testweb.seed_url)
        assert r.status == 200 and r.url == testweb.seed_url
        assert r.body == reference_body(testweb, testweb.seed_url)
        assert r.wire_bytes == len(r.body) and not r.truncated and r.truncate_reason is None
        assert r.ip == "127.0.0.1" and r.http_version == "HTTP/1.1" and r.redirect is None
        assert before <= r.started <= time.time() and r.elapsed >= 0
        assert r.headers["content-length"] == str(len(r.body))
        assert r.headers["server"] == "testweb" and "date" in r.headers
        assert set(r.headers) <= {"content-type", "content-length", "content-encoding",
                                  "location", "retry-after", "last-modified", "etag", "server",
                                  "date", "x-robots-tag"}
        assert content_type(r) == ("text/html", "utf-8")
        req = testweb.log.records()[0]
        assert req.method == "GET" and req.target == "/" and req.host == "h0.test"

    def test_keep_alive_reuses_one_connection_per_host(self, testweb: TestWeb,
                                                       make_fetcher: MakeFetcher):
        f = make_fetcher(testweb)
        pages = sorted(u for u in testweb.oracle.crawl().fetched if "//h0.test" in u)[:8]
        assert len(pages) >= 3
        for url in pages:  # pages, 404s and redirects alike
            assert f.fetch(url).status < 500
        f.fetch(testweb.url("h1.test"))
        f.fetch(testweb.url("h1.test"))
        assert len(testweb.log.connections("h0.test")) == 1
        assert len(testweb.log.connections("h1.test")) == 1
        # Pools are per host: the two virtual hosts on one IP:port do not share one.
        assert testweb.log.connections("h0.test") != testweb.log.connections("h1.test")

    def test_host_header_selects_the_virtual_host(self, testweb: TestWeb,
                                                  make_fetcher: MakeFetcher):
        f = make_fetcher(testweb)
        a, b = testweb.url("h0.test"), testweb.url("h1.test")
        ra, rb = f.fetch(a), f.fetch(b)
        assert ra.body != rb.body
        assert ra.body == reference_body(testweb, a) and rb.body == reference_body(testweb, b)
        assert [r.host for r in testweb.log.records(path="/")][:2] == ["h0.test", "h1.test"]

    def test_a_parsed_url_is_sent_as_its_string_is(self, testweb: TestWeb,
                                                    make_fetcher: MakeFetcher):
        """The engine hands over a URL split once (crawler.web.urls.parse): same request."""
        f = make_fetcher(testweb)
        page = sorted(u for u in testweb.oracle.crawl().fetched if "//h1.test" in u)[0]
        url = normalize(page + "?q=1")
        by_text, by_parts = f.fetch(url), f.fetch(parse(url))
        assert by_parts.url == by_text.url == url
        assert (by_parts.status, by_parts.body) == (by_text.status, by_text.body)
        sent = [(r.scheme, r.host, r.port, r.target) for r in testweb.log.records()]
        assert sent[0] == sent[1] == ("http", "h1.test", testweb.http_port, parse(url).target)
        f.close()
        with pytest.raises(FetchError) as info:
            f.fetch(parse(url))
        assert (info.value.url, info.value.reason) == (url, "aborted")

    def test_error_statuses_are_results(self, make_testweb: Callable[..., TestWeb],
                                        make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("status_500")])
        f = make_fetcher(web)
        missing = f.fetch(web.url("h0.test", "/no/such/page.html"))
        assert missing.status == 404 and missing.body
        broken = f.fetch(web.url("h0.test", "/x/status_500/1"))
        assert broken.status == 500 and b"error" in broken.body.lower()

    @pytest.mark.parametrize("retry_after", ["7", email.utils.formatdate(2_000_000_000,
                                                                        usegmt=True)])
    def test_429_keeps_retry_after(self, make_testweb: Callable[..., TestWeb],
                                   make_fetcher: MakeFetcher, retry_after: str):
        web = make_testweb(pages=20, hosts=2,
                           faults=[fault("status_429", times=-1, retry_after=retry_after)])
        f = make_fetcher(web)
        r = f.fetch(web.url("h0.test", "/x/status_429/1"))
        assert r.status == 429 and r.headers["retry-after"] == retry_after
        now = 1_999_999_990.0
        assert parse_retry_after(r.headers["retry-after"], now) == pytest.approx(
            7.0 if retry_after == "7" else 10.0)

    def test_binary_content_is_returned_as_is(self, make_testweb: Callable[..., TestWeb],
                                              make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("binary")])
        f = make_fetcher(web)
        for name, mime in [("image", "image/png"), ("pdf", "application/pdf"),
                           ("octet", "application/octet-stream"), ("png-as-html", "text/html")]:
            url = web.url("h0.test", f"/x/binary/{name}")
            r = f.fetch(url)
            assert r.status == 200 and content_type(r)[0] == mime
            assert r.body == reference_body(web, url) and len(r.body) > 0
        assert f.fetch(web.url("h0.test", "/x/binary/image")).body.startswith(b"\x89PNG\r\n")

    def test_charset_from_header(self, make_testweb: Callable[..., TestWeb],
                                 make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("charsets")])
        r = make_fetcher(web).fetch(web.url("h0.test", "/x/charsets/header"))
        assert content_type(r) == ("text/html", "iso-8859-1")
        assert "Café".encode("latin-1") in r.body

    def test_very_long_urls(self, make_testweb: Callable[..., TestWeb],
                            make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("long_urls")])
        f = make_fetcher(web)
        base = web.url("h0.test", "/x/long_urls/a/")
        long_ok = web.url("h0.test", "/x/long_urls/a/" + "x" * (8000 - len("/x/long_urls/a/")))
        too_long = web.url("h0.test", "/x/long_urls/a/" + "x" * (70000 - len("/x/long_urls/a/")))
        assert f.fetch(long_ok).status == 200
        assert f.fetch(too_long).status == 414
        assert base in long_ok and {len(r.target) for r in web.log} == {8000, 70000}


# -- redirects ----------------------------------------------------------------------------


class TestRedirects:
    @pytest.mark.parametrize(("name", "status", "target"), [
        ("relative", 302, "/x/redirects/rel-target"),
        ("chain/0", 301, "/x/redirects/chain/1"),
        ("loop-a", 302, "/x/redirects/loop-b"),
        ("303", 303, "/x/redirects/target-303"),
        ("307", 307, "/x/redirects/target-307"),
        ("308", 308, "/x/redirects/target-308"),
    ])
    def test_redirect_is_returned_not_followed(self, make_testweb: Callable[..., TestWeb],
                                               make_fetcher: MakeFetcher, name: str,
                                               status: int, target: str):
        web = make_testweb(pages=20, hosts=2, faults=[fault("redirects")])
        f = make_fetcher(web)
        url = web.url("h0.test", f"/x/redirects/{name}")
        r = f.fetch(url)
        assert r.status == status and r.redirect == web.url("h0.test", target)
        assert "location" in r.headers
        assert [rec.target for rec in web.log] == [f"/x/redirects/{name}"]

    def test_redirect_to_another_host(self, make_testweb: Callable[..., TestWeb],
                                      make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("redirects")])
        r = make_fetcher(web).fetch(web.url("h0.test", "/x/redirects/to-host"))
        assert r.status == 301 and r.redirect == web.url("h1.test", "/")
        assert web.log.hosts() == {"h0.test"}


# -- HTTPS ---------------------------------------------------------------------------------


class TestHTTPS:
    def test_https_via_ip_with_sni_and_verified_cert(self, testweb: TestWeb,
                                                     make_fetcher: MakeFetcher):
        f = make_fetcher(testweb)
        url = testweb.url("h2.test")  # the last host is the HTTPS one
        assert url.startswith("https://")
        first, second = f.fetch(url), f.fetch(url)
        assert first.status == second.status == 200 and first.ip == "127.0.0.1"
        recs = testweb.log.records(host="h2.test")
        assert len(recs) == 2 and {r.sni for r in recs} == {"h2.test"}
        assert {r.scheme for r in recs} == {"https"}
        assert len(testweb.log.connections("h2.test")) == 1  # kept alive over TLS too
        assert first.body == reference_body(testweb, url)

    def test_untrusted_ca_is_tls_error(self, testweb: TestWeb, make_fetcher: MakeFetcher):
        f = make_fetcher(testweb, ca_bundle=None)  # certifi's roots, not the test CA
        err = fetch_error(f, testweb.url("h2.test"))
        assert err.reason == "tls" and "certificate" in err.detail.lower()

    def test_certificate_for_another_name_is_tls_error(self, make_testweb: Callable[..., TestWeb],
                                                       make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("bad_cert")])
        err = fetch_error(make_fetcher(web), web.url("badcert.test"))
        assert err.reason == "tls"
        assert web.log.records(host="badcert.test") == []  # no request was sent


# -- timeouts, resets, refused ------------------------------------------------------------------


class TestTransportFaults:
    def test_slow_first_byte_is_read_timeout(self, make_testweb: Callable[..., TestWeb],
                                             make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("slow_first_byte", delay=1.5)])
        f = make_fetcher(web, read_timeout=0.3)
        assert fetch_error(f, web.url("h0.test", "/x/slow_first_byte/1")).reason == "read_timeout"

    def test_slow_first_byte_within_read_timeout_is_fine(
            self, make_testweb: Callable[..., TestWeb], make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("slow_first_byte", delay=0.3)])
        f = make_fetcher(web, read_timeout=3.0)
        assert f.fetch(web.url("h0.test", "/x/slow_first_byte/1")).status == 200

    def test_slow_drip_hits_total_timeout_and_frees_the_thread(
            self, make_testweb: Callable[..., TestWeb], make_fetcher: MakeFetcher):
        # 200 bytes at one per 0.1 s: 20 s in all, every read well under read_timeout.
        web = make_testweb(pages=20, hosts=2, faults=[fault("slow_drip", interval=0.1)])
        f = make_fetcher(web, read_timeout=1.0, total_timeout=1.0)
        t0 = time.monotonic()
        err = fetch_error(f, web.url("h0.test", "/x/slow_drip/1"))
        assert err.reason == "total_timeout"
        assert time.monotonic() - t0 < 1.0 + MARGIN
        (rec,) = web.log.records(path="/x/slow_drip/1")
        assert 0 < rec.bytes < 200
        # The cut connection is thrown away; the host is still fetched normally.
        assert f.fetch(web.seed_url).status == 200
        assert len(web.log.connections("h0.test")) == 2

    def test_reset_mid_body(self, make_testweb: Callable[..., TestWeb],
                            make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("reset")])
        f = make_fetcher(web)
        err = fetch_error(f, web.url("h0.test", "/x/reset/1"))
        assert err.reason == "reset"
        assert f.fetch(web.seed_url).status == 200

    def test_connection_refused(self, make_testweb: Callable[..., TestWeb],
                                make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("refused")])
        assert web.records()["refused.test"] == "127.0.0.2"  # nothing listens there
        err = fetch_error(make_fetcher(web), web.url("refused.test"))
        assert err.reason == "connect_refused"

    def test_connect_timeout(self, make_fetcher: MakeFetcher):
        # A listener whose accept queue (backlog 0) is full: the kernel drops our SYN.
        with socket.socket() as lsock:
            lsock.bind(("127.0.0.1", 0))
            lsock.listen(0)
            port = lsock.getsockname()[1]
            filler = socket.create_connection(("127.0.0.1", port))
            try:
                f = make_fetcher({"full.test": "127.0.0.1"}, connect_timeout=0.3)
                err = fetch_error(f, f"http://full.test:{port}/")
            finally:
                filler.close()
        assert err.reason == "connect_timeout"

    def test_dns_error_propagates_unchanged(self, make_fetcher: MakeFetcher):
        failure = DNSError("nx.test", "nxdomain")

        def resolve(host: str) -> str:
            raise failure

        f = Fetcher(user_agent=UA, resolve=resolve)
        try:
            with pytest.raises(DNSError) as info:
                f.fetch("http://nx.test/")
            assert info.value is failure
        finally:
            f.close()


# -- size limits ---------------------------------------------------------------------------------


class TestLimits:
    @pytest.mark.parametrize("chunked", [False, True])
    def test_huge_body_is_cut_at_the_wire_limit(self, make_testweb: Callable[..., TestWeb],
                                                make_fetcher: MakeFetcher, chunked: bool):
        web = make_testweb(pages=20, hosts=2, faults=[fault("huge_body", chunked=chunked)])
        f = make_fetcher(web, max_body_bytes=300_000, max_decoded_bytes=LIMIT)
        r = f.fetch(web.url("h0.test", "/x/huge_body/1"))
        assert r.status == 200 and r.truncated and r.truncate_reason == "too_large"
        assert len(r.body) == r.wire_bytes == 300_000
        assert r.body.startswith(b"<p>testweb filler")
        # The rest is still on the wire: the connection is closed at once (the
        # server sees its reader go away) and a new one serves the next fetch.
        deadline = time.monotonic() + 5
        while web.server.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert web.server.open_connections == 0
        assert f.fetch(web.seed_url).status == 200
        assert len(web.log.connections("h0.test")) == 2

    def test_body_exactly_at_the_limit_is_whole(self, testweb: TestWeb,
                                                make_fetcher: MakeFetcher):
        size = len(reference_body(testweb, testweb.seed_url))
        f = make_fetcher(testweb, max_body_bytes=size, max_decoded_bytes=size)
        r = f.fetch(testweb.seed_url)
        assert not r.truncated and len(r.body) == size
        r = make_fetcher(testweb, max_body_bytes=size - 1).fetch(testweb.seed_url)
        assert r.truncated and r.truncate_reason == "too_large" and len(r.body) == size - 1

    @pytest.mark.parametrize("kind", ["gzip_bomb", "br_bomb", "zstd_bomb"])
    def test_a_bomb_is_cut_at_the_decoded_limit_in_bounded_memory(
            self, make_testweb: Callable[..., TestWeb], make_fetcher: MakeFetcher, kind: str):
        """gzip, and Brotli's bomb class (CVE-2025-6176) and zstd's, are cut alike."""
        size = 64 << 20
        web = make_testweb(pages=20, hosts=2, faults=[fault(kind, size=size)])
        f = make_fetcher(web, read_timeout=20.0, total_timeout=30.0)
        url = web.url("h0.test", f"/x/{kind}/1")
        f.fetch(url)  # the server builds (and caches) the bomb on the first request
        tracemalloc.start()
        try:
            r = f.fetch(url)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert r.truncated and r.truncate_reason == "decompression_bomb"
        assert len(r.body) == LIMIT and r.body == b" " * LIMIT
        assert r.wire_bytes <= READ_CHUNK  # one read of ~1000:1 data was more than enough
        assert r.headers["content-encoding"] == kind.partition("_")[0]
        assert peak < 8 * LIMIT, peak  # the bomb decodes to 64 MiB

    @pytest.mark.parametrize("kind", ["gzip_bomb", "br_bomb", "zstd_bomb"])
    def test_a_small_encoded_body_is_decoded_whole(self, make_testweb: Callable[..., TestWeb],
                                                   make_fetcher: MakeFetcher, kind: str):
        web = make_testweb(pages=20, hosts=2, faults=[fault(kind, size=300_000)])
        r = make_fetcher(web).fetch(web.url("h0.test", f"/x/{kind}/1"))
        assert not r.truncated and r.body == b" " * 300_000 and r.wire_bytes < 10_000

    @pytest.mark.parametrize("kind", ["gzip_bomb", "br_bomb", "zstd_bomb"])
    def test_a_body_exactly_at_the_decoded_limit_is_whole(
            self, make_testweb: Callable[..., TestWeb], make_fetcher: MakeFetcher, kind: str):
        web = make_testweb(pages=20, hosts=2, faults=[fault(kind, size=LIMIT)])
        r = make_fetcher(web).fetch(web.url("h0.test", f"/x/{kind}/1"))
        assert not r.truncated and r.body == b" " * LIMIT
        r = make_fetcher(web, max_decoded_bytes=LIMIT - 1).fetch(web.url("h0.test", f"/x/{kind}/1"))
        assert r.truncate_reason == "decompression_bomb" and r.body == b" " * (LIMIT - 1)


class TestContentEncodings:
    """Pages a server sends compressed, in the coding it picks from our Accept-Encoding."""

    @pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
    def test_pages_in_each_coding_are_stored_as_the_server_has_them(
            self, make_testweb: Callable[..., TestWeb], make_fetcher: MakeFetcher,
            coding: str):
        web = make_testweb(pages=20, hosts=2, encodings=(coding,))
        f = make_fetcher(web)
        urls = sorted(u for u in web.oracle.crawl().fetched if "robots" not in u)[:8]
        with web.session() as s:
            s.headers["Accept-Encoding"] = "identity"
            for url in urls:
                plain = s.get(url, allow_redirects=False, timeout=10)
                r = f.fetch(url)
                assert r.status == plain.status_code and r.body == plain.content, url
                if r.status == 200:
                    assert r.headers["content-encoding"] == coding
                    assert r.wire_bytes < len(r.body)
        sent = {rec.encoding for rec in web.log.records() if rec.agent == UA and rec.status == 200}
        assert sent == {coding}

    def test_accept_encoding_names_the_codings_this_process_decodes(
            self, raw_server: Any, make_fetcher: MakeFetcher):
        heads: list[bytes] = []

        def handler(conn: socket.socket, n: int) -> None:
            heads.append(read_head(conn))
            conn.sendall(answer(b"ok"))

        srv = raw_server(handler)
        make_fetcher(RAW).fetch(srv.url())
        assert b"\r\nAccept-Encoding: zstd, br, gzip, deflate\r\n" in heads[0]

    @pytest.mark.parametrize("coding", ["br", "zstd"])
    def test_a_corrupt_body_is_a_protocol_error(self, raw_server: Any,
                                                make_fetcher: MakeFetcher, coding: str):
        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(answer(b"\xff" * 64 + b"not compressed at all" * 50,
                                f"Content-Encoding: {coding}"))

        srv = raw_server(handler)
        assert fetch_error(make_fetcher(RAW), srv.url()).reason == "protocol"

    def test_an_unknown_or_stacked_coding_is_kept_as_it_came(
            self, raw_server: Any, make_fetcher: MakeFetcher):
        body = gzip.compress(b"<html>twice</html>")

        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            coding = ("compress", "gzip, gzip")[n % 2]
            conn.sendall(answer(body, f"Content-Encoding: {coding}"))

        srv = raw_server(handler)
        f = make_fetcher(RAW)
        for _ in range(2):
            r = f.fetch(srv.url())
            assert r.body == body and not r.truncated


# -- answers only a raw server gives ---------------------------------------------------------------


class RawServer:
    """A loopback TCP server running ``handler(conn, n)`` per connection (n from 0)."""

    def __init__(self, handler: Callable[[socket.socket, int], None],
                 tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.scheme = "https" if tls else "http"
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.sock.settimeout(0.05)  # accept() polls the stop flag
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            t = threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True)
            self.connections += 1
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket, n: int) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)  # detaches the plain one
            with conn:
                self.handler(conn, n)
        except OSError:  # includes ssl.SSLError
            conn.close()

    def url(self, path: str = "/") -> str:
        return f"{self.scheme}://raw.test:{self.port}{path}"

    def close(self) -> None:
        self._stop.set()
        self._accepter.join(5)
        self.sock.close()
        for t in self._threads:
            t.join(5)


def read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


@pytest.fixture(scope="module")
def raw_tls() -> Iterator[TLS]:
    """A throwaway CA and a certificate for raw.test."""
    tls = TLS(good=["raw.test"])
    yield tls
    tls.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    """``raw_server(handler, tls=None)``: started now, stopped after the test."""
    servers: list[RawServer] = []

    def start(handler: Callable[[socket.socket, int], None],
              tls: ssl.SSLContext | None = None) -> RawServer:
        servers.append(RawServer(handler, tls))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


RAW = {"raw.test": "127.0.0.1"}


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class TestRawAnswers:
    def test_a_nul_in_a_header_never_reaches_the_result(self, raw_server: Any,
                                                        make_fetcher: MakeFetcher):
        # http.client reads it; a page record (and a WARC written from it) must not hold it
        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(answer(b"<p>x</p>", "Content-Type: text/ht\x00ml",
                                "Server: ev\x00il", "Set-Cookie: a=b\x00c; Path=/"))

        srv = raw_server(handler)
        r = make_fetcher(RAW).fetch(srv.url())
        assert r.status == 200 and r.body == b"<p>x</p>"
        assert (r.headers["content-type"], r.headers["server"]) == ("text/html", "evil")
        assert r.headers["set-cookie"] == "a=bc; Path=/"
        assert not any("\x00" in v for v in r.headers.values())

    def test_garbage_response_is_protocol_error(self, raw_server: Any,
                                                make_fetcher: MakeFetcher):
        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(b"SPDY/9 banana\r\n\r\n")

        srv = raw_server(handler)
        assert fetch_error(make_fetcher(RAW), srv.url()).reason == "protocol"

    @pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS])
    def test_deflate_with_and_without_zlib_header(self, raw_server: Any,
                                                  make_fetcher: MakeFetcher, wbits: int):
        page = b"<html>" + b"deflated text " * 5000 + b"</html>"
        comp = zlib.compressobj(6, zlib.DEFLATED, wbits)
        data = comp.compress(page) + comp.flush()

        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(answer(data, "Content-Encoding: deflate", "Content-Type: text/html"))

        srv = raw_server(handler)
        r = make_fetcher(RAW).fetch(srv.url())
        assert r.body == page and r.wire_bytes == len(data) and not r.truncated

    def test_corrupt_gzip_is_protocol_error(self, raw_server: Any, make_fetcher: MakeFetcher):
        data = gzip.compress(b"x" * 10_000)[:10] + b"\xff" * 50  # block type 3: invalid

        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(answer(bytes(data), "Content-Encoding: gzip"))

        srv = raw_server(handler)
        assert fetch_error(make_fetcher(RAW), srv.url()).reason == "protocol"

    def test_dripped_headers_hit_total_timeout(self, raw_server: Any,
                                               make_fetcher: MakeFetcher):
        stop = threading.Event()

        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not stop.wait(0.05):  # a header line that never ends
                conn.sendall(b"a")

        srv = raw_server(handler)
        f = make_fetcher(RAW, read_timeout=1.0, total_timeout=0.8)
        t0 = time.monotonic()
        try:
            assert fetch_error(f, srv.url()).reason == "total_timeout"
        finally:
            stop.set()
        assert time.monotonic() - t0 < 0.8 + MARGIN

    def test_close_delimited_body_and_long_header_values(self, raw_server: Any,
                                                         make_fetcher: MakeFetcher):
        body = b"no length, ended by close " * 100

        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(b"HTTP/1.0 200 OK\r\nServer: " + b"s" * 5000 + b"\r\n"
                         b"Content-Type: text/plain; charset=\"UTF-8\"\r\n\r\n" + body)

        srv = raw_server(handler)
        r = make_fetcher(RAW, max_header_value=100).fetch(srv.url())
        assert r.body == body and r.http_version == "HTTP/1.0"
        assert r.headers["server"] == "s" * 100
        assert content_type(r) == ("text/plain", "utf-8")

    def test_utf8_location_is_resolved(self, raw_server: Any, make_fetcher: MakeFetcher):
        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: ../caf\xc3\xa9?q=1\r\n"
                         b"Content-Length: 0\r\n\r\n")

        srv = raw_server(handler)
        r = make_fetcher(RAW).fetch(srv.url("/a/b/page"))
        assert r.status == 302 and r.redirect == srv.url("/a/café?q=1")

    @pytest.mark.parametrize("drip", [b"", b"\x16\x03\x03\x40\x00"])
    def test_stalled_tls_handshake_hits_total_timeout(self, raw_server: Any,
                                                      make_fetcher: MakeFetcher, drip: bytes):
        # Silence, or a 16 KiB handshake record dripped a byte at a time: each
        # read is well within the timeouts, only the total deadline ends it.
        stop = threading.Event()

        def handler(conn: socket.socket, n: int) -> None:
            conn.sendall(drip)
            while not stop.wait(0.05):
                if drip:
                    conn.sendall(b"\x00")

        srv = raw_server(handler)
        f = make_fetcher(RAW, connect_timeout=1.0, read_timeout=1.0, total_timeout=0.8)
        t0 = time.monotonic()
        try:
            err = fetch_error(f, f"https://raw.test:{srv.port}/")
        finally:
            stop.set()
        assert err.reason == "total_timeout" and time.monotonic() - t0 < 0.8 + MARGIN

    def test_a_socket_timeout_at_the_deadline_is_the_totals_whatever_the_watchdog(
            self, raw_server: Any, make_fetcher: MakeFetcher, monkeypatch: pytest.MonkeyPatch):
        # On a busy machine the watchdog's thread may not run before the handshake's
        # socket timeout (capped at what is left of the total) fires: the fetch is still
        # over its total, not a connect timeout. Here the watchdog never runs at all.
        monkeypatch.setattr(watchdog.Watchdog, "_run", lambda self: None)
        stop = threading.Event()
        srv = raw_server(lambda conn, n: stop.wait(5))
        f = make_fetcher(RAW, connect_timeout=1.0, read_timeout=1.0, total_timeout=0.5)
        try:
            err = fetch_error(f, f"https://raw.test:{srv.port}/")
        finally:
            stop.set()
        assert err.reason == "total_timeout"

    @pytest.mark.parametrize("scheme", ["http", "https"])
    def test_kept_alive_connection_closed_by_server_is_retried_once(
            self, raw_server: Any, raw_tls: TLS, make_fetcher: MakeFetcher, scheme: str):
        def handler(conn: socket.socket, n: int) -> None:
            read_head(conn)
            conn.sendall(answer(f"conn {n}".encode()))
            read_head(conn)  # the second request on this connection: hang up unanswered

        tls = raw_tls.server_context() if scheme == "https" else None
        srv = raw_server(handler, tls)
        f = make_fetcher(RAW, ca_bundle=str(raw_tls.ca_file))
        assert f.fetch(srv.url()).body == b"conn 0"
        assert f.fetch(srv.url()).body == b"conn 1"
        assert srv.connections == 2

    @pytest.mark.parametrize("scheme", ["http", "https"])
    def test_fresh_connection_closed_without_answer_is_reset(
            self, raw_server: Any, raw_tls: TLS, make_fetcher: MakeFetcher, scheme: str):
        tls = raw_tls.server_context() if scheme == "https" else None
        srv = raw_server(lambda conn, n: read_head(conn) and None, tls)
        f = make_fetcher(RAW, ca_bundle=str(raw_tls.ca_file))
        assert fetch_error(f, srv.url()).reason == "reset"
        assert srv.connections == 1  # not retried: the connection was new


# -- threads, lifecycle, arguments ---------------------------------------------------------------


class TestConcurrencyAndLifecycle:
    def test_many_threads_with_small_stacks(self, make_testweb: Callable[..., TestWeb],
                                            make_fetcher: MakeFetcher):
        web = make_testweb(pages=60, hosts=3, faults=[fault("slow_drip", interval=0.1)])
        f = make_fetcher(web, total_timeout=1.0)
        urls = sorted(u for u in web.oracle.crawl().fetched if "/x/" not in u)
        assert any(u.startswith("https://") for u in urls)
        want = {u: reference_body(web, u) for u in urls}
        drip = web.url("h0.test", "/x/slow_drip/1")
        results: dict[str, bytes | str] = {}
        lock = threading.Lock()

        def work(mine: list[str]) -> None:
            for url in mine:
                try:
                    out: bytes | str = f.fetch(url).body
                except FetchError as e:
                    out = e.reason
                with lock:
                    results[url] = out

        old = threading.stack_size(256 * 1024)
        try:
            threads = [threading.Thread(target=work, args=([drip] if i == 0 else urls[i::15],))
                       for i in range(16)]
        finally:
            threading.stack_size(old)
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results.pop(drip) == "total_timeout"
        assert results == {u: want[u] for u in urls if u in results}
        assert set(results) == {u for i in range(1, 16) for u in urls[i::15]}

    def test_close_aborts_a_fetch_in_flight(self, make_testweb: Callable[..., TestWeb],
                                            make_fetcher: MakeFetcher):
        web = make_testweb(pages=20, hosts=2, faults=[fault("slow_drip", interval=0.1)])
        f = make_fetcher(web, total_timeout=30.0)
        assert f.fetch(web.seed_url).status == 200  # leaves an idle pooled connection
        outcome: list[str] = []

        def work() -> None:
            try:
                f.fetch(web.url("h0.test", "/x/slow_drip/1"))
            except FetchError as e:
                outcome.append(e.reason)

        t = threading.Thread(target=work)
        t.start()
        deadline = time.monotonic() + 10
        while not web.log.records(path="/x/slow_drip/1") and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        f.close()
        t.join(MARGIN + 1)
        assert not t.is_alive() and outcome == ["aborted"]
        deadline = time.monotonic() + 5  # and the server sees the connection go
        while web.server.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert web.server.open_connections == 0
        f.close()  # idempotent
        assert fetch_error(f, web.seed_url).reason == "aborted"

    @pytest.mark.parametrize("url", ["ftp://h0.test/", "http:///nohost", "not a url",
                                     "http://h0.test:99999/"])
    def test_unrequestable_url_raises_urlerror(self, make_fetcher: MakeFetcher, url: str):
        f = make_fetcher({"h0.test": "127.0.0.1"})
        with pytest.raises(URLError):
            f.fetch(url)

    def test_bad_settings_raise_configerror(self, tmp_path: Any):
        with pytest.raises(ConfigError):
            Fetcher(user_agent=UA, resolve=str, total_timeout=0)
        with pytest.raises(ConfigError):
            Fetcher(user_agent=UA, resolve=str, max_body_bytes=-1)
        with pytest.raises(ConfigError):
            Fetcher(user_agent=UA, resolve=str, ca_bundle=str(tmp_path / "missing.pem"))

    def test_result_is_frozen(self) -> None:
        r = FetchResult(url="http://a.test/", status=200, headers={}, body=b"", ip="127.0.0.1",
                        started=0.0, elapsed=0.0, wire_bytes=0)
        with pytest.raises(AttributeError):
            r.status = 404  # type: ignore[misc]


# -- pure helpers ----------------------------------------------------------------------------------


class TestRetryAfter:
    @pytest.mark.parametrize(("value", "want"), [
        ("120", 120.0), (" 0 ", 0.0), ("3600", 3600.0),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),  # in the past: clamped
        ("garbage", None), ("", None), ("-5", None), ("1.5", None), ("12abc", None),
        ("Sun, 06 Nov 99999 08:49:37 GMT", None),
    ])
    def test_table(self, value: str, want: float | None) -> None:
        assert parse_retry_after(value, time.time()) == want

    def test_http_date_in_the_future(self) -> None:
        now = 1_700_000_000.0
        assert parse_retry_after(email.utils.formatdate(now + 90, usegmt=True), now) == 90.0

    @given(st.integers(min_value=0, max_value=10**9))
    def test_seconds_round_trip(self, n: int) -> None:
        assert parse_retry_after(str(n), 0.0) == float(n)

    @given(st.text(max_size=40))
    def test_never_raises_and_never_negative(self, value: str) -> None:
        got = parse_retry_after(value, 1_700_000_000.0)
        assert got is None or got >= 0


class TestContentType:
    @pytest.mark.parametrize(("value", "want"), [
        ("text/html; charset=UTF-8", ("text/html", "utf-8")),
        ("Text/HTML", ("text/html", None)),
        ('text/html; charset="iso-8859-1"', ("text/html", "iso-8859-1")),
        ("text/html;foo=bar; Charset = Shift_JIS ", ("text/html", "shift_jis")),
        ("", ("", None)),
        ("application/pdf; charset=", ("application/pdf", None)),
    ])
    def test_table(self, value: str, want: tuple[str, str | None]) -> None:
        assert parse_content_type(value) == want
