"""Export a crawl as WARC (ISO 28500, written with warcio) and JSON lines, in one streaming pass.

Theory of operation
-------------------
:func:`export` reads the crawl through a
:class:`~crawler.read.listing.CrawlReader` (read-only: it works beside a
running crawl and exports the records flushed before it started) and hands
each page record to the sinks asked for, :class:`WarcSink` and
:class:`JsonlSink`. One record is in memory at a time.
Progress goes to a ``progress(done, total)`` callback (records read, damaged
ones included, of the records in the snapshot: it reaches ``total`` when the
pass is complete); showing it is the caller's business (crawler.cli.progress).
Each output is written under ``NAME.part`` and renamed when it is complete
(crawler.read._outfile), so a file under its final name is whole; every
file is logged as it is finished (its name, records or lines, bytes), and
the summary at the end. An export is
all or nothing: on an error (or Ctrl-C) every file it wrote is removed,
completed split files included (each removal logged), so no output of a
failed export can be taken for a whole one. Only JSON lines already written
to a stream (stdout) cannot be taken back.

WARC mapping (docs/EXPORT.md is the reference):

- every file opens with a ``warcinfo`` record, and every record names it in
  WARC-Warcinfo-ID;
- a page with an HTTP answer (any status, redirects included) gives a
  ``response`` record, or a ``revisit`` (identical-payload-digest profile)
  when a 200 payload repeats an earlier one, plus a ``request`` record
  rebuilt from what crawler.net.fetch sends; the request names the response in
  WARC-Concurrent-To, and both carry the fetch time and the IP;
- a page rendered in a browser (a record with a DOM) adds, after them, a
  ``conversion`` record of the rendered DOM that names the response (or
  revisit) written for the page in WARC-Refers-To;
- a page a recrawl found unchanged (a 304 to its conditional GET, the record
  says ``revisit: not_modified``) gives the response of the fetch whose body
  it kept (dated ``revisit_of``), then a request and a ``revisit`` record of
  the 304 (server-not-modified profile) that refers to it;
- a URL with no answer (status 0: DNS failure, refused, robots...) gives a
  ``metadata`` record with its outcome, or nothing with ``skip_failures``;
- the crawler stores bodies *decoded*, so Content-Encoding (and any
  Transfer-Encoding) is dropped and Content-Length rewritten to the stored
  length; original values stay visible as ``X-Crawler-Original-*`` headers;
  a body cut at a limit is ``WARC-Truncated: length``, a body the crawler did
  not keep (non-200, non-HTML, noindex) ``WARC-Truncated: unspecified``;
- ``max_size`` splits: the files are always numbered, ``OUT-00000.warc.gz``,
  ``OUT-00001.warc.gz``... (:func:`split_name`, as ``wget --warc-max-size``
  names them), even when one file results: the names depend on the options
  only, never on the crawl's size, and sort in order. Once a file reached the
  size the next page starts a new file; a request/response pair never spans
  two files.

Revisit detection keeps one entry per distinct payload in a temporary
kvstore (its 16-byte key in memory, the original's record id, date and URI
on disk): about 30 bytes of memory per distinct payload, never a body.

Thread safety: sinks and ``export`` are for one thread.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from io import BytesIO
from typing import IO, Any
from urllib.parse import urlsplit

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

import kvstore

from ..config import DEFAULT_USER_AGENT
from ..exceptions import ConfigError
from ..net.fetch import DEFAULT_ACCEPT
from ..state.pages import NOFOLLOW, PageRecord
from ..web.urls import url_key
from ._outfile import create, discard, drop, naming, publish
from .linkgraph import Resolver
from .listing import DEFAULT_MAX_TEXT_CHARS, CrawlReader, iso_time, visible_text
from .rankstore import Rank, RankStore

log = logging.getLogger(__name__)

WARC_VERSION = "WARC/1.1"  # 1.1: WARC-Date with microseconds
NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
SENT_ACCEPT_ENCODING = "gzip, deflate"  # what net.fetch.Fetcher asks for on every request
DOM_CONTENT_TYPE = "text/html; charset=utf-8"  # a rendered DOM, as the record stores it
_RESPONSE_ONLY = ("content-encoding", "transfer-encoding", "content-length")


@dataclass(slots=True)
class ExportStats:
    pages: int = 0  # page records read
    records: int = 0  # WARC records written (warcinfo included)
    revisits: int = 0
    failures: int = 0  # pages with no HTTP answer (status 0)
    warc_files: list[str] = field(default_factory=list)
    warc_bytes: int = 0
    jsonl_file: str | None = None  # None: no JSONL, or JSONL to a stream
    jsonl_lines: int = 0
    jsonl_bytes: int = 0
    skipped: int = 0  # damaged records skipped
    seconds: float = 0.0

    @property
    def files(self) -> list[str]:
        """Every file written, in order: the WARC file(s), then the JSONL file."""
        return self.warc_files + ([self.jsonl_file] if self.jsonl_file else [])

    def summary(self) -> str:
        out = (f"exported {self.pages} pages ({self.failures} with no HTTP answer) "
               f"in {self.seconds:.1f} s")
        if self.warc_files:
            out += (f"; WARC: {self.records} records ({self.revisits} revisits), "
                    f"{self.warc_bytes} bytes in {len(self.warc_files)} file(s)")
        if self.jsonl_lines:
            out += f"; JSONL: {self.jsonl_lines} lines, {self.jsonl_bytes} bytes"
        if self.skipped:
            out += f"; {self.skipped} damaged record(s) skipped"
        return out


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


def request_headers(url: str, user_agent: str) -> StatusAndHeaders:
    """The GET that net.fetch.Fetcher sends for ``url`` (a normalized URL)."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = [("Host", parts.netloc), ("User-Agent", user_agent), ("Accept", DEFAULT_ACCEPT),
               ("Accept-Encoding", SENT_ACCEPT_ENCODING)]
    return StatusAndHeaders(f"GET {target} HTTP/1.1", headers, is_http_request=True)


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


