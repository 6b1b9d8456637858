"""A page's 64-bit SimHash (Charikar 2002), for near-duplicate detection.

The text's words, lowercased, are cut into overlapping shingles of :data:`SHINGLE` words;
each shingle hashes to 64 bits, and bit i of the SimHash is set when more than half of
the shingles have bit i set. Pages that share most of their shingles get hashes a few
bits apart: two pages are near-duplicates when their hashes differ in at most
:data:`NEAR` bits (Manku, Jain and Das Sarma, WWW 2007: 3 of 64 bits at web scale).
Identical texts get identical hashes; a text of fewer words than a shingle is one
shingle.

A shingle's hash: each word hashes to 64 bits (a polynomial hash of its UTF-8 bytes,
mixed: the same value in every process and release, unlike ``hash()``), a shingle
combines its words' hashes by position (multiplied by odd constants, summed modulo
2**64) and mixes the sum with splitmix64's finalizer. All of it is vectorized over the
page in numpy, the bit count too: ~0.1 µs a word, where a blake2b a shingle in Python
cost ~1.2 µs (it was the indexer's largest cost). At most :data:`MAX_WORDS`
words are read (a page past that is the same page for this purpose).
"""

from __future__ import annotations

import numpy as np

SHINGLE = 3
NEAR = 3
MAX_WORDS = 20_000
# Odd multipliers, one a shingle position (from splitmix64's and xxhash's constants).
_POSITION = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9],
                     dtype=np.uint64)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_BASE = 0x100000001B3  # FNV-1's 64-bit prime (odd)
_BASE_INVERSE = pow(_BASE, -1, 1 << 64)


def _powers(base: int, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) modulo 2**64."""
    out = np.full(n, base, dtype=np.uint64)
    out[0] = 1
    return np.cumprod(out, dtype=np.uint64)


# The powers tables of texts up to this many UTF-8 bytes are kept (2 x 8 B a byte: 4 MiB
# at most), grown as texts need: rebuilding them per page was a third of simhash's time
# on a 1,500-word page. A longer text builds its own, as every text once did.
KEEP_POWERS = 1 << 18
_ONE = np.ones(1, dtype=np.uint64)  # base**0
_kept: tuple[np.ndarray, np.ndarray] = (_ONE, _ONE)


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """_BASE's and _BASE_INVERSE's powers 0 .. n (at least: slice them)."""
    global _kept
    forward, inverse = _kept  # one tuple: a thread that grows it swaps both at once
    if len(forward) > n:
        return forward, inverse
    if n >= KEEP_POWERS:
        return _powers(_BASE, n + 1), _powers(_BASE_INVERSE, n + 1)
    size = min(KEEP_POWERS, max(n + 1, 2 * len(forward), 4096))
    _kept = (_powers(_BASE, size), _powers(_BASE_INVERSE, size))
    return _kept


def _finish(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place: every input bit reaches every output bit."""
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def _word_hashes(words: list[str]) -> np.ndarray:
    """A 64-bit hash of each word: a polynomial hash of its UTF-8 bytes modulo 2**64
    (odd base, so its powers are invertible: each word's hash is a difference of prefix
    sums, for every word at once), finished by splitmix64's mixer."""
    data = np.frombuffer(" ".join(words).encode("utf-8"), dtype=np.uint8)
    # Only the separators are spaces: split() took every whitespace out of the words,
    # and no byte of a multi-byte UTF-8 sequence is 0x20.
    gaps = np.flatnonzero(data == 0x20)
    starts = np.concatenate(([0], gaps + 1))
    ends = np.concatenate((gaps, [len(data)]))
    forward, inverse = _power_tables(len(data))
    prefix = np.zeros(len(data) + 1, dtype=np.uint64)
    np.cumsum(data.astype(np.uint64) * forward[:len(data)], out=prefix[1:])
    h = (prefix[ends] - prefix[starts]) * inverse[starts]
    return _finish(h ^ (ends - starts).astype(np.uint64))


def simhash(text: str) -> int:
    """The SimHash of ``text`` as an int in [0, 2**64); 0 for a text with no words."""
    words = text.lower().split()[:MAX_WORDS]
    if not words:
        return 0
    h = _word_hashes(words)
    n = max(1, len(words) - SHINGLE + 1)
    x = np.zeros(n, dtype=np.uint64)
    for j in range(min(SHINGLE, len(words))):
        x += h[j : j + n] * _POSITION[j]
    _finish(x)
    # big-endian bytes, unpacked most significant bit first: column 0 is bit 63
    bits = np.unpackbits(x.astype(">u8").view(np.uint8).reshape(n, 8), axis=1)
    majority = bits.sum(axis=0, dtype=np.int64) * 2 > n
    return int.from_bytes(np.packbits(majority).tobytes(), "big")


def distance(a: int, b: int) -> int:
    """How many of the 64 bits two SimHashes differ in."""
    return (a ^ b).bit_count()


def near(a: int, b: int, bits: int = NEAR) -> bool:
    """Whether two SimHashes are near-duplicates (at most ``bits`` bits apart)."""
    return distance(a, b) <= bits
