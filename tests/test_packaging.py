"""Packaging promises: what a new machine installs, and what CI tests of it."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_REQ = re.compile(r"^([A-Za-z0-9_.-]+)\s*(.*)$")


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def _version(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _requirements(text: str) -> dict[str, str]:
    """name (lower case) -> version spec, for one setup.cfg requirement list."""
    out = {}
    for line in text.strip().splitlines():
        m = _REQ.match(line.strip())
        assert m, f"unparsed requirement {line!r}"
        out[m.group(1).lower()] = m.group(2).strip()
    return out


def test_every_dependency_floor_is_pinned_in_the_oldest_releases_ci_tests() -> None:
    cfg = _setup_cfg()
    reqs = _requirements(cfg["options"]["install_requires"])
    reqs.update(_requirements(cfg["options.extras_require"]["test"]))
    pins = {}
    for line in (REPO / ".ci" / "min-constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = _version(version.strip())
    floors = {}
    for name, spec in reqs.items():
        spec = spec.partition(";")[0].strip()  # an environment marker says where, not which
        m = re.fullmatch(r">=([0-9][0-9.]*)", spec)
        assert m, f"{name}: {spec!r} is not a plain lower bound (an upper bound needs a reason)"
        floors[name] = _version(m.group(1))
    assert pins == floors


def test_tools_is_not_an_installed_package() -> None:
    include = _setup_cfg()["options.packages.find"]["include"].split()
    assert not any(p == "tools" or p.startswith("tools.") for p in include)


def test_installed_distribution_outside_the_checkout(tmp_path: Path) -> None:
    """From a directory that is not the checkout, the installed kvcrawl gives kvstore and
    crawler, and no top-level ``tools`` of ours."""
    code = (
        "import importlib.util, kvstore, crawler\n"
        "spec = importlib.util.find_spec('tools')\n"
        f"assert spec is None or not (spec.origin or '').startswith({str(REPO)!r}), spec\n"
        "print(kvstore.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    if "No module named 'kvstore'" in done.stderr:
        pytest.fail("kvcrawl is not installed in this environment: run the README's install")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(REPO / "kvstore"))


@pytest.mark.parametrize("package", ["kvstore", "crawler"])
def test_the_built_package_ships_py_typed(tmp_path: Path, package: str) -> None:
    """PEP 561: code that embeds kvstore or crawler gets their type hints only if the
    installed package holds ``py.typed``. setuptools' build_py is the step a wheel (and an
    install from an sdist) takes a package's files from: its output is the package as a
    user's site-packages gets it."""
    out = tmp_path / "lib"
    done = subprocess.run(
        [sys.executable, "setup.py", "--quiet", "build_py", "--build-lib", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    if "No module named 'setuptools'" in done.stderr:
        pytest.fail("setuptools is not in this venv (Python 3.12+ venvs lack it): "
                    "pip install 'setuptools>=64'")
    assert done.returncode == 0, done.stderr
    assert (out / package / "__init__.py").is_file(), sorted(p.name for p in out.iterdir())
    marker = out / package / "py.typed"
    assert marker.is_file(), f"{package}/py.typed is not in the built package"
    assert (REPO / package / "py.typed").read_bytes() == marker.read_bytes()


def test_ci_lints_before_the_tests_with_the_configured_tools() -> None:
    """.ci/run installs the [lint] extra and runs ruff and mypy (strict, setup.cfg) in the
    venv of the newest releases before its test command, so a finding fails CI early."""
    ci = (REPO / ".ci" / "run").read_text()
    lint = _requirements(_setup_cfg()["options.extras_require"]["lint"])
    assert set(lint) == {"ruff", "mypy"}
    steps = [line.strip() for line in ci.splitlines()]
    install = steps.index("pip install --quiet -e '.[lint]'")
    assert install < steps.index("ruff check .") < steps.index("mypy") < steps.index(
        "python -m pytest -q")
    mypy = _setup_cfg()["mypy"]
    assert mypy["strict"] == "true" and mypy["packages"] == "kvstore, crawler, tools"


def test_readme_test_command_is_the_one_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    first = re.search(r"python -m pytest[^\n`]*", ci)
    assert first is not None
    assert f"\n{first.group(0)}\n" in readme
    assert "pip install -e '.[test]'" in readme and "pip install --quiet -e '.[test]'" in ci
