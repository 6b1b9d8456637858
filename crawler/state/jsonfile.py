"""Reading and writing the crawl's own JSON files (settings.json, shards.json, status.json).

A damaged file is the user's to fix, so each way it can fail is one DataDirError
naming the file, never a traceback: unreadable, not UTF-8, not JSON, nested so
deeply that the parser gives up, or holding a number no file of ours holds: an integer
past 64 bits (10**400 is valid JSON, and float() or numpy then raise OverflowError far
from the file) or a number too large for a float (1e400, read as infinity). An absent
file is not an error here: what it means differs per file, so FileNotFoundError goes to
the caller.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ..exceptions import DataDirError

MAX_INT_DIGITS = 20  # 2**64 has 20 digits: no count, size or offset of ours has more


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-')):,} digits")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"a number too large: {text[:40]}")
    return value


def read_json(path: str, what: str, fix: str = "") -> Any:
    """The JSON document in ``path``. ``what`` names what the file should be ("a shard
    layout"), ``fix`` what the user can do about a damaged one; FileNotFoundError
    passes through."""
    tail = f": {fix}" if fix else ""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, parse_int=_int, parse_float=_float)
    except FileNotFoundError:
        raise
    except RecursionError:
        raise DataDirError(f"{path}: not {what} (nested too deeply){tail}") from None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8
        raise DataDirError(f"{path}: unreadable ({exc}){tail}") from None


def write_json(path: str, value: Any) -> None:
    """Write ``value`` as ``path``, atomically (a reader sees the old file or the new
    one) and durably (fsynced before the rename, and the rename fsynced). The
    temporary file is this process's own: the shard actors of one Ray node each write
    shards.json at their start, at the same moment."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(path) or ".")


def fsync_path(path: str) -> None:
    """fsync a file or a directory by name (a directory: the renames in it survive a
    power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
