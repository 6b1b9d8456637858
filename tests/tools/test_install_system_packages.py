"""tools/install-system-packages, the README's first test command, where the packages are
missing: on a machine with no apt-get it names each missing package in one line; run by
a user who is not root, with no sudo, it says so and names them; either way it fails
(exit 1) and installs nothing. The packages it finds missing are the ones
tools/system-packages.txt probes with a program not on PATH (the list both read).
Where everything is installed, it says so and does nothing (CI installs them first)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import system_packages

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "install-system-packages"
TOOLS = ("bash", "dirname", "id", "cat")  # what the script runs besides its builtins


def path_probed() -> list[str]:
    """The packages system-packages.txt probes by a program on PATH, in its order."""
    return [p.name for p in system_packages.packages().values() if not p.probe.startswith("/")]


@pytest.fixture
def bare() -> Iterator[Path]:
    """A directory anyone may read, holding the script, its list, and a bin/ of only the
    programs the script runs: a PATH on which no package's program is found."""
    # (in /tmp, not TMPDIR: the user nobody must reach it, and CI's TMPDIR is mode 700)
    top = Path(tempfile.mkdtemp(prefix="bare-", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        top.chmod(0o755)
        for name in ("install-system-packages", "system-packages.txt"):
            shutil.copy2(REPO / "tools" / name, top / name)
        (top / "bin").mkdir()
        for tool in TOOLS:
            found = shutil.which(tool)
            assert found, tool
            (top / "bin" / tool).symlink_to(found)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run(bare: Path, *, as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
    command = ["env", "-i", f"PATH={bare / 'bin'}", "bash", str(bare / "install-system-packages")]
    if as_nobody:
        command = ["runuser", "-u", "nobody", "--", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_with_no_apt_get_it_names_each_missing_package_in_one_line(bare: Path) -> None:
    done = run(bare)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no apt-get here" in done.stderr
    assert done.stderr.rstrip().endswith(": " + " ".join(path_probed())), done.stderr


def test_without_root_or_sudo_it_says_so_and_installs_nothing(bare: Path) -> None:
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.skip("no apt-get on this machine: the case above is its case")
    (bare / "bin" / "apt-get").symlink_to(apt)
    done = run(bare, as_nobody=os.geteuid() == 0)  # (root: as nobody, through runuser)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "run it as root (no sudo here): it installs " + " ".join(path_probed()) in (
        done.stderr)


@pytest.mark.system_packages(*system_packages.packages())
def test_with_every_package_installed_it_does_nothing() -> None:
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("install-system-packages: all installed"), done.stdout
