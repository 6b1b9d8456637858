"""What the command groups share: the types of their numbers (each with its range,
docs/BOUNDS.md), logging to stderr, a closed stdout, the parser's one-line errors."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

from ..config import MAX_AGE
from ..exceptions import CrawlerError
from ..read.display import printable

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_BOUNDS = "docs/BOUNDS.md says why"
# The JSON type a parsed value is saved as (settings.json): read back, it must be one.
SAVED_AS = "saved_as"


def _shown(n: float) -> str:
    return f"{n:,}" if float(n).is_integer() else f"{n:g}"


def _bytes(n: float) -> str:
    """A byte count as it would be typed: 32M rather than 33,554,432."""
    for suffix, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and int(n) % (1 << shift) == 0:
            return f"{int(n) >> shift:,}{suffix}"
    return _shown(n)


def _check_range(n: float, low: float, high: float, value: str, *, above: bool = False,
                 shown: Callable[[float], str] = _shown) -> None:
    if above and not n > low:
        raise argparse.ArgumentTypeError(f"{value!r}: must be more than {shown(low)}")
    if n < low:
        raise argparse.ArgumentTypeError(f"{value!r}: must be at least {shown(low)}")
    if n > high:
        raise argparse.ArgumentTypeError(
            f"{value[:50]!r}: must be at most {shown(high)} ({_BOUNDS})"
        )


def count(low: int, high: int) -> Callable[[str], int]:
    """argparse's type for a whole number from ``low`` to ``high``."""

    def parse(value: str) -> int:
        try:
            n = int(value.strip())
        except ValueError:  # also a number of more than 4,300 digits
            raise argparse.ArgumentTypeError(f"not a whole number: {value[:50]!r}") from None
        _check_range(n, low, high, value)
        return n

    parse.__name__ = "count"  # argparse names the type in some errors
    setattr(parse, SAVED_AS, (int,))
    return parse


def number(low: float, high: float, *, above: bool = False) -> Callable[[str], float]:
    """argparse's type for a finite number from ``low`` (more than it with ``above``)
    to ``high``: nan and inf are refused."""

    def parse(value: str) -> float:
        try:
            n = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value[:50]!r}") from None
        if not math.isfinite(n):
            raise argparse.ArgumentTypeError(f"{value!r}: give a finite number")
        _check_range(n, low, high, value, above=above)
        return n

    parse.__name__ = "number"
    setattr(parse, SAVED_AS, (int, float))
    return parse


def parse_age(text: str) -> float:
    """Seconds of an age: ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (a bare number:
    seconds), from 0 to ten years (MAX_AGE)."""
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in _UNITS else "s"
    digits = value[:-1] if value[-1:] in _UNITS else value
    try:
        seconds = float(digits) * _UNITS[unit]
    except ValueError:
        raise CrawlerError(f"bad age {text!r}: use a number and s, m, h, d or w (7d)") from None
    if not seconds >= 0:  # also refuses nan
        raise CrawlerError(f"bad age {text!r}: it cannot be negative")
    if seconds > MAX_AGE:  # also inf
        raise CrawlerError(f"bad age {text!r}: at most {MAX_AGE / 86400:,.0f}d ({_BOUNDS})")
    return seconds


def age(value: str) -> float:
    """argparse's type for an age: 90s, 30m, 12h, 7d, 2w (recrawl, --revisit-after)."""
    try:
        return parse_age(value)
    except CrawlerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


setattr(age, SAVED_AS, (int, float))


def size_in(low: int, high: int) -> Callable[[str], int]:
    """argparse's type for BYTES, with an optional K, M or G suffix (powers of 1024),
    from ``low`` to ``high``."""

    def parse(value: str) -> int:
        text = value.strip().upper()
        shift = 10 * ("KMG".index(text[-1]) + 1) if text and text[-1] in "KMG" else 0
        try:
            n = int(text[:-1] if shift else text) << shift
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad size {value[:50]!r}: use BYTES, 500M, 1G..."
            ) from None
        _check_range(n, low, high, value, shown=_bytes)
        return n

    parse.__name__ = "size"
    setattr(parse, SAVED_AS, (int,))
    return parse


# BYTES more than 0 (an option whose upper bound is the machine's, not ours).
size = size_in(1, 1 << 62)


class Parser(argparse.ArgumentParser):
    """Usage errors as one ``crawler: error:`` line, exit status 2 (argparse prints the
    whole usage, over many lines for start, then the error). No abbreviations: ``--dat``
    is an unknown option, not ``--data`` (a subcommand's parser is a Parser too)."""

    # said after an error about an argument that starts with "-" (``search DIR -word``
    # reads -word as an option): how to give it (after ``--``)
    dash_hint: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if self.dash_hint and ("arguments are required" in message
                               or "unrecognized arguments: -" in message):
            message = f"{message}; {self.dash_hint}"
        self.exit(2, f"crawler: error: {printable(message)} (usage: {self.prog} --help)\n")


class DefaultsFormatter(argparse.HelpFormatter):
    """--help shows each option's default, unless it has none worth saying (None, off,
    an empty list) or its help speaks of its default already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default in (None, False, argparse.SUPPRESS)
            or default == []
        ):
            return text
        return f"{text} (default: {default})"


def log_to_stderr(level: int) -> None:
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def quiet(stream: TextIO) -> None:
    """Point ``stream`` (stdout, stderr) at /dev/null: its reader went away (``| head``, a
    ``| tee`` that Ctrl-C stopped), so what is still written to it, and the interpreter's
    final flush, go nowhere instead of raising BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):  # no real descriptor (captured in tests)
        pass
    finally:
        os.close(devnull)


def flush_or_quiet(stream: TextIO) -> None:
    """Flush ``stream``; if its reader is gone, :func:`quiet` it (no error: a closed
    pipe ends a command quietly, docs/CRAWLING.md)."""
    try:
        stream.flush()
    except (OSError, ValueError):
        quiet(stream)


def say(text: str, stream: TextIO | None = None) -> bool:
    """Print one line on ``stream`` (stdout by default) at once; False, and the stream
    :func:`quiet` from then on, if it cannot be written (its reader went away). For what
    must not stop a clean stop: a signal handler's words, a crawl's summary."""
    stream = sys.stdout if stream is None else stream
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        quiet(stream)
        return False
    return True


def stdout_gone() -> int:
    """stdout's reader went away (``| head``): not an error. Point stdout at /dev/null
    so the interpreter's final flush does not complain."""
    quiet(sys.stdout)
    return 0


class _ExitAtOnce:
    """Whether a command asked ``python -m crawler`` to end without the interpreter's
    finalization (:func:`exit_at_once`)."""

    asked = False


def exit_at_once() -> None:
    """Ask ``python -m crawler`` to end with ``os._exit`` once the command has returned
    and its output is flushed. For a command that stops while a daemon thread is still
    inside C++ code it cannot interrupt (serve's report: matplotlib's charts): the
    interpreter's shutdown ends such a thread as it takes the GIL back, which aborts the
    process ("terminate called without an active exception", SIGABRT or SIGSEGV) instead
    of exiting with the command's status. Only for threads that write nothing."""
    _ExitAtOnce.asked = True


def exit_at_once_asked() -> bool:
    return _ExitAtOnce.asked
