"""A page's 64-bit SimHash (Charikar 2002), for near-duplicate detection.

The text's words, lowercased, are cut into overlapping shingles of :data:`SHINGLE` words;
each shingle hashes to 64 bits (blake2b: the same value in every process and release,
unlike ``hash()``), and bit i of the SimHash is set when more than half of the shingles
have bit i set. Pages that share most of their shingles get hashes a few bits apart: two
pages are near-duplicates when their hashes differ in at most :data:`NEAR` bits (Manku,
Jain and Das Sarma, WWW 2007: 3 of 64 bits at web scale). Identical texts get identical
hashes; a text of fewer words than a shingle is one shingle.

Cost: one blake2b a shingle, and the bits counted in C (``bytes.translate`` and
``count`` over the n shingles' j-th bytes, 64 times), ~1 µs a word; at most
:data:`MAX_WORDS` words are read (a page past that is the same page for this purpose).
"""

from __future__ import annotations

import hashlib

SHINGLE = 3
NEAR = 3
MAX_WORDS = 20_000


# _BIT[k]: a byte becomes 1 where its bit k (7 = the high bit) is set, else 0.
_BIT = [bytes((v >> k) & 1 for v in range(256)) for k in range(8)]


def simhash(text: str) -> int:
    """The SimHash of ``text`` as an int in [0, 2**64); 0 for a text with no words."""
    words = text.lower().split()[:MAX_WORDS]
    if not words:
        return 0
    n = max(1, len(words) - SHINGLE + 1)
    digests = b"".join(
        hashlib.blake2b(" ".join(words[i : i + SHINGLE]).encode("utf-8"),
                        digest_size=8).digest()
        for i in range(n))
    out = 0
    for j in range(8):  # the j-th byte of every digest, most significant first
        column = digests[j::8]
        for k in range(7, -1, -1):
            out = (out << 1) | (column.translate(_BIT[k]).count(1) * 2 > n)
    return out


def distance(a: int, b: int) -> int:
    """How many of the 64 bits two SimHashes differ in."""
    return (a ^ b).bit_count()


def near(a: int, b: int, bits: int = NEAR) -> bool:
    """Whether two SimHashes are near-duplicates (at most ``bits`` bits apart)."""
    return distance(a, b) <= bits
