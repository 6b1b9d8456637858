"""Proxies: a proxy URL parsed and checked, and a tunnel through it to a checked address.

Theory of operation
-------------------
The crawler resolves every target itself and checks the address (the private-address
rule, crawler.net.dnscache) before a byte goes out; a proxy must not undo that. So a
fetch through a proxy is a tunnel to the *checked IP*, never to the name:

- an ``http://`` or ``https://`` proxy gets ``CONNECT 203.0.113.5:443 HTTP/1.1``, for
  https *and* plain-http targets. Not the absolute-form request curl sends for http
  targets (``GET http://host/path``): with the name in it the proxy resolves it with
  its own DNS, past our check (a split-horizon resolver answers an inside address);
  with the IP in it, RFC 9112 3.2.2 makes the proxy replace our Host header with the
  IP, and name-based virtual hosts break. The cost: a proxy that allows CONNECT only
  to 443 (squid's SSL_ports, tinyproxy's shipped ConnectPort lines) refuses http
  targets with 403; give those a socks5 proxy, or none (``--proxy https=URL`` alone).
  An ``https://`` proxy (TLS to the proxy, checked against its name) carries http
  targets only: TLS inside TLS is more than ``ssl`` does over one socket.
- a ``socks5://`` proxy (RFC 1928) gets the IP as the target (ATYP 1 or 4).
  ``socks5h://`` ("the proxy resolves the name") is accepted and does the same:
  sending the name would let the proxy's DNS choose the address, past the check.

Inside the tunnel the fetcher goes on as if connected directly: TLS with the target's
name as SNI and for the certificate check, our Host header, keep-alive per origin.

Credentials (``user:password@``) go to an http proxy as Proxy-Authorization Basic and
to a socks5 proxy as RFC 1929 user/password. ``str(proxy)`` and :func:`redact` show
them as ``***``; messages and logs use only those. The proxy's own address may be
private (it is the operator's); its name is resolved by the system's resolver.

Errors while tunnelling are OSErrors, classified by the fetcher's connect phase:
ConnectionRefusedError (the proxy, or the target behind a SOCKS5 proxy, refused),
TimeoutError, and ProxyError (exceptions) for everything else the proxy answered.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import re
import socket
import ssl
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from ..exceptions import ConfigError, ProxyError
from .connections import connect_tcp, wrap_tls

log = logging.getLogger(__name__)

SCHEMES = ("http", "https", "socks5", "socks5h")
TARGETS = ("http", "https")  # the schemes of the URLs a proxy may be given for
DEFAULT_PORTS = {"http": 80, "https": 443, "socks5": 1080, "socks5h": 1080}
NONE = "none"  # ``--proxy none``, ``--proxy http=none``: direct
REDACTED = "***"  # what credentials are shown (and saved) as
MAX_HEAD = 16 << 10  # bytes of a CONNECT answer's head
_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+")  # a name, an IPv4 or an IPv6 address
_SOCKS_REPLIES = {1: "general failure", 2: "not allowed by the proxy's rules",
                  3: "network unreachable", 4: "host unreachable", 5: "connection refused",
                  6: "TTL expired", 7: "command not supported", 8: "address type not supported"}


@dataclass(frozen=True, slots=True)
class Proxy:
    """One proxy. ``str()`` is its URL with the credentials as ``***``."""

    scheme: str  # one of SCHEMES
    host: str  # a name or an IP (IPv6 without brackets)
    port: int
    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        auth = f"{REDACTED}@" if self.username else ""
        return f"{self.scheme}://{auth}{host}:{self.port}"


# -- parsing (pure) -----------------------------------------------------------------------


def redact(text: str) -> str:
    """``text`` (a proxy URL or a ``--proxy`` value) with its credentials as ``***``."""
    head, sep, rest = text.partition("://")
    if not sep:  # no scheme ("user:pw@host:1", typed wrong): all before an "@" goes
        return f"{REDACTED}@{text.rpartition('@')[2]}" if "@" in text else text
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    if "@" not in rest[:end]:
        return text
    return f"{head}://{REDACTED}@{rest[:end].rpartition('@')[2]}{rest[end:]}"


def parse_proxy(text: str) -> Proxy:
    """A proxy URL: ``SCHEME://[USER:PASSWORD@]HOST[:PORT]``. ConfigError saying what is
    wrong otherwise (the credentials never in it)."""
    shown = redact(text)[:200]
    try:
        parts = urlsplit(text.strip())
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError(f"bad proxy {shown!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"bad proxy {shown!r}: give http://, https://, socks5:// or "
                          "socks5h:// and the proxy's HOST:PORT")
    if not host or not _HOST.fullmatch(host):
        raise ConfigError(f"bad proxy {shown!r}: no valid host: give {scheme}://HOST:PORT")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"bad proxy {shown!r}: give {scheme}://HOST:PORT, nothing after it")
    user, password = parts.username, parts.password
    if user == REDACTED and password is None:
        raise ConfigError(f"the proxy {shown} had credentials, which are never saved: "
                          "give --proxy again with them (or --proxy none)")
    if user is not None and (password is None or not user):
        raise ConfigError(f"bad proxy {shown!r}: give credentials as USER:PASSWORD@")
    user, password = unquote(user or ""), unquote(password or "")
    if scheme.startswith("socks") and (len(user.encode()) > 255 or len(password.encode()) > 255):
        raise ConfigError(f"bad proxy {shown!r}: a SOCKS5 user or password is at most 255 bytes")
    return Proxy(scheme, host, port or DEFAULT_PORTS[scheme], user, password)


def parse_option(value: str) -> tuple[tuple[str, ...], Proxy | None]:
    """One ``--proxy`` value, ``[TARGET=]URL`` or ``[TARGET=]none``: the target schemes it
    is for (both when not named) and the proxy (None: direct). ConfigError if bad."""
    target, sep, url = value.partition("=")
    if not sep or "://" in target:  # an "=" in a URL's credentials names no target
        target, url = "", value
    if target and target.lower() not in TARGETS:
        raise ConfigError(f"bad proxy {redact(value)[:200]!r}: name a target scheme as "
                          "http=URL or https=URL")
    targets = (target.lower(),) if target else TARGETS
    if url.strip().lower() == NONE:
        return targets, None
    proxy = parse_proxy(url)
    if proxy.scheme == "https" and "https" in targets:
        raise ConfigError(f"bad proxy {redact(value)[:200]!r}: an https:// proxy carries http "
                          "targets only (TLS inside TLS is not supported): give it as "
                          "http=URL, and https targets an http:// or socks5:// proxy")
    return targets, proxy


def proxy_map(values: Iterable[str]) -> dict[str, Proxy]:
    """The proxy of each target scheme from ``--proxy`` values, a later one replacing an
    earlier one's. ConfigError if one is bad."""
    out: dict[str, Proxy] = {}
    for value in values:
        targets, proxy = parse_option(value)
        for target in targets:
            if proxy is None:
                out.pop(target, None)
            else:
                out[target] = proxy
    return out


