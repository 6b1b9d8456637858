"""Skips and fallbacks are never silent.

- A skip names its reason in the summary (``-ra`` in setup.cfg). When the ``CI``
  environment variable is set, a test that skipped fails the run, unless it is
  marked ``@pytest.mark.ci_may_skip("why CI may skip it")``. A module skipped
  whole (at collection) always counts.
- A test that ran a weaker variant of itself (a fallback) says so through the
  ``fallback`` fixture: ``fallback("no tmpfs here: a file size limit instead")``.
  Each fallback is a line at the end of the report (and a ``fallback`` property
  in JUnit XML).
- The suite runs on pytest-xdist workers, a file to a worker (setup.cfg's addopts),
  the files with the most tests marked ``slow`` first; ``-n 0`` runs it in one process.
- A test that needs a system package (tools/system-packages.txt) is marked
  ``@pytest.mark.system_packages("nftables", ...)``: where one is missing it skips,
  naming the package and ``tools/install-system-packages``. Such a skip fails a CI run
  even in a test marked ``ci_may_skip`` (CI installs every package of the list).
- The project's packages are compiled to bytecode once, before the workers start
  (:func:`compile_once`).
- The tests' temporary files are in memory (/dev/shm) where the machine has room for
  them, unless ``--basetemp`` says where (tests/memtmp.py).
"""

from __future__ import annotations

import compileall
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import memtmp
import pytest

from tools import system_packages

CI_MAY_SKIP = "ci_may_skip"
COMPILED = ("crawler", "kvstore", "tools")  # what the suite's subprocesses import
MAX_WORKERS = 8
SYSTEM_PACKAGES = "system_packages"

# A run started in the background of a non-interactive shell (``pytest &``, nohup) has
# SIGINT ignored, and every child inherits that: a crawl, an export or a server the tests
# stop with SIGINT (Ctrl-C) would then ignore it, and those tests fail or hang for a
# reason that is not the code's. A handler (unlike SIG_IGN) is reset by exec, so with
# Python's own handler here the children start as a terminal user's would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class _Watch:
    """Collects the run's unexpected skips and its fallbacks; reports them at the end."""

    def __init__(self) -> None:
        self.skipped: list[str] = []
        self.fallbacks: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            if CI_MAY_SKIP not in report.keywords or _missing_package(report):
                self.skipped.append(report.nodeid)
        if report.when == "teardown":  # its user_properties hold every phase's
            notes = [v for k, v in report.user_properties if k == "fallback"]
            self.fallbacks += [(report.nodeid, str(v)) for v in notes]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.skipped.append(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if os.environ.get("CI") and self.skipped and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for nodeid, reason in self.fallbacks:
            terminalreporter.write_line(f"FALLBACK {nodeid}: {reason}", yellow=True)
        if os.environ.get("CI") and self.skipped:
            terminalreporter.write_line(
                f"CI: {len(self.skipped)} skipped without @pytest.mark.{CI_MAY_SKIP} or for a "
                f"missing system package, which fails the run: {', '.join(self.skipped)}",
                red=True,
            )


def _missing_package(report: pytest.TestReport) -> bool:
    """Whether the test skipped for a missing system package (tools/system_packages.py)."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
    return reason.removeprefix("Skipped: ").startswith(system_packages.MISSING)


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    memtmp.use_memory(config)
    config.addinivalue_line(
        "markers",
        f"{CI_MAY_SKIP}(reason): this test may skip in CI (the reason says why); "
        "any other skip fails the run when CI is set",
    )
    config.addinivalue_line(
        "markers",
        f"{SYSTEM_PACKAGES}(*names): the test needs these packages of "
        "tools/system-packages.txt, and skips naming the missing ones (never in CI)",
    )
    config.pluginmanager.register(_Watch(), "skip-and-fallback-watch")
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers)
        compile_once(Path(__file__).resolve().parent.parent)


def compile_once(repo: Path) -> None:
    """The project's modules compiled to ``__pycache__`` (what an import does by itself,
    unless PYTHONDONTWRITEBYTECODE is set, as on the machines CI runs on): the suite starts
    ~1,600 Python processes (crawls, shards, Ray workers, commands), and without the
    bytecode each compiled the ~100 modules it imports from source again, a quarter of the
    CPU a shard's start takes. Only what is missing or stale is compiled; a tree that
    cannot be written is left as it is (the imports then compile, as before)."""
    for name in COMPILED:
        compileall.compile_dir(repo / name, quiet=2)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which -p no:xdist leaves out
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (setup.cfg's addopts): a worker for each core this run may use, and one
    more, since most of the suite's time is spent waiting (on servers, subprocesses and
    politeness delays: 2 cores were ~70% busy with 3 workers); at most 8 (a worker with its
    imports is ~0.7 GB, and each test starts servers and crawls of its own).
    PYTEST_XDIST_AUTO_NUM_WORKERS says otherwise, as in pytest-xdist."""
    named = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if named:
        return int(named)
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")  # (not macOS)
             else os.cpu_count() or 1)
    return min(MAX_WORKERS, cores + 1)


def slow_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The files with the most tests marked ``slow`` first, then the rest in the order
    collected: pytest-xdist hands out whole files in this order (``--dist loadfile
    --no-loadscope-reorder``), so a long file never starts when the other workers are
    about done."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow") is not None)
    return sorted(items, key=lambda item: -slow[item.path])  # stable: a file stays whole


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = slow_files_first(items)
    for item in items:  # a skip mark, so the skip is reported at the test's own line
        names = [n for mark in item.iter_markers(SYSTEM_PACKAGES) for n in mark.args]
        try:
            why = system_packages.missing(*names) if names else None
        except ValueError as exc:  # a name not in the list: a typo, or a list to extend
            raise pytest.UsageError(f"{item.nodeid}: {exc}") from None
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def fallback(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Call it with the reason when the test falls back on a weaker variant of itself."""

    def note(reason: str) -> None:
        request.node.user_properties.append(("fallback", reason))

    return note
