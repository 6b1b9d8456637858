"""``status``: the state of a running or stopped crawl, totals over every run.

Its numbers come from the stores (read-only, beside a live crawl) and from
status.json, the last snapshot a run wrote; docs/STATUS.md defines each one.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..outcomes import by_class
from ..read.counting import RECOUNT, count_shards
from ..read.display import printable
from ..read.sitemaps import summary as sitemap_summary
from ..state.shards import crawl_count, shard_dir
from ..state.statusfile import is_running, read_status, sum_snapshots

# status.json's "state" after a run (crawler.cli.crawl writes it), in words.
_STOPPED = {
    "complete": "finished: nothing is left to fetch",
    "interrupted": "interrupted (Ctrl-C or SIGTERM)",
    "limit": "stopped: --max-pages reached",
    "failed": "stopped by an error (see the run's log)",
}


def add_parsers(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="show the state of a running or stopped crawl",
        description="Whether the crawl in DIR runs, finished or was stopped; what every run "
        "recorded (counted from its stores, so a crawl in progress is read as it is); "
        "what is pending; the last status line. docs/STATUS.md defines every number.",
        epilog="example: python -m crawler status crawl1",
    )
    status.add_argument("data", metavar="DIR", help="the crawl's data directory (--data)")
    status.add_argument("--json", action="store_true", help="all of it as one JSON object")
    status.add_argument("--shards", action="store_true", help="one line per shard too")
    status.add_argument("--recount", action="store_true",
                        help="count by reading every record and bulk (about a second per "
                        "100,000 pages) instead of the counters the crawl keeps")


def _state(info: dict[str, Any]) -> str:
    if info["running"]:
        return "running"
    last = info.get("last_status")
    if not last:
        return "not started" if info["recorded"] == 0 else "stopped"
    state = last.get("state")
    if state in _STOPPED:
        return _STOPPED[state]
    return "killed or crashed (the last run did not stop cleanly; nothing is lost)"


def collect(data_dir: str, *, recount: bool = False) -> dict[str, Any]:
    """Everything ``status`` shows, as one dict (the --json output). ``recount``: read
    every record rather than the committer's counters (crawler.read.counting)."""
    count = crawl_count(data_dir)
    dirs = [shard_dir(data_dir, i, count) for i in range(count)]
    snaps = [s for s in (read_status(d) for d in dirs) if s]
    top = read_status(data_dir) if len(dirs) > 1 else None
    if not snaps and top is not None:  # no shard ran: the supervisor's word is all there is
        snaps = [top]
    shard_snaps = [read_status(d) or {} for d in dirs]
    counts, absent = count_shards(data_dir, dirs, [is_running(s) for s in shard_snaps],
                                  recount=recount)
    outcomes: dict[str, int] = {}
    per_shard = []
    for d, snap, c in zip(dirs, shard_snaps, counts, strict=True):
        for key, n in c.tally.outcomes.items():
            outcomes[key] = outcomes.get(key, 0) + n
        per_shard.append({
            "data": d, "running": is_running(snap), "recorded": c.stored,
            "pending_bulks": c.tally.pending_bulks, "pending": c.tally.pending,
            "fetched": snap.get("fetched", 0), "outbox": snap.get("outbox", 0),
        })
    recorded = sum(c.tally.recorded for c in counts)
    fetched = sum(c.tally.fetched for c in counts)
    scanned = [c.why for c in counts if c.source == "scan"]
    bulks = sum(s["pending_bulks"] for s in per_shard)
    pending = sum(s["pending"] for s in per_shard)
    info: dict[str, Any] = {
        "data": data_dir,
        "shards": len(dirs),
        "absent_shards": absent,
        "running": any(is_running(s) for s in snaps) or is_running(top),
        "recorded": recorded,
        "fetched": fetched,
        "not_fetched": recorded - fetched,
        "outcomes": dict(sorted(outcomes.items())),
        "classes": by_class(outcomes),
        "pending_bulks": bulks,
        "pending": pending,
        "sitemaps": sitemap_summary(data_dir),
        "counts_from": "scan" if scanned else "counters",
    }
    if scanned and scanned[0] != RECOUNT:
        info["counts_why"] = scanned[0]  # the first shard's reason: they rarely differ
    if snaps:
        last = snaps[0] if len(snaps) == 1 else sum_snapshots(snaps)
        # The supervisor's word on how the run ended, unless a shard's own file says it
        # was still running: then that run was killed before the supervisor wrote again.
        if top is not None and "state" in top and not any(x.get("running") for x in snaps):
            last["state"] = top["state"]
        info["last_status"] = last
    info["state"] = _state(info)
    if is_running(top):  # the running supervisor's or Ray driver's word on its shards
        assert top is not None
        shards = top.get("per_shard")
        info["shards_down"] = [p.get("shard") for p in (shards if isinstance(shards, list)
                                                        else []) if isinstance(p, dict)
                               and p.get("up") is False]
    if len(dirs) > 1:
        info["per_shard"] = per_shard
    return info


