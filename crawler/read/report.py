"""The crawl report's numbers (``python -m crawler report``, ``serve``), in streaming passes.

Theory of operation
-------------------
One pass reads every record (bodies included: duplicate content is found by
payload digest) and feeds, record by record:

- counters that stay small: outcomes by class, key and HTTP status; the
  depth histogram; the time line (:class:`TimeBins`: at most ``max_bins``
  bins, their width doubled whenever the crawl's span needs more);
- the link graph (crawler.read.graph: its own bounded passes, then PageRank
  with crawler.read.rank), which also gives every record a *rid* and the
  rid -> URL table the lists below are printed from;
- two bucketed spills (crawler.read._spill): one row per record keyed by
  its host, one per stored 200 body keyed by its SHA-1; each bucket
  (~512K rows) is then grouped with numpy: per-host pages, errors, bytes,
  robots-blocked and the exact median fetch time; groups of equal payloads;
- fixed-size heaps: the slowest and the largest pages.

Then from the graph: redirect chains (the redirect edges, followed from each
redirect no other redirect points to; loops, chains with no head, and chains
over 3 hops flagged), broken links (edges to a 4xx/5xx answer or a failed
fetch, grouped by target with their referrers), and the top pages by rank.

Memory at 10M pages: the reader's key index (kvstore's, ~60 B/page while
iterating), one bucket of host or digest rows (~512K x 60 B), one graph bucket
or chunk (see graph.py), the PageRank blocks (~100 MB), the redirect table
(16 B per redirect record, with a Python dict over it: ~100 B per redirect)
and one counter per distinct broken target (~100 B each); the lists shown
are ``limit`` long. Nothing holds the pages, the links or the hosts at once.

Thread safety: one computation per thread; it opens its own reader.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import outcomes
from ..outcomes import CLASSES, outcome_class, outcome_key
from ..state.pages import NOFOLLOW, PageRecord
from ..web.urls import host_key, host_of
from . import _grouping, _spill
from ._grouping import (
    DUP,
    HOST,
    HOST_GROUPS,
    chunked_hosts,
    dup_groups,
    exact_hosts,
)
from .graph import (
    DEFAULT_BLOCK_NODES,
    DEFAULT_CHUNK,
    NODES_PER_BUCKET,
    REDIRECT,
    Graph,
    GraphBuilder,
    split_keys,
)
from .listing import CrawlReader
from .rank import DEFAULT_DAMPING, DEFAULT_MAX_ITER, DEFAULT_TOL, pagerank

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 50  # rows of each list
DEFAULT_REFERRERS = 10  # referrers shown per broken target
DEFAULT_MAX_BINS = 240  # time line bins
LONG_CHAIN = 3  # redirect chains of more hops are flagged
# Outcome classes counted as errors (in the time line and per host).
ERROR_CLASSES = frozenset({"http_4xx", "http_5xx", "dns", "connect", "timeout", "broken",
                           "bad_host", "other"})
# Outcome classes of a record without an answer that are a decision, not a broken target.
NOT_BROKEN = frozenset({"robots", "limit"})
_BATCH = 1 << 16  # records buffered before the spills get them

class TimeBins:
    """Counts per time bin, at most ``max_bins`` bins: the width starts at 1/8 s
    and doubles (bins merged in pairs) whenever the span seen needs more."""

    def __init__(self, max_bins: int = DEFAULT_MAX_BINS, width: float = 0.125) -> None:
        self.max_bins, self.width = max_bins, width
        self.bins: dict[int, list[int]] = {}
        self.lo = self.hi = 0

    def add(self, t: float, pages: int, errors: int) -> None:
        i = math.floor(t / self.width)
        if not self.bins:
            self.lo = self.hi = i
        self.lo, self.hi = min(self.lo, i), max(self.hi, i)
        while self.hi - self.lo + 1 > self.max_bins:
            self.width *= 2
            merged: dict[int, list[int]] = {}
            for j, (p, e) in self.bins.items():
                slot = merged.setdefault(j // 2, [0, 0])
                slot[0] += p
                slot[1] += e
            self.bins, self.lo, self.hi, i = merged, self.lo // 2, self.hi // 2, i // 2
        slot = self.bins.setdefault(i, [0, 0])
        slot[0] += pages
        slot[1] += errors

    def rows(self) -> list[dict[str, float]]:
        if not self.bins:
            return []
        return [{"t": j * self.width, "pages": self.bins.get(j, [0, 0])[0],
                 "errors": self.bins.get(j, [0, 0])[1],
                 "pages_per_s": self.bins.get(j, [0, 0])[0] / self.width}
                for j in range(self.lo, self.hi + 1)]


def _size(page: PageRecord) -> int:
    """Bytes of the page: its stored body, else the Content-Length it was sent with."""
    if page.body:
        return len(page.body)
    try:
        return max(0, int(page.headers.get("content-length", "0")))
    except ValueError:
        return 0


class _Scan:
    """What the one pass over the records accumulates (see the module docstring)."""

    def __init__(self, work: str, expected: int, limit: int, block: int, chunk: int) -> None:
        self.builder = GraphBuilder(os.path.join(work, "graph"), expected=expected,
                                    block=block, chunk=chunk)
        buckets = 1 << max(0, math.ceil(math.log2(max(expected, 1) / NODES_PER_BUCKET)))
        self.hosts = _spill.Spill(os.path.join(work, "hosts"), "h", buckets, HOST, buffer=chunk)
        self.dups = _spill.Spill(os.path.join(work, "dups"), "d", buckets, DUP, buffer=chunk)
        self.bits = int(math.log2(buckets))
        self.broken_path = os.path.join(work, "broken.u1")
        open(self.broken_path, "wb").close()
        self.limit = limit
        self.by_key: Counter[str] = Counter()
        self.by_status: Counter[int] = Counter()
        self.depth: Counter[int] = Counter()
        self.bins = TimeBins()
        self.slowest: list[tuple[float, int]] = []
        self.largest: list[tuple[int, int]] = []
        self.bytes = 0
        self._rows: list[tuple[bytes, int, float, int, int, int]] = []
        self._digests: list[tuple[bytes, int, int]] = []
        self._broken: list[int] = []

    def add(self, page: PageRecord) -> None:
        rid = self.builder.add_page(page)
        key = outcome_key(page.status, page.reason, page.truncated)
        cls = outcome_class(key)
        self.by_key[key] += 1
        self.by_status[page.status] += 1
        self.depth[page.depth] += 1
        error = cls in ERROR_CLASSES
        self.bins.add(page.fetched_at, int(page.status > 0), int(error))
        size = _size(page)
        self.bytes += size
        elapsed = page.elapsed if page.elapsed is not None else math.nan
        blocked = page.reason == outcomes.ROBOTS_DISALLOWED
        self._rows.append((host_key(host_of(page.url)), rid, elapsed, size, error, blocked))
        self._broken.append(page.status >= 400 or (page.status <= 0 and cls not in NOT_BROKEN))
        if page.status == 200 and page.body and not page.truncated:
            self._digests.append((hashlib.sha1(page.body).digest()[:16], rid, len(page.body)))
        if page.elapsed is not None:
            _push(self.slowest, (page.elapsed, -rid), self.limit)
        if size:
            _push(self.largest, (size, -rid), self.limit)
        if len(self._rows) >= _BATCH:
            self.flush()

    def _bucket(self, hi: np.ndarray) -> np.ndarray:
        if self.bits == 0:
            return np.zeros(len(hi), dtype=np.int64)
        return (hi >> np.uint64(64 - self.bits)).astype(np.int64)

    def flush(self) -> None:
        if self._rows:
            keys, rids, elapsed, sizes, errors, blocked = zip(*self._rows, strict=True)
            rows = np.empty(len(rids), dtype=HOST)
            rows["hi"], rows["lo"] = split_keys(b"".join(keys))
            rows["rid"], rows["elapsed"], rows["size"] = rids, elapsed, sizes
            rows["error"], rows["blocked"] = errors, blocked
            self.hosts.add(self._bucket(rows["hi"]), rows)
            _spill.append(self.broken_path, np.array(self._broken, dtype=np.uint8))
            self._rows, self._broken = [], []
        if self._digests:
            digests, rids, sizes = zip(*self._digests, strict=True)
            rows = np.empty(len(rids), dtype=DUP)
            rows["hi"], rows["lo"] = split_keys(b"".join(digests))
            rows["rid"], rows["size"] = rids, sizes
            self.dups.add(self._bucket(rows["hi"]), rows)
            self._digests = []
        self.hosts.flush()
        self.dups.flush()


def _push(heap: list[Any], item: Any, limit: int) -> None:
    if len(heap) < limit:
        heapq.heappush(heap, item)
    elif item > heap[0]:
        heapq.heapreplace(heap, item)


def _hosts(scan: _Scan, graph: Graph, limit: int, chunk: int) -> dict[str, Any]:
    count = 0
    top = np.empty(0, dtype=HOST_GROUPS)
    for b in range(scan.hosts.buckets):
        rows = int(scan.hosts.counts[b])
        if not rows:
            continue
        if rows <= _grouping.MAX_EXACT_ROWS:
            g = exact_hosts(scan.hosts.load(b))
        else:
            g = chunked_hosts(scan.hosts, b, chunk)
        count += len(g)
        top = np.concatenate((top, g))
        top = top[np.lexsort((top["rid"], -top["pages"]))][:limit]
        scan.hosts.remove(b)
    out = []
    for g in top:
        med = float(g["median"])
        out.append({"host": host_of(graph.url_of(int(g["rid"]))), "pages": int(g["pages"]),
                    "errors": int(g["errors"]), "bytes": int(g["bytes"]),
                    "median_fetch_s": None if math.isnan(med) else round(med, 6),
                    "robots_blocked": int(g["blocked"])})
    return {"count": count, "top": out}


def _duplicates(scan: _Scan, graph: Graph, limit: int, urls_per_group: int,
                chunk: int) -> dict[str, Any]:
    groups = pages = wasted = 0
    best: list[tuple[int, int, list[int]]] = []  # (count, size, rids), the largest groups
    for b in range(scan.dups.buckets):
        found = list(dup_groups(scan.dups, b, chunk, urls_per_group))
        groups += len(found)
        pages += sum(c for c, _, _ in found)
        wasted += sum(size * (c - 1) for c, size, _ in found)
        best = heapq.nlargest(limit, [*best, *found], key=lambda t: (t[0], t[1]))
        scan.dups.remove(b)
    return {"groups": groups, "pages": pages, "wasted_bytes": wasted, "top": [
        {"count": c, "bytes": size, "urls": [graph.url_of(r) for r in rids]}
        for c, size, rids in best]}


def _chains(graph: Graph, reader: CrawlReader, limit: int) -> dict[str, Any]:
    pairs = graph.redirects()
    nxt = dict(zip(pairs["src"].tolist(), pairs["dst"].tolist(), strict=True))
    targets = set(nxt.values())
    status = graph.statuses()
    chains: list[dict[str, Any]] = []
    seen: set[int] = set()

    def follow(start: int) -> dict[str, Any]:
        path, on_path, rid = [start], {start}, start
        final: int | None = None
        loop = False
        while True:
            seen.add(rid)
            dst = nxt[rid]
            if dst < 0:  # the Location was never recorded
                break
            if dst in on_path:
                loop = True
                path.append(dst)
                break
            path.append(dst)
            on_path.add(dst)
            if dst not in nxt:  # not a redirect: the chain ends here
                final = int(status[dst])
                break
            rid = dst
        hops = len(path) - 1 if final is not None or loop else len(path)
        return {"rids": path, "hops": hops, "final_status": final, "loop": loop,
                "long": hops > LONG_CHAIN, "ends_unrecorded": final is None and not loop}

    for src in sorted(nxt):
        if src not in targets:
            chains.append(follow(src))
    for src in sorted(nxt):  # what is left: cycles nothing outside points into
        if src not in seen:
            chains.append(follow(src))
    chains.sort(key=lambda c: (not (c["loop"] or c["long"]), -c["hops"], c["rids"][0]))
    shown = []
    for c in chains[:limit]:
        rids = c.pop("rids")
        c["urls"] = [graph.url_of(r) for r in rids]
        if c["ends_unrecorded"]:  # the Location nobody fetched, from the last record
            last = reader.get_key(_key(graph, rids[-1]), with_body=False)
            if last is not None:
                c["urls"].append(last.redirect)
        shown.append(c)
    return {"chains": len(chains), "loops": sum(c["loop"] for c in chains),
            "long": sum(c["long"] for c in chains), "redirects": len(nxt), "list": shown}


def _broken(graph: Graph, scan: _Scan, reader: CrawlReader, limit: int,
            referrers: int) -> dict[str, Any]:
    broken = _spill.memmap(scan.broken_path, np.uint8, graph.n)
    counts: Counter[int] = Counter()
    links = 0
    for part in graph.failed_edges():
        part = part[broken[part["dst"]] == 1]
        links += len(part)
        hit, times = np.unique(part["dst"], return_counts=True)
        counts.update(dict(zip(hit.tolist(), times.tolist(), strict=True)))
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    wanted: dict[int, list[tuple[int, int]]] = {rid: [] for rid, _ in top}
    for part in graph.failed_edges():
        keep = np.isin(part["dst"], np.fromiter(wanted, dtype=np.int64, count=len(wanted)))
        for dst, src, flags in zip(part["dst"][keep].tolist(), part["src"][keep].tolist(),
                                   part["flags"][keep].tolist(), strict=True):
            if len(wanted[dst]) < referrers:
                wanted[dst].append((src, flags))
    status = graph.statuses()
    out = []
    for rid, n in top:
        rec = reader.get_key(_key(graph, rid), with_body=False)
        out.append({"url": graph.url_of(rid), "status": int(status[rid]),
                    "reason": rec.reason if rec is not None else "", "referrers": n,
                    "from": [{"url": graph.url_of(s), "nofollow": bool(f & NOFOLLOW),
                              "redirect": bool(f & REDIRECT)} for s, f in sorted(wanted[rid])]})
    return {"targets": len(counts), "links": links, "list": out}


def _key(graph: Graph, rid: int) -> bytes:
    return _spill.read_slice(graph.path("keys.bin"), np.uint8, rid * 16, 16).tobytes()


def _top_ranked(graph: Graph, limit: int, max_rank: float) -> list[dict[str, Any]]:
    best = np.empty(0, dtype=[("rank", "<f8"), ("rid", "<i8")])
    for b in range(graph.blocks):
        start, end = graph.block_range(b)
        rank = graph.read("rank.f8", np.float64, b)
        k = min(limit, len(rank))
        idx = np.argpartition(-rank, k - 1)[:k] if k else np.empty(0, np.int64)
        part = np.empty(len(idx), dtype=best.dtype)
        part["rank"], part["rid"] = rank[idx], idx + start
        best = np.concatenate((best, part))
        best = best[np.lexsort((best["rid"], -best["rank"]))][:limit]
    status = graph.statuses()
    return [{"url": graph.url_of(int(r)), "rank": float(v),
             "rank_scaled": round(100.0 * v / max_rank, 4) if max_rank else 0.0,
             "status": int(status[int(r)])} for v, r in best if v > 0]


def compute(data_dir: str, *, limit: int = DEFAULT_LIMIT, referrers: int = DEFAULT_REFERRERS,
            rank: bool = True, work_dir: str | None = None, damping: float = DEFAULT_DAMPING,
            tol: float = DEFAULT_TOL, max_iter: int = DEFAULT_MAX_ITER,
            block: int = DEFAULT_BLOCK_NODES, chunk: int = DEFAULT_CHUNK,
            progress: Callable[[int, int], None] | None = None,
            rank_progress: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """The report of the crawl in ``data_dir`` as plain data (what ``--format json``
    prints and the HTML shows). Read-only: works beside a running crawl.
    ``progress(done, total)``: records read so far by the pass, damaged ones included;
    ``rank_progress(iteration, delta)``: PageRank's."""
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="kvcrawl-report-", dir=work_dir)
    try:
        with CrawlReader(data_dir) as reader:
            total = len(reader)
            scan = _Scan(work, total, limit, block, chunk)
            for n, page in enumerate(reader.pages(), 1):
                scan.add(page)
                if progress is not None:
                    progress(n + reader.skipped, total)
            if progress is not None:  # damaged records at the end are read too
                progress(reader.skipped + sum(scan.by_key.values()), total)
            scan.flush()
            graph = scan.builder.finish()
            ranked: dict[str, Any] = {"computed": False}
            if rank:
                result = pagerank(graph, damping=damping, tol=tol, max_iter=max_iter,
                                  chunk=chunk, progress=rank_progress)
                ranked = {"computed": True, "iterations": result.iterations,
                          "delta": result.delta, "converged": result.converged,
                          "damping": damping, "max_rank": result.max_rank,
                          "top": _top_ranked(graph, limit, result.max_rank)}
            info = graph.info
            rows = scan.bins.rows()
            by_class: Counter[str] = Counter()
            for k, n in scan.by_key.items():
                by_class[outcome_class(k)] += n
            report: dict[str, Any] = {
                "crawl": {"dir": os.path.abspath(data_dir), "generated_at": time.time(),
                          "records": info.records, "fetched": info.fetched,
                          "bytes": scan.bytes, "links": info.links,
                          "links_unrecorded": info.unrecorded, "skipped": reader.skipped,
                          "first": rows[0]["t"] if rows else None,
                          "last": rows[-1]["t"] + scan.bins.width if rows else None},
                "outcomes": {"by_class": {c: by_class[c] for c in CLASSES if by_class[c]},
                             "by_key": dict(scan.by_key.most_common()),
                             "by_status": {str(s): n for s, n in sorted(scan.by_status.items())}},
                "timeline": {"bin_seconds": scan.bins.width, "bins": rows},
                "hosts": _hosts(scan, graph, limit, chunk),
                "depth": {str(d): n for d, n in sorted(scan.depth.items())},
                "redirects": _chains(graph, reader, limit),
                "broken": _broken(graph, scan, reader, limit, referrers),
                "duplicates": _duplicates(scan, graph, limit, referrers, chunk),
                "slowest": [{"url": graph.url_of(-r), "elapsed": e}
                            for e, r in sorted(scan.slowest, reverse=True)],
                "largest": [{"url": graph.url_of(-r), "bytes": s}
                            for s, r in sorted(scan.largest, reverse=True)],
                "rank": ranked,
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["crawl"]["seconds"] = round(time.monotonic() - started, 3)
    return report


__all__ = ["DEFAULT_LIMIT", "DEFAULT_REFERRERS", "ERROR_CLASSES", "LONG_CHAIN", "TimeBins",
           "compute"]
