"""Host -> IPv4 through dnspython, with our own cache (the design's Host2IP).

Theory of operation. ``resolve(host)`` lowercases the host and drops one
final dot. An IP literal is returned as it is (IPv4 only). A name is looked
up in two kvstore.KeyIntMaps keyed by the name's host key (crawler.web.urls.host_key,
the one md5 of a host name the crawler makes):

- positive (Host2IP): ``(expiry << 32) | ipv4``, kept for the answer's TTL
  clamped to [min_ttl, max_ttl];
- negative: ``(expiry << 3) | kind``, kept ``negative_ttl`` seconds, for
  every failure (nxdomain, nodata, servfail, timeout, private, error), so a
  dead host is not asked about again for every one of its URLs.

Memory is bounded: past ``max_entries`` names (both maps) the expired ones
are dropped, then the ones expiring soonest down to 3/4 of it (a dropped
name costs one more query), about 31 bytes a name at most.

Expiries are whole seconds of ``clock`` (wall-clock ``time.time`` by default,
so entries keep their meaning if the map is ever persisted). On a miss, one
thread per name queries (A, UDP, then TCP when the answer is truncated,
within ``timeout`` seconds in all); threads that ask for the same name
meanwhile wait for that query's outcome, never longer than ``timeout``. The
query's thread writes the cache before it wakes them (under the lock that
admits queriers), so a name is queried once however many threads want it.

Addresses that are not globally routable (private, loopback, link-local,
multicast, reserved, unspecified, shared) are refused with kind "private"
unless ``allow_private_ips``; of several A records the first allowed one is
used. Every dnspython error becomes a DNSError here, ``raise ... from``.
All public methods are thread-safe.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import dns.exception
import dns.message
import dns.name
import dns.nameserver
import dns.query
import dns.rcode
import dns.rdatatype
import dns.resolver
import numpy as np

from kvstore import KeyIntMap

from ..config import DEFAULT_DNS_TIMEOUT
from ..exceptions import ConfigError, DNSError
from ..web.urls import host_key

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_DNS_TIMEOUT",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_TTL",
    "DEFAULT_MIN_TTL",
    "DEFAULT_NEGATIVE_TTL",
    "DEFAULT_TRY_TIMEOUT",
    "KINDS",
    "DNSCache",
    "DNSStats",
]

logger = logging.getLogger(__name__)

#: Total time one lookup may take, every retry and the TCP fallback included.
#: Time one UDP or TCP attempt waits before dnspython retries (within the total).
DEFAULT_TRY_TIMEOUT = 2.0
DEFAULT_MIN_TTL = 60
DEFAULT_MAX_TTL = 6 * 3600
DEFAULT_NEGATIVE_TTL = 60
#: Our EDNS UDP payload size (the DNS Flag Day 2020 value).
EDNS_PAYLOAD = 1232
#: Hosts expected; sizes the maps once.
DEFAULT_CAPACITY = 4096
#: Entries (both maps) above which expired ones, then the soonest to expire, are dropped.
DEFAULT_MAX_ENTRIES = 1_000_000

#: DNSError kinds raised by resolve(); their index is stored in the negative map.
KINDS = ("nxdomain", "nodata", "servfail", "timeout", "private", "error")
_KIND_BITS = 3
_IP_MASK = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class DNSStats:
    """A snapshot of the resolver's counters (for the status line)."""

    lookups: int  # resolve() calls for names (IP literals not counted)
    cache_hits: int  # answered from the positive cache
    negative_hits: int  # answered from the negative cache
    queries: int  # lookups sent to DNS
    coalesced: int  # waited for another thread's query of the same name
    entries: int  # names in both caches, expired ones included until purged
    failures: Mapping[str, int]  # DNSErrors raised, by kind (cache hits included)


class _Flight:
    """One query in progress; waiters read ``ip``/``error`` after ``done``."""

    __slots__ = ("done", "error", "ip")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ip: str | None = None
        self.error: DNSError | None = None


