"""tools/pytest_cpu.py: each test's CPU as a row, the heavy one first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TESTS = '''
import subprocess, sys, time

def test_idle():
    time.sleep(0.3)

def test_burns_a_second_in_a_child():
    subprocess.run([sys.executable, "-c",
                    "import time\\nwhile time.process_time() < 1.0: pass"], check=True)
'''


def test_the_test_that_burns_is_first_with_its_second(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text(TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "-p", "tools.pytest_cpu", "--rootdir", str(tmp_path), "-c", "/dev/null",
         str(tmp_path / "test_two.py")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = re.findall(r"^\s*([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\S+)$", done.stdout, re.M)
    names = [r[3].split("::")[-1] for r in rows]
    assert names == ["test_burns_a_second_in_a_child", "test_idle"], done.stdout
    burn, idle = (float(r[0]) for r in rows)
    assert burn >= 0.9 and float(rows[1][1]) >= 0.3  # the child's second; the idle's sleep
    assert int(rows[0][2]) >= 1  # the child it started
    assert burn > idle
