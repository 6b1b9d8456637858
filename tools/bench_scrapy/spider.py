"""The benchmark spider and a resolver that asks our loopback DNS server (runs in the Scrapy venv).

The spider follows every ``<a href>`` of an HTML 200 response whose host is
one of the test hosts. On Scrapy's ``response_downloaded`` signal (every
response off the wire, redirects and robots.txt included) it writes the
request URL to a text file, so the benchmark can compare what was fetched
with the oracle. Nothing else is stored: no items, no bodies.

``LoopbackResolver`` answers Twisted's ``getHostByName`` with an A query to
the benchmark's DNS server through dnspython (in the reactor's thread pool),
caching each answer: one lookup per host, like our crawler's DNS cache.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import dns.message
import dns.query
import dns.rdatatype
import scrapy
from scrapy import signals
from scrapy.http import HtmlResponse, Response
from twisted.internet import defer, threads
from twisted.internet.interfaces import IResolverSimple
from zope.interface import implementer


@implementer(IResolverSimple)
class LoopbackResolver:
    """IPv4 lookups against ``BENCH_NAMESERVER`` (``IP:PORT``, loopback only), cached."""

    def __init__(self, reactor: Any, nameserver: str, timeout: float) -> None:
        host, _, port = nameserver.partition(":")
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"nameserver {host} is not on loopback")
        self.reactor = reactor
        self.server = (host, int(port or 53))
        self.timeout = timeout
        self.cache: dict[str, str] = {}

    @classmethod
    def from_crawler(cls, crawler: Any, reactor: Any) -> LoopbackResolver:
        s = crawler.settings
        return cls(reactor, s.get("BENCH_NAMESERVER"), s.getfloat("DNS_TIMEOUT"))

    def install_on_reactor(self) -> None:
        self.reactor.installResolver(self)

    def getHostByName(self, name: str, timeout: Any = ()) -> defer.Deferred[str]:  # noqa: N802 - Twisted's name
        hit = self.cache.get(name)
        if hit is not None:
            return defer.succeed(hit)
        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self._query, name)
        d.addCallback(self._store, name)
        return d

    def _query(self, name: str) -> str:
        q = dns.message.make_query(name, dns.rdatatype.A)
        r = dns.query.udp(q, self.server[0], port=self.server[1], timeout=self.timeout)
        for rrset in r.answer:
            for rd in rrset:
                if rd.rdtype == dns.rdatatype.A:
                    return str(rd.address)
        raise OSError(f"no A record for {name}")

    def _store(self, ip: str, name: str) -> str:
        self.cache[name] = ip
        return ip


class BenchSpider(scrapy.Spider):
    name = "bench"

    def __init__(self, seed: str, hosts: str, urls_path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed = seed
        self.hosts = frozenset(hosts.split(","))
        self._urls = open(urls_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in closed()

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> BenchSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.downloaded, signal=signals.response_downloaded)
        return spider  # type: ignore[no-any-return]

    def downloaded(self, response: Response, request: scrapy.Request, spider: Any) -> None:
        self._urls.write(request.url + "\n")

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(self.seed, callback=self.parse)

    def parse(self, response: Response) -> Iterator[scrapy.Request]:
        if response.status != 200 or not isinstance(response, HtmlResponse):
            return
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href.strip())
            parts = urlsplit(url)
            if parts.scheme in ("http", "https") and parts.hostname in self.hosts:
                yield scrapy.Request(url, callback=self.parse)

    def closed(self, reason: str) -> None:
        self._urls.close()
