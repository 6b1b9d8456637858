"""The ``start`` command: start or resume a crawl (``status`` is in :mod:`.status`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..config import (
    DEFAULT_MAX_URL_LENGTH,
    MAX_PROCESSES,
    MAX_SHARDS,
    MAX_THREADS_PER_SHARD,
    CrawlerConfig,
)
from ..exceptions import CrawlerError, DataDirError, ShardCountError, URLError, UsageError
from ..net.auth import load_netrc
from ..run.hints import explain, nothing_crawled
from ..state.settings import SETTINGS_NAME, load_settings, save_settings, settings_path
from ..state.shards import default_count, open_layout, read_count
from ..state.statusfile import live_pid, record_end
from ..web.urls import normalize, origin
from . import raystart, startopts
from ._common import count, say
from .resumehint import say_still_recorded

log = logging.getLogger(__name__)

SEEDS_NAME = "seeds.txt"


def add_parsers(sub: Any) -> None:
    start = sub.add_parser(
        "start",
        help="start a crawl, or resume the one in --data",
        description="Crawl from the seeds until nothing is pending (exit 0), a limit is reached, "
        "or Ctrl-C / SIGTERM (a clean stop; a second Ctrl-C stops at once, still safely). "
        "The first start saves its options in DIR/settings.json: to resume, run "
        "start --data DIR alone; an option given on a resume changes the saved one. Exit 1 when "
        "nothing was crawled (every URL refused or failed: the last line says why).",
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
        type=count(1, MAX_PROCESSES),
        metavar="N",
        help="shards, one process each, each owning the hosts that hash to it "
        "(default: the number the crawl was created with; for a new crawl, one per CPU). "
        f"1: one process, no supervisor; at most {MAX_PROCESSES}. See docs/SHARDS.md",
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
        type=count(1, MAX_SHARDS),
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
    "too_long": f"longer than the {DEFAULT_MAX_URL_LENGTH} characters a URL may have",
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
            out.append(normalize(seed, max_length=DEFAULT_MAX_URL_LENGTH))
        except URLError as exc:
            why = _SEED_REASONS.get(exc.reason, exc.reason)
            raise CrawlerError(f"bad seed URL {seed[:200]!r}{where}: {why}") from None
    return list(dict.fromkeys(out))


def _read_seeds(data_dir: str) -> list[str]:
    """The seeds a crawl keeps (seeds.txt); DataDirError naming the file (and the line)
    when it cannot be read or holds something that is not a seed URL."""
    path = os.path.join(data_dir, SEEDS_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8 (not a text file)
        raise DataDirError(f"{path}: unreadable ({exc}): fix or delete it") from None
    seeds = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                normalize(line.strip(), max_length=DEFAULT_MAX_URL_LENGTH)
            except URLError as exc:
                why = _SEED_REASONS.get(exc.reason, exc.reason)
                raise DataDirError(f"{path}:{n}: not a seed URL ({why}): fix or delete the "
                                   "line") from None
            seeds.append(line.strip())
    return seeds


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
    # Ctrl-C and SIGTERM from the first line: a signal while the crawl is starting (its
    # files written, its stores opening, its shards and threads starting) stops it too.
    with Interrupts() as interrupts:
        return _start(args, interrupts)


def _start(args: argparse.Namespace, interrupts: Interrupts) -> int:
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
        raise UsageError(str(ShardCountError(data_dir, recorded, wanted)))
    shards = recorded if recorded is not None else wanted or default_count()
    if not args.ray and shards > MAX_PROCESSES:
        raise UsageError(f"--data {data_dir}: this crawl has {shards} shards, more than the "
                         f"{MAX_PROCESSES} processes one machine runs: resume it with --ray")
    live = live_pid(data_dir)
    if live is not None:  # the stores' lock would refuse too, but after settings were saved
        raise CrawlerError(
            f"--data {data_dir}: a crawl is running on it (pid {live}): stop it first"
        )
    saved = load_settings(data_dir) if os.path.isdir(data_dir) else None
    if saved is not None:
        startopts.check_saved(saved, settings_path(data_dir))
    given = startopts.given_options(args)
    settings, changes = startopts.merge(saved, given)
    _check_threads(settings["threads"], shards, "threads" in given, settings_path(data_dir))
    startopts.check_proxies(settings)
    if settings["ca_bundle"] and not os.access(settings["ca_bundle"], os.R_OK):
        raise CrawlerError(f"--ca-bundle {settings['ca_bundle']}: no such readable file")
    if settings["netrc"]:  # read now so a mistake in it is one line before anything is written
        load_netrc(settings["netrc"])
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
    if interrupts.signals:  # before anything is written: there is nothing to stop
        say("crawler: interrupted before the crawl started: nothing written", sys.stderr)
        return interrupts.code
    try:
        os.makedirs(data_dir, exist_ok=True)
    except OSError as exc:
        raise CrawlerError(f"--data {data_dir}: cannot create it: {exc.strerror}") from None
    if saved is not None:
        log.info("resuming with the settings saved in %s", settings_path(data_dir))
    for change in changes:
        log.info("setting changed: %s (saved)", change)
    say_still_recorded(data_dir, changes)
    save_settings(data_dir, startopts.saved_form(settings))  # no proxy credentials
    if new_seeds:
        with open(os.path.join(data_dir, SEEDS_NAME), "a", encoding="utf-8") as f:
            f.write("".join(s + "\n" for s in new_seeds))
    shards = open_layout(data_dir, wanted)
    # Every seed is offered again (dedup skips those admitted): a first run killed
    # before its seeds reached PendDB must not leave a crawl with nothing to do.
    first_run = saved is None
    if shards == 1 and not args.ray:
        return _start_one(config, all_seeds, interrupts, first_run)
    return _start_shards(config, shards, all_seeds, level, args.ray, interrupts, first_run)


def _check_threads(threads: int, shards: int, given: bool, settings_file: str) -> None:
    """Refuse more threads than MAX_THREADS_PER_SHARD in a shard's share: a usage error
    when typed now, the settings file's when read back from it."""
    if -(-threads // shards) <= MAX_THREADS_PER_SHARD:
        return
    most = MAX_THREADS_PER_SHARD * shards
    why = (f"at most {MAX_THREADS_PER_SHARD:,} a shard process, so {most:,} for {shards} "
           "shard(s) (docs/BOUNDS.md says why)")
    if given:
        raise UsageError(f"--threads {threads}: {why}")
    raise DataDirError(f"{settings_file}: setting 'threads': {threads}: {why}: fix or delete it")


class Interrupts:
    """SIGINT and SIGTERM while ``start`` runs (a context manager: the handlers it found
    come back at its end). The first signal asks for a clean stop of what runs by then:
    nothing yet, the engine or the supervisor (:meth:`attach`); a second one exits at
    once, which is as safe as a kill -9 (every write is crash-safe)."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self._stop: Callable[[], None] | None = None
        self._kill: Callable[[], None] | None = None
        self._before: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._before[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)

    @property
    def code(self) -> int:
        """The exit status of a run stopped by the first signal (130, 143)."""
        return 128 + self.signals[0]

    def attach(self, stop: Callable[[], None], kill: Callable[[], None] | None = None) -> None:
        """What a signal stops from now on; a signal that came before stops it now."""
        self._stop, self._kill = stop, kill
        if self.signals:
            stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signals:
            if self._kill is not None:
                self._kill()  # as safe as a kill -9 of every shard
            os._exit(128 + signum)
        self.signals.append(signum)
        # Ctrl-C on `start ... | tee log` stops tee too: a write to the pipe it read must
        # not raise here, in the middle of the crawl, instead of stopping it cleanly.
        say("crawler: stopping (press Ctrl-C again to stop at once)", sys.stderr)
        if self._stop is not None:
            self._stop()


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
    what addresses it, and how to resume a crawl that did not finish. Written after the
    run's end is recorded, and never raising: a stream whose reader is gone is skipped."""
    say(f"crawl {state}: {json.dumps(summary, sort_keys=True)}")
    for line in explain(summary["outcomes"], data_dir):
        say(f"crawler: {line}", sys.stderr)
    if state != "complete":
        say(f"crawler: to resume: python -m crawler start --data {data_dir}", sys.stderr)


def _stopped_before_start(data_dir: str, interrupts: Interrupts) -> int:
    """A signal came while the crawl was starting, before any fetch: say so, as a run
    that was interrupted (status.json too), and exit with its status."""
    record_end(data_dir, "interrupted")
    summary = {"complete": False, "fetched": 0, "seconds": 0.0, "pages_per_s": 0.0,
               "outcomes": {}}
    _print_summary(_ENDS["interrupted"], summary, data_dir)
    return interrupts.code


def _nothing_crawled(end: str, summary: dict[str, Any], data_dir: str,
                     first_run: bool) -> bool:
    """A run that ended with nothing to do and nothing fetched, every URL it tried
    refused or failed: say why in one line, with the commands that would crawl them."""
    line = (nothing_crawled(summary["outcomes"], summary["fetched"], data_dir,
                            first_run=first_run) if end == "complete" else None)
    if line is None:
        return False
    say(f"crawler: {line}", sys.stderr)
    return True


NOTHING_CRAWLED = 1  # start's exit status when every URL was refused or failed


def _start_one(config: CrawlerConfig, seeds: list[str], interrupts: Interrupts,
               first_run: bool) -> int:
    """One process, no supervisor: the crawl directory is the shard's."""
    if interrupts.signals:
        return _stopped_before_start(config.data_dir, interrupts)
    from ..run.engine import Engine

    engine = Engine(config)
    if interrupts.signals:  # while the stores opened: close them, fetch nothing
        engine.close()
        return _stopped_before_start(config.data_dir, interrupts)
    interrupts.attach(engine.stop)
    engine.add_seeds(seeds)
    started = time.monotonic()
    try:
        complete = engine.run()
    except CrawlerError:
        record_end(config.data_dir, "failed")
        raise
    elapsed = time.monotonic() - started
    counts = engine.counters.snapshot()
    summary = {
        "complete": complete,
        "fetched": counts.fetched,
        "seconds": round(elapsed, 1),
        "pages_per_s": round(counts.fetched / max(elapsed, 1e-9), 1),
        "outcomes": counts.outcomes,
    }
    end = "complete" if complete else ("interrupted" if interrupts.signals else "limit")
    record_end(config.data_dir, end)
    _print_summary(_ENDS[end], summary, config.data_dir)
    if interrupts.signals:
        return interrupts.code
    return NOTHING_CRAWLED if _nothing_crawled(end, summary, config.data_dir, first_run) else 0


def _start_shards(
    config: CrawlerConfig, count: int, seeds: list[str], level: int, ray: str | None,
    interrupts: Interrupts, first_run: bool,
) -> int:
    """``count`` shard processes under this one, the supervisor (docs/SHARDS.md), or
    with ``ray``, ``count`` shard actors on that cluster (docs/RAY.md)."""
    if interrupts.signals:
        return _stopped_before_start(config.data_dir, interrupts)
    sup: Any
    if ray:
        from ..run.raydriver import RayDriver

        sup = RayDriver(config, count, seeds, ray, log_level=level)
    else:
        from ..run.supervisor import Supervisor

        sup = Supervisor(config, count, seeds, log_level=level)
    interrupts.attach(sup.stop, sup.kill)  # a signal before: the supervisor starts no shard
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
    end = "interrupted" if interrupts.signals else _END_OF.get(result.state, "failed")
    record_end(config.data_dir, end)
    _print_summary(_ENDS[end], summary, config.data_dir)
    if interrupts.signals:
        return interrupts.code
    return NOTHING_CRAWLED if _nothing_crawled(end, summary, config.data_dir, first_run) else 0


COMMANDS = {"start": cmd_start}
