"""The ``python -m kvstore`` commands that write: load, put, delete, compact.

Each takes the store's write lock, so it fails with one clear line while
another process (a crawl) has the store open. Only ``load`` and
``put --create`` make a store; they never turn a directory holding other
files into one, and ``load`` removes a store it made but put nothing into.
``put`` checks its key and value before it opens the store, so a failure
writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from typing import BinaryIO

import kvstore

from ._lines import parse_record
from ._support import (
    CliError,
    UsageError,
    both_keys_error,
    check_store,
    check_value_size,
    format_bytes,
    key_of,
    open_writable,
    parse_hex_key,
    plural,
    read_value_file,
    take_key,
)

# load: records per put_many call, and a cap on the bytes buffered for one call.
LOAD_BATCH_RECORDS = 10_000
LOAD_BATCH_BYTES = 32 * 1024 * 1024


def cmd_load(args: argparse.Namespace) -> int:
    """Put every record of a dump into the store (created if missing)."""
    new_dirs = _missing_dirs(args.path)
    # The input is opened first, so a bad -i path does not create a store.
    with _binary_input(args.input) as src:
        created = check_store(args.path, create=True)
        with open_writable(args.path, create=True) as store:
            loaded, failure = _load_lines(src, store, _input_name(args.input))
    if failure is not None:
        if created and not loaded:  # leave nothing behind: the store would be empty
            _remove_new_store(args.path, new_dirs)
            raise CliError(f"{failure}; nothing loaded, {args.path} not created")
        raise CliError(f"{failure}; loaded the {loaded} records before it")
    print(f"loaded {loaded} records into {args.path}")
    return 0


def _load_lines(src: BinaryIO, store: kvstore.Store, name: str) -> tuple[int, str | None]:
    """Load until the end or the first bad line: (records loaded, what was wrong or None)."""
    max_line = 4 * kvstore.DEFAULT_MAX_VALUE_SIZE + kvstore.KEY_SIZE * 2 + 2
    loaded = 0
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
            check_value_size(value, "value", kvstore.DEFAULT_MAX_VALUE_SIZE)
        except (ValueError, CliError) as exc:
            put_batch()  # everything before the bad line is kept
            store.flush()
            return loaded, f"{name}: line {lineno}: {exc}"
        keys.append(key)
        values.append(value)
        batch_bytes += len(value)
        if len(keys) >= LOAD_BATCH_RECORDS or batch_bytes >= LOAD_BATCH_BYTES:
            put_batch()
    put_batch()
    store.flush()
    return loaded, None


def cmd_put(args: argparse.Namespace) -> int:
    """Store one value under one key (the store must exist unless --create)."""
    operands = [x for x in (args.key, args.value) if x is not None]
    key, rest = take_key(args.key_of, operands)
    limit = kvstore.DEFAULT_MAX_VALUE_SIZE
    # Everything is checked before the store is opened, so a failure writes nothing.
    if args.value_file is not None:
        if rest:
            raise (
                both_keys_error() if args.key_of is not None
                else UsageError("give the value either as VALUE or with --value-file, not both")
            )
        value = read_value_file(args.value_file, limit)
    else:
        if not rest:
            raise UsageError("missing VALUE (or --value-file FILE, - for stdin)")
        if len(rest) > 1:
            raise both_keys_error()
        value = os.fsencode(rest[0])  # the exact bytes of the argument
        check_value_size(value, "VALUE", limit)
    with open_writable(args.path, create=args.create) as store:
        new = key.key not in store
        store[key.key] = value
    print(
        f"{args.path}: put {key.describe()}: {plural(len(value), 'byte')} "
        f"({'new key' if new else 'replaced the old value'})"
    )
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete keys; all or nothing unless --missing-ok."""
    keys = [parse_hex_key(text) for text in args.keys] + [key_of(s) for s in args.key_of]
    if not keys:
        raise UsageError("give at least one KEY or --key-of STRING")
    unique = list({k.key: k for k in keys}.values())
    with open_writable(args.path) as store:
        absent = [k for k in unique if k.key not in store]
        if absent and not args.missing_ok:
            listed = ", ".join(k.describe() for k in absent)
            raise CliError(
                f"{args.path}: {'key' if len(absent) == 1 else 'keys'} not found: {listed}; "
                "nothing deleted (--missing-ok deletes the others)"
            )
        gone = {k.key for k in absent}
        present = [k for k in unique if k.key not in gone]
        for k in present:
            del store[k.key]
    note = f"; {plural(len(absent), 'key')} not found, skipped" if absent else ""
    print(f"{args.path}: deleted {plural(len(present), 'key')}{note}")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """Rewrite only the live records; print the bytes on disk before and after."""
    with open_writable(args.path) as store:
        before = store.stats()
        store.compact()
        after = store.stats()
    size_before = before.key_file_bytes + before.val_file_bytes
    size_after = after.key_file_bytes + after.val_file_bytes
    for label, stats in (("before", before), ("after", after)):
        total = stats.key_file_bytes + stats.val_file_bytes
        print(
            f"{label + ':':<10} {format_bytes(total)} "
            f"(key file {stats.key_file_bytes:,}, val file {stats.val_file_bytes:,})"
        )
    print(f"reclaimed: {format_bytes(size_before - size_after)}")
    return 0


def _missing_dirs(path: str) -> list[str]:
    """``path`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return missing


def _remove_new_store(path: str, new_dirs: list[str]) -> None:
    """Undo a store this command created (it holds nothing: only its own files)."""
    if not new_dirs:  # it was an empty directory: keep the directory, drop the files
        for name in os.listdir(path):
            os.remove(os.path.join(path, name))
        return
    shutil.rmtree(new_dirs[0])
    for directory in new_dirs[1:]:
        with contextlib.suppress(OSError):
            os.rmdir(directory)


@contextlib.contextmanager
def _binary_input(path: str | None) -> Iterator[BinaryIO]:
    if path is None or path == "-":
        yield sys.stdin.buffer
        return
    try:
        src = open(path, "rb")
    except OSError as exc:
        raise CliError(f"input file {path}: {exc.strerror}") from None
    with src:
        yield src


def _input_name(path: str | None) -> str:
    return "<stdin>" if path is None or path == "-" else path
