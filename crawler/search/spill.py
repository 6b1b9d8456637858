"""What an ``index`` run has read but not yet written, kept across runs: what makes a
long run resumable (crawler.search.indexer). At 20M pages the reading phase alone
takes hours; a kill in it no longer loses what was read.

In the shard's search directory, ``spill/`` holds:

- ``documents-S-NNNNNNNNNN.gz``: one finished reading task's documents (crawler.search.
  reading), gzip level 1, numbered in the order they were read, across runs. Our own
  records, never pickles: a crawl directory is data, and a file someone put there must
  not run code when ``index`` reads it (issue 42). Inside the gzip: :data:`DOCS_MAGIC`,
  then one record a document: a fixed head (:data:`_DOC_HEAD`: the record's key, its
  version, the fetch time, the SimHash, whether it is an indexed page, the main text's
  share in code blocks as a percent, and the byte lengths of eight strings) and the
  eight strings, UTF-8: URL, title, description, headings, the names the page defines,
  main text, language, canonical URL. A record that is not an indexable page
  has kind 0 and no strings (its version is journaled all the same). A file that does
  not start with the magic, or whose records do not add up, is refused with one line
  (:func:`read_documents`): nothing in it is interpreted beyond lengths and text;
- ``lines-D-S-NNNNNNNNNN.gz``: the anchor lines of that task's links whose targets shard
  D owns (moved into D's spill when D is another shard of the run), gzip level 1 too
  (1.9x smaller: their random hex keys do not compress; most of the spill);
- ``spilled/``: a crawler.search.versions table of the (key, version) of every record
  in a finished task. The next run does not read such a record again at that version;
- ``reanchor.bin``: 16-byte keys of pages to index again for their new anchor text.

Order of writes, so that a kill -9 anywhere loses at most the task under way: a task's
files are written beside their names, fsynced and renamed (a full disk leaves a
``.tmp``, removed by the next open, never half a file), the directory fsynced, then
its records are journaled in ``spilled/`` (phase 1); the anchor lines are merged into
the anchor store, which is flushed, then the keys to re-index are appended to
``reanchor.bin`` and fsynced, and only then the lines files are removed (phase 2:
merging twice is a set union, so a kill between is harmless); a documents file is
removed after the index commit that holds its last document (phase 3: writing a
document twice replaces it). At the end of a run the spill is emptied.

Thread safety: one writer (the index lock).
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import shutil
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np

from ..exceptions import DataDirError
from ..read.pagetext import PageText
from ..state.jsonfile import fsync_path
from .schema import REBUILD
from .versions import Versions, key_order

SPILL_DIR = "spill"
SPILLED_DIR = "spilled"
REANCHOR = "reanchor.bin"
TMP_SUFFIX = ".tmp"
_DOCUMENTS = re.compile(r"documents-(\d+)-(\d{10})\.gz")
_LINES = re.compile(r"lines-(\d+)-(\d+)-(\d{10})\.gz")
DOCS_MAGIC = b"kvcrawl spill documents 3\n"  # a documents file's first bytes (gunzipped)
# key, version, fetch time, SimHash, kind (0: no document, 1: a page), the main text's
# share in code blocks (percent), 8 string lengths
_DOC_HEAD = struct.Struct("<16sqdQBB8I")
_NO_STRINGS = (0,) * 8
# an anchor line: a target's key in hex, a tab, the link's text (crawler.search.reading)
_LINES_FILE = re.compile(rb"(?:[0-9a-f]{32}\t[^\n]*\n)*")


class Document(NamedTuple):
    """One spilled record: what phase 3 of an index run writes (crawler.search.indexer).
    ``url`` and ``text`` are None for a record that is not an indexable page. The text's
    links and base are not kept: phase 1 wrote them out as anchor lines."""

    key: bytes
    version: int
    url: str | None
    fetched: float
    text: PageText | None


def encode_document(key: bytes, version: int, url: str | None, fetched: float,
                    text: PageText | None) -> bytes:
    """One documents-file record (see the module docstring)."""
    if url is None or text is None:
        return _DOC_HEAD.pack(key, version, 0.0, 0, 0, 0, *_NO_STRINGS)
    strings = [s.encode("utf-8", "surrogatepass") for s in (
        url, text.title, text.description, text.headings, text.names, text.text, text.lang,
        text.canonical)]
    return (_DOC_HEAD.pack(key, version, fetched, text.simhash, 1, code_percent(text.code),
                           *map(len, strings))
            + b"".join(strings))


def code_percent(share: float) -> int:
    """A share in [0, 1] as a whole percent (what the spill and the index keep)."""
    return max(0, min(100, round(share * 100)))


def documents_name(shard: int, number: int) -> str:
    return f"documents-{shard}-{number:010d}.gz"


def lines_name(dest: int, shard: int, number: int) -> str:
    return f"lines-{dest}-{shard}-{number:010d}.gz"


def write_documents(path: str, records: list[bytes]) -> None:
    """A task's documents (:func:`encode_document`'s records), as write_file writes."""
    write_file(path, [DOCS_MAGIC, *records])


def write_file(path: str, chunks: list[bytes]) -> None:
    """A task's documents or lines, gzipped in one call (a write a line or a
    document cost ~10% of a run in gzip's Python layer), durable and whole when this
    returns: written beside, then renamed, so a full disk or a crash never leaves half a
    file under the name."""
    _write_whole(path, gzip.compress(b"".join(chunks), compresslevel=1, mtime=0))


def _write_whole(path: str, data: bytes) -> None:
    tmp = path + TMP_SUFFIX
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _damaged(path: str, what: str) -> DataDirError:
    return DataDirError(f"{path}: {what}; {REBUILD}")  # (--rebuild empties the spill)


def _read(path: str) -> bytes:
    """A spilled file's bytes; a cut or damaged one is a DataDirError naming it."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:  # cut; not gzip (BadGzipFile), CRC
        raise _damaged(path, f"not a whole gzip file ({exc})") from None


