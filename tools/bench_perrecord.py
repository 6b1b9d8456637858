"""CPU a record of the read commands' per-record paths, on a crawl (issue 31: what a
20M-page `index` or `export` costs, from a sample): the index's reading task
(crawler.search.reading.read_task: a record read by its version, its page's text,
SimHash and anchor lines, the task's files gzipped), the rank store's lookups one key
at a time (crawler.read.rankstore: a URL by key, a rank by key, as `pages` and `show`
make them) and the batched resolution of links that `export --jsonl` makes
(``link_batch_us``). The lookups need a rank store: ``python -m crawler rank DIR``.

    python tools/bench_perrecord.py --data /tmp/seedsmall --records 3000 --repeat 3

Process CPU time (``time.process_time``), median of ``--repeat`` runs, one line of JSON
(``--json``) or a table. The records are the first ``--records`` of shard 0 in file
order; the lookups are the link targets of the first pages until ``--links`` of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import kvstore  # noqa: E402
from crawler.read.linkgraph import Resolver  # noqa: E402
from crawler.read.listing import CrawlReader  # noqa: E402
from crawler.read.rankstore import RankStore  # noqa: E402
from crawler.search.reading import Task, VersionPages, read_task  # noqa: E402
from crawler.state.pages import KEY_SIZE  # noqa: E402


def read_task_ms(data: str, records: int) -> float:
    """CPU ms a record of one reading task over the first ``records`` of shard 0."""
    with CrawlReader(data) as reader:
        path = os.path.join(reader.dirs[0], "main")
        count = len(reader.dirs)
    with kvstore.open(path, readonly=True) as store:
        gen, keys, vers = store.versions()
    order = np.argsort(vers, kind="stable")[:records]
    keys_v = np.ascontiguousarray(keys[order]).view("V16").ravel()
    pages = VersionPages({0: (path, gen)})
    try:
        with tempfile.TemporaryDirectory() as spill:
            task = Task(0, 0, keys_v.tobytes(), tuple(vers[order].tolist()), spill, count,
                        frozenset(range(count)), 100_000)
            started = time.process_time()
            read_task(task, pages)
            return (time.process_time() - started) / len(order) * 1e3
    finally:
        pages.close()


def link_keys(reader: CrawlReader, links: int) -> np.ndarray:
    """The first ``links`` link targets of the crawl's pages in store order, as an
    (n, 16) uint8 array."""
    parts: list[bytes] = []
    size = 0
    for page in reader.pages(with_body=False):
        parts.append(page.links[: page.link_count() * KEY_SIZE])
        size += len(parts[-1])
        if size >= links * KEY_SIZE:
            break
    return np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(-1, KEY_SIZE)[:links]


def lookup_us(data: str, links: int) -> tuple[float, float, float]:
    """CPU us a link target of a URL lookup and of a rank lookup by key, one at a time,
    and of export's batched resolution (crawler.read.linkgraph.Resolver.many: the rank
    store's vectorized search, MainDB's indexes for what it lacks) in batches of 16,384
    as export makes them, over ``links`` link targets."""
    with CrawlReader(data) as reader, RankStore(data) as ranks:
        array = link_keys(reader, links)
        keys = [row.tobytes() for row in array]
        started = time.process_time()
        for key in keys:
            ranks.url(key)
        url = (time.process_time() - started) / len(keys) * 1e6
        started = time.process_time()
        for key in keys:
            ranks.get(key)
        rank = (time.process_time() - started) / len(keys) * 1e6
        resolver = Resolver(reader, ranks=ranks)
        started = time.process_time()
        for i in range(0, len(array), 1 << 14):
            resolver.many(array[i : i + (1 << 14)])
        batch = (time.process_time() - started) / len(array) * 1e6
    return url, rank, batch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="crawl directory")
    p.add_argument("--records", type=int, default=3000, help="records the reading task reads")
    p.add_argument("--links", type=int, default=200_000, help="link targets looked up")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true", help="one line of JSON")
    args = p.parse_args(argv)
    runs: dict[str, list[float]] = {"read_task_ms": [], "url_lookup_us": [],
                                    "rank_lookup_us": [], "link_batch_us": []}
    store = RankStore.open(args.data)
    has_ranks = store is not None
    if store is not None:
        store.close()
    for _ in range(args.repeat):
        runs["read_task_ms"].append(read_task_ms(args.data, args.records))
        if has_ranks:
            url, rank, batch = lookup_us(args.data, args.links)
            runs["url_lookup_us"].append(url)
            runs["rank_lookup_us"].append(rank)
            runs["link_batch_us"].append(batch)
    out: dict[str, Any] = {name: round(statistics.median(v), 3) if v else None
                           for name, v in runs.items()}
    out.update(data=args.data, records=args.records, links=args.links, repeat=args.repeat)
    if args.json:
        print(json.dumps(out))
    else:
        for name in runs:
            print(f"{name}\t{out[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
