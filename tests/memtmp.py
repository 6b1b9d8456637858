"""The tests' temporary files in memory, where the machine has room for them.

The suite writes ~2 GB of stores, crawls, indexes and exports under pytest's
``tmp_path``, and syncs many of them (kvstore's fsync, a compaction's renames, a
crawl's commits). On a disk that is I/O wait and the file system's journal: a quiet
run took 10 min 5 s with them on ext4 and 8 min 22 s on tmpfs (docs/PERFORMANCE.md,
the test suite). What the tests prove does not change: a kill -9 leaves the files as
it would on a disk (the page cache is the same), and the tests of a full disk make
file systems of their own.

So when a run names no ``--basetemp``, /dev/shm is a tmpfs with :data:`MIN_FREE` free
and the machine has that much memory available, the run's base temporary directory
is made in /dev/shm. A run that passed removes its directory at its end; a failed or
interrupted one leaves it (the end of the report says where) until the next run that
uses /dev/shm, which removes every earlier run's directory that no run holds any more
(each run holds a lock on its own while it lasts). Elsewhere pytest's own default
stands.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest

SHM = Path("/dev/shm")
PREFIX = "kvcrawl-tests-"
# Free room on the tmpfs, and memory available, for a run to use it: a run's files
# peak at ~2 GB, Ray's object stores and Chromium use /dev/shm too, and the memory a
# tmpfs file takes is the machine's.
MIN_FREE = 8 << 30


def _is_tmpfs(path: Path) -> bool:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            mounts = [line.split() for line in f]
    except OSError:  # not Linux
        return False
    kinds = [m[2] for m in mounts if len(m) > 2 and m[1] == str(path)]
    return bool(kinds) and kinds[-1] == "tmpfs"  # the last mount at a point is the one seen


def _available_memory() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def roomy(path: Path = SHM, need: int = MIN_FREE) -> bool:
    """Whether ``path`` is a tmpfs with ``need`` bytes free, and that much memory is
    available."""
    if not _is_tmpfs(path):
        return False
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize >= need and _available_memory() >= need
    except OSError:
        return False


def _hold(directory: Path, *, wait: bool) -> int | None:
    """A lock on ``directory`` (an open descriptor holding it), or None if another
    process holds it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def holds_files(directory: Path) -> bool:
    """Whether there is a file anywhere under ``directory``."""
    return any(files for _, _, files in os.walk(directory))


def remove_ended_runs(shm: Path = SHM) -> list[Path]:
    """Remove the directories of earlier runs of this user that no run holds; the ones
    removed."""
    removed = []
    for run in sorted(shm.glob(PREFIX + "*")):
        try:
            if run.stat().st_uid != os.getuid():
                continue
            fd = _hold(run, wait=False)
        except OSError:  # removed meanwhile, or not a directory
            continue
        if fd is None:  # a run in progress
            continue
        try:
            shutil.rmtree(run, ignore_errors=True)
            removed.append(run)
        finally:
            os.close(fd)
    return removed


class MemoryTmp:
    """The plugin of one run whose base temporary directory is in /dev/shm."""

    def __init__(self, run: Path) -> None:
        self.run = run
        self.fd = _hold(run, wait=True)  # held while this process lives
        self.passed = False

    @pytest.hookimpl(hookwrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        yield
        self.passed = session.exitstatus == pytest.ExitCode.OK

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter,
                                exitstatus: int) -> None:
        if exitstatus != pytest.ExitCode.OK and holds_files(self.run):
            terminalreporter.write_line(
                f"the tests' files are in {self.run} (in memory: the next run removes them)")

    def pytest_unconfigure(self) -> None:
        if self.passed or not holds_files(self.run):  # (a run no test of which had files)
            shutil.rmtree(self.run, ignore_errors=True)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def use_memory(config: pytest.Config, shm: Path = SHM) -> Path | None:
    """Point the run's ``--basetemp`` into ``shm`` when it is roomy and the user named
    none (in the controller only: pytest-xdist hands each worker a directory under it);
    the run's directory, or None."""
    if config.option.basetemp is not None or hasattr(config, "workerinput"):
        return None
    if not roomy(shm):
        return None
    remove_ended_runs(shm)
    run = Path(tempfile.mkdtemp(prefix=PREFIX, dir=shm))
    # pytest empties the basetemp it is given: a directory inside ours, whose lock stays
    config.option.basetemp = str(run / "t")
    config.pluginmanager.register(MemoryTmp(run), "tests-in-memory")
    return run