def read_lines(path: str) -> list[bytes]:
    """A lines file's anchor lines; one that is not all such lines (UTF-8) is refused
    whole, before any of it is merged."""
    data = _read(path)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _damaged(path, f"not an anchor lines file (not UTF-8 at byte {exc.start})"
                       ) from None
    if _LINES_FILE.fullmatch(data) is None:
        raise _damaged(path, "not an anchor lines file (a line is not KEY<tab>TEXT)")
    return data.splitlines(keepends=True)


def read_documents(path: str) -> Iterator[Document]:
    """The documents of a file :func:`write_documents` wrote, in order. A file that is
    not one (no magic: another program's, an older crawler's pickles) or is damaged is a
    DataDirError naming it, raised before the first document for a foreign file; nothing
    in a file is ever run or unpickled."""
    data = _read(path)
    if not data.startswith(DOCS_MAGIC):
        raise _damaged(path, "not a documents file of this crawler's index spill (it is "
                       "not read: only our own records are)")
    pos, end = len(DOCS_MAGIC), len(data)
    while pos < end:
        if pos + _DOC_HEAD.size > end:
            raise _damaged(path, f"a documents file cut at byte {pos}")
        key, version, fetched, simhash, kind, code, *lengths = _DOC_HEAD.unpack_from(data, pos)
        pos += _DOC_HEAD.size
        if kind == 0 and not any(lengths):
            yield Document(key, version, None, 0.0, None)
            continue
        if kind != 1 or pos + sum(lengths) > end:
            raise _damaged(path, f"a damaged documents file (record at byte "
                           f"{pos - _DOC_HEAD.size})")
        strings = []
        try:
            for n in lengths:
                strings.append(data[pos:pos + n].decode("utf-8", "surrogatepass"))
                pos += n
        except UnicodeDecodeError:
            raise _damaged(path, f"a damaged documents file (text at byte {pos})") from None
        url, title, description, headings, names, body, lang, canonical = strings
        yield Document(key, version, url, fetched, PageText(
            title=title, description=description, headings=headings, names=names, text=body,
            lang=lang, canonical=canonical, simhash=simhash, code=min(code, 100) / 100))


