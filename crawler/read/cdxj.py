"""CDXJ index lines for WARC records, keyed the way replay tools look URLs up (pure).

A CDXJ line is ``SURT-KEY TIMESTAMP14 {json}`` (the pywb CDXJ format that
WACZ 1.1 names): the JSON has the capture's ``url``, ``mime``, ``status``
(response records only), ``digest`` (SHA-1, base32), and where the record
is: ``length`` and ``offset`` of its gzip member, and ``filename``. Only
``response`` and ``revisit`` records are indexed: they are what a replay
tool looks up (request, warcinfo, metadata and conversion records are not
captures of the URL as it was served).

The key is the URL in SURT form after the Internet Archive's canonicalization,
because that is what pywb (python ``surt``) and wabac.js compute from the URL
asked for and binary-search: a key that differs in one byte is a page that
does not replay. The rules, in order:

- scheme, userinfo and fragment dropped; the host percent-decoded, IDNA-encoded
  when not ASCII, ``..`` made ``.``, outer dots stripped; an IPv4 address in
  any inet_aton form (``2130706433``, ``0x7f.1``) written dotted-decimal;
  lowercased, then percent-encoded; a leading ``www``, ``www2``... label
  removed; the labels reversed and joined by commas; the port kept unless it
  is the scheme's default; ``)`` closes the host;
- the path percent-decoded until stable, dot segments resolved and empty
  segments dropped (a trailing ``/`` stays), percent-encoded again (bytes
  outside ``!``..``~``, and ``#`` and ``%``), lowercased, ASP.NET cookieless
  session segments removed, and a trailing ``/`` dropped unless the path is
  ``/``;
- the query percent-decoded and encoded the same way, session ids removed
  (``jsessionid``, ``phpsessid``, ``sid`` of 32 characters, ``ASPSESSIONID``,
  ``cfid``/``cftoken``), lowercased, its ``&``-separated arguments sorted;
  an empty query is dropped with its ``?``.

tests/crawler/test_wacz.py checks these keys against the ``surt`` package
(pywb's) on every URL of a crawl and on hand-picked and generated ones.
"""

from __future__ import annotations

import json
import re
import socket
from urllib.parse import SplitResultBytes, unquote_to_bytes

from warcio.recordloader import ArcWarcRecord

# RFC 3986 appendix B, with a scheme limited to scheme characters.
_URI = re.compile(rb"^(?:([a-zA-Z][a-zA-Z0-9+.-]*):)?(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?")
_REPEATED_SCHEME = re.compile(rb"^(https?://)+")  # http://https://x -> https://x
_HAS_SCHEME = re.compile(rb"^[a-zA-Z][a-zA-Z0-9+\-.]*:")
_WWW = re.compile(rb"www\d*\.")
# Dotted numbers read as an IPv4 address: decimal, or octal when the first starts with 0.
_NUMERIC_HOSTS = (re.compile(rb"^[1-9][0-9]*(?:\.[0-9]+){0,3}$"),
                  re.compile(rb"^0[0-7]*(?:\.[0-7]+){0,3}$"))
_DEFAULT_PORTS = {b"http": 80, b"https": 443}
# Bytes kept as they are when percent-encoding: printable ASCII but '#' and '%'.
_KEPT = frozenset(range(0x21, 0x7F)) - {ord("#"), ord("%")}
_ESCAPES = [chr(b) if b in _KEPT else f"%{b:02X}" for b in range(256)]

# Session ids: ASP.NET cookieless sessions in the path (``/(S(24 chars))/x.aspx``,
# ``/(24 chars)/x.aspx``) and well-known query parameters. Each pattern keeps the
# text before (group 1) and after (group 2) the id.
_PATH_SESSIONS = (
    re.compile(rb"^(.*/)\((?:[a-z]\([0-9a-z]{24}\))+\)/([^?]+\.aspx.*)$", re.I),
    re.compile(rb"^(.*/)\([0-9a-z]{24}\)/([^?]+\.aspx.*)$", re.I),
)
_QUERY_SESSIONS = tuple(re.compile(rb"^(.*)(?:" + ident + rb")(?:&(.*))?$", re.I) for ident in (
    rb"jsessionid=[0-9a-zA-Z]{32}", rb"phpsessid=[0-9a-zA-Z]{32}", rb"sid=[0-9a-zA-Z]{32}",
    rb"ASPSESSIONID[a-zA-Z]{8}=[a-zA-Z]{24}", rb"cfid=[^&]+&cftoken=[^&]+"))


def _decode(data: bytes) -> bytes:
    """Percent-decode until nothing changes (``%2541`` -> ``%41`` -> ``A``)."""
    while True:
        decoded = unquote_to_bytes(data)
        if decoded == data:
            return data
        data = decoded


