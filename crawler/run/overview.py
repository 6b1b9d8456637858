"""One crawl seen from above: the shards' reports summed, status.json, and how the run ended.

Shared by the two drivers of a sharded crawl, the process supervisor
(crawler.run.supervisor) and the Ray driver (crawler.run.raydriver): each
keeps one :class:`ShardTally` per shard and mixes in :class:`Overview`, which
only reads them. A shard's counters live in its process and restart from zero
with it, so a tally folds every ended incarnation's last counts into
``fetched_before`` / ``outcomes_before``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import CrawlerConfig
from ..outcomes import by_class
from ..state import statusfile
from . import status as status_mod

log = logging.getLogger(__name__)

# a shard's link exchange counters (run/shard.py): its final word keeps them, so the
# final status.json holds every link sent and received, not those of a last report
EXCHANGE_COUNTS = ("sent_batches", "sent_urls", "received_batches", "received_urls",
                   "send_failures")


@dataclass
class ShardTally:
    index: int
    incarnation: int = 0
    report: dict[str, Any] | None = None  # the latest report of this incarnation
    final: dict[str, Any] | None = None  # what this incarnation said when it ended
    exited: bool = False  # exited for good (finished, stopped, failed)
    fetched_before: int = 0  # fetches of earlier incarnations
    outcomes_before: dict[str, int] = field(default_factory=dict)

    def retire(self) -> None:
        """This incarnation ended: keep its counts (its final, else its last report)."""
        final = self.final or {}
        if self.report is not None or final:
            self.fetched_before += int(final.get("fetched", (self.report or {}).get("fetched", 0)))
            got = final.get("outcomes", (self.report or {}).get("outcomes", {}))
            for k, v in got.items():
                self.outcomes_before[k] = self.outcomes_before.get(k, 0) + v
        self.report = None


@dataclass
class Summary:
    complete: bool
    state: str  # complete | interrupted | stopped (limit reached) | failed
    fetched: int
    seconds: float
    outcomes: dict[str, int]
    error: str | None = None


class Overview:
    """Status and summary of a sharded crawl (mixed into a driver that sets the
    attributes below)."""

    config: CrawlerConfig
    data_dir: str
    count: int
    shards: list[Any]  # ShardTally, or a subclass
    _started: float
    _last_status: float
    _last_status_t: float
    _last_fetched: int
    _stopping: bool
    _limit: bool
    _error: str | None

    def snapshot(self) -> dict[str, Any]:
        """The crawl's status: the shards' latest reports summed (earlier incarnations'
        fetches and outcomes included)."""
        reports = [s.report for s in self.shards if s.report is not None]
        snap = statusfile.sum_snapshots(reports)
        snap["fetched"] += sum(s.fetched_before for s in self.shards)
        outcomes = dict(snap["outcomes"])
        for s in self.shards:
            for k, v in s.outcomes_before.items():
                outcomes[k] = outcomes.get(k, 0) + v
        snap["outcomes"] = dict(sorted(outcomes.items()))
        snap["classes"] = by_class(outcomes)
        now = time.monotonic()
        snap["pages_per_s"] = round(
            (snap["fetched"] - self._last_fetched) / max(1e-9, now - self._last_status_t), 1
        )
        snap["avg_pages_per_s"] = round(snap["fetched"] / max(1e-9, now - self._started), 1)
        snap["elapsed"] = round(now - self._started, 1)
        snap["rss_mb"] = round(snap["rss_mb"] + status_mod.rss_bytes() / 1e6, 1)
        snap["shards"] = self.count
        snap["shards_up"] = len(reports)
        snap["pid"] = os.getpid()
        snap["running"] = True
        snap["time"] = time.time()
        snap["per_shard"] = [
            # up: it answered the last round (a lost node's shards did not)
            {"shard": s.index, "incarnation": s.incarnation, "up": s.report is not None,
             **exchange_counts(s.final), **(s.report or {})}
            for s in self.shards
        ]
        return snap

    def _maybe_status(self, *, final: bool = False, initial: bool = False) -> None:
        """Write status.json (and log the line) every status interval; ``initial``: at
        once, unlogged, so the file says from the start that this run is on (and a
        kill leaves "running" there, not how an earlier run ended)."""
        now = time.monotonic()
        if not (final or initial) and now - self._last_status < self.config.status_interval:
            return
        snap = self.snapshot()
        self._last_status = self._last_status_t = now
        self._last_fetched = snap["fetched"]
        if final:
            snap["running"] = False
        elif not initial:
            status_mod.log_status(snap)
        try:
            statusfile.write_status(self.data_dir, snap)
        except OSError as exc:
            log.warning("status.json not written: %s", exc)

    def _summary(self) -> Summary:
        fetched = sum(s.fetched_before for s in self.shards)
        outcomes: dict[str, int] = {}
        for s in self.shards:
            for k, v in s.outcomes_before.items():
                outcomes[k] = outcomes.get(k, 0) + v
        complete = not self._stopping and all(
            s.exited and (s.final or {}).get("complete") for s in self.shards
        )
        if self._error:
            state = "failed"
        elif complete:
            state = "complete"
        elif self._limit:
            state = "stopped (limit reached)"
        else:
            state = "interrupted"
        self._maybe_status(final=True)
        return Summary(
            complete=complete,
            state=state,
            fetched=fetched,
            seconds=round(time.monotonic() - self._started, 1),
            outcomes=dict(sorted(outcomes.items())),
            error=self._error,
        )


Round = list[tuple[int, int, bool]]  # per shard: (incarnation, activity, idle)


def exchange_counts(final: dict[str, Any] | None) -> dict[str, int]:
    """The exchange counters in a shard's final word (none before it ended)."""
    return {k: final[k] for k in EXCHANGE_COUNTS if final and k in final}


def quiescent(before: Round | None, after: Round) -> bool:
    """Whether two consecutive rounds of reports (``after`` asked only once ``before``
    was all answered) prove the crawl complete: every shard idle in both, with the same
    incarnation and activity, so none admitted or wrote anything in between."""
    return before is not None and before == after and all(idle for *_, idle in after)
