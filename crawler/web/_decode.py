"""A body as the UTF-8 the HTML parser is fed: whole, or in pieces (pure, no I/O).

crawler.web.links decodes a page with the codec it sniffed, with replacement
characters, drops a leading byte-order mark and turns NULs into U+FFFD, so
that libxml2 always gets valid UTF-8. A small page is decoded whole
(:func:`to_utf8`, the tree path needs it whole); a large one in pieces of 64
KiB of body (:func:`utf8_pieces`, an incremental decoder), so that no whole
copy of it exists as text. Both give the same bytes.

A run of U+FFFD longer than ``run`` characters is cut to ``run``: libxml2
keeps every byte it is fed until the parse ends, and a body of NULs or
invalid bytes would otherwise cost 3 bytes of UTF-8 a byte. links.py chooses
``run`` so that no link can change (module doc there, *Memory*).
"""

from __future__ import annotations

import codecs
import re
import sys
from collections.abc import Callable, Iterator
from functools import lru_cache

__all__ = ["CHUNK", "MIN_RUN", "Reserve", "cut_runs", "to_utf8", "utf8_pieces"]

CHUNK = 1 << 16  # body bytes decoded at a time
# Runs are never cut shorter than this: past libxml2's name length (1,000), so a cut
# tag or attribute name is as over-long as the whole one.
MIN_RUN = 4096

# Called with a number of bytes before a parse holds that many more (it may block).
Reserve = Callable[[int], None]

_FFFD_RUN = re.compile("\ufffd+")
# Python's "utf-16"/"utf-32" read a BOM, or else native byte order, when decoding in one
# go; their incremental decoders refuse a body without a BOM (see _stream_codec).
_BOM_SNIFFERS: dict[str, Callable[..., tuple[str, int, int]]] = {
    "utf-16": codecs.utf_16_ex_decode, "utf-32": codecs.utf_32_ex_decode}


def _no_reserve(n: int) -> None:
    return None


@lru_cache(maxsize=16)
def _needle(run: int) -> str:
    return "\ufffd" * (run + 1)


def cut_runs(text: str, run: int) -> str:
    """``text`` with every run of U+FFFD longer than ``run`` cut to ``run``. Linear:
    str.find skips ~``run`` characters at a time through text without such a run (a
    regex would recount every shorter run from each of its characters)."""
    needle = _needle(run)
    i = text.find(needle)
    if i < 0:
        return text
    out = []
    pos = 0
    while i >= 0:
        found = _FFFD_RUN.match(text, i)  # the whole run that starts at i
        assert found is not None
        out.append(text[pos:i + run])
        pos = found.end()
        i = text.find(needle, pos)
    out.append(text[pos:])
    return "".join(out)


def to_utf8(body: bytes, charset: str, run: int = MIN_RUN) -> bytes:
    """``body`` decoded with ``charset`` in one go, a leading BOM dropped, NULs as
    U+FFFD and U+FFFD runs cut to ``run``, as UTF-8."""
    text = body.decode(charset, "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return cut_runs(text, run).encode("utf-8", "replace")


def utf8_pieces(body: bytes, charset: str, run: int = MIN_RUN,
                reserve: Reserve = _no_reserve, chunk: int = CHUNK) -> Iterator[bytes]:
    """What :func:`to_utf8` gives, in pieces of at most ``chunk`` bytes of body, none
    empty; ``reserve(len(piece))`` before each is handed out."""
    charset, skip = _stream_codec(body, charset)
    decoder = codecs.getincrementaldecoder(charset)("replace")
    view = memoryview(body)[skip:]
    size = len(view)
    first = True
    held = ""  # a trailing U+FFFD run, held back until the next piece says where it ends
    for start in range(0, max(size, 1), chunk):
        final = start + chunk >= size
        text = decoder.decode(view[start:start + chunk], final)
        if first and text:
            first = False
            if text.startswith("\ufeff"):
                text = text[1:]
        if "\x00" in text:
            text = text.replace("\x00", "\ufffd")
        if held or text.endswith("\ufffd"):
            text, held = cut_runs(held + text, run), ""
            if not final and text.endswith("\ufffd"):  # may go on in the next piece
                kept = text.rstrip("\ufffd")
                held, text = text[len(kept):], kept
        else:
            text = cut_runs(text, run)
        if text:
            piece = text.encode("utf-8", "replace")
            reserve(len(piece))
            yield piece


def _stream_codec(body: bytes, charset: str) -> tuple[str, int]:
    """(codec, bytes to skip) decoding ``body`` piece by piece as ``body.decode(charset)``
    decodes it whole: "utf-16"/"utf-32" named with their byte order."""
    ex_decode = _BOM_SNIFFERS.get(charset)
    if ex_decode is None:
        return charset, 0
    width = 2 if charset == "utf-16" else 4
    order = ex_decode(body[:width], "replace", 0, False)[2]
    if order == 0:
        return f"{charset}-{'le' if sys.byteorder == 'little' else 'be'}", 0
    return f"{charset}-{'le' if order < 0 else 'be'}", width
