"""In-memory key collections on the store's index: a key set and a key -> int map.

The crawler's PendSet and ProcessingSet (sets of URL digests), BadHosts and
Host2IP (digest -> retry time or IPv4 address) use these. Memory per key is
17 bytes a slot for a set and 16 + ``width`` (8 unless asked) for a map, at a
load factor up to 0.78.

The single-key methods (``in``, ``add``, ``discard``; ``[]``, ``get``,
``[k] = v``, ``del``) come from ``KeySetBase`` / ``KeyIntMapBase``: C, or
their pure-Python twins (see ``_backend``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping, MutableSet
from typing import Any

import numpy as np

from ._backend import KeyIntMapBase, KeySetBase, Lock
from ._index import HashIndex, as_key_array
from .exceptions import InvalidKeyError


def _keys(keys: Any) -> np.ndarray:
    try:
        return as_key_array(keys)
    except ValueError as exc:
        raise InvalidKeyError(str(exc)) from None


class KeySet(KeySetBase, MutableSet[bytes]):
    """A set of 16-byte keys. Thread-safe; membership tests take no lock."""

    _index_type: type[HashIndex] = HashIndex
    _index: HashIndex

    def __init__(self, keys: Iterable[bytes] = (), *, capacity: int = 0) -> None:
        self._index = self._index_type(1, capacity=capacity)
        self._lock = Lock()
        for key in keys:
            self.add(key)

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[bytes]:
        """Iterate over a snapshot taken when iteration starts."""
        with self._lock:
            keys, _ = self._index.items_arrays()
        kb = keys.tobytes()
        for j in range(0, len(kb), 16):
            yield kb[j : j + 16]

    def add_many(self, keys: Any) -> None:
        arr = _keys(keys)
        with self._lock:
            self._index.set_many(arr, np.zeros(len(arr), dtype=np.int64))

    def discard_many(self, keys: Any) -> None:
        arr = _keys(keys)
        with self._lock:
            self._index.set_many(arr, np.full(len(arr), -1, dtype=np.int64))

    def contains_many(self, keys: Any) -> np.ndarray:
        found, _ = self._index.lookup_many(_keys(keys))
        return found >= 0

    def random_key(self) -> bytes:
        """A member drawn uniformly at random; KeyError if empty."""
        with self._lock:
            return self._index.random_key()

    def index_stats(self) -> dict[str, float | int]:
        with self._lock:
            return self._index.stats()

    def __repr__(self) -> str:
        return f"<kvstore.KeySet {len(self)} keys>"


class KeyIntMap(KeyIntMapBase, MutableMapping[bytes, int]):
    """16-byte keys -> ints in 0 .. 2**(8 * width - 1) - 1 (``width`` bytes a value,
    1..8; 8: 0 .. 2**63 - 1). A narrow map costs less per slot: 18 bytes at width 2.
    Thread-safe; lookups take no lock."""

    _index_type: type[HashIndex] = HashIndex
    _index: HashIndex

    def __init__(
        self, items: Iterable[tuple[bytes, int]] = (), *, capacity: int = 0, width: int = 8
    ) -> None:
        if type(width) is not int or not 1 <= width <= 8:
            raise ValueError(f"width must be 1..8 bytes, got {width!r}")
        self._index = self._index_type(width, capacity=capacity)
        self._lock = Lock()
        for key, value in items:
            self[key] = value

    def _check_value(self, value: int) -> int:
        if not isinstance(value, int | np.integer) or isinstance(value, bool):
            raise TypeError(f"values are ints, got {type(value).__name__}")
        value = int(value)
        if not 0 <= value <= self._index.max_value:
            raise ValueError(f"value {value} outside 0..{self._index.max_value}")
        return value

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[bytes]:
        with self._lock:
            keys, _ = self._index.items_arrays()
        kb = keys.tobytes()
        for j in range(0, len(kb), 16):
            yield kb[j : j + 16]

    def contains_many(self, keys: Any) -> np.ndarray:
        found, _ = self._index.lookup_many(_keys(keys))
        return found >= 0

    def get_many(self, keys: Any, default: int = -1) -> np.ndarray:
        """int64 array of the keys' values, ``default`` where absent."""
        found, _ = self._index.lookup_many(_keys(keys))
        if default != -1:
            found[found < 0] = default
        return found

    def items_arrays(
        self, lo: int | None = None, hi: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """A snapshot of every entry, or of those with ``lo <= value <= hi``: (keys as
        an (n, 16) uint8 array, values int64), in no particular order. Filtered as it
        goes (memory: what is returned), for scans such as "the entries due by now"."""
        with self._lock:
            return self._index.items_arrays(lo, hi)

    def put_many(self, keys: Any, values: Any) -> None:
        arr = _keys(keys)
        try:
            vals = np.asarray(values, dtype=np.int64)
        except OverflowError:
            raise ValueError(f"values must be in 0..{self._index.max_value}") from None
        if len(vals) != len(arr):
            raise ValueError(f"put_many: {len(arr)} keys but {len(vals)} values")
        if len(vals) and (vals.min() < 0 or vals.max() > self._index.max_value):
            raise ValueError(f"values must be in 0..{self._index.max_value}")
        with self._lock:
            self._index.set_many(arr, vals)

    def random_key(self) -> bytes:
        with self._lock:
            return self._index.random_key()

    def index_stats(self) -> dict[str, float | int]:
        with self._lock:
            return self._index.stats()

    def __repr__(self) -> str:
        return f"<kvstore.KeyIntMap {len(self)} keys>"
