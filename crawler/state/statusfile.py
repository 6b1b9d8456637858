"""status.json: the snapshot a crawl writes in its data directory, and reads back.

A run writes it every few seconds and when it ends (crawler.run.status,
crawler.run.overview for a sharded crawl); ``python -m crawler status`` and a resume
read it. Writes go through a temporary file and a rename, so a reader never sees
half a file. A file that is not a snapshot is refused with one line naming it and
what is wrong (:func:`snapshot_problem`), never half-read.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any

from ..exceptions import DataDirError
from ..outcomes import by_class
from .jsonfile import read_json

log = logging.getLogger(__name__)

STATUS_NAME = "status.json"

# Snapshot fields that add up over shards (pages_per_s is recomputed by whoever sums).
_SUMMED = ("fetched", "done", "pending", "in_flight", "waiting", "hosts", "bad_hosts", "outbox",
           "depth_improved", "depth_not_reread", "mb", "bytes", "uncommitted",
           "delayed_hosts", "rss_mb",
           "pages_per_s", "avg_pages_per_s")
# A revisiting crawl's fields (start --revisit-after): summed, but for the next due time.
_REVISIT = ("revisits", "revisits_waiting")


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
        data = read_json(path, "a status snapshot", fix)
    except FileNotFoundError:
        return None
    problem = snapshot_problem(data)
    if problem:
        raise DataDirError(f"{path}: not a status snapshot ({problem}): {fix}")
    snap: dict[str, Any] = data
    return snap


# What readers take from a snapshot, by type (a field may be absent, but for "time").
_NUMBERS = (*_SUMMED, *_REVISIT, *_RENDER, "time", "elapsed", "shard", "shards", "shards_up")
_COUNTERS = ("outcomes", "classes", "sitemaps")
_MAX_PID = 1 << 22  # Linux's PID_MAX_LIMIT
_MAX_TIME = 253_402_300_799  # 9999-12-31T23:59:59Z: what a date can show


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
    if not 0 <= data["time"] <= _MAX_TIME:  # (time.localtime refuses it: OverflowError)
        return f"its time is {str(data['time'])[:50]!r}, not a time"
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
