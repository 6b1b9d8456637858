"""URL normalization and hashing: one canonical string per crawlable URL (pure, no I/O).

Theory of operation. Every URL the crawler admits goes through
:func:`normalize`, and only its result is hashed (:func:`url_key`) into
MainDB / PendSet / ProcessingSet, so two spellings of one resource must give
one string. The rules are RFC 3986 (section 5 resolution, 6.2.2 syntax-based
and 6.2.3 scheme-based normalization) with the WHATWG URL Standard's leniency
where browsers and the RFC disagree, because pages are written for browsers.
Each rule is a case in tests/crawler/test_url_normalization_rfc.py.

Rules:

1. Input clean-up (WHATWG): leading/trailing C0 controls and spaces are
   stripped; tab, CR and LF are removed anywhere.
2. Schemes: only ``http`` and ``https`` (any case); anything else
   (``javascript:``, ``mailto:``, ``data:``, ``ftp:``...) is rejected.
   ``http:g`` against an http base is a relative reference (RFC 5.2.2's
   non-strict option, as WHATWG); extra slashes after the scheme are skipped
   (``http:///h/`` is ``http://h/``); ``\\`` counts as ``/`` before the query.
3. Resolution: RFC 3986 5.2 against the base (itself normalized, cached);
   dot segments are removed after resolution (5.2.4), ``%2E`` counting as a
   dot (WHATWG); ``..`` above the root stays at the root.
4. The fragment is dropped. The query is kept as written, in order; an empty
   ``?`` is dropped (no server we know tells ``/p?`` from ``/p``).
5. Userinfo is *stripped*, not rejected: the crawler never sends
   credentials, and ``http://a@b/`` names what ``http://b/`` names.
6. Host: percent-decoded, lowercased (6.2.2.1), one trailing dot dropped
   (our choice: ``e.com.`` and ``e.com`` are one host for politeness and
   keys; WHATWG keeps the dot). Non-ASCII hosts go through UTS #46 mapping
   (non-transitional, so ``ß`` stays ``ß`` as in browsers) and then IDNA 2008
   A-labels via the ``idna`` package; a code point UTS #46 allows and IDNA
   2008 does not (emoji, symbols) is Punycode-encoded anyway, as browsers do.
   An ``xn--`` label must be the canonical A-label of a valid U-label. After
   that only letters, digits, ``-`` and ``_`` may remain, in labels of 1-63
   characters, 253 in all; anything else (an empty host too) is rejected.
7. IPv4 (WHATWG): a host whose last label is a number is an address in
   decimal, ``0x`` hex or ``0`` octal parts (``0x7f.1``, ``2130706433``,
   ``0177.0.0.1``) and is *normalized* to dotted decimal, so address checks
   downstream see the real address; out of range is rejected. IPv6 literals
   are kept, compressed and lowercase (``[::1]``); zone ids and IPvFuture are
   rejected.
8. Port: the default (80 for http, 443 for https) is dropped (6.2.3), ``:``
   with no digits means the default, leading zeros are dropped, port 0 and
   ports > 65535 or not ASCII digits are rejected.
9. Path and query (6.2.2.2, WHATWG): escapes of unreserved characters are
   decoded, other escapes get uppercase hex, a stray ``%`` becomes ``%25``,
   and every character RFC 3986 does not allow there (space, ``"<>`{}|^[]``,
   C0 controls, non-ASCII as UTF-8) is percent-encoded. Reserved characters
   and their escapes stay distinct (``/`` is not ``%2F``). Query text is
   always UTF-8, not the page's charset (browsers use the page's). An empty
   path is ``/`` (6.2.3).
10. Length: the result is at most ``max_length`` characters (all ASCII;
    2,048 by default, crawler.config's); raw input over 4 times that is refused
    before any work.

The result is idempotent (``normalize(normalize(u)) == normalize(u)``) and
always parses with :mod:`urllib.parse`. Errors raise
:class:`~crawler.exceptions.URLError` whose ``reason`` is one of
``too_long``, ``scheme``, ``relative`` (no scheme and no base), ``host``,
``port``; a bad base raises with reason ``base <reason>`` and the base as url.

Speed: links on a page are mostly clean ASCII (``p7.html``, ``/s1/p4.html``,
``http://host/path``). One precompiled regex recognizes such input, and then
:func:`_fast` needs only string slicing and the cached authority and base;
anything else (escapes, non-ASCII, whitespace, backslashes, uppercase or
other schemes) takes the general path. Both give the same answer (a property
test checks it).

Parse once: :func:`parse` splits a normalized URL into a :class:`URL`
(scheme, host, port, path+query, and the origin, Host header and keys
derived from them) by slicing. The engine makes one per claimed URL and
hands it on, so no later step splits the string again.

Host names and IP literals (rules 6 and 7) are parsed in
:mod:`crawler.web._hosts`.

Thread safety: every function is pure; the small ``functools.lru_cache``
tables (authorities, bases) are thread-safe.
"""

