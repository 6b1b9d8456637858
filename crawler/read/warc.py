"""A crawl's pages as WARC records (ISO 28500, WARC 1.1), written with warcio.

Theory of operation
-------------------
:class:`WarcSink` takes one page record at a time and writes its records
(docs/EXPORT.md is the reference):

- every file opens with a ``warcinfo`` record, and every record names it in
  WARC-Warcinfo-ID;
- a page with an HTTP answer (any status, redirects included) gives a
  ``response`` record, or a ``revisit`` (identical-payload-digest profile)
  when a 200 payload repeats an earlier one, plus a ``request`` record
  rebuilt from what crawler.net.fetch sends (but the Cookie header: the page
  record keeps no request header, and the jar has changed since); the request
  names the response in WARC-Concurrent-To, and both carry the fetch time and
  the IP; the response's Set-Cookie lines are one header each, as sent;
- a page rendered in a browser (a record with a DOM) adds, after them, a
  ``conversion`` record of the rendered DOM that names the response (or
  revisit) written for the page in WARC-Refers-To;
- a page a recrawl found unchanged (a 304 to its conditional GET, the record
  says ``revisit: not_modified``) gives the records of the fetch whose body it
  kept (dated ``revisit_of``), then the conditional request and a ``revisit``
  of the 304 (server-not-modified profile). That revisit refers to the
  ``response`` record that holds the body (never to another revisit), carries
  the body's WARC-Payload-Digest, and as block the stored response as the 304
  freshened it (RFC 9111 §4.3.4), status 200, with
  ``X-Crawler-Original-Status: 304``: replay tools (pywb) replay a revisit
  whose own status is 3xx as an empty redirect without loading the body it
  refers to, so the 304 status line cannot be the block's; the header says
  what the server answered;
- a URL with no answer (status 0: DNS failure, refused, robots...) gives a
  ``metadata`` record with its outcome, or nothing with ``skip_failures``;
- the crawler stores bodies *decoded*, so Content-Encoding (and any
  Transfer-Encoding) is dropped and Content-Length rewritten to the stored
  length; original values stay visible as ``X-Crawler-Original-*`` headers;
  a body cut at a limit is ``WARC-Truncated: length``, a body the crawler did
  not keep (non-200, non-HTML, noindex) ``WARC-Truncated: unspecified``;
- ``max_size`` splits: the files are always numbered, ``OUT-00000.warc.gz``,
  ``OUT-00001.warc.gz``... (:func:`split_name`, as ``wget --warc-max-size``
  names them), even when one file results. Once a file reached the size the
  next page starts a new file; a request/response pair never spans two files.

Files are written as ``NAME.part`` and renamed when complete
(crawler.read._outfile); given a ``stream`` instead (a WACZ's zip entry), the
sink writes there and the caller owns it. ``on_record(record, offset,
length)`` is told where each record landed (a CDXJ index is built from it).

Revisit detection keeps one entry per distinct payload in a temporary
kvstore (its 16-byte key in memory, the original's record id, date and URI
on disk): about 30 bytes of memory per distinct payload, never a body.

Thread safety: for one thread.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from http import HTTPStatus
from io import BytesIO
from typing import IO, Protocol
from urllib.parse import urlsplit

from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

import kvstore

from ..config import DEFAULT_USER_AGENT
from ..exceptions import ConfigError
from ..net.decoding import ACCEPT_ENCODING
from ..net.fetch import DEFAULT_ACCEPT
from ..state.pages import PageRecord
from ._outfile import Outputs, naming
from .listing import iso_time

log = logging.getLogger(__name__)

WARC_VERSION = "WARC/1.1"  # 1.1: WARC-Date with microseconds
NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
# What net.fetch.Fetcher asks for on every request: the codings this installation can
# decode (the page record does not keep the request's headers). With the packages
# setup.cfg requires, that is every coding named in net.decoding.
SENT_ACCEPT_ENCODING = ACCEPT_ENCODING
DOM_CONTENT_TYPE = "text/html; charset=utf-8"  # a rendered DOM, as the record stores it
_RESPONSE_ONLY = ("content-encoding", "transfer-encoding", "content-length")

# Where a record landed: (record, offset, length) in the current file.
RecordHook = Callable[[ArcWarcRecord, int, int], None]


class Output(Protocol):
    """What the sink writes to: a file, or a caller's stream that counts what it got."""

    def write(self, data: bytes, /) -> int: ...

    def tell(self) -> int: ...

    def flush(self) -> None: ...


# -- pure: what goes into the records -------------------------------------------------------


def _name(header: str) -> str:
    return "-".join(part.capitalize() for part in header.split("-"))


