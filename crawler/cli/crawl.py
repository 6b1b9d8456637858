"""The ``start`` command: start or resume a crawl (``status`` is in :mod:`.status`)."""

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

from ..config import CrawlerConfig
from ..exceptions import CrawlerError, ShardCountError, URLError
from ..run.hints import explain
from ..run.status import live_pid, record_end
from ..state.settings import SETTINGS_NAME, load_settings, save_settings, settings_path
from ..state.shards import open_layout, read_count
from ..web.urls import normalize, origin
from . import raystart, startopts

log = logging.getLogger(__name__)

SEEDS_NAME = "seeds.txt"


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
        "or Ctrl-C / SIGTERM (a clean stop; a second Ctrl-C stops at once, still safely). "
        "The first start saves its options in DIR/settings.json: to resume, run "
        "start --data DIR alone; an option given on a resume changes the saved one.",
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
        "--seeds-file",
        metavar="FILE",
        help="more seed URLs, one per line (blank lines and lines starting with # skipped)",
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
        "--max-pages",
        type=startopts.whole(0),
        metavar="N",
        help="stop this run after N fetches (not saved: a resume runs to the end)",
    )
    start.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the shards as Ray actors on a cluster: auto (the cluster this machine "
        "joined), HOST:PORT of its head, or local (a private cluster on this machine). "
        "Needs the [ray] extra; not saved. See docs/RAY.md",
    )
    start.add_argument(
        "--shards",
        type=startopts.whole(1),
        metavar="N",
        help="with --ray: how many shard actors (default as for --processes)",
    )
    start.add_argument("--quiet", action="store_true", help="no status lines, only warnings")
    startopts.add_options(start)


# Why normalize() refused a seed, in words (crawler.web.urls's reasons).
_SEED_REASONS = {
    "relative": "not a full URL: give the scheme and host, e.g. http://example.com/",
    "scheme": "only http:// and https:// URLs can be crawled",
    "host": "no valid host name in it",
    "port": "its port is not a number from 1 to 65535",
    "too_long": "longer than the 2048 characters a URL may have",
}


