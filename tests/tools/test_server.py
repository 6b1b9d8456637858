"""The HTTP/1.1 server: protocol, virtual hosts, TLS with SNI, many connections, loopback only."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import time

import pytest
import requests

from tools.testweb import SiteConfig, TestWeb, fault
from tools.testweb.server import WebServer

TIMEOUT = 5.0


@pytest.fixture(scope="module")
def web():
    with TestWeb(SiteConfig(pages=40, hosts=3, seed=1),
                 faults=[fault("slow_first_byte", delay=0.3)]) as w:
        yield w


def raw(web: TestWeb, data: bytes, *, port: int | None = None) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port or web.http_port), TIMEOUT) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


class TestProtocol:
    def test_get_page_by_host_header(self, web: TestWeb) -> None:
        r = web.session().get(web.url("h1.test"), timeout=TIMEOUT)
        assert r.status_code == 200 and r.headers["Content-Type"] == "text/html; charset=utf-8"
        assert b"page 1 on h1.test" in r.content
        assert len(r.content) == int(r.headers["Content-Length"])

    def test_head_has_length_but_no_body(self, web: TestWeb) -> None:
        port = web.http_port
        out = raw(web, f"HEAD / HTTP/1.1\r\nHost: h0.test:{port}\r\nConnection: close\r\n\r\n"
                  .encode())
        head, _, body = out.partition(b"\r\n\r\n")
        assert status_of(out) == 200 and body == b""
        assert int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]) > 1000

    def test_keep_alive_reuses_the_connection(self, web: TestWeb) -> None:
        web.reset()
        with web.session() as s:
            for path in ("/", "/robots.txt", "/"):
                assert s.get(web.url("h0.test", path), timeout=TIMEOUT).status_code == 200
        recs = web.log.records(host="h0.test")
        assert len(recs) == 3 and len({r.conn for r in recs}) == 1

    def test_connection_close_and_http10(self, web: TestWeb) -> None:
        port = web.http_port
        out = raw(web, f"GET / HTTP/1.1\r\nHost: h0.test:{port}\r\nConnection: close\r\n\r\n"
                  .encode())
        assert b"Connection: close" in out and status_of(out) == 200
        out = raw(web, b"GET / HTTP/1.0\r\nHost: h0.test\r\n\r\n")
        assert status_of(out) == 200 and b"Connection: close" in out

    def test_pipelined_requests_answered_in_order(self, web: TestWeb) -> None:
        req = b"GET /robots.txt HTTP/1.1\r\nHost: h1.test\r\n\r\n"
        out = raw(web, req + req.replace(b"h1", b"h0") + b"GET / HTTP/1.1\r\nHost: h2.test\r\n"
                  b"Connection: close\r\n\r\n")
        assert out.count(b"HTTP/1.1 200 OK") == 2 and out.count(b"HTTP/1.1 421") == 1
        assert out.index(b"Crawl-delay") < out.index(b"Disallow: /s2/")

    @pytest.mark.parametrize(
        ("request_bytes", "status"),
        [
            (b"POST / HTTP/1.1\r\nHost: h0.test\r\nContent-Length: 3\r\n\r\nabc", 405),
            (b"garbage\r\n\r\n", 400),
            (b"GET / HTTP/2.0\r\nHost: h0.test\r\n\r\n", 501),
            (b"GET / HTTP/1.1\r\nHost: nowhere.test\r\n\r\n", 421),
            (b"GET / HTTP/1.1\r\nHost: h2.test\r\n\r\n", 421),  # an HTTPS host on HTTP
            (b"GET /nope HTTP/1.1\r\nHost: h0.test\r\n\r\n", 404),
            (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: h0.test\r\n\r\n", 414),
        ],
    )
    def test_error_statuses(self, web: TestWeb, request_bytes: bytes, status: int) -> None:
        with socket.create_connection(("127.0.0.1", web.http_port), TIMEOUT) as s:
            s.sendall(request_bytes)
            assert status_of(s.recv(65536)) == status

    def test_oversized_head_gets_431_and_close(self, web: TestWeb) -> None:
        out = raw(web, b"GET / HTTP/1.1\r\nX: " + b"a" * (1 << 20) + b"\r\n\r\n")
        assert status_of(out) == 431

    def test_absolute_form_and_percent_case(self, web: TestWeb) -> None:
        port = web.http_port
        out = raw(web, f"GET http://h0.test:{port}/robots.txt HTTP/1.1\r\nHost: x\r\n"
                  "Connection: close\r\n\r\n".encode())
        assert status_of(out) == 200 and b"Disallow: /s2/" in out
        out = raw(web, b"GET /%72obots.txt HTTP/1.1\r\nHost: h0.test\r\nConnection: close\r\n\r\n")
        assert status_of(out) == 404  # %72 is not decoded: the path differs

    def test_requests_while_one_is_slow(self, web: TestWeb) -> None:
        """A slow answer holds only its own connection."""
        slow = socket.create_connection(("127.0.0.1", web.http_port), TIMEOUT)
        try:
            slow.sendall(b"GET /x/slow_first_byte/1 HTTP/1.1\r\nHost: h0.test\r\n\r\n")
            assert web.session().get(web.url("h1.test"), timeout=TIMEOUT).status_code == 200
            assert status_of(slow.recv(65536)) == 200
        finally:
            slow.close()


class TestTLS:
    def test_verified_with_the_throwaway_ca_and_sni_logged(self, web: TestWeb) -> None:
        web.reset()
        r = web.session().get(web.url("h2.test"), timeout=TIMEOUT)
        assert r.status_code == 200 and r.url.startswith("https://h2.test:")
        (rec,) = web.log.records(host="h2.test")
        assert rec.scheme == "https" and rec.sni == "h2.test"

    def test_unknown_ca_is_refused(self, web: TestWeb) -> None:
        s = web.session()
        s.verify = True  # the system store does not know our CA
        with pytest.raises(requests.exceptions.SSLError):
            s.get(web.url("h2.test"), timeout=TIMEOUT)

    def test_without_sni_the_certificate_does_not_match(self, web: TestWeb) -> None:
        ctx = ssl.create_default_context(cafile=str(web.ca_file))
        ctx.check_hostname = False
        with socket.create_connection(("127.0.0.1", web.https_port), TIMEOUT) as raw_sock:
            with ctx.wrap_socket(raw_sock) as tls:  # no server_hostname: no SNI
                names = [v for k, v in tls.getpeercert()["subjectAltName"]]
        assert names == ["testweb.invalid"]

    def test_sni_picks_the_site_certificate(self, web: TestWeb) -> None:
        ctx = ssl.create_default_context(cafile=str(web.ca_file))
        with socket.create_connection(("127.0.0.1", web.https_port), TIMEOUT) as raw_sock:
            with ctx.wrap_socket(raw_sock, server_hostname="h2.test") as tls:
                tls.sendall(b"GET / HTTP/1.1\r\nHost: h2.test\r\nConnection: close\r\n\r\n")
                assert tls.recv(100).startswith(b"HTTP/1.1 200")


class TestManyConnections:
    def test_a_thousand_idle_connections_do_not_block_service(self, web: TestWeb) -> None:
        socks = []
        try:
            for _ in range(1000):
                s = socket.create_connection(("127.0.0.1", web.http_port), TIMEOUT)
                s.sendall(b"GET / HTTP/1.1\r\nHost: h0")  # never finished
                socks.append(s)
            r = web.session().get(web.url("h0.test", "/robots.txt"), timeout=TIMEOUT)
            assert r.status_code == 200
            deadline = time.monotonic() + 10  # accepting is asynchronous: wait, don't race
            while web.server.open_connections < 1000 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert web.server.open_connections >= 1000
        finally:
            for s in socks:
                s.close()


class TestLoopbackOnly:
    def test_refuses_other_addresses(self) -> None:
        with pytest.raises(ValueError, match="loopback"):
            WebServer(address="0.0.0.0")
        with pytest.raises(ValueError, match="loopback"):
            TestWeb(address="192.0.2.1")

    def test_every_listening_socket_is_on_loopback(self, web: TestWeb) -> None:
        """Walk this process's sockets in /proc: nothing bound outside 127.0.0.0/8."""
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        bound = []
        for table in ("tcp", "udp", "tcp6", "udp6"):
            with open(f"/proc/self/net/{table}") as fh:
                for line in list(fh)[1:]:
                    cols = line.split()
                    local, state, inode = cols[1], cols[3], cols[9]
                    listening = state == "0A" if table.startswith("tcp") else True
                    if inode in inodes and listening:
                        bound.append((table, local))
        assert {t for t, _ in bound} >= {"tcp", "udp"}  # HTTP, HTTPS, DNS are all there
        assert len(bound) >= 4
        for table, local in bound:
            assert not table.endswith("6"), local
            ip = ipaddress.IPv4Address(bytes.fromhex(local.split(":")[0])[::-1])
            assert ip in ipaddress.ip_network("127.0.0.0/8"), (table, ip)
