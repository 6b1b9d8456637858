"""Output files that are whole or absent: how the export's sinks (crawler.read.export) and
the report create, finish and give up their files.

A file is written as ``NAME.part`` and renamed ``NAME`` when complete, so a
file under its final name is whole. The ``.part`` is created exclusively and
never through a link (:func:`create`). An :class:`Outputs` ledger holds every
file one command makes: it writes the name down *before* the file exists,
and knows each file by its inode, so a Ctrl-C that lands anywhere (between
the create and the caller keeping the handle, between the rename and the
caller noting it) still leaves a file that :meth:`Outputs.discard` finds and
removes; a file someone else put under the same name is never removed. An
OSError from a write carries no file name (a full disk): :func:`naming` gives
it the output's, so the user is told which output failed.
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


class Outputs:
    """The files one command writes, to finish one by one or to give up together.

    Each is known by name and inode from the moment it is asked for, before the
    ``.part`` exists (see the module docstring), so :meth:`discard` removes what
    was made even when the caller never learned of it. Sinks of one export share
    one ledger: giving the export up removes all their files.
    """

    def __init__(self) -> None:
        self._made: dict[str, tuple[int, int] | None] = {}  # name -> (dev, inode) of its file
        self.finished: list[str] = []  # renamed to their final name, in order

    def create(self, name: str, mode: str) -> IO[Any]:
        """:func:`create` ``name.part``, noted first."""
        new = name not in self._made
        self._made.setdefault(name, None)  # an interrupt from here on still finds the .part
        try:
            out = create(name, mode)
        except OSError:  # refused or failed: nothing was made here
            if new:
                del self._made[name]
            raise
        st = os.fstat(out.fileno())
        self._made[name] = (st.st_dev, st.st_ino)
        return out

    def publish(self, out: IO[Any], name: str) -> None:
        """Close ``name.part`` and rename it ``name``; on failure no ``.part`` is left."""
        try:
            with naming(name):
                out.close()
                os.replace(name + ".part", name)
        except BaseException:
            _close_quietly(out)
            self._remove(name + ".part", self._made.get(name))
            raise
        self.finished.append(name)

    def discard(self, out: IO[Any] | None = None) -> None:
        """Give up every file made here: close ``out`` (what it would still write no
        longer matters, nor its error: a full disk) and remove each ``.part`` and each
        finished file that is still the one made here. Idempotent."""
        if out is not None:
            _close_quietly(out)
        for name, ident in self._made.items():
            self._remove(name + ".part", ident)
            if ident is not None and self._remove(name, ident):
                log.warning("export: removed %s: the export did not complete", name)
        self._made.clear()
        self.finished.clear()

    @staticmethod
    def _remove(path: str, ident: tuple[int, int] | None) -> bool:
        """Remove ``path`` if it is the file ``ident`` (None: a ``.part`` made before its
        inode was known: ours by name, see :func:`create`)."""
        try:
            if ident is not None:
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) != ident:
                    return False
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True


def _close_quietly(out: IO[Any]) -> None:
    try:
        out.close()
    except OSError:
        pass
