"""tests/memtmp.py: the tests' files in /dev/shm where it has room, removed once a run
passed, kept for a look after a failure until a later run, never a live run's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import memtmp
import pytest

HERE = Path(__file__).resolve().parent

CONFTEST = """
import os
from pathlib import Path

import memtmp
import pytest

memtmp.roomy = lambda shm, need=0: True  # the test's own directory stands for /dev/shm

@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    memtmp.use_memory(config, Path(os.environ["SHM_DIR"]))
"""

TEST = """
import os

def test_notes_where(tmp_path):
    (tmp_path / "made.txt").write_text("a file of the test's own")
    with open(os.environ["WHERE_FILE"], "w") as f:
        f.write(str(tmp_path))
    assert os.environ.get("INNER_FAILS") != "1"
"""


def test_the_runs_that_ended_are_removed_and_a_held_one_stays(tmp_path: Path) -> None:
    ended = tmp_path / (memtmp.PREFIX + "ended")
    live = tmp_path / (memtmp.PREFIX + "live")
    other = tmp_path / "someone-else"
    for d in (ended, live, other):
        (d / "t").mkdir(parents=True)
    held = memtmp._hold(live, wait=False)  # a run in progress holds its directory
    assert held is not None
    try:
        assert memtmp.remove_ended_runs(tmp_path) == [ended]
    finally:
        os.close(held)
    assert not ended.exists() and (live / "t").is_dir() and (other / "t").is_dir()
    assert memtmp.remove_ended_runs(tmp_path) == [live]  # once its run has ended


def test_only_a_tmpfs_with_room_is_used(tmp_path: Path) -> None:
    assert not memtmp.roomy(tmp_path, need=1)  # a directory, not a tmpfs's mount point
    if memtmp._is_tmpfs(memtmp.SHM):
        free = os.statvfs(memtmp.SHM)
        assert memtmp.roomy(memtmp.SHM, need=1)
        assert not memtmp.roomy(memtmp.SHM, need=free.f_blocks * free.f_frsize + 1)
    else:
        assert not memtmp.roomy(memtmp.SHM, need=1)


def inner_run(where: Path, root: Path, *extra: str, fails: bool = False
              ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(HERE), WHERE_FILE=str(where),
               SHM_DIR=str(root.parent / "shm"), INNER_FAILS="1" if fails else "0",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-c", os.devnull, "--rootdir", str(root), *extra, str(root)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_a_run_works_there_and_removes_its_files_once_it_passed(tmp_path: Path) -> None:
    root, shm = tmp_path / "suite", tmp_path / "shm"
    root.mkdir()
    shm.mkdir()
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_inner.py").write_text(TEST)
    where = tmp_path / "where.txt"
    failed = inner_run(where, root, fails=True)
    assert failed.returncode == pytest.ExitCode.TESTS_FAILED
    run = Path(where.read_text()).parents[1]  # .../kvcrawl-tests-XXXX/t/test_notes_where0
    assert run.parent == shm and run.name.startswith(memtmp.PREFIX)
    assert f"the tests' files are in {run} (in memory" in failed.stdout
    assert list(shm.iterdir()) == [run] and memtmp.holds_files(run)  # kept for a look
    passed = inner_run(where, root)
    assert passed.returncode == pytest.ExitCode.OK, passed.stdout
    assert Path(where.read_text()).parents[1].parent == shm
    assert "the tests' files" not in passed.stdout
    assert list(shm.iterdir()) == []  # the failed run's removed by the next, its own too
    nothing = inner_run(where, root, "-k", "no_such_test")  # no test: no file to keep
    assert nothing.returncode == pytest.ExitCode.NO_TESTS_COLLECTED
    assert "the tests' files" not in nothing.stdout and list(shm.iterdir()) == []
    named = inner_run(where, root, "--basetemp", str(tmp_path / "named"))
    assert named.returncode == pytest.ExitCode.OK
    assert Path(where.read_text()).parent == tmp_path / "named"  # a named one wins
    assert list(shm.iterdir()) == []
