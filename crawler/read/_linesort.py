"""Sorting more lines than memory holds: sorted runs spilled to files, merged (crawler.read.wacz).

:class:`LineSorter` buffers lines (bytes, each ending in ``\\n``) up to
``buffer_bytes``, sorts the buffer and writes it as a run file in
``directory``. :meth:`LineSorter.sorted` merges the runs (``fan_in`` at a
time, in passes when there are more), so memory holds one buffer, or one
line per open run, never the whole. Lines sort as bytes (the C locale's
order, the one CDXJ readers binary-search).

For one thread; the caller owns and removes ``directory``.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator
from contextlib import ExitStack

DEFAULT_BUFFER = 32 << 20  # bytes of lines sorted in memory at once
DEFAULT_FAN_IN = 64  # runs merged at once (open files)


class LineSorter:
    def __init__(self, directory: str, *, buffer_bytes: int = DEFAULT_BUFFER,
                 fan_in: int = DEFAULT_FAN_IN) -> None:
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
            files = [stack.enter_context(open(run, "rb")) for run in runs]
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
            files = [stack.enter_context(open(run, "rb")) for run in self._runs]
            yield from heapq.merge(*files)
        for run in self._runs:
            os.unlink(run)
        self._runs = []