from __future__ import annotations

import re
from functools import lru_cache
from hashlib import md5 as _md5
from typing import NamedTuple

from ..config import DEFAULT_MAX_URL_LENGTH
from ..exceptions import URLError
from ._hosts import Bad, parse_host, parse_ipv6

__all__ = [
    "DEFAULT_MAX_URL_LENGTH",
    "DEFAULT_PORTS",
    "URL",
    "host_key",
    "host_of",
    "host_of_netloc",
    "netloc_of",
    "normalize",
    "origin",
    "parse",
    "url_key",
    "utf8_url_key",
]

DEFAULT_PORTS = {"http": 80, "https": 443}
_SCHEMES = {scheme: scheme for scheme in DEFAULT_PORTS}
# Raw input longer than this many times max_length is refused before any
# work: resolution can shrink a URL, but not by that much in practice.
_INPUT_SLACK = 4
_CACHE_SIZE = 4096

_STRIP = "".join(map(chr, range(0x21)))  # WHATWG: C0 controls and space, at both ends
_TAB_NL = {ord("\t"): None, ord("\n"): None, ord("\r"): None}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# RFC 3986: pchar = unreserved / pct-encoded / sub-delims / ":" / "@"; path adds "/",
# query adds "/" and "?". Anything else is percent-encoded.
_PATH_SET = r"A-Za-z0-9\-._~!$&'()*+,;=:@/"
_QUERY_SET = _PATH_SET + "?"
_PATH_CLEAN = re.compile(f"[{_PATH_SET}]*")
_QUERY_CLEAN = re.compile(f"[{_QUERY_SET}]*")
_PATH_FIX = re.compile(f"%([0-9A-Fa-f]{{2}})?|[^{_PATH_SET}%]+")
_QUERY_FIX = re.compile(f"%([0-9A-Fa-f]{{2}})?|[^{_QUERY_SET}%]+")

# The fast path takes input without escapes, whitespace, backslashes or
# non-ASCII: only characters that stand for themselves, and "#".
_unclean = re.compile(f"[^{_QUERY_SET}#]").search


def normalize(
    url: str, base: str | None = None, *, max_length: int = DEFAULT_MAX_URL_LENGTH
) -> str:
    """The canonical absolute form of ``url`` resolved against ``base``.

    ``base`` is any absolute http(s) URL (normalized here, cached). Raises
    URLError (reason ``too_long``, ``scheme``, ``relative``, ``host`` or
    ``port``); a bad ``base`` raises URLError for the base. Thread-safe.
    """
    if _unclean(url) is None and len(url) <= max_length * _INPUT_SLACK:
        try:
            out = _fast(url, base)
        except Bad as exc:
            raise URLError(url, exc.reason) from None
        if out is not None:
            if len(out) > max_length:
                raise URLError(url, "too_long")
            return out
    return _normalize(url, base, max_length)


def _normalize(url: str, base: str | None, max_length: int) -> str:
    """The general path of :func:`normalize` (every rule, any input)."""
    s = url.strip(_STRIP)
    if "\t" in s or "\n" in s or "\r" in s:
        s = s.translate(_TAB_NL)
    if len(s) > max_length * _INPUT_SLACK:
        raise URLError(url, "too_long")
    try:
        out = _resolve(s, base)
    except Bad as exc:
        raise URLError(url, exc.reason) from None
    if len(out) > max_length:
        raise URLError(url, "too_long")
    return out


