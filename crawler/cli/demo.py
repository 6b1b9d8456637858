"""The ``demo`` command: crawl a small built-in site on loopback, rank it, write its report.

It runs the main job on a machine with no network. crawler.cli.demosite serves
a few hosts on 127.0.0.x; then three commands run in this process, as a user
would type them:

- ``start``, with its defaults (politeness included: one connection and one
  request a second per host), except what a crawl of loopback needs. The
  default refuses loopback addresses, so ``--allow-private-ips``; and the
  scope is narrowed to exactly the demo's origins (``--broad --allow-regex
  '^http://127\\.0\\.0\\.[23456]:PORT/'``), so no other address is ever
  admitted. The site's URLs name IPs: nothing is resolved by DNS.
- ``rank`` (PageRank, stored for ``pages --sort rank``);
- ``report`` (the HTML file; JSON when matplotlib is not installed).

Their own output is kept back (it would bury the summary) and shown only when
one fails. The demo then prints a few lines of its own, read from the crawl
on disk, and the command that crawls a real site. The crawl and its report
go to a new temporary directory (kept, and printed) or to ``--data DIR``, which
must be new or empty (a resume of a demo crawl would look for a site that has
gone).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shlex
import sys
import tempfile
import time
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from ..exceptions import CrawlerError
from ..read import charts
from ..read.listing import CrawlReader
from ..read.rankstore import RankStore
from . import app
from ._common import log_to_stderr
from .demosite import HOSTS, DemoSite

REPORT_HTML = "report.html"
REPORT_JSON = "report.json"  # without matplotlib
TEMP_PREFIX = "kvcrawl-demo-"
REAL_SITE = "python -m crawler start https://example.com/ --data mysite"
INTERRUPTED = (130, 143)  # a command stopped by Ctrl-C or SIGTERM (it said so)


def add_parsers(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="crawl a small built-in site on loopback, rank it and write its report "
        "(no network needed)",
        description="Serve a small site of a few hosts on 127.0.0.x (robots.txt, a sitemap, "
        "links between the hosts, a redirect, a broken link), crawl it with start's defaults "
        "(only the demo's own addresses allowed), rank it, write the HTML report, and say "
        "what it did and how to crawl a real site. Takes a few seconds.",
        epilog="example: python -m crawler demo --data demo1",
    )
    demo.add_argument("--data", metavar="DIR",
                      help="a new or empty directory for the crawl and its report "
                      "(default: a new temporary directory, printed at the end)")


def _check_data(data: str) -> None:
    """Refuse, before anything is written, a --data the demo cannot make its crawl in."""
    if os.path.isdir(data):
        if os.listdir(data):
            raise CrawlerError(f"--data {data}: not empty: the demo makes a new crawl; "
                               "give a new or empty directory")
    elif os.path.lexists(data):
        raise CrawlerError(f"--data {data}: exists and is not a directory: choose another")


def scope_regex(site: DemoSite) -> str:
    """The --allow-regex that admits the demo's origins and nothing else (its hosts are
    127.0.0.N, N one digit: a character class names them)."""
    last = "".join(address.rpartition(".")[2] for address in site.addresses)
    if not all(a.startswith("127.0.0.") for a in site.addresses) or len(last) != len(
            site.addresses):
        raise ValueError(f"demo hosts not of the form 127.0.0.N: {site.addresses}")
    return rf"^http://127\.0\.0\.[{last}]:{site.port}/"


def start_argv(site: DemoSite, data: str) -> list[str]:
    """The ``start`` command line of the demo's crawl: the defaults, and loopback allowed
    for the demo's origins only."""
    return ["start", site.home, "--data", data, "--allow-private-ips", "--broad",
            "--allow-regex", scope_regex(site), "--quiet"]


