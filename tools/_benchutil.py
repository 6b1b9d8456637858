"""Helpers shared by the ``tools/bench_*.py`` benchmarks: memory, disk, machine, workers, tables.

Linux first: RSS is read from ``/proc/self/statm`` (cheap and exact); elsewhere it falls
back to the peak from ``getrusage``. Nothing here imports numpy or the code under test, so
a worker's "fresh interpreter" baseline is not inflated by this module.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
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
    """Peak resident set size of this process so far, in bytes: VmHWM where /proc has it.
    Not ``ru_maxrss`` there: Linux carries the parent's high-water mark into a child
    across fork/vfork and exec, so a worker of a big parent would report the parent's."""
    hwm = _vm_status(os.getpid()).get("VmHWM")
    if hwm:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # KiB on Linux


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


def nginx_binary(tool: str) -> str:
    """The nginx to serve a benchmark's site; exits with how to install it if absent."""
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(found):
        raise SystemExit(f"{tool}: nginx not found: tools/install-system-packages installs "
                         "it (Debian's nginx-light)")
    return found


def write_results(path: Path, result: dict[str, Any], text: str) -> None:
    """End a benchmark: the load now into ``result["machine"]``, ``result`` as JSON at
    ``path``, ``text`` (its table) on stdout, where it went on stderr."""
    result["machine"]["load_end"] = loadavg()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(text)
    log(f"wrote {path}")


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


_MEM_FIELDS = ("VmHWM:", "VmRSS:", "RssAnon:", "RssFile:")


def _vm_status(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS), VmRSS, RssAnon and RssFile of a live process in bytes ({} once it is
    gone or a zombie)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(_MEM_FIELDS):
                    name, value = line.split()[:2]
                    out[name[:-1]] = int(value) * 1024
    except (OSError, ValueError):
        return {}
    return out if "VmHWM" in out else {}


