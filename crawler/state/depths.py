"""URL depths: the smallest depth each admitted URL is known at (``--max-depth`` BFS-exact).

Theory of operation
-------------------
Pages come back in whatever order their hosts answer, so a URL is often
admitted first by a long path (a fast host's chain of links) and only later
offered by a short one (a slow host's page). Admission drops the second offer
as known; under ``--max-depth`` the URL would keep its larger depth, and the
pages below it that the limit cuts would be lost although a shorter path
reaches them. A breadth-first crawl fetches them; so do we.

This module remembers, for every admitted URL, the smallest depth it was
offered at: an in-memory ``kvstore.KeyIntMap`` of width 2 (18 bytes a slot,
about 23 a URL), kept only when the crawl has a ``--max-depth``. Its durable
form is ``depths.bin`` in the data directory: append-only records of a
url_key and a depth (18 bytes), one for every admitted URL and one for every
improvement, written always (a crawl resumed with ``--max-depth`` then knows
its old URLs). The last record of a key holds its depth: a record is only
ever appended for a fresh URL or a smaller depth. A record cut by a kill is
ignored on open (and cut off before the next append).

``improve`` finds the offers that beat a known depth; the frontier
(crawler.state.frontier) decides what an improvement means for the URL:
pending, nothing to write (``claim`` gives it the remembered depth); done,
its stored page is read again and its links offered at the new depth; in
flight, the same once its outcome is committed. Depths only shrink and are at
least 0, so improvements end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import numpy as np

import kvstore

from ..exceptions import CrawlerError
from .admission import keys_array
from .pages import Pending
from .recordlog import RecordLog, keys_of

__all__ = ["DEPTHS_NAME", "MAX_TRACKED_DEPTH", "Depths", "Expand"]

log = logging.getLogger(__name__)

Link = tuple[bytes, Pending]
# A stored page record read again as fetched for an entry: (the record, its links).
Expand = Callable[[bytes, Pending], tuple[bytes, list[Link]]]
Route = Callable[[list[Link]], list[Link]]

DEPTHS_NAME = "depths.bin"
# A width-2 map holds 0..32767; a deeper URL is remembered at this depth (never
# offered again at a smaller one than that in practice).
MAX_TRACKED_DEPTH = 32_767


class Depths:
    """The depth map of one frontier. ``track``: keep the map in memory (a crawl with a
    ``--max-depth``); without it only ``depths.bin`` is written. The committer's alone:
    not thread-safe, except ``get`` (a lock-free lookup)."""

    def __init__(self, data_dir: str, *, track: bool) -> None:
        self.map: kvstore.KeyIntMap | None = kvstore.KeyIntMap(width=2) if track else None
        self.improved = 0  # improvements this run
        self.log = RecordLog(os.path.join(data_dir, DEPTHS_NAME), "depth", "<u2")
        if self.map is not None:
            for rec in self.log.chunks():  # later records win
                self.map.put_many(keys_of(rec), rec["depth"].astype(np.int64))

    @property
    def tracking(self) -> bool:
        return self.map is not None

    def get(self, key: bytes) -> int:
        """The key's remembered depth, or -1 (not tracked, or not known)."""
        return -1 if self.map is None else self.map.get(key, -1)

    def fold(self, keys: np.ndarray, depths: list[int]) -> None:
        """Remember depths met outside the log (a crawl that predates it): each only
        where it beats what is known. ``keys``: (n, 16) uint8 rows."""
        if self.map is None or not len(keys):
            return
        offered = np.minimum(np.asarray(depths, dtype=np.int64), MAX_TRACKED_DEPTH)
        known = self.map.get_many(keys)
        better = (known < 0) | (offered < known)
        if better.any():
            self.map.put_many(keys[better], offered[better])

    def improve(
        self, offers: list[tuple[bytes, Pending]]
    ) -> tuple[list[tuple[bytes, Pending]], list[tuple[bytes, Pending]]]:
        """(the offers, one per key: its smallest depth, in first-offer order; the
        ones of keys known at a larger depth, now remembered at the offered one).
        Unknown keys are left to admission. Not tracking: (``offers``, [])."""
        if self.map is None or not offers:
            return offers, []
        best: dict[bytes, Pending] = {}
        for k, e in offers:
            have = best.get(k)
            if have is None or e.depth < have.depth:
                best[k] = e
        keys = list(best)
        offered = np.fromiter((best[k].depth for k in keys), dtype=np.int64, count=len(keys))
        offered = np.minimum(offered, MAX_TRACKED_DEPTH)
        known = self.map.get_many(keys_array(keys))
        better = np.flatnonzero((known >= 0) & (offered < known)).tolist()
        reduced = list(best.items())
        if not better:
            return reduced, []
        won = [(keys[i], best[keys[i]]) for i in better]
        self.map.put_many(keys_array([k for k, _ in won]), offered[better])
        self.improved += len(won)
        self.log.stage((k, min(e.depth, MAX_TRACKED_DEPTH)) for k, e in won)
        return reduced, won

    def deepen(
        self,
        offers: list[tuple[bytes, Pending]],
        stored: dict[bytes, tuple[bytes, Pending]],
        main: kvstore.Store,
        route: Route,
        expand: Expand | None,
    ) -> tuple[list[tuple[bytes, Pending]], dict[bytes, bytes]]:
        """One commit's improvements, to a fixed point: (the offers, reduced to the
        smallest depth of each key and with the links of re-read pages added; the
        page records to write again, by key, at their new depth).

        ``stored``: the batch's page records (key -> (record, the entry it was
        fetched as)); ``main``: MainDB, where done pages are read again; ``route``
        keeps this shard's links (the outbox takes the others); ``expand`` reads a
        stored page again as if fetched at the entry's depth: (the record at that
        depth, its links). Without ``expand`` only the map learns."""
        rewrites: dict[bytes, bytes] = {}
        at = {k: e.depth for k, (_, e) in stored.items()}  # depth each record is at
        out: list[tuple[bytes, Pending]] = []
        todo = offers
        while todo:
            reduced, won = self.improve(todo)
            out += reduced
            extra: list[tuple[bytes, Pending]] = []
            if expand is None:
                break
            for k, e in won:
                if k in stored:
                    continue  # re-read below, with the rest of the batch
                record = rewrites.get(k)
                if record is None and k in main:
                    record = main[k]
                if record is not None:  # else pending (claim gives it the depth) or in flight
                    extra += self._expand(expand, k, record, e, rewrites)
            for k, (record, e) in stored.items():
                d = self.get(k)
                if 0 <= d < at[k]:  # improved while in flight, or in this commit
                    at[k] = d
                    extra += self._expand(expand, k, rewrites.get(k, record), e._replace(depth=d),
                                          rewrites)
            todo = route(extra)
        if len(out) != len(offers):  # links were added: reduce once more
            out, _ = self.improve(out)
        return out, rewrites

    def _expand(
        self, expand: Expand, key: bytes, record: bytes, entry: Pending,
        rewrites: dict[bytes, bytes],
    ) -> list[tuple[bytes, Pending]]:
        try:
            rewrites[key], links = expand(record, entry)
        except CrawlerError as exc:  # a damaged record: it keeps its depth
            log.warning("%s: %s", entry.url, exc)
            return []
        return links

    def admit(self, keys: list[bytes], entries: list[Pending]) -> None:
        """Remember freshly admitted URLs at their depths (``write`` logs them)."""
        if not keys:
            return
        depths = [min(e.depth, MAX_TRACKED_DEPTH) for e in entries]
        if self.map is not None:
            self.map.put_many(keys_array(keys), depths)
        self.log.stage(zip(keys, depths, strict=True))

    def write(self) -> None:
        """Append the records of this commit's admissions and improvements and flush
        them to the OS (raises OSError). The frontier calls it once their links are
        in PendDB and before page records at the new depths reach MainDB."""
        self.log.write()
