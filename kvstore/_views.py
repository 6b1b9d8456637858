"""Mapping views that a concurrent delete cannot break.

``collections.abc``'s ``ItemsView`` and ``ValuesView`` iterate the keys and then
read each value with ``store[key]``: a key that another thread deletes between
the two raises KeyError out of the loop. The store is documented thread-safe, so
its views skip such a key, as they would had the loop started a moment later.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Iterator, Mapping
from typing import Any

_ABSENT: Any = object()


class ItemsView(collections.abc.ItemsView[bytes, bytes]):
    def __init__(self, store: Mapping[bytes, bytes]) -> None:
        super().__init__(store)
        self._store = store

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        store = self._store
        for key in store:
            value = store.get(key, _ABSENT)
            if value is not _ABSENT:
                yield key, value


class ValuesView(collections.abc.ValuesView[bytes]):
    def __init__(self, store: Mapping[bytes, bytes]) -> None:
        super().__init__(store)
        self._store = store

    def __iter__(self) -> Iterator[bytes]:
        store = self._store
        for key in store:
            value = store.get(key, _ABSENT)
            if value is not _ABSENT:
                yield value

    def __contains__(self, value: object) -> bool:
        return any(v is value or v == value for v in self)
