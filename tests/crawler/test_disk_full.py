"""A full disk: the crawl stops cleanly with a clear message, loses nothing, and resumes.

The data directory lives on a small tmpfs when this process may mount one
(root in a container usually may); space "comes back" by remounting it larger.
Otherwise the crawler runs under a file size limit (``ulimit -f``: writes past
it fail with EFBIG, which the crawler treats as a full disk) and space comes
back by running without the limit.
"""

from __future__ import annotations

import resource
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from crawl_helpers import cli_args, records, start_cli

import kvstore
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
SMALL = 600 << 10  # bytes: room for a few dozen pages of the test site


class SmallDisk:
    """A directory with little space, and a way to give it more."""

    def __init__(self, root: Path) -> None:
        self.path = root / "disk"
        self.path.mkdir()
        self.mounted = _mount(self.path, SMALL)
        self.limit: int | None = None if self.mounted else SMALL

    def grow(self) -> None:
        if self.mounted:
            _run("mount", "-o", "remount,size=256m", str(self.path))
        self.limit = None

    def preexec(self) -> Callable[[], None] | None:
        limit = self.limit
        if limit is None:
            return None

        def apply() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        return apply

    def close(self) -> None:
        if self.mounted:
            _run("umount", "-l", str(self.path))


def _run(*cmd: str) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


def _mount(path: Path, size: int) -> bool:
    return _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))


@pytest.fixture
def small_disk(tmp_path: Path, fallback: Callable[[str], None]) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path)
    if not disk.mounted:
        fallback("cannot mount a tmpfs here: a file size limit (RLIMIT_FSIZE) plays the full disk")
    try:
        yield disk
    finally:
        disk.close()


def test_full_disk_stops_cleanly_then_the_crawl_resumes_to_the_oracle(
    make_testweb: MakeWeb, small_disk: SmallDisk
) -> None:
    web = make_testweb(pages=400, hosts=3, seed=21, crawl_delay=0.0)
    want = web.oracle.crawl()
    data = small_disk.path / "crawl"
    proc = start_cli(cli_args(web, data), preexec_fn=small_disk.preexec())
    out, err = proc.communicate(timeout=240)
    message = err.decode()
    assert proc.returncode == 1, message[-3000:]
    assert "disk full" in message and "resume" in message, message[-3000:]
    assert "Traceback" not in message, message[-3000:]
    partial = records(data)  # opens cleanly: a consistent prefix of the crawl
    assert 0 < len(partial) < len(want.fetched)
    assert all(r.status > 0 or r.reason for r in partial.values())

    small_disk.grow()
    proc = start_cli(cli_args(web, data), preexec_fn=small_disk.preexec())
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err.decode()[-3000:]
    final = records(data)
    fetched = {url: r.status for url, r in final.items() if r.status > 0}
    assert fetched == dict(want.status)
    for url, r in partial.items():  # nothing recorded before the full disk was lost
        assert final[url].status == r.status
    with kvstore.open(data / "main", readonly=True) as main:
        assert main.verify() == []
