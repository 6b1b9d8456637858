"""Packaging promises: what a new machine installs, and what CI tests of it."""

from __future__ import annotations

import configparser
import os
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


def test_ci_lints_with_the_configured_tools_after_the_readmes_commands() -> None:
    """.ci/run installs the [lint] extra and runs ruff and mypy (strict, setup.cfg) with
    the newest releases, in the README's venv once its commands are done: pip is upgraded
    there (the [bench] extra needs it) only after the README's commands ran with the pip
    a venv ships (issue 43: nothing upgrades pip before the README's install), and before
    the oldest releases' run."""
    ci = (REPO / ".ci" / "run").read_text()
    lint = _requirements(_setup_cfg()["options.extras_require"]["lint"])
    assert set(lint) == {"ruff", "mypy"}
    steps = [line.strip() for line in ci.splitlines()]
    upgrade = steps.index("python -m pip install --quiet --upgrade pip")
    install = steps.index("pip install --quiet -e '.[test,lint,bench]'")
    readme = steps.index('run_readme "## Run the tests"')
    code = [step.split("#")[0] for step in steps[:readme]]
    assert not any("upgrade" in line and "pip" in line for line in code)
    assert readme < upgrade < install < steps.index("ruff check .") < steps.index("mypy")
    # the oldest releases run on the CI machine, after the fresh machine's legs
    assert steps.index('fresh_venv "$work/oldest"') < steps.index(
        "# -- on the fresh machine (--inside) " + "-" * 54)
    mypy = _setup_cfg()["mypy"]
    assert mypy["strict"] == "true" and mypy["packages"] == "kvstore, crawler, tools"


README_SECTIONS = {  # what a newcomer types, section by section, as .ci/run runs it
    "## Install and first crawl": ["pip install -e . && python -m crawler demo"],
    "## Run the tests": ["tools/install-system-packages",
                         "pip install -e '.[test]' && python -m pytest -q"],
}


def test_ci_runs_the_readmes_install_and_test_commands_as_printed() -> None:
    """.ci/run runs the README's install and test sections, read from the README as
    printed (tests/readme_blocks.py as a program), in a venv made by `python3 -m venv`
    whose pip is not upgraded first: a newcomer's (issue 43). The main install is the
    crawler alone, the tests' install beside the test command."""
    ci = (REPO / ".ci" / "run").read_text()
    assert re.findall(r'^\s*run_readme "([^"]+)"$', ci, re.M) == list(README_SECTIONS)
    for heading, commands in README_SECTIONS.items():
        printed = subprocess.run([sys.executable, str(REPO / "tests" / "readme_blocks.py"),
                                  heading], capture_output=True, text=True, check=True)
        assert printed.stdout.splitlines() == commands, heading
    start = ci.index("fresh_venv() {")
    venv = [line.split("#")[0] for line in ci[start:ci.index("\n}\n", start)].splitlines()]
    assert any("python3 -m venv" in line for line in venv), venv
    assert not any("pip" in line for line in venv), venv
    newest = ci[ci.index('fresh_venv "$work/newest"'):ci.index('run_readme "## Run the tests"')]
    assert "pip install" not in newest and "upgrade" not in newest


def test_the_bench_extra_is_out_of_the_tests_install() -> None:
    """The benchmarks' peers are [bench]'s only: two of them name lxml's html-clean extra
    two ways, which the pip a new venv ships cannot resolve (issue 43)."""
    extras = _setup_cfg()["options.extras_require"]
    test, bench = _requirements(extras["test"]), _requirements(extras["bench"])
    assert {"trafilatura", "readability-lxml"} <= set(bench)
    assert not set(test) & set(bench)


def test_ci_runs_the_readmes_commands_on_a_machine_with_only_the_readmes_prerequisites(
) -> None:
    """The README's sections run inside .ci/fresh-machine's debootstrapped Debian (issue
    49: a machine without the system packages), which holds what the README's
    prerequisites name and nothing more; the oldest releases run outside it."""
    ci = (REPO / ".ci" / "run").read_text()
    outer, _, inside = ci.partition("# -- on the fresh machine (--inside) ")
    assert ".ci/fresh-machine make \"$work/machine\"" in outer
    assert re.search(r'fresh-machine run "\$work/machine" .*\\\n\s+bash /root/kvcrawl/.ci/run '
                     r"--inside", outer), outer
    assert 'run_readme "## Install and first crawl"' in inside
    assert 'run_readme "' not in outer
    readme = (REPO / "README.md").read_text()
    named = re.search(r"On Debian or Ubuntu that is\s+`apt-get install ([^`]+)`", readme)
    assert named is not None, "the README names the prerequisites' Debian packages"
    machine = (REPO / ".ci" / "fresh-machine").read_text()
    packages = re.search(r"^PACKAGES=(\S+)$", machine, re.M)
    assert packages is not None
    assert set(packages.group(1).split(",")) == {"python3", *named.group(1).split()}


@pytest.mark.ci_may_skip("mounts a directory: needs root (CI runs as root)")
def test_removing_the_fresh_machine_unmounts_before_it_deletes(tmp_path: Path) -> None:
    """``.ci/fresh-machine remove`` deletes the machine's directory only once nothing is
    mounted under it: its /dev is the host's, bound in, and must survive."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    host_dev = tmp_path / "host-dev"
    (host_dev / "shm").mkdir(parents=True)
    (host_dev / "null").write_text("the host's")
    root = tmp_path / "machine"
    (root / "dev").mkdir(parents=True)
    subprocess.run(["mount", "--rbind", str(host_dev), str(root / "dev")], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root / "dev" / "shm")], check=True)
    try:
        done = subprocess.run([str(REPO / ".ci" / "fresh-machine"), "remove", str(root)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert not root.exists()
        assert (host_dev / "null").read_text() == "the host's"
    finally:
        mounted = Path("/proc/self/mountinfo").read_text()
        for point in (root / "dev" / "shm", root / "dev"):
            if f" {point} " in mounted:
                subprocess.run(["umount", "-l", str(point)], check=False)
