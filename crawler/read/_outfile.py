"""Output files that are whole or absent: how the export's sinks create, finish and give up
their files (crawler.read.export).

A file is written as ``NAME.part`` and renamed ``NAME`` when complete, so a
file under its final name is whole. The ``.part`` is created exclusively and
never through a link (:func:`create`). Given up (an error, Ctrl-C), the
``.part`` is removed, and so are the files already finished by the same
export (:func:`discard`, each removal logged). An OSError from a write carries
no file name (a full disk): :func:`naming` gives it the output's, so the
user is told which output failed.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

log = logging.getLogger(__name__)

# A .part is created, never opened: exclusive, not through a link, not inherited.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create(name: str, mode: str) -> IO[Any]:
    """Open ``name.part`` for writing (``mode`` "w" or "wb"), a file made here and now:
    created exclusively and never through a link (O_EXCL, O_NOFOLLOW), so a ``.part``
    that someone planted (a symlink to a file of yours) is never written through. A
    plain file of that name, left by an export that was killed, is replaced (a hard
    link to it keeps its content); anything else there is refused (FileExistsError,
    the file left alone). A ``name`` that is a directory is refused here, before any
    work (the rename at the end would fail)."""
    if os.path.isdir(name):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
    part = name + ".part"
    try:
        fd = os.open(part, _CREATE, 0o666)
    except FileExistsError:
        if not stat.S_ISREG(os.lstat(part).st_mode):
            raise FileExistsError(
                errno.EEXIST, f"{part} exists and is not a plain file (a symbolic link?): it "
                "is never written through; remove it", part) from None
        os.unlink(part)  # removes the name only: another link to the file keeps it
        fd = os.open(part, _CREATE, 0o666)  # a link planted meanwhile fails here too
    if "b" in mode:
        return os.fdopen(fd, "wb")
    return os.fdopen(fd, "w", encoding="utf-8", newline="\n")


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