def _normalized_seeds(args: argparse.Namespace) -> list[str]:
    """The seeds of this command line (arguments, then --seeds-file), normalized."""
    given = [(seed, "") for seed in args.seeds]
    if args.seeds_file:
        try:
            with open(args.seeds_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CrawlerError(f"--seeds-file {args.seeds_file}: cannot read it: {exc}") from None
        given += [
            (line.strip(), f" ({args.seeds_file}:{n})")
            for n, line in enumerate(lines, 1)
            if line.strip() and not line.lstrip().startswith("#")
        ]
    out = []
    for seed, where in given:
        try:
            out.append(normalize(seed, max_length=2048))
        except URLError as exc:
            why = _SEED_REASONS.get(exc.reason, exc.reason)
            raise CrawlerError(f"bad seed URL {seed[:200]!r}{where}: {why}") from None
    return list(dict.fromkeys(out))


def _read_seeds(data_dir: str) -> list[str]:
    path = os.path.join(data_dir, SEEDS_NAME)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


# What a crawl directory holds; a non-empty directory with none of it is not one.
_CRAWL_MARKS = (SEEDS_NAME, SETTINGS_NAME, "shards.json", "main", "pend", "shards")


def _check_data_dir(data_dir: str) -> None:
    """Refuse, before anything is written, a --data that cannot be a crawl directory."""
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise CrawlerError(f"--data {data_dir}: exists and is not a directory: choose another")
    if not os.path.isdir(data_dir):
        parent = os.path.dirname(os.path.abspath(data_dir))
        while not os.path.isdir(parent):  # makedirs creates the missing parents too
            if os.path.exists(parent):
                raise CrawlerError(
                    f"--data {data_dir}: cannot create it: {parent} is not a directory"
                )
            parent = os.path.dirname(parent)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise CrawlerError(f"--data {data_dir}: cannot create it: {parent} is not writable")
        if kvstore_files(set(os.listdir(parent))):
            raise CrawlerError(
                f"--data {data_dir}: {parent} is a kvstore store: a crawl directory does not "
                "go inside one; choose another place"
            )
        return
    names = set(os.listdir(data_dir))
    if kvstore_files(names):
        raise CrawlerError(
            f"--data {data_dir}: this is a kvstore store, not a crawl directory: "
            "choose a new or empty directory"
        )
    if names and not names & set(_CRAWL_MARKS):
        raise CrawlerError(
            f"--data {data_dir}: holds other files and no crawl: choose a new or empty directory"
        )
    if not os.access(data_dir, os.W_OK | os.X_OK):
        raise CrawlerError(f"--data {data_dir}: not writable")


def kvstore_files(names: set[str]) -> bool:
    return "LOCK" in names or any(n.startswith("data-") and n.endswith(".key") for n in names)


def cmd_start(args: argparse.Namespace) -> int:
    level = logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    data_dir = args.data
    # Everything is checked before anything is written: a mistake leaves nothing behind.
    _check_data_dir(data_dir)
    wanted = raystart.check_args(args, data_dir)
    recorded = read_count(data_dir)
    if recorded is not None and wanted not in (None, recorded):
        print(f"crawler: error: {ShardCountError(data_dir, recorded, wanted)}",
              file=sys.stderr)
        return 2  # a usage error: the option does not fit this crawl
    live = live_pid(data_dir)
    if live is not None:  # the stores' lock would refuse too, but after settings were saved
        raise CrawlerError(
            f"--data {data_dir}: a crawl is running on it (pid {live}): stop it first"
        )
    saved = load_settings(data_dir) if os.path.isdir(data_dir) else None
    settings, changes = startopts.merge(saved, startopts.given_options(args))
    if settings["ca_bundle"] and not os.access(settings["ca_bundle"], os.R_OK):
        raise CrawlerError(f"--ca-bundle {settings['ca_bundle']}: no such readable file")
    old_seeds = _read_seeds(data_dir)
    new_seeds = [s for s in _normalized_seeds(args) if s not in old_seeds]
    all_seeds = old_seeds + new_seeds
    if not all_seeds:
        raise CrawlerError(f"{data_dir}: no seeds: give at least one SEED URL or --seeds-file")
    config = CrawlerConfig(
        data_dir=data_dir,
        seeds=tuple(all_seeds),
        max_pages=args.max_pages,
        scope_hosts=frozenset(origin(s)[1] for s in all_seeds),
        **startopts.config_fields(settings),
    )
    try:
        os.makedirs(data_dir, exist_ok=True)
    except OSError as exc:
        raise CrawlerError(f"--data {data_dir}: cannot create it: {exc.strerror}") from None
    if saved is not None:
        log.info("resuming with the settings saved in %s", settings_path(data_dir))
    for change in changes:
        log.info("setting changed: %s (saved)", change)
    save_settings(data_dir, settings)
    if new_seeds:
        with open(os.path.join(data_dir, SEEDS_NAME), "a", encoding="utf-8") as f:
            f.write("".join(s + "\n" for s in new_seeds))
    count = open_layout(data_dir, wanted)
    # Every seed is offered again (dedup skips those admitted): a first run killed
    # before its seeds reached PendDB must not leave a crawl with nothing to do.
    if count == 1 and not args.ray:
        return _start_one(config, all_seeds)
    return _start_shards(config, count, all_seeds, level, args.ray)


# How a run ended: the key status.json keeps, and the words of the summary line.
_ENDS = {
    "complete": "complete",
    "interrupted": "interrupted",
    "limit": "stopped (limit reached)",
    "failed": "failed",
}
_END_OF = {words: key for key, words in _ENDS.items()}


def _print_summary(state: str, summary: dict[str, Any], data_dir: str) -> None:
    """The summary line on stdout; on stderr, what each kind of failure means and
    what addresses it, and how to resume a crawl that did not finish."""
    print(f"crawl {state}: {json.dumps(summary, sort_keys=True)}")
    for line in explain(summary["outcomes"], data_dir):
        print(f"crawler: {line}", file=sys.stderr)
    if state != "complete":
        print(f"crawler: to resume: python -m crawler start --data {data_dir}", file=sys.stderr)


def _start_one(config: CrawlerConfig, seeds: list[str]) -> int:
    """One process, no supervisor: the crawl directory is the shard's."""
    from ..run.engine import Engine

    engine = Engine(config)
    engine.add_seeds(seeds)
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
    try:
        complete = engine.run()
    except CrawlerError:
        record_end(config.data_dir, "failed")
        raise
    elapsed = time.monotonic() - started
    summary = {
        "complete": complete,
        "fetched": engine.fetched,
        "seconds": round(elapsed, 1),
        "pages_per_s": round(engine.fetched / max(elapsed, 1e-9), 1),
        "outcomes": dict(sorted(engine.outcomes.items())),
    }
    end = "complete" if complete else ("interrupted" if interrupted else "limit")
    record_end(config.data_dir, end)
    _print_summary(_ENDS[end], summary, config.data_dir)
    if interrupted:
        return 128 + interrupted[0]
    return 0


def _start_shards(
    config: CrawlerConfig, count: int, seeds: list[str], level: int, ray: str | None
) -> int:
    """``count`` shard processes under this one, the supervisor (docs/SHARDS.md), or
    with ``ray``, ``count`` shard actors on that cluster (docs/RAY.md)."""
    sup: Any
    if ray:
        from ..run.raydriver import RayDriver

        sup = RayDriver(config, count, seeds, ray, log_level=level)
    else:
        from ..run.supervisor import Supervisor

        sup = Supervisor(config, count, seeds, log_level=level)
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
        **({"ray": ray} if ray else {}),
    }
    if result.error:
        record_end(config.data_dir, "failed")
        raise CrawlerError(result.error)
    end = "interrupted" if interrupted else _END_OF.get(result.state, "failed")
    record_end(config.data_dir, end)
    _print_summary(_ENDS[end], summary, config.data_dir)
    if interrupted:
        return 128 + interrupted[0]
    return 0


COMMANDS = {"start": cmd_start}
