"""The status line (every few seconds, through logging) and ``status.json`` in the data directory.

``python -m crawler status DIR`` reads the file a running or stopped crawl
left, plus read-only opens of its stores.

Outcomes are counted by key and grouped into classes (crawler.outcomes: the
vocabulary). status.json carries both (``outcomes`` by key, ``classes``); the
status line shows the classes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ..outcomes import by_class
from ..state.statusfile import write_status

log = logging.getLogger(__name__)


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def tree_rss_bytes(leader: int | None) -> int:
    """Resident set size of the processes in ``leader``'s process group (the browser
    and its renderers); 0 for None or where /proc is unavailable."""
    if leader is None:
        return 0
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            if int(fields[2]) == leader:  # pgrp, the 5th field
                total += int(fields[21]) * page  # rss in pages, the 24th
        except (OSError, ValueError, IndexError):
            continue
    return total


class Reporter:
    """Writes ``status.json`` every ``interval`` seconds and, with ``log_line``, logs
    the status line (a shard leaves the line to its supervisor). ``counts()`` gives the
    crawl's counts (the engine's ``status_counts``, ``fetched`` among them); the
    reporter adds the time, the rates and this process's memory: it takes a snapshot
    of the crawl, not the crawl."""

    def __init__(self, counts: Callable[[], dict[str, Any]], *, data_dir: str,
                 interval: float, log_line: bool = True) -> None:
        self.counts = counts
        self.data_dir = data_dir
        self.interval = interval
        self.log_line = log_line
        self._last = time.monotonic()
        self._last_fetched = 0
        self._started = time.monotonic()

    def maybe_report(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.report()

    def snapshot(self, *, final: bool = False) -> dict[str, Any]:
        now = time.monotonic()
        elapsed = max(1e-9, now - self._last)
        counts = self.counts()
        fetched = counts["fetched"]
        snap: dict[str, Any] = {
            "pid": os.getpid(),
            "running": not final,
            "time": time.time(),
            "elapsed": round(now - self._started, 1),
            "pages_per_s": round((fetched - self._last_fetched) / elapsed, 1),
            "avg_pages_per_s": round(fetched / max(1e-9, now - self._started), 1),
            "rss_mb": round(rss_bytes() / 1e6, 1),
            **counts,
        }
        snap["classes"] = by_class(snap.get("outcomes", {}))
        return snap

    def report(self, *, final: bool = False) -> dict[str, Any]:
        snap = self.snapshot(final=final)
        self._last = time.monotonic()
        self._last_fetched = snap["fetched"]
        if self.log_line:
            log_status(snap)
        try:
            write_status(self.data_dir, snap)
        except OSError as exc:  # a full disk must not stop the crawl from stopping cleanly
            log.warning("status.json not written: %s", exc)
        return snap


def log_status(snap: dict[str, Any]) -> None:
    """Log the status line, under this module's logger whoever writes it (one engine,
    or a supervisor's sum), so it reads the same with one process or many."""
    log.info("%s", status_line(snap))


def status_line(snap: dict[str, Any]) -> str:
    """The status line of a snapshot (one engine's, or a supervisor's sum)."""
    top = ", ".join(f"{k}={v}" for k, v in snap["classes"].items())
    line = (
        f"fetched {snap['fetched']} ({snap['pages_per_s']:.1f}/s) pending {snap['pending']} "
        f"claimed {snap['in_flight']} (waiting {snap['waiting']}) hosts {snap['hosts']} "
        f"bad hosts {snap['bad_hosts']} | {top or 'nothing recorded yet'} | "
        f"{snap['mb']:.1f} MB rss {snap['rss_mb']:.0f} MB"
    )
    if "rendered" in snap:
        line += (
            f" | rendered {snap['rendered']} (failed {snap['render_failed']}, "
            f"queued {snap['render_queued']}, rendering {snap['rendering']}) "
            f"browser {snap.get('browser_rss_mb', 0):.0f} MB"
        )
    if snap.get("shards", 1) > 1:
        line += f" | shards {snap.get('shards_up', snap['shards'])}/{snap['shards']}"
        if snap.get("outbox"):
            line += f", {snap['outbox']} links to hand over"
    return line
