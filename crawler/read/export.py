"""Export a crawl as WARC, WACZ and JSON lines, in one streaming pass.

Theory of operation
-------------------
:func:`export` reads the crawl through a
:class:`~crawler.read.listing.CrawlReader` (read-only: it works beside a
running crawl and exports the records flushed before it started) and hands
each page record to the sinks asked for: :class:`~crawler.read.warc.WarcSink`
(WARC records, crawler.read.warc says which), :class:`~crawler.read.wacz.WaczSink`
(the same records in a WACZ package, with its CDXJ index and page list) and
:class:`JsonlSink`. One record is in memory at a time (JSON lines wait, without
their bodies, in batches of a few hundred pages: their links are resolved to URLs
together, crawler.read.linkgraph.Resolver).
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

JSON lines: one object per page record, in the shape crawler.read.pagejson
gives it (the record's fields, its link graph, its PageRank).

Thread safety: sinks and ``export`` are for one thread.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from ..config import DEFAULT_USER_AGENT
from ..exceptions import ConfigError
from ..state.pages import KEY_SIZE, LINK_SIZE, PageRecord
from ..web.urls import url_key
from ._outfile import Outputs, naming
from .display import printable_json
from .htmlbounds import DEFAULT_BOUNDS, ReadBounds
from .linkgraph import Resolver
from .listing import DEFAULT_MAX_TEXT_CHARS, CrawlReader
from .markdown import MarkdownSink
from .pagejson import link_items, page_object, rank_fields, read_text_fields
from .rankstore import Rank, RankStore
from .wacz import WaczSink
from .warc import WarcSink, payload_digest, request_headers, response_headers, split_name

__all__ = ["ExportStats", "JsonlSink", "WaczSink", "WarcSink", "export", "payload_digest",
           "request_headers", "response_headers", "split_name"]

log = logging.getLogger(__name__)

_BATCH_PAGES = 512  # JSON lines waiting for their links to be resolved together
_BATCH_TEXT_PAGES = 32  # with --text (each holds up to two texts of text_limit chars)
_BATCH_LINKS = 1 << 14  # or this many links (a vectorized lookup of ~16k keys)


@dataclass(slots=True)
class ExportStats:
    pages: int = 0  # page records read
    records: int = 0  # WARC records written (warcinfo included)
    revisits: int = 0
    failures: int = 0  # pages with no HTTP answer (status 0)
    warc_files: list[str] = field(default_factory=list)
    warc_bytes: int = 0
    wacz_file: str | None = None
    wacz_bytes: int = 0
    wacz_pages: int = 0  # entries of its pages/pages.jsonl
    jsonl_file: str | None = None  # None: no JSONL, or JSONL to a stream
    jsonl_lines: int = 0
    jsonl_bytes: int = 0
    markdown_dir: str | None = None
    markdown_files: int = 0
    skipped: int = 0  # damaged records skipped
    # pages whose JSONL main_text or Markdown is their plain text, not their main content:
    # nested too deeply or over the time budget a page (crawler.read.htmlbounds)
    plain: int = 0
    seconds: float = 0.0

    @property
    def files(self) -> list[str]:
        """Every output written, in order: the WARC file(s), the WACZ, the JSONL file, the
        Markdown directory."""
        return (self.warc_files + ([self.wacz_file] if self.wacz_file else [])
                + ([self.jsonl_file] if self.jsonl_file else [])
                + ([self.markdown_dir] if self.markdown_dir else []))

    def summary(self) -> str:
        out = (f"exported {self.pages} pages ({self.failures} with no HTTP answer) "
               f"in {self.seconds:.1f} s")
        if self.warc_files or self.wacz_file:
            out += f"; WARC: {self.records} records ({self.revisits} revisits)"
        if self.warc_files:
            out += f", {self.warc_bytes} bytes in {len(self.warc_files)} file(s)"
        if self.wacz_file:
            out += f"; WACZ: {self.wacz_pages} pages listed, {self.wacz_bytes} bytes"
        if self.jsonl_lines:
            out += f"; JSONL: {self.jsonl_lines} lines, {self.jsonl_bytes} bytes"
        if self.markdown_dir:
            out += f"; Markdown: {self.markdown_files} files"
        if self.skipped:
            out += f"; {self.skipped} damaged record(s) skipped"
        if self.plain:
            out += (f"; {self.plain} page(s) read from their plain text (nested too deeply "
                    "or over the time budget a page: docs/BOUNDS.md)")
        return out


# -- sinks ------------------------------------------------------------------------------------


class JsonlSink:
    """Writes one JSON object per page to a file (via ``.part``) or an open text stream.

    Lines wait in a batch (at most _BATCH_PAGES pages, their bodies not kept, or
    _BATCH_LINKS links) so that the resolver looks their links up together; ``close``
    writes the last batch."""

    def __init__(self, target: str | os.PathLike[str] | IO[str], *, text: bool = False,
                 text_limit: int = DEFAULT_MAX_TEXT_CHARS,
                 resolver: Resolver | None = None, ranks: RankStore | None = None,
                 outputs: Outputs | None = None, bounds: ReadBounds = DEFAULT_BOUNDS) -> None:
        self.text, self.text_limit, self.bounds = text, text_limit, bounds
        self.plain = 0  # lines whose main_text is the page's plain text (bounds)
        self.resolver = resolver  # outlink keys -> URLs (link_items)
        self.ranks = ranks  # rank_fields; closed with the sink
        self.lines = self.bytes = 0
        self.path: str | None = None  # the file, once it is complete
        self._batch: list[tuple[dict[str, Any], bytes]] = []  # (object, packed links)
        self._batch_links = 0
        self._batch_pages = _BATCH_TEXT_PAGES if text else _BATCH_PAGES
        self._name: str | None = None
        self._out: IO[str] | None = None
        self._outputs = outputs if outputs is not None else Outputs()  # see WarcSink
        if isinstance(target, str | os.PathLike):
            self._name = os.fspath(target)
            try:
                self._out = self._outputs.create(self._name, "w")
            except BaseException:
                self.close(complete=False)
                raise
        else:
            self._out = target

    def write(self, page: PageRecord) -> None:
        if self._out is None:
            raise ValueError("the JSONL sink is closed")
        obj = page_object(page)
        if self.text:  # (the fields page_object(text=True) adds, in the same place)
            fields, plain = read_text_fields(page, self.text_limit, self.bounds)
            obj.update(fields)
            self.plain += bool(plain)
        obj["elapsed"] = page.elapsed
        obj["links"] = None  # these three made when the batch is resolved (_flush),
        obj.update(rank_fields(None))  # each in its place among the keys
        self._batch.append((obj, page.links))
        self._batch_links += page.link_count()
        if self._batch_links >= _BATCH_LINKS or len(self._batch) >= self._batch_pages:
            self._flush()

    def _flush(self) -> None:
        """Resolve the batch's links in one call and write its lines."""
        batch, self._batch, self._batch_links = self._batch, [], 0
        if not batch:
            return
        urls: list[str | None] | None = None
        if self.resolver is not None:
            packed = b"".join(links[: len(links) // LINK_SIZE * KEY_SIZE] for _, links in batch)
            urls = self.resolver.many(_keys(packed))
        ranks: list[Rank | None] = [None] * len(batch)
        if self.ranks is not None:
            ranks = self.ranks.ranks(_keys(b"".join(url_key(obj["url"]) for obj, _ in batch)))
        at = 0
        lines = []
        for (obj, links), rank in zip(batch, ranks, strict=True):
            n = len(links) // LINK_SIZE
            obj["links"] = link_items(links, urls[at : at + n] if urls is not None else None)
            obj.update(rank_fields(rank))
            at += n
            lines.append(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._write("".join(lines), len(lines))

    def _write(self, text: str, lines: int) -> None:
        """Write ``lines`` JSON lines at once (one encode, one call)."""
        assert self._out is not None
        if self._name is None:  # a stream, maybe a terminal: the same JSON, nothing raw
            text = printable_json(text)  # that a terminal acts on (ESC, C1, bidi controls)
            self._out.write(text)  # its errors (a closed pipe) as they are
        else:
            with naming(self._name):
                self._out.write(text)
        self.lines += lines
        self.bytes += len(text.encode("utf-8"))

    def close(self, *, complete: bool = True) -> None:
        """Finish (rename) the file; with ``complete`` False, or when that fails, remove
        it, even once complete. A stream is flushed, never closed. Idempotent."""
        if complete and self._out is not None:
            self._flush()  # its error (a full disk, a closed pipe) goes to the caller,
        self._batch = []  # who closes again with complete False
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
            self._outputs.discard(out)
            self.path = None
            return
        if out is not None:
            self._outputs.publish(out, self._name)
            self.path = self._name
            log.info("export: wrote %s (%s lines, %s bytes)", self._name, f"{self.lines:,}",
                     f"{self.bytes:,}")


def _keys(packed: bytes) -> np.ndarray:
    return np.frombuffer(packed, dtype=np.uint8).reshape(-1, KEY_SIZE)


# -- the pass -----------------------------------------------------------------------------------


def export(data_dir: str | os.PathLike[str], *, warc: str | os.PathLike[str] | None = None,
           wacz: str | os.PathLike[str] | None = None,
           jsonl: str | os.PathLike[str] | IO[str] | None = None,
           markdown: str | os.PathLike[str] | None = None, max_size: int | None = None,
           text: bool = False, text_limit: int = DEFAULT_MAX_TEXT_CHARS,
           user_agent: str = DEFAULT_USER_AGENT, revisits: bool = True,
           skip_failures: bool = False, strict: bool = False,
           progress: Callable[[int, int], None] | None = None,
           bounds: ReadBounds = DEFAULT_BOUNDS) -> ExportStats:
    """Export the crawl in ``data_dir`` to ``warc``, ``wacz`` and/or ``jsonl`` in one pass.

    ``user_agent`` goes into the rebuilt request records (the crawl does not
    record the one it used). ``max_size`` splits the ``warc`` output (a WACZ
    holds one WARC). ``strict``: a damaged record raises DataDirError
    instead of being skipped with a warning. ``progress(done, total)`` is called
    after every record read (and once at the end). ``bounds``: what reading a page's
    main content (JSONL ``--text``, Markdown) may cost before its plain text is used
    instead (counted in ``plain``). All or nothing: on any error
    every file written is removed. Raises DataDirError, ConfigError or OSError
    (an output that cannot be written; ``filename`` names it).
    """
    if warc is None and wacz is None and jsonl is None and markdown is None:
        raise ConfigError("nothing to export: give a WARC, a WACZ, a JSONL and/or a Markdown "
                          "output")
    stats = ExportStats()
    started = time.monotonic()
    with CrawlReader(data_dir, strict=strict) as reader:
        total = len(reader)
        name = os.path.basename(os.path.abspath(reader.data_dir))
        info = {"isPartOf": name, "description": f"crawl {name}: {total} page records at "
                "export time; bodies stored decoded (see X-Crawler-Original-*)"}
        wsink: WarcSink | None = None
        zsink: WaczSink | None = None
        jsink: JsonlSink | None = None
        msink: MarkdownSink | None = None
        sinks: list[WarcSink | WaczSink | JsonlSink | MarkdownSink] = []
        outputs = Outputs()  # every file of every sink, from before it exists
        try:
            if warc is not None:
                wsink = WarcSink(warc, user_agent=user_agent, max_size=max_size,
                                 revisits=revisits, skip_failures=skip_failures, info=info,
                                 outputs=outputs)
                sinks.append(wsink)
            if wacz is not None:
                zsink = WaczSink(wacz, user_agent=user_agent, revisits=revisits,
                                 skip_failures=skip_failures, info=info, title=f"crawl {name}",
                                 outputs=outputs)
                sinks.append(zsink)
            if jsonl is not None:
                ranks = RankStore.open(reader.data_dir)
                jsink = JsonlSink(jsonl, text=text, text_limit=text_limit, ranks=ranks,
                                  resolver=Resolver(reader, ranks=ranks),
                                  outputs=outputs, bounds=bounds)
                sinks.append(jsink)
            if markdown is not None:
                msink = MarkdownSink(markdown, bounds=bounds)
                sinks.append(msink)
            readers = [s for s in (jsink, msink) if s is not None]
            for page in reader.pages():
                stats.pages += 1
                stats.failures += page.status <= 0
                plain = sum(s.plain for s in readers)
                for sink in sinks:
                    sink.write(page)
                stats.plain += sum(s.plain for s in readers) > plain
                if progress is not None:
                    progress(stats.pages + reader.skipped, total)
            if progress is not None:  # damaged records at the end are read too
                progress(stats.pages + reader.skipped, total)
            for sink in sinks:
                sink.close()
        except BaseException:
            for sink in sinks:
                sink.close(complete=False)
            outputs.discard()  # a sink made but not yet in sinks (a Ctrl-C as it returned)
            raise
        stats.skipped = reader.skipped
    if wsink is not None:
        stats.records, stats.revisits = wsink.records, wsink.revisits
        stats.warc_files, stats.warc_bytes = list(wsink.files), wsink.bytes
    if zsink is not None:
        if wsink is None:
            stats.records, stats.revisits = zsink.records, zsink.revisits
        stats.wacz_file, stats.wacz_bytes, stats.wacz_pages = zsink.file, zsink.bytes, zsink.pages
    if msink is not None:
        stats.markdown_dir, stats.markdown_files = msink.directory, msink.files
    if jsink is not None:
        stats.jsonl_file = jsink.path
        stats.jsonl_lines, stats.jsonl_bytes = jsink.lines, jsink.bytes
    stats.seconds = time.monotonic() - started
    log.info("%s", stats.summary())
    return stats
