"""Moving one crawl's per-shard state to the owners of a new shard count (``reshard``).

Theory of operation
-------------------
crawler.state.reshard decides *when* (the build in ``DIR/.reshard-tmp``, the
commit point, the swap); this module does the *moving*: it reads the old
shards, never writes them, and writes the new shards' files from scratch.
Everything is routed by the owner of its URL's host (crawler.state.shards,
the same Router the frontier uses), shard by shard and store by store, in a
stream: memory holds the kvstore key indexes of the new stores, one PendSet
(crawler.state.pendset, 9 bytes a URL) per new shard, and bounded buffers.

Per old shard, in this order (each step may look up what the earlier ones wrote):

* MainDB: each record (read whole, CRC-checked) goes to its URL's owner under
  the same key; the owner's counters (crawler.state.tally) count it.
* PendDB: each bulk's URLs are split by owner and written again as new bulks
  of ``DEFAULT_BULK_SIZE`` (depth, hops, attempts kept); the new PendSets get
  their keys, and a URL with no record yet counts as pending.
* ``depths.bin`` and ``due.bin`` are keyed by url_key without the URL: a
  record goes to the new shard whose MainDB or PendSet holds the key (each key
  is in exactly one), in file order, so the last record of a key still wins.
* ``prior/`` (recrawl) by the record's URL; BadHosts by its host; sitemaps by
  the sitemap's URL; ``urls.log`` line by line.
* robots.txt answers are keyed by md5 of ``scheme://host:port``, which cannot
  be inverted: the origins of ``urls.log`` (every admitted URL) find them. An
  answer whose origin is in no log line is dropped: it is advisory, and costs
  one robots.txt fetch at the next start.
* cookies (one record per site, crawler.state.cookiestore): a host-only cookie
  goes to its host's owner; a domain cookie to every new shard (its hosts may
  now be anywhere), merged with what is there by name, domain and path.

Then the outboxes of every old shard: each waiting link is admitted by its new
owner as the frontier's admission would, deduplicated against that owner's
MainDB and PendSet: a known URL is dropped, a new one goes into a new bulk,
``urls.log`` and ``depths.bin``. A shorter depth that a link brings for a URL
its owner knows already is logged in ``depths.bin`` (a pending URL is claimed
at it; a done page is not read again, as the live frontier would: see
docs/SHARDS.md). The ProcessingSet is memory only: nothing to move.

Not thread-safe: one reshard at a time (the crawl's locks see to it).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np

import kvstore

from ..exceptions import CrawlerError, DataDirError, URLError
from ..outcomes import outcome_key
from ..web.cookies import MAX_COOKIES_PER_SITE, Cookie
from ..web.urls import parse, url_key
from .admission import keys_array
from .badhosts import BAD_HOSTS_NAME
from .cookiestore import COOKIES_NAME, decode_site, encode_site
from .depths import DEPTHS_NAME, MAX_TRACKED_DEPTH
from .due import DUE_NAME
from .frontier import DEFAULT_BULK_SIZE, URL_LOG_NAME
from .jsonfile import fsync_path
from .outbox import OUTBOX_NAME
from .outcomelog import OutcomeLog
from .pages import PageRecord, Pending, decode_bulk, decode_page_head, put_bulks
from .pendset import PendSet
from .retry import MAIN_NAME, PEND_NAME, PRIOR_NAME
from .robotsstore import ROBOTS_STORE_NAME, store_key
from .shards import Router, ShardPlace, owner
from .sitemapstore import SITEMAP_STORE_NAME, decode_sitemap
from .tally import Tally, shard_stamp, write_counts

log = logging.getLogger(__name__)

# The stores a shard directory may hold, opened for the move when present.
OPTIONAL_STORES = (BAD_HOSTS_NAME, ROBOTS_STORE_NAME, SITEMAP_STORE_NAME, COOKIES_NAME,
                   PRIOR_NAME, OUTBOX_NAME)
_LOGS = {DEPTHS_NAME: np.dtype([("key", "V16"), ("depth", "<u2")]),
         DUE_NAME: np.dtype([("key", "V16"), ("due", "<i8")])}
_CHUNK = 1 << 16  # records of a depths/due log, URL-log bytes, store puts: one batch
_BUFFER = 8 << 20  # kvstore append buffer of each store opened here
_RECENT_ORIGINS = 1 << 16  # origins of urls.log remembered before the cache starts over

Checkpoint = Callable[[str], None]


def _no_checkpoint(name: str) -> None:
    pass


def open_store(path: str, *, create: bool = False) -> kvstore.Store:
    """A store of an old or new shard, for writing (its lock keeps a crawl out). One
    DataDirError line when a crawl holds it or it is damaged."""
    try:
        return kvstore.open(path, buffer_size=_BUFFER)
    except kvstore.exceptions.StoreLockedError:
        raise DataDirError(f"{path}: a crawl is running on this data directory: stop it "
                           "(Ctrl-C) and run reshard again") from None
    except kvstore.exceptions.KVStoreError as exc:
        what = "cannot be created" if create else "is damaged"
        raise DataDirError(f"{path} {what} ({exc}): python -m kvstore verify {path} says "
                           "more; nothing was changed") from None


class OldShard:
    """One shard of the old layout, its stores open (and locked), read only."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stores: dict[str, kvstore.Store] = {}
        try:
            for name in (MAIN_NAME, PEND_NAME, *OPTIONAL_STORES):
                if os.path.isdir(os.path.join(path, name)):
                    self.stores[name] = open_store(os.path.join(path, name))
        except BaseException:
            self.close()
            raise

    def get(self, name: str, key: bytes) -> bytes:
        """A value, read whole and CRC-checked; a damaged one stops the reshard."""
        try:
            return self.stores[name][key]
        except kvstore.exceptions.KVStoreError as exc:
            raise DataDirError(f"{os.path.join(self.path, name)}: record {key.hex()} is "
                               f"damaged ({exc}): python -m kvstore verify says more; "
                               "reshard stopped, the crawl is as it was") from None

    def records(self, name: str) -> Iterator[tuple[bytes, bytes]]:
        store = self.stores.get(name)
        for key in store if store is not None else ():
            yield key, self.get(name, key)

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.stores = {}