# -- the tunnel -----------------------------------------------------------------------------


def connect(proxy: Proxy, timeout: float) -> socket.socket:
    """A TCP connection to the proxy itself; OSError naming the proxy when it fails."""
    try:
        ipaddress.ip_address(proxy.host)
        ip = proxy.host
    except ValueError:  # a name: the system's resolver (not the crawl's --nameserver)
        try:
            ip = str(socket.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)[0][4][0])
        except OSError as exc:
            raise ProxyError(f"proxy {proxy}: cannot resolve its name: {exc}") from exc
    try:
        return connect_tcp(ip, proxy.port, timeout)
    except OSError as exc:  # the same class (refused, timed out...), the proxy named
        what = f"proxy {proxy}: {exc.strerror or exc or 'timed out'}"
        raise (type(exc)(exc.errno, what) if exc.errno else type(exc)(what)) from exc


def tunnel(sock: socket.socket, proxy: Proxy, ip: str, port: int,
           context: ssl.SSLContext) -> socket.socket:
    """Open a tunnel to ``ip``:``port`` on ``sock`` (connected to ``proxy``): the socket
    to talk to the target on (a TLS one for an https proxy). Closes ``sock`` and raises
    OSError (ProxyError, ConnectionRefusedError, TimeoutError...) when it cannot."""
    try:
        if proxy.scheme == "https":
            sock = wrap_tls(sock, proxy.host, context)
        if proxy.scheme.startswith("socks"):
            _socks5(sock, proxy, ip, port)
        else:
            _connect(sock, proxy, ip, port)
    except BaseException:
        sock.close()
        raise
    log.debug("tunnel to %s:%d through %s", ip, port, proxy)
    return sock


