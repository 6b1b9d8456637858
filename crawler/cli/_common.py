"""What the command groups share: logging to stderr, a closed stdout, sizes with suffixes."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..exceptions import CrawlerError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds of an age: ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (a bare number: seconds)."""
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in _UNITS else "s"
    number = value[:-1] if value[-1:] in _UNITS else value
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        raise CrawlerError(f"bad age {text!r}: use a number and s, m, h, d or w (7d)") from None
    if not seconds >= 0:  # also refuses nan
        raise CrawlerError(f"bad age {text!r}: it cannot be negative")
    return seconds


def age(value: str) -> float:
    """argparse's type for an age: 90s, 30m, 12h, 7d, 2w (recrawl, --revisit-after)."""
    try:
        return parse_age(value)
    except CrawlerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def size(value: str) -> int:
    """BYTES, with an optional K, M or G suffix (powers of 1024)."""
    text = value.strip().upper()
    shift = 10 * ("KMG".index(text[-1]) + 1) if text and text[-1] in "KMG" else 0
    try:
        n = int(text[:-1] if shift else text) << shift
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {value!r}: use BYTES, 500M, 1G...") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0, got {value!r}")
    return n


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


def stdout_gone() -> int:
    """stdout's reader went away (``| head``): not an error. Point stdout at /dev/null
    so the interpreter's final flush does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0
