"""What the ``python -m kvstore`` commands share: keys from the command line,
opening a store with messages a user can act on, value files, number formats.

Every failure here is a :class:`CliError` whose text is the one line the CLI
prints after ``kvstore: error:``; none is meant for the Python API.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys

import kvstore

from .. import _datafiles
from ..exceptions import StoreLockedError, StorePermissionError

PROG = "kvstore"
READ_ONLY_COMMANDS = "get, dump, stats, verify"

_HEX_KEY_RE = re.compile(r"[0-9a-fA-F]{32}")


class CliError(Exception):
    """A failure the CLI reports as ``kvstore: error: <message>`` (exit status 1)."""

    status = 1


class UsageError(CliError):
    """The command line is wrong (exit status 2), reported on one line like a CliError."""

    status = 2


# --- keys --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KeyArg:
    """A key from the command line and, for ``--key-of``, the string it is the md5 of."""

    key: bytes
    of: str | None = None

    def describe(self) -> str:
        """``<hex>``, or ``<hex> (md5 of 'STRING')`` for a ``--key-of`` key."""
        return self.key.hex() + ("" if self.of is None else f" (md5 of {self.of!r})")


def parse_hex_key(text: str) -> KeyArg:
    """A KEY argument: 32 hex digits, either case; anything else is a UsageError."""
    if _HEX_KEY_RE.fullmatch(text) is None:
        raise UsageError(
            f"invalid key {text!r}: a KEY is 32 hex digits (16 bytes); to use the md5 of "
            f"a string (e.g. a URL) as the key, give --key-of {shlex.quote(text)}"
        )
    return KeyArg(bytes.fromhex(text))


def key_of(text: str) -> KeyArg:
    """A ``--key-of`` argument: the key is the md5 of its UTF-8 bytes (``kvstore.md5_key``)."""
    # os.fsencode gives back the exact argv bytes (surrogateescape), UTF-8 for any text.
    return KeyArg(kvstore.md5_key(os.fsencode(text)), text)


def take_key(key_of_text: str | None, operands: list[str]) -> tuple[KeyArg, list[str]]:
    """The key (``--key-of`` or the first operand) and the operands after it."""
    if key_of_text is not None:
        return key_of(key_of_text), operands
    if not operands:
        raise UsageError("missing KEY (32 hex digits) or --key-of STRING")
    return parse_hex_key(operands[0]), operands[1:]


def both_keys_error() -> UsageError:
    return UsageError("give the key either as KEY or with --key-of STRING, not both")


# --- opening stores ----------------------------------------------------------


def check_store(path: str, *, create: bool = False) -> bool:
    """Raise CliError unless ``path`` holds a store; return True if it must be created.

    With ``create``, a path that does not exist or an empty directory is fine
    (``kvstore.open`` makes the store); a directory holding other files never
    becomes a store, so a wrong PATH cannot scatter store files into it.
    """
    if not os.path.lexists(path):
        if create:
            return True
        raise CliError(f"{path}: no such store")
    if not os.path.isdir(path):
        raise CliError(f"{path}: not a store: it is a file (a store is a directory)")
    try:
        generation, _ = _datafiles.find_generation(path)
        names = os.listdir(path)
    except PermissionError:
        raise CliError(f"{path}: permission denied: cannot list the directory") from None
    if generation is not None:
        return False
    if create and not names:
        return True
    hint = "; a new store is made only where PATH is missing or empty" if create else ""
    raise CliError(f"{path}: not a store: {_what_is_there(path, names)}{hint}")


def _what_is_there(path: str, names: list[str]) -> str:
    if not names:
        return "the directory is empty"
    stores = sorted(n for n in names if _is_store(os.path.join(path, n)))
    if stores:
        shown = ", ".join(os.path.join(path, n) for n in stores[:3])
        more = ", ..." if len(stores) > 3 else ""
        return f"no data files in it, but it holds stores: {shown}{more}"
    return "no data-NNNNNN.key and .val files in it"


def _is_store(path: str) -> bool:
    try:
        return os.path.isdir(path) and _datafiles.find_generation(path)[0] is not None
    except OSError:
        return False


def open_readonly(path: str) -> kvstore.Store:
    """Open an existing store without a lock (beside a live writer)."""
    check_store(path)
    return kvstore.open(path, readonly=True)


def open_writable(path: str, *, create: bool = False) -> kvstore.Store:
    """Open a store for writing; a store held by another writer is one clear CliError."""
    check_store(path, create=create)
    try:
        return kvstore.open(path)
    except StoreLockedError:
        raise CliError(locked_message(path)) from None
    except StorePermissionError as exc:
        raise CliError(
            f"{path}: cannot open the store for writing: {exc.filename}: "
            f"{os.strerror(exc.errno) if exc.errno else exc.strerror}; "
            f"the read-only commands ({READ_ONLY_COMMANDS}) may still work"
        ) from None


def locked_message(path: str) -> str:
    return (
        f"{path}: another process has this store open for writing (a crawl in progress?); "
        f"stop it first, or use the read-only commands ({READ_ONLY_COMMANDS})"
    )


def describe_error(exc: BaseException) -> str:
    """One line for an error that got past the commands' own checks (races, I/O)."""
    if isinstance(exc, StoreLockedError):
        return locked_message(exc.path)
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


# --- values ------------------------------------------------------------------


def read_value_file(name: str, limit: int) -> bytes:
    """The bytes of a ``--value-file`` (``-`` is stdin), at most ``limit`` of them."""
    shown = "<stdin>" if name == "-" else name
    try:
        if name == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(name, "rb") as src:
                data = src.read(limit + 1)
    except OSError as exc:
        raise CliError(f"value file {shown}: {exc.strerror or exc}") from None
    check_value_size(data, f"value file {shown}", limit)
    return data


def check_value_size(value: bytes, what: str, limit: int) -> None:
    if len(value) > limit:
        raise CliError(
            f"{what}: more than the store's max_value_size of {format_bytes(limit)}"
        )


# --- numbers -------------------------------------------------------------------


def format_bytes(n: int) -> str:
    """``1,234,567 bytes (1.2 MiB)``; the unit part only from 1 KiB on."""
    if abs(n) < 1024:
        return f"{n:,} bytes"
    size, units = n / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while abs(size) >= 1024 and len(units) > 1:
        size /= 1024
        units.pop(0)
    return f"{n:,} bytes ({size:.1f} {units[0]})"


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def format_stat(name: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    if name.endswith("_bytes"):
        return format_bytes(value)
    return f"{value:,}"
