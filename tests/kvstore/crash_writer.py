"""Child program of test_crash.py: writes to a store at full speed until it is killed.

    python crash_writer.py STORE put START
    python crash_writer.py STORE compact START

It prints ``ready`` once the store is open. After each ``flush()`` returns it
prints N, meaning every operation of steps < N has reached the OS. In
``compact`` mode it prints ``compacting`` before each ``compact()`` and
``compacted`` after it. Keys and values are functions of the step number, so
the parent can check the store without any other channel.
"""

from __future__ import annotations

import random
import sys

import kvstore

FLUSH_EVERY = 300  # put mode: steps between flushes
NEW_PER_CYCLE = 20  # compact mode: new keys per cycle
OVERWRITES_PER_CYCLE = 150  # compact mode: rewrites of old keys (same value) per cycle
BIG = 4096  # compact mode: value size, so compaction has real work to do


def key(i: int) -> bytes:
    return kvstore.md5_key(str(i))


def small_value(i: int) -> bytes:
    """Put mode: 0 to ~45 bytes; every 97th value is empty."""
    if i % 97 == 0:
        return b""
    return b"%d:" % i * (1 + i % 5)


def is_deleted_at_step(i: int) -> int | None:
    """Put mode: step i (i % 10 == 9) also deletes key(i - 5); returns that index."""
    return i - 5 if i % 10 == 9 and i >= 5 else None


def big_value(i: int) -> bytes:
    stamp = b"%d;" % i
    return (stamp * (BIG // len(stamp) + 1))[: BIG - (i % 64)]


def scratch_key(i: int) -> bytes:
    """Compact mode: a key put and deleted in the cycle that ends at step i."""
    return kvstore.md5_key(b"scratch%d" % i)


def run_puts(db: kvstore.Store, start: int) -> None:
    i = start
    while True:
        for _ in range(FLUSH_EVERY):
            db[key(i)] = small_value(i)
            gone = is_deleted_at_step(i)
            if gone is not None:
                db.pop(key(gone), None)
            i += 1
        db.flush()
        print(i)


def run_compactions(db: kvstore.Store, start: int) -> None:
    rng = random.Random(start)
    i = start
    while True:
        for _ in range(NEW_PER_CYCLE):
            db[key(i)] = big_value(i)
            i += 1
        for _ in range(OVERWRITES_PER_CYCLE):
            j = rng.randrange(i)
            db[key(j)] = big_value(j)
        scratch = scratch_key(i)
        db[scratch] = b"s" * 500
        del db[scratch]
        db.flush()
        print(i)
        print("compacting")
        db.compact()
        print("compacted")


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    path, mode, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
    db = kvstore.open(path)
    print("ready")
    if mode == "put":
        run_puts(db, start)
    else:
        run_compactions(db, start)


if __name__ == "__main__":
    main()
