"""Re-queue recorded failures, so that the next ``start`` fetches them again.

Every outcome of a URL is final once it is in MainDB: the next claim of the URL
skips it (Frontier.claim). To try a failure again its record must go and the URL
must be pending again. :func:`requeue` does that for the records a
:class:`Selection` picks, shard by shard (each shard's records go back to that
shard's PendDB: the shard owns the host), and clears the BadHosts entries of
their hosts (otherwise a ``tls`` or ``connect_refused`` host would stay bad
until its retry time and its URLs would be recorded ``bad_host:...`` again
without a request). For a record that robots.txt decided (``robots_*``), the
host's kept robots.txt answer (crawler.state.robotsstore, trusted 24 h) is
forgotten too: a retry after the site changed its robots.txt must read the new
one, not be refused again by the old.

Theory of operation
-------------------
The invariant (DESIGN §4.3): an admitted URL is, on disk, in a live PendDB bulk
or done in MainDB at every instant. So, for each chunk of ``chunk`` selected
records, in this order:

1. new bulks holding their URLs (the original depth; no attempts, no redirect
   hops: a fresh retry budget) are written to PendDB, flushed and fsynced;
2. the BadHosts entries of their hosts, and the kept robots.txt answers of
   their origins (robots_* records only), are deleted, flushed and fsynced;
3. (a recrawl, ``keep_prior``) their records, body included, are copied to
   ``prior/``, fsynced; then their MainDB records are deleted, flushed (fsynced
   once at the end). Killed between the copy and the delete, the record is in
   both: the URL is skipped as done, and a second recrawl finishes the job.

Deleting a record before its bulk is written would leave the URL in neither
store for a moment, and a kill -9 then loses it. Written first, the URL is in
both for a moment, which the crawler already allows: a URL of a live bulk that
is in MainDB is skipped when the bulk is claimed. That skip is the one thing a
kill can cost: if a retry is killed between 1 and 3 and the next command is
``start``, the URLs of the unfinished chunk are skipped as done. Their *retry*
is lost, never the URLs: they are still failures in MainDB, and running retry
again finishes the job (its selection finds them again; as their URLs are
already in live bulks it only deletes their records, so no URL is queued
twice). BadHosts goes before the records for the same reason: killed between 2
and 3, a second retry still finds the records and finishes; the other way
round, a kill after 3 would leave hosts bad with no record left to find them by.

MainDB is read through its key snapshot (kvstore iterates a copy of the keys),
so records can be deleted while the walk goes on; memory holds one chunk and
the url_keys of the live bulks (a PendSet: 9 bytes a URL, crawler.state.pendset).
A damaged record is skipped with a warning and counted (``python -m kvstore
verify`` names it).

Selecting reads only each record's head (its first 4 KiB: the JSON header,
crawler.state.pages.read_page_head over kvstore's get_prefix), never a body. The
CRC covers the whole record, so a real run reads each record it picks whole
before it touches anything (a record damaged anywhere is left alone, as before);
a dry run does not, so it counts a record whose body alone is damaged among those
it would re-queue, and the real run then leaves it alone as damaged.

Every store of every shard is opened for writing before anything is changed:
their writer locks keep a crawl out while the retry runs, and a crawl already
running makes the open fail (DataDirError) with nothing changed. A sharded
crawl's supervisor lock is the CLI's to take (crawler.cli.retry). A dry run
opens the stores read-only and writes nothing at all; it holds no lock, so it
opens one shard at a time (its memory is one shard's key indexes, not all).

Not thread-safe: one call at a time (the locks see to it across processes).
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

import kvstore

from .. import outcomes
from ..exceptions import CrawlerError, DataDirError, URLError
from ..web.urls import host_key, host_of, parse
from .admission import keys_array
from .badhosts import BAD_HOSTS_NAME
from .frontier import DEFAULT_BULK_SIZE
from .outcomelog import OutcomeLog, hosts_u64, standing, uncovered, words
from .pages import PageRecord, Pending, bulk_counter, bulk_keys, put_bulks, read_page_head
from .pendset import PendSet, sorted_unique
from .robotsstore import ROBOTS_STORE_NAME, store_key
from .shards import shard_dirs
from .tally import Tally, shard_stamp, stale_reason, write_counts

log = logging.getLogger(__name__)

MAIN_NAME = "main"
PEND_NAME = "pend"
PRIOR_NAME = "prior"  # records a recrawl set aside for conditional GETs (crawler.run.revisit)
DEFAULT_CHUNK = 10_000  # records re-queued per write round (three flushes, two fsyncs)
# Outcomes that are the crawler keeping its own rules (robots.txt said no, the per-run
# page limit of a host): recorded at status 0 but not failures, so not retried unless
# named with --reason.
NOT_FAILURES = frozenset({outcomes.ROBOTS_DISALLOWED, outcomes.HOST_PAGE_LIMIT})
_STATUS = re.compile(r"^(?:0|[1-5][0-9][0-9]|[1-5]xx)$")


def outcome_key(page: PageRecord) -> str:
    """The key the crawl counted the record under (crawler.outcomes.outcome_key)."""
    return outcomes.outcome_key(page.status, page.reason, page.truncated)


def is_failure(page: PageRecord) -> bool:
    """A record that is not an answer the crawl can use: no HTTP answer (status 0)
    for any reason but the crawler's own rules (NOT_FAILURES), or an HTTP error
    (4xx, 5xx). 2xx and 3xx answers are not failures, whatever their reason
    (not_html, a cut body, redirect_limit)."""
    if page.status == 0:
        return page.reason not in NOT_FAILURES
    return page.status >= 400


@dataclass(frozen=True, slots=True)
class Selection:
    """Which records to re-queue.

    ``reasons``: prefixes of outcome keys; ``tls`` takes ``tls`` and also
    ``bad_host:tls`` (the URLs of the host its ``tls`` failure marked bad), ``dns_``
    every DNS failure, ``bad_host`` every URL recorded because its host was bad.
    ``statuses``: ``404``, ``5xx`` (a class), ``0`` (every record without an HTTP
    answer). A record is taken if it matches any of them; with neither, every
    failure (:func:`is_failure`)."""

    reasons: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    _ranges: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ranges = []
        for s in self.statuses:
            text = s.strip().lower()
            if not _STATUS.match(text):
                raise CrawlerError(f"bad status {s!r}: use a code (404), a class (5xx) or 0")
            low = int(text[0]) * 100 if text.endswith("xx") else int(text)
            ranges.append((low, low + 99 if text.endswith("xx") else low))
        if any(not r for r in self.reasons):
            raise CrawlerError("an empty reason selects nothing")
        object.__setattr__(self, "_ranges", tuple(ranges))

    @property
    def everything_failed(self) -> bool:
        return not self.reasons and not self.statuses

    def pick(self, facts: np.ndarray) -> np.ndarray:
        """``matches`` over outcome log rows (crawler.state.outcomelog): a bool each."""
        which, distinct = words(facts)
        said = [self.matches(PageRecord("", status, 0.0, 0, reason=reason, truncated=cut))
                for status, reason, cut in distinct]
        picked: np.ndarray = np.array(said, dtype=bool)[which]
        return picked

    def matches(self, page: PageRecord) -> bool:
        if self.everything_failed:
            return is_failure(page)
        if any(low <= page.status <= high for low, high in self._ranges):
            return True
        key = outcome_key(page)
        cause = key.removeprefix(outcomes.BAD_HOST) if key.startswith(outcomes.BAD_HOST) else None
        return any(key.startswith(r) or (cause is not None and cause.startswith(r))
                   for r in self.reasons)


@dataclass(slots=True)
class RetryReport:
    """What a requeue did (or, dry, would do)."""

    counts: Counter[str] = field(default_factory=Counter)  # re-queued records by outcome key
    hosts_cleared: int = 0  # BadHosts entries deleted (dry: that would be)
    robots_cleared: int = 0  # kept robots.txt answers forgotten (dry: that would be)
    already_pending: int = 0  # URLs found in a live bulk already (an interrupted retry);
    # counted by a real run only
    damaged: int = 0  # records that could not be read, left alone
    from_log: int = 0  # records selected by their outcome log rows (no read)
    heads_read: int = 0  # records whose heads were read (no standing log row, or taken)
    shards: int = 1
    dry_run: bool = False

    @property
    def requeued(self) -> int:
        return sum(self.counts.values())


class _Shard:
    """One shard's MainDB, PendDB and BadHosts, open for the retry."""

    def __init__(self, data_dir: str, *, readonly: bool, keep_prior: bool = False) -> None:
        self.data_dir = data_dir
        self.readonly = readonly
        self.stores: list[kvstore.Store] = []
        self.live = PendSet()  # url_keys of the URLs in live bulks
        self.counter = 0  # the next free bulk key
        self.tally: Tally | None = None  # the shard's counters, if current (kept current)
        self.outcomes: OutcomeLog | None = None  # a real run logs the records it read
        self.bad_prefixes: dict[bytes, list[bytes]] | None = None  # BadHosts keys by prefix
        try:
            self.main = self._open(MAIN_NAME)  # first, as the frontier: a crawl holds it
            self.pend = self._open(PEND_NAME)
            self.bad = self._open(BAD_HOSTS_NAME)
            has_robots = os.path.isdir(os.path.join(data_dir, ROBOTS_STORE_NAME))
            self.robots = self._open(ROBOTS_STORE_NAME) if has_robots else None
            self.prior = self._open(PRIOR_NAME) if keep_prior else None
            # The live bulks' URLs and the next free bulk key: a real run's. A dry run
            # would decode every pending URL only to count already_pending.
            if self.pend is not None and not readonly:
                top = -1
                keys = bytearray()  # 16 B a URL while it lasts; PendSet is made in one sort
                for bk in self.pend:
                    top = max(top, bulk_counter(bk))
                    keys += bulk_keys(self.pend[bk])
                self.live = PendSet(np.frombuffer(keys, dtype=np.uint8).reshape(-1, 16))
                del keys
                self.counter = top + 1
            if not readonly:  # our locks keep the committer out: the counters hold still
                self.tally = stale_reason(data_dir)[0]
                self.outcomes = OutcomeLog(data_dir)
        except BaseException:
            self.close()
            raise

    def _open(self, name: str) -> kvstore.Store | None:
        path = os.path.join(self.data_dir, name)
        if self.readonly and not os.path.isdir(path):
            return None  # a dry run creates nothing
        try:
            # PendDB unmapped: a real run reads every bulk once, and a map would keep
            # each page it touched in the RSS (0.7 GB a shard at 20M pages).
            store = kvstore.open(path, readonly=self.readonly, buffer_size=8 << 20,
                                 map_values=name != PEND_NAME)
        except kvstore.exceptions.StoreLockedError:
            raise DataDirError(
                f"{self.data_dir}: a crawl is running on this data directory: stop it "
                "(Ctrl-C) and run retry again"
            ) from None
        self.stores.append(store)
        return store

    def close(self) -> None:
        if self.outcomes is not None:
            self.outcomes.close()
        for store in self.stores:
            store.close()


