"""tools.testweb.dnsserver against dnspython as a real client, on loopback only."""

from __future__ import annotations

import dataclasses
import gc
import socket
import struct
import threading
import time
from collections.abc import Iterator

import dns.exception
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.resolver
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.testweb.dnsserver import DNSFaults, DNSQuery, DNSServer

HOST = "127.0.0.1"
ANSWER_TIMEOUT = 3.0  # a client's wait for an answer that must come
NO_ANSWER_TIMEOUT = 0.5  # a client's wait for an answer that must not come
SLOW_DELAY = 1.0  # the "slow" fault; long enough that ordering is not a race

MANY = [f"127.0.1.{i}" for i in range(1, 41)]  # 40 A records: > 512 bytes
RECORDS: dict[str, str | list[str]] = {
    "h0.test": "127.0.0.1",
    "h1.test": ["127.0.0.2", "127.0.0.3"],
    "MiXed.Test": "127.0.0.4",
    "many.test": MANY,
    "empty.test": [],
    "slow.test": "127.0.0.9",
    "fast.test": "127.0.0.8",
    "broken.test": "127.0.0.7",
}


def _faults() -> DNSFaults:
    return DNSFaults(
        servfail={"broken.test"}, timeout={"Silent.test"}, slow={"slow.test": SLOW_DELAY}
    )


@pytest.fixture
def server() -> Iterator[DNSServer]:
    with DNSServer(RECORDS, faults=_faults()) as srv:
        yield srv
    assert _server_threads() == []


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dnsserver")]


def ask(
    srv: DNSServer,
    name: str,
    rdtype: str = "A",
    *,
    tcp: bool = False,
    timeout: float = ANSWER_TIMEOUT,
) -> dns.message.Message:
    query = dns.message.make_query(name, rdtype)
    if tcp:
        return dns.query.tcp(query, HOST, timeout=timeout, port=srv.port)
    return dns.query.udp(query, HOST, timeout=timeout, port=srv.port)


def resolver(srv: DNSServer) -> dns.resolver.Resolver:
    res = dns.resolver.Resolver(configure=False)  # never read the host's resolv.conf
    res.nameservers = [HOST]
    res.port = srv.port
    res.lifetime = ANSWER_TIMEOUT
    res.cache = None
    return res


def addresses(response: dns.message.Message) -> list[str]:
    return sorted(rdata.address for rrset in response.answer for rdata in rrset)


def recv_reply(sock: socket.socket) -> dns.message.Message:
    return dns.message.from_wire(sock.recv(65535))


class TestAnswers:
    def test_a_query_returns_the_records(self, server: DNSServer) -> None:
        res = resolver(server)
        assert [r.address for r in res.resolve("h0.test.", "A")] == ["127.0.0.1"]
        assert sorted(r.address for r in res.resolve("h1.test.", "A")) == ["127.0.0.2", "127.0.0.3"]

    def test_answer_is_authoritative_noerror_over_both_transports(self, server: DNSServer) -> None:
        for tcp in (False, True):
            response = ask(server, "h1.test", tcp=tcp)
            assert response.rcode() == dns.rcode.NOERROR
            assert response.flags & dns.flags.AA
            assert addresses(response) == ["127.0.0.2", "127.0.0.3"]

    def test_unknown_name_is_nxdomain(self, server: DNSServer) -> None:
        with pytest.raises(dns.resolver.NXDOMAIN):
            resolver(server).resolve("nope.test.", "A")
        # A subdomain of a known name is unknown too.
        response = ask(server, "www.h0.test", tcp=True)
        assert response.rcode() == dns.rcode.NXDOMAIN
        assert response.answer == []

    @pytest.mark.parametrize(
        ("name", "rdtype"), [("h0.test", "AAAA"), ("h0.test", "MX"), ("empty.test", "A")]
    )
    def test_known_name_without_such_records_is_nodata(
        self, server: DNSServer, name: str, rdtype: str
    ) -> None:
        with pytest.raises(dns.resolver.NoAnswer):
            resolver(server).resolve(name + ".", rdtype)
        response = ask(server, name, rdtype)
        assert response.rcode() == dns.rcode.NOERROR
        assert response.answer == []

    def test_names_are_case_insensitive(self, server: DNSServer) -> None:
        for name in ("mixed.test", "MIXED.TEST", "MiXeD.tEsT"):
            assert addresses(ask(server, name)) == ["127.0.0.4"]
        assert addresses(ask(server, "H0.Test", tcp=True)) == ["127.0.0.1"]

    def test_ttl_defaults_to_300(self, server: DNSServer) -> None:
        answer = resolver(server).resolve("h0.test.", "A")
        assert answer.rrset is not None and answer.rrset.ttl == 300

    def test_ttl_is_configurable(self) -> None:
        with DNSServer({"h0.test": "127.0.0.1"}, ttl=42) as srv:
            for tcp in (False, True):
                assert ask(srv, "h0.test", tcp=tcp).answer[0].ttl == 42


