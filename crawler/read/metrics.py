"""A crawl's status in the Prometheus text format (exposition format 0.0.4), for
``serve``'s ``/metrics``.

Read from the snapshots the shards write in their directories (status.json, every
``--status-interval`` seconds and at the end: crawler.run.status), so scraping costs the
crawl nothing and works beside a running crawl or after it. Every sample is labelled
with its ``shard``; a shard that never wrote a snapshot is absent, and one whose file
is damaged shows as ``kvcrawl_snapshot_ok 0``. docs/STATUS.md lists every metric.

The counters count this run of the shard (a restart starts them again, which
Prometheus' ``rate()`` takes as a counter reset).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..exceptions import DataDirError
from ..state.shards import crawl_count, shard_dir
from ..state.statusfile import is_running, read_status

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "kvcrawl_"


@dataclass(frozen=True)
class Metric:
    """One metric of a snapshot: its name (without the prefix), type, help text, and the
    value taken from a snapshot (None: not in this snapshot)."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    value: Callable[[dict[str, Any]], float | None]


def _field(name: str, scale: float = 1.0) -> Callable[[dict[str, Any]], float | None]:
    def get(snap: dict[str, Any]) -> float | None:
        value = snap.get(name)
        return None if value is None else float(value) * scale
    return get


def _memory(name: str) -> Callable[[dict[str, Any]], float | None]:
    def get(snap: dict[str, Any]) -> float | None:
        memory = snap.get("memory")
        value = memory.get(name) if isinstance(memory, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)
    return get


# One sample a shard each (the labelled families, outcomes and classes, are below).
METRICS = (
    Metric("up", "gauge", "1 while the shard's run is alive, 0 once it ended or died",
           lambda s: float(is_running(s))),
    Metric("snapshot_age_seconds", "gauge", "seconds since the shard wrote its status",
           lambda s: max(0.0, time.time() - float(s["time"]))),
    Metric("fetched_total", "counter", "fetches this run made (any answer or failure)",
           _field("fetched")),
    Metric("downloaded_bytes_total", "counter", "body bytes received on the wire this run",
           lambda s: float(s["bytes"]) if "bytes" in s else _field("mb", 1e6)(s)),
    Metric("pages_per_second", "gauge", "fetches a second over the last status interval",
           _field("pages_per_s")),
    Metric("recorded", "gauge", "pages the shard has recorded (MainDB)", _field("done")),
    Metric("pending", "gauge", "URLs waiting to be fetched (PendDB)", _field("pending")),
    Metric("in_flight", "gauge", "URLs claimed and not yet committed", _field("in_flight")),
    Metric("waiting", "gauge", "claimed URLs held in memory waiting for their host's turn",
           _field("waiting")),
    Metric("hosts", "gauge", "hosts with a slot in the politeness scheduler",
           _field("hosts")),
    Metric("hosts_delayed", "gauge", "hosts with URLs waiting whose turn is not yet "
           "(their delay, Crawl-delay, Retry-After or backoff: politeness waits)",
           _field("delayed_hosts")),
    Metric("bad_hosts", "gauge", "hosts in BadHosts (DNS or connect failures)",
           _field("bad_hosts")),
    Metric("outbox", "gauge", "links waiting to be handed to the shards that own them",
           _field("outbox")),
    Metric("uncommitted", "gauge", "outcomes queued for the committer (its lag)",
           _field("uncommitted")),
    Metric("rss_bytes", "gauge", "the shard process's resident memory", _field("rss_mb", 1e6)),
    Metric("memory_budget_bytes", "gauge", "the shard's --memory-budget", _memory("limit")),
    Metric("memory_in_use_bytes", "gauge", "bytes of bodies and parses held now",
           _memory("in_use")),
    Metric("memory_waits_total", "counter", "fetches that waited for the memory budget",
           _memory("waits")),
    Metric("rendered_total", "counter", "pages rendered in the browser (--render-js)",
           _field("rendered")),
    Metric("render_failed_total", "counter", "renders cut (timeout, crash, memory)",
           _field("render_failed")),
    Metric("render_queued", "gauge", "pages waiting for a browser tab", _field("render_queued")),
    Metric("browser_rss_bytes", "gauge", "the rendering browser's resident memory",
           _field("browser_rss_mb", 1e6)),
)
LABELLED = (
    ("pages_total", "class", "classes", "recorded outcomes this run, by class (ok, redirect, "
     "http_4xx, dns, ...: crawler.outcomes)"),
    ("outcomes_total", "outcome", "outcomes", "recorded outcomes this run, by outcome "
     "(an HTTP status, or a failure reason: docs/HOSTILE.md)"),
)
STATUS_OK = ("snapshot_ok", "gauge", "1 when the shard's status.json could be read")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value == int(value) and abs(value) < 1 << 53 else repr(value)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _snapshots(data_dir: str) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(shard label, its snapshot or None when damaged) of every shard that wrote one."""
    count = crawl_count(data_dir)
    for i in range(count):
        try:
            snap = read_status(shard_dir(data_dir, i, count))
        except DataDirError:
            yield str(i), None
            continue
        if snap is not None:
            yield str(i), snap


def metrics_text(data_dir: str) -> str:
    """The exposition text of the crawl in ``data_dir`` (see the module docstring)."""
    shards = list(_snapshots(data_dir))
    lines: list[str] = []

    def family(name: str, kind: str, text: str) -> None:
        lines.append(f"# HELP {PREFIX}{name} {text}")
        lines.append(f"# TYPE {PREFIX}{name} {kind}")

    name, kind, text = STATUS_OK
    family(name, kind, text)
    for shard, snap in shards:
        lines.append(f'{PREFIX}{name}{{shard="{shard}"}} {int(snap is not None)}')
    good = [(shard, snap) for shard, snap in shards if snap is not None]
    for metric in METRICS:
        samples = [(shard, metric.value(snap)) for shard, snap in good]
        present = [(shard, v) for shard, v in samples if v is not None]
        if not present:
            continue
        family(metric.name, metric.kind, metric.help)
        lines += [f'{PREFIX}{metric.name}{{shard="{shard}"}} {_number(v)}'
                  for shard, v in present]
    for name, label, key, text in LABELLED:
        family(name, "counter", text)
        for shard, snap in good:
            counts = snap.get(key) or {}
            lines += [f'{PREFIX}{name}{{shard="{shard}",{label}="{_label(str(k))}"}} {int(n)}'
                      for k, n in sorted(counts.items())]
    return "\n".join(lines) + "\n"