def requeue(data_dir: str, selection: Selection | Any, *, dry_run: bool = False,
            chunk: int = DEFAULT_CHUNK, keep_prior: bool = False) -> RetryReport:
    """Re-queue the records of every shard of the crawl in ``data_dir`` that
    ``selection`` (anything with ``matches(page)``) picks (see the module docstring for
    the order of the writes); with ``dry_run``, only count them. ``keep_prior`` (a
    recrawl) copies each record, body included, to the shard's ``prior/`` before it is
    deleted, so the next fetch can be conditional. Raises DataDirError while a crawl
    runs on ``data_dir`` (nothing changed then)."""
    dirs = [d for d in shard_dirs(data_dir) if os.path.isdir(os.path.join(d, MAIN_NAME))]
    if not dirs:
        raise DataDirError(f"{data_dir}: not a crawl directory (it has no main/)")
    report = RetryReport(shards=len(dirs), dry_run=dry_run)
    shards: list[_Shard] = []
    try:
        if dry_run:  # nothing to lock: one shard's indexes in memory at a time
            for d in dirs:
                shard = _Shard(d, readonly=True, keep_prior=keep_prior)
                try:
                    _requeue_shard(shard, selection, report, chunk)
                finally:
                    shard.close()
        else:
            for d in dirs:  # every lock before any change
                shards.append(_Shard(d, readonly=False, keep_prior=keep_prior))
            for shard in shards:
                _requeue_shard(shard, selection, report, chunk)
    finally:
        for shard in shards:
            shard.close()
    log.info("%s: %d records %s, %d bad hosts %s", data_dir, report.requeued,
             "would be re-queued" if dry_run else "re-queued", report.hosts_cleared,
             "would be cleared" if dry_run else "cleared")
    return report


