"""Tests of the writing commands of ``python -m kvstore`` (put, delete, and the
write lock of load and compact), of ``--key-of``, of every error a user can
cause (one ``kvstore: error:`` line, the right exit status, nothing left
behind) and of the help texts.

Error paths, the locked store and the permission case run the CLI as a child
process (``sys.executable -m kvstore``); the store is read back with
``kvstore.open`` after each command.
"""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import kvstore
from kvstore import cli
from kvstore.exceptions import StoreLockedError

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 60  # seconds; a hung child fails the test instead of stalling it
COMMANDS = ["dump", "load", "stats", "get", "put", "delete", "verify", "compact"]
KEY_A = kvstore.md5_key("a")  # 0cc175b9c0f1b6a831c399e269772661
KEY_B = kvstore.md5_key("b")
READ_ONLY = "(get, dump, stats, verify)"

# What a command says after "PATH: not a store: " for each kind of PATH.
NOT_A_STORE = {
    "file": "it is a file (a store is a directory)",
    "empty": "the directory is empty",
    "other": "no data-NNNNNN.key and .val files in it",
    "parent": "no data files in it, but it holds stores: {path}/main",
}

Run = Callable[..., subprocess.CompletedProcess[bytes]]


@pytest.fixture
def kv(python: str, child_env: dict[str, str]) -> Run:
    """``kv(*args, stdin=b"")`` runs ``python -m kvstore *args`` as a child process."""

    def run(*args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [python, "-m", "kvstore", *args], input=stdin, capture_output=True,
            env=child_env, cwd=REPO_ROOT, timeout=CHILD_TIMEOUT, check=False,
        )

    return run


def read_store(path: Path) -> dict[bytes, bytes]:
    with kvstore.open(path, readonly=True) as db:
        return {key: db[key] for key in db}


def make_store(path: Path, mapping: dict[bytes, bytes]) -> None:
    with kvstore.open(path) as db:
        for key, value in mapping.items():
            db[key] = value


def assert_error(done: subprocess.CompletedProcess[bytes], message: str, status: int = 1) -> None:
    """The child printed exactly ``kvstore: error: <message>`` on stderr, nothing on stdout."""
    assert (done.returncode, done.stdout, done.stderr.decode()) == (
        status, b"", f"kvstore: error: {message}\n"
    )


def locked(path: Path) -> str:
    return (
        f"{path}: another process has this store open for writing (a crawl in progress?); "
        f"stop it first, or use the read-only commands {READ_ONLY}"
    )


