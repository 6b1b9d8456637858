"""The crawl's link graph on disk, built out of core from the page records (for rank, report).

Theory of operation
-------------------
Every record gets a *record id* (rid) in the order the pass reads it. The
graph is built in three phases, none of which holds more than a bounded
slice in memory (``chunk`` records, a ``block`` of node values, or one hash
bucket of node keys):

1. **Scan** (one pass over the records, :meth:`GraphBuilder.add`): per-rid
   arrays are appended in rid order (``keys.bin`` 16 B, ``status.i2``, the URL
   table ``urls.bin`` + ``urloff.u8``); each record's key goes to a *node
   spill* and each of its edges (its stored links, its redirect target) to an
   *edge spill* as (target key, source rid, flags). Both spills are bucketed
   by the key's top bits: md5 keys are uniform, so ``P`` buckets (``P`` from
   the expected record count, ~512K nodes a bucket) split both evenly.
2. **Join** (per bucket): the bucket's node keys are sorted (they are also
   appended to the sorted key *index*, ``index.{hi,lo,rid}.u8``: buckets in
   order give a globally sorted index), and its edges, read in chunks, find
   their target by binary search on (hi, lo) 64-bit halves. Matched edges
   give each target its inlink count (``index.inlinks.u4``, all links); the
   rank edges among them (not nofollow, target fetched) go to a *tile spill*
   bucketed by (target block, source block); redirect edges and edges to
   failed targets are kept aside (``redirects.bin``, ``failed.bin``) for the
   report. Edges to URLs the crawl never recorded are counted and dropped.
3. **Tiles**: the tile buckets are concatenated in (target block, source
   block) order into ``edges.bin`` (u32 source and target offsets within
   their blocks) with ``tiles.i8`` offsets, and a pass over the tiles by
   source block counts each node's out-degree (``outdeg.u4``).

So PageRank (crawler.read.rank) reads, per tile, one block of source values
and a run of edges, and writes one block of target values.

Memory: the scan buffers ``chunk`` edges; a join holds one bucket of nodes
(~60 B each while sorted, ~512K) and one chunk of edges (~300 B each with the
temporaries); the tile pass one block of counts. Disk: about 25 B per edge
and 26 B per record in the spills, 8 B per rank edge in the tiles, removed
as they are consumed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from ..exceptions import ConfigError
from ..state.pages import KEY_SIZE, NOFOLLOW, PageRecord
from ..web.urls import url_key
from . import _spill
from ._spill import Spill

log = logging.getLogger(__name__)

DEFAULT_BLOCK_NODES = 1 << 21  # nodes per block: 16 MB of float64 values
DEFAULT_CHUNK = 1 << 18  # edges (or records) handled per vectorized step: ~300 B each
NODES_PER_BUCKET = 1 << 19  # target node keys per join bucket (~60 B each while sorted)
REDIRECT = 0x80  # edge flag: a redirect's Location (page link flags use the low bits)
META_NAME = "graph.json"

NODE = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("rid", "<u8"), ("status", "<i2")])
EDGE = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("src", "<u8"), ("flags", "u1")])
TILE = np.dtype([("src", "<u4"), ("dst", "<u4")])
PAIR = np.dtype([("src", "<i8"), ("dst", "<i8")])  # redirects (dst -1: not recorded)
FAILED = np.dtype([("dst", "<i8"), ("src", "<i8"), ("flags", "u1")])


@dataclass
class GraphInfo:
    """What a built graph holds (``graph.json``)."""

    records: int = 0  # nodes of any status (rids 0..records-1)
    fetched: int = 0  # records with an HTTP answer: the PageRank nodes
    links: int = 0  # edges read (links and redirects, every flag)
    unrecorded: int = 0  # of which to URLs with no record (dropped)
    edges: int = 0  # rank edges: followable, between fetched pages
    dangling: int = 0  # fetched pages with no rank edge out
    block: int = DEFAULT_BLOCK_NODES
    blocks: int = 1
    buckets: int = 1


def split_keys(packed: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) native uint64 halves of packed 16-byte keys (big-endian halves, so the
    order of (hi, lo) is the order of the key bytes)."""
    halves = np.frombuffer(packed, dtype=">u8").reshape(-1, 2)
    return halves[:, 0].astype(np.uint64), halves[:, 1].astype(np.uint64)


