"""Fixtures for the crawler tests: a running test web on loopback."""

from tools.testweb.pytest_plugin import make_testweb, testweb  # noqa: F401 - fixtures
