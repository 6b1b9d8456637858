"""A DNS server for tests, on loopback only, built on dnspython.

Theory of operation: one background thread runs an asyncio loop that serves
UDP and TCP on the same port of a 127.0.0.0/8 address (or of tools/cluster.py's
bridge in 198.18.0.0/15, whose network namespaces cannot reach loopback). The sockets are bound
in ``start()`` (UDP first, which picks the port, then TCP on that number; a
clash retries with a fresh port), so bind errors surface in the caller.

Each message goes through ``_plan()``, which parses it, logs a ``DNSQuery``
and builds the reply bytes (or none). The answer is authoritative: A records
for known names, NOERROR with no answer (NODATA) for other types of a known
name, NXDOMAIN for anything else. Our UDP payload size is 512 bytes (also
what we advertise over EDNS), so a large answer goes out over UDP with the TC
bit and only the question, and whole over TCP. Faults per name: SERVFAIL,
no answer at all, or an answer after a delay; a delayed answer is sent by its
own task, so it never holds up other queries (not even on the same TCP
connection: RFC 7766 allows replies out of order).

``stop()`` wakes the loop, which closes the listening sockets, every TCP
connection and every pending delayed answer, then the thread ends. The same
object can be started again; it rebinds the port it had.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import struct
import threading
import time
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, cast

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from .urls import SERVE_NETWORKS_TEXT, servable

__all__ = ["DNSFaults", "DNSQuery", "DNSServer"]

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_TTL = 300
#: Our UDP payload size; larger answers are truncated (TC) over UDP.
UDP_MAX_SIZE = 512
TCP_MAX_SIZE = 65535
TCP_BACKLOG = 128
#: Attempts to find a port free for both UDP and TCP when port=0.
BIND_ATTEMPTS = 50
#: How long start() and stop() wait for the server thread.
THREAD_TIMEOUT = 5.0

#: Log rcodes for messages that got no reply (they are not DNS rcodes).
TIMEOUT = "TIMEOUT"  # the name has the "timeout" fault
DROPPED = "DROPPED"  # a response or garbage too short to answer

Transport = Literal["udp", "tcp"]
_HEADER = struct.Struct("!HHHHHH")


@dataclass(frozen=True, slots=True)
class DNSQuery:
    """One message the server received.

    ``time`` is wall-clock ``time.time()`` at receipt; ``name`` is lower case
    without the final dot ("" if the message could not be parsed); ``rcode``
    is the rcode sent (e.g. "NOERROR", "NXDOMAIN", "SERVFAIL", "FORMERR"),
    or TIMEOUT / DROPPED when nothing was sent.
    """

    time: float
    name: str
    qtype: str
    transport: Transport
    rcode: str


@dataclass
class DNSFaults:
    """Per-name faults (any name, known or not; case-insensitive).

    ``timeout`` wins over the others; ``slow`` delays whatever the answer is,
    SERVFAIL included. The server reads these sets on every query, so they
    may be changed while it runs.
    """

    servfail: set[str] = field(default_factory=set)
    timeout: set[str] = field(default_factory=set)
    slow: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Plan:
    reply: bytes | None  # None: send nothing
    delay: float = 0.0


def _name(text: str) -> dns.name.Name:
    """Parse a host name given by the user (case-insensitive, IDN allowed)."""
    try:
        name = dns.name.from_text(text.strip())
    except dns.exception.DNSException as exc:
        raise ValueError(f"invalid DNS name {text!r}: {exc}") from exc
    if name == dns.name.root:
        raise ValueError(f"invalid DNS name {text!r}: empty")
    return name


def _name_text(name: dns.name.Name) -> str:
    return name.to_text(omit_final_dot=True).lower()


def _loopback_ip(text: str) -> str:
    try:
        ip = ipaddress.IPv4Address(text)
    except ValueError as exc:
        raise ValueError(f"not an IPv4 address: {text!r}") from exc
    # A record elsewhere would send the crawler under test off this machine.
    if not servable(str(ip)):
        raise ValueError(f"{text}: only {SERVE_NETWORKS_TEXT} addresses may be served")
    return str(ip)


def _check_host(host: str) -> str:
    if host == "localhost":
        return DEFAULT_HOST
    if not servable(host):
        raise ValueError(f"host must be an IPv4 address in {SERVE_NETWORKS_TEXT}, not {host!r}")
    return str(ipaddress.ip_address(host))


def _parse_records(
    records: Mapping[str, str | Iterable[str]],
) -> dict[dns.name.Name, tuple[str, ...]]:
    parsed: dict[dns.name.Name, tuple[str, ...]] = {}
    for name, value in records.items():
        ips = [value] if isinstance(value, str) else list(value)
        # dict.fromkeys: drop duplicates, keep order.
        parsed[_name(name)] = tuple(dict.fromkeys(_loopback_ip(ip) for ip in ips))
    return parsed


def _formerr_for(data: bytes) -> bytes | None:
    """A bare FORMERR reply to an unparsable query, if it has a query header."""
    if len(data) < _HEADER.size:
        return None
    qid, flags = _HEADER.unpack_from(data)[:2]
    if flags & dns.flags.QR:
        return None
    # Keep the opcode bits (0x7800) and RD, as make_response would.
    flags = int(dns.flags.QR) | (flags & (0x7800 | int(dns.flags.RD))) | int(dns.rcode.FORMERR)
    return _HEADER.pack(qid, flags, 0, 0, 0, 0)


class _UDPProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: DNSServer) -> None:
        self._server = server
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's UDP transport class does not inherit DatagramTransport.
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        plan = self._server._plan(data, "udp")
        if plan.reply is None or self._transport is None:
            return
        if plan.delay > 0:
            self._server._spawn(self._send_later(plan.reply, addr, plan.delay))
        else:
            self._transport.sendto(plan.reply, addr)

    async def _send_later(self, reply: bytes, addr: tuple[str, int], delay: float) -> None:
        await asyncio.sleep(delay)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.sendto(reply, addr)

    def error_received(self, exc: Exception) -> None:
        # E.g. ICMP port unreachable from a client that gave up; not our problem.
        logger.debug("dns udp error: %s", exc)


class DNSServer:
    """An authoritative DNS server for ``records`` on a loopback address.

    ``records`` maps host names (case-insensitive, no final dot needed) to an
    IPv4 address or a list of them, all in 127.0.0.0/8; an empty list makes
    a name that exists with no A record. All public methods are thread-safe.
    """

    def __init__(
        self,
        records: Mapping[str, str | list[str]],
        *,
        host: str = DEFAULT_HOST,
        port: int = 0,
        ttl: int = DEFAULT_TTL,
        faults: DNSFaults | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port out of range: {port}")
        if not 0 <= ttl <= 2**31 - 1:
            raise ValueError(f"ttl out of range: {ttl}")
        self._host = _check_host(host)
        self._port = port
        self.ttl = ttl
        #: Read on every query; may be replaced or changed while running.
        self.faults = faults if faults is not None else DNSFaults()
        self._records = _parse_records(records)
        self._lock = threading.Lock()  # guards _records and _log
        self._log: list[DNSQuery] = []
        self._state_lock = threading.Lock()  # serialises start/stop
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._startup_error: BaseException | None = None
        # Loop-thread only: delayed answers and TCP connections, cancelled on stop
        # (a cancelled connection closes its socket on the way out).
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle -----------------------------------------------------------

    @property
    def port(self) -> int:
        """The port bound (kept after stop, and rebound by a restart)."""
        if self._port == 0:
            raise RuntimeError("DNSServer has not been started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return (self._host, self.port)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Bind UDP and TCP and serve in a background thread."""
        with self._state_lock:
            if self._thread is not None:
                raise RuntimeError("DNSServer is already running")
            udp, tcp = self._bind()
            self._port = udp.getsockname()[1]
            self._startup_error = None
            ready = threading.Event()
            thread = threading.Thread(
                target=self._run,
                args=(udp, tcp, ready),
                name=f"dnsserver:{self._port}",
                daemon=True,
            )
            thread.start()
            ready.wait(THREAD_TIMEOUT)
            if self._startup_error is not None:
                thread.join(THREAD_TIMEOUT)
                raise self._startup_error
            self._thread = thread
            logger.debug("dns server on %s:%d (udp+tcp)", self._host, self._port)

    def stop(self) -> None:
        """Stop serving, close every socket and join the thread. Idempotent."""
        with self._state_lock:
            thread, loop, stopping = self._thread, self._loop, self._stopping
            if thread is None:
                return
            if loop is not None and stopping is not None:
                try:
                    loop.call_soon_threadsafe(stopping.set)
                except RuntimeError:  # the loop already ended (it crashed)
                    pass
            thread.join(THREAD_TIMEOUT)
            if thread.is_alive():
                logger.warning("dns server thread did not stop within %.1f s", THREAD_TIMEOUT)
            self._thread = self._loop = self._stopping = None

    def __enter__(self) -> DNSServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<DNSServer {self._host}:{self._port} {state} names={len(self._records)}>"

    def _bind(self) -> tuple[socket.socket, socket.socket]:
        attempts = BIND_ATTEMPTS if self._port == 0 else 1
        for _ in range(attempts):
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                udp.bind((self._host, self._port))
                tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    # Lets a restart rebind while old connections sit in TIME_WAIT.
                    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    tcp.bind((self._host, udp.getsockname()[1]))
                    tcp.listen(TCP_BACKLOG)
                except BaseException:
                    tcp.close()
                    raise
            except OSError as exc:
                udp.close()
                if attempts == 1 or exc.errno != errno.EADDRINUSE:
                    raise OSError(
                        exc.errno, f"dns port {self._host}:{self._port}: {exc.strerror}"
                    ) from exc
                continue
            except BaseException:
                udp.close()
                raise
            return udp, tcp
        raise OSError(errno.EADDRINUSE, f"no port free for both UDP and TCP on {self._host}")

    def _run(self, udp: socket.socket, tcp: socket.socket, ready: threading.Event) -> None:
        try:
            asyncio.run(self._serve(udp, tcp, ready))
        except BaseException as exc:  # reported to start(), or logged
            if not ready.is_set():
                self._startup_error = exc
            else:
                logger.exception("dns server thread crashed")
        finally:
            udp.close()  # no-ops when the loop already closed them
            tcp.close()
            ready.set()

    async def _serve(self, udp: socket.socket, tcp: socket.socket, ready: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        udp_transport, _ = await loop.create_datagram_endpoint(lambda: _UDPProtocol(self), sock=udp)
        try:
            server = await asyncio.start_server(self._serve_tcp, sock=tcp)
        except BaseException:
            udp_transport.close()
            raise
        self._loop, self._stopping = loop, stopping
        ready.set()
        try:
            await stopping.wait()
        finally:
            server.close()
            udp_transport.close()
            # Repeat: a connection accepted just before close() starts its task late.
            while self._tasks:
                tasks = list(self._tasks)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()
            await asyncio.sleep(0)  # let the transports' connection_lost callbacks run

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                try:
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    data = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                plan = self._plan(data, "tcp")
                if plan.reply is None:
                    continue
                framed = len(plan.reply).to_bytes(2, "big") + plan.reply
                if plan.delay > 0:
                    self._spawn(self._send_tcp_later(writer, framed, plan.delay))
                else:
                    # Replies are small; no drain, so one slow reader cannot stall us.
                    writer.write(framed)
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    @staticmethod
    async def _send_tcp_later(writer: asyncio.StreamWriter, framed: bytes, delay: float) -> None:
        await asyncio.sleep(delay)
        if not writer.is_closing():
            writer.write(framed)

    # -- answering -----------------------------------------------------------

    def _plan(self, data: bytes, transport: Transport) -> _Plan:
        """Log one message and decide the reply. Never raises: a bad packet
        must not kill the UDP endpoint (asyncio closes it on an exception)."""
        received = time.time()
        try:
            plan, name, qtype, rcode = self._answer(data, transport)
        except Exception:  # survive anything, but say what happened
            logger.exception("dns server failed on a %d-byte %s message", len(data), transport)
            plan, name, qtype, rcode = _Plan(None), "", "", DROPPED
        with self._lock:
            self._log.append(DNSQuery(received, name, qtype, transport, rcode))
        return plan

    def _answer(self, data: bytes, transport: Transport) -> tuple[_Plan, str, str, str]:
        try:
            query = dns.message.from_wire(data)
        except Exception as exc:  # dnspython raises many kinds on garbage
            logger.debug("dns: malformed %s message (%s)", transport, exc)
            reply = _formerr_for(data)
            return _Plan(reply), "", "", "FORMERR" if reply else DROPPED
        if query.flags & dns.flags.QR:
            return _Plan(None), "", "", DROPPED  # never answer a response
        response = dns.message.make_response(query, our_payload=UDP_MAX_SIZE)
        response.flags |= dns.flags.AA
        if len(query.question) != 1:
            return self._reply(response, dns.rcode.FORMERR, transport), "", "", "FORMERR"
        question = query.question[0]
        name, qtype = _name_text(question.name), dns.rdatatype.to_text(question.rdtype)
        faults = self.faults
        if name in {_name_text(_name(n)) for n in faults.timeout}:
            return _Plan(None), name, qtype, TIMEOUT
        delay = max(
            (d for n, d in faults.slow.items() if _name_text(_name(n)) == name), default=0.0
        )
        if query.opcode() != dns.opcode.QUERY:
            rcode = dns.rcode.NOTIMP
        elif name in {_name_text(_name(n)) for n in faults.servfail}:
            rcode = dns.rcode.SERVFAIL
        elif question.rdclass != dns.rdataclass.IN:
            rcode = dns.rcode.REFUSED
        else:
            with self._lock:
                ips = self._records.get(question.name)
            if ips is None:
                rcode = dns.rcode.NXDOMAIN
            else:
                rcode = dns.rcode.NOERROR
                if question.rdtype == dns.rdatatype.A and ips:
                    response.answer.append(
                        dns.rrset.from_text_list(
                            question.name, self.ttl, dns.rdataclass.IN, dns.rdatatype.A, list(ips)
                        )
                    )
        plan = self._reply(response, rcode, transport, delay)
        return plan, name, qtype, dns.rcode.to_text(rcode)

    @staticmethod
    def _reply(
        response: dns.message.Message,
        rcode: dns.rcode.Rcode,
        transport: Transport,
        delay: float = 0.0,
    ) -> _Plan:
        response.set_rcode(rcode)
        max_size = UDP_MAX_SIZE if transport == "udp" else TCP_MAX_SIZE
        try:
            wire = response.to_wire(max_size=max_size)
        except dns.exception.TooBig:
            # Too big: question only, with TC, so the client retries over TCP.
            response.answer.clear()
            response.flags |= dns.flags.TC
            wire = response.to_wire(max_size=max_size)
        return _Plan(wire, delay)

    # -- records and log -----------------------------------------------------

    def set_records(self, records: Mapping[str, str | list[str]]) -> None:
        """Replace all records at once (atomically for queries). Thread-safe."""
        parsed = _parse_records(records)
        with self._lock:
            self._records = parsed

    def add_record(self, name: str, ip: str) -> None:
        """Add one address to ``name``, creating the name if new. Thread-safe."""
        key, ip = _name(name), _loopback_ip(ip)
        with self._lock:
            records = dict(self._records)  # copy-on-write: readers see old or new
            old = records.get(key, ())
            records[key] = old if ip in old else (*old, ip)
            self._records = records

    @property
    def log(self) -> list[DNSQuery]:
        """A copy of every message received, oldest first. Thread-safe."""
        with self._lock:
            return list(self._log)

    def queries(self, name: str | None = None) -> list[DNSQuery]:
        """The log, only for ``name`` (case-insensitive) if given. Thread-safe."""
        if name is None:
            return self.log
        wanted = _name_text(_name(name))
        return [q for q in self.log if q.name == wanted]

    def clear_log(self) -> None:
        """Forget every logged message. Thread-safe."""
        with self._lock:
            self._log.clear()
