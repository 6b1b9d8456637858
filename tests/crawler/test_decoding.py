"""crawler.net.decoding: every Content-Encoding decodes whole, in any split, and never
returns more than it is asked for; the codings asked for are the ones installed.

Compressed data comes from the real libraries (zlib, brotlicffi, zstd); the fetcher
over a real server is tests/crawler/test_fetch.py."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
import zlib
from collections.abc import Callable

import brotlicffi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.exceptions import ContentDecodingError
from crawler.net import decoding
from crawler.net.decoding import PIECE, decode_all, decoder_for

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def _gzip(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "gzip": _gzip,
    "deflate": zlib.compress,
    "br": lambda d: bytes(brotlicffi.compress(d, quality=5)),
    "zstd": zstd.compress,
}


def decode_in_pieces(coding: str, data: bytes, cuts: list[int], limit: int) -> list[bytes]:
    """Feed ``data`` split at ``cuts``, as reads from a socket would; every piece out."""
    decoder = decoder_for(coding)
    assert decoder is not None
    got: list[bytes] = []
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        got += decoder.pieces(data[a:b], limit - sum(map(len, got)))
        if sum(map(len, got)) >= limit:
            return got
    got += decoder.finish(limit - sum(map(len, got)))
    return got


@pytest.mark.parametrize("coding", sorted(ENCODE))
@settings(max_examples=40, deadline=None)
@given(body=st.binary(max_size=3000) | st.builds(lambda n, b: b * n, st.integers(0, 400_000),
                                                  st.binary(min_size=1, max_size=3)),
       cuts=st.lists(st.integers(0, 1 << 20), max_size=6))
def test_any_split_decodes_whole_in_bounded_pieces(coding: str, body: bytes,
                                                   cuts: list[int]) -> None:
    got = decode_in_pieces(coding, ENCODE[coding](body), cuts, len(body) + 1)
    assert b"".join(got) == body
    assert all(0 < len(p) <= PIECE for p in got)


@pytest.mark.parametrize("coding", sorted(ENCODE))
@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 300_000), limit=st.integers(0, 300_000),
       cuts=st.lists(st.integers(0, 1 << 20), max_size=4))
def test_never_more_than_the_limit(coding: str, size: int, limit: int, cuts: list[int]) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    got = decode_in_pieces(coding, ENCODE[coding](body), cuts, limit)
    assert b"".join(got) == body[:limit]
    out, more = decode_all(coding, ENCODE[coding](body), limit)
    assert out == body[:limit] and more == (size > limit)


@pytest.mark.parametrize("coding", sorted(ENCODE))
def test_a_bomb_costs_only_what_is_asked_for(coding: str) -> None:
    """256 MiB of zeros compress to KiB; asking for 1 MiB decodes about 1 MiB."""
    c = {"gzip": lambda: zlib.compressobj(9, zlib.DEFLATED, 31),
         "deflate": lambda: zlib.compressobj(9),
         "br": lambda: brotlicffi.Compressor(quality=5),
         "zstd": lambda: zstd.ZstdCompressor()}[coding]()
    block = bytes(1 << 20)
    feed = c.process if coding == "br" else c.compress
    parts = [feed(block) for _ in range(256)]
    parts.append(c.finish() if coding == "br" else
                 c.flush(zstd.ZstdCompressor.FLUSH_FRAME) if coding == "zstd" else c.flush())
    data = b"".join(parts)
    decoder = decoder_for(coding)
    assert decoder is not None
    tracemalloc.start()
    try:
        got = list(decoder.pieces(data, (1 << 20) + 1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(map(len, got)) == (1 << 20) + 1 and max(map(len, got)) <= PIECE
    assert peak < 8 << 20, peak  # the bomb decodes to 256 MiB


def test_zstd_frames_one_after_another_are_one_body() -> None:
    data = zstd.compress(b"first frame, ") + zstd.compress(b"") + zstd.compress(b"second")
    assert decode_in_pieces("zstd", data, [5, 17, 30], 1000) != []
    assert b"".join(decode_in_pieces("zstd", data, [5, 17, 30], 1000)) == \
        b"first frame, second"


def test_a_zstd_window_past_8_mib_is_refused() -> None:
    """RFC 9659: a decoder of HTTP content needs no window over 8 MiB; a frame asking for
    128 MiB (here without its content size, so the window stays) is refused, not
    allocated."""
    c = zstd.ZstdCompressor(options={zstd.CompressionParameter.window_log: 27})
    data = c.compress(os.urandom(1000)) + c.flush(zstd.ZstdCompressor.FLUSH_FRAME)
    with pytest.raises(ContentDecodingError, match="zstd"):
        decode_all("zstd", data, 1 << 20)
    c = zstd.ZstdCompressor(options={zstd.CompressionParameter.window_log: 23})
    data = c.compress(b"fits") + c.flush(zstd.ZstdCompressor.FLUSH_FRAME)
    assert decode_all("zstd", data, 100) == (b"fits", False)


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_corrupt_data_is_a_decoding_error_a_value_error(coding: str) -> None:
    text = b"".join(b"line %d of a page that compresses well\n" % i for i in range(5000))
    data = bytearray(ENCODE[coding](text))
    data[12:] = b"\xff" * (len(data) - 12)  # past the header: no valid block follows
    with pytest.raises(ContentDecodingError) as info:
        decode_all(coding, bytes(data), 1 << 20)
    assert isinstance(info.value, ValueError)  # the fetcher's "protocol" outcome


def test_raw_deflate_without_its_zlib_header_is_accepted() -> None:
    assert decode_all("deflate", _raw_deflate(b"raw " * 999), 1 << 20) == (b"raw " * 999, False)


def test_identity_unknown_and_stacked_codings_have_no_decoder() -> None:
    for coding in (None, "", "identity", "compress", "gzip, br", "x-bzip2"):
        assert decoder_for(coding) is None, coding
    for coding in ("GZIP", " br ", "Zstd", "x-gzip"):
        assert decoder_for(coding) is not None, coding


def test_accept_encoding_is_every_coding_decoded_here() -> None:
    assert decoding.ACCEPT_ENCODING == "zstd, br, gzip, deflate"


def _import_with_hidden(*modules: str) -> str:
    """ACCEPT_ENCODING, and whether br and zstd decode, in a Python where ``modules``
    cannot be imported (as if not installed)."""
    code = ("import sys\n"
            f"for m in {modules!r}: sys.modules[m] = None\n"
            "from crawler.net import decoding as d\n"
            "print(d.ACCEPT_ENCODING, d.decoder_for('br') is None, d.decoder_for('zstd') is None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=True)
    return done.stdout.strip()


def test_a_coding_whose_package_is_missing_is_neither_asked_for_nor_decoded() -> None:
    assert _import_with_hidden("brotlicffi", "brotli") == "zstd, gzip, deflate True False"
    assert _import_with_hidden("compression.zstd", "backports.zstd") == \
        "br, gzip, deflate False True"


def test_a_brotli_that_cannot_bound_its_output_is_not_used() -> None:
    """brotlipy (pywb's dependency) installs a module named ``brotli`` whose decoder has
    no output limit: with brotlicffi absent, br is then off, never decoded unbounded."""
    code = ("import sys, types\n"
            "sys.modules['brotlicffi'] = None\n"
            "old = types.ModuleType('brotli')\n"
            "class error(Exception): pass\n"
            "class Decompressor:\n"
            "    def decompress(self, data): return data\n"
            "old.error, old.Decompressor = error, Decompressor\n"
            "sys.modules['brotli'] = old\n"
            "from crawler.net import decoding as d\n"
            "print(d.ACCEPT_ENCODING, d.decoder_for('br'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=True)
    assert done.stdout.strip() == "zstd, gzip, deflate None"
