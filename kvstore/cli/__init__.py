"""``python -m kvstore``: dump, load, stats, get, put, delete, verify, compact, repair.

Commands that only read (dump, stats, get, verify) open the store read-only,
so they work beside a live writer; load, put, delete, compact and repair take
the write lock. Only ``load`` and ``put --create`` make a store; every other
command refuses a PATH that holds none. Every user error is one line,
``kvstore: error: ...``, on stderr: exit status 1 for failures, 2 for usage.

The modules: ``_app`` (the parser, the commands that read, ``main``), ``_write``
(the commands that write), ``_lines`` (the dump line format, docs/CLI.md) and
``_support`` (opening stores, keys, values and error messages for them all).
"""

from ._app import (
    CliError,
    build_parser,
    escape_value,
    format_record,
    main,
    parse_record,
    unescape_value,
)

__all__ = [
    "CliError",
    "build_parser",
    "escape_value",
    "format_record",
    "main",
    "parse_record",
    "unescape_value",
]
