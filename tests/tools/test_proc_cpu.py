"""tools/proc_cpu.py: a command's CPU by kind of process, the rows adding up to the
machine's busy time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools.proc_cpu import UNSEEN, kind, merge

REPO = Path(__file__).resolve().parents[2]

# A child that uses a second of CPU (its own, however busy the machine), then idles
# long enough to be read once more before it ends. Its first words are its own: its kind
# is no other test's child, running beside it on another worker.
BURN = ("proc_cpu_burner = 1; import time\n"
        "while time.process_time() < 1.0: pass\n"
        "time.sleep(1.5)\n")


def test_a_child_burning_a_second_is_its_own_row_and_its_exit_code_is_kept(
        tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    done = subprocess.run(
        [sys.executable, "tools/proc_cpu.py", "--interval", "0.2", "--json", str(out), "--",
         sys.executable, "-c", BURN + "raise SystemExit(3)"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    found = json.loads(out.read_text())
    kinds, total = found["kinds"], found["cpu_s"]
    assert found["exit"] == 3 and found["wall_s"] >= 2.5
    assert 0.9 <= kinds["python -c proc_cpu_burner ="] <= 1.5, kinds  # its second
    # the kinds add up to the machine's busy time meanwhile (what ran before, the kernel's
    # threads and this test's own process, counted from the start only), within the
    # kernel's two ways of counting
    assert abs(sum(kinds.values()) - total) <= 0.03 * total + 0.05, (total, kinds)
    assert UNSEEN in kinds
    printed = done.stdout.splitlines()
    assert printed[0].startswith(f"{total:9.1f} CPU-s") and any(
        line.endswith("  python -c proc_cpu_burner =") for line in printed)


def test_a_process_keeps_its_kind_once_its_command_line_is_gone() -> None:
    """An exited process not yet reaped has no command line: its CPU is still its kind's."""
    seen = {(7, 1): ("python -m crawler start", 0.5, True)}
    merge(seen, {(7, 1): ("python", 0.9, False), (8, 2): ("kdamond.0", 3.0, False)})
    assert seen == {(7, 1): ("python -m crawler start", 0.9, True),
                    (8, 2): ("kdamond.0", 3.0, False)}
    merge(seen, {(7, 1): ("python -m crawler shard", 1.0, True)})  # an exec: the new one
    assert seen[(7, 1)] == ("python -m crawler shard", 1.0, True)


def test_kinds_name_what_python_runs() -> None:
    assert kind("python", ["/usr/bin/python3", "-m", "crawler", "start", "x"]) == (
        "python -m crawler start")
    assert kind("python3.11", ["python3.11", "-u", "-c", "import sys;exec(eval(x))"]) == (
        "python -c import sys;exec(eval(x))")
    assert kind("python3", ["python3", "tools/bench_crawl.py", "--pages", "9"]) == (
        "python bench_crawl.py")
    assert kind("kdamond.0", []) == "kdamond.0"
    assert kind("raylet", ["/x/raylet", "--node"]) == "raylet"


def test_no_command_is_one_line() -> None:
    done = subprocess.run([sys.executable, "tools/proc_cpu.py", "--"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "no command" in done.stderr
    assert "Traceback" not in done.stderr
