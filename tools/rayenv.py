"""A Ray cluster's environment and its end, for the tests and tools/cluster.py.

A test cluster is told apart from every other Ray on the machine by its own auth
token: every process of it (GCS, raylet, agents, workers) inherits ``RAY_AUTH_TOKEN``
from ``ray start``, so ``stop_cluster(token)`` ends that cluster only (``ray stop``
would end every Ray on the machine).
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GRACE = 15.0  # seconds a SIGTERM is given before the next step (not a limit: SIGKILL follows)


def new_token() -> str:
    return secrets.token_hex(32)


def ray_env(token: str, *, loopback: bool = True) -> dict[str, str]:
    """The environment of ``ray start`` and of a driver: this checkout importable, no
    usage reports, token auth; ``loopback``: every server on 127.0.0.1 (Ray's
    one-machine switch; tools/cluster.py's nodes bind their own addresses instead)."""
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
    )
    if loopback:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    else:
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    return env


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def token_pids(token: str) -> list[int]:
    """The live processes whose environment holds this cluster's token (not this one)."""
    mark = f"RAY_AUTH_TOKEN={token}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return [p for p in pids if alive(p)]


def _is_gcs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.path.basename(f.read().split(b"\0")[0]) == b"gcs_server"
    except OSError:
        return False


def _end(pids: Callable[[], list[int]], sig: signal.Signals) -> None:
    for pid in pids():
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE
    while pids() and time.monotonic() < deadline:
        time.sleep(0.1)


def stop_cluster(token: str) -> None:
    """End this cluster only: each of its processes, servers, agents (which rename
    themselves) and workers.

    The GCS server goes last: sent SIGTERM together with the raylet it stayed up for
    more than 20 s (so every teardown waited out the grace period), while after the
    raylet and the rest are gone it ends within a second."""
    gcs = [p for p in token_pids(token) if _is_gcs(p)]
    _end(lambda: [p for p in token_pids(token) if p not in gcs], signal.SIGTERM)
    _end(lambda: token_pids(token), signal.SIGTERM)
    _end(lambda: token_pids(token), signal.SIGKILL)


__all__ = ["REPO", "alive", "new_token", "ray_env", "stop_cluster", "token_pids"]
