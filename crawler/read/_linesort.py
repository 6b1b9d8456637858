"""Sorting more lines than memory holds: sorted runs spilled to files, merged (crawler.read.wacz).

:class:`LineSorter` buffers lines (bytes, each ending in ``\\n``) up to
``buffer_bytes``, sorts the buffer and writes it as a run file in
``directory``. :meth:`LineSorter.sorted` merges the runs (``fan_in`` at a
time, in passes when there are more; by default as many as the limit of open
files allows, so that a pass is rarely needed), so memory holds one buffer, or
one line and a read-ahead per open run, never the whole. Lines sort as bytes (the C locale's
order, the one CDXJ readers binary-search).

For one thread; the caller owns and removes ``directory``.
"""

from __future__ import annotations

import heapq
import os
import resource
from collections.abc import Iterator
from contextlib import ExitStack

DEFAULT_BUFFER = 32 << 20  # bytes of lines sorted in memory at once
MAX_FAN_IN = 1024  # runs merged at once (open files), at most
RUN_BUFFER = 1 << 16  # bytes read ahead from a run while merging


def default_fan_in() -> int:
    """Runs merged at once: as many as half of this process's soft limit of open files
    allows (the rest is the caller's), up to MAX_FAN_IN. Each pass over the runs reads
    and writes every line once more: at 20M pages the index's anchor lines are ~9 GB a
    shard, ~570 runs of 16 MB, one merge with 1,024 files open, two with 64."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_FAN_IN
    return max(2, min(MAX_FAN_IN, soft // 2))


class LineSorter:
    def __init__(self, directory: str, *, buffer_bytes: int = DEFAULT_BUFFER,
                 fan_in: int | None = None) -> None:
        if fan_in is None:
            fan_in = default_fan_in()
        if fan_in < 2:
            raise ValueError(f"fan_in must be >= 2, got {fan_in}")
        self.dir, self.buffer_bytes, self.fan_in = directory, buffer_bytes, fan_in
        self.lines = 0
        self._buffer: list[bytes] = []
        self._held = 0
        self._runs: list[str] = []
        self._made = 0  # run files made, for their names

    def add(self, line: bytes) -> None:
        self._buffer.append(line)
        self._held += len(line)
        self.lines += 1
        if self._held >= self.buffer_bytes:
            self._spill()

    def _new_run(self) -> str:
        self._made += 1
        return os.path.join(self.dir, f"run-{self._made:06d}")

    def _spill(self) -> None:
        if not self._buffer:
            return
        self._buffer.sort()
        path = self._new_run()
        with open(path, "wb") as f:
            f.writelines(self._buffer)
        self._runs.append(path)
        self._buffer, self._held = [], 0

    def _merge(self, runs: list[str]) -> str:
        path = self._new_run()
        with ExitStack() as stack, open(path, "wb") as out:
            files = [stack.enter_context(open(run, "rb", buffering=RUN_BUFFER))
                     for run in runs]
            out.writelines(heapq.merge(*files))
        for run in runs:
            os.unlink(run)
        return path

    def sorted(self) -> Iterator[bytes]:
        """Every line added, in order. Call once, after the last ``add``."""
        if not self._runs:  # it all fit in memory
            self._buffer.sort()
            yield from self._buffer
            self._buffer = []
            return
        self._spill()
        while len(self._runs) > self.fan_in:
            merged = [self._merge(self._runs[i:i + self.fan_in])
                      for i in range(0, len(self._runs), self.fan_in)]
            self._runs = merged
        with ExitStack() as stack:
            files = [stack.enter_context(open(run, "rb", buffering=RUN_BUFFER))
                     for run in self._runs]
            yield from heapq.merge(*files)
        for run in self._runs:
            os.unlink(run)
        self._runs = []