def _resolve(s: str, base: str | None) -> str:
    m = _SCHEME.match(s)
    b = _parse_base(base) if base is not None else None
    if m is not None:
        scheme = m.group(1).lower()
        if scheme not in DEFAULT_PORTS:
            raise Bad("scheme")
        head, query = _split_ref(s[m.end() :])
        if b is None or b[0] != scheme or head.startswith("//"):
            return _assemble(scheme, head.lstrip("/"), query)
        # Same scheme as the base and no authority: a relative reference.
    elif b is None:
        raise Bad("relative")
    else:
        head, query = _split_ref(s)
    scheme, netloc, bpath, bquery = b
    if head.startswith("//"):
        return _assemble(scheme, head.lstrip("/"), query)
    if head.startswith("/"):
        path = head
    elif head:
        path = bpath[: bpath.rfind("/") + 1] + head
    else:
        path = bpath
        if query is None:
            query = bquery
    return _finish(scheme, netloc, path, query)


def _fast(ref: str, base: str | None) -> str | None:
    """:func:`normalize` of a clean ASCII reference, or None when it needs the
    general path. Raises Bad or URLError as that path would."""
    cut = ref.find("#")
    if cut >= 0:
        ref = ref[:cut]
    cut = ref.find("?")
    if cut >= 0:
        head, query = ref[:cut], ref[cut + 1 :]
    else:
        head, query = ref, None
    if head.startswith(("http://", "https://")):
        if base is not None:
            _base_dir(base)  # a bad base fails even beside an absolute URL
        if head[4] == ":":
            return _fast_net("http", head[7:], query)
        return _fast_net("https", head[8:], query)
    if base is None or not head:
        return None
    colon = head.find(":")
    if colon >= 0 and not 0 <= head.find("/") < colon:
        return None  # a first segment with ":" may be a scheme
    scheme, origin, directory = _base_dir(base)
    if head.startswith("/"):
        if head.startswith("//"):
            return _fast_net(scheme, head[2:], query)
        path = head
    else:
        while head.startswith("../"):  # the usual dot segments, without _remove_dots
            directory = directory[: directory.rfind("/", 0, -1) + 1] or "/"
            head = head[3:]
        while head.startswith("./"):
            head = head[2:]
        path = directory + head
    if "/." in path:
        path = _remove_dots(path)
    return f"{origin}{path}?{query}" if query else origin + path


def _fast_net(scheme: str, rest: str, query: str | None) -> str | None:
    """``rest`` is ``authority[/path]`` just after ``//``."""
    slash = rest.find("/")
    if slash == 0:
        return None  # extra slashes
    if slash < 0:
        path = "/"
        netloc = _authority(scheme, rest)
    else:
        path = rest[slash:]
        netloc = _authority(scheme, rest[:slash])
        if "/." in path:
            path = _remove_dots(path)
    return f"{scheme}://{netloc}{path}?{query}" if query else f"{scheme}://{netloc}{path}"


@lru_cache(maxsize=_CACHE_SIZE)
def _base_dir(base: str) -> tuple[str, str, str]:
    """(scheme, ``scheme://netloc``, directory of the path) of a base URL."""
    scheme, netloc, path, _ = _parse_base(base)
    return scheme, f"{scheme}://{netloc}", path[: path.rfind("/") + 1]


def _split_ref(rest: str) -> tuple[str, str | None]:
    """(part before the query with ``\\`` as ``/``, query or None); the fragment is dropped."""
    cut = rest.find("#")
    if cut >= 0:
        rest = rest[:cut]
    q = rest.find("?")
    query = None
    if q >= 0:
        rest, query = rest[:q], rest[q + 1 :]
    if "\\" in rest:
        rest = rest.replace("\\", "/")
    return rest, query


