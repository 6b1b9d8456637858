"""HTTP/2 against a real server: the test web exported to Debian's nginx with ``listen ...
ssl http2`` and the Brotli filter, crawled with ``--http2``: nginx's own log says HTTP/2.0
for every request to the https host (and HTTP/1.1 to the plain ones, and to all of them
without the option), every page is stored as the site's bytes, the record says the
protocol, and the WARC export writes it as WARC-Protocol."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
from crawl_helpers import record, records, run_crawl
from warcio.archiveiterator import ArchiveIterator

from crawler.cli import main
from tools.testweb import SiteConfig, TestWeb
from tools.testweb.export import ACCESS_FIELDS, BROTLI_MODULE, export, nginx_serving
from tools.testweb.graph import Graph
from tools.testweb.site import Site

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None or not os.path.exists(BROTLI_MODULE),
    reason="needs Debian's nginx and libnginx-mod-http-brotli-filter (.ci/run installs both)")

CONFIG = SiteConfig(pages=60, hosts=3, seed=5, crawl_delay=0.0)  # h2.test is the https host


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def crawl_nginx(tmp_path: Path, **options: object) -> tuple[Path, Path, Site, list[dict[str, str]]]:
    """The site on nginx (h2 offered, Brotli on), crawled with ``options``: (crawl dir,
    nginx root, the site, nginx's access log as dicts)."""
    http_port, https_port = free_ports(2)
    root = tmp_path / "site"
    export(Graph(CONFIG), root, http_port=http_port, https_port=https_port,
           codings=("br", "gzip"), access_log=True, http2=True)
    site = Site(Graph(CONFIG), http_port=http_port, https_port=https_port)
    web = TestWeb(CONFIG).start()  # for its DNS: the site's host names on 127.0.0.1
    data = tmp_path / "crawl"
    try:
        with nginx_serving(root, http_port):
            assert run_crawl(web, data, seeds=[site.seed_url],
                             ca_bundle=str(root / "tls/ca.pem"), **options).complete
    finally:
        web.stop()
    lines = (root / "logs/access.log").read_text().splitlines()
    return data, root, site, [dict(zip(ACCESS_FIELDS, ln.split("\t"), strict=True))
                              for ln in lines]


def assert_stored_whole(data: Path, site: Site) -> dict[str, str]:
    """Every 200 page's stored body is the site's; returns each one's protocol."""
    out = {}
    for url, rec in records(data).items():
        if rec.status != 200:
            continue
        host, _, path = url.split("://", 1)[1].partition("/")
        host = host.split(":")[0]
        full = record(data, url)
        assert not full.truncated and full.body == site.body(
            host, site.lookup(host, "/" + path)), url
        out[url] = rec.protocol
    return out


def test_a_crawl_with_http2_speaks_h2_to_the_https_host_and_stores_every_page(
    tmp_path: Path
) -> None:
    data, _, site, log = crawl_nginx(tmp_path, http2=True)
    by_host: dict[str, set[str]] = {}
    for entry in log:
        by_host.setdefault(entry["$host"], set()).add(entry["$server_protocol"])
    assert by_host == {"h0.test": {"HTTP/1.1"}, "h1.test": {"HTTP/1.1"},
                       "h2.test": {"HTTP/2.0"}}
    pages = [e for e in log if e["$host"] == "h2.test" and e["$status"] == "200"
             and e["$request_uri"] != "/robots.txt"]
    assert len(pages) >= 10
    assert {e["$sent_http_content_encoding"] for e in pages} == {"br"}
    protocols = assert_stored_whole(data, site)
    assert len(protocols) > 40
    for url, protocol in protocols.items():
        want = "h2 tls/1.3" if url.startswith("https://") else ""
        assert protocol == want, url

    out = tmp_path / "c.warc.gz"
    assert main(["export", str(data), "--warc", str(out), "--quiet"]) == 0
    seen = 0
    with open(out, "rb") as f:
        for rec in ArchiveIterator(f):
            if rec.rec_type not in ("response", "request"):
                continue
            uri = rec.rec_headers.get_header("WARC-Target-URI")
            protos = [v for k, v in rec.rec_headers.headers if k == "WARC-Protocol"]
            assert protos == (["h2", "tls/1.3"] if uri.startswith("https://") else []), uri
            if rec.rec_type == "response":
                assert rec.http_headers.protocol == "HTTP/1.1"  # the status line's form
                seen += uri.startswith("https://")
    assert seen >= 10


def test_without_http2_the_same_host_gets_http1_over_tls(tmp_path: Path) -> None:
    data, _, site, log = crawl_nginx(tmp_path)
    assert {e["$server_protocol"] for e in log} == {"HTTP/1.1"}
    protocols = assert_stored_whole(data, site)
    assert {p for u, p in protocols.items() if u.startswith("https://")} == {"http/1.1 tls/1.3"}
