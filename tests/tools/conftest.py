"""Fixtures for the testweb tests (the crawler tests can import them the same way)."""

from tools.testweb.pytest_plugin import make_testweb, testweb  # noqa: F401 - fixtures
