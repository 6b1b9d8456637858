"""What each recorded outcome means to the user, and the flag or command that addresses it.

A crawl counts its outcomes by key (crawler.run.status.outcome_key: a record's
reason, else why its body was cut, else its HTTP status; ``retry:<why>`` for a
try that will be repeated). :func:`explain` turns those counts into one line
per *family*, most frequent first: a reason (``tls``, ``dns_nxdomain``...)
together with its ``bad_host:<reason>`` records (URLs of a host that reason
had marked bad, recorded without a request), or an HTTP class (``4xx``,
``5xx``). Answers (2xx, 3xx) and ``retry:`` tries are not explained. Each
line says what the outcome means and how to address it: a ``start`` option
and the ``python -m crawler retry`` command that re-queues those records
(crawler.state.retry), or that it is a limit or the site's wish, not a
failure. The words for each reason are in ``HINTS``; docs/RETRY.md shows them.

Pure: no I/O, safe from any thread.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

BAD_HOST = "bad_host:"


@dataclass(frozen=True, slots=True)
class Hint:
    """One family's words. ``fix``: what to do ("" if nothing); ``flag``: the ``start``
    option that addresses it, for a resume command ("" if none); ``failure``: False
    for a limit, the site's wish or an answer (not retried by a bare ``retry``);
    ``retry``: whether ``retry`` is worth suggesting at all."""

    meaning: str
    fix: str = ""
    flag: str = ""
    failure: bool = True
    retry: bool = True


# Every reason a record can carry (and the truncations, which stand for a reason in the
# counts), plus the HTTP error classes. crawler.cli.retry accepts prefixes of these.
HINTS: dict[str, Hint] = {
    "private_ip": Hint(
        "the host resolved to a private, loopback or link-local address, which is not "
        "fetched by default (a crawled page must not steer the crawler into your network)",
        "add --allow-private-ips if you mean to crawl it", "--allow-private-ips"),
    "tls": Hint(
        "the HTTPS certificate could not be verified (unknown CA, wrong name, expired) or "
        "the TLS handshake failed",
        "if you trust the site's CA, give it with --ca-bundle FILE (PEM)", "--ca-bundle FILE"),
    "dns_nxdomain": Hint(
        "the host name does not exist in DNS",
        "check the URL, or ask another resolver with --nameserver IP[:PORT]",
        "--nameserver IP[:PORT]"),
    "dns_nodata": Hint(
        "the host name has no IPv4 address (IPv6-only hosts are not crawled)",
        "check the name, or ask another resolver with --nameserver IP[:PORT]",
        "--nameserver IP[:PORT]"),
    "dns_servfail": Hint(
        "the DNS server could not answer for the host",
        "try again later, or ask another resolver with --nameserver IP[:PORT]",
        "--nameserver IP[:PORT]"),
    "dns_timeout": Hint(
        "no DNS answer came within --dns-timeout",
        "raise --dns-timeout S, or ask another resolver with --nameserver IP[:PORT]",
        "--dns-timeout S"),
    "dns_error": Hint(
        "the lookup failed (a bad name, a broken answer, an unreachable resolver)",
        "check the URL and the resolver (--nameserver IP[:PORT])", "--nameserver IP[:PORT]"),
    "connect_refused": Hint(
        "nothing accepted the connection on the host's port (the site is down, or the "
        "port is wrong)",
        "try again later"),
    "connect_timeout": Hint(
        "no connection (TCP, then TLS) within --connect-timeout",
        "raise --connect-timeout S, or try again later", "--connect-timeout S"),
    "connect_error": Hint(
        "the connection failed (no route to the host, the network is down)",
        "check the network, then try again"),
    "read_timeout": Hint(
        "the server went silent longer than --read-timeout in its answer, on every try",
        "raise --read-timeout S", "--read-timeout S"),
    "total_timeout": Hint(
        "the fetch took longer than --timeout (connect to last byte), on every try",
        "raise --timeout S", "--timeout S"),
    "reset": Hint(
        "the server closed or reset the connection before its answer was complete, on "
        "every try",
        "try again later"),
    "protocol": Hint(
        "the answer was not valid HTTP (status line, headers, chunking or gzip), on "
        "every try",
        "try again later (the server is at fault)"),
    "robots_unavailable": Hint(
        "robots.txt answered 5xx or 429, or nothing, so the host counted as disallowed "
        "for now (RFC 9309)",
        "try again later"),
    "robots_disallowed": Hint(
        "robots.txt forbids the URL: the site's wish, not a failure",
        "--ignore-robots fetches it anyway: only on sites you own or may crawl so, as "
        "ignoring robots.txt is impolite", "--ignore-robots", failure=False),
    "host_page_limit": Hint(
        "a limit, not a failure: the host had reached --max-pages-per-host in that run",
        "raise --max-pages-per-host N (it counts per run)", "--max-pages-per-host N",
        failure=False),
    "redirect_limit": Hint(
        "a limit, not a failure: more than --max-redirects redirects in a row (the last "
        "one is recorded)",
        "raise --max-redirects N", "--max-redirects N", failure=False),
    "too_large": Hint(
        "a limit, not a failure: the body was cut at --max-body-bytes (its first part "
        "is stored)",
        "raise --max-body-bytes SIZE", "--max-body-bytes SIZE", failure=False),
    "decompression_bomb": Hint(
        "a limit, not a failure: the decoded body was cut at --max-decoded-bytes (its "
        "first part is stored)",
        "raise --max-decoded-bytes SIZE", "--max-decoded-bytes SIZE", failure=False),
    "not_html": Hint(
        "not a failure: pages that are not HTML are recorded with their content type, "
        "their bodies neither stored nor parsed", failure=False, retry=False),
    "bad_url": Hint(
        "a URL that could not be split into host and path for a request", retry=False),
    "internal_error": Hint(
        "a crawler bug (the log has its traceback)",
        "please report it; retry once a fixed version is installed"),
    "4xx": Hint(
        "the server answered with a client error (404 not found, 403 forbidden, 410 "
        "gone...)",
        "usually final (a broken link); retry once the site is fixed"),
    "5xx": Hint(
        "the server answered with an error on every try",
        "try again later, or allow more tries with --max-retries N", "--max-retries N"),
}
# Reasons a record can carry (HTTP classes aside): what --reason prefixes must match.
REASONS: tuple[str, ...] = tuple(k for k in HINTS if not k[0].isdigit())
_UNKNOWN = Hint("an outcome this version of the crawler does not describe",
                "see the log and `python -m crawler pages DIR --status 0`", retry=False)


def family(key: str) -> str | None:
    """The family an outcome key is explained under (see the module docstring); None
    for answers (2xx, 3xx) and for tries (``retry:``)."""
    if key.startswith("retry:"):
        return None
    if key.startswith(BAD_HOST):
        key = key[len(BAD_HOST):]
    if key.isdigit():
        status = int(key)
        if 200 <= status < 400:
            return None
        return f"{status // 100}xx" if 400 <= status < 600 else "other"
    return key if key in HINTS else "other"


def hint(name: str) -> Hint:
    """The words of a family (as :func:`family` names it)."""
    return HINTS.get(name, _UNKNOWN)


def retry_command(name: str, data_dir: str) -> str:
    """The ``retry`` command that re-queues a family's records."""
    select = f"--status {name}" if name[0].isdigit() else f"--reason {name}"
    return f"python -m crawler retry {shlex.quote(data_dir)} {select}"


