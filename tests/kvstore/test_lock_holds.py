"""The writer lock holds on the store directory itself (issue 42 §3).

Deleting ``LOCK`` (or anything else in a store directory that is not its data: the
saved index, ``recovered/``) while a writer is open must not let a second writer
in. The holder is a real second process: a child that opens the store for writing
and waits for orders on stdin; the contenders are further children (``kvstore.open``
and ``python -m kvstore``) and this process.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import kvstore
from kvstore import _datafiles
from kvstore.exceptions import StoreLockedError

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 60  # seconds; a hung child fails the test instead of stalling it
KEY_A = kvstore.md5_key("a")
KEY_B = kvstore.md5_key("b")

HOLDER = """
import sys, kvstore
db = kvstore.open(sys.argv[1])
db[kvstore.md5_key("a")] = b"held"
db.flush()
print("ready")
for line in sys.stdin:
    if line.strip() == "compact":
        db.compact()
        print("compacted")
    elif line.strip() == "close":
        break
db.close()
print("closed")
"""

OLD_WRITER = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[1], "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # all an older kvstore's writer locks
print("ready")
sys.stdin.read()
"""

SECOND_WRITER = """
import sys, kvstore
from kvstore.exceptions import StoreLockedError
try:
    db = kvstore.open(sys.argv[1])
except StoreLockedError as exc:
    print("locked:", exc)
else:
    db[kvstore.md5_key("b")] = b"second"
    db.close()
    print("opened")
"""


