"""Progress of the long read commands (export, rank, report) on stderr.

Theory of operation
-------------------
The read layer reports through plain callbacks, ``progress(done, total)``
(crawler.read.export, report) and ``progress(iteration, delta)``
(crawler.read.rank); how to show them is the command line's business, so it
lives here: a program embedding ``export()`` gets no bar on its stderr and no
tqdm import. One :class:`Progress` per command, one *phase* per pass
(``rank``: the read of the records, then the PageRank iterations):

- on a terminal, a tqdm bar per phase (percentage, count, elapsed, time left,
  rate), redrawn at most every 0.2 s; log records (a file written, a warning)
  are printed above it (tqdm's logging redirect), never through it;
- elsewhere (a pipe, a file, a CI log), where a redrawn bar is noise: a log
  line every ``interval`` seconds, ``export: 45% (4,500/10,000 pages),
  1,230 pages/s, 4 s left``, and one when the phase ends, ``export: 100%
  (10,000/10,000 pages) in 8.1 s, 1,234 pages/s`` (a phase that ends short of
  its total says so: the last line shows where it stopped);
- ``quiet``: nothing.

Rate and time left are averages over the phase so far (count / elapsed, the
phase timed from the end of the one before, or from the start): steady, and
right for a pass whose records cost about the same. A phase
whose total is an estimate (iterations until PageRank converges,
:class:`Convergence`) shows it as ``~N``. The callbacks are called once per
record, so the non-terminal path costs one clock read a call.

Thread safety: for the one thread that runs the command.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType
from typing import Any, TextIO

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 10.0  # seconds between progress lines when stderr is not a terminal
BAR_REDRAW = 0.2  # seconds between redraws of a terminal bar

Callback = Callable[[int, int], None]


def duration(seconds: float, *, precise: bool = False) -> str:
    """``4 s``, ``3 min 20 s``, ``2 h 05 min``; ``precise``: tenths below 10 s."""
    if precise and seconds < 10:
        return f"{max(seconds, 0.0):.1f} s"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s // 60 % 60:02d} min"


def rate(per_second: float, unit: str) -> str:
    return f"{per_second:,.{0 if per_second >= 10 else 1}f} {unit}/s"


def percent(done: int, total: int) -> int:
    """Rounded down (100 only when done), 100 for an empty pass."""
    return 100 if total <= 0 else max(0, min(100, done * 100 // total))


def line(name: str, done: int, total: int, elapsed: float, *, unit: str = "pages",
         estimated: bool = False, final: bool = False) -> str:
    """One progress line (see the module docstring)."""
    total = max(total, done) if estimated else total
    of = f"~{total:,}" if estimated and not final else f"{total:,}"
    head = f"{name}: {percent(done, total)}% ({done:,}/{of} {unit})"
    speed = done / elapsed if elapsed > 0 else 0.0
    if final:
        return f"{head} in {duration(elapsed, precise=True)}, {rate(speed, unit)}"
    if speed <= 0:
        return f"{head}, time left unknown"
    left = duration((total - done) / speed)
    return f"{head}, {rate(speed, unit)}, {'~' if estimated else ''}{left} left"


class _Phase:
    __slots__ = ("owner", "name", "unit", "estimated", "started", "last", "done", "total",
                 "bar", "finished")

    def __init__(self, owner: Progress, name: str, unit: str, estimated: bool) -> None:
        self.owner, self.name, self.unit, self.estimated = owner, name, unit, estimated
        self.started = self.last = 0.0
        self.done = self.total = 0
        self.bar: Any = None
        self.finished = False

    def __call__(self, done: int, total: int) -> None:
        self.owner.update(self, done, total)


class Progress:
    """The progress of one command on ``stream`` (stderr): a bar on a terminal, log
    lines elsewhere, nothing when ``quiet``. A context manager: leaving it ends the
    running phase (its last line; after an exception, no last line, the bar is left
    where it stopped)."""

    def __init__(self, *, quiet: bool = False, interval: float = DEFAULT_INTERVAL,
                 stream: TextIO | None = None, terminal: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if terminal is None:
            terminal = self.stream.isatty()
        self.mode = "off" if quiet else "bar" if terminal else "log"
        self.interval, self.clock = interval, clock
        self._current: _Phase | None = None
        self._mark = clock()  # a phase starts when the one before it ended
        self._stack = ExitStack()

    def phase(self, name: str, unit: str = "pages", *, estimated: bool = False) -> Callback:
        """A callback ``(done, total)`` for one pass; its first call ends the phase
        before it, a call with ``done >= total`` ends it (later calls are ignored)."""
        return _Phase(self, name, unit, estimated)

    def __enter__(self) -> Progress:
        self._mark = self.clock()
        if self.mode == "bar":
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._stack.enter_context(logging_redirect_tqdm())
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.end(final=kind is None)
        finally:
            self._stack.close()

    def update(self, phase: _Phase, done: int, total: int) -> None:
        if self.mode == "off" or phase.finished:
            return
        if phase is not self._current:
            self.end()
            self._start(phase, total)
        phase.done, phase.total = done, total
        if self.mode == "bar":
            bar = phase.bar
            if total != bar.total:
                bar.total = max(total, done) if phase.estimated else total
            bar.update(done - bar.n)
        elif done < total:
            now = self.clock()
            if now - phase.last >= self.interval:
                phase.last = now
                log.info("%s", line(phase.name, done, total, now - phase.started,
                                    unit=phase.unit, estimated=phase.estimated))
        if done >= total:  # the pass is complete: its last line now, before what follows
            self.end()

    def _start(self, phase: _Phase, total: int) -> None:
        self._current = phase
        phase.started = phase.last = self._mark
        if self.mode == "bar":
            from tqdm import tqdm

            phase.bar = tqdm(total=total, desc=phase.name, unit=phase.unit, file=self.stream,
                             mininterval=BAR_REDRAW, dynamic_ncols=True, leave=True)

    def end(self, *, final: bool = True) -> None:
        """End the running phase: close its bar, or log its last line (``final``)."""
        phase, self._current = self._current, None
        if phase is None:
            return
        phase.finished = True
        self._mark = self.clock()
        if phase.bar is not None:
            phase.bar.close()
            phase.bar = None
        elif final:
            log.info("%s", line(phase.name, phase.done, phase.total,
                                self._mark - phase.started, unit=phase.unit,
                                estimated=phase.estimated, final=True))


class Convergence:
    """PageRank's ``progress(iteration, delta)`` as a phase of estimated length.

    The L1 change falls about geometrically, by a ratio ``r`` an iteration, so
    the iterations left to get below ``tol`` are the first ``k`` with
    ``delta * r**k < tol``, with ``r`` measured over the iterations so far (the
    geometric mean); never more than ``max_iter``.
    The phase reaches its total at convergence or at ``max_iter``."""

    def __init__(self, phase: Callback, *, tol: float, max_iter: int) -> None:
        self.phase, self.tol, self.max_iter = phase, tol, max_iter
        self.first = 0.0

    def __call__(self, iteration: int, delta: float) -> None:
        if iteration == 1:
            self.first = delta
        total = self.max_iter
        if delta < self.tol:
            total = iteration
        elif iteration >= 2 and 0 < delta < self.first:
            ratio = (delta / self.first) ** (1.0 / (iteration - 1))
            if ratio < 1:  # k more iterations get below tol when delta * ratio**k < tol
                left = math.floor(math.log(self.tol / delta) / math.log(ratio)) + 1
                total = min(self.max_iter, iteration + max(left, 1))
        self.phase(iteration, total)


__all__ = ["DEFAULT_INTERVAL", "Callback", "Convergence", "Progress", "duration", "line",
           "percent", "rate"]
