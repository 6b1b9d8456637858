"""A crawl as a WACZ 1.1.1 package (Web Archive Collection Zipped), written by streaming.

Theory of operation
-------------------
A WACZ is a ZIP that replay tools (pywb, ReplayWeb.page) open directly:

- ``archive/data.warc.gz``: the crawl's WARC records, as
  :class:`~crawler.read.warc.WarcSink` writes them, streamed into the ZIP entry
  as they are made (stored, not deflated: the records are gzip members a
  reader seeks into);
- ``indexes/index.cdx``: a CDXJ line for each response and revisit record
  (crawler.read.cdxj), with the offset and length the record got in the
  entry, sorted by bytes in bounded memory (crawler.read._linesort);
- ``pages/pages.jsonl``: the pages to browse: a header line, then each
  200 answer of an HTML type (``id``: the crawler's key of the URL, ``url``,
  ``ts``: the fetch time, RFC 3339);
- ``datapackage.json``: a Frictionless data package listing every file with
  its ``sha256`` digest and size, ``wacz_version``, title, description,
  creation time, the software, and the main page (the first seed by URL
  order); ``datapackage-digest.json``: the digest of ``datapackage.json``.

Only one ZIP entry can be written at a time, so index lines and page lines
wait in a temporary directory until the WARC entry is complete. Memory holds
one page record, the sort buffer and the revisit detection's keys, whatever
the crawl's size. The ZIP is written as ``NAME.part`` and renamed when
complete; on failure it is removed (crawler.read._outfile).

Thread safety: for one thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
import zipfile
from collections.abc import Iterable
from typing import IO, Any

from warcio.recordloader import ArcWarcRecord

from ..config import DEFAULT_USER_AGENT
from ..state.pages import PageRecord
from ..web.urls import url_key
from ._linesort import LineSorter
from ._outfile import Outputs, naming
from .cdxj import cdxj_line
from .listing import iso_time
from .warc import WarcSink, software

log = logging.getLogger(__name__)

WACZ_VERSION = "1.1.1"
WARC_NAME = "data.warc.gz"
WARC_PATH = f"archive/{WARC_NAME}"
INDEX_PATH = "indexes/index.cdx"  # CDXJ; the .cdx name is the one pywb's wb-manager reads
PAGES_PATH = "pages/pages.jsonl"
PAGES_HEADER = {"format": "json-pages-1.0", "id": "pages", "title": "All Pages"}
_CHUNK = 1 << 20  # bytes gathered before a write into a deflated entry


class _Counted:
    """A write-only stream that counts and hashes (SHA-256) what passes through."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.size, self._sha = out, 0, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self._sha.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.out.flush()

    @property
    def digest(self) -> str:
        return "sha256:" + self._sha.hexdigest()