def _connect(sock: socket.socket, proxy: Proxy, ip: str, port: int) -> None:
    """HTTP CONNECT (RFC 9110 9.3.6) to the IP, and its answer's head read exactly."""
    authority = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.username:
        token = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
        lines.append(f"Proxy-Authorization: Basic {token}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        if len(head) > MAX_HEAD:
            raise ProxyError(f"proxy {proxy}: an answer to CONNECT of over {MAX_HEAD} bytes")
        data = sock.recv(4096)
        if not data:
            raise ProxyError(f"proxy {proxy}: closed the connection before it answered CONNECT")
        head += data
    head, _, extra = head.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    shown = "".join(c if " " <= c <= "~" else "?" for c in status_line)[:100]
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ProxyError(f"proxy {proxy}: not an HTTP answer to CONNECT: {shown!r}")
    if code in ("407", "401"):  # 407 is the standard; tinyproxy answers bad ones with 401
        why = "refused the credentials" if proxy.username else "wants credentials (USER:PASSWORD@)"
        raise ProxyError(f"proxy {proxy}: {why}: {shown!r}")
    if not code.startswith("2"):
        raise ProxyError(f"proxy {proxy}: answered CONNECT {authority} with {shown!r}")
    if extra:  # the target cannot have spoken: neither HTTP nor TLS servers speak first
        raise ProxyError(f"proxy {proxy}: sent bytes past its answer to CONNECT")


def _socks5(sock: socket.socket, proxy: Proxy, ip: str, port: int) -> None:
    """The SOCKS5 greeting, RFC 1929 authentication if asked for, then CONNECT to the IP."""
    methods = b"\x00\x02" if proxy.username else b"\x00"
    sock.sendall(b"\x05" + bytes([len(methods)]) + methods)
    version, method = _read(sock, 2, proxy)
    if version != 5:
        raise ProxyError(f"proxy {proxy}: not a SOCKS5 proxy (version {version})")
    if method == 2 and proxy.username:
        user, password = proxy.username.encode(), proxy.password.encode()
        sock.sendall(b"\x01" + bytes([len(user)]) + user + bytes([len(password)]) + password)
        if _read(sock, 2, proxy)[1] != 0:
            raise ProxyError(f"proxy {proxy}: refused the user name and password")
    elif method != 0:  # 2 when we have no credentials, 255: none of those offered
        why = "" if proxy.username else ": it may want USER:PASSWORD@"
        raise ProxyError(f"proxy {proxy}: accepts no method we offered ({method}){why}")
    addr = ipaddress.ip_address(ip)
    atyp = b"\x01" if addr.version == 4 else b"\x04"
    sock.sendall(b"\x05\x01\x00" + atyp + addr.packed + struct.pack(">H", port))
    version, reply, _, atyp_back = _read(sock, 4, proxy)
    if version != 5:
        raise ProxyError(f"proxy {proxy}: not a SOCKS5 answer (version {version})")
    if reply != 0:
        what = f"{proxy}: {ip}:{port}: {_SOCKS_REPLIES.get(reply, 'error')} (SOCKS5 reply {reply})"
        if reply == 5:  # the target refused: as a direct connect would have said
            raise ConnectionRefusedError(f"proxy {what}")
        if reply == 6:
            raise TimeoutError(f"proxy {what}")
        raise ProxyError(f"proxy {what}")
    if atyp_back not in (1, 3, 4):
        raise ProxyError(f"proxy {proxy}: a SOCKS5 answer with address type {atyp_back}")
    size = 4 if atyp_back == 1 else 16 if atyp_back == 4 else _read(sock, 1, proxy)[0]
    _read(sock, size + 2, proxy)  # the address the proxy bound, and its port: unused


def _read(sock: socket.socket, n: int, proxy: Proxy) -> bytes:
    """Exactly ``n`` bytes of the proxy's answer."""
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise ProxyError(f"proxy {proxy}: closed the connection in the SOCKS5 handshake")
        data += piece
    return data