def match(nhi: np.ndarray, nlo: np.ndarray, qhi: np.ndarray,
          qlo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position, found) of each query key among nodes sorted by (hi, lo). Exact: equal
    ``hi`` halves (never seen, but possible) are walked until ``lo`` matches."""
    m = len(nhi)
    order = np.argsort(qhi, kind="stable")  # sorted queries search ~10x faster
    pos = np.empty(len(qhi), dtype=np.int64)
    pos[order] = np.searchsorted(nhi, qhi[order])
    found = np.zeros(len(qhi), dtype=bool)
    cand = np.arange(len(qhi))
    at = pos.copy()
    while len(cand):
        pc = at[cand]
        keep = pc < m
        cand, pc = cand[keep], pc[keep]
        keep = nhi[pc] == qhi[cand]
        cand, pc = cand[keep], pc[keep]
        hit = nlo[pc] == qlo[cand]
        found[cand[hit]] = True
        pos[cand[hit]] = pc[hit]
        cand = cand[~hit]
        at[cand] = pc[~hit] + 1
    return pos, found


class GraphBuilder:
    """Builds a graph in ``directory`` from records added one by one. For one thread."""

    def __init__(self, directory: str, *, expected: int = 0, block: int = DEFAULT_BLOCK_NODES,
                 chunk: int = DEFAULT_CHUNK, bucket_nodes: int = NODES_PER_BUCKET) -> None:
        if block < 1 or chunk < 1 or bucket_nodes < 1:
            raise ConfigError("block, chunk and bucket sizes must be >= 1")
        if block > 1 << 32:
            raise ConfigError(f"block of {block} nodes: at most 2**32 (u32 offsets)")
        self.dir = directory
        self.block, self.chunk = block, chunk
        bits = max(0, math.ceil(math.log2(max(expected, 1) / bucket_nodes)))
        self.bits = min(bits, 16)
        buckets = 1 << self.bits
        os.makedirs(directory, exist_ok=True)
        work = os.path.join(directory, "work")
        self.nodes = Spill(work, "nodes", buckets, NODE, buffer=chunk)
        self.edges = Spill(work, "edges", buckets, EDGE, buffer=chunk)
        self.info = GraphInfo(block=block, buckets=buckets)
        self.n = 0
        self._url_end = 0
        for name in ("keys.bin", "status.i2", "urls.bin", "urloff.u8"):
            open(self.path(name), "wb").close()
        _spill.append(self.path("urloff.u8"), np.zeros(1, dtype=np.uint64))
        self._reset_batch()

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _reset_batch(self) -> None:
        self._keys: list[bytes] = []
        self._status: list[int] = []
        self._urls: list[bytes] = []
        self._targets: list[bytes] = []
        self._flags: list[bytes] = []
        self._counts: list[int] = []
        self._held = 0

    # -- phase 1: the scan ------------------------------------------------------------

    def add_page(self, page: PageRecord) -> int:
        """Add one record: its links and, for a redirect, its Location. Returns its rid."""
        n = page.link_count()
        targets = page.links[: n * KEY_SIZE]
        flags = page.links[n * KEY_SIZE :]
        target = page.redirect_key()
        if target is not None:
            targets += target
            flags += bytes([REDIRECT])
        return self.add(url_key(page.url), page.url, page.status, targets, flags)

    def add(self, key: bytes, url: str, status: int, targets: bytes = b"",
            flags: bytes = b"") -> int:
        """Add one record: ``targets`` packed 16-byte keys (each once), ``flags`` one byte
        each (NOFOLLOW, REDIRECT). Keys must be unique across records."""
        rid = self.n
        self.n += 1
        self._keys.append(key)
        self._status.append(status)
        self._urls.append(url.encode("utf-8"))
        if status <= 0:
            targets, flags = b"", b""  # no answer, no edges
        self._targets.append(targets)
        self._flags.append(flags)
        self._counts.append(len(flags))
        self._held += 1 + len(flags)
        if self._held >= self.chunk:
            self._flush_batch()
        return rid

    def _bucket(self, hi: np.ndarray) -> np.ndarray:
        if self.bits == 0:
            return np.zeros(len(hi), dtype=np.int64)
        return (hi >> np.uint64(64 - self.bits)).astype(np.int64)

    def _flush_batch(self) -> None:
        if not self._keys:
            return
        self._write(b"".join(self._keys), np.array(self._status, dtype=np.int16), self._urls,
                    b"".join(self._targets), np.array(self._counts, dtype=np.int64),
                    b"".join(self._flags))
        self._reset_batch()

    def add_many(self, keys: bytes, urls: list[bytes], status: np.ndarray, targets: bytes,
                 counts: np.ndarray, flags: bytes) -> None:
        """Add ``len(urls)`` records at once (packed keys, UTF-8 URLs, statuses, and their
        targets: ``counts[i]`` keys each, in record order, with a flag byte each)."""
        self._flush_batch()
        counts = np.where(status > 0, counts, 0)
        if int(counts.sum()) * KEY_SIZE != len(targets):
            raise ConfigError("add_many: records with no answer cannot have edges")
        self.n += len(urls)
        self._write(keys, status.astype(np.int16), urls, targets, counts.astype(np.int64),
                    flags)

    def _write(self, packed: bytes, status: np.ndarray, urls: list[bytes], tpacked: bytes,
               counts: np.ndarray, flags: bytes) -> None:
        count = len(urls)
        base = self.n - count
        _spill.append(self.path("keys.bin"), np.frombuffer(packed, dtype=np.uint8))
        _spill.append(self.path("status.i2"), status)
        sizes = np.fromiter((len(u) for u in urls), dtype=np.uint64, count=count)
        _spill.append(self.path("urls.bin"), np.frombuffer(b"".join(urls), np.uint8))
        ends = np.cumsum(sizes, dtype=np.uint64) + np.uint64(self._url_end)
        _spill.append(self.path("urloff.u8"), ends)
        self._url_end = int(ends[-1])
        rids = np.arange(base, base + count, dtype=np.uint64)
        hi, lo = split_keys(packed)
        nodes = np.empty(count, dtype=NODE)
        nodes["hi"], nodes["lo"], nodes["rid"], nodes["status"] = hi, lo, rids, status
        self.nodes.add(self._bucket(hi), nodes)
        self.info.records += count
        self.info.fetched += int((status > 0).sum())
        if tpacked:
            thi, tlo = split_keys(tpacked)
            edges = np.empty(len(thi), dtype=EDGE)
            edges["hi"], edges["lo"] = thi, tlo
            edges["src"] = np.repeat(rids, counts)
            edges["flags"] = np.frombuffer(flags, dtype=np.uint8)
            self.edges.add(self._bucket(thi), edges)
            self.info.links += len(edges)

    # -- phases 2 and 3 -----------------------------------------------------------------

    def finish(self) -> Graph:
        """Join, tile, count out-degrees; returns the graph (the spills are removed)."""
        self._flush_batch()
        self.nodes.flush()
        self.edges.flush()
        info = self.info
        n, block = info.records, self.block
        info.blocks = max(1, -(-n // block))
        nb = info.blocks
        tiles = Spill(os.path.join(self.dir, "work"), "tile", nb * nb, TILE, buffer=self.chunk)
        for name in ("index.hi.u8", "index.lo.u8", "index.rid.u8", "index.inlinks.u4",
                     "redirects.bin", "failed.bin"):
            open(self.path(name), "wb").close()
        for p in range(self.nodes.buckets):
            self._join(p, tiles)
        tiles.flush()
        offsets = np.concatenate(([0], np.cumsum(tiles.counts))).astype(np.int64)
        with open(self.path("edges.bin"), "wb") as out:
            for t in range(nb * nb):
                if tiles.counts[t]:
                    with open(tiles.path(t), "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
                    tiles.remove(t)
        offsets.tofile(self.path("tiles.i8"))
        info.edges = int(offsets[-1])
        graph = Graph(self.dir, info)
        graph.count_outdegrees(self.chunk)
        shutil.rmtree(os.path.join(self.dir, "work"), ignore_errors=True)
        with open(self.path(META_NAME), "w", encoding="utf-8") as f:
            json.dump(asdict(info), f)
        return graph

    def _join(self, p: int, tiles: Spill) -> None:
        nodes = self.nodes.load(p)
        order = np.lexsort((nodes["lo"], nodes["hi"]))
        nhi, nlo, nrid, nstat = (np.ascontiguousarray(nodes[f][order])
                                 for f in ("hi", "lo", "rid", "status"))
        del nodes, order
        size = len(nhi)
        _spill.append(self.path("index.hi.u8"), nhi)
        _spill.append(self.path("index.lo.u8"), nlo)
        _spill.append(self.path("index.rid.u8"), nrid)
        inlinks = np.zeros(size, dtype=np.int64)
        block, nb = np.uint64(self.block), self.info.blocks
        for chunk in self.edges.chunks(p, self.chunk):
            pos, found = match(nhi, nlo, chunk["hi"], chunk["lo"])
            self.info.unrecorded += int(len(found) - found.sum())
            redirect = (chunk["flags"] & REDIRECT) != 0
            if redirect.any():
                pairs = np.empty(int(redirect.sum()), dtype=PAIR)
                pairs["src"] = chunk["src"][redirect]
                rpos, rfound = pos[redirect], found[redirect]
                target = np.full(len(rpos), -1, dtype=np.int64)
                target[rfound] = nrid[rpos[rfound]]
                pairs["dst"] = target
                _spill.append(self.path("redirects.bin"), pairs)
            fpos, fe = pos[found], chunk[found]
            if not len(fpos):
                continue
            inlinks += np.bincount(fpos, minlength=size)
            dst, dstat = nrid[fpos], nstat[fpos]
            bad = (dstat <= 0) | (dstat >= 400)
            if bad.any():
                failed = np.empty(int(bad.sum()), dtype=FAILED)
                failed["dst"], failed["src"] = dst[bad], fe["src"][bad]
                failed["flags"] = fe["flags"][bad]
                _spill.append(self.path("failed.bin"), failed)
            ok = ((fe["flags"] & NOFOLLOW) == 0) & (dstat > 0)
            src, dst = fe["src"][ok], dst[ok]
            recs = np.empty(len(src), dtype=TILE)
            recs["src"], recs["dst"] = src % block, dst % block
            tiles.add(((dst // block) * np.uint64(nb) + src // block).astype(np.int64), recs)
        _spill.append(self.path("index.inlinks.u4"),
                      np.minimum(inlinks, 0xFFFFFFFF).astype(np.uint32))
        self.nodes.remove(p)
        self.edges.remove(p)


class Graph:
    """A built graph directory, read in slices. For one thread."""

    def __init__(self, directory: str, info: GraphInfo | None = None) -> None:
        self.dir = directory
        if info is None:
            with open(os.path.join(directory, META_NAME), encoding="utf-8") as f:
                info = GraphInfo(**json.load(f))
        self.info = info
        self.n, self.block, self.blocks = info.records, info.block, info.blocks
        self.offsets = np.fromfile(self.path("tiles.i8"), dtype=np.int64)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def block_range(self, b: int) -> tuple[int, int]:
        start = b * self.block
        return start, min(self.n, start + self.block)

    def read(self, name: str, dtype: object, b: int) -> np.ndarray:
        """Block ``b`` of a per-rid array file."""
        start, end = self.block_range(b)
        return _spill.read_slice(self.path(name), dtype, start, end - start)

    def tile_size(self, db: int, sb: int) -> int:
        t = db * self.blocks + sb
        return int(self.offsets[t + 1] - self.offsets[t])

    def tile(self, db: int, sb: int, chunk: int) -> Iterator[np.ndarray]:
        """The edges into block ``db`` from block ``sb`` (offsets within the blocks)."""
        t = db * self.blocks + sb
        start, end = int(self.offsets[t]), int(self.offsets[t + 1])
        for i in range(start, end, chunk):
            yield _spill.read_slice(self.path("edges.bin"), TILE, i, min(chunk, end - i))

    def count_outdegrees(self, chunk: int) -> None:
        open(self.path("outdeg.u4"), "wb").close()
        dangling = 0
        for sb in range(self.blocks):
            start, end = self.block_range(sb)
            acc = np.zeros(end - start, dtype=np.int64)
            for db in range(self.blocks):
                for part in self.tile(db, sb, chunk):
                    acc += np.bincount(part["src"], minlength=end - start)
            _spill.append(self.path("outdeg.u4"), acc.astype(np.uint32))
            status = self.read("status.i2", np.int16, sb)
            dangling += int(((status > 0) & (acc == 0)).sum())
        self.info.dangling = dangling

    def url_of(self, rid: int) -> str:
        """The URL of record ``rid`` (two small reads)."""
        start, end = _spill.read_slice(self.path("urloff.u8"), np.uint64, rid, 2).tolist()
        with open(self.path("urls.bin"), "rb") as f:
            f.seek(start)
            return f.read(end - start).decode("utf-8")

    def statuses(self) -> np.ndarray:
        """A read-only memmap of the per-rid statuses (lookups by rid touch a page each)."""
        return _spill.memmap(self.path("status.i2"), np.int16, self.n)

    def redirects(self) -> np.ndarray:
        return np.fromfile(self.path("redirects.bin"), dtype=PAIR)

    def failed_edges(self, chunk: int = DEFAULT_CHUNK) -> Iterator[np.ndarray]:
        with open(self.path("failed.bin"), "rb") as f:
            while True:
                part = np.fromfile(f, dtype=FAILED, count=chunk)
                if not len(part):
                    return
                yield part

    def remove_edges(self) -> None:
        """Drop the edges (the tiles, and the report's redirect and failed-target edges),
        keep the node tables."""
        for name in ("edges.bin", "tiles.i8", "redirects.bin", "failed.bin"):
            try:
                os.unlink(self.path(name))
            except FileNotFoundError:
                pass


def build(pages: Iterator[PageRecord], directory: str, *, expected: int = 0,
          block: int = DEFAULT_BLOCK_NODES, chunk: int = DEFAULT_CHUNK) -> Graph:
    """The graph of ``pages`` (records without bodies will do) in ``directory``."""
    builder = GraphBuilder(directory, expected=expected, block=block, chunk=chunk)
    for page in pages:
        builder.add_page(page)
    return builder.finish()


__all__ = ["DEFAULT_BLOCK_NODES", "DEFAULT_CHUNK", "REDIRECT", "Graph", "GraphBuilder",
           "GraphInfo", "build", "match", "split_keys"]