class TestTruncation:
    def test_large_answer_is_truncated_over_udp(self, server: DNSServer) -> None:
        response = ask(server, "many.test")
        assert response.flags & dns.flags.TC
        assert response.answer == []
        assert response.rcode() == dns.rcode.NOERROR

    def test_large_answer_is_truncated_over_udp_even_with_edns(self, server: DNSServer) -> None:
        # Our payload size is 512 whatever the client offers, so the fallback is testable.
        query = dns.message.make_query("many.test", "A", use_edns=0, payload=4096)
        response = dns.query.udp(query, HOST, timeout=ANSWER_TIMEOUT, port=server.port)
        assert response.flags & dns.flags.TC
        assert response.answer == []

    def test_large_answer_is_whole_over_tcp(self, server: DNSServer) -> None:
        response = ask(server, "many.test", tcp=True)
        assert not response.flags & dns.flags.TC
        assert addresses(response) == sorted(MANY)

    def test_udp_with_fallback_gets_everything_over_tcp(self, server: DNSServer) -> None:
        query = dns.message.make_query("many.test", "A")
        response, used_tcp = dns.query.udp_with_fallback(
            query, HOST, timeout=ANSWER_TIMEOUT, port=server.port
        )
        assert used_tcp
        assert addresses(response) == sorted(MANY)
        assert [q.transport for q in server.queries("many.test")] == ["udp", "tcp"]

    def test_resolver_falls_back_to_tcp(self, server: DNSServer) -> None:
        answer = resolver(server).resolve("many.test.", "A")
        assert sorted(r.address for r in answer) == sorted(MANY)
        assert {q.transport for q in server.queries("many.test")} == {"udp", "tcp"}

    def test_small_answer_is_not_truncated(self, server: DNSServer) -> None:
        _, used_tcp = dns.query.udp_with_fallback(
            dns.message.make_query("h1.test", "A"), HOST, timeout=ANSWER_TIMEOUT, port=server.port
        )
        assert not used_tcp


class TestFaults:
    @pytest.mark.parametrize("tcp", [False, True])
    def test_servfail(self, server: DNSServer, tcp: bool) -> None:
        response = ask(server, "BROKEN.test", tcp=tcp)
        assert response.rcode() == dns.rcode.SERVFAIL
        assert response.answer == []
        assert server.queries("broken.test")[-1].rcode == "SERVFAIL"

    def test_servfail_through_resolver(self, server: DNSServer) -> None:
        with pytest.raises(dns.resolver.NoNameservers):
            resolver(server).resolve("broken.test.", "A")

    @pytest.mark.parametrize("tcp", [False, True])
    def test_timeout_never_answers(self, server: DNSServer, tcp: bool) -> None:
        with pytest.raises(dns.exception.Timeout):
            ask(server, "silent.TEST", tcp=tcp, timeout=NO_ANSWER_TIMEOUT)
        (logged,) = server.queries("silent.test")
        assert (logged.transport, logged.rcode) == ("tcp" if tcp else "udp", "TIMEOUT")
        # The server is fine afterwards.
        assert addresses(ask(server, "h0.test", tcp=tcp)) == ["127.0.0.1"]

    def test_slow_udp_answer_does_not_block_a_fast_one(self, server: DNSServer) -> None:
        slow = dns.message.make_query("slow.test", "A", id=1)
        fast = dns.message.make_query("fast.test", "A", id=2)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(SLOW_DELAY + ANSWER_TIMEOUT)
            sock.sendto(slow.to_wire(), server.address)
            sock.sendto(fast.to_wire(), server.address)
            first, second = recv_reply(sock), recv_reply(sock)
        assert (first.id, addresses(first)) == (2, ["127.0.0.8"])
        assert (second.id, addresses(second)) == (1, ["127.0.0.9"])

    def test_slow_tcp_answer_does_not_block_a_fast_one_on_the_same_connection(
        self, server: DNSServer
    ) -> None:
        slow = dns.message.make_query("slow.test", "A", id=1)
        fast = dns.message.make_query("fast.test", "A", id=2)
        with socket.create_connection(server.address, timeout=ANSWER_TIMEOUT) as sock:
            dns.query.send_tcp(sock, slow)
            dns.query.send_tcp(sock, fast)
            expiration = time.time() + SLOW_DELAY + ANSWER_TIMEOUT
            first, _ = dns.query.receive_tcp(sock, expiration)
            second, _ = dns.query.receive_tcp(sock, expiration)
        assert (first.id, addresses(first)) == (2, ["127.0.0.8"])
        assert (second.id, addresses(second)) == (1, ["127.0.0.9"])

    def test_faults_can_change_while_running(self, server: DNSServer) -> None:
        assert ask(server, "h0.test").rcode() == dns.rcode.NOERROR
        server.faults.servfail.add("H0.test")
        assert ask(server, "h0.test").rcode() == dns.rcode.SERVFAIL
        server.faults = DNSFaults()
        assert ask(server, "broken.test").rcode() == dns.rcode.NOERROR


