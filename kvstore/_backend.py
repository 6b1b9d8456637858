"""Which implementation of the hot paths runs: the C extension, or the pure-Python reference.

Theory of operation
-------------------
What is in C. A Python method call costs ~0.1-0.3 us, more than a whole
probe, so the single-key operations cannot be Python methods that call C:
they must *be* C. ``Store``, ``KeySet``, ``KeyIntMap`` and ``HashIndex``
therefore inherit them from a base class: ``key in s``, ``s[k]``,
``s[k] = v`` and ``del s[k]`` are the base type's ``sq_contains``,
``mp_subscript`` and ``mp_ass_subscript`` slots, which a Python subclass
that does not define those methods uses directly, with no Python frame in
between; ``get``, ``add``, ``discard`` and the index's methods are C
methods. The batch paths keep their numpy orchestration in Python (hash,
group by segment, rebuild decisions) and call C for the loops that numpy
could only run in rounds: ``_lookup_into`` (``contains_many``,
``lookup_many``), ``_insert_segment`` (``put_many`` and the index build on
open), ``_group_batch`` (a batch's keys grouped by segment, repeats dropped)
and ``_hash_keys``; and the CRC walks over VAL records on open
(``check_val_records``, ``check_keyed_records``).

There are two sets of those bases with the same names and fields:
``kvstore._speedups`` (C) and ``kvstore._fallback`` (Python). The Python
one is the reference: the C code mirrors it function for function on the
same storage (the ``_Segment`` arrays, the generation's buffers), so the
two build byte-identical tables and files, which tests/kvstore/
test_speedups.py checks by driving both with the same operations. The C
code has no logic of its own: everything uncommon (normalizing a key that
is not exactly 16 bytes of ``bytes``, a closed or read-only store, a value
that needs pread or a remap, a CRC failure, a segment rebuild, a value check
that fails) is handed to the same Python code that the pure backend runs,
so errors and their messages are the same by construction.

Threads. The C paths hold the GIL from start to end and never let it go
during a walk over the slots, which is what makes the lock-free lookups
safe, exactly as for the Python code (see ``_index``); writers take the
owner's lock (``Lock``: ``threading.Lock``, or its C twin, which the C write
paths take without a method call), so they are serialized with the Python paths
(flush, compaction, batches) that hold it, including a flush whose
``os.write`` runs without the GIL. _speedups.c says what a free-threaded
CPython would need.

Selection. At import, the C extension is used if it was built and matches
this Python code (``API_VERSION`` and the table constants); setting the
environment variable ``KVSTORE_PURE_PYTHON=1`` forces the pure-Python code.
``BACKEND`` says which one runs: ``"c"`` or ``"python"``.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING

from . import _fallback

log = logging.getLogger(__name__)

API_VERSION = 4  # must equal _speedups.API_VERSION
# Constants both implementations must agree on.
_SHARED = (
    "KEY_SIZE",
    "NUM_SEGMENTS",
    "MAX_LOAD",
    "MIN_LOAD",
    "MIN_SEGMENT_CAPACITY",
    "REMAP_SLACK",
    "MULT128",
    "MULT64",
)

FORCE_PURE = os.environ.get("KVSTORE_PURE_PYTHON", "") not in ("", "0")


def _load_speedups() -> ModuleType | None:
    if FORCE_PURE:
        return None
    try:
        from . import _speedups  # type: ignore[attr-defined]
    except ImportError as exc:
        log.debug("kvstore: C extension not available (%s); using pure Python", exc)
        return None
    mismatch = [
        name for name in _SHARED if getattr(_speedups, name, None) != getattr(_fallback, name)
    ]
    if _speedups.API_VERSION != API_VERSION or mismatch:
        raise ImportError(
            f"kvstore._speedups ({_speedups.__file__}) was built from other sources "
            f"(API {_speedups.API_VERSION}, expected {API_VERSION}; differing: {mismatch}); "
            "rebuild it with `pip install -e .`, or set KVSTORE_PURE_PYTHON=1"
        )
    module: ModuleType = _speedups
    return module


_impl = _load_speedups()
BACKEND = "python" if _impl is None else "c"

if TYPE_CHECKING or _impl is None:
    from ._fallback import (
        IndexBase,
        KeyIntMapBase,
        KeySetBase,
        Lock,
        SegmentBase,
        StoreBase,
        check_keyed_records,
        check_val_records,
    )
else:
    Lock = _impl.Lock
    check_keyed_records = _impl.check_keyed_records
    check_val_records = _impl.check_val_records
    IndexBase = _impl.IndexBase
    KeyIntMapBase = _impl.KeyIntMapBase
    KeySetBase = _impl.KeySetBase
    SegmentBase = _impl.SegmentBase
    StoreBase = _impl.StoreBase

__all__ = [
    "BACKEND",
    "FORCE_PURE",
    "IndexBase",
    "KeyIntMapBase",
    "KeySetBase",
    "Lock",
    "SegmentBase",
    "StoreBase",
    "check_keyed_records",
    "check_val_records",
]
