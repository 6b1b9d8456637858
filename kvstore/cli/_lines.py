"""The dump line format of ``python -m kvstore`` (pure: bytes in, bytes out).

One line per record (also in docs/CLI.md)::

    <32 lowercase hex digits of the key> TAB <escaped value> LF

Value escaping: bytes 0x20..0x7e other than backslash stand for themselves;
backslash is ``\\\\``, tab ``\\t``, newline ``\\n``, carriage return ``\\r``;
every other byte is ``\\xNN`` with two lowercase hex digits. That is exactly
what Python's ``unicode_escape`` codec writes for a Latin-1 string (quotes are
not escaped), so both directions run in C; parsing checks every line against
a strict pattern first, so the codec only ever sees these five escapes.
"""

from __future__ import annotations

import re

# One escaped value: runs of plain bytes between escapes ("unrolling the loop": a byte
# starts either a run or an escape, never both), so a long or hostile line costs linear
# time. Not possessive quantifiers: the re of Python 3.11.2 (Debian 12's) matches a
# possessive repeat over alternatives wrongly (3.11.7's does not: .ci/run tests both).
_PLAIN = rb"[\x20-\x5b\x5d-\x7e]*"
_VALUE_PATTERN = _PLAIN + rb"(?:(?:\\[\\tnr]|\\x[0-9a-f]{2})" + _PLAIN + rb")*"
_LINE_RE = re.compile(rb"([0-9a-f]{32})\t(" + _VALUE_PATTERN + rb")\n?")
_VALUE_PREFIX_RE = re.compile(_VALUE_PATTERN)


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
