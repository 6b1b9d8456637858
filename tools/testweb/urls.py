"""URL helpers shared by the site, the oracle and the exporter.

The site speaks one canonical URL form, and the oracle returns URLs in it:
absolute; scheme and host lowercase; an IDN host in its ASCII (``xn--``)
form; no default port; an empty path is ``/``; non-ASCII and spaces in the
path and query percent-encoded as UTF-8 with uppercase hex; no fragment.
Dot segments are resolved by ``urljoin`` when a relative link is joined.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from ipaddress import IPv4Address, ip_address, ip_network
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
LOOPBACK_IP = "127.0.0.1"
# Nothing listens on this address (everything binds 127.0.0.1 only), so a host
# resolving here refuses connections on every port.
REFUSED_IP = "127.0.0.2"
# Where the test web may listen, and what its DNS may answer: loopback, or the
# benchmarking range (RFC 2544) that tools/cluster.py gives its bridge and network
# namespaces (a namespace cannot reach the root namespace's loopback). Nothing else,
# so a crawler under test is never sent off this machine.
SERVE_NETWORKS = (ip_network("127.0.0.0/8"), ip_network("198.18.0.0/15"))
SERVE_NETWORKS_TEXT = "127.0.0.0/8 or 198.18.0.0/15"


def servable(address: str) -> bool:
    """Whether ``address`` is an IPv4 address in SERVE_NETWORKS."""
    try:
        ip = ip_address(address)
    except ValueError:
        return False
    return isinstance(ip, IPv4Address) and any(ip in net for net in SERVE_NETWORKS)

# Characters left alone when percent-encoding (RFC 3986 reserved + unreserved + '%').
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"
_PCT = re.compile(r"%[0-9a-fA-F]{2}")


def idna_host(host: str) -> str | None:
    """Lowercase ASCII form of a host name, None if it cannot be encoded."""
    host = host.lower().rstrip(".")
    if not host:
        return None
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return None


def upper_pct(text: str) -> str:
    """Uppercase the hex digits of every percent-escape (RFC 3986 6.2.2.1)."""
    return _PCT.sub(lambda m: m.group(0).upper(), text)


def quote_path(path: str) -> str:
    return upper_pct(quote(path, safe=_PATH_SAFE))


def quote_query(query: str) -> str:
    return upper_pct(quote(query, safe=_QUERY_SAFE))


def origin(scheme: str, host: str, port: int) -> str:
    """``scheme://host[:port]`` without a default port."""
    if port == DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def normalize(url: str, base: str | None = None) -> str | None:
    """The canonical absolute form of ``url`` (joined to ``base``), or None.

    None means "not a URL a crawler fetches": another scheme (mailto:,
    javascript:, data:, tel:, ftp:), no host, a bad port or an unencodable host.
    """
    url = url.strip(" \t\n\r\f")
    if base is not None:
        url = urljoin(base, url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or parts.hostname is None:
        return None
    host = idna_host(parts.hostname)
    if host is None:
        return None
    netloc = origin(scheme, host, port or DEFAULT_PORTS[scheme]).split("://", 1)[1]
    path = quote_path(parts.path or "/")
    return urlunsplit((scheme, netloc, path, quote_query(parts.query), ""))


@dataclass(frozen=True, slots=True)
class Target:
    """A canonical URL split into the parts the site routes on."""

    scheme: str
    host: str
    port: int
    path: str  # percent-encoded, no query
    query: str  # without '?'; "" when absent

    @property
    def target(self) -> str:
        """The request-target: path plus ``?query`` when there is one."""
        return f"{self.path}?{self.query}" if self.query else self.path


def split(url: str) -> Target | None:
    """Split a canonical (or any absolute) URL; None when it is not http(s)."""
    canon = normalize(url)
    if canon is None:
        return None
    parts = urlsplit(canon)
    scheme = parts.scheme
    host = parts.hostname or ""
    port = parts.port or DEFAULT_PORTS[scheme]
    return Target(scheme, host, port, parts.path, parts.query)
