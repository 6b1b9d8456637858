"""The parser, the read-only commands (dump, stats, get, verify), repair, and ``main``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, NoReturn

from .._repair import repair
from ..exceptions import KVStoreError
from ._lines import escape_value, format_record, parse_record, unescape_value
from ._support import (
    PROG,
    CliError,
    both_keys_error,
    check_store,
    describe_error,
    format_stat,
    open_readonly,
    plural,
    take_key,
)
from ._write import cmd_compact, cmd_delete, cmd_load, cmd_put

__all__ = [
    "CliError",
    "build_parser",
    "escape_value",
    "format_record",
    "main",
    "parse_record",
    "unescape_value",
]


# --- commands --------------------------------------------------------------


def cmd_dump(args: argparse.Namespace) -> int:
    """Write every live record, one line each, in index order."""
    with open_readonly(args.path) as store, _binary_output(args.output) as out:
        for key in store:
            try:
                value = store[key]
            except KeyError:  # a read-only view does not change; guard anyway
                continue
            out.write(format_record(key, value))
        out.flush()
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Print store.stats() as a table, or as JSON with --json."""
    with open_readonly(args.path) as store:
        stats = dataclasses.asdict(store.stats())
    if args.json:
        print(json.dumps({"path": os.fspath(args.path), **stats}, indent=2))
        return 0
    rows = [("path", os.fspath(args.path))]
    rows += [(name.replace("_", " "), format_stat(name, value)) for name, value in stats.items()]
    width = max(len(label) for label, _ in rows)
    for label, text in rows:
        print(f"{label:<{width}}  {text}")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """Print one value, escaped (or raw with --raw)."""
    key, extra = take_key(args.key_of, [args.key] if args.key is not None else [])
    if extra:
        raise both_keys_error()
    with open_readonly(args.path) as store:
        try:
            value = store[key.key]
        except KeyError:
            raise CliError(f"{args.path}: key not found: {key.describe()}") from None
    out = sys.stdout.buffer
    out.write(value if args.raw else escape_value(value) + b"\n")
    out.flush()
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every KEY record on disk; list damage and the torn tail; exit 1 on damage."""
    with open_readonly(args.path) as store:
        report = store.verify_report()
    for item in report.damages:
        print(
            f"damaged: key {item.key.hex()} offset {item.offset}: {item.reason} "
            f"(KEY record at offset {item.key_offset})"
        )
    for what in report.missing:
        print(f"missing: {what}")
    if report.mended is not None:
        print(f"mend: on a writable open, {report.mended.describe()}")
    tail = report.torn_tail
    if tail is not None:
        print(f"torn tail: a writable open would cut {tail.describe()}")
    if not report.ok:
        cut = f"; a writable open would cut {plural(tail.key_records, 'record')}" if tail else ""
        lost = f"; {report.missing[0]}" if report.missing else ""
        fix = (
            f"; 'python -m kvstore repair {args.path}' rebuilds the KEY file from VAL, "
            "unless values are damaged" if report.repairable else ""
        )
        raise CliError(
            f"{args.path}: {plural(len(report.damages), 'damaged record')} of "
            f"{report.records} checked{cut}{lost}{fix}"
        )
    print(f"ok: {report.records} records checked")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    """Rebuild the KEY file from VAL; say what changed."""
    check_store(args.path, create=False)
    report = repair(args.path)
    if report.unchanged:
        print(f"ok: the KEY file already matches VAL ({report.records} records)")
        return 0
    print(
        f"repaired: {report.records} KEY records written from VAL; {report.changed} changed, "
        f"{report.added} added, {report.dropped} dropped; {report.val_bytes_cut} torn VAL "
        "bytes cut"
    )
    print(f"kept: {', '.join(report.saved)}")
    return 0


# --- helpers ---------------------------------------------------------------


@contextlib.contextmanager
def _binary_output(path: str | None) -> Iterator[BinaryIO]:
    if path is None or path == "-":
        yield sys.stdout.buffer
        return
    try:
        out = open(path, "wb")
    except OSError as exc:
        raise CliError(f"output file {path}: {exc.strerror}") from None
    with out:
        yield out


# --- parser and entry point --------------------------------------------------

_KEY_OF_HELP = (
    "use the md5 of STRING's UTF-8 bytes as the key (what kvstore.md5_key(STRING) "
    "gives); a crawl's MainDB (DIR/main) is keyed by the md5 of the normalized URL, so "
    "give the URL exactly as 'python -m crawler pages' prints it (lowercase scheme and "
    "host, no default port, '/' for an empty path)"
)


_KEY_OF_ONE_HELP = _KEY_OF_HELP + " (default: the KEY argument)"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``kvstore: error:`` line (the usage in it), exit status 2."""

    def error(self, message: str) -> NoReturn:
        usage = " ".join(self.format_usage().split())
        self.exit(2, f"{PROG}: error: {message}; {usage} (see --help)\n")


