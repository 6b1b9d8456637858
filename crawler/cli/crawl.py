"""The crawl commands: ``start`` (start or resume a crawl) and ``status`` (its state)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import kvstore

from .. import config as cfgmod
from ..config import CrawlerConfig
from ..exceptions import CrawlerError, ShardCountError, URLError
from ..run.status import read_status, sum_snapshots
from ..state.shards import open_layout, read_count, shard_dirs
from ..web.urls import normalize, origin
from ._common import size

SEEDS_NAME = "seeds.txt"


def _nameserver(value: str) -> tuple[str, int]:
    host, _, port = value.partition(":")
    try:
        return host, int(port or 53)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad nameserver {value!r}: use IP or IP:PORT") from None


def _processes(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--processes must be a whole number >= 1, not {value!r}")
    return n


def add_parsers(sub: Any) -> None:
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
    start.add_argument(
        "--threads",
        type=int,
        default=cfgmod.DEFAULT_THREADS,
        help="fetch threads in all (split over the processes)",
    )
    start.add_argument(
        "--processes",
        type=_processes,
        metavar="N",
        help="shards, one process each, each owning the hosts that hash to it "
        "(default: the number the crawl was created with; for a new crawl, one per CPU). "
        "1: one process, no supervisor. See docs/SHARDS.md",
    )
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
    for flag, kind, field, text in LIMITS:
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
    status.add_argument("--shards", action="store_true", help="one line per shard too")


# (flag, type, CrawlerConfig field with a DEFAULT_<FIELD> in config, help)
LIMITS: tuple[tuple[str, Any, str, str], ...] = (
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
    ("--max-body-bytes", size, "max_body_bytes", "body bytes read off the wire"),
    ("--max-decoded-bytes", size, "max_decoded_bytes", "body after gzip/deflate"),
)


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
    level = logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        recorded = read_count(args.data)
        if recorded is not None and args.processes not in (None, recorded):
            raise ShardCountError(args.data, recorded, args.processes)
    except ShardCountError as exc:
        print(f"crawler: error: {exc}", file=sys.stderr)
        return 2
    all_seeds = _seeds(args.data, args.seeds, 2048)
    if not all_seeds:
        raise CrawlerError(f"{args.data}: no seeds: give at least one SEED URL")
    count = open_layout(args.data, args.processes)
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
        **{field: getattr(args, field) for _, _, field, _ in LIMITS},
        status_interval=args.status_interval,
        scope_hosts=frozenset(origin(s)[1] for s in all_seeds),
    )
    if count == 1:
        return _start_one(config, args.seeds)
    return _start_shards(config, count, args.seeds, level)


def _print_summary(state: str, summary: dict[str, Any]) -> None:
    print(f"crawl {state}: {json.dumps(summary, sort_keys=True)}")


def _start_one(config: CrawlerConfig, seeds: list[str]) -> int:
    """One process, no supervisor: the crawl directory is the shard's."""
    from ..run.engine import Engine

    engine = Engine(config)
    engine.add_seeds([normalize(s) for s in seeds])
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
    _print_summary(state, summary)
    if interrupted:
        return 128 + interrupted[0]
    return 0


def _start_shards(config: CrawlerConfig, count: int, seeds: list[str], level: int) -> int:
    """``count`` shard processes under this one, the supervisor (docs/SHARDS.md)."""
    from ..run.supervisor import Supervisor

    sup = Supervisor(config, count, [normalize(s) for s in seeds], log_level=level)
    interrupted: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if interrupted:
            sup.kill()  # as safe as a kill -9 of every shard
            os._exit(128 + signum)
        interrupted.append(signum)
        print("crawler: stopping (press Ctrl-C again to stop at once)", file=sys.stderr)
        sup.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    result = sup.run()
    summary = {
        "complete": result.complete,
        "fetched": result.fetched,
        "seconds": result.seconds,
        "pages_per_s": round(result.fetched / max(result.seconds, 1e-9), 1),
        "outcomes": result.outcomes,
        "shards": count,
    }
    if result.error:
        raise CrawlerError(result.error)
    _print_summary("interrupted" if interrupted else result.state, summary)
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


def _shard_info(data_dir: str) -> dict[str, Any]:
    """One shard directory's state: its last status.json and read-only store counts."""
    info: dict[str, Any] = {"data": data_dir}
    snap = read_status(data_dir)
    if snap:
        info["last_status"] = snap
        info["running"] = bool(snap.get("running")) and _alive(int(snap.get("pid", 0)))
    with kvstore.open(os.path.join(data_dir, "main"), readonly=True) as main:
        info["done"] = len(main)
    with kvstore.open(os.path.join(data_dir, "pend"), readonly=True) as pend:
        info["pending_bulks"] = len(pend)
    return info


def cmd_status(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.data):
        raise CrawlerError(f"{args.data}: no such crawl directory")
    dirs = shard_dirs(args.data)
    shards = [_shard_info(d) for d in dirs]
    if len(dirs) == 1:
        info = shards[0]
    else:
        snaps = [s["last_status"] for s in shards if "last_status" in s]
        top = read_status(args.data)  # the supervisor's
        info = {
            "data": args.data,
            "shards": len(dirs),
            "done": sum(s["done"] for s in shards),
            "pending_bulks": sum(s["pending_bulks"] for s in shards),
            "running": any(s.get("running") for s in shards)
            or bool(top and top.get("running") and _alive(int(top.get("pid", 0)))),
            "per_shard": shards,
        }
        if snaps:
            info["last_status"] = sum_snapshots(snaps)
    snap = info.get("last_status")
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return 0
    title = f"crawl {args.data}: {'running' if info.get('running') else 'not running'}"
    print(title + (f" ({len(dirs)} shards)" if len(dirs) > 1 else ""))
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
    if args.shards and len(dirs) > 1:
        for i, s in enumerate(shards):
            last = s.get("last_status") or {}
            print(
                f"  shard {i} ({s['data']}): {'running' if s.get('running') else 'not running'}, "
                f"pages recorded {s['done']}, pending bulks {s['pending_bulks']}, "
                f"fetched {last.get('fetched', 0)}, links to hand over {last.get('outbox', 0)}"
            )
    return 0


COMMANDS = {"start": cmd_start, "status": cmd_status}
