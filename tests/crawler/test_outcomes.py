"""crawler/outcomes.py is the one vocabulary of outcomes, and docs/HOSTILE.md says the same.

The reasons are a contract between the parts that make them (fetcher, DNS cache,
robots.txt gate, page work), the record on disk and the parts that read them
(status, report, retry, hints, the docs). These tests hold the module against the
docs' class table and against what the fetcher and the resolver can actually give.
"""

from __future__ import annotations

import http.client
import re
import ssl
import zlib
from pathlib import Path

import pytest

from crawler import outcomes
from crawler.exceptions import FetchError
from crawler.net import dnscache
from crawler.net.fetch import _classify

HOSTILE = Path(__file__).resolve().parents[2] / "docs" / "HOSTILE.md"
# Named reasons of crawler.outcomes (its upper-case string constants).
NAMES = {v for k, v in vars(outcomes).items() if k.isupper() and isinstance(v, str)}
RECORDED = NAMES - {outcomes.ABORTED, outcomes.BAD_HOST, outcomes.RETRY}
RECORDED -= outcomes.RENDER_REASONS | {outcomes.RENDER_OK}


def docs_classes() -> dict[str, set[str]]:
    """The class table of docs/HOSTILE.md: class -> the reasons it lists."""
    text = HOSTILE.read_text(encoding="utf-8")
    table = text[text.index("| class | keys |"):]
    out: dict[str, set[str]] = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        classes, keys = line.split("|")[1:3]
        for cls in re.findall(r"`([a-z_0-9]+)`", classes):
            out[cls] = set(re.findall(r"`([a-z_]+)`", keys))
    return out


def test_the_docs_list_every_class_and_the_module_the_same_reasons_in_each() -> None:
    table = docs_classes()
    assert list(table) == list(outcomes.CLASSES)
    for cls, reasons in table.items():
        named = {r for r, c in outcomes.CLASS_OF.items() if c == cls}
        assert reasons == named, cls


@pytest.mark.parametrize("reason", sorted(RECORDED))
def test_every_recorded_reason_has_a_class_and_a_hint(reason: str) -> None:
    assert outcomes.outcome_class(reason) != "other" or reason in (
        outcomes.INTERNAL_ERROR, outcomes.BAD_URL)
    assert reason in outcomes.HINTS, f"{reason}: no words for the summary and `retry`"


def test_the_behaviour_sets_are_made_of_named_reasons() -> None:
    assert outcomes.HOST_FAILURES <= RECORDED and outcomes.TRANSIENT <= RECORDED
    assert not outcomes.HOST_FAILURES & outcomes.TRANSIENT
    assert set(outcomes.DNS_REASONS.values()) <= RECORDED


def test_every_kind_of_dns_failure_is_recorded_under_a_named_reason() -> None:
    assert set(dnscache.KINDS) == set(outcomes.DNS_REASONS)
    for kind in dnscache.KINDS:
        assert outcomes.dns_reason(kind) in RECORDED


@pytest.mark.parametrize("phase", ["connect", "tls", "response", "body"])
@pytest.mark.parametrize("exc", [
    ConnectionRefusedError(), TimeoutError(), ConnectionResetError(), BrokenPipeError(),
    ssl.SSLError(), zlib.error(), ValueError(), http.client.BadStatusLine("x"), OSError(),
])
def test_the_fetcher_names_only_reasons_of_the_vocabulary(phase: str, exc: Exception) -> None:
    assert _classify(exc, phase) in outcomes.HOST_FAILURES | outcomes.TRANSIENT


def test_the_fetch_error_says_which_reasons_it_carries() -> None:
    doc = FetchError.__doc__ or ""
    said = set(re.findall(r"\b([a-z]+_[a-z_]+|tls|reset|protocol|aborted)\b", doc))
    assert said == outcomes.HOST_FAILURES | outcomes.TRANSIENT | {outcomes.ABORTED}


def test_keys_and_classes() -> None:
    assert outcomes.outcome_key(200, "", "") == "200"
    assert outcomes.outcome_key(200, "", outcomes.TOO_LARGE) == outcomes.TOO_LARGE
    assert outcomes.outcome_class(outcomes.bad_host(outcomes.TLS)) == "bad_host"
    assert outcomes.outcome_class(outcomes.RETRY + outcomes.RESET) == "retry"
    assert outcomes.outcome_class("503") == "http_5xx"
    assert outcomes.by_class({"200": 2, "404": 1, "dns_nxdomain": 3}) == {
        "ok": 2, "http_4xx": 1, "dns": 3}