class _IntermixedParser(_Parser):
    """A subcommand parser that lets options sit between positionals.

    ``put PATH --key-of URL VALUE`` has optional positionals (KEY, VALUE);
    argparse's plain parse would fill them, empty, from the first chunk and
    then reject VALUE. Intermixed parsing reads the options first.
    """

    _parsing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._parsing:  # the intermixed parse's own inner calls
            return super().parse_known_args(args, namespace)
        self._parsing = True
        try:
            namespace, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False
        if extras:  # said here, so the message shows this command's usage
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Inspect and maintain a kvstore directory (run as: python -m kvstore).",
        epilog=(
            "examples:\n"
            "  python -m kvstore stats data/main\n"
            "  python -m kvstore get data/main --key-of http://example.com/ --raw\n"
            "  python -m kvstore dump data/main | python -m kvstore load data/copy\n\n"
            "Run 'python -m kvstore COMMAND --help' for a command's options.\n"
            "See docs/CLI.md for the dump line format and exit codes."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_IntermixedParser
    )

    def command(
        name: str, func: Callable[[argparse.Namespace], int], summary: str, description: str,
        examples: list[str], usage: str | None = None,
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=summary, usage=usage,
            description=textwrap.fill(description, 78, break_on_hyphens=False),
            epilog="examples:\n" + "".join(f"  {line}\n" for line in examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(func=func)
        sub.add_argument("path", metavar="PATH", help="the store directory")
        return sub

    dump = command(
        "dump", cmd_dump, "write every live record as a text line (read-only)",
        "Write every live record as '<hex key>\\t<escaped value>' lines, in no particular "
        "order (read-only; safe beside a live writer).",
        ["python -m kvstore dump data/main -o main.dump",
         "python -m kvstore dump data/main | head"],
    )
    dump.add_argument("-o", "--output", metavar="FILE",
                      help="write here; - is stdout (default: stdout)")

    load = command(
        "load", cmd_load, "put every record of a dump into a store (creates it)",
        "Put every record of a dump into the store, creating it if PATH does not exist or "
        "is an empty directory (needs the write lock).",
        ["python -m kvstore dump data/main | python -m kvstore load data/copy",
         "python -m kvstore load data/copy -i main.dump"],
    )
    load.add_argument("-i", "--input", metavar="FILE",
                      help="read here; - is stdin (default: stdin)")

    stats = command(
        "stats", cmd_stats, "show counts, live/dead bytes, index memory, file sizes",
        "Show record counts, live and dead bytes, index memory, file sizes, generation "
        "(read-only).",
        ["python -m kvstore stats data/main", "python -m kvstore stats data/main --json"],
    )
    stats.add_argument("--json", action="store_true",
                       help="print one JSON object (default: an aligned table)")

    get = command(
        "get", cmd_get, "print the value of one key (read-only)",
        "Print the value of one key, escaped as in dump (raw bytes with --raw); read-only.",
        ["python -m kvstore get data/main 0cc175b9c0f1b6a831c399e269772661",
         "python -m kvstore get data/main --key-of http://example.com/ --raw > page.bin"],
        usage="kvstore get [-h] [--raw] PATH (KEY | --key-of STRING)",
    )
    get.add_argument("key", metavar="KEY", nargs="?", help="the key as 32 hex digits, either case")
    get.add_argument("--key-of", metavar="STRING", help=_KEY_OF_ONE_HELP)
    get.add_argument("--raw", action="store_true",
                     help="write the value's bytes, no newline (default: escaped, as in dump)")

    put = command(
        "put", cmd_put, "store one value under a key (needs the write lock)",
        "Store VALUE (the argument's bytes) or the bytes of --value-file under one key, "
        "replacing any old value. PATH must be a store unless --create is given (needs the "
        "write lock: fails while a crawl has the store open).",
        ["python -m kvstore put data/kv 0cc175b9c0f1b6a831c399e269772661 'hello'",
         "python -m kvstore put data/kv --key-of greeting 'hello' --create",
         "python -m kvstore put data/kv --key-of logo --value-file logo.png",
         "printf 'a\\0b' | python -m kvstore put data/kv --key-of raw --value-file -"],
        usage="kvstore put [-h] [--create] PATH (KEY | --key-of STRING) "
              "(VALUE | --value-file FILE)",
    )
    put.add_argument("key", metavar="KEY", nargs="?", help="the key as 32 hex digits, either case")
    put.add_argument("value", metavar="VALUE", nargs="?",
                     help="the value: this argument's bytes (UTF-8 for text)")
    put.add_argument("--key-of", metavar="STRING", help=_KEY_OF_ONE_HELP)
    put.add_argument("--value-file", metavar="FILE",
                     help="store the bytes of FILE, - for stdin (default: the VALUE argument)")
    put.add_argument("--create", action="store_true",
                     help="create the store if PATH does not exist or is an empty directory "
                     "(default: a PATH that holds no store is an error)")

    delete = command(
        "delete", cmd_delete, "delete keys (needs the write lock)",
        "Delete every key given (as KEY or --key-of STRING, any number of each). All or "
        "nothing: if one is absent, nothing is deleted and the exit status is 1, unless "
        "--missing-ok (needs the write lock: fails while a crawl has the store open).",
        ["python -m kvstore delete data/kv 0cc175b9c0f1b6a831c399e269772661",
         "python -m kvstore delete data/kv --key-of greeting --key-of logo --missing-ok"],
        usage="kvstore delete [-h] [--missing-ok] PATH [KEY ...] [--key-of STRING ...]",
    )
    delete.add_argument("keys", metavar="KEY", nargs="*",
                        help="a key as 32 hex digits, either case")
    delete.add_argument("--key-of", metavar="STRING", action="append", default=[],
                        help=_KEY_OF_HELP + "; repeat for more keys (default: none)")
    delete.add_argument("--missing-ok", action="store_true",
                        help="skip absent keys and delete the others (default: an absent key "
                        "is an error and nothing is deleted)")

    command(
        "verify", cmd_verify, "check every record on disk; exit 1 on damage",
        "Check every KEY record on disk and the value it references (CRC, offset, length); "
        "list damaged records and what a writable open would cut; exit 1 on damage "
        "(read-only).",
        ["python -m kvstore verify data/main"],
    )
    command(
        "compact", cmd_compact, "rewrite only the live records (needs the write lock)",
        "Rewrite only live records, reclaiming deleted and overwritten space; a store of "
        "format 1 or 2 is rewritten as format 3 (needs the write lock: fails while a crawl "
        "has the store open).",
        ["python -m kvstore compact data/main"],
    )
    command(
        "repair", cmd_repair, "rebuild the KEY file from the VAL file (needs the write lock)",
        "Rewrite the KEY file from the VAL file, whose records name their keys (format 3): "
        "fixes the KEY damage that verify reports (flipped keys or offsets, records lost "
        "from the end). The old KEY file and any cut bytes are kept in recovered/. Refuses, "
        "changing nothing, if a value record is damaged (needs the write lock).",
        ["python -m kvstore verify data/main || python -m kvstore repair data/main"],
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 ok, 1 error, 2 usage, 130 Ctrl-C)."""
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
    except CliError as exc:
        _error(str(exc))
        return exc.status
    except (KVStoreError, OSError) as exc:  # races past the checks, corrupt files, full disk
        _error(describe_error(exc))
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the store is closed (and consistent) on the way out
        _error(f"interrupted ({args.command} {args.path})")
        return 130
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