def _requeue_shard(shard: _Shard, selection: Selection, report: RetryReport, chunk: int) -> None:
    main = shard.main
    assert main is not None  # dirs were chosen for their main/
    state = _Walk(shard, selection, report, chunk)
    covered = kvstore.KeySet()  # live keys whose standing log record was seen
    live = len(main)  # before a real run deletes any (covered keys among them)
    pick = getattr(selection, "pick", None)  # a selection that reads log rows
    if pick is not None:
        for keys, facts in standing(shard.data_dir, main, covered):
            picked = pick(facts)
            report.from_log += len(keys)
            keys, facts = keys[picked], facts[picked]
            if not shard.readonly:  # a real run reads each record it takes, whole
                state.read([k.tobytes() for k in keys], heal=False)
                continue
            robots = _robots_rows(facts)  # their robots.txt origin is in the URL: read
            state.read([k.tobytes() for k in keys[robots]], heal=False)
            _count_rows(shard, keys[~robots], facts[~robots], report, state.cleared)
    if len(covered) < live:  # records the log does not stand for: read their heads
        state.read([k.tobytes() for k in uncovered(main, covered)], heal=True)
    state.finish()
    if not shard.readonly:
        main.sync()
        if shard.outcomes is not None:
            shard.outcomes.sync()
        if shard.tally is not None:  # after the deletes reached the disk: stamped with them
            assert shard.pend is not None
            shard.tally.pending_bulks = len(shard.pend)
            try:
                write_counts(shard.data_dir, shard.tally, shard_stamp(shard.data_dir))
            except OSError as exc:  # stale then: status reads every record
                log.warning("%s: outcome counters not written: %s", shard.data_dir, exc)


