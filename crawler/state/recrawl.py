"""Which fetched pages a recrawl re-queues: older than an age, of some hosts, of some
statuses. The re-queue itself (its order of writes, why a kill -9 loses nothing) is
crawler.state.retry's, with ``keep_prior``: each record is kept in ``prior/`` so that
the next fetch of its URL is a conditional GET (crawler.run.revisit)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..exceptions import URLError
from ..web.urls import host_of
from .outcomelog import host_prefix, hosts_u64
from .pages import PageRecord
from .retry import RetryReport, Selection, requeue


@dataclass(frozen=True, slots=True)
class RecrawlSelection:
    """Records with an HTTP answer (status > 0) fetched at least ``older_than`` seconds
    before ``now``, of one of ``hosts`` (all if empty) and one of ``statuses`` (a code or
    a class, as retry's; all if empty)."""

    older_than: float
    hosts: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    now: float = field(default_factory=time.time)
    _status: Selection = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_status", Selection(statuses=self.statuses))
        object.__setattr__(self, "hosts", tuple(h.lower().rstrip(".") for h in self.hosts))

    def pick(self, facts: np.ndarray) -> np.ndarray:
        """``matches`` over outcome log rows (crawler.state.outcomelog): a bool each."""
        chosen = (facts["status"] > 0) & (facts["fetched"] <= self.now - self.older_than)
        if self.statuses:
            chosen &= self._status.pick(facts)
        if self.hosts:
            wanted = hosts_u64([host_prefix(h) for h in self.hosts])
            chosen &= np.isin(hosts_u64(facts["host"]), wanted)
        return chosen

    def matches(self, page: PageRecord) -> bool:
        if page.status <= 0 or page.fetched_at > self.now - self.older_than:
            return False
        if self.statuses and not self._status.matches(page):
            return False
        if self.hosts:
            try:
                return host_of(page.url) in self.hosts
            except URLError:
                return False
        return True


def recrawl(data_dir: str, selection: RecrawlSelection, *, dry_run: bool = False) -> RetryReport:
    """Re-queue the pages ``selection`` picks, each record kept for its conditional GET."""
    return requeue(data_dir, selection, dry_run=dry_run, keep_prior=True)
