"""A real server's compression: the test web exported and served by Debian's nginx with
its gzip filter and the Brotli filter module (libnginx-mod-http-brotli-filter), the way a
real site compresses on the fly, crawled: nginx's own log shows what it sent, and every
page is stored as the bytes the site has (decoded, whole)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
from crawl_helpers import record, records, run_crawl

from tools.testweb import SiteConfig, TestWeb
from tools.testweb.export import ACCESS_FIELDS, BROTLI_MODULE, export, nginx_serving
from tools.testweb.graph import Graph
from tools.testweb.site import Site

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None or not os.path.exists(BROTLI_MODULE),
    reason="needs Debian's nginx and libnginx-mod-http-brotli-filter (.ci/run installs both)")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("codings, sent", [(("br", "gzip"), "br"), (("gzip",), "gzip")])
def test_a_crawl_of_nginx_compressing_on_the_fly_stores_every_page_whole(
    tmp_path: Path, codings: tuple[str, ...], sent: str
) -> None:
    config = SiteConfig(pages=60, hosts=3, seed=4, crawl_delay=0.0)
    http_port, https_port = free_ports(2)
    root = tmp_path / "site"
    export(Graph(config), root, http_port=http_port, https_port=https_port, codings=codings,
           access_log=True)
    site = Site(Graph(config), http_port=http_port, https_port=https_port)
    web = TestWeb(config).start()  # for its DNS: the site's host names on 127.0.0.1
    data = tmp_path / "c"
    try:
        with nginx_serving(root, http_port):
            assert run_crawl(web, data, seeds=[site.seed_url],
                             ca_bundle=str(root / "tls/ca.pem")).complete
    finally:
        web.stop()
    lines = (root / "logs/access.log").read_text().splitlines()
    log = [dict(zip(ACCESS_FIELDS, line.split("\t"), strict=True)) for line in lines]
    pages = [e for e in log if e["$status"] == "200" and not e["$request_uri"].endswith(".txt")]
    assert len(pages) > 40
    # nginx compressed every HTML page it sent, with the coding we asked for first
    assert {e["$sent_http_content_encoding"] for e in pages} == {sent}
    stored = {u: r for u, r in records(data).items() if r.status == 200}
    assert len(stored) == len(pages)
    for url in stored:
        host, _, path = url.split("://", 1)[1].partition("/")
        host = host.split(":")[0]
        rec = record(data, url)
        assert not rec.truncated, url
        assert rec.body == site.body(host, site.lookup(host, "/" + path)), url
