"""Output files that are whole or absent: how the export's sinks create, finish and give up
their files (crawler.read.export).

A file is written as ``NAME.part`` and renamed ``NAME`` when complete, so a
file under its final name is whole. Given up (an error, Ctrl-C), the
``.part`` is removed, and so are the files already finished by the same
export (:func:`discard`, each removal logged). An OSError from a write carries
no file name (a full disk): :func:`naming` gives it the output's, so the
user is told which output failed.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

log = logging.getLogger(__name__)


def create(name: str, mode: str) -> IO[Any]:
    """Open ``name.part`` for writing; a ``name`` that is a directory is refused here,
    before any work (the rename at the end would fail)."""
    if os.path.isdir(name):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
    if "b" in mode:
        return open(name + ".part", mode)  # noqa: SIM115 - the sink closes it
    return open(name + ".part", mode, encoding="utf-8", newline="\n")  # noqa: SIM115


@contextmanager
def naming(name: str) -> Iterator[None]:
    """A write's OSError carries no file name (a full disk): give it the output's, so
    the user is told which output failed."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, name) from exc


def publish(out: IO[Any], name: str) -> None:
    """Close ``name.part`` and rename it ``name``; on failure no ``.part`` is left."""
    try:
        with naming(name):
            out.close()
            os.replace(name + ".part", name)
    except BaseException:
        drop(out, name)
        raise


def drop(out: IO[Any] | None, name: str) -> None:
    """Close and remove ``name.part``, which is being given up: what the close would
    still write (and its error: a full disk) no longer matters."""
    if out is not None:
        try:
            out.close()
        except OSError:
            pass
    remove(name + ".part")


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def discard(files: list[str]) -> None:
    """Remove the files an export completed before it failed (see the module docstring)."""
    for name in files:
        remove(name)
        log.warning("export: removed %s: the export did not complete", name)
    files.clear()
