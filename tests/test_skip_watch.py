"""tests/conftest.py: a skip fails a CI run unless allowed, and a fallback shows in the report."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text(encoding="utf-8")

TESTS = """
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("no widget on this machine")

@pytest.mark.ci_may_skip("widgets are optional")
def test_may_skip():
    pytest.skip("no widget here either")

@pytest.mark.xfail(reason="known")
def test_xfails():
    assert False

def test_falls_back(fallback):
    fallback("no widget: a gadget instead")
"""


@pytest.fixture(autouse=True)
def _bare(monkeypatch: pytest.MonkeyPatch) -> None:
    # The inner runs need no third-party plugin; loading them all costs seconds a run.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=TESTS)
    return pytester


def test_a_skip_names_itself_and_passes_outside_ci(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest("-ra")
    result.assert_outcomes(passed=2, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["SKIPPED *no widget on this machine"])
    result.stdout.no_fnmatch_line("CI: *")


def test_in_ci_an_unexpected_skip_fails_the_run(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "1")
    result = suite.runpytest("-ra")
    result.assert_outcomes(passed=2, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # Only the skip without the marker counts; the xfail is no skip.
    result.stdout.fnmatch_lines(["CI: 1 skipped without @pytest.mark.ci_may_skip*test_skips"])
    result.stdout.no_fnmatch_line("CI: *test_may_skip*")


def test_in_ci_allowed_skips_pass(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    result = suite.runpytest("-k", "not test_skips")
    result.assert_outcomes(passed=2, skipped=1, xfailed=1)
    assert result.ret == pytest.ExitCode.OK


def test_in_ci_a_module_skipped_whole_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_gone='import pytest\npytest.importorskip("no_such_module_here")\n'
        "def test_never():\n    pass\n",
        test_here="def test_here():\n    pass\n",
    )
    monkeypatch.setenv("CI", "1")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["CI: 1 skipped *test_gone.py"])


def test_a_fallback_is_a_line_in_the_report_and_a_junit_property(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest("--junitxml=report.xml")
    result.stdout.fnmatch_lines(["FALLBACK *test_falls_back: no widget: a gadget instead"])
    assert len([line for line in result.outlines if line.startswith("FALLBACK")]) == 1
    xml = (suite.path / "report.xml").read_text(encoding="utf-8")
    assert '<property name="fallback" value="no widget: a gadget instead"' in xml


PACKAGE_TESTS = """
import pytest

from tools import system_packages

@pytest.mark.system_packages("widget-tools")
def test_needs_widgets():
    pass

@pytest.mark.ci_may_skip("this kernel may refuse widgets")
@pytest.mark.system_packages("widget-tools")
def test_may_skip_but_needs_widgets():
    pass

def test_finds_it_missing_inside():
    why = system_packages.missing("widget-tools")
    if why is not None:
        pytest.skip(why)

@pytest.mark.system_packages("gadget-tools")
def test_needs_gadgets():
    pass
"""


@pytest.fixture
def packages(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A list of two packages: widget-tools missing, gadget-tools there (this interpreter)."""
    from tools import system_packages

    listed = {"widget-tools": system_packages.Package("widget-tools", "no-such-widget", ""),
              "gadget-tools": system_packages.Package("gadget-tools", sys.executable, "")}
    monkeypatch.setattr(system_packages, "packages", lambda: listed)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_packages=PACKAGE_TESTS)
    return pytester


def test_a_missing_system_package_skips_naming_it_and_its_installer(
    packages: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = packages.runpytest("-ra")
    result.assert_outcomes(passed=1, skipped=3)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["SKIPPED *system package missing: widget-tools (no "
                                 "`no-such-widget` on PATH): tools/install-system-packages *"])


def test_in_ci_a_missing_system_package_fails_the_run_even_where_a_skip_may(
    packages: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "1")
    result = packages.runpytest("-ra")
    result.assert_outcomes(passed=1, skipped=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["CI: 3 skipped without @pytest.mark.ci_may_skip*"
                                 "test_may_skip_but_needs_widgets*"])


def test_a_package_not_in_the_list_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_typo='import pytest\n\n@pytest.mark.system_packages("ngnix")\n'
                        "def test_typo():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_typo: ngnix: not in system-packages.txt*"])


# The suite runs on pytest-xdist workers (setup.cfg's addopts): the controller sees every
# worker's reports, so the watch holds there too; a file's tests share one worker, and the
# files with a slow test are handed out first.
XDIST_TESTS = {
    "test_one": """
import os

def test_a():
    assert os.environ["PYTEST_XDIST_WORKER"]

def test_b():
    pass
""",
    "test_two": """
import pytest

def test_c():
    pass

def test_skips():
    pytest.skip("no widget on this worker")

def test_falls_back(fallback):
    fallback("a gadget on a worker")
""",
    "test_three": """
import pytest

def test_d():
    pass

@pytest.mark.slow
def test_long():
    pass
""",
}


def suite_xdist_options() -> list[str]:
    """The pytest-xdist options of setup.cfg's addopts (what the suite runs with)."""
    import configparser
    import shlex

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).parents[1] / "setup.cfg")
    opts = shlex.split(cfg["tool:pytest"]["addopts"])
    kept = [o for i, o in enumerate(opts) if o in ("-n", "--dist") or opts[i - 1] in
            ("-n", "--dist") or o == "--no-loadscope-reorder"]
    assert "-n" in kept and "--dist" in kept, opts
    return kept


def worker_lines(result: pytest.RunResult) -> list[tuple[str, str]]:
    """(worker, test file) of each "[gw0] [ 20%] PASSED test_one.py::test_a" line."""
    return [(line.split("]")[0], line.split()[-1].split("::")[0])
            for line in result.outlines if line.startswith("[gw") and "::" in line]


def test_on_xdist_workers_a_skip_still_fails_ci_and_a_file_stays_on_one_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**XDIST_TESTS)
    pytester.makeini("[pytest]\nmarkers =\n    slow: long\n")
    monkeypatch.setenv("CI", "1")
    # tools/ and tests/memtmp.py, for conftest
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(map(str, Path(__file__).parents[:2])))
    options = ["-p", "xdist", *suite_xdist_options(), "-v", "-ra"]
    result = pytester.runpytest_subprocess(*options, "-n", "2")
    result.assert_outcomes(passed=6, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["CI: 1 skipped without @pytest.mark.ci_may_skip*test_skips*"])
    result.stdout.fnmatch_lines(["FALLBACK *test_falls_back: a gadget on a worker"])
    workers: dict[str, set[str]] = {}
    for worker, file in worker_lines(result):
        workers.setdefault(file, set()).add(worker)
    assert set(workers) == {"test_one.py", "test_two.py", "test_three.py"}
    assert all(len(w) == 1 for w in workers.values()), workers
    # one worker: the file with a slow test runs first, the others in the order collected
    result = pytester.runpytest_subprocess(*options, "-n", "1")
    order = list(dict.fromkeys(file for _, file in worker_lines(result)))
    assert order == ["test_three.py", "test_one.py", "test_two.py"], order