def _assemble(scheme: str, auth_path: str, query: str | None) -> str:
    """From ``authority[/path]`` (leading slashes already skipped)."""
    slash = auth_path.find("/")
    if slash < 0:
        authority, path = auth_path, "/"
    else:
        authority, path = auth_path[:slash], auth_path[slash:]
    return _finish(scheme, _authority(scheme, authority), path, query)


def _finish(scheme: str, netloc: str, path: str, query: str | None) -> str:
    if not _PATH_CLEAN.fullmatch(path):
        path = _PATH_FIX.sub(_fix_escape, path)
    if "/." in path:
        path = _remove_dots(path)
    if query:
        if not _QUERY_CLEAN.fullmatch(query):
            query = _QUERY_FIX.sub(_fix_escape, query)
        return f"{scheme}://{netloc}{path}?{query}"
    return f"{scheme}://{netloc}{path}"


def _fix_escape(m: re.Match[str]) -> str:
    text = m.group(0)
    if text[0] != "%":  # characters that must be encoded, as UTF-8
        return "".join(f"%{b:02X}" for b in text.encode("utf-8", "surrogatepass"))
    hexits = m.group(1)
    if hexits is None:
        return "%25"  # a '%' that starts no escape
    char = chr(int(hexits, 16))
    return char if char in _UNRESERVED else "%" + hexits.upper()


def _remove_dots(path: str) -> str:
    """RFC 3986 5.2.4 on an absolute path, iteratively."""
    segs = path.split("/")
    if "." not in segs and ".." not in segs:
        return path  # "/." was the start of a name, as in "/.well-known"
    out: list[str] = []
    for seg in segs[1:]:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    if segs[-1] in (".", ".."):
        out.append("")  # "/a/." and "/a/b/.." name a directory
    return "/" + "/".join(out)


@lru_cache(maxsize=_CACHE_SIZE)
def _parse_base(base: str) -> tuple[str, str, str, str | None]:
    """(scheme, netloc, path, query) of a normalized base URL."""
    try:
        canon = _resolve(base.strip(_STRIP).translate(_TAB_NL), None)
    except Bad as exc:
        raise URLError(base, "base " + exc.reason) from None
    scheme, _, rest = canon.partition("://")
    slash = rest.index("/")
    netloc, tail = rest[:slash], rest[slash:]
    path, sep, query = tail.partition("?")
    return scheme, netloc, path, query if sep else None


@lru_cache(maxsize=_CACHE_SIZE)
def _authority(scheme: str, authority: str) -> str:
    """Normalized ``host[:port]`` of a raw authority; raises Bad."""
    hostport = authority.rpartition("@")[2]  # userinfo stripped
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise Bad("host")
        host = parse_ipv6(hostport[1:end])
        rest = hostport[end + 1 :]
        if rest and not rest.startswith(":"):
            raise Bad("host")
        port_text = rest[1:]
    else:
        raw, _, port_text = hostport.partition(":")
        host = parse_host(raw)
    if port_text:
        if not port_text.isascii() or not port_text.isdigit():
            raise Bad("port")
        port = int(port_text)
        if not 0 < port <= 65535:
            raise Bad("port")
        if port != DEFAULT_PORTS[scheme]:
            return f"{host}:{port}"
    return host


def url_key(normalized_url: str) -> bytes:
    """The 16-byte MainDB / PendSet key: md5 of the UTF-8 normalized URL (what
    kvstore.md5_key gives; called directly, as this runs for every link found)."""
    return _md5(normalized_url.encode("utf-8")).digest()


def utf8_url_key(normalized_url: bytes) -> bytes:
    """:func:`url_key` of a normalized URL already in UTF-8 (as a PendDB bulk holds it)."""
    return _md5(normalized_url).digest()


def host_key(host: str) -> bytes:
    """The 16-byte Host2IP / BadHosts key: md5 of the lowercase host name, no port.

    DNS answers and politeness belong to the host name, whatever the port or
    scheme (robots.txt is per origin: see :func:`origin`). ``host`` is what
    :func:`host_of` returns (IPv6 literals with brackets).
    """
    return _md5(host.lower().encode("utf-8")).digest()  # kvstore.md5_key, without kvstore