def tree(path: Path) -> list[str]:
    """Every name under ``path`` (to show a failed command left nothing behind)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


class TestPut:
    def test_put_stores_the_literal_value_under_the_hex_key(
        self, store_path: Path, kv: Run
    ) -> None:
        make_store(store_path, {KEY_B: b"other"})
        done = kv("put", str(store_path), KEY_A.hex(), "hello world")
        assert (done.returncode, done.stderr) == (0, b"")
        assert done.stdout.decode() == f"{store_path}: put {KEY_A.hex()}: 11 bytes (new key)\n"
        assert read_store(store_path) == {KEY_A: b"hello world", KEY_B: b"other"}

    def test_put_replaces_and_takes_the_exact_argument_bytes(
        self, store_path: Path, kv: Run
    ) -> None:
        make_store(store_path, {KEY_A: b"old"})
        # Not UTF-8: the argv bytes arrive surrogate-escaped and go back unchanged.
        done = kv("put", str(store_path), "--key-of", "a", b"\xff\xfe caf\xc3\xa9")
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode() == (
            f"{store_path}: put {KEY_A.hex()} (md5 of 'a'): 8 bytes (replaced the old value)\n"
        )
        assert read_store(store_path) == {KEY_A: b"\xff\xfe caf\xc3\xa9"}

    def test_value_file_and_stdin_give_their_bytes(
        self, store_path: Path, tmp_path: Path, kv: Run
    ) -> None:
        make_store(store_path, {})
        blob = bytes(range(256)) * 3
        (tmp_path / "blob").write_bytes(blob)
        assert kv("put", str(store_path), KEY_A.hex(), "--value-file",
                  str(tmp_path / "blob")).returncode == 0
        done = kv("put", "--value-file", "-", str(store_path), "--key-of", "b",
                  stdin=b"a\x00b\n")
        assert done.returncode == 0, done.stderr
        assert read_store(store_path) == {KEY_A: blob, KEY_B: b"a\x00b\n"}

    def test_create_makes_a_store_at_a_missing_path_or_an_empty_directory(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        missing, empty = tmp_path / "new" / "store", tmp_path / "empty"
        empty.mkdir()
        for path in (missing, empty):
            assert cli.main(["put", str(path), "--key-of", "a", "v", "--create"]) == 0
            assert read_store(path) == {KEY_A: b"v"}
        assert capsys.readouterr().err == ""

    def test_empty_value(self, store_path: Path) -> None:
        make_store(store_path, {})
        assert cli.main(["put", str(store_path), "--key-of", "a", ""]) == 0
        assert read_store(store_path) == {KEY_A: b""}


class TestKeyOf:
    def test_key_of_is_md5_of_the_utf8_string(self, store_path: Path, kv: Run) -> None:
        text = "ключ/bücher"  # not ASCII: a wrong encoding gives another md5
        make_store(store_path, {})
        assert kv("put", str(store_path), "--key-of", text, "v").returncode == 0
        assert read_store(store_path) == {hashlib.md5(text.encode("utf-8")).digest(): b"v"}
        done = kv("get", str(store_path), "--key-of", text)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"v\n", b"")

    def test_key_of_a_normalized_url_is_the_crawlers_mainDB_key(
        self, store_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
    ) -> None:
        from crawler.web.urls import normalize, url_key

        urls = [normalize("HTTP://Example.COM:80"), normalize("http://bücher.example/ä?q=1")]
        assert urls == ["http://example.com/", "http://xn--bcher-kva.example/%C3%A4?q=1"]
        make_store(store_path, {url_key(u): u.encode() for u in urls})
        for url in urls:
            assert cli.main(["get", str(store_path), "--key-of", url]) == 0
            assert capsysbinary.readouterr().out == url.encode() + b"\n"
        assert cli.main(["delete", str(store_path), "--key-of", urls[0]]) == 0
        assert read_store(store_path) == {url_key(urls[1]): urls[1].encode()}

    @pytest.mark.parametrize("command", ["get", "put", "delete"])
    def test_a_key_that_is_not_hex_is_one_line_suggesting_key_of(
        self, command: str, store_path: Path, kv: Run
    ) -> None:
        make_store(store_path, {KEY_A: b"x"})
        args = ["http://example.com/", "v"] if command == "put" else ["http://example.com/"]
        done = kv(command, str(store_path), *args)
        assert_error(done, (
            "invalid key 'http://example.com/': a KEY is 32 hex digits (16 bytes); to use the "
            "md5 of a string (e.g. a URL) as the key, give --key-of http://example.com/"
        ), status=2)
        assert read_store(store_path) == {KEY_A: b"x"}

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["get", "S", KEY_A.hex(), "--key-of", "a"],
             "give the key either as KEY or with --key-of STRING, not both"),
            (["get", "S"], "missing KEY (32 hex digits) or --key-of STRING"),
            (["put", "S", KEY_A.hex(), "v", "--key-of", "a"],
             "give the key either as KEY or with --key-of STRING, not both"),
            (["put", "S", "--key-of", "a"], "missing VALUE (or --value-file FILE, - for stdin)"),
            (["put", "S", KEY_A.hex(), "v", "--value-file", "f"],
             "give the value either as VALUE or with --value-file, not both"),
            (["delete", "S"], "give at least one KEY or --key-of STRING"),
        ],
    )
    def test_wrong_key_and_value_arguments_are_usage_errors(
        self, argv: list[str], message: str, store_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        make_store(store_path, {KEY_A: b"x"})
        argv = [str(store_path) if a == "S" else a for a in argv]
        assert cli.main(argv) == 2
        assert capsys.readouterr() == ("", f"kvstore: error: {message}\n")
        assert read_store(store_path) == {KEY_A: b"x"}


class TestDelete:
    def test_delete_removes_exactly_the_keys_given(self, store_path: Path, kv: Run) -> None:
        keep = kvstore.md5_key("keep")
        make_store(store_path, {KEY_A: b"1", KEY_B: b"2", keep: b"3"})
        done = kv("delete", str(store_path), KEY_A.hex(), "--key-of", "b", KEY_A.hex().upper())
        assert (done.returncode, done.stderr) == (0, b"")
        assert done.stdout.decode() == f"{store_path}: deleted 2 keys\n"
        assert read_store(store_path) == {keep: b"3"}

    def test_an_absent_key_deletes_nothing(self, store_path: Path, kv: Run) -> None:
        make_store(store_path, {KEY_A: b"1"})
        done = kv("delete", str(store_path), KEY_A.hex(), "--key-of", "b")
        assert_error(done, (
            f"{store_path}: key not found: {KEY_B.hex()} (md5 of 'b'); nothing deleted "
            "(--missing-ok deletes the others)"
        ))
        assert read_store(store_path) == {KEY_A: b"1"}

    def test_missing_ok_deletes_the_others(
        self, store_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        make_store(store_path, {KEY_A: b"1", KEY_B: b"2"})
        argv = ["delete", str(store_path), "--key-of", "a", "--key-of", "zz", "--missing-ok"]
        assert cli.main(argv) == 0
        assert capsys.readouterr() == (
            f"{store_path}: deleted 1 key; 1 key not found, skipped\n", ""
        )
        assert read_store(store_path) == {KEY_B: b"2"}
        # the deletion is on disk: a reopened writer and a compaction agree
        assert cli.main(["compact", str(store_path)]) == 0
        assert read_store(store_path) == {KEY_B: b"2"}


class TestWhereThereIsNoStore:
    """Every command on a PATH that holds no store: one line, exit 1, nothing created."""

    ARGS = {
        "dump": [], "load": ["-i", os.devnull], "stats": [], "get": [KEY_A.hex()],
        "put": [KEY_A.hex(), "v"], "delete": [KEY_A.hex()], "verify": [], "compact": [],
    }

    @pytest.mark.parametrize("command", [c for c in COMMANDS if c != "load"])
    def test_missing_path(
        self, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "nope"
        assert cli.main([command, str(path), *self.ARGS[command]]) == 1
        assert capsys.readouterr() == ("", f"kvstore: error: {path}: no such store\n")
        assert tree(tmp_path) == []

    # load makes a store in an empty directory (TestLoadLeavesNothing)
    @pytest.mark.parametrize(
        ("command", "kind"),
        [(c, k) for c in COMMANDS for k in NOT_A_STORE if (c, k) != ("load", "empty")],
    )
    def test_not_a_store(
        self, command: str, kind: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        path = tmp_path / "p"
        if kind == "file":
            path.write_bytes(b"not a store")
        else:
            path.mkdir()
        if kind == "other":
            (path / "notes.txt").write_text("x")
        if kind == "parent":  # e.g. a crawl's data directory instead of DIR/main
            make_store(path / "main", {KEY_A: b"x"})
        before = tree(tmp_path)
        assert cli.main([command, str(path), *self.ARGS[command]]) == 1
        hint = "; a new store is made only where PATH is missing or empty"
        hint = hint if command == "load" and kind != "file" else ""
        reason = NOT_A_STORE[kind].format(path=path)
        assert capsys.readouterr() == ("", f"kvstore: error: {path}: not a store: {reason}{hint}\n")
        assert tree(tmp_path) == before
        if kind == "parent":
            assert read_store(path / "main") == {KEY_A: b"x"}

    def test_put_without_create_in_a_child_creates_nothing(self, tmp_path: Path, kv: Run) -> None:
        path = tmp_path / "typo"
        assert_error(kv("put", str(path), "--key-of", "a", "v"), f"{path}: no such store")
        assert tree(tmp_path) == []

    def test_put_create_refuses_a_directory_holding_other_files(
        self, tmp_path: Path, kv: Run
    ) -> None:
        (tmp_path / "notes.txt").write_text("x")
        done = kv("put", str(tmp_path), "--key-of", "a", "v", "--create")
        assert_error(done, (
            f"{tmp_path}: not a store: no data-NNNNNN.key and .val files in it; "
            "a new store is made only where PATH is missing or empty"
        ))
        assert tree(tmp_path) == ["notes.txt"]


class TestLoadLeavesNothing:
    def test_bad_first_line_into_a_new_path_creates_nothing(self, tmp_path: Path, kv: Run) -> None:
        path = tmp_path / "a" / "b"
        done = kv("load", str(path), stdin=b"not a dump line\n")
        assert_error(done, (
            "<stdin>: line 1: expected <32 hex digit key><TAB><escaped value>, found no tab; "
            f"nothing loaded, {path} not created"
        ))
        assert tree(tmp_path) == []

    def test_bad_first_line_into_an_empty_directory_leaves_it_empty(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = tmp_path / "empty"
        path.mkdir()
        src = tmp_path / "in.dump"
        src.write_bytes(b"zz\tv\n")
        assert cli.main(["load", str(path), "-i", str(src)]) == 1
        assert "nothing loaded" in capsys.readouterr().err
        assert tree(path) == []

    def test_empty_input_makes_an_empty_store(self, tmp_path: Path) -> None:
        assert cli.main(["load", str(tmp_path / "s"), "-i", os.devnull]) == 0
        assert read_store(tmp_path / "s") == {}


class TestBadValues:
    def test_missing_value_file(self, store_path: Path, tmp_path: Path, kv: Run) -> None:
        make_store(store_path, {KEY_A: b"x"})
        missing = tmp_path / "absent.bin"
        done = kv("put", str(store_path), "--key-of", "a", "--value-file", str(missing))
        assert_error(done, f"value file {missing}: No such file or directory")
        assert read_store(store_path) == {KEY_A: b"x"}

    def test_value_file_that_is_a_directory_creates_no_store(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "new"
        argv = ["put", str(path), "--key-of", "a", "--value-file", str(tmp_path), "--create"]
        assert cli.main(argv) == 1
        err = f"kvstore: error: value file {tmp_path}: Is a directory\n"
        assert capsys.readouterr() == ("", err)
        assert not path.exists()

    def test_value_over_the_size_limit_writes_nothing(
        self, store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        make_store(store_path, {})
        big = tmp_path / "big.bin"
        with big.open("wb") as f:
            f.truncate(kvstore.DEFAULT_MAX_VALUE_SIZE + 1)  # sparse: no 64 MiB written
        assert cli.main(["put", str(store_path), "--key-of", "a", "--value-file", str(big)]) == 1
        limit = kvstore.DEFAULT_MAX_VALUE_SIZE
        assert capsys.readouterr() == ("", (
            f"kvstore: error: value file {big}: more than the store's max_value_size of "
            f"{limit:,} bytes (64.0 MiB)\n"
        ))
        assert read_store(store_path) == {}


@pytest.fixture
def writer(store_path: Path, python: str, child_env: dict[str, str]) -> Iterator[Path]:
    """A child process holding ``kvstore.open(store_path)`` (as a crawl would) until the
    test ends; the store holds KEY_A -> b"live"."""
    code = (
        "import sys, kvstore\n"
        "db = kvstore.open(sys.argv[1])\n"
        "db[kvstore.md5_key('a')] = b'live'\n"
        "db.flush()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
        "db.close()\n"
    )
    with subprocess.Popen([python, "-c", code, str(store_path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, env=child_env, cwd=REPO_ROOT) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline() == b"ready\n"
            yield store_path
        finally:
            child.stdin.close()
            assert child.wait(timeout=CHILD_TIMEOUT) == 0


class TestLockedStore:
    @pytest.mark.parametrize(
        "args",
        [["put", "--key-of", "a", "new"], ["put", "--key-of", "b", "new", "--create"],
         ["delete", "--key-of", "a"], ["compact"], ["load", "-i", os.devnull]],
        ids=["put", "put-create", "delete", "compact", "load"],
    )
    def test_writing_commands_say_another_process_has_it(
        self, args: list[str], writer: Path, kv: Run
    ) -> None:
        command, *rest = args
        assert_error(kv(command, str(writer), *rest), locked(writer))
        assert read_store(writer) == {KEY_A: b"live"}

    def test_read_only_commands_work_beside_the_writer(self, writer: Path, kv: Run) -> None:
        done = kv("get", str(writer), "--key-of", "a")
        assert (done.returncode, done.stdout, done.stderr) == (0, b"live\n", b"")

    def test_the_lock_is_real(self, writer: Path) -> None:
        with pytest.raises(StoreLockedError):
            kvstore.open(writer)


def test_a_store_not_writable_is_one_line_and_read_only_still_works(
    store_path: Path, unprivileged_child: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    make_store(store_path, {KEY_A: b"x"})
    entries = [store_path, *store_path.iterdir()]
    modes = {p: p.stat().st_mode for p in entries}
    code = "import sys\nfrom kvstore.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    try:
        for p in entries:
            p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
        done = unprivileged_child(code, "put", str(store_path), "--key-of", "b", "v")
        assert (done.returncode, done.stdout, done.stderr) == (1, "", (
            f"kvstore: error: {store_path}: cannot open the store for writing: "
            f"{store_path}/LOCK: Permission denied; the read-only commands {READ_ONLY} "
            "may still work\n"
        ))
        done = unprivileged_child(code, "get", str(store_path), "--key-of", "a")
        assert (done.returncode, done.stdout, done.stderr) == (0, "x\n", "")
    finally:
        for p in entries:
            p.chmod(modes[p])
    assert read_store(store_path) == {KEY_A: b"x"}


class TestHelp:
    def test_top_level_help_lists_every_command_on_one_line(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main(["--help"]) == 0
        out = capsys.readouterr().out
        listed = {}
        for line in out.splitlines():
            name, _, summary = line.strip().partition(" ")
            if line.startswith("    ") and name in COMMANDS:
                listed[name] = summary.strip()
        assert sorted(listed) == sorted(COMMANDS)
        assert all(listed.values()), listed
        assert "\nexamples:\n  python -m kvstore " in out

    @pytest.mark.parametrize("command", COMMANDS)
    def test_every_option_shows_its_default(
        self, command: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        parser = cli.build_parser()
        (sub,) = [a for a in parser._actions if a.dest == "command"]
        options = [
            a for a in sub.choices[command]._actions  # type: ignore[index]
            if a.option_strings and a.dest != "help"
        ]
        assert cli.main([command, "--help"]) == 0
        flat = " ".join(capsys.readouterr().out.split())
        for action in options:
            assert action.help is not None and "(default: " in action.help, action.dest
            assert " ".join(action.help.split()) in flat

    @pytest.mark.parametrize("command", ["get", "put", "delete"])
    def test_key_of_help_says_a_crawl_needs_the_normalized_url(
        self, command: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main([command, "--help"]) == 0
        flat = " ".join(capsys.readouterr().out.split())
        assert "--key-of STRING" in flat
        assert "md5 of STRING's UTF-8 bytes" in flat and "normalized URL" in flat



def test_ctrl_c_is_one_line_and_keeps_the_store(
    store_path: Path, python: str, child_env: dict[str, str]
) -> None:
    make_store(store_path, {KEY_A: b"x"})
    with subprocess.Popen([python, "-m", "kvstore", "load", str(store_path)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=child_env, cwd=REPO_ROOT) as child:
        assert child.stdin is not None and child.stderr is not None
        child.stdin.write(b"%s\tnew\n" % KEY_B.hex().encode())
        child.stdin.flush()
        # Wait until the child blocks reading stdin (syscall 0, fd 0 in Linux's
        # /proc/PID/syscall): it then holds the open store, inside main().
        syscall = Path(f"/proc/{child.pid}/syscall")
        deadline = time.monotonic() + CHILD_TIMEOUT
        while not syscall.read_text().startswith("0 0x0 "):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)  # polling a condition, not timing anything
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=CHILD_TIMEOUT) == 130
        assert child.stderr.read().decode() == f"kvstore: error: interrupted (load {store_path})\n"
    assert read_store(store_path) == {KEY_A: b"x"}