def _encode(data: bytes) -> bytes:
    return "".join(_ESCAPES[b] for b in data).encode("ascii")


def _ipv4(host: bytes) -> bytes | None:
    """The dotted-decimal form of a numeric host, else None."""
    if host.isdigit():
        return socket.inet_ntoa((int(host) & 0xFFFFFFFF).to_bytes(4, "big")).encode()
    if any(p.match(host) for p in _NUMERIC_HOSTS):
        try:
            return socket.inet_ntoa(socket.inet_aton(host.decode("ascii"))).encode()
        except OSError:
            return None
    return None


def _host(raw: bytes) -> bytes:
    host = _decode(raw)
    if not host.isascii():
        try:
            host = host.decode("utf-8", "ignore").encode("idna")
        except UnicodeError:
            pass
    host = host.replace(b"..", b".").strip(b".")
    host = _ipv4(host) or _encode(host.lower())
    www = _WWW.match(host)
    return host[www.end():] if www else host


def _path(raw: bytes) -> bytes:
    kept: list[bytes] = []
    for segment in _decode(raw).split(b"/")[1:]:
        if segment == b".":
            continue
        if segment == b".." and kept:
            kept.pop()
        else:
            kept.append(segment)
    # Empty segments are dropped, but the last one: a trailing '/' stays.
    path = b"/" + b"".join(s + b"/" for s in kept[:-1] if s) + (kept[-1] if kept else b"")
    path = _encode(path).lower()
    for pattern in _PATH_SESSIONS:
        m = pattern.match(path)
        if m:
            path = m.group(1) + m.group(2)
    return path[:-1] if len(path) > 1 and path.endswith(b"/") else path


def _query(raw: bytes) -> bytes:
    query = _encode(_decode(raw))
    for pattern in _QUERY_SESSIONS:
        m = pattern.match(query)
        if m:
            query = m.group(1) + (m.group(2) or b"")
    if not query:
        return b""
    args = sorted(tuple(arg.split(b"=", 1)) for arg in query.lower().split(b"&"))
    return b"&".join(b"=".join(arg) for arg in args)


def surt_key(url: str) -> str:
    """The SURT key of ``url`` (see the module docstring): ``com,example)/a?b=c``."""
    raw = re.sub(rb"[\t\r\n]", b"", url.encode("utf-8").strip())
    if not _HAS_SCHEME.match(raw):
        raw = b"http://" + raw
    raw = _REPEATED_SCHEME.sub(lambda m: m.group(1), raw)  # a repeated group: its last
    m = _URI.match(raw)
    assert m is not None  # every group is optional
    scheme, netloc, path, query = (g or b"" for g in m.groups())
    netloc = netloc.rstrip(b":")
    parts = SplitResultBytes(scheme, netloc, path, query, b"")
    host, port = parts.hostname or b"", parts.port
    if not host and path and scheme.lower().startswith(b"http"):  # http:////host/path
        host, _, rest = path.lstrip(b"/").partition(b"/")
        path = b"/" + rest
    if not host:
        return url
    key = b",".join(reversed(_host(host).split(b".")))
    if port is not None and port != _DEFAULT_PORTS.get(scheme.lower()):
        key += b":%d" % port
    key += b")" + _path(path)
    if query:
        query = _query(query)
        if query:
            key += b"?" + query
    return key.decode("ascii")


def _timestamp(warc_date: str) -> str:
    """``2024-05-01T12:00:00.123456Z`` -> ``20240501120000`` (CDX timestamps are seconds)."""
    return "".join(ch for ch in warc_date if ch.isdigit())[:14]


def cdxj_line(record: ArcWarcRecord, offset: int, length: int, filename: str) -> bytes | None:
    """The CDXJ line of a record written at ``offset`` (``length`` bytes) of
    ``filename``, or None for a record that is not indexed."""
    if record.rec_type not in ("response", "revisit"):
        return None
    headers = record.rec_headers
    url = headers.get_header("WARC-Target-URI")
    entry: dict[str, str] = {"url": url}
    if record.rec_type == "revisit":
        entry["mime"] = "warc/revisit"
    else:
        ctype = record.http_headers.get_header("Content-Type") if record.http_headers else None
        entry["mime"] = re.split(r"[; ]", ctype, maxsplit=1)[0] if ctype else "unk"
        if record.http_headers is not None:
            entry["status"] = record.http_headers.get_statuscode()
    digest = headers.get_header("WARC-Payload-Digest") or ""
    if digest:
        entry["digest"] = digest.removeprefix("sha1:")
    entry.update(length=str(length), offset=str(offset), filename=filename)
    key = surt_key(url)
    return f"{key} {_timestamp(headers.get_header('WARC-Date'))} {json.dumps(entry)}".encode()