class TestLog:
    def test_log_records_each_query_per_transport(self, server: DNSServer) -> None:
        before = time.time()
        ask(server, "h0.test")
        ask(server, "H1.TEST", "AAAA", tcp=True)
        ask(server, "nope.test")
        ask(server, "broken.test", tcp=True)
        after = time.time()
        log = server.log
        assert [(q.name, q.qtype, q.transport, q.rcode) for q in log] == [
            ("h0.test", "A", "udp", "NOERROR"),
            ("h1.test", "AAAA", "tcp", "NOERROR"),
            ("nope.test", "A", "udp", "NXDOMAIN"),
            ("broken.test", "A", "tcp", "SERVFAIL"),
        ]
        times = [q.time for q in log]
        assert before <= times[0] and times == sorted(times) and times[-1] <= after

    def test_queries_filters_by_name_case_insensitively(self, server: DNSServer) -> None:
        for _ in range(3):
            ask(server, "h0.test")
        ask(server, "h1.test")
        assert len(server.queries("H0.TEST")) == 3
        assert [q.name for q in server.queries("h1.test")] == ["h1.test"]
        assert server.queries("never.test") == []
        assert len(server.queries()) == 4

    def test_clear_log(self, server: DNSServer) -> None:
        ask(server, "h0.test")
        server.clear_log()
        assert server.log == []
        ask(server, "h1.test", tcp=True)
        assert [q.name for q in server.log] == ["h1.test"]

    def test_log_is_a_copy_of_frozen_entries(self, server: DNSServer) -> None:
        ask(server, "h0.test")
        log = server.log
        log.clear()
        assert len(server.log) == 1
        with pytest.raises(dataclasses.FrozenInstanceError):
            server.log[0].rcode = "NXDOMAIN"  # type: ignore[misc]
        assert isinstance(server.log[0], DNSQuery)


def _query_header(qid: int, qdcount: int) -> bytes:
    return struct.pack("!HHHHHH", qid, 0x0100, qdcount, 0, 0, 0)  # RD set, opcode QUERY


