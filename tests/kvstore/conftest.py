"""Fixtures shared by the kvstore tests: a store's lifecycle, its data files, child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import kvstore

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Where a test's store lives (not created yet: open() creates it)."""
    return tmp_path / "store"


@pytest.fixture
def store(store_path: Path) -> Iterator[kvstore.Store]:
    """An open, empty, writable store, closed after the test."""
    db = kvstore.open(store_path)
    try:
        yield db
    finally:
        db.close()


def _data_files(path: Path) -> tuple[Path, Path]:
    keys = sorted(path.glob("data-*.key"))
    vals = sorted(path.glob("data-*.val"))
    assert len(keys) == 1 and len(vals) == 1, f"expected one generation in {path}: {keys} {vals}"
    return keys[0], vals[0]


@pytest.fixture
def data_files() -> Callable[[Path], tuple[Path, Path]]:
    """``data_files(store_dir) -> (key_file, val_file)``; asserts there is exactly one of each."""
    return _data_files


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for a child Python that must import this checkout's kvstore."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def python() -> str:
    """The interpreter running the tests, for child processes."""
    return sys.executable


# As root the kernel ignores file modes unless the process gives up CAP_DAC_OVERRIDE
# and CAP_DAC_READ_SEARCH; this prelude drops them (staying uid 0, so the child can
# still reach pytest's 0700 temp directories).
DROP_DAC_PRELUDE = r"""
import ctypes, os
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    class Hdr(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    hdr = Hdr(0x20080522, 0)
    data = (Data * 2)()
    if libc.capget(ctypes.byref(hdr), data) == 0:
        mask = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        for field in ("effective", "permitted", "inheritable"):
            setattr(data[0], field, getattr(data[0], field) & mask)
        libc.capset(ctypes.byref(hdr), data)
"""


@pytest.fixture
def unprivileged_child(
    python: str, child_env: dict[str, str]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``unprivileged_child(code, *args)`` runs ``code`` in a child Python for which
    file modes hold (as root, it drops the capabilities that bypass them)."""

    def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-c", DROP_DAC_PRELUDE + code, *args],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run
