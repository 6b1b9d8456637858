"""``python -m kvstore``: dump, load, stats, get, verify and compact a store.

The dump line format (also in docs/CLI.md)::

    <32 lowercase hex digits of the key> TAB <escaped value> LF

Value escaping: bytes 0x20..0x7e other than backslash stand for themselves;
backslash is ``\\\\``, tab ``\\t``, newline ``\\n``, carriage return ``\\r``;
every other byte is ``\\xNN`` with two lowercase hex digits. That is exactly
what Python's ``unicode_escape`` codec writes for a Latin-1 string (quotes are
not escaped), so both directions run in C; ``load`` checks every line against
a strict pattern first, so the codec only ever sees these five escapes.

Commands that only read (dump, stats, get, verify) open the store read-only,
so they work beside a live writer. Every ``KVStoreError`` becomes one
``kvstore: error: ...`` line on stderr and exit status 1; usage errors are
argparse's (exit status 2).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import BinaryIO

import kvstore
from kvstore.exceptions import KVStoreError

PROG = "kvstore"

# load: records per put_many call, and a cap on the bytes buffered for one call.
LOAD_BATCH_RECORDS = 10_000
LOAD_BATCH_BYTES = 32 * 1024 * 1024

# One escaped value, matched without backtracking (possessive quantifiers), so
# a long or hostile line costs linear time.
_VALUE_PATTERN = rb"(?:[\x20-\x5b\x5d-\x7e]++|\\(?:[\\tnr]|x[0-9a-f]{2}))*+"
_LINE_RE = re.compile(rb"([0-9a-f]{32})\t(" + _VALUE_PATTERN + rb")\n?")
_VALUE_PREFIX_RE = re.compile(_VALUE_PATTERN)
_HEX_KEY_RE = re.compile(r"[0-9a-fA-F]{32}")


class CliError(Exception):
    """A failure the CLI reports as ``kvstore: error: <message>`` (exit status 1)."""


# --- the line format -------------------------------------------------------


def escape_value(value: bytes) -> bytes:
    """Escape ``value`` for one dump line: printable ASCII except backslash is kept."""
    return value.decode("latin-1").encode("unicode_escape")


def unescape_value(text: bytes) -> bytes:
    """Invert :func:`escape_value`; ``ValueError`` if ``text`` is not in its exact form."""
    if _VALUE_PREFIX_RE.fullmatch(text) is None:
        raise ValueError(_describe_bad_value(text, 0))
    return text.decode("unicode_escape").encode("latin-1")


def format_record(key: bytes, value: bytes) -> bytes:
    """One dump line, newline included."""
    return b"%s\t%s\n" % (key.hex().encode("ascii"), escape_value(value))


def parse_record(line: bytes) -> tuple[bytes, bytes]:
    """Parse one dump line (its trailing newline optional); ``ValueError`` says what is wrong."""
    match = _LINE_RE.fullmatch(line)
    if match is None:
        raise ValueError(_describe_bad_line(line))
    key_hex, escaped = match.groups()
    value = escaped.decode("unicode_escape").encode("latin-1")
    return bytes.fromhex(key_hex.decode("ascii")), value


def _describe_bad_line(line: bytes) -> str:
    body = line[:-1] if line.endswith(b"\n") else line
    key_hex, tab, escaped = body.partition(b"\t")
    if not tab:
        return "expected <32 hex digit key><TAB><escaped value>, found no tab"
    if re.fullmatch(rb"[0-9a-f]{32}", key_hex) is None:
        return f"key must be 32 lowercase hex digits, found {_show(key_hex)}"
    return _describe_bad_value(escaped, len(key_hex) + 1)


def _describe_bad_value(escaped: bytes, column_base: int) -> str:
    good = _VALUE_PREFIX_RE.match(escaped)
    pos = good.end() if good is not None else 0
    column = column_base + pos + 1  # 1-based byte column in the line
    if pos < len(escaped) and escaped[pos] == 0x5C:
        shown = escaped[pos : pos + (4 if escaped[pos + 1 : pos + 2] == b"x" else 2)]
        return (
            f"column {column}: invalid escape {_show(shown)} "
            "(expected \\\\, \\t, \\n, \\r or \\xNN with lowercase hex digits)"
        )
    return f"column {column}: byte 0x{escaped[pos]:02x} must be escaped"


def _show(data: bytes, limit: int = 40) -> str:
    """Quote a piece of an input line for an error message, non-printable bytes as \\xNN."""
    text = "".join(chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}" for b in data[:limit])
    return f"'{text}{'...' if len(data) > limit else ''}'"


# --- commands --------------------------------------------------------------


def cmd_dump(args: argparse.Namespace) -> int:
    """Write every live record, one line each, in index order."""
    with _open_readonly(args.path) as store, _binary_output(args.output) as out:
        for key in store:
            try:
                value = store[key]
            except KeyError:  # a read-only view does not change; guard anyway
                continue
            out.write(format_record(key, value))
        out.flush()
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    """Put every record of a dump into the store (created if missing)."""
    max_line = 4 * kvstore.DEFAULT_MAX_VALUE_SIZE + kvstore.KEY_SIZE * 2 + 2
    loaded = 0
    # The input is opened first, so a bad -i path does not create a store.
    with _binary_input(args.input) as src, kvstore.open(args.path) as store:
        keys: list[bytes] = []
        values: list[bytes] = []
        batch_bytes = 0

        def put_batch() -> None:
            nonlocal batch_bytes, loaded
            if keys:
                store.put_many(keys, values)
                loaded += len(keys)
                keys.clear()
                values.clear()
                batch_bytes = 0

        lineno = 0
        while line := src.readline(max_line):
            lineno += 1
            try:
                if len(line) == max_line and not line.endswith(b"\n"):
                    raise ValueError(f"line longer than {max_line} bytes")
                key, value = parse_record(line)
                if len(value) > kvstore.DEFAULT_MAX_VALUE_SIZE:
                    raise ValueError(
                        f"value of {len(value)} bytes exceeds max_value_size="
                        f"{kvstore.DEFAULT_MAX_VALUE_SIZE}"
                    )
            except ValueError as exc:
                put_batch()  # everything before the bad line is kept
                store.flush()
                raise CliError(
                    f"{_input_name(args.input)}: line {lineno}: {exc}; "
                    f"loaded the {loaded} records before it"
                ) from None
            keys.append(key)
            values.append(value)
            batch_bytes += len(value)
            if len(keys) >= LOAD_BATCH_RECORDS or batch_bytes >= LOAD_BATCH_BYTES:
                put_batch()
        put_batch()
        store.flush()
    print(f"loaded {loaded} records into {args.path}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Print store.stats() as a table, or as JSON with --json."""
    with _open_readonly(args.path) as store:
        stats = dataclasses.asdict(store.stats())
    if args.json:
        print(json.dumps({"path": os.fspath(args.path), **stats}, indent=2))
        return 0
    rows = [("path", os.fspath(args.path))]
    rows += [(name.replace("_", " "), _format_stat(name, value)) for name, value in stats.items()]
    width = max(len(label) for label, _ in rows)
    for label, text in rows:
        print(f"{label:<{width}}  {text}")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """Print one value, escaped (or raw with --raw)."""
    with _open_readonly(args.path) as store:
        try:
            value = store[args.key]
        except KeyError:
            raise CliError(f"key not found: {args.key.hex()}") from None
    out = sys.stdout.buffer
    out.write(value if args.raw else escape_value(value) + b"\n")
    out.flush()
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every KEY record on disk; list damage and the torn tail; exit 1 on damage."""
    with _open_readonly(args.path) as store:
        report = store.verify_report()
    for item in report.damages:
        print(
            f"damaged: key {item.key.hex()} offset {item.offset}: {item.reason} "
            f"(KEY record at offset {item.key_offset})"
        )
    tail = report.torn_tail
    if tail is not None:
        print(f"torn tail: a writable open would cut {tail.describe()}")
    if not report.ok:
        cut = f"; a writable open would cut {_plural(tail.key_records, 'record')}" if tail else ""
        raise CliError(
            f"{args.path}: {_plural(len(report.damages), 'damaged record')} of "
            f"{report.records} checked{cut}"
        )
    print(f"ok: {report.records} records checked")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """Rewrite only the live records; print the bytes on disk before and after."""
    # kvstore.open creates a missing store; compacting a typo should not.
    if not os.path.exists(args.path):
        raise CliError(f"{args.path}: no such store")
    with kvstore.open(args.path) as store:
        before = store.stats()
        store.compact()
        after = store.stats()
    size_before = before.key_file_bytes + before.val_file_bytes
    size_after = after.key_file_bytes + after.val_file_bytes
    for label, stats in (("before", before), ("after", after)):
        total = stats.key_file_bytes + stats.val_file_bytes
        print(
            f"{label + ':':<10} {_bytes(total)} "
            f"(key file {stats.key_file_bytes:,}, val file {stats.val_file_bytes:,})"
        )
    print(f"reclaimed: {_bytes(size_before - size_after)}")
    return 0


# --- helpers ---------------------------------------------------------------


def _open_readonly(path: str) -> kvstore.Store:
    return kvstore.open(path, readonly=True)


@contextlib.contextmanager
def _binary_output(path: str | None) -> Iterator[BinaryIO]:
    if path is None or path == "-":
        yield sys.stdout.buffer
    else:
        with open(path, "wb") as out:
            yield out


@contextlib.contextmanager
def _binary_input(path: str | None) -> Iterator[BinaryIO]:
    if path is None or path == "-":
        yield sys.stdin.buffer
    else:
        with open(path, "rb") as src:
            yield src


def _input_name(path: str | None) -> str:
    return "<stdin>" if path is None or path == "-" else path


def _bytes(n: int) -> str:
    """``1,234,567 bytes (1.2 MiB)``; the unit part only from 1 KiB on."""
    if abs(n) < 1024:
        return f"{n:,} bytes"
    size, units = n / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while abs(size) >= 1024 and len(units) > 1:
        size /= 1024
        units.pop(0)
    return f"{n:,} bytes ({size:.1f} {units[0]})"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _format_stat(name: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    if name.endswith("_bytes"):
        return _bytes(value)
    return f"{value:,}"


def _hex_key(text: str) -> bytes:
    if _HEX_KEY_RE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"invalid key {text!r}: expected 32 hex digits (16 bytes)")
    return bytes.fromhex(text)


# --- parser and entry point --------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and maintain a kvstore directory (run as: python -m kvstore).",
        epilog="See docs/CLI.md for the dump line format and exit codes.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, func: Callable[[argparse.Namespace], int], summary: str, example: str
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=summary, description=textwrap.fill(summary, 78),
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(func=func)
        sub.add_argument("path", metavar="PATH", help="the store directory")
        return sub

    dump = command(
        "dump", cmd_dump,
        "Write every live record as '<hex key>\\t<escaped value>' lines, in no particular order "
        "(read-only; safe beside a live writer).",
        "python -m kvstore dump data/main -o main.dump",
    )
    dump.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")

    load = command(
        "load", cmd_load,
        "Put every record of a dump into the store, creating it if missing (needs the write lock).",
        "python -m kvstore dump data/main | python -m kvstore load data/copy",
    )
    load.add_argument("-i", "--input", metavar="FILE", help="read here instead of stdin")

    stats = command(
        "stats", cmd_stats,
        "Show record counts, live and dead bytes, index memory, file sizes, generation.",
        "python -m kvstore stats data/main --json",
    )
    stats.add_argument("--json", action="store_true", help="print one JSON object")

    get = command(
        "get", cmd_get,
        "Print the value of one key, escaped as in dump (raw bytes with --raw).",
        "python -m kvstore get data/main 0123456789abcdef0123456789abcdef --raw > value.bin",
    )
    get.add_argument("key", metavar="HEXKEY", type=_hex_key, help="the key as 32 hex digits")
    get.add_argument("--raw", action="store_true", help="write the value's bytes, no newline")

    command(
        "verify", cmd_verify,
        "Check every KEY record on disk and the value it references (CRC, offset, length); "
        "list damaged records and what a writable open would cut; exit 1 on damage.",
        "python -m kvstore verify data/main",
    )
    command(
        "compact", cmd_compact,
        "Rewrite only live records, reclaiming deleted and overwritten space "
        "(needs the write lock).",
        "python -m kvstore compact data/main",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return it, do not exit
        return exc.code if isinstance(exc.code, int) else 2
    handler = _show_library_warnings()
    try:
        status: int = args.func(args)
        return status
    except BrokenPipeError:  # e.g. `dump | head`: the reader is gone, stop quietly
        _silence_stdout()
        return 1
    except (CliError, KVStoreError) as exc:
        _error(str(exc))
        return 1
    except OSError as exc:  # an -i/-o file that cannot be opened, a full disk
        _error(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
        return 1
    finally:
        if handler is not None:
            logging.getLogger("kvstore").removeHandler(handler)


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def _show_library_warnings() -> logging.Handler | None:
    """Send kvstore's warnings (e.g. records dropped by recovery) to stderr.

    Only when nobody configured logging, so an embedding application keeps control.
    """
    logger = logging.getLogger("kvstore")
    if logger.hasHandlers():
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    return handler


def _silence_stdout() -> None:
    # Python flushes stdout at exit; with the pipe gone that would print a
    # traceback, so point the descriptor at /dev/null first.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real descriptor (captured in tests)
        pass