class Spill:
    """One shard's spill directory."""

    def __init__(self, search_dir: str, shard: int) -> None:
        self.dir = os.path.join(search_dir, SPILL_DIR)
        self.shard = shard
        os.makedirs(os.path.join(self.dir, SPILLED_DIR), exist_ok=True)
        self.spilled = Versions(os.path.join(self.dir, SPILLED_DIR))
        for name in os.listdir(self.dir):
            if name.endswith(TMP_SUFFIX):  # a task's file a stop cut short: not journaled
                os.remove(os.path.join(self.dir, name))
        # numbers after every file's here (a received lines file too: never overwritten)
        numbers = [int(m.group(2)) for _, m in self._files(_DOCUMENTS)]
        numbers += [int(m.group(3)) for _, m in self._files(_LINES)]
        self._next = max(numbers, default=-1) + 1

    def __len__(self) -> int:
        """Records read by earlier runs and not yet written (an upper bound: some may be
        written already, their files not yet removed)."""
        return len(self.spilled)

    def take_numbers(self, n: int) -> int:
        """The first of ``n`` new task numbers (later than every file here)."""
        first, self._next = self._next, self._next + n
        return first

    def changed(self, keys: np.ndarray, vers: np.ndarray) -> np.ndarray:
        """Which of a snapshot's keys (V16) are not spilled at their version."""
        return self.spilled.changed(keys, vers)

    def record(self, keys: bytes, versions: Iterable[int]) -> None:
        """A finished task's records (16-byte keys, their versions): not read again.
        Its files were renamed into place: those renames are made durable first."""
        fsync_path(self.dir)
        self.spilled.record((keys[i * 16:(i + 1) * 16], ver, 0)
                            for i, ver in enumerate(versions))

    def adopt(self, path: str) -> None:
        """Move a lines file another shard's task wrote for this shard in here."""
        target = os.path.join(self.dir, os.path.basename(path))
        try:
            os.replace(path, target)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            with open(path, "rb") as f:  # shards on two filesystems: copied whole
                _write_whole(target, f.read())
            os.remove(path)
        fsync_path(self.dir)

    def add_lines(self, number: int, source: int, data: bytes) -> None:
        """Anchor lines from another node's shard (``index --ray``: its lines files'
        bytes, gzip members one after the other), durable."""
        _write_whole(os.path.join(self.dir, lines_name(self.shard, source, number)), data)

    def _files(self, pattern: re.Pattern[str]) -> list[tuple[str, re.Match[str]]]:
        """(path, its name's match) of the files here named by ``pattern``, by name."""
        return [(os.path.join(self.dir, name), m) for name in sorted(os.listdir(self.dir))
                if (m := pattern.fullmatch(name)) is not None]

    def lines(self) -> list[str]:
        """The lines files for this shard's targets."""
        return [path for path, m in self._files(_LINES) if int(m.group(1)) == self.shard]

    def lines_for_others(self) -> dict[int, list[str]]:
        """The lines files this shard's tasks wrote for shards not in this run (on Ray:
        other nodes'), by shard: kept until the run ends, so a stop before they were
        handed over does not lose them (the records that wrote them are not read
        again)."""
        out: dict[int, list[str]] = {}
        for path, m in self._files(_LINES):
            if int(m.group(1)) != self.shard:
                out.setdefault(int(m.group(1)), []).append(path)
        return out

    def documents(self) -> list[str]:
        """The documents files, in the order they were read (their names sort so)."""
        return [path for path, _ in self._files(_DOCUMENTS)]

    def add_reanchor(self, keys: list[bytes]) -> None:
        if not keys:
            return
        with open(os.path.join(self.dir, REANCHOR), "ab") as f:
            f.write(b"".join(keys))
            f.flush()
            os.fsync(f.fileno())

    def reanchor(self) -> list[bytes]:
        """The distinct keys to index again for their anchor text, in key order."""
        try:
            with open(os.path.join(self.dir, REANCHOR), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        data = data[:len(data) - len(data) % 16]  # a torn tail: appended again next time
        keys = np.frombuffer(data, dtype="V16")
        keys = keys[key_order(keys)]
        if len(keys) > 1:
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        return [bytes(k) for k in keys.tolist()]

    def clear(self) -> None:
        """Everything written: start the next run empty."""
        self.spilled.close()
        shutil.rmtree(self.dir)
        os.makedirs(os.path.join(self.dir, SPILLED_DIR))
        self.spilled = Versions(os.path.join(self.dir, SPILLED_DIR))
        self._next = 0

    def close(self) -> None:
        self.spilled.close()


__all__ = ["DOCS_MAGIC", "REANCHOR", "SPILLED_DIR", "SPILL_DIR", "TMP_SUFFIX", "Document",
           "Spill", "documents_name", "encode_document", "lines_name", "read_documents",
           "read_lines", "write_documents", "write_file"]
