"""tools/suite_cpu.py: each test file run alone, its rows and the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PASSING = "def test_sums():\n    assert sum(range(10**6)) == 499999500000\n"
FAILING = "def test_fails():\n    assert 1 + 1 == 3\n"


def test_each_file_is_a_row_and_a_failing_file_fails_the_run(tmp_path: Path) -> None:
    good, bad = tmp_path / "test_good.py", tmp_path / "test_bad.py"
    good.write_text(PASSING)
    bad.write_text(FAILING)
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "tools/suite_cpu.py", "--json", str(out),
                           str(good), str(bad)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {Path(r["file"]).name: r for r in json.loads(out.read_text())}
    assert set(rows) == {"test_good.py", "test_bad.py"}
    assert rows["test_good.py"]["exit"] == 0 and "1 passed" in rows["test_good.py"]["summary"]
    assert rows["test_bad.py"]["exit"] == 1 and "1 failed" in rows["test_bad.py"]["summary"]
    for row in rows.values():  # the machine's numbers: only their kind (it may be busy)
        assert isinstance(row["cpu_s"], float) and float(row["wall_s"]) > 0
    assert "all 2 files" in done.stdout


def test_a_passing_file_exits_0(tmp_path: Path) -> None:
    good = tmp_path / "test_good.py"
    good.write_text(PASSING)
    done = subprocess.run([sys.executable, "tools/suite_cpu.py", str(good)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_good.py" in done.stdout and "(1 passed" in done.stdout