def _split(url: str) -> tuple[str, str, int]:
    """(scheme, netloc, where the path starts) of a *normalized* URL: the one place
    that slices a URL's authority out (parse, origin, host_of)."""
    start = url.find("://")
    if start <= 0:
        raise URLError(url, "relative")
    end = url.find("/", start + 3)
    end = len(url) if end < 0 else end
    return url[:start], url[start + 3 : end], end


def _host_port(scheme: str, netloc: str) -> tuple[str, int | str]:
    """(host, port) of a netloc; the port a string if written (the caller converts it),
    else the scheme's default. IPv6 literals keep their brackets."""
    if netloc.endswith("]") or ":" not in netloc:
        return netloc, DEFAULT_PORTS.get(scheme, 0)
    host, _, port = netloc.rpartition(":")
    return host, port


def netloc_of(url: str) -> str:
    """``host[:port]`` of a *normalized* URL, as written in it."""
    return _split(url)[1]


def host_of_netloc(netloc: str) -> str:
    """The host of a ``host[:port]`` (an IPv6 literal keeps its brackets)."""
    return netloc if netloc.endswith("]") or ":" not in netloc else netloc.rpartition(":")[0]


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a *normalized* URL; the port is always filled in.

    The host is as written in the URL (IPv6 literals keep their brackets), so
    ``f"{scheme}://{host}:{port}"`` rebuilds a valid origin.
    """
    scheme, netloc, _ = _split(url)
    host, port = _host_port(scheme, netloc)
    return scheme, host, int(port)


def host_of(url: str) -> str:
    """The host of a *normalized* URL (lowercase ASCII; IPv6 literals with brackets)."""
    scheme, netloc, _ = _split(url)
    return _host_port(scheme, netloc)[0]


class URL(NamedTuple):
    """A normalized URL split once into the parts a fetch needs; made by :func:`parse`.

    The engine parses each claimed URL once and carries this object through
    politeness (``host``), BadHosts (``host_key``), the robots cache
    (``robots_key``, ``target``) and the fetcher (``origin``, ``netloc``,
    ``target``), so none of them splits the string again. Immutable; a
    NamedTuple because one is made per fetch and waits in the scheduler
    (about 100 bytes besides its strings). What is stored on disk is ``url``.
    """

    url: str  # the normalized string: what is hashed, stored, logged and reported
    scheme: str  # "http" or "https"
    host: str  # lowercase ASCII; an IPv6 literal keeps its brackets (what host_of gives)
    port: int  # always filled in: the URL's, else the scheme's default
    target: str  # path and query: the request target, and what robots.txt rules match
    host_key: bytes  # host_key(host), hashed once here: BadHosts' key

    @property
    def origin(self) -> tuple[str, str, int]:
        """(scheme, host, port): the connection pool's key, as :func:`origin` gives."""
        return self.scheme, self.host, self.port

    @property
    def netloc(self) -> str:
        """``host[:port]`` as in the URL (a default port left out): the Host header."""
        if self.port == DEFAULT_PORTS.get(self.scheme):
            return self.host
        return f"{self.host}:{self.port}"

    @property
    def robots_key(self) -> str:
        """``scheme://host:port``, the port always explicit: one robots.txt per origin."""
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def robots_url(self) -> str:
        """The URL of the origin's robots.txt (a default port left out)."""
        return f"{self.scheme}://{self.netloc}/robots.txt"


def parse(url: str) -> URL:
    """The parts of a *normalized* URL (what :func:`normalize` returns), by slicing.

    Nothing is checked that normalize already made true; a string with no
    ``scheme://`` raises URLError (reason ``relative``), a port that is not a
    number URLError (reason ``port``). Thread-safe.
    """
    scheme, netloc, end = _split(url)
    scheme = _SCHEMES.get(scheme, scheme)  # one shared string, not one per waiting URL
    target = url[end:] or "/"  # "/": not normalize's output, which always has a path
    host, port = _host_port(scheme, netloc)
    try:
        return URL(url, scheme, host, int(port), target, host_key(host))
    except ValueError:
        raise URLError(url, "port") from None
