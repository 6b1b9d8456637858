"""``python -m crawler``: start or resume a crawl, its status, and its pages: list, show, export."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import kvstore

from . import config as cfgmod
from .config import CrawlerConfig
from .exceptions import CrawlerError, URLError
from .export import DEFAULT_PROGRESS_INTERVAL, export
from .listing import DEFAULT_MAX_TEXT_CHARS, CrawlReader, describe, host_filter, matches, page_line
from .status import read_status
from .urls import normalize, origin

SEEDS_NAME = "seeds.txt"


def _nameserver(value: str) -> tuple[str, int]:
    host, _, port = value.partition(":")
    try:
        return host, int(port or 53)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad nameserver {value!r}: use IP or IP:PORT") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m crawler", description="A single-PC web crawler on kvstore."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    start = sub.add_parser(
        "start",
        help="start a crawl, or resume the one in --data",
        description="Crawl from the seeds until nothing is pending (exit 0), a limit is reached, "
        "or Ctrl-C / SIGTERM (a clean stop; a second Ctrl-C stops at once, still safely).",
        epilog="example: python -m crawler start http://h0.test:8080/ --data crawl1 "
        "--nameserver 127.0.0.1:5353 --allow-private-ips --delay 0.1",
    )
    start.add_argument(
        "seeds", nargs="*", metavar="SEED", help="seed URLs (optional when resuming)"
    )
    start.add_argument(
        "--data", required=True, metavar="DIR", help="data directory (created, or resumed)"
    )
    start.add_argument("--threads", type=int, default=cfgmod.DEFAULT_THREADS)
    start.add_argument(
        "--delay",
        type=float,
        default=cfgmod.DEFAULT_DELAY,
        help="seconds between requests to a host",
    )
    start.add_argument(
        "--per-host", type=int, default=cfgmod.DEFAULT_PER_HOST, help="connections per host"
    )
    start.add_argument("--max-pages", type=int, help="stop after this many fetches")
    start.add_argument("--max-pages-per-host", type=int)
    start.add_argument("--max-depth", type=int, help="seeds are depth 0; each link adds 1")
    start.add_argument(
        "--nameserver", type=_nameserver, action="append", default=[], metavar="IP[:PORT]"
    )
    start.add_argument("--user-agent", default=cfgmod.DEFAULT_USER_AGENT)
    start.add_argument(
        "--allow-private-ips",
        action="store_true",
        help="allow fetching private/loopback addresses (off by default to protect your network)",
    )
    start.add_argument(
        "--sync-interval",
        type=float,
        default=cfgmod.DEFAULT_SYNC_INTERVAL,
        help="seconds between fsyncs",
    )
    start.add_argument(
        "--ca-bundle", metavar="FILE", help="CA certificates (PEM) to verify HTTPS against"
    )
    start.add_argument(
        "--broad", action="store_true", help="follow links to any host (default: seed hosts only)"
    )
    start.add_argument("--allow-domain", action="append", default=[], metavar="DOMAIN")
    start.add_argument("--allow-regex", action="append", default=[], metavar="REGEX")
    start.add_argument("--deny-regex", action="append", default=[], metavar="REGEX")
    start.add_argument(
        "--ignore-robots", action="store_true", help="do not fetch or obey robots.txt"
    )
    start.add_argument(
        "--timeout",
        type=float,
        default=cfgmod.DEFAULT_TOTAL_TIMEOUT,
        help="total seconds for one fetch, connect to last byte",
    )
    start.add_argument("--status-interval", type=float, default=cfgmod.DEFAULT_STATUS_INTERVAL)
    start.add_argument("--quiet", action="store_true", help="no status lines, only warnings")
    limits = start.add_argument_group("limits (docs/HOSTILE.md says what each bounds)")
    for flag, kind, field, text in _LIMITS:
        limits.add_argument(
            flag,
            type=kind,
            default=getattr(cfgmod, "DEFAULT_" + field.upper()),
            dest=field,
            metavar="N" if kind is int else "S" if kind is float else "BYTES",
            help=f"{text} (default %(default)s)",
        )

    status = sub.add_parser(
        "status",
        help="show the state of a running or stopped crawl",
        epilog="example: python -m crawler status crawl1",
    )
    status.add_argument("data", metavar="DIR")
    status.add_argument("--json", action="store_true")
    _add_export(sub)
    _add_pages_and_show(sub)
    return parser


# (flag, type, CrawlerConfig field with a DEFAULT_<FIELD> in config, help)
_LIMITS: tuple[tuple[str, Any, str, str], ...] = (
    ("--connect-timeout", float, "connect_timeout", "seconds for a TCP connect plus TLS"),
    ("--read-timeout", float, "read_timeout", "seconds one socket read may wait"),
    ("--dns-timeout", float, "dns_timeout", "seconds for one host lookup, retries included"),
    ("--max-retries", int, "max_retries", "further tries after a transient failure"),
    ("--backoff", float, "backoff", "seconds a host waits after a failure (doubles)"),
    ("--max-retry-after", float, "max_retry_after", "cap on Retry-After and backoff, seconds"),
    ("--max-crawl-delay", float, "max_crawl_delay", "cap on a robots.txt Crawl-delay"),
    ("--bad-host-retry", float, "bad_host_retry", "seconds before a dead host is tried again"),
    ("--max-redirects", int, "max_redirects", "redirect hops followed from one URL"),
    ("--max-url-length", int, "max_url_length", "longer links are dropped"),
    ("--max-body-bytes", lambda v: _size(v), "max_body_bytes", "body bytes read off the wire"),
    ("--max-decoded-bytes", lambda v: _size(v), "max_decoded_bytes", "body after gzip/deflate"),
)


def _size(value: str) -> int:
    """BYTES, with an optional K, M or G suffix (powers of 1024)."""
    text = value.strip().upper()
    shift = 10 * ("KMG".index(text[-1]) + 1) if text and text[-1] in "KMG" else 0
    try:
        size = int(text[:-1] if shift else text) << shift
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {value!r}: use BYTES, 500M, 1G...") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0, got {value!r}")
    return size


def _add_export(sub: Any) -> None:
    export_p = sub.add_parser(
        "export",
        help="export a crawl's pages to WARC and/or JSON lines",
        description="Write every page record of a crawl (running or stopped: read-only, "
        "streaming) as WARC (warcinfo, then request/response records, revisits for repeated "
        "payloads, metadata records for URLs with no answer) and/or JSON lines. "
        "The formats are described in docs/EXPORT.md.",
        epilog="example: python -m crawler export crawl1 --warc crawl1.warc.gz --max-size 1G "
        "--jsonl crawl1.jsonl --text",
    )
    export_p.add_argument("data", metavar="DIR", help="crawl data directory")
    export_p.add_argument(
        "--warc", metavar="OUT.warc.gz", help="WARC output (gzip per record if it ends in .gz)"
    )
    export_p.add_argument(
        "--max-size",
        type=_size,
        metavar="BYTES",
        help="split the WARC: OUT-00000.warc.gz, OUT-00001... a new file once one reaches "
        "BYTES (K, M, G suffixes)",
    )
    export_p.add_argument(
        "--jsonl", metavar="OUT.jsonl", help="JSON lines output, one object per page (- = stdout)"
    )
    export_p.add_argument(
        "--text", action="store_true", help="add each page's visible text to the JSONL objects"
    )
    export_p.add_argument(
        "--text-limit",
        type=int,
        default=DEFAULT_MAX_TEXT_CHARS,
        metavar="CHARS",
        help="visible text kept per page",
    )
    export_p.add_argument(
        "--user-agent",
        default=cfgmod.DEFAULT_USER_AGENT,
        help="User-Agent of the rebuilt WARC request records (a crawl does not record the one "
        "it used; default: the crawler's default)",
    )
    export_p.add_argument(
        "--no-revisits", action="store_true", help="write repeated payloads in full"
    )
    export_p.add_argument(
        "--skip-failures",
        action="store_true",
        help="no WARC metadata records for URLs that got no HTTP answer",
    )
    export_p.add_argument(
        "--strict",
        action="store_true",
        help="stop at a damaged record (exit 1) instead of skipping it with a warning",
    )
    export_p.add_argument(
        "--progress-interval",
        type=float,
        default=DEFAULT_PROGRESS_INTERVAL,
        metavar="S",
        help="seconds between progress lines on stderr",
    )
    export_p.add_argument("--quiet", action="store_true", help="only warnings on stderr")


def _add_pages_and_show(sub: Any) -> None:
    pages = sub.add_parser(
        "pages",
        help="list a crawl's pages: status, content type, body size, URL",
        description="One tab-separated line per page record (in store order): status "
        "(0: no HTTP answer), content type (or [outcome]), stored body bytes, URL.",
        epilog="example: python -m crawler pages crawl1 --status 404 --host h0.test --limit 20",
    )
    pages.add_argument("data", metavar="DIR", help="crawl data directory")
    pages.add_argument("--status", type=int, metavar="CODE", help="only this status (0: failures)")
    pages.add_argument("--host", metavar="HOST", help="only this host (or HOST:PORT)")
    pages.add_argument("--limit", type=int, metavar="N", help="at most N lines")

    show = sub.add_parser(
        "show",
        help="show one page record: fields, headers and body",
        description="Print a page record's fields and stored headers, then its body: as text "
        "when it is text, else a size and hex note. URL is normalized as the crawler does.",
        epilog="example: python -m crawler show crawl1 http://h0.test:8080/",
    )
    show.add_argument("data", metavar="DIR", help="crawl data directory")
    show.add_argument("url", metavar="URL")
    show.add_argument(
        "--body-only", action="store_true", help="write only the stored body bytes to stdout"
    )


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot express; parser.error exits 2."""
    if args.command == "export":
        if not (args.warc or args.jsonl):
            parser.error("export: give --warc OUT.warc.gz and/or --jsonl OUT.jsonl")
        if args.warc == "-":
            parser.error("export: --warc needs a file name (WARC is not written to stdout)")
        if args.max_size is not None and not args.warc:
            parser.error("export: --max-size splits the WARC output: give --warc")
        if args.text and not args.jsonl:
            parser.error("export: --text adds text to the JSONL output: give --jsonl")
        if args.text_limit <= 0:
            parser.error("export: --text-limit must be > 0")
    if args.command == "pages" and args.limit is not None and args.limit < 0:
        parser.error("pages: --limit cannot be negative")


