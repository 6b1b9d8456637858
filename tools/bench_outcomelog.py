"""What the outcome log (crawler.state.outcomelog) costs the committer, per record.

The committer's writes of page records timed apart in CPU time (process_time: the
number a busy machine changes least): MainDB's put and flush, the outcome log's
note and write, and the decode of a record's head that the counters and the log
share (done once per record whether or not the log exists).

    python tools/bench_outcomelog.py --records 50000 --batch 200 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import kvstore
from crawler.state.outcomelog import OutcomeLog
from crawler.state.pages import PageRecord, decode_page, encode_page
from crawler.web.urls import url_key


def once(records: int, batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        urls = [f"http://h{i % 997}.example.test/p{i}.html" for i in range(records)]
        values = [encode_page(PageRecord(u, 200, 1.7e9, 3, content_type="text/html"))
                  for u in urls]
        keys = [url_key(u) for u in urls]
        started = time.process_time()
        heads = [decode_page(v, with_body=False) for v in values]
        decode = time.process_time() - started
        put = note = 0.0
        log = OutcomeLog(d)
        with kvstore.open(os.path.join(d, "main")) as main:
            for i in range(0, records, batch):
                a = time.process_time()
                main.put_many(keys[i:i + batch], values[i:i + batch])
                main.flush()
                b = time.process_time()
                log.note(main, keys[i:i + batch], heads[i:i + batch])
                log.write()
                note += time.process_time() - b
                put += b - a
        log.close()
    return {name: seconds / records * 1e6
            for name, seconds in (("put_flush_us", put), ("outcome_log_us", note),
                                  ("head_decode_us", decode))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--batch", type=int, default=200, help="records a commit writes")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    runs = [once(args.records, args.batch) for _ in range(args.repeat)]
    for name in runs[0]:
        print(f"{name}\tmedian {statistics.median(r[name] for r in runs):.1f} us a record\t"
              f"{[round(r[name], 1) for r in runs]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
