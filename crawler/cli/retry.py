"""``python -m crawler retry``: re-queue recorded failures so the next ``start`` fetches them.

The re-queue itself, its order of writes and why a kill -9 loses nothing, is
crawler.state.retry; the words for each outcome are crawler.run.hints.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
from collections.abc import Callable
from typing import Any, TypeVar

from .. import outcomes
from ..exceptions import CrawlerError
from ..read.display import printable
from ..run.hints import REASONS, explain, resume_flags
from ..run.supervisor import take_lock
from ..state.retry import Selection, requeue
from ..state.shards import crawl_count
from ._common import log_to_stderr


def _reasons(value: str) -> list[str]:
    """REASON[,REASON...]: each a prefix of a known reason, or of ``bad_host:REASON``."""
    out = []
    for reason in (r.strip() for r in value.split(",")):
        cause = reason.removeprefix(outcomes.BAD_HOST)
        known = outcomes.BAD_HOST.startswith(reason) or any(k.startswith(cause) for k in REASONS)
        if not reason or not known:
            raise argparse.ArgumentTypeError(
                f"unknown reason {reason!r}: give one of {', '.join(REASONS)}, a prefix such "
                "as dns_ or bad_host, or an HTTP status with --status"
            )
        out.append(reason)
    return out


def _statuses(value: str) -> list[str]:
    """CODE[,CODE...]: 404, 5xx, 0."""
    out = []
    for status in (s.strip() for s in value.split(",")):
        try:
            Selection(statuses=(status,))
        except CrawlerError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        out.append(status)
    return out


def add_parsers(sub: Any) -> None:
    retry = sub.add_parser(
        "retry",
        help="re-queue recorded failures so the next start fetches them again",
        description="Every outcome of a URL is final once recorded. retry deletes the records "
        "picked by --reason / --status (with neither: every failure, that is every record with "
        "no HTTP answer but robots_disallowed and host_page_limit, and every 4xx and 5xx), puts "
        "their URLs back in the queue and clears their hosts from the bad hosts, so that the "
        "next start fetches them again. The crawl must be stopped. See docs/RETRY.md.",
        epilog="example: python -m crawler retry crawl1 --reason tls --reason dns_ "
        "(then python -m crawler start --data crawl1 --ca-bundle ca.pem)",
    )
    retry.add_argument("data", metavar="DIR", help="crawl data directory (the crawl stopped)")
    retry.add_argument(
        "--reason", type=_reasons, action="extend", default=[], metavar="REASON",
        help="re-queue records of this reason or reason prefix (tls also takes bad_host:tls; "
        "dns_ every DNS failure; bad_host every URL of a bad host); repeat or separate with "
        "commas. python -m crawler pages DIR --status 0 shows the reasons",
    )
    retry.add_argument(
        "--status", type=_statuses, action="extend", default=[], metavar="CODE",
        help="re-queue records of this HTTP status or class (404, 5xx; 0: every record "
        "without an HTTP answer); repeat or separate with commas",
    )
    retry.add_argument(
        "--dry-run", action="store_true",
        help="print what would be re-queued, change nothing (works beside a running crawl)",
    )


def _supervisor_lock(data_dir: str) -> int:
    """A sharded crawl's supervisor lock (crawler.run.supervisor), held while retrying:
    no supervisor starts or restarts a shard meanwhile. Raises DataDirError if a
    supervisor holds it."""
    return take_lock(data_dir, "a crawl is running on this data directory: stop it (Ctrl-C) "
                               "and run retry again")


R = TypeVar("R")


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def locked_requeue(data: str, dry_run: bool, run: Callable[[], R]) -> R:
    """``run()`` (a requeue of the crawl in ``data``) after the directory's checks, under
    a sharded crawl's supervisor lock unless ``dry_run``: retry's and recrawl's start."""
    log_to_stderr(logging.WARNING)
    count = crawl_count(data)
    lock = _supervisor_lock(data) if count > 1 and not dry_run else None
    try:
        return run()
    finally:
        if lock is not None:
            os.close(lock)


def print_counts(counts: dict[str, int]) -> None:
    """A requeue's records by outcome, most first."""
    width = max(len(printable(k)) for k in counts)
    for key, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {printable(key):<{width}}  {n}")  # a key comes from a record


def cmd_retry(args: argparse.Namespace) -> int:
    data = args.data
    selection = Selection(tuple(args.reason), tuple(args.status))
    report = locked_requeue(data, args.dry_run,
                            lambda: requeue(data, selection, dry_run=args.dry_run))
    what = "failure" if selection.everything_failed else "record"
    if not report.requeued:
        print(f"retry {data}: no {what}s to re-queue")
        return 0
    verb = "would re-queue" if args.dry_run else "re-queued"
    hosts = f", {plural(report.hosts_cleared, 'bad host')} " + (
        "to clear" if args.dry_run else "cleared")
    if report.robots_cleared:
        hosts += f", {plural(report.robots_cleared, 'kept robots.txt answer')} " + (
            "to forget" if args.dry_run else "forgotten")
    shards = f" in {report.shards} shards" if report.shards > 1 else ""
    print(f"retry {data}: {verb} {plural(report.requeued, what)}{shards}{hosts}")
    print_counts(report.counts)
    if report.damaged:
        print(f"  ({plural(report.damaged, 'damaged record')} left alone: "
              "python -m kvstore verify names them)")
    if args.dry_run:
        return 0
    for line in explain(report.counts, data, retry=False):
        print(printable(line))
    resume = " ".join(["python -m crawler start --data", shlex.quote(data),
                       *resume_flags(report.counts)])
    print(f"resume: {resume}")
    return 0


COMMANDS = {"retry": cmd_retry}