def _step(argv: list[str]) -> int:
    """Run one ``python -m crawler`` command here, its output kept back unless it fails
    (then shown as it was); its exit status."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = app.main(argv)
    if code != 0:
        sys.stdout.write(out.getvalue())
        sys.stderr.write(err.getvalue())
    return code


def outcome_words(data: str) -> tuple[int, str]:
    """(URLs recorded, what they were in words: ``12 pages, 1 redirect, ...``)."""
    kinds: Counter[str] = Counter()
    with CrawlReader(data) as reader:
        for page in reader.pages(with_body=False):
            if 200 <= page.status < 300:
                kinds["pages"] += 1
            elif 300 <= page.status < 400:
                kinds["redirects"] += 1
            elif page.status:
                kinds[f"answered {page.status}"] += 1
            else:
                kinds[page.reason or "failed"] += 1
    order = ["pages", "redirects"]
    names = order + sorted(k for k in kinds if k not in order)
    parts = [f"{kinds[k]} {k[:-1] if kinds[k] == 1 and k in order else k}"
             for k in names if kinds[k]]
    return sum(kinds.values()), ", ".join(parts)


def cmd_demo(args: argparse.Namespace) -> int:
    # The handler goes to the real stderr now: the commands' logging.basicConfig is then a
    # no-op and their warnings are not kept back with their output.
    log_to_stderr(logging.WARNING)
    if args.data is not None:
        _check_data(args.data)
    began = time.monotonic()
    try:
        site = DemoSite().start()
    except OSError as exc:
        raise CrawlerError(f"demo: cannot serve its site on {HOSTS[0]}-{HOSTS[-1]} ({exc}): "
                           "the demo needs the whole of 127.0.0.0/8 on loopback, as "
                           "Linux has it") from None
    data = args.data if args.data is not None else tempfile.mkdtemp(prefix=TEMP_PREFIX)
    code, failed = _demo(site, data, began)
    if code in INTERRUPTED:
        print(f"demo: interrupted; what it made so far is in {data} (its site is gone, so "
              "it cannot be resumed: run the demo again)", file=sys.stderr)
    elif code:
        print(f"demo: stopped: `python -m crawler {shlex.join(failed)}` failed (above); what "
              f"it made so far is in {data}", file=sys.stderr)
    return code


def _demo(site: DemoSite, data: str, began: float) -> tuple[int, list[str]]:
    """Crawl the running site (then stop it), rank the crawl, write the report, say so.
    (0, []), or the exit status and command line of the step that failed."""
    try:
        print(f"demo: serving a site of {len(site.addresses)} hosts on loopback: "
              f"{site.origins[0]}/ to {site.origins[-1]}/", flush=True)
        crawl = start_argv(site, data)
        crawl_began = time.monotonic()
        code = _step(crawl)
        crawl_seconds = time.monotonic() - crawl_began
    finally:
        site.stop()
    if code:
        return code, crawl
    urls, words = outcome_words(data)
    print(f"demo: crawled it in {crawl_seconds:.1f} s with start's defaults (one request a "
          f"second per host): {urls} URLs, {words}", flush=True)
    rank = ["rank", data, "--top", "0", "--quiet"]
    if code := _step(rank):
        return code, rank
    with RankStore(data) as ranks:
        strongest = next(ranks.ordered(1))[1]
    print(f"demo: ranked its pages (PageRank); the strongest is {strongest}", flush=True)
    html = charts.available()
    path = os.path.join(data, REPORT_HTML if html else REPORT_JSON)
    report = ["report", data, "--out", path, "--quiet", *([] if html else ["--format", "json"])]
    if code := _step(report):
        return code, report
    print(f"demo: wrote the report: {path}"
          + ("" if html else " (for the HTML report with charts: pip install 'kvcrawl[report]')"))
    print(f"demo: done in {time.monotonic() - began:.1f} s; the crawl is in {data} "
          f"(python -m crawler pages {shlex.quote(data)} lists it)")
    print(f"demo: its crawl was: python -m crawler {shlex.join(crawl[:-1])}")
    print(f"to crawl a real site: {REAL_SITE}")
    return 0, []

COMMANDS = {"demo": cmd_demo}
