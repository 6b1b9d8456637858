"""crawler.net.dnscache against the test DNS server on loopback (never real DNS).

Every DNSCache here is given the loopback server as its only nameserver.
Cache expiry is tested with a clock the test moves; the server's query log
says whether a lookup went to the network.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import dns.message
import dns.rrset
import pytest

from crawler.exceptions import ConfigError, DNSError
from crawler.net.dnscache import DNSCache
from tools.testweb import TestWeb
from tools.testweb.dnsserver import DNSFaults, DNSServer

RECORDS: dict[str, str | list[str]] = {
    "a.test": "127.0.0.1",
    "b.test": "127.0.0.2",
    "empty.test": [],  # exists, no A record
    # ~60 A records: more than 512 bytes, so the UDP answer is truncated.
    "big.test": [f"127.0.1.{i}" for i in range(1, 61)],
    "slow.test": "127.0.0.3",
}
#: Generous: only a test that fails would wait this long.
TIMEOUT = 5.0
#: The timeout of the tests that time a lookup of a dead name, and their slack on top:
#: other test runs share this machine's two cores, so a thread may wait for a CPU for
#: a good part of a second; a lookup that took twice its timeout still fails.
BOUNDED, SLACK = 1.5, 1.0


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[DNSServer]:
    faults = DNSFaults(servfail={"sf.test"}, timeout={"dead.test"}, slow={"slow.test": 0.3})
    with DNSServer(RECORDS, ttl=300, faults=faults) as srv:
        yield srv


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(server: DNSServer, clock: Clock | None = None, **kw: object) -> DNSCache:
    kw.setdefault("allow_private_ips", True)  # the test server only has loopback addresses
    kw.setdefault("timeout", TIMEOUT)
    if clock is not None:
        kw["clock"] = clock
    return DNSCache([server.address], **kw)  # type: ignore[arg-type]


def kind_of(cache: DNSCache, host: str) -> str:
    with pytest.raises(DNSError) as info:
        cache.resolve(host)
    assert info.value.host in (host, host.lower().rstrip("."))
    return info.value.kind


class TestResolve:
    def test_resolves_a_name(self, server: DNSServer) -> None:
        assert make(server).resolve("a.test") == "127.0.0.1"
        assert [q.qtype for q in server.queries("a.test")] == ["A"]

    def test_second_resolve_is_cached(self, server: DNSServer) -> None:
        cache = make(server)
        assert cache.resolve("a.test") == cache.resolve("a.test") == "127.0.0.1"
        assert len(server.queries("a.test")) == 1
        s = cache.stats()
        assert (s.lookups, s.cache_hits, s.queries) == (2, 1, 1)

    def test_host_forms_share_one_entry(self, server: DNSServer) -> None:
        cache = make(server)
        for form in ("a.test", "A.TEST", "a.test.", " A.Test. "):
            assert cache.resolve(form) == "127.0.0.1"
        assert len(server.queries("a.test")) == 1

    def test_distinct_hosts_are_distinct(self, server: DNSServer) -> None:
        cache = make(server)
        assert cache.resolve("a.test") == "127.0.0.1"
        assert cache.resolve("b.test") == "127.0.0.2"

    def test_truncated_udp_answer_is_asked_again_over_tcp(self, server: DNSServer) -> None:
        ip = make(server).resolve("big.test")
        assert ip in RECORDS["big.test"]
        assert [q.transport for q in server.queries("big.test")] == ["udp", "tcp"]

    def test_no_search_domains_are_tried(self, server: DNSServer) -> None:
        with pytest.raises(DNSError):
            make(server).resolve("nosuch")
        assert [q.name for q in server.log] == ["nosuch"]


class TestTTL:
    def test_entry_expires_with_the_answer_ttl(self, clock: Clock) -> None:
        with DNSServer(RECORDS, ttl=5) as srv:
            cache = make(srv, clock, min_ttl=0)
            cache.resolve("a.test")
            clock.now += 4
            cache.resolve("a.test")
            assert len(srv.queries("a.test")) == 1
            clock.now += 1
            cache.resolve("a.test")
            assert len(srv.queries("a.test")) == 2

    def test_changed_record_seen_after_expiry(self, clock: Clock) -> None:
        with DNSServer(RECORDS, ttl=10) as srv:
            cache = make(srv, clock, min_ttl=0)
            assert cache.resolve("a.test") == "127.0.0.1"
            srv.set_records({**RECORDS, "a.test": "127.0.0.9"})
            assert cache.resolve("a.test") == "127.0.0.1"  # still cached
            clock.now += 10
            assert cache.resolve("a.test") == "127.0.0.9"

    def test_ttl_clamped_up_to_min_ttl(self, clock: Clock) -> None:
        with DNSServer(RECORDS, ttl=1) as srv:
            cache = make(srv, clock, min_ttl=60)
            cache.resolve("a.test")
            clock.now += 59
            cache.resolve("a.test")
            assert len(srv.queries("a.test")) == 1
            clock.now += 1
            cache.resolve("a.test")
            assert len(srv.queries("a.test")) == 2

    def test_ttl_clamped_down_to_max_ttl(self, clock: Clock, server: DNSServer) -> None:
        cache = make(server, clock, min_ttl=0, max_ttl=10)  # the server says 300
        cache.resolve("a.test")
        clock.now += 10
        cache.resolve("a.test")
        assert len(server.queries("a.test")) == 2

    def test_zero_ttl_is_not_cached(self) -> None:
        with DNSServer(RECORDS, ttl=0) as srv:
            cache = make(srv, min_ttl=0)
            cache.resolve("a.test")
            cache.resolve("a.test")
            assert len(srv.queries("a.test")) == 2

    def test_purge_drops_only_expired(self, clock: Clock, server: DNSServer) -> None:
        cache = make(server, clock, min_ttl=0, max_ttl=100, negative_ttl=10)
        cache.resolve("a.test")
        kind_of(cache, "nx.test")
        assert cache.stats().entries == 2
        clock.now += 10
        assert cache.purge() == 1  # the negative entry
        assert cache.stats().entries == 1
        cache.resolve("a.test")
        assert len(server.queries("a.test")) == 1
        clock.now += 90
        assert cache.purge() == 1
        assert cache.stats().entries == 0

    def test_automatic_purge_when_full(self, clock: Clock, server: DNSServer) -> None:
        cache = make(server, clock, min_ttl=0, negative_ttl=1, max_entries=3)
        for i in range(3):
            kind_of(cache, f"nx{i}.test")
        clock.now += 1
        kind_of(cache, "nx3.test")  # 4 entries > 3: the 3 expired ones go
        assert cache.stats().entries == 1

    def test_forget(self, server: DNSServer) -> None:
        cache = make(server)
        cache.resolve("a.test")
        cache.forget("A.test.")
        cache.resolve("a.test")
        assert len(server.queries("a.test")) == 2


class TestFailures:
    def test_nxdomain(self, server: DNSServer) -> None:
        assert kind_of(make(server), "nx.test") == "nxdomain"

    def test_nodata(self, server: DNSServer) -> None:
        assert kind_of(make(server), "empty.test") == "nodata"

    def test_servfail(self, server: DNSServer) -> None:
        assert kind_of(make(server), "sf.test") == "servfail"
        assert [q.rcode for q in server.queries("sf.test")] == ["SERVFAIL"]

    def test_timeout_kind_and_bound(self, server: DNSServer) -> None:
        # The timeout bounds the whole lookup, however long one try may wait.
        cache = make(server, timeout=BOUNDED, try_timeout=10 * BOUNDED)
        start = time.monotonic()
        assert kind_of(cache, "dead.test") == "timeout"
        took = time.monotonic() - start
        assert BOUNDED - 0.05 <= took <= BOUNDED + SLACK, took
        assert server.queries("dead.test")

    def test_retries_udp_within_the_timeout(self, server: DNSServer) -> None:
        cache = make(server, timeout=0.6, try_timeout=0.2)
        assert kind_of(cache, "dead.test") == "timeout"
        assert len(server.queries("dead.test")) >= 2

    def test_unreachable_nameserver_is_an_error(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()  # nothing listens there now: ICMP port unreachable
        cache = DNSCache([("127.0.0.1", port)], timeout=0.3, allow_private_ips=True)
        assert kind_of(cache, "a.test") in ("error", "timeout")

    def test_second_nameserver_used_when_first_fails(self, server: DNSServer) -> None:
        with DNSServer({"a.test": []}, faults=DNSFaults(servfail={"a.test"})) as bad:
            cache = DNSCache([bad.address, server.address], allow_private_ips=True)
            assert cache.resolve("a.test") == "127.0.0.1"
            assert len(bad.queries("a.test")) == 1

    def test_bad_names(self, server: DNSServer) -> None:
        cache = make(server)
        assert kind_of(cache, "") == "error"
        assert kind_of(cache, "a..test") == "error"
        assert kind_of(cache, "x" * 64 + ".test") == "error"
        assert not server.log

    def test_negative_answers_are_cached(self, clock: Clock, server: DNSServer) -> None:
        cache = make(server, clock, negative_ttl=30)
        for _ in range(3):
            assert kind_of(cache, "nx.test") == "nxdomain"
            assert kind_of(cache, "sf.test") == "servfail"
        assert len(server.queries("nx.test")) == 1
        assert len(server.queries("sf.test")) == 1
        clock.now += 30
        assert kind_of(cache, "nx.test") == "nxdomain"
        assert len(server.queries("nx.test")) == 2
        s = cache.stats()
        assert s.negative_hits == 4
        assert s.failures["nxdomain"] == 4 and s.failures["servfail"] == 3

    def test_negative_entry_replaced_once_the_name_exists(self, clock: Clock) -> None:
        with DNSServer(RECORDS) as srv:
            cache = make(srv, clock, negative_ttl=5)
            assert kind_of(cache, "new.test") == "nxdomain"
            srv.add_record("new.test", "127.0.0.7")
            assert kind_of(cache, "new.test") == "nxdomain"  # cached
            clock.now += 5
            assert cache.resolve("new.test") == "127.0.0.7"

    def test_timeout_is_cached_too(self, clock: Clock, server: DNSServer) -> None:
        cache = make(server, clock, timeout=0.2)
        assert kind_of(cache, "dead.test") == "timeout"
        n = len(server.queries("dead.test"))
        assert kind_of(cache, "dead.test") == "timeout"
        assert len(server.queries("dead.test")) == n


class TestPrivate:
    def test_private_answer_refused_by_default(self, server: DNSServer) -> None:
        cache = make(server, allow_private_ips=False)
        assert kind_of(cache, "a.test") == "private"
        assert kind_of(cache, "a.test") == "private"  # cached as a failure
        assert len(server.queries("a.test")) == 1
        assert cache.stats().failures["private"] == 2

    def test_private_answer_allowed_when_asked(self, server: DNSServer) -> None:
        assert make(server, allow_private_ips=True).resolve("a.test") == "127.0.0.1"

    @pytest.mark.parametrize("ip", [
        "10.1.2.3", "172.16.0.1", "192.168.1.1",  # private
        "127.0.0.1", "127.9.9.9",  # loopback
        "169.254.1.1",  # link-local
        "224.0.0.1", "239.255.255.250",  # multicast
        "240.0.0.1", "255.255.255.255",  # reserved, broadcast
        "0.0.0.0",  # unspecified
        "100.64.0.1",  # shared address space (carrier NAT)
        "192.0.2.1",  # documentation
        "[::1]", "::1", "fe80::1", "fc00::1", "::",  # IPv6 equivalents
    ])
    def test_private_ip_literals_refused(self, server: DNSServer, ip: str) -> None:
        assert kind_of(make(server, allow_private_ips=False), ip) == "private"
        assert not server.log

    def test_ip_literals_returned_without_a_query(self, server: DNSServer) -> None:
        strict = make(server, allow_private_ips=False)
        assert strict.resolve("8.8.8.8") == "8.8.8.8"  # returned as is: no traffic at all
        assert strict.resolve(" 93.184.216.34. ") == "93.184.216.34"
        lax = make(server, allow_private_ips=True)
        assert lax.resolve("127.0.0.1") == "127.0.0.1"
        assert lax.resolve("10.0.0.1") == "10.0.0.1"
        assert not server.log
        assert strict.stats().lookups == 0

    def test_ipv6_literal_is_not_supported(self, server: DNSServer) -> None:
        assert kind_of(make(server, allow_private_ips=True), "[::1]") == "error"
        assert kind_of(make(server, allow_private_ips=False), "2001:4860::8888") == "error"

    def test_answer_with_only_private_addresses_refused(self, server: DNSServer) -> None:
        assert kind_of(make(server, allow_private_ips=False), "big.test") == "private"

    def test_first_public_address_of_a_mixed_answer_is_chosen(self, server: DNSServer) -> None:
        # The test server serves loopback only (by design), so a mixed answer is built
        # as a real dnspython message and handed to the answer step.
        query = dns.message.make_query("mixed.test", "A")
        response = dns.message.make_response(query)
        response.answer.append(dns.rrset.from_text_list(
            "mixed.test.", 120, "IN", "A", ["10.0.0.1", "192.0.2.7", "93.184.216.34", "127.0.0.1"]))
        response = dns.message.from_wire(response.to_wire())  # to_wire shuffles the records
        strict = make(server, allow_private_ips=False)
        assert strict._answer("mixed.test", response) == ("93.184.216.34", 120)
        ip, ttl = make(server)._answer("mixed.test", response)  # type: ignore[misc]
        assert ip in ("10.0.0.1", "192.0.2.7", "93.184.216.34", "127.0.0.1") and ttl == 120


class TestConcurrency:
    def test_concurrent_lookups_of_a_slow_name_make_one_query(self, server: DNSServer) -> None:
        cache = make(server)
        n = 20
        barrier = threading.Barrier(n)
        results: list[str] = []
        lock = threading.Lock()

        def worker() -> None:
            barrier.wait()
            ip = cache.resolve("slow.test")
            with lock:
                results.append(ip)

        threads = [threading.Thread(target=worker) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == ["127.0.0.3"] * n
        assert len(server.queries("slow.test")) == 1
        s = cache.stats()
        assert s.queries == 1 and s.lookups == n
        assert s.coalesced + s.cache_hits == n - 1

    def test_waiters_share_the_failure(self, server: DNSServer) -> None:
        server.faults.slow["sfslow.test"] = 0.3
        server.faults.servfail.add("sfslow.test")
        cache = make(server)
        kinds: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(10)

        def worker() -> None:
            barrier.wait()
            try:
                cache.resolve("sfslow.test")
            except DNSError as exc:
                with lock:
                    kinds.append(exc.kind)

        threads = [threading.Thread(target=worker) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert kinds == ["servfail"] * 10
        assert len(server.queries("sfslow.test")) == 1

    def test_waiters_bounded_by_the_timeout(self, server: DNSServer) -> None:
        """Threads that wait for another's query of a dead name give up with it: each
        one within the timeout (plus slack) of its own call, none by querying again."""
        cache = make(server, timeout=BOUNDED)
        kinds: list[str] = []
        took: list[float] = []
        lock = threading.Lock()
        barrier = threading.Barrier(8)

        def worker() -> None:
            barrier.wait()
            start = time.monotonic()
            try:
                cache.resolve("dead.test")
            except DNSError as exc:
                with lock:
                    kinds.append(exc.kind)
                    took.append(time.monotonic() - start)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert kinds == ["timeout"] * 8
        assert max(took) <= BOUNDED + SLACK, took
        assert cache.stats().queries == 1  # one lookup, seven waiters

    def test_many_names_many_threads(self, server: DNSServer) -> None:
        names = {f"n{i}.test": f"127.0.2.{i}" for i in range(40)}
        server.set_records({**RECORDS, **names})
        cache = make(server)
        errors: list[BaseException] = []

        def worker(offset: int) -> None:
            try:
                for j in range(len(names)):
                    name = f"n{(j + offset) % len(names)}.test"
                    assert cache.resolve(name) == names[name]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert all(len(server.queries(n)) == 1 for n in names)


class TestConfig:
    @pytest.mark.parametrize("kw", [
        {"timeout": 0}, {"min_ttl": 10, "max_ttl": 5}, {"negative_ttl": -1}, {"min_ttl": -1},
    ])
    def test_bad_settings(self, kw: dict[str, float]) -> None:
        with pytest.raises(ConfigError):
            DNSCache([("127.0.0.1", 53)], **kw)  # type: ignore[arg-type]

    @pytest.mark.parametrize("ns", [[], [("not-an-ip", 53)], [("127.0.0.1", 0)]])
    def test_bad_nameservers(self, ns: list[tuple[str, int]]) -> None:
        with pytest.raises(ConfigError):
            DNSCache(ns)


def test_testweb_hosts_resolve_through_its_dns(testweb: TestWeb) -> None:
    cache = DNSCache([testweb.nameserver], allow_private_ips=True)
    for host, ip in testweb.records().items():
        assert cache.resolve(host) == ip
    assert kind_of(cache, "nx.test") == "nxdomain"
    strict = DNSCache([testweb.nameserver])
    assert kind_of(strict, "h0.test") == "private"
