"""TestWeb: one site served over HTTP (+HTTPS) and DNS on loopback, in threads
(``address=``: or on tools/cluster.py's bridge in 198.18.0.0/15; its names resolve there).

    with TestWeb(SiteConfig(pages=100, hosts=3), faults=hostile()) as web:
        web.seed_url            # http://h0.test:PORT/
        web.nameserver          # ("127.0.0.1", DNS port) for the crawler's resolver
        web.ca_file             # PEM of the throwaway CA, for verify=
        web.oracle.crawl(...)   # what a correct crawler fetches
        web.log                 # what was fetched

Startup binds free ports (or the ones given), builds the site with those
ports in its URLs and starts the servers; it takes milliseconds for small
sites (the graph is the only part that grows with the site).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

import requests

from . import client
from .dnsserver import DNSFaults, DNSServer
from .faults import Fault
from .graph import Graph, SiteConfig
from .oracle import Oracle
from .requestlog import RequestLog
from .server import WebServer, check_loopback
from .site import Site
from .tls import TLS

log = logging.getLogger(__name__)


class TestWeb:
    """HTTP + HTTPS + DNS for one generated site. Start/stop from one thread."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        config: SiteConfig | None = None,
        *,
        faults: Iterable[Fault] = (),
        graph: Graph | None = None,
        address: str = "127.0.0.1",
        http_port: int = 0,
        https_port: int = 0,
        dns_port: int | None = 0,
        dns_ttl: int = 300,
    ) -> None:
        check_loopback(address)
        if graph is not None and config is not None and graph.config != config:
            raise ValueError("graph was built from another config")
        self.config = graph.config if graph is not None else (config or SiteConfig())
        self.faults = tuple(faults)
        self._graph = graph
        self.address = address
        self._ports = (http_port, https_port, dns_port)
        self.dns_ttl = dns_ttl
        self.log = RequestLog()
        self._server: WebServer | None = None
        self._site: Site | None = None
        self.dns: DNSServer | None = None
        self.tls: TLS | None = None
        self._oracle: Oracle | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> TestWeb:
        graph = self._graph or Graph(self.config)
        self._graph = graph
        http_port, https_port, dns_port = self._ports
        server = WebServer(address=self.address, log_=self.log)
        try:
            server.bind(http_port, https_port)
            site = Site(graph, self.faults, http_port=server.http_port,
                        https_port=server.https_port, address=self.address)
            tls_hosts = [h for h in site.hosts.values() if h.scheme == "https"]
            self.tls = TLS(good=[h.name for h in tls_hosts if not h.bad_cert],
                           bad=[h.name for h in tls_hosts if h.bad_cert])
            server.start(site, self.tls.server_context())
            self._server, self._site = server, site
            if dns_port is not None:
                self.dns = DNSServer(site.dns_records(), host=self.address, port=dns_port,
                                     ttl=self.dns_ttl, faults=self._dns_faults(site))
                self.dns.start()
        except BaseException:
            server.stop()
            self.stop()
            raise
        self._oracle = Oracle(site)
        log.info("testweb: %s, dns %s", site.seed_url, self.nameserver if self.dns else None)
        return self

    def stop(self) -> None:
        """Stop everything; idempotent."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.dns is not None:
            self.dns.stop()
        if self.tls is not None:
            self.tls.close()

    def __enter__(self) -> TestWeb:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @staticmethod
    def _dns_faults(site: Site) -> DNSFaults:
        hosts = site.hosts.values()
        return DNSFaults(
            servfail={h.name for h in hosts if h.dns == "servfail"},
            timeout={h.name for h in hosts if h.dns == "timeout"},
            slow={h.name: h.dns_delay for h in hosts if h.dns == "slow"},
        )

    # -- what tests use -------------------------------------------------------------

    @property
    def site(self) -> Site:
        if self._site is None:
            raise RuntimeError("TestWeb is not started")
        return self._site

    @property
    def graph(self) -> Graph:
        return self.site.graph

    @property
    def oracle(self) -> Oracle:
        if self._oracle is None:
            raise RuntimeError("TestWeb is not started")
        return self._oracle

    @property
    def server(self) -> WebServer:
        if self._server is None:
            raise RuntimeError("TestWeb is not started")
        return self._server

    @property
    def seed_url(self) -> str:
        return self.site.seed_url

    def url(self, host: str, target: str = "/") -> str:
        return self.site.url(host, target)

    @property
    def http_port(self) -> int:
        return self.server.http_port

    @property
    def https_port(self) -> int | None:
        return self.server.https_port

    @property
    def nameserver(self) -> tuple[str, int]:
        """(IP, port) of the DNS server."""
        if self.dns is None:
            raise RuntimeError("started without DNS")
        return self.dns.address

    @property
    def ca_file(self) -> Path:
        if self.tls is None:
            raise RuntimeError("TestWeb is not started")
        return self.tls.ca_file

    def records(self) -> dict[str, str]:
        """Host name -> IPv4, as the DNS server answers (NXDOMAIN hosts left out)."""
        return self.site.dns_records()

    def session(self, *, via_dns: bool = False) -> requests.Session:
        """A requests Session for this web: names resolved from the site's records
        (or through the DNS server with ``via_dns``), the CA trusted."""
        resolve = (client.dns_resolver(self.nameserver) if via_dns
                   else client.static_resolver(self.records()))
        return client.session(resolve, str(self.ca_file))

    def reset(self) -> None:
        """Empty the logs and make 429/503 pages fail again, for a second crawl."""
        self.log.clear()
        self.server.reset_counters()
        if self.dns is not None:
            self.dns.clear_log()