def _seeds(data_dir: str, new: list[str], max_length: int) -> list[str]:
    """Normalize new seeds, append them to seeds.txt, return every seed of this crawl."""
    path = os.path.join(data_dir, SEEDS_NAME)
    old = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = [line.strip() for line in f if line.strip()]
    normalized = []
    for seed in new:
        try:
            normalized.append(normalize(seed, max_length=max_length))
        except URLError as exc:
            raise CrawlerError(f"bad seed URL: {exc}") from None
    added = [s for s in normalized if s not in old]
    if added:
        os.makedirs(data_dir, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(s + "\n" for s in added))
    return old + added


def cmd_start(args: argparse.Namespace) -> int:
    from .engine import Engine

    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    all_seeds = _seeds(args.data, args.seeds, 2048)
    if not all_seeds:
        raise CrawlerError(f"{args.data}: no seeds: give at least one SEED URL")
    config = CrawlerConfig(
        data_dir=args.data,
        seeds=tuple(args.seeds),
        threads=args.threads,
        delay=args.delay,
        per_host=args.per_host,
        max_pages=args.max_pages,
        max_pages_per_host=args.max_pages_per_host,
        max_depth=args.max_depth,
        nameservers=tuple(args.nameserver),
        user_agent=args.user_agent,
        allow_private_ips=args.allow_private_ips,
        sync_interval=args.sync_interval,
        ca_bundle=args.ca_bundle,
        obey_robots=not args.ignore_robots,
        broad=args.broad,
        allow_domains=tuple(args.allow_domain),
        allow_regex=tuple(args.allow_regex),
        deny_regex=tuple(args.deny_regex),
        total_timeout=args.timeout,
        **{field: getattr(args, field) for _, _, field, _ in _LIMITS},
        status_interval=args.status_interval,
        scope_hosts=frozenset(origin(s)[1] for s in all_seeds),
    )
    engine = Engine(config)
    engine.add_seeds([normalize(s) for s in args.seeds])
    interrupted: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if interrupted:
            # Everything written so far is crash-safe: stopping now is like a kill -9.
            os._exit(128 + signum)
        interrupted.append(signum)
        print("crawler: stopping (press Ctrl-C again to stop at once)", file=sys.stderr)
        engine.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    started = time.monotonic()
    complete = engine.run()
    elapsed = time.monotonic() - started
    summary = {
        "complete": complete,
        "fetched": engine.fetched,
        "seconds": round(elapsed, 1),
        "pages_per_s": round(engine.fetched / max(elapsed, 1e-9), 1),
        "outcomes": dict(sorted(engine.outcomes.items())),
    }
    state = (
        "complete" if complete else ("interrupted" if interrupted else "stopped (limit reached)")
    )
    print(f"crawl {state}: {json.dumps(summary, sort_keys=True)}")
    if interrupted:
        return 128 + interrupted[0]
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmd_status(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.data):
        raise CrawlerError(f"{args.data}: no such crawl directory")
    info: dict[str, Any] = {"data": args.data}
    snap = read_status(args.data)
    if snap:
        info["last_status"] = snap
        info["running"] = bool(snap.get("running")) and _alive(int(snap.get("pid", 0)))
    with kvstore.open(os.path.join(args.data, "main"), readonly=True) as main:
        info["done"] = len(main)
    with kvstore.open(os.path.join(args.data, "pend"), readonly=True) as pend:
        info["pending_bulks"] = len(pend)
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return 0
    print(f"crawl {args.data}: {'running' if info.get('running') else 'not running'}")
    print(f"  pages recorded: {info['done']}")
    print(f"  pending bulks:  {info['pending_bulks']}")
    if snap:
        print(
            f"  last status ({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(snap['time']))}): "
            f"fetched {snap['fetched']}, pending {snap['pending']}, in flight {snap['in_flight']}, "
            f"hosts {snap['hosts']}, bad hosts {snap['bad_hosts']}, rss {snap['rss_mb']} MB"
        )
        for k, v in sorted(snap.get("outcomes", {}).items()):
            print(f"    {k}: {v}")
    return 0