def payload_digest(body: bytes) -> tuple[bytes, str]:
    """(raw SHA-1, ``sha1:BASE32``) of a payload, the form warcio writes and checks."""
    raw = hashlib.sha1(body).digest()
    return raw, "sha1:" + base64.b32encode(raw).decode("ascii")


def response_headers(page: PageRecord) -> StatusAndHeaders:
    """The status line and stored headers, made consistent with the stored (decoded) body."""
    headers: list[tuple[str, str]] = []
    original: dict[str, str] = {}
    for name, value in page.headers.items():
        if name.lower() in _RESPONSE_ONLY:
            original[name.lower()] = value
        elif name.lower() == "set-cookie":  # one header a line, as sent (crawler.net.fetch)
            headers.extend(("Set-Cookie", line) for line in value.split("\n"))
        else:
            headers.append((_name(name.lower()), value))
    headers.append(("Content-Length", str(len(page.body))))
    for name in _RESPONSE_ONLY:
        kept = original.get(name)
        if kept is not None and not (name == "content-length" and kept == str(len(page.body))):
            headers.append(("X-Crawler-Original-" + _name(name), kept))
    if page.reason:
        headers.append(("X-Crawler-Reason", page.reason))
    try:
        phrase = HTTPStatus(page.status).phrase
    except ValueError:
        phrase = "Unknown"
    return StatusAndHeaders(f"{page.status} {phrase}", headers, protocol="HTTP/1.1")


