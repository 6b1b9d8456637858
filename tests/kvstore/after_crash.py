"""A store's directory as a crash leaves it, for tests of recovery on open."""

from __future__ import annotations

from pathlib import Path


def as_after_a_crash(path: Path) -> None:
    """Remove the index a clean close saved: a crash saves none for the files it leaves.

    A test that damages a cleanly closed store's tail to stand for a torn write
    needs this. With the index in place the open knows that nothing was written
    since the close (which syncs both files first), so a changed VAL tail is rot
    in place, which it keeps (see test_indexfile)."""
    for idx in path.glob("data-*.idx"):
        idx.unlink()
