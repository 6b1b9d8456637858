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


# Strings outside crawler/outcomes.py that equal a reason but are not one: (file, string)
# and why. A new reason literal elsewhere fails the test below: name it from
# crawler.outcomes, or, if it is not a reason, add it here with why.
NOT_REASONS = {
    ("crawler/net/watchdog.py", "aborted"): "a __slots__ name",
    ("crawler/net/fetch.py", "connect_timeout"): "a setting's name",
    ("crawler/net/fetch.py", "read_timeout"): "a setting's name",
    ("crawler/net/fetch.py", "total_timeout"): "a setting's name",
    ("crawler/net/fetch.py", "tls"): "the phase of a connection that failed",
    ("crawler/cli/startopts.py", "connect_timeout"): "a setting's name",
    ("crawler/cli/startopts.py", "read_timeout"): "a setting's name",
    ("crawler/cli/startopts.py", "dns_timeout"): "a setting's name",
    ("crawler/cli/startopts.py", "total_timeout"): "a setting's name",
    ("crawler/cli/startopts.py", "render_timeout"): "a setting's name",
    ("crawler/cli/startopts.py", "render_memory"): "a setting's name",
    ("crawler/read/charts.py", "ok"): "a class of outcomes (CLASSES)",
    ("crawler/read/charts.py", "not_html"): "a class of outcomes (CLASSES)",
    ("crawler/read/sitemaps.py", "ok"): "a sitemap's fetch that did not fail",
    ("crawler/web/sitemaps.py", "too_large"): "why a sitemap was cut (its own words)",
    ("crawler/state/pages.py", "protocol"): "a page record's field (HTTP/1.1, h2)",
    ("crawler/run/responses.py", "protocol"): "a page record's field (HTTP/1.1, h2)",
    ("crawler/run/render.py", "render_failed"): "a status counter's name",
    ("crawler/cli/status.py", "render_failed"): "a status counter's name",
    ("crawler/read/metrics.py", "render_failed"): "a status counter's name",
    ("crawler/state/statusfile.py", "render_failed"): "a status counter's name",
    ("crawler/run/status.py", "render_failed"): "a status counter's name",
}


def _literals(path: Path) -> set[str]:
    """The string constants of a module, docstrings left out."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found.add(node.value)
        elif isinstance(node, ast.JoinedStr):  # f"bad_host:{r}": its leading text
            first = node.values[0] if node.values else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
    return found


def test_no_reason_is_spelled_outside_the_vocabulary() -> None:
    """Every reason is named from crawler.outcomes, never written out again (issue 46):
    a copy can drift from the vocabulary (or be misspelt) into a reason nothing else
    knows, where a misspelt constant is a NameError that ruff and mypy catch."""
    root = HOSTILE.parents[1]
    prefixes = (outcomes.BAD_HOST, outcomes.RETRY)
    words = {w for w in NAMES if w}
    spelled = set()
    for path in sorted((root / "crawler").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "crawler/outcomes.py":
            continue
        for text in _literals(path):
            if (text in words or text.startswith(prefixes)) and (rel, text) not in NOT_REASONS:
                spelled.add((rel, text))
    assert spelled == set()
    # and the exceptions are still there (else this list hides nothing and should shrink)
    assert all(text in _literals(root / rel) for rel, text in NOT_REASONS)