def _by_family(outcomes: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Counts by family, most frequent first (then by name), and how many of each
    were ``bad_host:`` records (recorded without a request)."""
    totals: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for key, n in outcomes.items():
        name = family(key)
        if name is None or n <= 0:
            continue
        totals[name] = totals.get(name, 0) + n
        if key.startswith(BAD_HOST):
            skipped[name] = skipped.get(name, 0) + n
    ordered = dict(sorted(totals.items(), key=lambda item: (-item[1], item[0])))
    return ordered, skipped


def explain(outcomes: Mapping[str, int], data_dir: str, *, retry: bool = True) -> list[str]:
    """One line per family of the outcome counts of a crawl summary, most frequent
    first: what it means and what addresses it (with ``retry``, the ``retry`` command
    that re-queues it once fixed). Families with no count and answers are left out."""
    totals, skipped = _by_family(outcomes)
    lines = []
    for name, n in totals.items():
        h = hint(name)
        count = f"{n} URL{'s' if n != 1 else ''}"
        if skipped.get(name):
            count += f", {skipped[name]} of them not requested as their host was marked bad"
        line = f"{name} ({count}): {h.meaning}"
        fix = h.fix
        if retry and h.retry:
            command = f"`{retry_command(name, data_dir)}`"
            fix = f"{fix}, then {command}" if fix else f"re-queue them with {command}"
        if fix:
            line += f"; {fix}"
        lines.append(line)
    return lines


def resume_flags(outcomes: Mapping[str, int]) -> list[str]:
    """The ``start`` options that address these outcomes, in order of count, each
    once (placeholders such as FILE or S for the user to fill in)."""
    flags: list[str] = []
    for name in _by_family(outcomes)[0]:
        flag = hint(name).flag
        if flag and flag not in flags:
            flags.append(flag)
    return flags