def _log_to_stderr(level: int) -> None:
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _stdout_gone() -> int:
    """stdout's reader went away (``| head``): not an error. Point stdout at /dev/null
    so the interpreter's final flush does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    _log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    stream: io.TextIOWrapper | None = None
    jsonl: str | io.TextIOWrapper | None = args.jsonl
    if args.jsonl == "-":
        sys.stdout.flush()
        stream = jsonl = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    try:
        export(
            args.data,
            warc=args.warc,
            jsonl=jsonl,
            max_size=args.max_size,
            text=args.text,
            text_limit=args.text_limit,
            user_agent=args.user_agent,
            revisits=not args.no_revisits,
            skip_failures=args.skip_failures,
            strict=args.strict,
            progress_interval=args.progress_interval,
        )
    except BrokenPipeError:
        return _stdout_gone()
    except OSError as exc:
        raise CrawlerError(f"cannot write the export: {exc}") from exc
    finally:
        if stream is not None:
            try:
                stream.flush()
            except BrokenPipeError:
                pass
            stream.detach()  # sys.stdout keeps its buffer
    return 0


def cmd_pages(args: argparse.Namespace) -> int:
    _log_to_stderr(logging.WARNING)
    try:
        host = host_filter(args.host) if args.host is not None else None
    except URLError as exc:
        raise CrawlerError(f"bad --host: {exc}") from None
    shown = 0
    try:
        with CrawlReader(args.data) as reader:
            for page in reader.pages():
                if args.limit is not None and shown >= args.limit:
                    break
                if matches(page, status=args.status, host=host):
                    print(page_line(page))
                    shown += 1
        sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        url = normalize(args.url)
    except URLError as exc:
        raise CrawlerError(f"bad URL: {exc}") from None
    with CrawlReader(args.data, strict=True) as reader:
        page = reader.get(url)
    if page is None:
        raise CrawlerError(f"{url}: not in the crawl {args.data}")
    try:
        if args.body_only:
            sys.stdout.flush()
            sys.stdout.buffer.write(page.body)
            sys.stdout.buffer.flush()
        else:
            print(describe(page))
            sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()
    return 0


_COMMANDS = {
    "start": cmd_start,
    "status": cmd_status,
    "export": cmd_export,
    "pages": cmd_pages,
    "show": cmd_show,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_usage(parser, args)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return _COMMANDS[args.command](args)
    except (CrawlerError, kvstore.exceptions.KVStoreError) as exc:
        print(f"crawler: error: {exc}", file=sys.stderr)
        return 1
