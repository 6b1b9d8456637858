"""Text a server sent, made safe to show on the operator's terminal.

A page's content type, headers, redirect target, body, a sitemap's lastmod: all of it
is the server's choice. Printed raw, an escape sequence in it would drive the
terminal (recolour it, retitle the window, rewrite what was printed before, on some
terminals answer back with keystrokes), and a bidi override would show a URL or a
line in an order other than its own. :func:`printable` writes every such character as
a Python-style escape instead, so what is shown is what is stored, visibly:

- C0 controls (U+0000-U+001F: ESC, BEL, CR, LF, TAB...) and DEL as ``\\xNN``
  (``\\n``, ``\\r``, ``\\t`` for those three), but those in ``keep`` (a body
  shown as text keeps its line breaks and tabs);
- C1 controls (U+0080-U+009F: CSI, OSC... which some terminals obey in UTF-8 too)
  as ``\\xNN``;
- the bidi marks, embeddings, overrides and isolates, and the line and paragraph
  separators, as ``\\uNNNN``.

Everything else, other scripts and symbols included, is left as it is; a backslash
is not doubled (the output is for reading, not for parsing back; the JSON outputs
are the ones for programs). A JSON output (``--json``) goes through
:func:`printable_json` instead, which keeps it the same JSON. Pure; thread-safe.
"""

from __future__ import annotations

import re

# Bidi: ALM, LRM, RLM, the embeddings and overrides (LRE..RLO), the isolates (LRI..PDI);
# and the line and paragraph separators, which some terminals break lines at.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
_RAW_IN_JSON = re.compile(f"[\x7f-\x9f{_BIDI}]")  # json.dumps escapes the rest


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable_json(text: str) -> str:
    """A JSON text made with ``ensure_ascii=False``, with the characters a terminal acts
    on that JSON leaves raw (DEL, the C1 controls, the bidi and separator characters
    above) written as ``\\uNNNN``: the same JSON value, safe to print. (JSON itself
    escapes the C0 controls.)"""
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def printable(text: str, *, keep: str = "") -> str:
    """``text`` with every character a terminal would act on escaped (see the module
    docstring), but the ones in ``keep`` (``"\\n\\t"`` for a body shown as text)."""
    if not keep:
        return _UNSAFE.sub(_escape, text)
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)


__all__ = ["printable", "printable_json"]