def page_object(page: PageRecord, *, text: bool = False,
                text_limit: int = DEFAULT_MAX_TEXT_CHARS) -> dict[str, Any]:
    """One JSONL object: the record's fields as stored, the fetch time in ISO 8601 UTC."""
    obj: dict[str, Any] = {
        "url": page.url, "final_url": page.final_url, "status": page.status,
        "reason": page.reason, "content_type": page.content_type,
        "fetched_at": iso_time(page.fetched_at), "ip": page.ip, "depth": page.depth,
        "outlinks": page.outlinks, "truncated": page.truncated, "noindex": page.noindex,
        "redirect": page.redirect, "size": len(page.body),
        "render": page.render, "dom_size": len(page.dom), "revisit": page.revisit,
    }
    if text:
        obj["text"] = visible_text(page, limit=text_limit)
    return obj


def graph_fields(page: PageRecord, resolver: Resolver | None) -> dict[str, Any]:
    """The JSONL fields of the link graph: the fetch time and every stored link, as
    ``{"url": ..., "nofollow": ...}`` (``{"key": HEX, ...}`` for a URL the crawl never
    recorded; keys only when there is no resolver)."""
    if resolver is not None:
        links = resolver.links(page)
    else:
        links = [{"key": k.hex(), "nofollow": bool(f & NOFOLLOW)} for k, f in page.link_list()]
    return {"elapsed": page.elapsed, "links": links}


def rank_fields(rank: Rank | None) -> dict[str, Any]:
    """The JSONL fields of a page's PageRank (None when the crawl has no rank for it)."""
    if rank is None:
        return {"rank": None, "rank_scaled": None}
    return {"rank": rank.raw, "rank_scaled": round(rank.scaled, 4)}


def split_name(path: str, n: int) -> str:
    """The name of split file ``n``: ``OUT.warc.gz`` -> ``OUT-00003.warc.gz``."""
    for ext in (".warc.gz", ".warc"):
        if path.endswith(ext):
            return f"{path[: -len(ext)]}-{n:05d}{ext}"
    return f"{path}-{n:05d}"


def _software() -> str:
    try:
        ours = importlib.metadata.version("kvcrawl")
    except importlib.metadata.PackageNotFoundError:
        ours = "unknown"
    return f"kvcrawl/{ours} warcio/{importlib.metadata.version('warcio')}"


# -- sinks ------------------------------------------------------------------------------------


