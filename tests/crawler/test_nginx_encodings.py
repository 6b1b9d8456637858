"""A real server's compression: the test web exported and served by Debian's nginx with
its gzip filter and the Brotli filter module (libnginx-mod-http-brotli-filter), the way a
real site compresses on the fly, crawled: nginx's own log shows what it sent, and every
page is stored as the bytes the site has (decoded, whole)."""

from __future__ import annotations

from pathlib import Path

import pytest
from crawl_helpers import crawl_on_nginx, needs_nginx_brotli, stored_whole

from tools.testweb import SiteConfig

pytestmark = needs_nginx_brotli


@pytest.mark.parametrize("codings, sent", [(("br", "gzip"), "br"), (("gzip",), "gzip")])
def test_a_crawl_of_nginx_compressing_on_the_fly_stores_every_page_whole(
    tmp_path: Path, codings: tuple[str, ...], sent: str
) -> None:
    config = SiteConfig(pages=60, hosts=3, seed=4, crawl_delay=0.0)
    data, site, log = crawl_on_nginx(tmp_path, config, codings=codings)
    pages = [e for e in log if e["$status"] == "200" and not e["$request_uri"].endswith(".txt")]
    assert len(pages) > 40
    # nginx compressed every HTML page it sent, with the coding we asked for first
    assert {e["$sent_http_content_encoding"] for e in pages} == {sent}
    assert len(stored_whole(data, site)) == len(pages)
