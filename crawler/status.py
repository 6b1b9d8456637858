"""The status line (every few seconds, through logging) and ``status.json`` in the data directory.

``python -m crawler status DIR`` reads the file a running or stopped crawl
left, plus read-only opens of its stores.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

STATUS_NAME = "status.json"


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Reporter:
    def __init__(self, engine: Engine, *, interval: float) -> None:
        self.engine = engine
        self.interval = interval
        self._last = time.monotonic()
        self._last_fetched = 0
        self._started = time.monotonic()

    def maybe_report(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.report()

    def snapshot(self, *, final: bool = False) -> dict[str, Any]:
        e = self.engine
        now = time.monotonic()
        elapsed = max(1e-9, now - self._last)
        counts = e.frontier.counts()
        errors = {k: v for k, v in sorted(e.outcomes.items()) if k}
        return {
            "pid": os.getpid(),
            "running": not final,
            "time": time.time(),
            "elapsed": round(now - self._started, 1),
            "fetched": e.fetched,
            "pages_per_s": round((e.fetched - self._last_fetched) / elapsed, 1),
            "avg_pages_per_s": round(e.fetched / max(1e-9, now - self._started), 1),
            "done": counts["done"],
            "pending": counts["pending"],
            "in_flight": counts["in_flight"],
            "waiting": e.scheduler.waiting,
            "hosts": e.scheduler.hosts(),
            "bad_hosts": len(e._bad),
            "outcomes": errors,
            "mb": round(e.bytes / 1e6, 1),
            "rss_mb": round(rss_bytes() / 1e6, 1),
        }

    def report(self, *, final: bool = False) -> dict[str, Any]:
        snap = self.snapshot(final=final)
        self._last = time.monotonic()
        self._last_fetched = snap["fetched"]
        top = ", ".join(
            f"{k}={v}" for k, v in sorted(snap["outcomes"].items(), key=lambda kv: -kv[1])[:6]
        )
        log.info(
            "fetched %d (%.1f/s) pending %d in flight %d waiting %d hosts %d bad hosts %d"
            " | %s | %.1f MB rss %.0f MB",
            snap["fetched"],
            snap["pages_per_s"],
            snap["pending"],
            snap["in_flight"],
            snap["waiting"],
            snap["hosts"],
            snap["bad_hosts"],
            top or "no errors",
            snap["mb"],
            snap["rss_mb"],
        )
        try:
            write_status(self.engine.config.data_dir, snap)
        except OSError as exc:  # a full disk must not stop the crawl from stopping cleanly
            log.warning("status.json not written: %s", exc)
        return snap


def write_status(data_dir: str, snap: dict[str, Any]) -> None:
    path = os.path.join(data_dir, STATUS_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(snap, f, indent=1, sort_keys=True)
    os.replace(tmp, path)  # readers never see half a file


def read_status(data_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(data_dir, STATUS_NAME), encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return None
