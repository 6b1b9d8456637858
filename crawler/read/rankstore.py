"""Reading the rank store ``DIR/rank`` that ``python -m crawler rank`` leaves (crawler.read.rank).

A lookup by url_key is a binary search in the sorted key index (two u64
array files, memory-mapped: a lookup touches ~log2(N) pages, and the OS page
cache, not the process, keeps them), then one read in the per-rid arrays. The
ranks are those of the snapshot the rank run read: a page recorded since has
none (``None``) until the next run; ``records`` says how many the run saw.

Thread safety: for one thread (numpy memmaps are read-only, but keep it simple).
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..exceptions import DataDirError
from ..state.jsonfile import read_json
from . import _spill
from .graph import META_NAME, match
from .rank import RANK_DIR, RANK_META

_ORDER_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class Rank:
    raw: float  # PageRank, the N fetched pages summing to 1
    scaled: float  # 100 * raw / the strongest page's raw rank
    inlinks: int  # records linking or redirecting here (any flag) at rank time


class RankStore:
    """The ranks of one crawl. A context manager (nothing to release but maps)."""

    def __init__(self, data_dir: str) -> None:
        self.dir = os.path.join(data_dir, RANK_DIR)
        again = f"run python -m crawler rank {data_dir} again"
        try:
            self.meta: dict[str, Any] = read_json(os.path.join(self.dir, RANK_META),
                                                  "a rank store's metadata", again)
            self.graph: dict[str, Any] = read_json(os.path.join(self.dir, META_NAME),
                                                   "a link graph's metadata", again)
        except FileNotFoundError as exc:
            raise DataDirError(f"{self.dir}: not a rank store ({exc.strerror}: "
                               f"{exc.filename}); {again}") from None
        n = self.graph.get("records") if isinstance(self.graph, dict) else None
        top = self.meta.get("max_rank") if isinstance(self.meta, dict) else None
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0
                and isinstance(top, int | float) and not isinstance(top, bool)
                and math.isfinite(top)):
            raise DataDirError(f"{self.dir}: damaged (records {str(n)[:40]}, max_rank "
                               f"{str(top)[:40]}); {again}")
        self.n: int = n
        self.max_rank = float(top) or 1.0
        try:
            # its ranks, 8 bytes a record, hold n: an n no file holds (graph.json's records
            # 10**19) is refused here, before a map's size overflows (numpy: a warning
            # and an OverflowError)
            size = os.path.getsize(self._path("rank.f8"))
            if n > size // 8:
                raise ValueError(f"records {n} in graph.json, rank.f8 holds {size // 8}")
            self._map(n)
        except (OSError, ValueError) as exc:  # a file missing, or shorter than n records
            raise DataDirError(f"{self.dir}: damaged ({exc}); {again}") from None

    def _map(self, n: int) -> None:
        self._hi = _spill.memmap(self._path("index.hi.u8"), np.uint64, n)
        self._lo = _spill.memmap(self._path("index.lo.u8"), np.uint64, n)
        self._rid = _spill.memmap(self._path("index.rid.u8"), np.uint64, n)
        self._inlinks = _spill.memmap(self._path("index.inlinks.u4"), np.uint32, n)
        self._rank = _spill.memmap(self._path("rank.f8"), np.float64, n)
        self._status = _spill.memmap(self._path("status.i2"), np.int16, n)
        self._urloff = _spill.memmap(self._path("urloff.u8"), np.uint64, n + 1)
        self._keys = _spill.memmap(self._path("keys.bin"), np.uint8, n * 16)
        # mapped: a URL is a slice of it, a batch of them no read call each
        with open(self._path("urls.bin"), "rb") as f:
            self._urls: mmap.mmap | bytes = (
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                if os.fstat(f.fileno()).st_size else b"")
        self.ordered_count = os.path.getsize(self._path("order.u8")) // 8

    @classmethod
    def open(cls, data_dir: str) -> RankStore | None:
        """The store of ``data_dir``, or None when no rank run left one."""
        if not os.path.exists(os.path.join(data_dir, RANK_DIR, RANK_META)):
            return None
        return cls(data_dir)

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def close(self) -> None:
        if isinstance(self._urls, mmap.mmap):
            self._urls.close()

    def __enter__(self) -> RankStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rid(self, key: bytes) -> int | None:
        """The record id of ``key`` in the ranked snapshot, or None."""
        pos = self._pos(key)
        return None if pos is None else int(self._rid[pos])

    def _pos(self, key: bytes) -> int | None:
        """Where ``key`` is in the sorted index (equal high halves walked), or None. A
        key's halves as numpy scalars made from Python ints: numpy's own conversion of
        one key cost 3x the search."""
        h = np.uint64(int.from_bytes(key[:8], "big"))  # (a Python int above 2**63 would
        lo_ = np.uint64(int.from_bytes(key[8:16], "big"))  # make numpy search as floats)
        hi = self._hi
        i = int(hi.searchsorted(h))
        while i < self.n and hi[i] == h:
            if self._lo[i] == lo_:
                return i
            i += 1
        return None

    def get(self, key: bytes) -> Rank | None:
        """The rank of ``key``; None when it was not ranked (no record then, or no
        HTTP answer)."""
        pos = self._pos(key)
        if pos is None:
            return None
        rid = int(self._rid[pos])
        if self._status[rid] <= 0:
            return None
        raw = float(self._rank[rid])
        return Rank(raw, 100.0 * raw / self.max_rank, int(self._inlinks[pos]))

    def url_of(self, rid: int) -> str:
        start, end = int(self._urloff[rid]), int(self._urloff[rid + 1])
        return self._urls[start:end].decode("utf-8")

    def key_of(self, rid: int) -> bytes:
        return bytes(self._keys[rid * 16 : rid * 16 + 16])

    def url(self, key: bytes) -> str | None:
        """The URL of a recorded key (the Resolver's fast table), or None."""
        rid = self.rid(key)
        return None if rid is None else self.url_of(rid)

    def _match(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in the sorted index, found) of ``keys``, an (n, 16) uint8 array of
        url_keys: one vectorized search (export looks up a batch of pages at once)."""
        halves = np.ascontiguousarray(keys).view(">u8")
        return match(self._hi, self._lo, halves[:, 0].astype(np.uint64),
                     halves[:, 1].astype(np.uint64))

    def urls(self, keys: np.ndarray) -> list[str | None]:
        """The URLs of ``keys`` (an (n, 16) uint8 array), None for a key the snapshot had
        no record of."""
        out: list[str | None] = [None] * len(keys)
        if not len(keys) or not self.n:
            return out
        pos, found = self._match(keys)
        rids = self._rid[pos[found]].astype(np.int64)
        starts, ends = self._urloff[rids].tolist(), self._urloff[rids + 1].tolist()
        urls = self._urls
        for i, start, end in zip(np.flatnonzero(found).tolist(), starts, ends, strict=True):
            out[i] = urls[start:end].decode("utf-8")
        return out

    def ranks(self, keys: np.ndarray) -> list[Rank | None]:
        """What ``get`` says of each of ``keys`` (an (n, 16) uint8 array)."""
        out: list[Rank | None] = [None] * len(keys)
        if not len(keys) or not self.n:
            return out
        pos, found = self._match(keys)
        at = pos[found]
        rids = self._rid[at].astype(np.int64)
        for i, raw, inlinks, answered in zip(
                np.flatnonzero(found).tolist(), self._rank[rids].tolist(),
                self._inlinks[at].tolist(), (self._status[rids] > 0).tolist(), strict=True):
            if answered:
                out[i] = Rank(raw, 100.0 * raw / self.max_rank, inlinks)
        return out

    def ordered(self, limit: int | None = None) -> Iterator[tuple[int, str, float]]:
        """(rid, URL, raw rank) of the ranked pages, strongest first."""
        total = self.ordered_count if limit is None else min(limit, self.ordered_count)
        for i in range(0, total, _ORDER_CHUNK):
            rids = _spill.read_slice(self._path("order.u8"), np.uint64, i,
                                     min(_ORDER_CHUNK, total - i))
            for rid in rids.tolist():
                yield rid, self.url_of(rid), float(self._rank[rid])

    def describe(self) -> str:
        m = self.meta
        return (f"ranks of {m['records']} records ({self.graph['fetched']} ranked) from "
                f"{m['iterations']} iterations, L1 change {m['delta']:.3g}")


__all__ = ["Rank", "RankStore"]