def cmd_status(args: argparse.Namespace) -> int:
    info = collect(args.data, recount=args.recount)
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return 0
    for line in _text(args, info):
        print(printable(line))  # a directory's name, an outcome from a record: never raw
    return 0


def _text(args: argparse.Namespace, info: dict[str, Any]) -> list[str]:
    """What ``status`` prints without --json, line by line."""
    out: list[str] = []
    shards = f" ({info['shards']} shards)" if info["shards"] > 1 else ""
    out.append(f"crawl {args.data}: {info['state']}{shards}")
    if info.get("shards_down"):
        out.append(f"  shards down: {', '.join(map(str, info['shards_down']))} (not answering "
                   "the running crawl; their links wait in the others' outboxes)")
    if info["absent_shards"]:
        out.append(f"  not on this machine: shards {', '.join(map(str, info['absent_shards']))} "
              "(counted below: only the shards here)")
    out.append(
        f"  pages recorded: {info['recorded']} over every run "
        f"({info['fetched']} fetched over HTTP, {info['not_fetched']} not fetched)"
    )
    for cls, n in info["classes"].items():
        out.append(f"    {cls}: {n}")
    out.append(f"  pending: {info['pending']} URLs in {info['pending_bulks']} bulks")
    if "counts_why" in info:  # fell back from the counters: say why that status was slow
        out.append(f"  counted by reading every record: {info['counts_why']}")
    sm = info["sitemaps"]
    if sm["read"]:
        ends = ", ".join(f"{k} {n}" for k, n in sm["outcomes"].items())
        out.append(f"  sitemaps read: {sm['read']} ({ends}); {sm['urls_listed']} URLs listed, "
              f"{sm['urls_admitted']} handed to the frontier (python -m crawler sitemaps DIR)")
    snap = info.get("last_status")
    if snap:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap["time"]))
        out.append(  # a run that ended before its first report wrote only time and fetched
            f"  last run ({'status at ' if info['running'] else 'ended '}{when}): "
            f"fetched {snap.get('fetched', 0)} in {snap.get('elapsed', 0):.0f} s, "
            f"hosts {snap.get('hosts', 0)}, bad hosts {snap.get('bad_hosts', 0)}, "
            f"rss {snap.get('rss_mb', 0)} MB"
        )
        if "revisits" in snap:  # start --revisit-after (docs/RETRY.md)
            out.append(
                f"  revisits (last run): {snap['revisits']} pages re-queued as due, "
                f"{snap.get('revisits_waiting', 0)} waiting for their time"
            )
        if "rendered" in snap:  # --render-js (docs/RENDER.md)
            out.append(
                f"  renders (last run): {snap['rendered']} rendered, "
                f"{snap.get('render_failed', 0)} cut, {snap.get('render_queued', 0)} queued, "
                f"{snap.get('rendering', 0)} rendering, "
                f"browser started {snap.get('browser_starts', 0)} time(s)"
            )
    if not info["running"] and (info["pending"] or not snap or snap.get("state") != "complete"):
        out.append(f"  to resume: python -m crawler start --data {args.data}")
    if args.shards and info["shards"] > 1:
        for i, s in enumerate(info["per_shard"]):
            out.append(
                f"  shard {i} ({s['data']}): {'running' if s['running'] else 'not running'}, "
                f"pages recorded {s['recorded']}, pending {s['pending']} URLs, "
                f"fetched {s['fetched']} in its last run, links to hand over {s['outbox']}"
            )
    return out


COMMANDS = {"status": cmd_status}
