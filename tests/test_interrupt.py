"""Ctrl-C while a command is still loading its modules: one line on stderr, exit 130.

A command takes SIGINT over once it runs; before that (numpy alone takes ~100 ms to
load) Python's default handler raises KeyboardInterrupt inside an import. The signal
is sent from an import hook at the moment a given module starts to load, so the test
does not depend on timing. ``python -m kvstore`` loads numpy with the package itself,
before any code of its ``__main__`` runs (runpy imports the package first): there
only the CLI's own modules are covered, and a Ctrl-C in numpy's load stays Python's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Runs ``python -m PACKAGE ARGS...`` as runpy does, with a Ctrl-C (a real SIGINT to
# itself) when the first import of MODULE begins.
CTRL_C_IN_IMPORT = """
import builtins, os, runpy, signal, sys

real_import = builtins.__import__

def hook(name, *args, **kwargs):
    if name == module and builtins.__import__ is hook:
        builtins.__import__ = real_import
        os.kill(os.getpid(), signal.SIGINT)
    return real_import(name, *args, **kwargs)

builtins.__import__ = hook
module, package, sys.argv = sys.argv[1], sys.argv[2], sys.argv[2:]
runpy.run_module(package, run_name="__main__", alter_sys=True)
raise SystemExit(f"{module} was never imported")
"""


@pytest.mark.parametrize(
    ("module", "package", "command", "line"),
    [
        ("numpy", "crawler", "status", "crawler: interrupted"),
        ("argparse", "kvstore", "stats", "kvstore: error: interrupted"),
    ],
)
def test_ctrl_c_while_modules_load_is_one_line(
    module: str, package: str, command: str, line: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_IMPORT, module, package, command, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert done.stderr.splitlines() == [line], done.stderr[-2000:]
    assert done.returncode == 130
