"""export: static files equal to what the Python server sends, an nginx config, a hosts map."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tools.testweb import client
from tools.testweb import graph as g
from tools.testweb.export import export, nginx_serving
from tools.testweb.graph import Graph, SiteConfig
from tools.testweb.oracle import Oracle
from tools.testweb.site import Site

CONFIG = SiteConfig(pages=60, hosts=3, seed=6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, Site]:
    http_port, https_port = _free_port(), _free_port()
    export(Graph(CONFIG), tmp_path, http_port=http_port, https_port=https_port)
    return tmp_path, Site(Graph(CONFIG), http_port=http_port, https_port=https_port)


def test_files_are_the_served_bytes(exported: tuple[Path, Site]) -> None:
    root, site = exported
    gr = site.graph
    for pid in range(gr.pages):
        host = g.host_name(gr.host_of[pid])
        path = gr.page_path(pid)
        f = root / "www" / host / ("index.html" if path == "/" else path[1:])
        assert f.read_bytes() == site.body(host, site.lookup(host, path))
    robots = site.lookup("h0.test", "/robots.txt").body
    assert (root / "www/h0.test/robots.txt").read_bytes() == robots
    assert not (root / "www/h2.test/robots.txt").exists()  # that style answers 404


def test_config_hosts_and_meta(exported: tuple[Path, Site]) -> None:
    root, site = exported
    conf = (root / "nginx.conf").read_text()
    assert conf.count("server_name") == 3
    assert f"listen 127.0.0.1:{site.https_port} ssl;" in conf  # h2 is the HTTPS host
    for k, r in enumerate(site.graph.redirects):
        first = f"/r/{k}" if r.hops == 1 else f"/rc/{k}/0"
        assert f"location = {first} {{ return {r.status} " in conf
    assert (root / "hosts").read_text().splitlines() == [
        f"127.0.0.1 h{i}.test" for i in range(3)]
    meta = json.loads((root / "site.json").read_text())
    assert meta["seed_url"] == site.seed_url and meta["pages"] == 60
    assert (root / "tls/ca.pem").read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert "0.0.0.0" not in conf and "listen 80" not in conf


@pytest.mark.system_packages("nginx-light")
def test_nginx_serves_the_site_the_oracle_describes(exported: tuple[Path, Site]) -> None:
    root, site = exported
    with nginx_serving(root, site.http_port):
        records = {f"h{i}.test": "127.0.0.1" for i in range(3)}
        s = client.session(client.static_resolver(records), str(root / "tls/ca.pem"))
        wanted = Oracle(site).crawl(obey_robots=False)
        for url in sorted(wanted.fetched):
            r = s.get(url, timeout=5, allow_redirects=False)
            assert r.status_code == wanted.status[url], url
            node = Oracle(site).describe(url)
            if r.status_code == 200:
                host = url.split("/")[2].split(":")[0]
                assert r.content == site.body(host, node)  # type: ignore[arg-type]
            elif r.is_redirect:
                assert r.headers["Location"] == node.location  # type: ignore[union-attr]