class NewShard:
    """One shard of the new layout, written from nothing in the reshard's work directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.stores: dict[str, kvstore.Store] = {}
        self.main = self.store(MAIN_NAME)
        self.pend = self.store(PEND_NAME)
        self.store(BAD_HOSTS_NAME)
        self.outcomes = OutcomeLog(path)  # rows for the new MainDB's versions
        self.pend_set = PendSet()
        self.tally = Tally()
        self.counter = 0  # the next PendDB bulk key
        self._waiting: list[Pending] = []  # entries not yet in a full bulk
        self.offered: dict[bytes, int] = {}  # outbox links known here: the smallest depth
        self._files: dict[str, BinaryIO] = {}

    def store(self, name: str) -> kvstore.Store:
        """The store ``name`` of this shard, created at its first use."""
        store = self.stores.get(name)
        if store is None:
            store = self.stores[name] = open_store(os.path.join(self.path, name), create=True)
        return store

    def file(self, name: str) -> BinaryIO:
        f = self._files.get(name)
        if f is None:
            f = self._files[name] = open(os.path.join(self.path, name), "ab")  # noqa: SIM115
        return f

    def add_pending(self, entries: list[Pending], keys: list[bytes]) -> None:
        """Entries of live bulks: queued for bulks of DEFAULT_BULK_SIZE; a URL neither
        recorded nor pending yet counts as pending."""
        if not keys:
            return
        arr = keys_array(keys)
        known = (self.main.contains_many(arr) | self.pend_set.contains_many(arr)).tolist()
        fresh = {k for k, old in zip(keys, known, strict=True) if not old}
        self.tally.pending += len(fresh)
        self.pend_set.add_many(arr)
        self._waiting += entries
        if len(self._waiting) >= _CHUNK:
            self.write_bulks(whole_only=True)

    def write_bulks(self, *, whole_only: bool = False) -> None:
        size = DEFAULT_BULK_SIZE
        cut = len(self._waiting) - len(self._waiting) % size if whole_only else len(self._waiting)
        todo, self._waiting = self._waiting[:cut], self._waiting[cut:]
        _, self.counter = put_bulks(self.pend, todo, self.counter, size)

    def finish(self) -> None:
        """Everything written, fsynced and closed; then the counters, stamped."""
        self.write_bulks()
        self.tally.pending_bulks = len(self.pend)
        self.outcomes.write()
        self.outcomes.sync()
        self.outcomes.close()
        for store in self.stores.values():
            store.sync()
            store.close()
        for f in self._files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        write_counts(self.path, self.tally, shard_stamp(self.path))
        fsync_path(os.path.join(self.path, "counts.json"))
        for name in os.listdir(self.path):  # the stores' directories and this one
            if os.path.isdir(os.path.join(self.path, name)):
                fsync_path(os.path.join(self.path, name))
        fsync_path(self.path)

    def abandon(self) -> None:
        self.outcomes.abandon()
        for store in self.stores.values():
            store.abandon()
        for f in self._files.values():
            f.close()


class Mover:
    """Routes the state of old shards into ``new`` (the new layout's shards, in order)."""

    def __init__(self, new: list[NewShard], checkpoint: Checkpoint = _no_checkpoint) -> None:
        self.new = new
        self.router = Router(ShardPlace(0, len(new)))
        self.checkpoint = checkpoint
        self.moved: dict[str, int] = {}  # what went where, counted for the report
        self.dropped_robots = 0

    def _count(self, what: str, n: int = 1) -> None:
        self.moved[what] = self.moved.get(what, 0) + n

    def owner_of(self, url: str) -> int:
        return self.router.owner_of(url)

    # -- one old shard ---------------------------------------------------------------------

    def move_shard(self, old: OldShard) -> None:
        self._main(old)
        self._pend(old)
        for name, dtype in _LOGS.items():
            self._keyed_log(old, name, dtype)
        self._by_url(old, PRIOR_NAME, lambda v: _page_url(v))
        self._by_url(old, SITEMAP_STORE_NAME, lambda v: decode_sitemap(v)["url"])
        self._bad_hosts(old)
        self._cookies(old)
        self._url_log(old)

    def _main(self, old: OldShard) -> None:
        batches: list[list[tuple[bytes, bytes, PageRecord]]] = [[] for _ in self.new]
        for key, value in old.records(MAIN_NAME):
            try:
                page = decode_page_head(value)
                if isinstance(page, int):  # shorter than its own head says
                    raise CrawlerError(f"cut at {len(value)} bytes, its head ends at {page}")
            except (CrawlerError, ValueError, TypeError) as exc:
                raise DataDirError(f"{old.path}/main: record {key.hex()} is not a page record "
                                   f"({exc}): reshard stopped, the crawl is as it was") from None
            dest = self.owner_of(page.url)
            self.new[dest].tally.count(page.status,
                                       outcome_key(page.status, page.reason, page.truncated))
            batch = batches[dest]
            batch.append((key, value, page))
            if len(batch) >= 256:
                self._put(self.new[dest], batch)
            self.checkpoint("record")
        for dest, batch in enumerate(batches):
            self._put(self.new[dest], batch)

    def _put(self, shard: NewShard, batch: list[tuple[bytes, bytes, PageRecord]]) -> None:
        if batch:
            keys = [k for k, _, _ in batch]
            shard.main.put_many(keys, [v for _, v, _ in batch])
            shard.outcomes.note(shard.main, keys, [p for _, _, p in batch])  # new versions
            shard.outcomes.write()
            self._count("pages", len(batch))
            batch.clear()

    def _pend(self, old: OldShard) -> None:
        for _, value in old.records(PEND_NAME):
            entries = decode_bulk(value)
            self._route_entries(entries, admit=False)
            self._count("pending URLs", len(entries))

    def _route_entries(self, entries: list[Pending], *, admit: bool) -> int:
        """Entries to their owners: as live bulks (``admit`` False), or admitted as new
        links (deduplicated, logged in urls.log and depths.bin); how many went in."""
        split: list[tuple[list[Pending], list[bytes]]] = [([], []) for _ in self.new]
        for e in entries:
            to = split[self.owner_of(e.url)]
            to[0].append(e)
            to[1].append(url_key(e.url))
        went = 0
        for shard, (part, keys) in zip(self.new, split, strict=True):
            if not admit:
                shard.add_pending(part, keys)
                continue
            fresh = _admissible(shard, part, keys)
            if fresh:
                entries_in = [e for e, _ in fresh]
                keys_in = [k for _, k in fresh]
                shard.add_pending(entries_in, keys_in)
                shard.file(URL_LOG_NAME).write("".join(e.url + "\n" for e in entries_in)
                                               .encode("utf-8"))
                rec = np.empty(len(fresh), dtype=_LOGS[DEPTHS_NAME])
                rec["key"] = np.frombuffer(b"".join(keys_in), dtype="V16")
                rec["depth"] = [min(e.depth, MAX_TRACKED_DEPTH) for e in entries_in]
                shard.file(DEPTHS_NAME).write(rec.tobytes())
                went += len(fresh)
        return went

    def _keyed_log(self, old: OldShard, name: str, dtype: np.dtype) -> None:
        """depths.bin or due.bin: each record to the shard that holds its key."""
        path = os.path.join(old.path, name)
        if not os.path.exists(path):
            return
        whole = os.path.getsize(path) // dtype.itemsize * dtype.itemsize  # a cut tail: torn
        with open(path, "rb") as f:
            done = 0
            while done < whole:
                rec = np.frombuffer(f.read(min(_CHUNK * dtype.itemsize, whole - done)),
                                    dtype=dtype)
                done += rec.nbytes
                keys = np.frombuffer(rec["key"].tobytes(), dtype=np.uint8).reshape(-1, 16)
                left = np.ones(len(rec), dtype=bool)
                for shard in self.new:
                    mine = left & (shard.main.contains_many(keys)
                                   | shard.pend_set.contains_many(keys))
                    if mine.any():
                        shard.file(name).write(rec[mine].tobytes())
                        left &= ~mine
                self._count(name, int((~left).sum()))

    def _by_url(self, old: OldShard, name: str, url_of: Callable[[bytes], str]) -> None:
        """A store keyed by url_key whose values name their URL (prior/, sitemaps/)."""
        for key, value in old.records(name):
            try:
                url = url_of(value)
            except (CrawlerError, ValueError, TypeError, KeyError) as exc:
                if name == PRIOR_NAME:
                    raise DataDirError(f"{old.path}/{name}: record {key.hex()} is damaged "
                                       f"({exc}): reshard stopped, the crawl is as it was"
                                       ) from None
                log.warning("%s/%s: record %s dropped (%s)", old.path, name, key.hex(), exc)
                continue
            self.new[self.owner_of(url)].store(name)[key] = value
            self._count(name)

    def _bad_hosts(self, old: OldShard) -> None:
        for key, value in old.records(BAD_HOSTS_NAME):
            try:
                host = json.loads(value)["host"]
                dest = owner(str(host), len(self.new))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("%s/badhosts: entry %s dropped (%s)", old.path, key.hex(), exc)
                continue
            self.new[dest].store(BAD_HOSTS_NAME)[key] = value
            self._count("bad hosts")

    def _cookies(self, old: OldShard) -> None:
        for key, value in old.records(COOKIES_NAME):
            try:
                site, cookies = decode_site(value)
            except ValueError as exc:  # advisory state, as the jar itself reads it
                log.warning("%s/cookies: record %s dropped (%s)", old.path, key.hex(), exc)
                continue
            parts: list[list[Cookie]] = [[] for _ in self.new]
            for c in cookies:
                if c.host_only:
                    parts[owner(c.domain, len(self.new))].append(c)
                else:  # a domain cookie: its hosts may now be on any shard
                    for part in parts:
                        part.append(c)
            for shard, part in zip(self.new, parts, strict=True):
                if part:
                    store = shard.store(COOKIES_NAME)
                    have = decode_site(store[key])[1] if key in store else []
                    store[key] = encode_site(site, merge_cookies(have, part))
            self._count("cookie sites")

    def _url_log(self, old: OldShard) -> None:
        """urls.log line by line; and the robots.txt answers of the origins it names."""
        path = os.path.join(old.path, URL_LOG_NAME)
        if not os.path.exists(path):
            return
        robots = old.stores.get(ROBOTS_STORE_NAME)
        moved = kvstore.KeySet()
        seen: set[str] = set()
        with open(path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # a line cut by a kill or a full disk
                url = raw[:-1].decode("utf-8", "replace")
                dest = self.owner_of(url)
                self.new[dest].file(URL_LOG_NAME).write(raw)
                if robots is None or not len(robots):
                    continue
                origin = url[: url.find("/", url.find("//") + 2)]
                if origin in seen:
                    continue
                if len(seen) >= _RECENT_ORIGINS:
                    seen.clear()
                seen.add(origin)
                try:
                    rk = store_key(parse(url).robots_key)
                except URLError:
                    continue
                if rk in robots and rk not in moved:
                    moved.add(rk)
                    self.new[dest].store(ROBOTS_STORE_NAME)[rk] = old.get(ROBOTS_STORE_NAME, rk)
        if robots is not None:
            self._count("robots answers", len(moved))
            self.dropped_robots += len(robots) - len(moved)

    # -- the outboxes, after every old shard's frontier ------------------------------------

    def admit_outbox(self, old: OldShard) -> None:
        for _, value in old.records(OUTBOX_NAME):
            entries = decode_bulk(value)
            self._count("outbox links", len(entries))
            self._count("outbox links admitted", self._route_entries(entries, admit=True))

    def improve_depths(self) -> None:
        """After the outboxes: a link known to its owner at a larger depth than it came
        with gets a ``depths.bin`` record at the smaller one, as the frontier's
        admission would (a pending URL is then claimed at it; a done page is not read
        again: docs/SHARDS.md)."""
        dtype = _LOGS[DEPTHS_NAME]
        for shard in self.new:
            if not shard.offered:
                continue
            offered = shard.offered
            wanted = kvstore.KeySet()
            wanted.add_many(keys_array(list(offered)))
            last: dict[bytes, int] = {}
            f = shard.file(DEPTHS_NAME)
            f.flush()
            path = os.path.join(shard.path, DEPTHS_NAME)
            with open(path, "rb") as log_file:
                while chunk := log_file.read(_CHUNK * dtype.itemsize):
                    rec = np.frombuffer(chunk, dtype=dtype)
                    keys = np.frombuffer(rec["key"].tobytes(), dtype=np.uint8).reshape(-1, 16)
                    for i in np.flatnonzero(wanted.contains_many(keys)).tolist():
                        last[keys[i].tobytes()] = int(rec["depth"][i])
            better = [(k, d) for k, d in offered.items()
                      if k in last and min(d, MAX_TRACKED_DEPTH) < last[k]]
            if better:
                rec = np.empty(len(better), dtype=dtype)
                rec["key"] = np.frombuffer(b"".join(k for k, _ in better), dtype="V16")
                rec["depth"] = [min(d, MAX_TRACKED_DEPTH) for _, d in better]
                f.write(rec.tobytes())
                self._count("shorter depths", len(better))


def _admissible(shard: NewShard, entries: list[Pending],
                keys: list[bytes]) -> list[tuple[Pending, bytes]]:
    """The entries a frontier's admission would let in: first offer of each key, known
    neither to MainDB nor to the PendSet."""
    if not keys:
        return []
    arr = keys_array(keys)
    known = (shard.main.contains_many(arr) | shard.pend_set.contains_many(arr)).tolist()
    out: dict[bytes, Pending] = {}
    for e, k, old in zip(entries, keys, known, strict=True):
        if old:  # its depth may still be news (improve_depths)
            offered = shard.offered.get(k)
            shard.offered[k] = e.depth if offered is None else min(offered, e.depth)
        elif k not in out:
            out[k] = e
    return [(e, k) for k, e in out.items()]


def _page_url(value: bytes) -> str:
    page = decode_page_head(value)
    if isinstance(page, int):
        raise CrawlerError("page record cut in its header")
    return page.url


def merge_cookies(have: list[Cookie], more: list[Cookie]) -> list[Cookie]:
    """One site's cookies from two shards: one per (name, domain, path), the newer
    (by creation, then value) kept; at most MAX_COOKIES_PER_SITE, the oldest dropped."""
    best: dict[tuple[str, str, str], Cookie] = {}
    for c in have + more:
        k = (c.name, c.domain, c.path)
        if k not in best or (c.created, c.value) > (best[k].created, best[k].value):
            best[k] = c
    out = sorted(best.values(), key=lambda c: (c.created, c.name, c.domain, c.path))
    return out[-MAX_COOKIES_PER_SITE:]