def request_headers(url: str, user_agent: str,
                    conditional: tuple[tuple[str, str], ...] = (),
                    cookie: str = "") -> StatusAndHeaders:
    """The GET that net.fetch.Fetcher sends for ``url`` (a normalized URL), with the
    ``conditional`` headers of a revisit (If-None-Match, If-Modified-Since) and the
    ``cookie`` the page was sent."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = [("Host", parts.netloc), ("User-Agent", user_agent), ("Accept", DEFAULT_ACCEPT),
               ("Accept-Encoding", SENT_ACCEPT_ENCODING), *conditional]
    if cookie:
        headers.append(("Cookie", cookie))
    return StatusAndHeaders(f"GET {target} HTTP/1.1", headers, is_http_request=True)


def validators(page: PageRecord) -> tuple[tuple[str, str], ...]:
    """The conditional headers of a recrawl's GET, rebuilt from the validators the
    record holds (crawler.run.revisit sends the prior record's ETag and Last-Modified;
    a 304 may have updated them, and to If-None-Match it means they matched)."""
    sent = []
    for name, header in (("etag", "If-None-Match"), ("last-modified", "If-Modified-Since")):
        value = page.headers.get(name, "")
        if value:
            sent.append((header, value))
    return tuple(sent)


def truncation(page: PageRecord) -> str | None:
    """WARC-Truncated for a page: cut at a size limit, or a body that was not kept."""
    if page.truncated:
        return "length"
    if not page.body and page.headers.get("content-length", "").strip() != "0":
        return "unspecified"
    return None


def failure_fields(page: PageRecord) -> bytes:
    """The application/warc-fields block of a URL that got no HTTP answer."""
    fields = [("outcome", page.reason or "no_response"), ("depth", str(page.depth))]
    return "".join(f"{k}: {v}\r\n" for k, v in fields).encode("utf-8")


def split_name(path: str, n: int) -> str:
    """The name of split file ``n``: ``OUT.warc.gz`` -> ``OUT-00003.warc.gz``."""
    for ext in (".warc.gz", ".warc"):
        if path.endswith(ext):
            return f"{path[: -len(ext)]}-{n:05d}{ext}"
    return f"{path}-{n:05d}"


def software() -> str:
    try:
        ours = importlib.metadata.version("kvcrawl")
    except importlib.metadata.PackageNotFoundError:
        ours = "unknown"
    return f"kvcrawl/{ours} warcio/{importlib.metadata.version('warcio')}"


# -- the sink ---------------------------------------------------------------------------------


class WarcSink:
    """Writes a crawl's pages to WARC file(s); see the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, user_agent: str = DEFAULT_USER_AGENT,
                 max_size: int | None = None, revisits: bool = True,
                 skip_failures: bool = False, info: dict[str, str] | None = None,
                 stream: Output | None = None, label: str | None = None,
                 on_record: RecordHook | None = None, outputs: Outputs | None = None) -> None:
        """``stream``: write there (it must have ``tell``) instead of a file named
        ``path``, which then only names the WARC in its warcinfo; ``label`` names the
        output in errors (default: ``path``). ``outputs``: the ledger of the files made,
        shared by an export's sinks (given up together); by default the sink's own."""
        if max_size is not None and max_size <= 0:
            raise ConfigError(f"max_size must be > 0, got {max_size}")
        if stream is not None and max_size is not None:
            raise ConfigError("a WARC written to a stream is not split")
        self.path = os.fspath(path)
        self.user_agent, self.max_size, self.skip_failures = user_agent, max_size, skip_failures
        self.info = {"software": software(), "format": "WARC File Format 1.1",
                     "conformsTo": "http://iipc.github.io/warc-specifications/specifications/"
                                   "warc-format/warc-1.1/",
                     "http-header-user-agent": user_agent, **(info or {})}
        self.files: list[str] = []  # completed files, in order (none for a stream)
        self.bytes = self.records = self.revisits = 0
        self._stream, self._label, self._on_record = stream, label, on_record
        self._outputs = outputs if outputs is not None else Outputs()
        # (record id, date, URI) of the response record that holds the body of the
        # page last written: the response itself, or the one its revisit refers to.
        self._holder = ("", "", "")
        self._file_records = 0  # records before the current file
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._seen: kvstore.Store | None = None
        self._out: Output | None = None  # the file or the stream
        self._file: IO[bytes] | None = None  # the current file (NAME.part), if not a stream
        self._name = ""
        self._writer = WARCWriter(None, gzip=self.path.endswith(".gz"), warc_version=WARC_VERSION)
        self._info_id = ""
        try:
            self._next_file()  # first: a path that cannot be written fails before the rest
            if revisits:
                self._tmp = tempfile.TemporaryDirectory(prefix="kvcrawl-export-")
                self._seen = kvstore.open(os.path.join(self._tmp.name, "digests"))
        except BaseException:
            self.close(complete=False)
            raise

    @property
    def _error_name(self) -> str:
        return self._label or self._name

    def _next_file(self) -> None:
        self._finish_file()
        self._name = self.path if self.max_size is None else split_name(self.path, len(self.files))
        if self._stream is None:
            self._file = self._outputs.create(self._name, "wb")
        self._out = self._stream or self._file
        self._writer.out = self._out
        info = self._writer.create_warcinfo_record(os.path.basename(self._name), self.info)
        self._info_id = info.rec_headers.get_header("WARC-Record-ID")
        self._emit(info)

    def _finish_file(self) -> None:
        if self._out is None:
            return
        size = self._out.tell()
        self._out = None
        file, self._file = self._file, None
        if file is None:  # the caller's stream: it closes and names it
            self.bytes += size
            return
        self._outputs.publish(file, self._name)
        self.bytes += size
        self.files.append(self._name)
        log.info("export: wrote %s (%s records, %s bytes)", self._name,
                 f"{self.records - self._file_records:,}", f"{size:,}")
        self._file_records = self.records

    def _emit(self, record: ArcWarcRecord) -> None:
        """Write one record and tell ``on_record`` where it landed."""
        assert self._out is not None
        start = self._out.tell()
        with naming(self._error_name):
            self._writer.write_record(record)
        self.records += 1
        if self._on_record is not None:
            self._on_record(record, start, self._out.tell() - start)

    def _emit_pair(self, req: ArcWarcRecord, resp: ArcWarcRecord) -> None:
        """A response (or revisit) and the request that got it, in that order (as
        warcio's write_request_response_pair writes them)."""
        req.rec_headers.add_header("WARC-Concurrent-To",
                                   resp.rec_headers.get_header("WARC-Record-ID"))
        self._emit(resp)
        self._emit(req)

    def write(self, page: PageRecord) -> int:
        """Write one page's records; returns how many were written."""
        if self._out is None:
            raise ValueError("the WARC sink is closed")
        if page.revisit == "not_modified" and page.status == 200:
            return self._write_not_modified(page)
        if self.max_size is not None and self._out.tell() >= self.max_size:
            self._next_file()
        w = self._writer
        base = {"WARC-Date": iso_time(page.fetched_at), "WARC-Warcinfo-ID": self._info_id}
        if page.status <= 0:
            if self.skip_failures:
                return 0
            block = failure_fields(page)
            self._emit(w.create_warc_record(
                page.url, "metadata", payload=BytesIO(block), length=len(block),
                warc_content_type="application/warc-fields", warc_headers_dict=base))
            return 1
        if page.ip:
            base["WARC-IP-Address"] = page.ip
        http = response_headers(page)
        raw, digest = payload_digest(page.body)
        dedup = self._seen is not None and page.status == 200 and page.body and not page.truncated
        key = raw[:16]
        if dedup and self._seen is not None and key in self._seen:
            rid, date, uri = self._seen[key].decode("utf-8").split("\n", 2)
            resp = w.create_revisit_record(page.url, digest, uri, date, http_headers=http,
                                           warc_headers_dict={**base, "WARC-Refers-To": rid})
            self._holder = (rid, date, uri)
            self.revisits += 1
        else:
            headers = {**base, "WARC-Payload-Digest": digest}
            cut = truncation(page)
            if cut:
                headers["WARC-Truncated"] = cut
            resp = w.create_warc_record(page.url, "response", payload=BytesIO(page.body),
                                        length=len(page.body), http_headers=http,
                                        warc_headers_dict=headers)
            rid = resp.rec_headers.get_header("WARC-Record-ID")
            self._holder = (rid, base["WARC-Date"], page.url)
            if dedup and self._seen is not None:
                self._seen[key] = f"{rid}\n{base['WARC-Date']}\n{page.url}".encode()
        req = w.create_warc_record(page.url, "request",
                                   http_headers=request_headers(page.url, self.user_agent,
                                                                cookie=page.cookie),
                                   warc_headers_dict=dict(base))
        # WARC-Protocol (as Common Crawl writes it: one header each, "h2", "tls/1.3"); the
        # HTTP block keeps an HTTP/1.1-style status line, whatever the protocol was
        for proto in page.protocol.split():
            resp.rec_headers.add_header("WARC-Protocol", proto)
            req.rec_headers.add_header("WARC-Protocol", proto)
        self._emit_pair(req, resp)
        if not page.dom:  # not rendered, or the render was cut: nothing to convert
            return 2
        # WARC 1.1 §6.7: the DOM is a transformation of this fetch's payload, so it
        # refers to the record written for this page (a revisit's own id, not the
        # original's). warcio adds the digests; the block is the DOM, no HTTP headers.
        conv = w.create_warc_record(
            page.url, "conversion", payload=BytesIO(page.dom), length=len(page.dom),
            warc_content_type=DOM_CONTENT_TYPE,
            warc_headers_dict={"WARC-Date": base["WARC-Date"],
                               "WARC-Warcinfo-ID": self._info_id,
                               "WARC-Refers-To": resp.rec_headers.get_header("WARC-Record-ID")})
        self._emit(conv)
        return 3

    def _write_not_modified(self, page: PageRecord) -> int:
        """A page a recrawl found unchanged (a 304): the records of the fetch whose
        body it kept (at ``revisit_of``), then the conditional request and a
        ``revisit`` of the 304 (WARC 1.1 §6.7.3, server-not-modified) that refers to
        the response holding that body; see the module docstring for its block."""
        # The record keeps the 304's Date (a 304 updates Date, ETag, Last-Modified):
        # it is not the earlier response's, so that response is written without one.
        earlier = {k: v for k, v in page.headers.items() if k.lower() != "date"}
        n = self.write(replace(page, fetched_at=page.revisit_of, revisit="", revisit_of=0.0,
                               headers=earlier))
        w = self._writer
        rid, date, uri = self._holder
        # No WARC-IP-Address: the record keeps the earlier fetch's address, not the 304's.
        base = {"WARC-Date": iso_time(page.fetched_at), "WARC-Warcinfo-ID": self._info_id}
        http = response_headers(page)
        http.headers.append(("X-Crawler-Original-Status", "304"))
        rev = w.create_warc_record(page.url, "revisit", http_headers=http, warc_headers_dict={
            **base, "WARC-Profile": NOT_MODIFIED_PROFILE, "WARC-Refers-To": rid,
            "WARC-Refers-To-Target-URI": uri, "WARC-Refers-To-Date": date,
            "WARC-Payload-Digest": payload_digest(page.body)[1]})
        req = w.create_warc_record(
            page.url, "request", warc_headers_dict=dict(base),
            http_headers=request_headers(page.url, self.user_agent, validators(page),
                                         page.cookie))
        self._emit_pair(req, rev)
        self.revisits += 1
        return n + 2

    def close(self, *, complete: bool = True) -> None:
        """Finish (rename) the current file; with ``complete`` False, or when that
        fails, remove every file this sink wrote instead. Idempotent. A stream is
        left to its owner."""
        try:
            if complete:
                self._finish_file()
        except BaseException:
            complete = False
            raise
        finally:
            if not complete:
                file, self._out, self._file = self._file, None, None
                self._outputs.discard(file)  # every file, even one made but not yet kept here
                self.files.clear()
            if self._seen is not None:
                self._seen.abandon()  # a scratch store: no fsync, no saved index
                self._seen = None
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
