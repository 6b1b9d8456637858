"""Simulate a sharded crawl on Ray with no network: link-exchange throughput and admission rate
versus shard count (issue 13, "Scale, on paper and in simulation"). Not a test.

Usage (from the repository root; the [ray] extra installed):

    python tools/sim_exchange.py                          # 1,2,4,8,16 shards, 100k pages
    python tools/sim_exchange.py --shards 4 --pages 500000 --hosts 5000 --links 20
    python tools/sim_exchange.py --batch-urls 500         # smaller link messages

Method. One private Ray cluster on this machine (every server on 127.0.0.1,
no dashboard, no usage reports), kept for every shard count. First, a
calibration: ``--calibrate`` RayExchange.send calls from the driver to an idle
actor whose admit does nothing, with messages of 100, 1,000 and 5,000 URLs:
what a message costs Ray alone. Then for each count N, N named actors
(tools._simshard.SimShard), each a shard: a real Frontier over kvstore files
in a fresh directory under ``--workdir``, with the shard's Router, so links
for other shards' hosts go to its durable outbox; a real Forwarder sends the
outbox over the real RayExchange to the owner's ``admit``, which returns once
``Frontier.receive`` has made the batch durable (written, flushed, fsynced).
The fetcher is synthetic: a "fetch" does no I/O and yields the page's links
generated from its URL (tools._simshard.SynthWeb: ``--pages`` pages over
``--hosts`` hosts, ``--links`` links a page, two of them tree links that make
every page reachable, a share ``--same-host`` of the others on the page's
host). A feeder thread claims bulks, "fetches" their URLs and submits one
Outcome each; a committer thread commits (the engine's loops, sleeps and queue
bound). The crawl starts from the first ``--seeds`` pages and ends by the
drivers' rule (crawler.run.overview.quiescent: two consecutive report rounds,
every shard idle, no commit between them); then every actor closes its stores.

Reading the table (one row per shard count; rates are over the crawl's
wall time, from the actors' start to the last commit that wrote anything):

  pages/s    pages "fetched" per second, all shards summed
  adm/s      URLs admitted (new to their owner) per second: = pages/s, since
             every page of the web is admitted once
  offer/s    links offered to admission (duplicates included) per second
  xfer/s     links sent to other shards per second (after the outbox's
             recently-sent filter)
  batches    link messages sent, and URLs/batch their mean size (a message
             leaves at ``--batch-urls`` or after ``--linger`` seconds)
  send ms    mean time of one RayExchange.send: the actor call and the wait for
             the owner to make the batch durable; admit ms is the owner's side
             (decode, wait for its committer, fsync). send - admit is Ray's
             share under load; the calibration line is its floor
  fwd busy   the share of the crawl's time each shard's Forwarder spent inside
             send (it sends one message at a time): near 100% it is the limit
  RSS        peak of the summed resident sets of the driver and the actors
             (sampled every 0.1 s); PSS counts shared pages once; tree RSS adds
             Ray's own processes (gcs_server, raylet, idle workers...)
  check      ok when every page of the web was fetched exactly once (sum ==
             pages, none twice, none missed, none by a shard not its owner),
             the admitted URLs sum to the pages and every link sent was
             received durably; else the exit status is 1

On this 2-core machine N > 2 actors share two cores, so beyond 2 the rates
show what each shard and each message costs, not a cluster's scaling; wall
times include threads waiting for the GIL and the CPU. JSON (``--out``,
default ``bench-results/sim-exchange-<timestamp>.json``, git-ignored):
``machine``, ``config``, ``calibration`` (per message size: ``urls``,
``bytes``, ``mean_ms``, ``median_ms``) and ``rows``: per count the table's
numbers (``pages_per_s``, ``admitted_per_s``, ``offered_per_s``,
``sent_urls_per_s``, ``sent_batches``, ``urls_per_batch``, ``send_ms``,
``admit_ms``, ``forwarder_busy``, ``rss_bytes``, ``pss_bytes``,
``tree_rss_bytes``, ``check_ok``, ``problems``), the time to start the actors
(``actor_start_s``), the threads' busy seconds (``fetch_s``, ``commit_s``),
PendDB fsyncs (``pend_syncs``, ``pend_sync_ms``) and every shard's counters
(``shards_detail``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

REPO = Path(__file__).resolve().parents[1]
# Ray reads these at import: every server binds 127.0.0.1, nothing is reported home.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from crawler.net.raycluster import NAMESPACE  # noqa: E402
from crawler.run.exchange import DEFAULT_BATCH_URLS, linger_for  # noqa: E402 - after the env
from crawler.run.overview import Round, quiescent  # noqa: E402
from crawler.run.raydriver import MAX_CONCURRENCY  # noqa: E402
from crawler.run.rayshard import actor_name  # noqa: E402
from crawler.run.supervisor import PROBE_INTERVAL  # noqa: E402
from crawler.state.pages import Pending, encode_bulk  # noqa: E402
from tools._simshard import SimShard, Sink, SynthWeb, TimedRayExchange  # noqa: E402

RSS_POLL = 0.1  # seconds between RSS samples
OBJECT_STORE = 128 << 20  # as crawler.run.raydriver: links pass as small objects
CALIBRATE_URLS = (100, 1000, 5000)  # message sizes timed against an idle actor


class CheckFailed(RuntimeError):
    """The simulated crawl did not fetch every page exactly once."""


# -- memory of the process tree ----------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children of all its threads: Ray forks from
    several)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", encoding="ascii") as f:
                    todo += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                pass
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class RssSampler:
    """Peaks of summed RSS (and PSS) over ``pids``, and of RSS over the driver's whole tree."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = self.peak_pss = self.peak_tree = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss", daemon=True)

    def _sample(self) -> None:
        rss = sum(bu._vm_status(p).get("VmRSS", 0) for p in self.pids)
        self.peak = max(self.peak, rss)
        self.peak_pss = max(self.peak_pss, sum(_pss(p) for p in self.pids))
        tree = sum(bu._vm_status(p).get("VmRSS", 0) for p in _descendants(os.getpid()))
        self.peak_tree = max(self.peak_tree, tree)

    def _loop(self) -> None:
        while not self._stop.wait(RSS_POLL):
            self._sample()

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# -- what a message costs Ray alone -----------------------------------------------------------


