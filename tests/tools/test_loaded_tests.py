"""tools/loaded_tests.py: pytest under busy loops, its exit status passed on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "tools/loaded_tests.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


def test_a_passing_selection_under_a_busy_loop_exits_0() -> None:
    done = run("--loops", "1", "--", "-q", "-p", "no:cacheprovider",
               "tests/crawler/test_outcomes.py", "-k", "dns")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
    assert "loaded_tests: pytest exit 0 with 1 busy loops" in done.stderr


def test_pytest_s_failure_is_the_exit_status() -> None:
    done = run("--loops", "1", "--", "-q", "-p", "no:cacheprovider", "-n", "0",
               "tests/no_such_file.py")
    assert done.returncode == 4  # pytest: usage error (no such file; in one process)
    assert "loaded_tests: pytest exit 4" in done.stderr
