"""What each recorded outcome means to the user, and the flag or command that addresses it.

A crawl counts its outcomes by key (crawler.outcomes.outcome_key: a record's
reason, else why its body was cut, else its HTTP status; ``retry:<why>`` for a
try that will be repeated). :func:`explain` turns those counts into one line
per *family*, most frequent first: a reason (``tls``, ``dns_nxdomain``...)
together with its ``bad_host:<reason>`` records (URLs of a host that reason
had marked bad, recorded without a request), or an HTTP class (``4xx``,
``5xx``). Answers (2xx, 3xx) and ``retry:`` tries are not explained. Each
line says what the outcome means and how to address it: a ``start`` option
and the ``python -m crawler retry`` command that re-queues those records
(crawler.state.retry), or that it is a limit or the site's wish, not a
failure. The words for each reason are crawler.outcomes' ``HINTS``; docs/RETRY.md shows them.

Pure: no I/O, safe from any thread.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from ..outcomes import BAD_HOST, HINTS, REASONS, RETRY, Hint

__all__ = ["HINTS", "REASONS", "Hint", "explain", "family", "hint", "lifted_by",
           "nothing_crawled", "resume_flags", "retry_command", "selection"]

_UNKNOWN = Hint("an outcome this version of the crawler does not describe",
                "see the log and `python -m crawler pages DIR --status 0`", retry=False)


def family(key: str) -> str | None:
    """The family an outcome key is explained under (see the module docstring); None
    for answers (2xx, 3xx) and for tries (``retry:``)."""
    if key.startswith(RETRY):
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


def selection(names: list[str]) -> str:
    """``retry``'s options that pick these families (reasons, HTTP classes)."""
    reasons = [n for n in names if not n[0].isdigit()]
    statuses = [n for n in names if n[0].isdigit()]
    return " ".join(([f"--reason {','.join(reasons)}"] if reasons else [])
                    + ([f"--status {','.join(statuses)}"] if statuses else []))


def nothing_crawled(outcomes: Mapping[str, int], fetched: int, data_dir: str, *,
                    first_run: bool) -> str | None:
    """The one line for a run that ended with nothing pending and nothing fetched, every
    URL it tried refused or failed (a private address, a name not in DNS...): why, and
    the commands that would crawl them; None for any other run (one with nothing to do,
    or whose URLs robots.txt or a limit kept, included)."""
    totals = _by_family(outcomes)[0]
    if fetched or not totals or not all(hint(name).failure for name in totals):
        return None  # robots.txt said no, a limit: the site's wish or the user's, no failure
    what = "every seed" if first_run else "every URL this run tried"
    counts = ", ".join(f"{n} {name}" for name, n in totals.items())
    line = f"nothing was crawled: {what} was refused or failed ({counts})"
    fixes = [hint(name).fix for name in totals if hint(name).fix]
    if fixes:
        line += f"; {'; '.join(dict.fromkeys(fixes))}"
    again = [name for name in totals if name != "other" and hint(name).retry]
    if again:
        flags = " ".join(resume_flags(outcomes))
        start = f"python -m crawler start --data {shlex.quote(data_dir)}"
        line += (f"; then: python -m crawler retry {shlex.quote(data_dir)} {selection(again)}"
                 f" && {start}{' ' + flags if flags else ''}")
    return line


def lifted_by(flag: str) -> list[str]:
    """The reasons whose fix is the ``start`` option ``flag`` (``--allow-private-ips``:
    private_ip; ``--nameserver``: the DNS failures...)."""
    return [name for name, h in HINTS.items()
            if not name[0].isdigit() and h.flag.split()[:1] == [flag]]