def calibrate(web: SynthWeb, sink_class: Any, calls: int) -> list[dict[str, Any]]:
    """RayExchange.send from the driver to an idle actor whose admit does nothing, for
    link messages of several sizes: the floor under the send ms of a crawl."""
    import ray

    name = actor_name("sim", uuid.uuid4().hex[:8], 0)
    sink = sink_class.options(name=name, num_cpus=0).remote()
    ray.get(sink.__ray_ready__.remote())  # constructed: a send waits PATIENCE at most
    exchange = TimedRayExchange([name])
    rows = []
    try:
        for urls in CALIBRATE_URLS:
            payload = encode_bulk([Pending(web.url(i % web.pages)) for i in range(urls)])
            for _ in range(5):  # warm: the handle, the connection, the worker's first call
                exchange.send(0, payload)
            times = []
            for _ in range(calls):
                before = exchange.seconds
                exchange.send(0, payload)
                times.append(exchange.seconds - before)
            rows.append({"urls": urls, "bytes": len(payload), "calls": calls,
                         "mean_ms": 1e3 * sum(times) / calls,
                         "median_ms": 1e3 * bu.median(times)})
    finally:
        exchange.close()
        ray.kill(sink, no_restart=True)
    return rows


# -- one shard count ------------------------------------------------------------------------


def run_count(
    count: int, args: argparse.Namespace, web: SynthWeb, actor_class: Any
) -> dict[str, Any]:
    import ray

    run = uuid.uuid4().hex[:8]
    names = [actor_name("sim", run, i) for i in range(count)]
    seeds = list(range(min(args.seeds, web.pages)))
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="sim-exchange-") as data:
        created = time.monotonic()
        actors = [
            actor_class.options(
                name=names[i], max_concurrency=MAX_CONCURRENCY, num_cpus=0, max_restarts=0
            ).remote(web, i, count, names, data, seeds, args.batch_urls,
                     linger_for(count) if args.linger is None else args.linger)
            for i in range(count)
        ]
        try:
            pids = ray.get([a.pid.remote() for a in actors])
            startup = time.monotonic() - created
            with RssSampler([os.getpid(), *pids]) as rss:
                ray.get([a.start.remote() for a in actors])
                rounds = _until_quiescent(actors, args.timeout)
                finals = ray.get([a.finish.remote() for a in actors])
        finally:
            for a in actors:
                ray.kill(a, no_restart=True)
    row = _summarize(count, web, finals)
    row.update(
        actor_start_s=round(startup, 2),
        report_rounds=rounds,
        rss_bytes=rss.peak,
        pss_bytes=rss.peak_pss,
        tree_rss_bytes=rss.peak_tree,
        shards_detail=[{k: v for k, v in f.items() if k != "fetched_pages"} for f in finals],
    )
    return row