class TestMalformed:
    def test_header_only_query_gets_formerr(self, server: DNSServer) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(ANSWER_TIMEOUT)
            sock.sendto(_query_header(0x1234, 1), server.address)  # says 1 question, has none
            reply = recv_reply(sock)
        assert reply.id == 0x1234
        assert reply.rcode() == dns.rcode.FORMERR
        assert reply.flags & dns.flags.QR
        assert server.log[-1].rcode == "FORMERR"

    def test_unanswerable_packets_get_no_reply(self, server: DNSServer) -> None:
        response = dns.message.make_response(dns.message.make_query("h0.test", "A"))
        valid = dns.message.make_query("h0.test", "A", id=7)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(ANSWER_TIMEOUT)
            broken_response = struct.pack("!HHHHHH", 5, 0x8100, 1, 0, 0, 0)  # QR, no question
            for junk in (b"", b"\x01", b"\xff" * 11, response.to_wire(), broken_response):
                sock.sendto(junk, server.address)
            sock.sendto(valid.to_wire(), server.address)
            # Replies leave in order, so the first one would be to the junk if any got one.
            reply = recv_reply(sock)
        assert reply.id == 7 and addresses(reply) == ["127.0.0.1"]
        assert [q.rcode for q in server.log] == ["DROPPED"] * 5 + ["NOERROR"]

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],  # one server survives all
    )
    @given(junk=st.binary(max_size=600))
    def test_server_survives_any_udp_payload(self, server: DNSServer, junk: bytes) -> None:
        valid = dns.message.make_query("h1.test", "A")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(ANSWER_TIMEOUT)
            sock.sendto(junk, server.address)
            sock.sendto(valid.to_wire(), server.address)
            while True:  # skip a reply to the junk, if it got one
                reply = recv_reply(sock)
                if reply.id == valid.id and reply.question == valid.question:
                    break
        assert addresses(reply) == ["127.0.0.2", "127.0.0.3"]

    def test_tcp_garbage_gets_formerr_and_the_connection_goes_on(self, server: DNSServer) -> None:
        valid = dns.message.make_query("h0.test", "A", id=9)
        with socket.create_connection(server.address, timeout=ANSWER_TIMEOUT) as sock:
            junk = _query_header(0x4321, 3) + b"\xde\xad\xbe\xef"
            sock.sendall(len(junk).to_bytes(2, "big") + junk)
            dns.query.send_tcp(sock, valid)
            expiration = time.time() + ANSWER_TIMEOUT
            first, _ = dns.query.receive_tcp(sock, expiration)
            second, _ = dns.query.receive_tcp(sock, expiration)
        assert (first.id, first.rcode()) == (0x4321, dns.rcode.FORMERR)
        assert (second.id, addresses(second)) == (9, ["127.0.0.1"])

    def test_tcp_client_that_hangs_up_mid_message_does_no_harm(self, server: DNSServer) -> None:
        with socket.create_connection(server.address, timeout=ANSWER_TIMEOUT) as sock:
            sock.sendall(b"\x00\x40" + b"\x00" * 10)  # announces 64 bytes, sends 10
        with socket.create_connection(server.address, timeout=ANSWER_TIMEOUT) as sock:
            sock.sendall(b"\x00")  # half a length prefix
        assert addresses(ask(server, "h0.test", tcp=True)) == ["127.0.0.1"]
        assert addresses(ask(server, "h0.test")) == ["127.0.0.1"]


class TestRecords:
    def test_add_record_while_running(self, server: DNSServer) -> None:
        assert ask(server, "new.test").rcode() == dns.rcode.NXDOMAIN
        server.add_record("NEW.test", "127.0.0.5")
        assert addresses(ask(server, "new.test")) == ["127.0.0.5"]
        server.add_record("new.test", "127.0.0.6")
        server.add_record("new.test", "127.0.0.6")  # no duplicate
        assert addresses(ask(server, "new.test", tcp=True)) == ["127.0.0.5", "127.0.0.6"]

    def test_set_records_replaces_everything(self, server: DNSServer) -> None:
        server.set_records({"other.test": ["127.0.0.6"]})
        assert ask(server, "h0.test").rcode() == dns.rcode.NXDOMAIN
        assert addresses(ask(server, "other.test")) == ["127.0.0.6"]

    def test_concurrent_set_records_is_atomic_for_queries(self, server: DNSServer) -> None:
        first = {"flip.test": ["127.0.0.1", "127.0.0.2"]}
        second = {"flip.test": ["127.0.0.3"]}
        done = threading.Event()

        def flip() -> None:
            while not done.is_set():
                server.set_records(first)
                server.set_records(second)

        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            seen = {tuple(addresses(ask(server, "flip.test"))) for _ in range(200)}
        finally:
            done.set()
            flipper.join()
        assert seen <= {("127.0.0.1", "127.0.0.2"), ("127.0.0.3",)}

    @pytest.mark.parametrize(
        "records",
        [
            {"x.test": "10.0.0.1"},
            {"x.test": ["127.0.0.1", "8.8.8.8"]},
            {"x.test": "nope"},
            {"": "127.0.0.1"},
        ],
    )
    def test_bad_records_are_refused_and_keep_the_old_ones(
        self, server: DNSServer, records: dict[str, str | list[str]]
    ) -> None:
        with pytest.raises(ValueError):
            server.set_records(records)
        with pytest.raises(ValueError):
            DNSServer(records)
        assert addresses(ask(server, "h0.test")) == ["127.0.0.1"]

    def test_add_record_refuses_a_non_loopback_address(self, server: DNSServer) -> None:
        with pytest.raises(ValueError):
            server.add_record("x.test", "192.168.1.1")
        with pytest.raises(ValueError):  # just past tools/cluster.py's 198.18.0.0/15
            server.add_record("x.test", "198.20.0.1")
        assert ask(server, "x.test").rcode() == dns.rcode.NXDOMAIN

    def test_the_cluster_range_may_be_answered(self, server: DNSServer) -> None:
        """tools/cluster.py's namespaces reach the test web on its bridge, 198.18.0.0/15."""
        server.add_record("x.test", "198.19.255.1")
        assert addresses(ask(server, "x.test")) == ["198.19.255.1"]