class WarcSink:
    """Writes a crawl's pages to WARC file(s); see the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, user_agent: str = DEFAULT_USER_AGENT,
                 max_size: int | None = None, revisits: bool = True,
                 skip_failures: bool = False, info: dict[str, str] | None = None) -> None:
        if max_size is not None and max_size <= 0:
            raise ConfigError(f"max_size must be > 0, got {max_size}")
        self.path = os.fspath(path)
        self.user_agent, self.max_size, self.skip_failures = user_agent, max_size, skip_failures
        self.info = {"software": _software(), "format": "WARC File Format 1.1",
                     "conformsTo": "http://iipc.github.io/warc-specifications/specifications/"
                                   "warc-format/warc-1.1/",
                     "http-header-user-agent": user_agent, **(info or {})}
        self.files: list[str] = []  # completed files, in order
        self.bytes = self.records = self.revisits = 0
        self._last_id = ""  # WARC-Record-ID of the last response or revisit written
        self._file_records = 0  # records before the current file
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._seen: kvstore.Store | None = None
        self._out: IO[bytes] | None = None
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

    def _next_file(self) -> None:
        self._finish_file()
        self._name = self.path if self.max_size is None else split_name(self.path, len(self.files))
        self._out = create(self._name, "wb")
        self._writer.out = self._out
        info = self._writer.create_warcinfo_record(os.path.basename(self._name), self.info)
        self._info_id = info.rec_headers.get_header("WARC-Record-ID")
        with naming(self._name):
            self._writer.write_record(info)
        self.records += 1

    def _finish_file(self) -> None:
        if self._out is None:
            return
        out, self._out = self._out, None
        size = out.tell()
        publish(out, self._name)
        self.bytes += size
        self.files.append(self._name)
        log.info("export: wrote %s (%s records, %s bytes)", self._name,
                 f"{self.records - self._file_records:,}", f"{size:,}")
        self._file_records = self.records

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
            with naming(self._name):
                w.write_record(w.create_warc_record(
                    page.url, "metadata", payload=BytesIO(block), length=len(block),
                    warc_content_type="application/warc-fields", warc_headers_dict=base))
            self.records += 1
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
            self.revisits += 1
        else:
            headers = {**base, "WARC-Payload-Digest": digest}
            cut = truncation(page)
            if cut:
                headers["WARC-Truncated"] = cut
            resp = w.create_warc_record(page.url, "response", payload=BytesIO(page.body),
                                        length=len(page.body), http_headers=http,
                                        warc_headers_dict=headers)
            if dedup and self._seen is not None:
                rid = resp.rec_headers.get_header("WARC-Record-ID")
                self._seen[key] = f"{rid}\n{base['WARC-Date']}\n{page.url}".encode()
        req = w.create_warc_record(page.url, "request",
                                   http_headers=request_headers(page.url, self.user_agent),
                                   warc_headers_dict=dict(base))
        with naming(self._name):
            w.write_request_response_pair(req, resp)
        self.records += 2
        self._last_id = resp.rec_headers.get_header("WARC-Record-ID")
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
        with naming(self._name):
            w.write_record(conv)
        self.records += 1
        return 3

    def _write_not_modified(self, page: PageRecord) -> int:
        """A page a recrawl found unchanged (a 304): its stored body as the response of
        the fetch that got it (at ``revisit_of``), then a ``revisit`` record of the 304
        (WARC 1.1 §6.7.3, the server-not-modified profile) that refers to it."""
        n = self.write(replace(page, fetched_at=page.revisit_of, revisit="", revisit_of=0.0))
        w = self._writer
        headers = {"WARC-Date": iso_time(page.fetched_at), "WARC-Warcinfo-ID": self._info_id,
                   "WARC-Refers-To": self._last_id,
                   "WARC-Refers-To-Target-URI": page.url,
                   "WARC-Refers-To-Date": iso_time(page.revisit_of)}
        if page.ip:
            headers["WARC-IP-Address"] = page.ip
        kept = [(_name(k.lower()), v) for k, v in page.headers.items()
                if k.lower() in ("etag", "last-modified", "date", "server")]
        http = StatusAndHeaders("304 Not Modified", kept, protocol="HTTP/1.1")
        rev = w.create_warc_record(page.url, "revisit", http_headers=http,
                                   warc_headers_dict=headers)
        rev.rec_headers.add_header("WARC-Profile", NOT_MODIFIED_PROFILE)
        req = w.create_warc_record(page.url, "request",
                                   http_headers=request_headers(page.url, self.user_agent),
                                   warc_headers_dict={"WARC-Date": headers["WARC-Date"],
                                                      "WARC-Warcinfo-ID": self._info_id})
        with naming(self._name):
            w.write_request_response_pair(req, rev)
        self.records += 2
        self.revisits += 1
        return n + 2

    def close(self, *, complete: bool = True) -> None:
        """Finish (rename) the current file; with ``complete`` False, or when that
        fails, remove every file this sink wrote instead. Idempotent."""
        try:
            if complete:
                self._finish_file()
        except BaseException:
            complete = False
            raise
        finally:
            if not complete:
                if self._out is not None:
                    drop(self._out, self._name)
                    self._out = None
                discard(self.files)
            if self._seen is not None:
                self._seen.abandon()  # a scratch store: no fsync, no saved index
                self._seen = None
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None


class JsonlSink:
    """Writes one JSON object per page to a file (via ``.part``) or an open text stream."""

    def __init__(self, target: str | os.PathLike[str] | IO[str], *, text: bool = False,
                 text_limit: int = DEFAULT_MAX_TEXT_CHARS,
                 resolver: Resolver | None = None, ranks: RankStore | None = None) -> None:
        self.text, self.text_limit = text, text_limit
        self.resolver = resolver  # outlink keys -> URLs (graph_fields)
        self.ranks = ranks  # rank_fields; closed with the sink
        self.lines = self.bytes = 0
        self.path: str | None = None  # the file, once it is complete
        self._name: str | None = None
        self._out: IO[str] | None = None
        if isinstance(target, str | os.PathLike):
            self._name = os.fspath(target)
            try:
                self._out = create(self._name, "w")
            except BaseException:
                self.close(complete=False)
                raise
        else:
            self._out = target

    def write(self, page: PageRecord) -> None:
        if self._out is None:
            raise ValueError("the JSONL sink is closed")
        obj = page_object(page, text=self.text, text_limit=self.text_limit)
        obj.update(graph_fields(page, self.resolver))
        obj.update(rank_fields(self.ranks.get(url_key(page.url)) if self.ranks else None))
        line = json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
        if self._name is None:
            self._out.write(line)  # a stream: its errors (a closed pipe) as they are
        else:
            with naming(self._name):
                self._out.write(line)
        self.lines += 1
        self.bytes += len(line.encode("utf-8"))

    def close(self, *, complete: bool = True) -> None:
        """Finish (rename) the file; with ``complete`` False, or when that fails, remove
        it, even once complete. A stream is flushed, never closed. Idempotent."""
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None
        out, self._out = self._out, None
        if self._name is None:  # a stream we were given: the caller owns it
            if out is not None:
                out.flush()
                if complete:
                    log.info("export: wrote %s JSON lines (%s bytes) to the output stream",
                             f"{self.lines:,}", f"{self.bytes:,}")
            return
        if not complete:
            if out is not None:
                drop(out, self._name)
            if self.path is not None:
                discard([self.path])
                self.path = None
            return
        if out is not None:
            publish(out, self._name)
            self.path = self._name
            log.info("export: wrote %s (%s lines, %s bytes)", self._name, f"{self.lines:,}",
                     f"{self.bytes:,}")


# -- the pass -----------------------------------------------------------------------------------


def export(data_dir: str | os.PathLike[str], *, warc: str | os.PathLike[str] | None = None,
           jsonl: str | os.PathLike[str] | IO[str] | None = None, max_size: int | None = None,
           text: bool = False, text_limit: int = DEFAULT_MAX_TEXT_CHARS,
           user_agent: str = DEFAULT_USER_AGENT, revisits: bool = True,
           skip_failures: bool = False, strict: bool = False,
           progress: Callable[[int, int], None] | None = None) -> ExportStats:
    """Export the crawl in ``data_dir`` to ``warc`` and/or ``jsonl`` in one pass.

    ``user_agent`` goes into the rebuilt request records (the crawl does not
    record the one it used). ``strict``: a damaged record raises DataDirError
    instead of being skipped with a warning. ``progress(done, total)`` is called
    after every record read (and once at the end). All or nothing: on any error
    every file written is removed. Raises DataDirError, ConfigError or OSError
    (an output that cannot be written; ``filename`` names it).
    """
    if warc is None and jsonl is None:
        raise ConfigError("nothing to export: give a WARC and/or a JSONL output")
    stats = ExportStats()
    started = time.monotonic()
    with CrawlReader(data_dir, strict=strict) as reader:
        total = len(reader)
        name = os.path.basename(os.path.abspath(reader.data_dir))
        wsink: WarcSink | None = None
        jsink: JsonlSink | None = None
        try:
            if warc is not None:
                wsink = WarcSink(warc, user_agent=user_agent, max_size=max_size,
                                 revisits=revisits, skip_failures=skip_failures,
                                 info={"isPartOf": name, "description":
                                       f"crawl {name}: {total} page records at export time; "
                                       "bodies stored decoded (see X-Crawler-Original-*)"})
            if jsonl is not None:
                ranks = RankStore.open(reader.data_dir)
                jsink = JsonlSink(jsonl, text=text, text_limit=text_limit, ranks=ranks,
                                  resolver=Resolver(reader, table=ranks.url if ranks else None))
            for page in reader.pages():
                stats.pages += 1
                stats.failures += page.status <= 0
                if wsink is not None:
                    wsink.write(page)
                if jsink is not None:
                    jsink.write(page)
                if progress is not None:
                    progress(stats.pages + reader.skipped, total)
            if progress is not None:  # damaged records at the end are read too
                progress(stats.pages + reader.skipped, total)
            for sink in (wsink, jsink):
                if sink is not None:
                    sink.close()
        except BaseException:
            for sink in (wsink, jsink):
                if sink is not None:
                    sink.close(complete=False)
            raise
        stats.skipped = reader.skipped
    if wsink is not None:
        stats.records, stats.revisits = wsink.records, wsink.revisits
        stats.warc_files, stats.warc_bytes = list(wsink.files), wsink.bytes
    if jsink is not None:
        stats.jsonl_file = jsink.path
        stats.jsonl_lines, stats.jsonl_bytes = jsink.lines, jsink.bytes
    stats.seconds = time.monotonic() - started
    log.info("%s", stats.summary())
    return stats