class Child:
    """A child Python running ``code`` with the store's path, talked to by lines."""

    def __init__(self, code: str, path: Path, env: dict[str, str], python: str) -> None:
        self.proc = subprocess.Popen(
            [python, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, cwd=REPO_ROOT, text=True,
        )
        assert self.readline() == "ready"

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def say(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.readline()

    def finish(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        assert self.proc.wait(timeout=CHILD_TIMEOUT) == 0
        if self.proc.stdout is not None:
            self.proc.stdout.close()


Spawn = Callable[[str, Path], "Child"]


@pytest.fixture
def spawn(python: str, child_env: dict[str, str]) -> Iterator[Spawn]:
    children: list[Child] = []

    def start(code: str, path: Path) -> Child:
        children.append(Child(code, path, child_env, python))
        return children[-1]

    yield start
    for child in children:
        if child.proc.poll() is None:
            child.proc.kill()
        child.proc.wait(timeout=CHILD_TIMEOUT)
        for stream in (child.proc.stdin, child.proc.stdout):
            if stream is not None:
                stream.close()


def second_writer(python: str, env: dict[str, str], path: Path) -> str:
    done = subprocess.run(
        [python, "-c", SECOND_WRITER, str(path)], env=env, cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def kv(python: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "kvstore", *args], env=env, cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )


def locked_line(path: Path) -> str:
    return (
        f"kvstore: error: {path}: another process has this store open for writing "
        "(a crawl in progress?); stop it first, or use the read-only commands "
        "(get, dump, stats, verify)\n"
    )


def remove_what_is_not_data(path: Path) -> list[str]:
    """Delete what a user might take for litter: LOCK, the saved index, recovered/."""
    gone = []
    for entry in sorted(path.iterdir()):
        if entry.name == "LOCK" or entry.suffix == ".idx" or entry.name == "recovered":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            gone.append(entry.name)
    return gone


def make_store(path: Path) -> None:
    """A store closed cleanly (so it has a saved index), with a recovered/ beside it."""
    with kvstore.open(path) as db:
        db[KEY_A] = b"first"
    (path / "recovered").mkdir(exist_ok=True)
    (path / "recovered" / "note").write_bytes(b"x")


class TestTwoProcesses:
    def test_deleting_lock_and_litter_lets_no_second_writer_in(
        self, store_path: Path, spawn: Spawn, python: str, child_env: dict[str, str]
    ) -> None:
        make_store(store_path)
        holder = spawn(HOLDER, store_path)
        gone = remove_what_is_not_data(store_path)
        assert "LOCK" in gone and "recovered" in gone and any(g.endswith(".idx") for g in gone)
        out = second_writer(python, child_env, store_path)
        assert out == f"locked: {store_path}: store is locked by another writer; " \
                      "close it first, or open with readonly=True"
        with pytest.raises(StoreLockedError):
            kvstore.open(store_path)  # this process too
        with pytest.raises(StoreLockedError):
            kvstore.repair(str(store_path))
        with kvstore.open(store_path, readonly=True) as db:  # readers take no lock
            assert db[KEY_A] == b"held"
        assert holder.say("close") == "closed"
        holder.finish()
        assert second_writer(python, child_env, store_path) == "opened"
        assert (store_path / "LOCK").exists()  # made again, for older releases
        with kvstore.open(store_path, readonly=True) as db:
            assert {k: db[k] for k in db} == {KEY_A: b"held", KEY_B: b"second"}

    @pytest.mark.parametrize(
        "args",
        [["put", "--key-of", "b", "new"], ["delete", "--key-of", "a"], ["compact"],
         ["load", "-i", os.devnull]],
        ids=["put", "delete", "compact", "load"],
    )
    def test_the_cli_says_one_line(
        self, args: list[str], store_path: Path, spawn: Spawn, python: str,
        child_env: dict[str, str],
    ) -> None:
        make_store(store_path)
        holder = spawn(HOLDER, store_path)
        remove_what_is_not_data(store_path)
        command, *rest = args
        done = kv(python, child_env, command, str(store_path), *rest)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", locked_line(store_path))
        done = kv(python, child_env, "get", str(store_path), "--key-of", "a")
        assert (done.returncode, done.stdout, done.stderr) == (0, "held\n", "")
        assert holder.say("close") == "closed"
        holder.finish()

    def test_the_lock_outlives_a_compaction(
        self, store_path: Path, spawn: Spawn, python: str, child_env: dict[str, str]
    ) -> None:
        make_store(store_path)
        holder = spawn(HOLDER, store_path)
        before = sorted(p.name for p in store_path.glob("data-*.key"))
        assert holder.say("compact") == "compacted"
        assert sorted(p.name for p in store_path.glob("data-*.key")) != before  # swapped
        remove_what_is_not_data(store_path)
        assert second_writer(python, child_env, store_path).startswith("locked:")
        assert holder.say("close") == "closed"
        holder.finish()
        assert second_writer(python, child_env, store_path) == "opened"

    def test_an_older_releases_writer_on_lock_is_respected(
        self, store_path: Path, spawn: Spawn, python: str, child_env: dict[str, str]
    ) -> None:
        make_store(store_path)
        old = spawn(OLD_WRITER, store_path)
        assert second_writer(python, child_env, store_path).startswith("locked:")
        with pytest.raises(StoreLockedError):
            kvstore.open(store_path)
        old.finish()
        assert second_writer(python, child_env, store_path) == "opened"

    def test_an_older_releases_writer_that_comes_later_is_refused(
        self, store_path: Path, python: str, child_env: dict[str, str]
    ) -> None:
        """The other order: a writer of this release holds LOCK's flock too, so an older
        release's writer (which locks LOCK alone) opened after it is refused."""
        make_store(store_path)
        old_writer = [python, "-c", OLD_WRITER, str(store_path)]
        with kvstore.open(store_path):
            late = subprocess.run(old_writer, input="", capture_output=True, text=True,
                                  env=child_env, timeout=60)
            assert late.returncode != 0 and "BlockingIOError" in late.stderr
        done = subprocess.run(old_writer, input="", capture_output=True, text=True,
                              env=child_env, timeout=60)
        assert done.returncode == 0 and done.stdout == "ready\n"  # released at the close


class TestOneProcess:
    def test_other_fds_of_the_directory_do_not_drop_the_lock(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            (store_path / "LOCK").unlink()
            _datafiles.fsync_dir(str(store_path))  # opens and closes the directory
            with kvstore.open(store_path, readonly=True) as reader:
                assert len(reader) == 0
            with pytest.raises(StoreLockedError):
                kvstore.open(store_path)
            db[KEY_A] = b"x"
        with kvstore.open(store_path) as db:  # closing released it
            assert db[KEY_A] == b"x"

    def test_a_failed_open_leaves_no_lock_behind(self, store_path: Path) -> None:
        with kvstore.open(store_path):
            for _ in range(3):
                with pytest.raises(StoreLockedError):
                    kvstore.open(store_path)
        kvstore.open(store_path).close()

    def test_where_a_directory_cannot_be_locked_lock_is_used(
        self, store_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = fcntl.flock

        def no_directory_locks(fd: int, op: int) -> None:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                raise OSError(errno.EBADF, os.strerror(errno.EBADF))  # as NFS does
            real(fd, op)

        monkeypatch.setattr(fcntl, "flock", no_directory_locks)  # as _datafiles calls it
        with kvstore.open(store_path):
            with pytest.raises(StoreLockedError):
                kvstore.open(store_path)
        kvstore.open(store_path).close()
