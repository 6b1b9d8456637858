"""The frontier's syncer: fsync every ``interval`` on a thread of its own, then upkeep.

An fsync can take a second on a busy disk, and the committer must go on
writing (what it writes reaches the OS at once; the fsync only adds power-loss
safety). So the committer only *asks* (``maybe``), and one thread fsyncs. A
failed fsync is kept and raised by the committer's next ``maybe``: the commit
fails with it, as a failed write would. After each good fsync the syncer runs
the frontier's upkeep: compacting PendDB when most of it is dead
(``compact_if_wasted``), beside the committer's writes (kvstore compaction
allows them and survives a kill at any instant).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import kvstore

__all__ = ["Syncer", "compact_if_wasted"]

log = logging.getLogger(__name__)

# Seconds a stop waits for the syncer's thread before it says what it waits for.
STOP_QUIET = 1.0


class Syncer:
    """``sync`` every ``interval`` seconds (when the committer asks), then ``upkeep``."""

    def __init__(self, interval: float, sync: Callable[[], None],
                 upkeep: Callable[[], None], name: str = "the frontier") -> None:
        self.interval = interval
        self.name = name  # in the message of a stop that waits
        self._sync = sync
        self._upkeep = upkeep
        self._last = time.monotonic()
        self.thread: threading.Thread | None = None  # started at the first due fsync
        self._due = threading.Event()
        self._stop = False
        self._failed: BaseException | None = None

    def maybe(self, force: bool = False) -> None:
        """Wake the syncer if ``interval`` passed; raise the last fsync's error.
        ``force`` (at close) stops the syncer and fsyncs here."""
        if force:
            self.stop()
            self._sync()
            return
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed  # from the syncer's last fsync: the commit fails with it
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="frontier-sync",
                                               daemon=True)
                self.thread.start()
            self._due.set()

    def _loop(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._stop:  # set before the wake-up that brought us here
                return
            try:
                self._sync()
            except BaseException as exc:  # noqa: BLE001 - handed to the committer
                self._failed = exc
                return
            self._upkeep()

    def stop(self) -> None:
        """Stop the thread; raise the last fsync's error, if any."""
        if self.thread is not None:
            self._stop = True
            self._due.set()
            self.thread.join(STOP_QUIET)
            if self.thread.is_alive():  # a compaction under way: 74-95 s a shard at 20M pages
                log.warning("%s: waiting for the fsync or compaction under way to end (a "
                            "second Ctrl-C stops at once, as safely as a kill -9)", self.name)
                self.thread.join()
            self.thread = None
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed


def compact_if_wasted(store: kvstore.Store, min_dead: int, name: str) -> bool | None:
    """Compact ``store`` if its dead bytes pass ``min_dead`` and twice its live ones.
    True if it did, None if not needed, False if it failed (a full disk: logged, the
    store as it was)."""
    st = store.stats()
    if st.dead_bytes < max(min_dead, 2 * st.live_bytes):
        return None
    try:
        store.compact()
    except OSError as exc:
        log.warning("%s not compacted: %s", name, exc)
        return False
    log.info("%s compacted: %d dead bytes dropped", name, st.dead_bytes)
    return True
