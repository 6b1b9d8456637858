"""HTTP/2 against a real server: the test web exported to Debian's nginx with ``listen ...
ssl http2`` and the Brotli filter, crawled with ``--http2``: nginx's own log says HTTP/2.0
for every request to the https host (and HTTP/1.1 to the plain ones, and to all of them
without the option), every page is stored as the site's bytes, the record says the
protocol, and the WARC export writes it as WARC-Protocol."""

from __future__ import annotations

from pathlib import Path

from crawl_helpers import crawl_on_nginx, needs_nginx_brotli, stored_whole
from test_proxy import Proxies, proxies  # noqa: F401 - the fixture
from warcio.archiveiterator import ArchiveIterator

from crawler.cli import main
from tools.testweb import SiteConfig

pytestmark = needs_nginx_brotli

CONFIG = SiteConfig(pages=60, hosts=3, seed=5, crawl_delay=0.0)  # h2.test is the https host


def test_a_crawl_with_http2_speaks_h2_to_the_https_host_and_stores_every_page(
    tmp_path: Path
) -> None:
    data, site, log = crawl_on_nginx(tmp_path, CONFIG, codings=("br", "gzip"), nginx_h2=True,
                                     http2=True)
    by_host: dict[str, set[str]] = {}
    for entry in log:
        by_host.setdefault(entry["$host"], set()).add(entry["$server_protocol"])
    assert by_host == {"h0.test": {"HTTP/1.1"}, "h1.test": {"HTTP/1.1"},
                       "h2.test": {"HTTP/2.0"}}
    pages = [e for e in log if e["$host"] == "h2.test" and e["$status"] == "200"
             and e["$request_uri"] != "/robots.txt"]
    assert len(pages) >= 10
    assert {e["$sent_http_content_encoding"] for e in pages} == {"br"}
    protocols = {u: r.protocol for u, r in stored_whole(data, site).items()}
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
    data, site, log = crawl_on_nginx(tmp_path, CONFIG, codings=("br", "gzip"), nginx_h2=True)
    assert {e["$server_protocol"] for e in log} == {"HTTP/1.1"}
    protocols = {u: r.protocol for u, r in stored_whole(data, site).items()}
    assert {p for u, p in protocols.items() if u.startswith("https://")} == {"http/1.1 tls/1.3"}


def test_http2_goes_through_a_connect_proxy(
    tmp_path: Path, proxies: Proxies  # noqa: F811 - the fixture imported above
) -> None:
    tiny = proxies.tinyproxy()
    data, site, log = crawl_on_nginx(tmp_path, CONFIG, nginx_h2=True, http2=True,
                                     proxy=(tiny.url(),))
    assert {e["$server_protocol"] for e in log if e["$host"] == "h2.test"} == {"HTTP/2.0"}
    https_port = site.https_port
    connects = [r for r in tiny.requests() if r.startswith("CONNECT ")]
    assert f"CONNECT 127.0.0.1:{https_port} HTTP/1.1" in connects  # a tunnel to the IP
    assert len(connects) >= 3  # each host's connections went through it
    assert {r.protocol for u, r in stored_whole(data, site).items()
            if u.startswith("https://")} == {"h2 tls/1.3"}