class _Walk:
    """The records of one shard read and selected by their heads: the chunk being
    gathered, and the hosts and robots answers already counted or cleared."""

    def __init__(self, shard: _Shard, selection: Selection, report: RetryReport,
                 chunk: int) -> None:
        self.shard, self.selection, self.report, self.chunk = shard, selection, report, chunk
        self.batch: list[tuple[bytes, PageRecord]] = []
        self.cleared: set[bytes] = set()  # BadHosts and robots store keys already counted

    def read(self, keys: list[bytes], *, heal: bool) -> None:
        """Read the heads of ``keys``; ``heal``: log the records a real run leaves (they
        had no standing log record)."""
        main, shard = self.shard.main, self.shard
        assert main is not None
        kept: list[tuple[bytes, PageRecord]] = []
        for key in keys:
            self.report.heads_read += 1
            try:  # the header is enough to select: the body is not read
                page = read_page_head(partial(main.get_prefix, key))
                picked = self.selection.matches(page)
                if picked and not shard.readonly:
                    main[key]  # read whole, CRC-checked: a damaged record is left alone
            except (kvstore.exceptions.CorruptStoreError, CrawlerError, ValueError,
                    TypeError) as exc:
                # as crawler.read.listing: ValueError is bad JSON or UTF-8, TypeError fields
                self.report.damaged += 1
                log.warning("%s: record %s is damaged, left alone: %s", shard.data_dir,
                            key.hex(), exc)
                continue
            if picked:
                self.batch.append((key, page))
                if len(self.batch) >= self.chunk:
                    _write_chunk(shard, self.batch, self.report, self.cleared)
                    self.batch = []
            elif heal and shard.outcomes is not None:
                kept.append((key, page))
                if len(kept) >= self.chunk:
                    self._heal(kept)
                    kept = []
        self._heal(kept)

    def _heal(self, kept: list[tuple[bytes, PageRecord]]) -> None:
        outcomes, main = self.shard.outcomes, self.shard.main
        if kept and outcomes is not None and main is not None:
            outcomes.note(main, [k for k, _ in kept], [p for _, p in kept])
            outcomes.write()

    def finish(self) -> None:
        if self.batch:
            _write_chunk(self.shard, self.batch, self.report, self.cleared)
            self.batch = []