def _refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``ip`` is off-limits without allow_private_ips."""
    return not ip.is_global or ip.is_multicast or ip.is_private or ip.is_reserved \
        or ip.is_loopback or ip.is_link_local or ip.is_unspecified


class DNSCache:
    """Resolve host names to one IPv4 address, cached. Thread-safe.

    ``nameservers``: (IP, port) pairs asked in order; None reads the system's
    resolv.conf. ``clock`` returns seconds (tests pass a controllable one).
    """

    def __init__(
        self,
        nameservers: Sequence[tuple[str, int]] | None = None,
        *,
        timeout: float = DEFAULT_DNS_TIMEOUT,
        try_timeout: float = DEFAULT_TRY_TIMEOUT,
        min_ttl: int = DEFAULT_MIN_TTL,
        max_ttl: int = DEFAULT_MAX_TTL,
        negative_ttl: int = DEFAULT_NEGATIVE_TTL,
        allow_private_ips: bool = False,
        capacity: int = DEFAULT_CAPACITY,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if timeout <= 0 or try_timeout <= 0:
            raise ConfigError("DNS timeouts must be positive")
        if not 0 <= min_ttl <= max_ttl or negative_ttl < 0:
            raise ConfigError(f"DNS TTLs: need 0 <= min_ttl ({min_ttl}) <= max_ttl ({max_ttl})"
                              f" and negative_ttl ({negative_ttl}) >= 0")
        self.timeout = timeout
        self.min_ttl, self.max_ttl, self.negative_ttl = min_ttl, max_ttl, negative_ttl
        self.allow_private_ips = allow_private_ips
        self.max_entries = max_entries
        self._clock = clock
        self._try_timeout = min(try_timeout, timeout)
        self.nameservers = self._servers(nameservers)
        self._positive = KeyIntMap(capacity=capacity)  # Host2IP
        self._negative = KeyIntMap(capacity=max(16, capacity // 8))
        self._lock = threading.Lock()  # guards _inflight, _purge_at and the counters
        self._inflight: dict[bytes, _Flight] = {}
        self._purge_at = max_entries
        self._counts = {"lookups": 0, "cache_hits": 0, "negative_hits": 0, "queries": 0,
                        "coalesced": 0}
        self._failures = dict.fromkeys(KINDS, 0)

    @staticmethod
    def _servers(nameservers: Sequence[tuple[str, int]] | None) -> tuple[tuple[str, int], ...]:
        """Validated (IP, port) pairs; the system's resolv.conf when None."""
        pairs: list[tuple[str, int]] = []
        try:
            if nameservers is None:
                system = dns.resolver.Resolver(configure=True)
                for ns in system.nameservers:
                    if isinstance(ns, str):
                        pairs.append((ns, system.nameserver_ports.get(ns, system.port)))
                    elif isinstance(ns, dns.nameserver.Do53Nameserver):
                        pairs.append((ns.address, ns.port))
            else:
                pairs = [(str(ipaddress.ip_address(ip)), int(port)) for ip, port in nameservers]
        except (dns.exception.DNSException, OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"cannot set up the DNS nameservers: {exc}") from exc
        if not pairs or not all(0 < port < 65536 for _, port in pairs):
            raise ConfigError(f"nameservers: need at least one (IP, port 1-65535), got {pairs}")
        return tuple(pairs)

    # -- the public API --------------------------------------------------------

    def resolve(self, host: str) -> str:
        """One IPv4 address of ``host`` as a string, or DNSError(host, kind).

        Blocks at most about ``timeout`` seconds. Thread-safe.
        """
        name = host.strip().lower()
        if name.endswith("."):
            name = name[:-1]
        if not name:
            with self._lock:
                self._failures["error"] += 1
            raise DNSError(host, "error", "empty host name")
        literal = self._literal(host, name)
        if literal is not None:
            return literal
        key = host_key(name)
        now = self._clock()
        outcome = self._cached(key, name, now)
        from_cache = outcome is not None
        if outcome is None:
            with self._lock:
                # Again under the lock: a query that just ended wrote the cache first.
                outcome = self._cached(key, name, now)
                from_cache = outcome is not None
                flight = self._inflight.get(key)
                leader = flight is None
                if outcome is None and leader:
                    flight = self._inflight[key] = _Flight()
                    self._counts["queries"] += 1
                elif outcome is None:
                    self._counts["coalesced"] += 1
            if outcome is None:
                assert flight is not None
                outcome = self._lead(key, name, flight) if leader else self._follow(name, flight)
        with self._lock:
            self._counts["lookups"] += 1
            if from_cache:
                hit = "negative_hits" if isinstance(outcome, DNSError) else "cache_hits"
                self._counts[hit] += 1
            if isinstance(outcome, DNSError):
                self._failures[outcome.kind] += 1
        if isinstance(outcome, DNSError):
            raise outcome
        return outcome

    def stats(self) -> DNSStats:
        """A consistent snapshot of the counters. Thread-safe."""
        with self._lock:
            return DNSStats(failures=dict(self._failures),
                            entries=len(self._positive) + len(self._negative), **self._counts)

    def purge(self) -> int:
        """Drop expired entries from both maps; returns how many. Thread-safe."""
        now = int(self._clock())
        dropped = 0
        for cache, shift in ((self._positive, 32), (self._negative, _KIND_BITS)):
            keys = list(cache)
            if not keys:
                continue
            values = cache.get_many(keys)
            for key, value in zip(keys, values.tolist(), strict=True):
                if 0 <= value and value >> shift <= now:
                    cache.pop(key, None)
                    dropped += 1
        return dropped

    def forget(self, host: str) -> None:
        """Drop ``host`` from both caches (e.g. after its IP refused connections)."""
        key = host_key(host.strip().lower().removesuffix("."))
        self._positive.pop(key, None)
        self._negative.pop(key, None)

    # -- inside ------------------------------------------------------------------

    def _literal(self, host: str, name: str) -> str | None:
        """``name`` if it is an IPv4 literal (allowed), None if it is no IP at all."""
        bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        if not bare or not (bare[-1].isdigit() or ":" in bare):
            return None  # cheap test first: most names end in a letter
        try:
            ip = ipaddress.ip_address(bare)
        except ValueError:
            return None
        if not self.allow_private_ips and _refused(ip):
            with self._lock:
                self._failures["private"] += 1
            raise DNSError(host, "private", f"{ip} is not a public address")
        if ip.version != 4:
            with self._lock:
                self._failures["error"] += 1
            raise DNSError(host, "error", "IPv6 addresses are not supported")
        return str(ip)

    def _cached(self, key: bytes, name: str, now: float) -> str | DNSError | None:
        """The cached outcome for ``key`` at ``now`` (an IP or an error), or None."""
        value = self._positive.get(key)
        if value is not None and value >> 32 > now:
            return str(ipaddress.IPv4Address(value & _IP_MASK))
        value = self._negative.get(key)
        if value is not None and value >> _KIND_BITS > now:
            return DNSError(name, KINDS[value & ((1 << _KIND_BITS) - 1)], "cached")
        return None

    def _lead(self, key: bytes, name: str, flight: _Flight) -> str | DNSError:
        """Query ``name``, cache the outcome, wake the waiters."""
        answer: tuple[str, int] | DNSError = DNSError(name, "error", "internal error")
        try:
            answer = self._query(name)
        except Exception:  # a bug here must still wake the waiters
            logger.exception("dns: unexpected failure resolving %s", name)
        now = self._clock()
        outcome: str | DNSError
        if isinstance(answer, DNSError):
            outcome = answer
            expiry = int(now + self.negative_ttl)
            self._negative[key] = (max(0, expiry) << _KIND_BITS) | KINDS.index(answer.kind)
            self._positive.pop(key, None)
        else:
            outcome, ttl = answer
            expiry = int(now + min(max(ttl, self.min_ttl), self.max_ttl))
            self._positive[key] = (max(0, expiry) << 32) | int(ipaddress.IPv4Address(outcome))
            self._negative.pop(key, None)
        with self._lock:
            del self._inflight[key]
            purge = len(self._positive) + len(self._negative) > self._purge_at
            if purge:
                self._purge_at = 1 << 62  # one purge at a time
        if isinstance(outcome, DNSError):
            flight.error = outcome
        else:
            flight.ip = outcome
        flight.done.set()
        if purge:
            self._purge_if_full()
        return outcome

    def _follow(self, name: str, flight: _Flight) -> str | DNSError:
        if not flight.done.wait(self.timeout):
            return DNSError(name, "timeout", "waited for another thread's query")
        if flight.ip is not None:
            return flight.ip
        assert flight.error is not None
        return DNSError(name, flight.error.kind, flight.error.detail)

    def _query(self, name: str) -> tuple[str, int] | DNSError:
        """(IP, TTL) of ``name``'s first allowed A record, or the DNSError.

        Each nameserver in turn, UDP then TCP if the answer is truncated; a
        server that times out is asked again while time remains, one that
        fails otherwise (SERVFAIL, REFUSED, unreachable) is dropped.
        """
        try:
            qname = dns.name.from_text(name)  # absolute: no search list
            query = dns.message.make_query(qname, dns.rdatatype.A, use_edns=0,
                                           payload=EDNS_PAYLOAD)
        except (dns.exception.DNSException, ValueError, UnicodeError) as exc:
            return DNSError(name, "error", f"bad name: {exc}"[:200])
        deadline = time.monotonic() + self.timeout
        servers = list(self.nameservers)
        failures: list[str] = []
        while servers:
            for server in list(servers):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return DNSError(name, "timeout", "; ".join(failures[-3:]))
                try:
                    response = self._ask(query, server, deadline)
                except (dns.exception.Timeout, TimeoutError):
                    failures.append(f"{server[0]}:{server[1]} timed out")
                    continue
                except (dns.exception.DNSException, OSError, ValueError, EOFError) as exc:
                    failures.append(f"{server[0]}:{server[1]} {type(exc).__name__}: {exc}")
                    servers.remove(server)
                    continue
                rcode = response.rcode()
                if rcode == dns.rcode.NXDOMAIN:
                    return DNSError(name, "nxdomain")
                if rcode == dns.rcode.NOERROR:
                    return self._answer(name, response)
                failures.append(f"{server[0]}:{server[1]} {dns.rcode.to_text(rcode)}")
                servers.remove(server)
        kind = "servfail" if any(f.endswith(" SERVFAIL") for f in failures) else "error"
        return DNSError(name, kind, "; ".join(failures[-3:])[:200])

    def _ask(self, query: dns.message.Message, server: tuple[str, int],
             deadline: float) -> dns.message.Message:
        ip, port = server
        remaining = deadline - time.monotonic()
        try:
            return dns.query.udp(query, ip, timeout=min(self._try_timeout, remaining), port=port,
                                 ignore_unexpected=True, raise_on_truncation=True)
        except dns.message.Truncated:
            pass  # too big for UDP: ask again over TCP, within what time is left
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no time left for TCP")
        return dns.query.tcp(query, ip, timeout=remaining, port=port)

    def _answer(self, name: str, response: dns.message.Message) -> tuple[str, int] | DNSError:
        if not isinstance(response, dns.message.QueryMessage):
            return DNSError(name, "error", "not a query response")
        try:
            chain = response.resolve_chaining()  # follows CNAMEs to the A records
        except dns.exception.DNSException as exc:
            return DNSError(name, "error", f"{type(exc).__name__}: {exc}"[:200])
        rrset = chain.answer
        ips = [ipaddress.IPv4Address(rd.address) for rd in rrset] if rrset is not None else []
        if not ips:
            return DNSError(name, "nodata")
        allowed = ips if self.allow_private_ips else [ip for ip in ips if not _refused(ip)]
        if not allowed:
            return DNSError(name, "private", f"{ips[0]} is not a public address")
        return str(allowed[0]), int(chain.minimum_ttl)

    def _purge_if_full(self) -> None:
        """Past max_entries: drop the expired entries and, if more than 3/4 of
        max_entries are left, the live ones that expire soonest (a dropped name is
        only queried again). Then the next purge is max_entries/4 inserts away, so
        a purge costs O(1) a lookup, and the maps never hold much more than
        max_entries names, however many hosts a crawl meets within max_ttl."""
        keep = self.max_entries * 3 // 4
        now = int(self._clock())
        found: list[tuple[KeyIntMap, list[bytes], np.ndarray]] = []
        for cache, shift in ((self._positive, 32), (self._negative, _KIND_BITS)):
            keys = list(cache)
            values = cache.get_many(keys) if keys else np.zeros(0, dtype=np.int64)
            # An entry gone meanwhile (-1) counts as expired: its pop does nothing.
            found.append((cache, keys, np.where(values < 0, 0, values >> shift)))
        expiries = np.concatenate([e for _, _, e in found])
        order = np.argsort(expiries, kind="stable")
        expired = int(np.count_nonzero(expiries <= now))
        cut = order[: max(expired, len(order) - keep)]
        split = len(found[0][1])
        for i in cut.tolist():
            cache, keys, _ = found[0] if i < split else found[1]
            cache.pop(keys[i if i < split else i - split], None)
        with self._lock:
            self._purge_at = self.max_entries
        logger.debug("dns cache: dropped %d entries (%d expired), %d left", len(cut), expired,
                     len(expiries) - len(cut))
