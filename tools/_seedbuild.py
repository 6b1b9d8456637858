"""Builds a synthetic crawl directory through the crawler's own state layer.

What tools/seedscale.py and tools/bench_status.py share. Each shard is written
by a real ``crawler.state.frontier.Frontier`` in that shard's directory, window
by window (tools/_seedweb.py): the window's recorded URLs are admitted
(``add_seeds``, ``commit``), every bulk is claimed, each URL gets its page
record (``encode_page``) submitted as an ``Outcome``, and the committer writes
them in its crash-safe order, keeping counts.json as in a crawl. The pending
URLs are admitted last, also through ``add_seeds``: claim() draws a random
unclaimed bulk, so pending bulks admitted earlier would be handed out with the
recorded ones. Their pages still list them (each pending URL is a link of one
page of its window), so the link graph is a crawl's.

The crawl directory is then what ``start`` writes: shards.json (open_layout),
settings.json (start's defaults plus --broad), seeds.txt (the largest hosts'
home pages, recorded at depth 0). A shard only ever receives its own hosts'
URLs (crawler.state.shards.owner), so no outbox is involved.
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import numpy as np

from crawler.cli import startopts
from crawler.cli.crawl import SEEDS_NAME
from crawler.state.frontier import Frontier, Outcome
from crawler.state.settings import save_settings
from crawler.state.shards import open_layout, shard_dir
from crawler.web.urls import url_key
from tools._seedweb import LinkCache, Shape, Web, Window

WINDOW_PAGES = 20_000  # recorded URLs of a shard admitted and claimed at a time
COMMIT_EVERY = 2_000  # outcomes a commit writes (the engine's commits are of this order)
PENDING_BATCH = 50_000  # pending URLs admitted by one commit


def build_shard(shape: Shape, shard: int, data_dir: str, *,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write shard ``shard`` of ``shape`` into its directory of ``data_dir``; return what
    was built (recorded, pending, outcomes by key, seconds, peak RSS)."""
    started = time.perf_counter()
    web = Web(shape)
    hosts = web.owned(shard)
    windows = web.windows(hosts, WINDOW_PAGES)
    frontier = Frontier(shard_dir(data_dir, shard, shape.shards))
    cache = LinkCache()
    outcomes: collections.Counter[str] = collections.Counter()
    recorded = pending = 0
    try:
        for k in range(windows):
            rng = np.random.default_rng([shape.seed, shape.shards, shard, k])
            hs, ls = web.recorded_in(hosts, k, windows)
            ph, pl = web.pending_in(hosts, k, windows)
            window = Window(web, hs, ls, ph, pl, rng, k, windows, cache)
            entries = web.pending_entries(hs, ls)
            where = {url_key(e.url): i for i, e in enumerate(entries)}
            frontier.add_seeds(entries)
            frontier.commit()
            claimed = []
            while (got := frontier.claim()) is not None:
                claimed.extend(got)
            if len(claimed) != len(entries):
                raise RuntimeError(f"shard {shard} window {k}: claimed {len(claimed)} "
                                   f"of {len(entries)}")
            for n, c in enumerate(claimed, 1):
                record, key = window.record(where[c.key])
                frontier.submit(Outcome(c, record))
                outcomes[key] += 1
                if n % COMMIT_EVERY == 0:
                    frontier.commit()
            frontier.commit()
            recorded += len(claimed)
            if progress and (k % 10 == 9 or k == windows - 1):
                progress(f"shard {shard}: {recorded:,} records, window {k + 1}/{windows}, "
                         f"{time.perf_counter() - started:.0f} s")
        for k in range(windows):
            ph, pl = web.pending_in(hosts, k, windows)
            for a in range(0, len(ph), PENDING_BATCH):
                frontier.add_seeds(web.pending_entries(ph[a:a + PENDING_BATCH],
                                                       pl[a:a + PENDING_BATCH]))
                frontier.commit()
            pending += len(ph)
        counts = frontier.counts()
    finally:
        frontier.close()
    if progress:
        progress(f"shard {shard}: done, {recorded:,} records, {pending:,} pending, "
                 f"{time.perf_counter() - started:.0f} s")
    return {
        "shard": shard, "recorded": recorded, "pending": pending,
        "frontier_done": counts["done"], "frontier_pending": counts["pending"],
        "outcomes": dict(sorted(outcomes.items())), "hosts": len(hosts),
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _build_shard_quietly(shape: Shape, shard: int, data_dir: str, verbose: bool
                         ) -> dict[str, Any]:
    return build_shard(shape, shard, data_dir, progress=_stderr if verbose else None)


def write_crawl_files(shape: Shape, data_dir: str, web: Web) -> None:
    """What ``start`` writes beside the stores: the shard layout, settings, seeds."""
    open_layout(data_dir, shape.shards)
    settings, _ = startopts.merge(None, {"broad": True})
    save_settings(data_dir, startopts.saved_form(settings))
    with open(os.path.join(data_dir, SEEDS_NAME), "w", encoding="utf-8") as f:
        f.write("".join(u + "\n" for u in web.seed_urls()))


def build_crawl(shape: Shape, data_dir: str, *, jobs: int | None = None,
                verbose: bool = True) -> list[dict[str, Any]]:
    """The whole crawl in ``data_dir`` (which must not hold one), its shards built by
    ``jobs`` processes at once (default: one per shard, up to the CPUs)."""
    if os.path.exists(os.path.join(data_dir, "shards.json")):
        raise FileExistsError(f"{data_dir}: holds a crawl already")
    os.makedirs(data_dir, exist_ok=True)
    write_crawl_files(shape, data_dir, Web(shape))
    jobs = jobs or min(shape.shards, os.cpu_count() or 1)
    if jobs == 1 or shape.shards == 1:
        return [build_shard(shape, s, data_dir, progress=_stderr if verbose else None)
                for s in range(shape.shards)]
    # spawn: each builder is a fresh interpreter (no lock or thread copied by a fork)
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_build_shard_quietly, shape, s, data_dir, verbose)
                   for s in range(shape.shards)]
        return [f.result() for f in futures]
