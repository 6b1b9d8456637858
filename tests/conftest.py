"""Skips and fallbacks are never silent.

- A skip names its reason in the summary (``-ra`` in setup.cfg). When the ``CI``
  environment variable is set, a test that skipped fails the run, unless it is
  marked ``@pytest.mark.ci_may_skip("why CI may skip it")``. A module skipped
  whole (at collection) always counts.
- A test that ran a weaker variant of itself (a fallback) says so through the
  ``fallback`` fixture: ``fallback("no tmpfs here: a file size limit instead")``.
  Each fallback is a line at the end of the report (and a ``fallback`` property
  in JUnit XML).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

CI_MAY_SKIP = "ci_may_skip"

# A run started in the background of a non-interactive shell (``pytest &``, nohup) has
# SIGINT ignored, and every child inherits that: a crawl, an export or a server the tests
# stop with SIGINT (Ctrl-C) would then ignore it, and those tests fail or hang for a
# reason that is not the code's. A handler (unlike SIG_IGN) is reset by exec, so with
# Python's own handler here the children start as a terminal user's would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class _Watch:
    """Collects the run's unexpected skips and its fallbacks; reports them at the end."""

    def __init__(self) -> None:
        self.skipped: list[str] = []
        self.fallbacks: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            if CI_MAY_SKIP not in report.keywords:
                self.skipped.append(report.nodeid)
        if report.when == "teardown":  # its user_properties hold every phase's
            notes = [v for k, v in report.user_properties if k == "fallback"]
            self.fallbacks += [(report.nodeid, str(v)) for v in notes]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.skipped.append(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if os.environ.get("CI") and self.skipped and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for nodeid, reason in self.fallbacks:
            terminalreporter.write_line(f"FALLBACK {nodeid}: {reason}", yellow=True)
        if os.environ.get("CI") and self.skipped:
            terminalreporter.write_line(
                f"CI: {len(self.skipped)} skipped without @pytest.mark.{CI_MAY_SKIP}, "
                f"which fails the run: {', '.join(self.skipped)}",
                red=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{CI_MAY_SKIP}(reason): this test may skip in CI (the reason says why); "
        "any other skip fails the run when CI is set",
    )
    config.pluginmanager.register(_Watch(), "skip-and-fallback-watch")


@pytest.fixture
def fallback(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Call it with the reason when the test falls back on a weaker variant of itself."""

    def note(reason: str) -> None:
        request.node.user_properties.append(("fallback", reason))

    return note