def is_page(page: PageRecord) -> bool:
    """A page a reader browses to (listed in pages.jsonl): a 200 answer of an HTML type."""
    return page.status == 200 and "html" in page.content_type.lower()


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class WaczSink:
    """Writes a crawl's pages to one WACZ file; see the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, user_agent: str = DEFAULT_USER_AGENT,
                 revisits: bool = True, skip_failures: bool = False,
                 info: dict[str, str] | None = None, title: str = "crawl",
                 outputs: Outputs | None = None) -> None:
        """``outputs``: the ledger of the files made (see WarcSink)."""
        self.path = os.fspath(path)
        self.title = title
        self.description = (info or {}).get("description", "")
        self.file: str | None = None  # the path, once complete
        self.bytes = self.pages = 0
        self._started = time.time()
        self._main: tuple[str, float] | None = None  # (URL, fetch time) of the main page
        self._out: IO[bytes] | None = None
        self._zip: zipfile.ZipFile | None = None
        self._entry: IO[bytes] | None = None  # the open WARC entry
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._page_lines: IO[bytes] | None = None
        self.warc: WarcSink | None = None
        self._outputs = outputs if outputs is not None else Outputs()
        try:
            self._out = self._outputs.create(self.path, "wb")
            self._zip = zipfile.ZipFile(self._out, "w", allowZip64=True)
            self._tmp = tempfile.TemporaryDirectory(prefix="kvcrawl-wacz-")
            self._index = LineSorter(self._tmp.name)
            pages = os.path.join(self._tmp.name, "pages.jsonl")
            self._page_lines = open(pages, "w+b")  # noqa: SIM115 - closed in close()
            with naming(self.path):
                self._entry = self._zip.open(self._member(WARC_PATH, zipfile.ZIP_STORED), "w",
                                             force_zip64=True)
            self._warc_out = _Counted(self._entry)
            self.warc = WarcSink(WARC_NAME, user_agent=user_agent, revisits=revisits,
                                 skip_failures=skip_failures, info=info, stream=self._warc_out,
                                 label=self.path, on_record=self._indexed)
        except BaseException:
            self.close(complete=False)
            raise

    @property
    def records(self) -> int:
        """WARC records written (warcinfo included)."""
        return self.warc.records if self.warc is not None else 0

    @property
    def revisits(self) -> int:
        return self.warc.revisits if self.warc is not None else 0

    def _member(self, name: str, compression: int) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, time.localtime(self._started)[:6])
        info.compress_type = compression
        return info

    def _indexed(self, record: ArcWarcRecord, offset: int, length: int) -> None:
        line = cdxj_line(record, offset, length, WARC_NAME)
        if line is not None:
            self._index.add(line + b"\n")

    def write(self, page: PageRecord) -> int:
        """Write one page's records (and its pages.jsonl line); returns the records."""
        if self.warc is None or self._page_lines is None:
            raise ValueError("the WACZ sink is closed")
        n = self.warc.write(page)
        if is_page(page):
            line = {"id": url_key(page.url).hex(), "url": page.url,
                    "ts": iso_time(page.fetched_at)}
            self._page_lines.write(json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n")
            self.pages += 1
            if page.depth == 0 and (self._main is None or page.url < self._main[0]):
                self._main = (page.url, page.fetched_at)
        return n

    def _write_member(self, name: str, chunks: Iterable[bytes]) -> dict[str, Any]:
        """A deflated ZIP entry from ``chunks``; its datapackage resource."""
        assert self._zip is not None
        with naming(self.path), self._zip.open(self._member(name, zipfile.ZIP_DEFLATED), "w",
                                               force_zip64=True) as raw:
            out = _Counted(raw)
            pending: list[bytes] = []
            held = 0
            for chunk in chunks:
                pending.append(chunk)
                held += len(chunk)
                if held >= _CHUNK:
                    out.write(b"".join(pending))
                    pending, held = [], 0
            out.write(b"".join(pending))
        return _resource(name, out)

    def _page_chunks(self) -> Iterable[bytes]:
        assert self._page_lines is not None
        yield json.dumps(PAGES_HEADER).encode() + b"\n"
        self._page_lines.seek(0)
        while chunk := self._page_lines.read(_CHUNK):
            yield chunk

    def _package(self, resources: list[dict[str, Any]]) -> dict[str, Any]:
        package: dict[str, Any] = {
            "profile": "data-package", "wacz_version": WACZ_VERSION, "title": self.title,
            "description": self.description, "created": _rfc3339(self._started),
            "modified": _rfc3339(self._started), "software": software()}
        if self._main is not None:
            package["mainPageUrl"] = self._main[0]
            package["mainPageDate"] = iso_time(self._main[1])
        package["resources"] = resources
        return package

    def _finish(self) -> None:
        assert self.warc is not None and self._entry is not None and self._zip is not None
        self.warc.close()
        with naming(self.path):
            self._entry.close()
        resources = [_resource(WARC_PATH, self._warc_out),
                     self._write_member(INDEX_PATH, self._index.sorted()),
                     self._write_member(PAGES_PATH, self._page_chunks())]
        package = json.dumps(self._package(resources), indent=2).encode("utf-8") + b"\n"
        digest = {"path": "datapackage.json",
                  "hash": "sha256:" + hashlib.sha256(package).hexdigest()}
        self._write_member("datapackage.json", [package])
        self._write_member("datapackage-digest.json", [json.dumps(digest).encode("utf-8")])
        with naming(self.path):
            self._zip.close()
        assert self._out is not None
        out, self._out = self._out, None
        size = out.tell()
        self._outputs.publish(out, self.path)
        self.file, self.bytes = self.path, size
        log.info("export: wrote %s (%s records, %s bytes)", self.path,
                 f"{self.warc.records:,}", f"{size:,}")

    def close(self, *, complete: bool = True) -> None:
        """Finish the package and rename it; with ``complete`` False, or when that
        fails, remove it instead. Idempotent."""
        try:
            if complete and self._out is not None:
                self._finish()
        except BaseException:
            complete = False
            raise
        finally:
            if not complete:
                self._abandon()
            if self._page_lines is not None:
                self._page_lines.close()
                self._page_lines = None
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    def _abandon(self) -> None:
        """Give the package up: what closing would still write no longer matters."""
        if self.warc is not None:
            self.warc.close(complete=False)
        for closing in (self._entry, self._zip):
            try:
                if closing is not None:
                    closing.close()
            except (OSError, ValueError):
                pass
        self._entry = self._zip = None
        out, self._out = self._out, None
        self._outputs.discard(out)  # complete or not (another output of the export failed)
        self.file = None


def _resource(path: str, written: _Counted) -> dict[str, Any]:
    return {"name": os.path.basename(path), "path": path, "hash": written.digest,
            "bytes": written.size}