def _until_quiescent(actors: list[Any], timeout: float) -> int:
    import ray

    deadline = time.monotonic() + timeout
    before: Round | None = None
    rounds = 0
    while True:
        time.sleep(PROBE_INTERVAL)
        reports = ray.get([a.report.remote() for a in actors], timeout=timeout)
        rounds += 1
        errors = [r["error"] for r in reports if r["error"]]
        if errors:
            raise CheckFailed(f"a shard failed: {errors[0]}")
        after = [(0, int(r["activity"]), bool(r["idle"])) for r in reports]
        if quiescent(before, after):
            return rounds
        before = after
        if time.monotonic() > deadline:
            raise CheckFailed(f"not complete after {timeout:.0f} s")


def _summarize(count: int, web: SynthWeb, finals: list[dict[str, Any]]) -> dict[str, Any]:
    def total(key: str) -> Any:
        return sum(f[key] for f in finals)

    per_page = [sum(col) for col in zip(*(f["fetched_pages"] for f in finals), strict=True)]
    twice = sum(1 for n in per_page if n > 1)
    missed = sum(1 for n in per_page if n == 0)
    problems = []
    if total("fetched") != web.pages:
        problems.append(f"fetched {total('fetched')} of {web.pages}")
    if twice or missed:
        problems.append(f"{twice} pages fetched twice or more, {missed} never")
    if total("misrouted"):
        problems.append(f"{total('misrouted')} fetched by a shard not their owner")
    if total("admitted") != web.pages:
        problems.append(f"admitted {total('admitted')} URLs, not {web.pages}")
    if total("received_urls") < total("sent_urls"):  # more: a batch resent after a lost answer
        problems.append(f"{total('sent_urls')} links sent, {total('received_urls')} received")
    if total("send_failures"):
        problems.append(f"{total('send_failures')} failed sends (retried)")  # not an error
    wall = max(f["last_active"] for f in finals) - min(f["started"] for f in finals)
    wall = max(wall, 1e-9)
    batches, calls = total("sent_batches"), max(1, total("send_calls"))
    received = max(1, total("received_batches"))
    return {
        "shards": count,
        "wall_s": round(wall, 3),
        "fetched": total("fetched"),
        "admitted": total("admitted"),
        "offered": total("offered"),
        "sent_urls": total("sent_urls"),
        "sent_batches": batches,
        "send_failures": total("send_failures"),
        "pages_per_s": total("fetched") / wall,
        "admitted_per_s": total("admitted") / wall,
        "offered_per_s": total("offered") / wall,
        "sent_urls_per_s": total("sent_urls") / wall,
        "urls_per_batch": total("sent_urls") / batches if batches else 0.0,
        "bytes_per_batch": total("send_bytes") / calls if batches else 0.0,
        "send_ms": 1e3 * total("send_seconds") / calls if batches else 0.0,
        "admit_ms": 1e3 * total("admit_seconds") / received if batches else 0.0,
        "forwarder_busy": total("send_seconds") / (wall * count),
        "fetch_s": round(total("fetch_seconds"), 3),
        "commit_s": round(total("commit_seconds"), 3),
        "commits": total("commits"),
        "pend_syncs": total("syncs"),
        "pend_sync_ms": 1e3 * total("sync_seconds") / max(1, total("syncs")),
        "check_ok": not [p for p in problems if "failed sends" not in p],
        "problems": problems,
    }