def child_pids(pid: int) -> list[int]:
    """Children of ``pid``'s main thread (where ``subprocess`` forks); [] if unknown."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def run_measured(cmd: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None, timeout: float | None = None,
                 stdout_path: str | os.PathLike[str] = os.devnull,
                 stderr_path: str | os.PathLike[str] = os.devnull,
                 poll: float = 0.02) -> dict[str, Any]:
    """Run ``cmd`` in a fresh process and return its own resource use.

    Peak RSS is the largest ``VmHWM`` read from ``/proc/PID/status`` every ``poll`` seconds
    while the child runs. Not ``ru_maxrss``: Linux carries the *parent's* RSS high-water mark
    into a child across fork (vfork) + exec, so a benchmark parent holding a 400 MB site
    would floor every child's ``ru_maxrss`` at 400 MB (kept as ``ru_maxrss_bytes``, for
    reference). ``tree_peak_rss_bytes`` is the largest sum of VmRSS over the child and
    its descendants seen at one poll (a sharded crawler's whole process tree). CPU comes
    from ``os.wait4``: this child's rusage, which includes the descendants it reaped.
    Descendants (e.g. a crawler started by a wrapper) are polled too and reported in
    ``descendants`` as ``{"pid", "cmd", "peak_rss_bytes"}``. Output goes to files, never to
    a pipe that could fill. Past ``timeout`` the child is killed (by its pid) and
    ``timed_out`` is set. Other keys: ``returncode``, ``wall_s``, ``peak_rss_bytes``,
    ``rss_anon_at_peak_bytes`` and ``rss_file_at_peak_bytes`` (anonymous memory and mapped
    files, read when the polled RSS was highest), ``cpu_s``, ``utime_s``, ``stime_s``.
    """
    peaks: dict[int, int] = {}
    cmds: dict[int, str] = {}
    at_peak: dict[str, int] = {}  # the child's RSS split when its RSS was highest
    tree_peak = 0  # the largest sum of VmRSS over the child and its descendants at one poll
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        started = time.monotonic()
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=out, stderr=err)
        timed_out = False
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                todo = [proc.pid]
                tree = 0
                while todo:
                    p = todo.pop()
                    vm = _vm_status(p)
                    if vm:
                        tree += vm.get("VmRSS", 0)
                        peaks[p] = max(peaks.get(p, 0), vm["VmHWM"])
                        if p not in cmds:
                            cmds[p] = _cmdline(p)
                        if p == proc.pid and vm.get("VmRSS", 0) >= at_peak.get("VmRSS", 0):
                            at_peak = vm
                    todo += child_pids(p)
                tree_peak = max(tree_peak, tree)
                if timeout is not None and time.monotonic() - started > timeout and not timed_out:
                    timed_out = True
                    proc.kill()
                time.sleep(poll)
        except BaseException:  # Ctrl-C or SIGTERM of the benchmark: leave no crawler behind
            proc.kill()
            proc.wait()
            raise
        wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
    maxrss = usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024
    return {
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(wall, 3),
        "peak_rss_bytes": peaks.get(proc.pid, maxrss),
        "tree_peak_rss_bytes": tree_peak or peaks.get(proc.pid, maxrss),
        "ru_maxrss_bytes": maxrss,
        "rss_anon_at_peak_bytes": at_peak.get("RssAnon"),
        "rss_file_at_peak_bytes": at_peak.get("RssFile"),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "utime_s": round(usage.ru_utime, 3),
        "stime_s": round(usage.ru_stime, 3),
        "descendants": [{"pid": p, "cmd": cmds.get(p, ""), "peak_rss_bytes": v}
                        for p, v in peaks.items() if p != proc.pid],
    }


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (the machine is shared: record them with results)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_revision(repo: str | os.PathLike[str]) -> dict[str, Any]:
    """The commit under test and whether the code differs from it (read-only git calls).

    Runs are fresh processes that import whatever is on disk, so a long benchmark on a tree
    that others are editing should record this at its start and end."""

    def git(*args: str) -> str:  # "" where git fails, or is not installed
        try:
            proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  text=True, check=False)
        except OSError:
            return ""
        return proc.stdout.rstrip("\n") if proc.returncode == 0 else ""

    status = git("status", "--porcelain", "--untracked-files=no", "--", "crawler", "kvstore")
    diff = git("diff", "HEAD", "--", "crawler", "kvstore")
    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": sorted(line[3:] for line in status.splitlines()),
            "diff_sha1": hashlib.sha1(diff.encode()).hexdigest() if diff else None}


def tree_rss(pid: int, field: str = "VmRSS") -> tuple[int, int]:
    """(sum of VmRSS in bytes, live processes) over ``pid`` and its descendants now ((0, 0)
    once it is gone): one sample of the polling ``run_measured`` does, for loops of their own.
    ``field="RssAnon"``: the anonymous part only (VmRSS also counts the file pages a
    process maps, such as a store's mmap, which the kernel can drop at any time)."""
    total = count = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        vm = _vm_status(p)
        if vm:
            total += vm.get(field, 0)
            count += 1
        todo += child_pids(p)
    return total, count


# -- for the crawl benchmarks (bench_crawl, bench_broad) -------------------------------

_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
_REPO = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    """Progress, on stderr (the results go to stdout)."""
    print(msg, file=sys.stderr, flush=True)


def child_env() -> dict[str, str]:
    """The environment of every crawler: the repository importable, no proxy (loopback only)."""
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
    env["PYTHONPATH"] = str(_REPO)
    env["NO_PROXY"] = env["no_proxy"] = "*"
    return env


def crawl_summary(stdout: str) -> tuple[str, dict[str, Any]] | None:
    """The last ``crawl ...: {json}`` line ``python -m crawler start`` printed, and its
    JSON; None when there is none (the crawler died before its summary)."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("crawl ")), "")
    if not line:
        return None
    return line, json.loads(line.split(": ", 1)[1])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
