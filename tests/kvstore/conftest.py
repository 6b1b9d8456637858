"""Fixtures shared by the kvstore tests: a store's lifecycle, its data files, child processes."""

from __future__ import annotations

import os
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
