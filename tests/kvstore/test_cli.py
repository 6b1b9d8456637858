"""Tests of ``python -m kvstore`` (kvstore/cli/): the line format, dump, load,
stats, get, verify, compact, help and docs. put, delete, --key-of and the
error paths run as child processes in test_cli_write.py.

Most tests call ``main([...])`` in-process against real stores in tmp_path;
TestProcess runs the module as a real child process (the entry point, pipes,
a store locked by this process).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvstore
from kvstore import cli
from kvstore.cli import _write as _cli_write

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI_DOC = REPO_ROOT / "docs" / "CLI.md"
CHILD_TIMEOUT = 60  # seconds; a hung child fails the test instead of stalling it
COMMANDS = ["dump", "load", "stats", "get", "put", "delete", "verify", "compact", "repair"]

keys16 = st.binary(min_size=16, max_size=16)
# Values rich in the bytes the escaping must handle, plus plain random bytes.
tricky_values = st.one_of(
    st.binary(max_size=200),
    st.lists(
        st.sampled_from(
            [b"\n", b"\t", b"\r", b"\\", b"\x00", b"\x7f", b"\x80", b"\xff", b"a", b" ",
             b"\\x41", b"\\n", b"'", b'"']
        ),
        max_size=40,
    ).map(b"".join),
)


def reference_escape(value: bytes) -> bytes:
    """The value escaping exactly as docs/CLI.md states it, byte by byte."""
    named = {0x5C: b"\\\\", 0x09: b"\\t", 0x0A: b"\\n", 0x0D: b"\\r"}
    out = []
    for b in value:
        if b in named:
            out.append(named[b])
        elif 0x20 <= b <= 0x7E:
            out.append(bytes([b]))
        else:
            out.append(b"\\x%02x" % b)
    return b"".join(out)


def reference_lines(mapping: Mapping[bytes, bytes]) -> set[bytes]:
    return {k.hex().encode() + b"\t" + reference_escape(v) + b"\n" for k, v in mapping.items()}


def locked_line(path: Path) -> str:
    """What a command that needs the write lock prints while another writer holds it."""
    return (
        f"kvstore: error: {path}: another process has this store open for writing "
        "(a crawl in progress?); stop it first, or use the read-only commands "
        "(get, dump, stats, verify)\n"
    )


def make_store(path: Path, mapping: Mapping[bytes, bytes]) -> None:
    with kvstore.open(path) as db:
        for key, value in mapping.items():
            db[key] = value


def read_store(path: Path) -> dict[bytes, bytes]:
    with kvstore.open(path, readonly=True) as db:
        return {key: db[key] for key in db}


def dump_lines(path: Path, out: Path) -> set[bytes]:
    assert cli.main(["dump", str(path), "-o", str(out)]) == 0
    lines = out.read_bytes().splitlines(keepends=True)
    assert len(lines) == len(set(lines))
    return set(lines)


def feed_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))


def sample(n: int, size: int = 20) -> dict[bytes, bytes]:
    return {kvstore.md5_key(str(i)): (b"v%d-" % i) * (size // 4 + 1) for i in range(n)}


class TestLineFormat:
    def test_every_byte_escapes_as_documented(self) -> None:
        for b in range(256):
            assert cli.escape_value(bytes([b])) == reference_escape(bytes([b])), hex(b)

    @given(key=keys16, value=tricky_values)
    def test_record_round_trips_and_is_one_printable_line(self, key: bytes, value: bytes) -> None:
        line = cli.format_record(key, value)
        assert line == key.hex().encode() + b"\t" + reference_escape(value) + b"\n"
        body = line[:-1]
        assert body.count(b"\t") == 1 and b"\n" not in body
        assert all(0x20 <= b <= 0x7E or b == 0x09 for b in body)
        assert cli.parse_record(line) == (key, value)
        assert cli.parse_record(body) == (key, value)  # last line may lack its newline

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            (b"\n", "found no tab"),
            (b"00112233445566778899aabbccddeeff\n", "found no tab"),
            (b"00112233445566778899AABBCCDDEEFF\tx\n", "32 lowercase hex digits"),
            (b"00112233445566778899aabbccddee\tx\n", "32 lowercase hex digits"),
            (b"00112233445566778899aabbccddeeff\tab\\q\n", "column 36: invalid escape '\\q'"),
            (b"00112233445566778899aabbccddeeff\t\\xAB\n", "column 34: invalid escape"),
            (b"00112233445566778899aabbccddeeff\t\\x4\n", "column 34: invalid escape"),
            (b"00112233445566778899aabbccddeeff\tend\\\n", "column 37: invalid escape"),
            (b"00112233445566778899aabbccddeeff\ta\tb\n", "column 35: byte 0x09"),
            (b"00112233445566778899aabbccddeeff\tcrlf\r\n", "column 38: byte 0x0d"),
            (b"00112233445566778899aabbccddeeff\t\xc3\xa9\n", "column 34: byte 0xc3"),
        ],
    )
    def test_parse_rejects_malformed_lines(self, line: bytes, message: str) -> None:
        with pytest.raises(ValueError, match=re.escape(message)):
            cli.parse_record(line)


class TestDump:
    def test_dump_writes_every_live_record_once(
        self, store_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
    ) -> None:
        mapping = sample(50)
        mapping[b"\x00" * 16] = b""
        mapping[b"\xff" * 16] = bytes(range(256))
        with kvstore.open(store_path) as db:
            for key, value in mapping.items():
                db[key] = b"old value, overwritten below"
                db[key] = value
            for key in list(mapping)[:10]:
                del db[key]
                del mapping[key]
        assert cli.main(["dump", str(store_path)]) == 0
        out, err = capsysbinary.readouterr()
        assert err == b""
        lines = out.splitlines(keepends=True)
        assert len(lines) == len(mapping)
        assert set(lines) == reference_lines(mapping)

    def test_dump_to_file(self, store_path: Path, tmp_path: Path) -> None:
        mapping = sample(5)
        make_store(store_path, mapping)
        assert dump_lines(store_path, tmp_path / "out.dump") == reference_lines(mapping)

    def test_dump_of_empty_store_is_empty(
        self, store_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
    ) -> None:
        make_store(store_path, {})
        assert cli.main(["dump", str(store_path)]) == 0
        assert capsysbinary.readouterr() == (b"", b"")

    def test_dump_missing_store_is_an_error_and_creates_nothing(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        missing = tmp_path / "nope"
        assert cli.main(["dump", str(missing)]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("kvstore: error: ") and err.count("\n") == 1
        assert not missing.exists()

    def test_dump_sees_flushed_records_of_a_live_writer(
        self, store: kvstore.Store, store_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
    ) -> None:
        mapping = sample(20)
        store.put_many(list(mapping), list(mapping.values()))
        store.flush()
        assert cli.main(["dump", str(store_path)]) == 0
        assert set(capsysbinary.readouterr().out.splitlines(True)) == reference_lines(mapping)


class TestLoad:
    def test_load_from_stdin_creates_the_store(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        mapping = sample(30) | {b"k" * 16: b"\n\t\\\x00\xff"}
        feed_stdin(monkeypatch, b"".join(sorted(reference_lines(mapping))))
        target = tmp_path / "new"
        assert cli.main(["load", str(target)]) == 0
        assert capsys.readouterr().out == f"loaded 31 records into {target}\n"
        assert read_store(target) == mapping

    def test_load_from_file_overwrites_and_later_duplicates_win(
        self, store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(_cli_write, "LOAD_BATCH_RECORDS", 3)  # duplicates span batches
        make_store(store_path, {b"a" * 16: b"before", b"b" * 16: b"untouched"})
        lines = [cli.format_record(b"a" * 16, b"first")]
        lines += [cli.format_record(kvstore.md5_key(str(i)), b"x") for i in range(7)]
        lines += [cli.format_record(b"a" * 16, b"last")]
        src = tmp_path / "in.dump"
        src.write_bytes(b"".join(lines)[:-1])  # no newline after the last line
        assert cli.main(["load", str(store_path), "-i", str(src)]) == 0
        got = read_store(store_path)
        assert got[b"a" * 16] == b"last" and got[b"b" * 16] == b"untouched"
        assert len(got) == 9

    @pytest.mark.parametrize("batch", [2, 10_000])
    def test_malformed_line_reports_its_number_and_keeps_what_came_before(
        self,
        batch: int,
        store_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.setattr(_cli_write, "LOAD_BATCH_RECORDS", batch)
        good = sample(6)
        lines = [cli.format_record(k, v) for k, v in good.items()]
        lines.insert(3, b"00112233445566778899aabbccddeeff\tbad \\z escape\n")
        feed_stdin(monkeypatch, b"".join(lines))
        assert cli.main(["load", str(store_path)]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err == (
            "kvstore: error: <stdin>: line 4: column 38: invalid escape '\\z' (expected \\\\, "
            "\\t, \\n, \\r or \\xNN with lowercase hex digits); loaded the 3 records before it\n"
        )
        assert read_store(store_path) == dict(list(good.items())[:3])

    def test_missing_input_file_is_an_error_and_creates_no_store(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        target = tmp_path / "new"
        assert cli.main(["load", str(target), "-i", str(tmp_path / "absent.dump")]) == 1
        assert capsys.readouterr().err.startswith("kvstore: error: ")
        assert not target.exists()

    def test_load_into_store_held_by_a_writer_in_this_process_fails(
        self, store: kvstore.Store, store_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        feed_stdin(monkeypatch, cli.format_record(b"a" * 16, b"x"))
        assert cli.main(["load", str(store_path)]) == 1
        assert capsys.readouterr().err == locked_line(store_path)
        assert b"a" * 16 not in store


class TestStats:
    def test_table_and_json_report_store_stats(
        self, store_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with kvstore.open(store_path) as db:
            db.put_many(list(sample(40)), list(sample(40).values()))
            for key in list(sample(10)):
                del db[key]
        with kvstore.open(store_path, readonly=True) as db:
            expected = dataclasses.asdict(db.stats())
        assert expected["live_keys"] == 30

        assert cli.main(["stats", str(store_path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"path": str(store_path), **expected}

        assert cli.main(["stats", str(store_path)]) == 0
        table = capsys.readouterr().out
        rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in table.splitlines())
        assert rows["path"] == str(store_path)
        assert rows["live keys"] == "30"
        assert rows["key file bytes"].startswith(f"{expected['key_file_bytes']:,} bytes")
        assert set(rows) == {"path"} | {name.replace("_", " ") for name in expected}

    def test_stats_of_missing_store_is_an_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main(["stats", str(tmp_path / "nope")]) == 1
        assert capsys.readouterr().err.startswith("kvstore: error: ")


class TestGet:
    VALUE = b"line1\nline2\t\\ \x00\xfe"

    @pytest.fixture
    def key(self, store_path: Path) -> bytes:
        key = kvstore.md5_key("k")
        make_store(store_path, {key: self.VALUE})
        return key

    def test_get_prints_escaped_value(
        self, key: bytes, store_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
    ) -> None:
        assert cli.main(["get", str(store_path), key.hex()]) == 0
        assert capsysbinary.readouterr().out == reference_escape(self.VALUE) + b"\n"

    def test_get_raw_prints_exact_bytes_and_accepts_uppercase_hex(
        self, key: bytes, store_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
    ) -> None:
        assert cli.main(["get", str(store_path), key.hex().upper(), "--raw"]) == 0
        assert capsysbinary.readouterr().out == self.VALUE

    def test_get_missing_key_is_an_error(
        self, key: bytes, store_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        other = "00" * 16
        assert cli.main(["get", str(store_path), other]) == 1
        err = f"kvstore: error: {store_path}: key not found: {other}\n"
        assert capsys.readouterr() == ("", err)

    @pytest.mark.parametrize("bad", ["xyz", "00" * 15, "00" * 17, "g" + "0" * 31, "00 " * 16])
    def test_get_bad_hex_is_a_one_line_usage_error_suggesting_key_of(
        self, bad: str, key: bytes, store_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main(["get", str(store_path), bad]) == 2
        assert capsys.readouterr() == ("", (
            f"kvstore: error: invalid key {bad!r}: a KEY is 32 hex digits (16 bytes); to use "
            f"the md5 of a string (e.g. a URL) as the key, give --key-of {shlex.quote(bad)}\n"
        ))


class TestVerify:
    def test_clean_store_is_ok(self, store_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        make_store(store_path, sample(25))
        assert cli.main(["verify", str(store_path)]) == 0
        assert capsys.readouterr() == ("ok: 25 records checked\n", "")

    def test_flipped_byte_in_a_value_is_reported(
        self,
        store_path: Path,
        data_files: Callable[[Path], tuple[Path, Path]],
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        victim = kvstore.md5_key("victim")
        with kvstore.open(store_path) as db:
            db[victim] = b"precious value"
            # Enough data after the victim that the damage lies before the
            # tail that open() checks (and would drop) on its own.
            filler = b"f" * 65536
            for i in range(kvstore.DEFAULT_TAIL_CHECK_BYTES // len(filler) + 2):
                db[kvstore.md5_key(str(i))] = filler
        _key_file, val_file = data_files(store_path)
        header, record_header = 24, 24  # FORMAT: file header; u32 length, u32 crc, the key
        data = bytearray(val_file.read_bytes())
        assert data[header + record_header : header + record_header + 14] == b"precious value"
        data[header + record_header + 3] ^= 0x01
        val_file.write_bytes(bytes(data))

        assert cli.main(["verify", str(store_path)]) == 1
        out, err = capsys.readouterr()
        assert out.startswith(f"damaged: key {victim.hex()} offset {header}: ")
        assert out.count("\n") == 1
        records = 1 + kvstore.DEFAULT_TAIL_CHECK_BYTES // len(filler) + 2
        assert err == f"kvstore: error: {store_path}: 1 damaged record of {records} checked\n"
        # get and dump refuse the damaged value instead of printing it
        assert cli.main(["get", str(store_path), victim.hex()]) == 1
        assert cli.main(["dump", str(store_path), "-o", os.devnull]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.count("kvstore: error: ") == 2 and "CRC" in err

    def test_verify_of_a_file_not_a_store_is_an_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "file"
        path.write_bytes(b"not a store")
        assert cli.main(["verify", str(path)]) == 1
        assert capsys.readouterr().err.startswith("kvstore: error: ")


class TestCompact:
    def test_compact_reclaims_space_and_keeps_live_records(
        self, store_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        live = sample(20, size=200)
        with kvstore.open(store_path) as db:
            for key in live:
                db[key] = b"x" * 1000  # overwritten: dead bytes
            db.put_many(list(live), list(live.values()))
            db[b"d" * 16] = b"deleted" * 100
            del db[b"d" * 16]
            before = db.stats()
        assert cli.main(["compact", str(store_path)]) == 0
        out = capsys.readouterr().out.splitlines()
        with kvstore.open(store_path, readonly=True) as db:
            after = db.stats()
        size_before = before.key_file_bytes + before.val_file_bytes
        size_after = after.key_file_bytes + after.val_file_bytes
        assert size_after < size_before
        assert out[0].startswith(f"before:    {size_before:,} bytes")
        assert out[1].startswith(f"after:     {size_after:,} bytes")
        assert out[2].startswith(f"reclaimed: {size_before - size_after:,} bytes")
        assert read_store(store_path) == live

    def test_compact_of_missing_path_does_not_create_a_store(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        missing = tmp_path / "nope"
        assert cli.main(["compact", str(missing)]) == 1
        assert capsys.readouterr().err == f"kvstore: error: {missing}: no such store\n"
        assert not missing.exists()

    def test_compact_of_a_locked_store_fails(
        self, store: kvstore.Store, store_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main(["compact", str(store_path)]) == 1
        assert capsys.readouterr() == ("", locked_line(store_path))


class TestRoundTrip:
    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(mapping=st.dictionaries(keys16, tricky_values, max_size=30))
    def test_dump_load_dump_is_identical(self, mapping: dict[bytes, bytes]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            a, b = Path(tmp, "a"), Path(tmp, "b")
            make_store(a, mapping)
            lines_a = dump_lines(a, Path(tmp, "a.dump"))
            assert lines_a == reference_lines(mapping)
            assert cli.main(["load", str(b), "-i", str(Path(tmp, "a.dump"))]) == 0
            assert read_store(b) == mapping
            assert dump_lines(b, Path(tmp, "b.dump")) == lines_a


class TestHelpAndDocs:
    def test_commands_are_the_documented_set(self) -> None:
        parser = cli.build_parser()
        (sub,) = [a for a in parser._actions if a.dest == "command"]
        assert sorted(sub.choices) == sorted(COMMANDS)  # type: ignore[arg-type]

    @pytest.mark.parametrize("command", COMMANDS)
    def test_every_command_has_help_with_an_example_and_is_documented(
        self, command: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert cli.main([command, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: kvstore {command} ")
        assert re.search(rf"\nexamples:\n(  .*\n)*  .*python -m kvstore {command} ", out)
        doc = CLI_DOC.read_text()
        assert f"\n## {command}\n" in doc
        assert f"python -m kvstore {command} PATH" in doc

    def test_documented_example_line_is_what_dump_writes(self) -> None:
        value = b'tab\there\n"q"\x00\xff\\'
        line = cli.format_record(kvstore.md5_key("a"), value).decode()
        assert f"\n{line}```" in CLI_DOC.read_text()

    @pytest.mark.parametrize("argv", [[], ["nope"], ["get"], ["dump", "p", "--bogus"]])
    def test_usage_errors_exit_2(self, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
        assert cli.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1
        assert err.startswith("kvstore: error: ") and "; usage: kvstore " in err


class TestProcess:
    def run(self, python: str, env: dict[str, str], *args: str,
            stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [python, "-m", "kvstore", *args], input=stdin, capture_output=True,
            env=env, cwd=REPO_ROOT, timeout=CHILD_TIMEOUT, check=False,
        )

    def test_module_entry_point(
        self, store_path: Path, python: str, child_env: dict[str, str]
    ) -> None:
        key = kvstore.md5_key("k")
        make_store(store_path, {key: b"v\n"})
        done = self.run(python, child_env, "get", str(store_path), key.hex())
        assert (done.returncode, done.stdout, done.stderr) == (0, b"v\\n\n", b"")
        done = self.run(python, child_env, "get", str(store_path), "00" * 16)
        assert done.returncode == 1
        assert done.stderr == f"kvstore: error: {store_path}: key not found: {'00' * 16}\n".encode()
        done = self.run(python, child_env, "stats", str(store_path), "--bogus")
        assert done.returncode == 2

    def test_dump_pipe_load(
        self, tmp_path: Path, python: str, child_env: dict[str, str]
    ) -> None:
        mapping = {
            kvstore.md5_key(str(i)): bytes([i % 256]) * (i % 50) + b"\n\\\t" for i in range(500)
        }
        a, b = tmp_path / "a", tmp_path / "b"
        make_store(a, mapping)
        command = [python, "-m", "kvstore"]
        with subprocess.Popen([*command, "dump", str(a)], stdout=subprocess.PIPE,
                              env=child_env, cwd=REPO_ROOT) as dump:
            assert dump.stdout is not None
            load = subprocess.run([*command, "load", str(b)], stdin=dump.stdout,
                                  capture_output=True, env=child_env, cwd=REPO_ROOT,
                                  timeout=CHILD_TIMEOUT, check=False)
            dump.stdout.close()
            assert dump.wait(timeout=CHILD_TIMEOUT) == 0
        assert (load.returncode, load.stderr) == (0, b"")
        assert read_store(b) == mapping
        assert dump_lines(b, tmp_path / "b.dump") == dump_lines(a, tmp_path / "a.dump")

    def test_dump_into_a_closed_pipe_exits_quietly(
        self, store_path: Path, python: str, child_env: dict[str, str]
    ) -> None:
        make_store(store_path, sample(3000, size=100))  # far more than a pipe buffer
        with subprocess.Popen([python, "-m", "kvstore", "dump", str(store_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=child_env, cwd=REPO_ROOT) as dump:
            assert dump.stdout is not None and dump.stderr is not None
            assert len(dump.stdout.readline()) > 33
            dump.stdout.close()  # like `| head -1`
            assert dump.wait(timeout=CHILD_TIMEOUT) == 1
            assert dump.stderr.read() == b""

    def test_load_into_a_store_locked_by_another_process(
        self, store: kvstore.Store, store_path: Path, tmp_path: Path, python: str,
        child_env: dict[str, str],
    ) -> None:
        src = tmp_path / "in.dump"
        src.write_bytes(cli.format_record(b"a" * 16, b"x"))
        done = self.run(python, child_env, "load", str(store_path), "-i", str(src))
        assert done.returncode == 1
        assert done.stderr == locked_line(store_path).encode()
        assert b"a" * 16 not in store
