"""Content-Encoding, decoded while the body streams in, never past a limit.

A response body may be compressed (gzip, deflate, br, zstd). A hostile server sends a
bomb: a few KiB that decode to gigabytes (CVE-2025-6176 is Brotli's). So a decoder here
never returns more than it is asked for: each call takes the bytes read and a limit,
and yields the decoded bytes in pieces of at most PIECE, no more than the limit in all.
The fetcher asks for one byte more than it will keep, so "more than the limit" is
seen without decoding any further.

- gzip, deflate: zlib's ``max_length``; "deflate" sent without its zlib header (raw
  deflate, as some servers do) is accepted too.
- br: ``brotlicffi`` (1.2.0.0 and later: ``output_buffer_limit``, the fix of
  CVE-2025-6176), or Google's ``brotli`` (1.2.0 and later) when brotlicffi is absent.
  brotlicffi is the one required: pywb depends on the old brotlipy, whose ``brotli``
  package shadows Google's module of that name and cannot bound its output. A decoder
  may overshoot its buffer limit (Google's does, by half), so output is cut into
  pieces here.
- zstd: Python 3.14's ``compression.zstd``, or the ``backports.zstd`` package before
  3.14. A frame's window is capped at 8 MiB (RFC 9659 §3: what a decoder of HTTP content
  needs), so a frame cannot make the decoder allocate its 2 GiB maximum.

``ACCEPT_ENCODING`` names exactly the codings this process can decode: a package
missing means its coding is not asked for (and a body sent in it anyway is kept as it
came). A body that does not decode raises ContentDecodingError (a ValueError: the
fetcher's "protocol" outcome).
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..exceptions import ContentDecodingError

PIECE = 64 << 10  # the most a decoder returns at once
ZSTD_WINDOW_LOG_MAX = 23  # 8 MiB: RFC 9659's limit for zstd in HTTP


def _first_module(*names: str) -> Any:
    """The first of the modules ``names`` that imports, None if none does."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


_brotli = _first_module("brotlicffi", "brotli")
_zstd = _first_module("compression.zstd", "backports.zstd")


class Decoder(Protocol):
    def pieces(self, data: bytes, limit: int) -> Iterator[bytes]:
        """``data`` (the next bytes of the body) decoded: pieces of at most PIECE bytes,
        at most ``limit`` bytes in all (what would come after is not decoded)."""
        ...

    def finish(self, limit: int) -> Iterator[bytes]:
        """What the decoder still holds once the body has ended, within ``limit``."""
        ...


def _cut(out: bytes, limit: int) -> Iterator[bytes]:
    """``out`` within ``limit``, in pieces of at most PIECE."""
    out = out[:limit]
    for i in range(0, len(out), PIECE):
        yield out[i : i + PIECE]


class _Zlib:
    """gzip (wbits 31) or deflate (15, falling back to raw deflate on the first bytes)."""

    def __init__(self, wbits: int) -> None:
        self._z = zlib.decompressobj(wbits)
        self._raw_ok = wbits == zlib.MAX_WBITS
        self._fed = False

    def _decode(self, data: bytes, limit: int) -> bytes:
        try:
            try:
                return self._z.decompress(data, limit)
            except zlib.error:
                if not self._raw_ok or self._fed:
                    raise
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                return self._z.decompress(data, limit)
        except zlib.error as exc:
            raise ContentDecodingError(f"bad deflate data: {exc}") from None
        finally:
            self._fed = True

    def pieces(self, data: bytes, limit: int) -> Iterator[bytes]:
        while limit > 0:
            piece = self._decode(data, min(limit, PIECE))
            data = self._z.unconsumed_tail
            if not piece:
                return
            limit -= len(piece)
            yield piece
            if not data:
                return

    def finish(self, limit: int) -> Iterator[bytes]:
        if limit > 0:
            yield from self.pieces(b"", limit)


class _Brotli:
    def __init__(self) -> None:
        self._d = _brotli.Decompressor()

    def _process(self, data: bytes) -> bytes:
        try:
            out: bytes = self._d.process(data, output_buffer_limit=PIECE)
        except _brotli.error as exc:
            raise ContentDecodingError(f"bad brotli data: {exc}") from None
        return out

    def pieces(self, data: bytes, limit: int) -> Iterator[bytes]:
        out = self._process(data)
        while out and limit > 0:
            for piece in _cut(out, limit):
                limit -= len(piece)
                yield piece
            # More output is pending until the decoder can take input again.
            out = b"" if self._d.can_accept_more_data() else self._process(b"")

    def finish(self, limit: int) -> Iterator[bytes]:
        while limit > 0:
            out = self._process(b"")
            if not out:
                return
            for piece in _cut(out, limit):
                limit -= len(piece)
                yield piece


class _Zstd:
    def __init__(self) -> None:
        self._d = self._new()

    @staticmethod
    def _new() -> Any:
        return _zstd.ZstdDecompressor(
            options={_zstd.DecompressionParameter.window_log_max: ZSTD_WINDOW_LOG_MAX})

    def pieces(self, data: bytes, limit: int) -> Iterator[bytes]:
        while limit > 0:
            if self._d.eof:  # a frame ended: what follows it is the next frame
                data = self._d.unused_data + data
                if not data:
                    return
                self._d = self._new()
            if self._d.needs_input and not data:
                return
            try:
                piece: bytes = self._d.decompress(data, max_length=min(limit, PIECE))
            except _zstd.ZstdError as exc:
                raise ContentDecodingError(f"bad zstd data: {exc}") from None
            data = b""
            if piece:
                limit -= len(piece)
                yield piece
            elif not self._d.eof:
                return

    def finish(self, limit: int) -> Iterator[bytes]:
        yield from self.pieces(b"", limit)


def _factories() -> dict[str, Callable[[], Decoder]]:
    out: dict[str, Callable[[], Decoder]] = {
        "gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
        "x-gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
        "deflate": lambda: _Zlib(zlib.MAX_WBITS),
    }
    if _brotli is not None and _brotli_bounded():
        out["br"] = _Brotli
    if _zstd is not None:
        out["zstd"] = _Zstd
    return out


def _brotli_bounded() -> bool:
    """Whether the brotli module found can bound its output (brotlicffi 1.2.0.0, brotli
    1.2.0 and later); another would decode a bomb whole, so br is then neither asked for
    nor decoded."""
    try:
        _brotli.Decompressor().process(b"", output_buffer_limit=1)
    except (AttributeError, TypeError):  # brotlipy, or a release before the limit
        return False
    except _brotli.error:
        pass
    return True


_FACTORIES = _factories()

# Most compact first: a server picks by its own preference, most by this order.
ACCEPT_ENCODING = ", ".join(c for c in ("zstd", "br", "gzip", "deflate") if c in _FACTORIES)


def decoder_for(coding: str | None) -> Decoder | None:
    """A decoder for a Content-Encoding value, None for identity, an unknown coding or a
    list of codings (the body is then kept as it came)."""
    factory = _FACTORIES.get((coding or "").strip().lower())
    return factory() if factory is not None else None


def decode_all(coding: str, data: bytes, limit: int) -> tuple[bytes, bool]:
    """``data`` decoded whole, within ``limit``: (decoded, whether there was more). For
    bodies already in memory (tests, tools); the fetcher streams."""
    decoder = decoder_for(coding)
    if decoder is None:
        raise ContentDecodingError(f"cannot decode Content-Encoding {coding!r}")
    out = b"".join(decoder.pieces(data, limit + 1))
    out += b"".join(decoder.finish(limit + 1 - len(out)))
    return out[:limit], len(out) > limit
