"""The status line (every few seconds, through logging) and ``status.json`` in the data directory.

``python -m crawler status DIR`` reads the file a running or stopped crawl
left, plus read-only opens of its stores.

Outcomes are counted by *key* (``outcome_key``: the record's reason, else its
truncation, else its HTTP status; ``retry:<why>`` for a try that will be
repeated) and grouped into a few *classes* an operator can read at a glance
(``outcome_class``; the table is in docs/HOSTILE.md). status.json carries
both (``outcomes`` by key, ``classes``); the status line shows the classes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any

from ..exceptions import DataDirError

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

STATUS_NAME = "status.json"

# Reason -> class. Reasons not listed fall back on their prefix (see outcome_class).
_CLASSES = {
    "not_html": "not_html",
    "too_large": "truncated",
    "decompression_bomb": "truncated",
    "robots_disallowed": "robots",
    "robots_unavailable": "robots",
    "redirect_limit": "limit",
    "host_page_limit": "limit",
    "private_ip": "dns",
    "connect_refused": "connect",
    "connect_timeout": "connect",
    "connect_error": "connect",
    "tls": "connect",
    "read_timeout": "timeout",
    "total_timeout": "timeout",
    "reset": "broken",
    "protocol": "broken",
}
CLASSES = (
    "ok",
    "redirect",
    "http_4xx",
    "http_5xx",
    "not_html",
    "truncated",
    "robots",
    "limit",
    "dns",
    "connect",
    "timeout",
    "broken",
    "bad_host",
    "retry",
    "other",
)


def outcome_key(status: int, reason: str, truncated: str = "") -> str:
    """The counter key of a recorded outcome: its reason, else why its body was
    cut, else its HTTP status ("200", "404")."""
    return reason or truncated or str(status)


def outcome_class(key: str) -> str:
    """The class (one of CLASSES) of an outcome key."""
    if key.startswith("retry:"):
        return "retry"
    if key.startswith("bad_host:"):
        return "bad_host"
    if key.startswith("dns_"):
        return "dns"
    cls = _CLASSES.get(key)
    if cls is not None:
        return cls
    if key.isdigit():
        status = int(key)
        if 200 <= status < 300:
            return "ok"
        if 300 <= status < 400:
            return "redirect"
        if 400 <= status < 500:
            return "http_4xx"
        if 500 <= status < 600:
            return "http_5xx"
    return "other"


def by_class(outcomes: dict[str, int]) -> dict[str, int]:
    """Outcome counts summed per class (classes with no outcome left out)."""
    out: dict[str, int] = {}
    for key, n in outcomes.items():
        cls = outcome_class(key)
        out[cls] = out.get(cls, 0) + n
    return {c: out[c] for c in CLASSES if c in out}


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
    the status line (a shard leaves the line to its supervisor)."""

    def __init__(self, engine: Engine, *, interval: float, log_line: bool = True) -> None:
        self.engine = engine
        self.interval = interval
        self.log_line = log_line
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
        with e.stats_lock:
            errors = {k: v for k, v in sorted(e.outcomes.items()) if k}
        outbox = e.frontier.outbox
        render: dict[str, Any] = {}
        if e.renderer is not None:
            render = {**e.renderer.counts(), "subrequests": e.subrequests,
                      "browser_rss_mb": round(tree_rss_bytes(e.renderer.browser.pid) / 1e6, 1)}
        return {
            "shard": e.place.index,
            "shards": e.place.count,
            "outbox": outbox.urls() if outbox is not None else 0,
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
            "bad_hosts": len(e.bad_hosts),
            # URLs a shorter path reached after they were admitted (--max-depth), and
            # pages that could not be read again for it (stored without their body)
            "depth_improved": e.frontier.depths.improved,
            "depth_not_reread": e.reader.not_reread,
            **revisits(e),
            "outcomes": errors,
            "classes": by_class(errors),
            "mb": round(e.bytes / 1e6, 1),
            "rss_mb": round(rss_bytes() / 1e6, 1),
            "memory": e.budget.snapshot(),  # bytes in flight (docs/HOSTILE.md, "Memory")
            **render,
            "sitemaps": e.sitemaps.snapshot() if e.sitemaps is not None else {},
        }

    def report(self, *, final: bool = False) -> dict[str, Any]:
        snap = self.snapshot(final=final)
        self._last = time.monotonic()
        self._last_fetched = snap["fetched"]
        if self.log_line:
            log_status(snap)
        try:
            write_status(self.engine.config.data_dir, snap)
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


# Snapshot fields that add up over shards (pages_per_s is recomputed by whoever sums).
_SUMMED = ("fetched", "done", "pending", "in_flight", "waiting", "hosts", "bad_hosts", "outbox",
           "depth_improved", "depth_not_reread", "mb", "rss_mb", "pages_per_s",
           "avg_pages_per_s")
# A revisiting crawl's fields (start --revisit-after): summed, but for the next due time.
_REVISIT = ("revisits", "revisits_waiting")


