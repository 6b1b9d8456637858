"""The feeder does not churn PendDB (issue 15): URLs of a host whose wait list is full
are handed back to their bulk, not rewritten into new bulks again and again."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from crawl_helpers import cli_args, fetched_urls, page_refetches, run_cli

from crawler.state.pages import decode_bulk
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]


def written_urls(data: Path) -> Counter[str]:
    """How many times each URL was written into a PendDB bulk. The VAL file keeps every
    value ever put (the store is append-only and nothing compacts it during a crawl):
    walk its records (docs/FORMAT.md: u32 length, 0xFFFFFFFF for a deletion, u32 CRC,
    the 16-byte key, the value) from offset 24."""
    out: Counter[str] = Counter()
    for val in sorted((data / "pend").glob("data-*.val")):
        raw = val.read_bytes()
        at = 24
        while at + 24 <= len(raw):
            (n,) = struct.unpack_from("<I", raw, at)
            if n == 0xFFFF_FFFF:  # a deletion: no value
                at += 24
                continue
            out.update(p.url for p in decode_bulk(raw[at + 24 : at + 24 + n]))
            at += 24 + n
    return out


def test_urls_of_a_busy_host_are_written_to_pendb_once(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    # One host, one connection, a delay: its wait list is full nearly all the crawl
    # long, while the feeder has room for sixteen times the thread count.
    web = make_testweb(pages=300, hosts=1, seed=5, crawl_delay=0.0)
    data = tmp_path / "c"
    args = cli_args(web, data, "--per-host", "1", "--delay", "0.01")
    done = run_cli(args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)
    assert page_refetches(web) == {}
    writes = written_urls(data)
    admitted = (data / "urls.log").read_text().split()
    assert set(writes) == set(admitted)
    assert sum(writes.values()) <= 1.05 * len(admitted), writes.most_common(3)
