"""Helpers shared by the ``tools/bench_*.py`` benchmarks: memory, disk, machine, workers, tables.

Linux first: RSS is read from ``/proc/self/statm`` (cheap and exact); elsewhere it falls
back to the peak from ``getrusage``. Nothing here imports numpy or the code under test, so
a worker's "fresh interpreter" baseline is not inflated by this module.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class WorkerError(RuntimeError):
    """A benchmark worker exited non-zero or printed no JSON line."""


def rss_bytes() -> int:
    """Resident set size of this process now, in bytes."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except OSError:
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (ru_maxrss is KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def disk_usage(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(sum of file sizes, bytes actually allocated) of every file under ``path``."""
    apparent = allocated = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def warm_page_cache(path: str | os.PathLike[str], chunk: int = 1 << 20) -> int:
    """Read every file under ``path`` once so it sits in the OS page cache; returns bytes read."""
    total = 0
    buf = bytearray(chunk)
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb", buffering=0) as f:
                while got := f.readinto(buf):
                    total += got
    return total


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def mem_total_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def filesystem_of(path: str | os.PathLike[str]) -> str:
    """Filesystem type and device holding ``path`` (longest mount-point prefix in /proc/mounts)."""
    target = os.path.realpath(path)
    best, best_len = "unknown", -1
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) > best_len:
                    best, best_len = f"{fstype} ({dev} on {mnt})", len(mnt)
    except OSError:
        pass
    return best


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(packages: Iterable[str] = ("numpy",)) -> dict[str, Any]:
    """What a reader needs to compare two benchmark runs: CPU, cores, memory, OS, versions."""
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mem_total_bytes": mem_total_bytes(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "packages": {name: package_version(name) for name in packages},
    }


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def run_worker(argv: Sequence[str], *, timeout: float | None = None,
               cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Run ``sys.executable *argv`` in a fresh process; return its last stdout line as JSON."""
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise WorkerError(f"exit {proc.returncode}: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _jsonable(obj: Any) -> Any:
    """numpy scalars (and anything else with ``.item()``) as plain numbers; the rest as text."""
    item = getattr(obj, "item", None)
    return item() if callable(item) else str(obj)


def emit(record: dict[str, Any]) -> None:
    """A worker's one result line on stdout (the parent reads the last line)."""
    sys.stdout.write(json.dumps(record, default=_jsonable) + "\n")
    sys.stdout.flush()


def fmt_rate(x: float | None) -> str:
    """Ops/s as a short human number: 1.23M, 456k, 789."""
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.0f}k"
    return f"{x:.0f}"


def fmt_bytes(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)