def revisits(e: Engine) -> dict[str, Any]:
    """start --revisit-after: pages re-queued as due this run and pages waiting for
    their time; nothing for another crawl."""
    due = e.frontier.due
    if due is None:
        return {}
    return {"revisits": e.frontier.revisits, "revisits_waiting": due.waiting}
# A rendering crawl's fields (--render-js), summed when the shards have them.
_RENDER = ("rendered", "render_failed", "render_queued", "rendering", "browser_starts",
           "subrequests", "browser_rss_mb")


def sum_snapshots(snaps: list[dict[str, Any]]) -> dict[str, Any]:
    """One crawl's snapshot from its shards' (outcomes summed by key, classes again)."""
    summed = _SUMMED + (_RENDER if any("rendered" in s for s in snaps) else ())
    summed += _REVISIT if any("revisits" in s for s in snaps) else ()
    out: dict[str, Any] = {k: 0 for k in summed}
    outcomes: dict[str, int] = {}
    for snap in snaps:
        for k in summed:
            out[k] += snap.get(k, 0)
        for key, n in snap.get("outcomes", {}).items():
            outcomes[key] = outcomes.get(key, 0) + n
    for k in ("mb", "rss_mb", "pages_per_s", "avg_pages_per_s"):
        out[k] = round(out[k], 1)
    out["outcomes"] = dict(sorted(outcomes.items()))
    sitemaps: dict[str, int] = {}
    for snap in snaps:
        for key, n in snap.get("sitemaps", {}).items():
            sitemaps[key] = sitemaps.get(key, 0) + n
    out["sitemaps"] = dict(sorted(sitemaps.items()))
    out["classes"] = by_class(outcomes)
    out["running"] = any(s.get("running") for s in snaps)
    out["time"] = max((s.get("time", 0.0) for s in snaps), default=0.0)
    out["elapsed"] = max((s.get("elapsed", 0.0) for s in snaps), default=0.0)
    return out


def write_status(data_dir: str, snap: dict[str, Any]) -> None:
    path = os.path.join(data_dir, STATUS_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(snap, f, indent=1, sort_keys=True)
    os.replace(tmp, path)  # readers never see half a file


def record_end(data_dir: str, state: str) -> None:
    """Add how the run ended (complete, interrupted, limit, failed) to status.json, so
    ``status`` can tell a finished crawl from a stopped or a killed one."""
    try:
        snap = read_status(data_dir)
    except DataDirError as exc:  # the run is over: say how it ended in a new file
        log.warning("%s (written again)", exc)
        snap = None
    snap = snap or {"time": time.time(), "fetched": 0}
    snap.update(state=state, running=False)
    try:
        write_status(data_dir, snap)
    except OSError as exc:
        log.warning("status.json not written: %s", exc)


def read_status(data_dir: str) -> dict[str, Any] | None:
    """The last snapshot a run wrote in ``data_dir``, None if there is none. Raises
    DataDirError, naming the file and what is wrong, when it cannot be read or is not
    a snapshot (:func:`snapshot_problem`)."""
    path = os.path.join(data_dir, STATUS_NAME)
    fix = "delete it (the next run writes it again)"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except RecursionError:
        raise DataDirError(f"{path}: not a status snapshot (nested too deeply): {fix}") from None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8
        raise DataDirError(f"{path}: unreadable ({exc}): {fix}") from None
    problem = snapshot_problem(data)
    if problem:
        raise DataDirError(f"{path}: not a status snapshot ({problem}): {fix}")
    snap: dict[str, Any] = data
    return snap


# What readers take from a snapshot, by type (a field may be absent, but for "time").
_NUMBERS = (*_SUMMED, *_REVISIT, *_RENDER, "time", "elapsed", "shard", "shards", "shards_up")
_COUNTERS = ("outcomes", "classes", "sitemaps")
_MAX_PID = 1 << 22  # Linux's PID_MAX_LIMIT


def snapshot_problem(data: Any) -> str | None:
    """What makes ``data`` (status.json, parsed) unfit to read, or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    if "time" not in data:
        return "it has no time"
    for key in _NUMBERS:
        value = data.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            return f"its {key} is {str(value)[:50]!r}, not a number"
    pid = data.get("pid", 1)
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 <= pid <= _MAX_PID:
        return f"its pid is {str(pid)[:50]!r}, not a process id"
    if not isinstance(data.get("running", False), bool):
        return "its running is not true or false"
    if not isinstance(data.get("state", ""), str):
        return "its state is not a string"
    for key in _COUNTERS:
        counts = data.get(key, {})
        if not isinstance(counts, dict) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in counts.values()
        ):
            return f"its {key} are not counts"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_running(snap: dict[str, Any] | None) -> bool:
    """Whether the run that wrote ``snap`` (a checked snapshot) still runs."""
    if not snap or not snap.get("running") or "pid" not in snap:
        return False
    return _alive(int(snap["pid"]))


def live_pid(data_dir: str) -> int | None:
    """The pid of a run in progress on ``data_dir`` (its status.json says so and the
    process lives), else None."""
    snap = read_status(data_dir)
    return int(snap["pid"]) if snap and is_running(snap) else None