class TestLifecycle:
    def test_restart_rebinds_the_same_port(self) -> None:
        srv = DNSServer({"h0.test": "127.0.0.1"})
        for _ in range(2):
            srv.start()
            port = srv.port
            assert addresses(ask(srv, "h0.test")) == ["127.0.0.1"]
            assert addresses(ask(srv, "h0.test", tcp=True)) == ["127.0.0.1"]
            srv.stop()
            srv.stop()  # idempotent
            assert srv.port == port
            assert _server_threads() == []
        assert len(srv.log) == 4  # the log outlives a restart

    def test_a_new_server_can_take_a_just_freed_port(self) -> None:
        with DNSServer({"h0.test": "127.0.0.1"}) as first:
            ask(first, "h0.test", tcp=True)  # leaves a closed connection behind
            port = first.port
        for _ in range(2):
            with DNSServer({"h0.test": "127.0.0.2"}, port=port) as srv:
                assert srv.address == (HOST, port)
                assert addresses(ask(srv, "h0.test", tcp=True)) == ["127.0.0.2"]
                assert addresses(ask(srv, "h0.test")) == ["127.0.0.2"]

    def test_stop_with_work_in_flight_is_clean(self) -> None:
        srv = DNSServer(RECORDS, faults=_faults())
        srv.start()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tcp = socket.create_connection(srv.address, timeout=ANSWER_TIMEOUT)
        try:
            udp.sendto(dns.message.make_query("slow.test", "A").to_wire(), srv.address)
            dns.query.send_tcp(tcp, dns.message.make_query("silent.test", "A"))
            dns.query.send_tcp(tcp, dns.message.make_query("slow.test", "A"))
            while len(srv.log) < 3:  # wait until the server has them all
                time.sleep(0.01)
            srv.stop()
            assert _server_threads() == []
            assert tcp.recv(1) == b""  # the server closed the connection
            srv.start()  # the server closed first, so its port has a TIME_WAIT left
            assert addresses(ask(srv, "h0.test", tcp=True)) == ["127.0.0.1"]
            srv.stop()
        finally:
            udp.close()
            tcp.close()
        gc.collect()  # any unclosed transport would warn now, and warnings are errors

    def test_stopped_server_does_not_answer(self) -> None:
        with DNSServer({"h0.test": "127.0.0.1"}) as srv:
            pass
        # Linux reports no ICMP error to dnspython's unconnected socket; allow for it anyway.
        with pytest.raises((dns.exception.Timeout, ConnectionRefusedError)):
            ask(srv, "h0.test", timeout=NO_ANSWER_TIMEOUT)
        with pytest.raises(ConnectionRefusedError):
            ask(srv, "h0.test", tcp=True)

    def test_start_twice_is_an_error(self, server: DNSServer) -> None:
        with pytest.raises(RuntimeError):
            server.start()

    def test_port_before_start_is_an_error(self) -> None:
        with pytest.raises(RuntimeError):
            _ = DNSServer({}).port

    def test_busy_port_raises_and_leaks_nothing(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
            taken.bind((HOST, 0))
            srv = DNSServer({}, port=taken.getsockname()[1])
            with pytest.raises(OSError):
                srv.start()
            assert not srv.running and _server_threads() == []


class TestBindSafety:
    @pytest.mark.parametrize(
        "host", ["0.0.0.0", "10.0.0.1", "192.168.1.10", "8.8.8.8", "::1", "::", "example.test", ""]
    )
    def test_non_loopback_host_is_refused(self, host: str) -> None:
        with pytest.raises(ValueError):
            DNSServer({"h0.test": "127.0.0.1"}, host=host)

    @pytest.mark.parametrize(("host", "bound"), [("127.0.0.2", "127.0.0.2"), ("localhost", HOST)])
    def test_any_loopback_host_is_allowed(self, host: str, bound: str) -> None:
        with DNSServer({"h0.test": "127.0.0.1"}, host=host) as srv:
            assert srv.address[0] == bound
            response = dns.query.udp(
                dns.message.make_query("h0.test", "A"), bound, timeout=ANSWER_TIMEOUT, port=srv.port
            )
            assert addresses(response) == ["127.0.0.1"]
