"""``--max-pages`` across the shard processes of one machine: one count they all take from.

A crawl of one site is one shard's work (hosts are sharded): with the limit split
evenly, ``--max-pages 100`` on 4 shards fetched 25 pages. So the supervisor makes
``DIR/pages.count`` at the start of each run, an 8-byte count at zero, and every
shard reserves each fetch there: an exclusive ``flock`` on the file, the count read,
written back one higher if it is below the limit, the lock released (four system
calls a page, nothing next to a fetch). The limit is exact over all shards whichever
has the work, and a shard restarted after a crash goes on from the run's count
instead of counting afresh. The count is of fetches reserved in this run, as a single
process counts them; a new run starts again from zero.

On Ray the shards can be on several machines and keep an even share each
(crawler.run.shard.shard_config).

Thread- and process-safe (the flock, on this file's own open file description).
"""

from __future__ import annotations

import fcntl
import os

from ..exceptions import DataDirError

COUNT_NAME = "pages.count"
_SIZE = 8


def create(path: str) -> None:
    """A count at zero under ``path`` (replacing the last run's)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(bytes(_SIZE))
    os.replace(tmp, path)


class SharedPageLimit:
    """Fetches reserved against ``limit`` in the count file ``path``."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise DataDirError(f"{path}: cannot open the run's page count "
                               f"({exc.strerror})") from None

    def reserve(self) -> bool:
        """Count one fetch; False (nothing counted) once ``limit`` were counted."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            count = int.from_bytes(os.pread(self._fd, _SIZE, 0), "little")
            if count >= self.limit:
                return False
            os.pwrite(self._fd, (count + 1).to_bytes(_SIZE, "little"), 0)
            return True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def count(self) -> int:
        """Fetches reserved so far in this run, by every shard."""
        return int.from_bytes(os.pread(self._fd, _SIZE, 0), "little")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


__all__ = ["COUNT_NAME", "SharedPageLimit", "create"]
