"""pytest fixtures for a running test web (HTTP + HTTPS + DNS on loopback).

Use from a conftest.py: ``from tools.testweb.pytest_plugin import testweb, make_testweb``
(or list ``"tools.testweb.pytest_plugin"`` in the root conftest's ``pytest_plugins``).

    def test_crawl(make_testweb):
        web = make_testweb(pages=80, hosts=3, faults=[fault("status_500")])
        ...                                   # stopped after the test

    def test_small(testweb):                  # a default small site, no faults
        ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from typing import Any

import pytest

from .faults import Fault
from .graph import SiteConfig
from .harness import TestWeb

_CONFIG_FIELDS = {f.name for f in fields(SiteConfig)}


@pytest.fixture
def make_testweb() -> Iterator[Callable[..., TestWeb]]:
    """A factory: ``make_testweb(pages=..., hosts=..., seed=..., faults=..., **TestWeb kwargs)``.

    SiteConfig fields go to the config, the rest to TestWeb. Every web it
    started is stopped when the test ends.
    """
    webs: list[TestWeb] = []

    def make(faults: Iterable[Fault] = (), **kwargs: Any) -> TestWeb:
        config = SiteConfig(**{k: v for k, v in kwargs.items() if k in _CONFIG_FIELDS})
        rest = {k: v for k, v in kwargs.items() if k not in _CONFIG_FIELDS}
        web = TestWeb(config, faults=faults, **rest)
        webs.append(web)
        return web.start()

    yield make
    for web in webs:
        web.stop()


@pytest.fixture
def testweb(make_testweb: Callable[..., TestWeb]) -> TestWeb:
    """A started small site (60 pages on 3 hosts, seed 0, no faults)."""
    return make_testweb(pages=60, hosts=3, seed=0)
