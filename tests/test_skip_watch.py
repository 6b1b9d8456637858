"""tests/conftest.py: a skip fails a CI run unless allowed, and a fallback shows in the report."""

from __future__ import annotations

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