# -- the table and main ----------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    headers = ["shards", "wall s", "pages/s", "adm/s", "offer/s", "xfer/s", "batches",
               "URLs/batch", "send ms", "admit ms", "fwd busy", "RSS", "PSS", "tree RSS", "check"]
    body = [
        [str(r["shards"]), f"{r['wall_s']:.1f}", bu.fmt_rate(r["pages_per_s"]),
         bu.fmt_rate(r["admitted_per_s"]), bu.fmt_rate(r["offered_per_s"]),
         bu.fmt_rate(r["sent_urls_per_s"]), str(r["sent_batches"]), f"{r['urls_per_batch']:.0f}",
         f"{r['send_ms']:.2f}", f"{r['admit_ms']:.2f}", f"{100 * r['forwarder_busy']:.0f}%",
         bu.fmt_bytes(r["rss_bytes"]),
         bu.fmt_bytes(r["pss_bytes"]), bu.fmt_bytes(r["tree_rss_bytes"]),
         "ok" if r["check_ok"] else "FAILED"]
        for r in rows
    ]
    return bu.markdown_table(headers, body)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", default="1,2,4,8,16", help="comma-separated shard counts")
    p.add_argument("--pages", type=int, default=100_000, help="pages of the synthetic web")
    p.add_argument("--hosts", type=int, default=1000, help="hosts the pages are spread over")
    p.add_argument("--links", type=int, default=10, help="links per page (>= 2)")
    p.add_argument("--same-host", type=float, default=0.8,
                   help="share of the random links (all but 2) that stay on the page's host")
    p.add_argument("--seeds", type=int, default=16, help="the crawl starts from pages 0..N-1")
    p.add_argument("--batch-urls", type=int, default=DEFAULT_BATCH_URLS,
                   help="URLs a link message carries at most (the Forwarder's default)")
    p.add_argument("--linger", type=float,
                   help="seconds links wait for more before they are sent (default: a "
                   "shard's, crawler.run.exchange.linger_for: 0.1 s up to 8 shards)")
    p.add_argument("--calibrate", type=int, default=200, metavar="CALLS",
                   help="sends per message size to an idle actor first (0: skip)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a shard count may take")
    p.add_argument("--workdir", type=Path, default=REPO / "bench-results",
                   help="where the shards' stores go (a fresh directory per count)")
    p.add_argument("--out", type=Path, help="the JSON file (default under bench-results/)")
    args = p.parse_args(argv)
    args.counts = [int(x) for x in args.shards.split(",")]
    if args.links < 2 or args.pages < 1 or args.hosts < 1 or min(args.counts) < 1:
        p.error("--links must be >= 2, --pages, --hosts and every shard count >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    web = SynthWeb(args.pages, args.hosts, args.links, args.same_host)
    # The actors import tools._simshard from this checkout (tools/ is not installed).
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    import ray

    keys = ("counts", "pages", "hosts", "links", "same_host", "seeds", "batch_urls", "linger")
    result: dict[str, Any] = {
        "machine": {
            **bu.machine_info(("numpy", "ray")),
            "load_start": bu.loadavg(),
            "git_start": bu.git_revision(REPO),
            "filesystem": bu.filesystem_of(args.workdir),
        },
        "config": {k: getattr(args, k) for k in keys},
        "rows": [],
    }
    temp = tempfile.mkdtemp(prefix="kvsim-", dir="/tmp")  # short: Ray's socket paths
    try:
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
                 object_store_memory=OBJECT_STORE, namespace=NAMESPACE, _temp_dir=temp,
                 configure_logging=False)
        if args.calibrate:
            result["calibration"] = calibrate(web, ray.remote(Sink), args.calibrate)
        actor_class = ray.remote(SimShard)
        for count in args.counts:
            print(f"{count} shards (load {bu.loadavg()})", file=sys.stderr, flush=True)
            result["rows"].append(run_count(count, args, web, actor_class))
    except (CheckFailed, ray.exceptions.RayError) as exc:  # RayError: e.g. a `ray stop` elsewhere
        result["error"] = f"{count} shards: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        print(f"sim_exchange: error: {result['error']}", file=sys.stderr)
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    result["machine"]["load_end"] = bu.loadavg()
    out = args.out or REPO / "bench-results" / f"sim-exchange-{bu.timestamp()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if result.get("calibration"):
        print("RayExchange.send to an idle no-op actor: " + ", ".join(
            f"{c['urls']} URLs ({bu.fmt_bytes(c['bytes'])}) {c['median_ms']:.2f} ms"
            for c in result["calibration"]) + " (median)")
    print(table(result["rows"]))
    print(f"{args.pages} pages, {args.hosts} hosts, {args.links} links a page; "
          f"load (1/5/15 min): start {result['machine']['load_start']}, "
          f"end {result['machine']['load_end']}")
    print(f"wrote {out}", file=sys.stderr)
    failed = [r for r in result["rows"] if not r["check_ok"]]
    for r in failed:
        print(f"{r['shards']} shards: check FAILED: {'; '.join(r['problems'])}", file=sys.stderr)
    return 1 if failed or "error" in result else 0


if __name__ == "__main__":
    raise SystemExit(main())