def _robots_rows(facts: np.ndarray) -> np.ndarray:
    which, distinct = words(facts)
    robots: np.ndarray = np.array([reason.startswith("robots_") for _, reason, _ in distinct],
                                  dtype=bool)[which]
    return robots


def _count_rows(shard: _Shard, keys: np.ndarray, facts: np.ndarray, report: RetryReport,
                cleared: set[bytes]) -> None:
    """A dry run's counts of the log rows it takes, as _write_chunk counts records."""
    if not len(keys):
        return
    which, distinct = words(facts)
    per = np.bincount(which, minlength=len(distinct)).tolist()
    for (status, reason, cut), n in zip(distinct, per, strict=True):
        if n:
            report.counts[outcomes.outcome_key(status, reason, cut)] += n
    report.already_pending += int(shard.live.contains_many(keys).sum())
    if shard.bad is not None and len(shard.bad):
        if shard.bad_prefixes is None:  # BadHosts is small next to MainDB: read its keys once
            shard.bad_prefixes = {}
            for h in shard.bad:
                shard.bad_prefixes.setdefault(h[:8], []).append(h)
        hosts = sorted_unique(hosts_u64(facts["host"]).copy()).astype("<u8").tobytes()
        for i in range(0, len(hosts), 8):
            for h in shard.bad_prefixes.get(hosts[i:i + 8], ()):
                if h not in cleared:
                    cleared.add(h)
                    report.hosts_cleared += 1


def _write_chunk(shard: _Shard, batch: list[tuple[bytes, PageRecord]], report: RetryReport,
                 cleared: set[bytes]) -> None:
    """One chunk, in the crash-safe order: bulks, BadHosts, records."""
    keys = [k for k, _ in batch]
    known = shard.live.contains_many(keys_array(keys)).tolist()
    entries = [Pending(page.url, page.depth) for (_, page), live in zip(batch, known, strict=True)
               if not live]
    report.already_pending += len(batch) - len(entries)
    hosts: set[bytes] = set()
    for _, page in batch:
        report.counts[outcome_key(page)] += 1
        try:
            hosts.add(host_key(host_of(page.url)))
        except URLError:
            pass  # a URL with no host (bad_url) has no BadHosts entry either
    bad = shard.bad
    to_clear = [h for h in hosts - cleared if bad is not None and h in bad]
    cleared.update(to_clear)
    report.hosts_cleared += len(to_clear)
    kept = _robots_answers(shard, batch) - cleared
    cleared.update(kept)
    report.robots_cleared += len(kept)
    if shard.readonly:
        return
    assert shard.pend is not None and shard.bad is not None and shard.main is not None
    if entries:  # 1. the URLs, pending again
        _, shard.counter = put_bulks(shard.pend, entries, shard.counter, DEFAULT_BULK_SIZE)
        shard.pend.sync()
        shard.live.add_many(keys_array([k for (k, _), live in zip(batch, known, strict=True)
                                         if not live]))
    if to_clear:  # 2. their hosts, no longer bad
        for h in to_clear:
            del shard.bad[h]
        shard.bad.sync()
    if kept and shard.robots is not None:  # ... and the robots.txt answers that refused them
        for k in kept:
            del shard.robots[k]
        shard.robots.sync()
    if shard.prior is not None:  # ... a recrawl's copies of the records, for a 304
        for k in keys:
            shard.prior[k] = shard.main[k]
        shard.prior.sync()
    for k in keys:  # 3. their records, gone
        del shard.main[k]
    shard.main.flush()
    if shard.tally is not None:  # each URL is pending again, in a live bulk
        for _, page in batch:
            shard.tally.count(page.status, outcome_key(page), -1)
        shard.tally.pending += len(batch)


def _robots_answers(shard: _Shard, batch: list[tuple[bytes, PageRecord]]) -> set[bytes]:
    """The robots store's keys of the kept answers that decided the ``robots_*`` records
    of ``batch``."""
    store = shard.robots
    if store is None:
        return set()
    keys = set()
    for _, page in batch:
        if page.reason.startswith("robots_"):
            try:
                keys.add(store_key(parse(page.url).robots_key))
            except URLError:
                continue
    return {k for k in keys if k in store}
