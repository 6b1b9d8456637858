"""A pytest plugin: the whole machine's CPU around each test, to find the tests the
suite's time goes to. Not a test.

Usage (from the repository root, on a quiet machine, one process so that the figures
are each test's own)::

    python -m pytest -q -n 0 -p no:cacheprovider -p tools.pytest_cpu tests/crawler/test_ray.py
    PYTEST_CPU_TOP=0 python -m pytest -q -n 0 -p tools.pytest_cpu tests/   # every test

At the end it prints, slowest first, each test's CPU-seconds (the machine's busy time
from /proc/stat across its setup, call and teardown: its servers, subprocesses,
browsers and Ray daemons included, so another load on the machine counts too), its
wall seconds, and how many processes and threads the machine started meanwhile (fork
and clone calls, /proc/stat's ``processes``). PYTEST_CPU_TOP: how many rows (default 40,
0 for all). Under pytest-xdist the workers' rows are not gathered: use ``-n 0``. Linux
only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator

import pytest

from tools.suite_cpu import busy_seconds

_rows: list[tuple[float, float, int, str]] = []


def started_tasks() -> int:
    """Processes and threads the machine has started since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("processes "):
                return int(line.split()[1])
    raise RuntimeError("/proc/stat has no processes line")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    cpu, wall, tasks = busy_seconds(), time.monotonic(), started_tasks()
    yield
    _rows.append((busy_seconds() - cpu, time.monotonic() - wall, started_tasks() - tasks,
                  item.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _rows:
        return
    top = int(os.environ.get("PYTEST_CPU_TOP", "40")) or len(_rows)
    rows = sorted(_rows, reverse=True)
    terminalreporter.write_sep("=", f"CPU by test, the whole machine's ({len(rows)} tests)")
    terminalreporter.write_line(f"{'CPU s':>8} {'wall s':>8} {'started':>8}  test")
    for cpu, wall, tasks, nodeid in rows[:top]:
        terminalreporter.write_line(f"{cpu:8.1f} {wall:8.1f} {tasks:8d}  {nodeid}")
    terminalreporter.write_line(f"{sum(r[0] for r in rows):8.1f} {'':8} {'':8}  all")
