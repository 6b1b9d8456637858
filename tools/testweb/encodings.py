"""Content-Encoding on the test web: bodies encoded as a real server would, and bombs.

A site with ``SiteConfig.encodings`` answers its pages in the first of those codings
the request's Accept-Encoding lists (as nginx's gzip and brotli filters do); the
request log records which (``Request.encoding``). The ``gzip_bomb``, ``br_bomb`` and
``zstd_bomb`` faults answer a few KiB that decode to ``size`` bytes.
"""

from __future__ import annotations

import importlib
import zlib
from functools import lru_cache
from typing import Any

import brotlicffi

zstd: Any
try:
    zstd = importlib.import_module("compression.zstd")  # the standard library's, from 3.14
except ImportError:
    zstd = importlib.import_module("backports.zstd")

CODINGS = ("gzip", "br", "zstd")
BOMBS = {"gzip_bomb": "gzip", "br_bomb": "br", "zstd_bomb": "zstd"}
_BLOCK = 1 << 20


class _Encoder:
    """One coding's streaming compressor: compress(piece), then finish()."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._c: Any
        if coding == "gzip":
            self._c = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip member, mtime 0
        elif coding == "br":
            self._c = brotlicffi.Compressor(quality=5)
        elif coding == "zstd":
            self._c = zstd.ZstdCompressor(level=3)
        else:
            raise ValueError(f"unknown coding {coding!r}: one of {CODINGS}")

    def compress(self, data: bytes) -> bytes:
        if self.coding == "br":
            return bytes(self._c.process(data))
        return bytes(self._c.compress(data))

    def finish(self) -> bytes:
        if self.coding == "br":
            return bytes(self._c.finish())
        if self.coding == "zstd":
            return bytes(self._c.flush(zstd.ZstdCompressor.FLUSH_FRAME))
        return bytes(self._c.flush())


def encode(coding: str, body: bytes) -> bytes:
    """``body`` in ``coding``."""
    enc = _Encoder(coding)
    return enc.compress(body) + enc.finish()


def chosen(offered: tuple[str, ...], accept_encoding: str | None) -> str | None:
    """The first of the site's ``offered`` codings that ``accept_encoding`` accepts (a
    coding with q=0 is refused), None for identity."""
    if not offered or not accept_encoding:
        return None
    accepted = set()
    for item in accept_encoding.split(","):
        name, _, params = item.strip().partition(";")
        q = params.strip().lower()
        if q.startswith("q=") and q[2:].strip() in ("0", "0.", "0.0", "0.00", "0.000"):
            continue
        accepted.add(name.strip().lower())
    return next((c for c in offered if c in accepted), None)


@lru_cache(maxsize=4)
def bomb(coding: str, size: int, fill: int = 0x20) -> bytes:
    """``coding``-encoded data that decodes to ``size`` bytes of value ``fill`` (spaces
    by default: gzip ~1000:1, br and zstd far more)."""
    enc = _Encoder(coding)
    block = bytes([fill]) * _BLOCK
    out = []
    left = size
    while left > 0:
        out.append(enc.compress(block[: min(left, _BLOCK)]))
        left -= _BLOCK
    out.append(enc.finish())
    return b"".join(out)
