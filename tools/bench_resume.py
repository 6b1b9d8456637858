"""Living in a crawl of the original's size (issue 31 §2): resume it, kill it, resume it.

Usage (from the repository root; needs nginx: ``apt-get install -y nginx-light``):

    python tools/seedscale.py --data /tmp/seed20m --port 8391       # 27 min at 20.4M pages
    python tools/bench_resume.py --data /tmp/seed20m --port 8391 --seconds 180 --compact --kill

The crawl directory must be one tools/seedscale.py built with ``--port``: its URLs
are ``http://h{i}.test:PORT/...``. The web behind them (tools/testweb/broadsite.py's
catch-all, served by nginx on 127.0.0.1:PORT) answers every path of every host with a
small page linking to two new paths of the same host, and the loopback DNS server
answers ``h0.test ... h{H-1}.test`` with 127.0.0.1. Nothing leaves loopback.

Runs, each one ``python -m crawler start`` with the same options (``--broad --delay 0
--sitemaps off``, ``--threads``), stopped after ``--seconds`` of crawling:

1. *resume*: ``start --data DIR`` on the big crawl (it changes that directory: the
   pages it fetches are recorded there);
2. *fresh*: the same crawl from an empty directory, its seeds ``--fresh-seeds`` URLs
   taken from the big crawl's pending bulks, one a bulk (many hosts, the same kind of
   URL);
3. with ``--compact``: *compact*, the big crawl resumed, ``python -m crawler compact
   DIR`` started ``--seconds`` after its first page (the running shards compact one
   after the other), the crawl stopped ``--seconds`` after the command ends: the
   compaction's time and the crawl's pages/s before, during and after it;
4. with ``--kill``: *killed*, the big crawl resumed and SIGKILLed after half the
   time, then *after-kill*, resumed again (its open rebuilds what the kill left).

For each run, from nginx's access log and /proc: the seconds from the process's start
to its first request and first page request (the open of every store, index loads or
rebuilds included), pages/s (page requests answered 200, from the first to the stop,
and over the last half of the window), the crawler tree's RSS (peak, and the median
of one sample a second once pages flow) and its anonymous part (RssAnon: RSS also
counts the stores' mapped file pages, which the kernel drops when memory is short),
the seconds a SIGINT took to stop it. The
ratio resume/fresh pages/s is the issue's target (>= 0.9); the tree RSS target is
<= 1.2 GB. For the kill: the records in MainDB (kvstore's count, every shard) before
the killed run, after it and after the next, against the pages nginx served: what the
kill lost is at most what was in flight.

Output: a table on stdout (progress on stderr) and JSON (``--json``, default
``bench-results/resume-<timestamp>.json``, git-ignored).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

import kvstore
from crawler.state.pages import decode_bulk
from crawler.state.shards import shard_dirs
from tools.testweb.broadsite import LOG_NAME, read_log, write_catchall
from tools.testweb.dnsserver import DNSServer
from tools.testweb.export import nginx_serving
from tools.testweb.graph import host_name

log = bu.log
REPO = Path(__file__).resolve().parents[1]
SAMPLE = 1.0  # seconds between two samples of the tree's RSS (0.1 before the first page)
STOP_WAIT = 600.0  # seconds a SIGINT-ed crawl may take to stop


def pending_sample(data: str, count: int) -> list[str]:
    """Up to ``count`` pending URLs of the crawl, the first of each bulk (spread over many
    hosts: 1,534 hosts in 5,000 URLs of a 1M-page seedscale crawl), an equal share from
    each shard."""
    dirs = shard_dirs(data)
    urls: list[str] = []
    for i, d in enumerate(dirs):
        with kvstore.open(os.path.join(d, "pend"), readonly=True) as pend:
            for key in pend:
                if len(urls) >= count * (i + 1) // len(dirs):
                    break
                urls += [e.url for e in decode_bulk(pend[key])[:1]]
    return urls


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it, parents first (none is left to
    notice the others' death)."""
    todo = [pid]
    while todo:
        p = todo.pop()
        todo += bu.child_pids(p)
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def records(data: str) -> int:
    """Page records in every shard's MainDB (kvstore's count: the key index, no record read)."""
    total = 0
    for d in shard_dirs(data):
        with kvstore.open(os.path.join(d, "main"), readonly=True) as main:
            total += len(main)
    return total


def run(cmd: list[str], access: Path, work: Path, tag: str, seconds: float,
        stop: signal.Signals, side: list[str] | None = None) -> dict[str, Any]:
    """Run one crawler until ``seconds`` after its first page request (or its end), then
    ``stop`` it; what nginx served it and its tree's RSS. With ``side``, that command
    starts ``seconds`` after the first page and the stop comes ``seconds`` after it
    ends: pages/s before, during and after it."""
    offset = access.stat().st_size if access.exists() else 0
    out, err = work / f"{tag}.out", work / f"{tag}.err"
    rss: list[tuple[float, int, int]] = []  # (seconds, VmRSS, RssAnon) of the tree
    pages: list[float] = []  # seconds since start of each page request answered 200
    first_request = first_page = stopped = side_start = side_end = None
    side_proc: subprocess.Popen[bytes] | None = None
    requests = robots = 0
    with open(out, "wb") as fo, open(err, "wb") as fe:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, env=bu.child_env(), stdout=fo, stderr=fe)
        try:
            while proc.poll() is None:
                now = time.monotonic() - started
                rss.append((now, bu.tree_rss(proc.pid)[0], bu.tree_rss(proc.pid, "RssAnon")[0]))
                rows, offset = read_log(access, offset)
                for _host, uri, status in rows:
                    requests += 1
                    first_request = now if first_request is None else first_request
                    if uri == "/robots.txt":
                        robots += 1
                    elif status == "200":
                        pages.append(now)
                        first_page = now if first_page is None else first_page
                if side and side_proc is None and first_page is not None \
                        and now >= first_page + seconds:
                    side_start = now
                    with open(work / f"{tag}.side", "wb") as so:
                        side_proc = subprocess.Popen(side, cwd=REPO, env=bu.child_env(),
                                                     stdout=so, stderr=subprocess.STDOUT)
                if side_proc is not None and side_end is None and side_proc.poll() is not None:
                    side_end = now
                due = (None if first_page is None else first_page + seconds if not side
                       else side_end + seconds if side_end is not None else None)
                if stopped is None and due is not None and now >= due:
                    stopped = now
                    if stop == signal.SIGKILL:  # a power cut: the shards die with it
                        kill_tree(proc.pid)
                    else:
                        proc.send_signal(stop)
                if stopped is not None and now > stopped + STOP_WAIT:
                    proc.kill()
                time.sleep(SAMPLE if first_page is not None else 0.1)
        except BaseException:  # Ctrl-C of the benchmark: leave no crawler behind
            proc.kill()
            proc.wait()
            if side_proc is not None:
                side_proc.kill()
            raise
        ended = time.monotonic() - started
    time.sleep(0.5)  # nginx logs a request once answered
    rows, offset = read_log(access, offset)
    pages += [ended] * sum(1 for _h, uri, st in rows if uri != "/robots.txt" and st == "200")
    if first_page is None:
        raise bu.WorkerError(f"{tag}: no page fetched (exit {proc.returncode}): "
                             f"{err.read_text()[-2000:]}")
    end = stopped if stopped is not None else ended
    window = [t for t in pages if t <= end]
    half = first_page + (end - first_page) / 2
    flowing = sorted(r for t, r, _ in rss if first_page <= t <= end)
    anon = sorted(a for t, _, a in rss if first_page <= t <= end)
    return {
        "returncode": proc.returncode,
        "first_request_s": round(first_request or 0.0, 1),
        "first_page_s": round(first_page, 1),
        "crawl_s": round(end - first_page, 1),
        "pages": len(window),
        "pages_per_s": round(len(window) / max(1e-9, end - first_page), 1),
        "pages_per_s_second_half": round(sum(1 for t in window if t >= half)
                                         / max(1e-9, end - half), 1),
        "requests": requests, "robots_requests": robots,
        "peak_rss_bytes": max((r for _, r, _ in rss), default=0),
        "median_rss_bytes": flowing[len(flowing) // 2] if flowing else None,
        "peak_anon_bytes": max((a for _, _, a in rss), default=0),
        "median_anon_bytes": anon[len(anon) // 2] if anon else None,
        "stop_s": round(ended - end, 1) if stopped is not None else None,
        "pages_after_stop": len(pages) - len(window),
        **(_segments(window, first_page, side_start, side_end, end, work / f"{tag}.side")
           if side_start is not None else {}),
    }


def _segments(pages: list[float], first: float, start: float, stop: float | None,
              end: float, output: Path) -> dict[str, Any]:
    """pages/s before, during and after the side command, and what it printed."""
    stop = end if stop is None else stop

    def rate(a: float, b: float) -> float:
        return round(sum(1 for t in pages if a <= t < b) / max(1e-9, b - a), 1)

    return {"side_s": round(stop - start, 1), "pages_per_s_before": rate(first, start),
            "pages_per_s_during": rate(start, stop), "pages_per_s_after": rate(stop, end),
            "side_output": output.read_text(errors="replace")[-4000:]}


def start_cmd(data: Path, dns: tuple[str, int], args: argparse.Namespace,
              *extra: str) -> list[str]:
    return [sys.executable, "-m", "crawler", "start", "--data", str(data), *extra,
            "--nameserver", f"{dns[0]}:{dns[1]}", "--allow-private-ips", "--broad",
            "--delay", "0", "--sitemaps", "off", "--timeout", "30",
            "--threads", str(args.threads), "--quiet"]


def table(result: dict[str, Any]) -> str:
    rows = []
    for tag in ("resume", "fresh", "compact", "killed", "after-kill"):
        r = result.get(tag)
        if r is None:
            continue
        rows.append([tag, f"{r['first_request_s']}", f"{r['first_page_s']}",
                     f"{r['pages_per_s']}", f"{r['pages_per_s_second_half']}",
                     bu.fmt_bytes(r["peak_rss_bytes"]), bu.fmt_bytes(r["median_rss_bytes"]),
                     bu.fmt_bytes(r["peak_anon_bytes"]), bu.fmt_bytes(r["median_anon_bytes"]),
                     "-" if r["stop_s"] is None else f"{r['stop_s']}"])
    text = bu.markdown_table(["run", "first request s", "first page s", "pages/s",
                              "pages/s 2nd half", "peak tree RSS", "median tree RSS",
                              "peak anon", "median anon", "stop s"], rows)
    if "fresh" in result and "resume" in result:
        ratio = result["resume"]["pages_per_s"] / max(1e-9, result["fresh"]["pages_per_s"])
        text += f"\nresume / fresh pages/s: {ratio:.2f} (target >= 0.9)"
    if "compact" in result:
        c = result["compact"]
        text += (f"\ncompact during the crawl: {c['side_s']} s; pages/s before "
                 f"{c['pages_per_s_before']}, during {c['pages_per_s_during']}, after "
                 f"{c['pages_per_s_after']}\n{c['side_output'].strip()}")
    if "kill" in result:
        k = result["kill"]
        text += (f"\nrecords: {k['before']:,} before, {k['after_killed']:,} after the kill "
                 f"({k['served_killed']:,} pages served to the killed run), "
                 f"{k['after_resume']:,} after the next run "
                 f"({k['served_after']:,} served to it)")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a crawl tools/seedscale.py built with --port")
    p.add_argument("--port", type=int, required=True, help="the port its URLs name")
    p.add_argument("--hosts", type=int, default=1_000_000, help="hosts h0.test... to resolve")
    p.add_argument("--seconds", type=float, default=180.0, help="crawling time of each run")
    p.add_argument("--threads", type=int, default=500, help="fetch threads in all")
    p.add_argument("--fresh-seeds", type=int, default=100_000,
                   help="seeds of the fresh crawl, from the big crawl's pending URLs (0: no "
                   "fresh run)")
    p.add_argument("--compact", action="store_true",
                   help="also a run during which `crawler compact` compacts the big crawl")
    p.add_argument("--kill", action="store_true", help="also the kill -9 and resume runs")
    p.add_argument("--workdir", help="parent of the temporary directory (default: the system's)")
    p.add_argument("--json", dest="out", help="results file "
                   "(default: bench-results/resume-<timestamp>.json, git-ignored)")
    args = p.parse_args(argv)
    nginx = bu.nginx_binary("bench_resume")
    data = Path(args.data)
    if not shard_dirs(str(data)):
        raise SystemExit(f"bench_resume: {data}: no crawl there")
    out_path = Path(args.out or REPO / "bench-results" / f"resume-{bu.timestamp()}.json")
    result: dict[str, Any] = {
        "machine": bu.machine_info(()) | {"load_start": bu.loadavg(),
                                          "git": bu.git_revision(REPO)},
        "config": {"data": str(data), "seconds": args.seconds, "threads": args.threads,
                   "fresh_seeds": args.fresh_seeds, "hosts": args.hosts},
    }
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="resume-work-") as tmp:
        work = Path(tmp)
        seeds = work / "seeds.txt"
        if args.fresh_seeds:
            seeds.write_text("\n".join(pending_sample(str(data), args.fresh_seeds)) + "\n")
        write_catchall(work / "site", args.port)
        access = work / "site" / "logs" / LOG_NAME
        log(f"resolving {args.hosts:,} hosts; starting nginx on 127.0.0.1:{args.port}")
        dns = DNSServer({host_name(i): "127.0.0.1" for i in range(args.hosts)})
        with nginx_serving(work / "site", args.port, nginx), dns:
            log("resume")
            result["resume"] = run(start_cmd(data, dns.address, args), access, work, "resume",
                                   args.seconds, signal.SIGINT)
            if args.fresh_seeds:
                log("fresh")
                result["fresh"] = run(
                    start_cmd(work / "fresh", dns.address, args, "--seeds-file", str(seeds)),
                    access, work, "fresh", args.seconds, signal.SIGINT)
            if args.compact:
                log("compact")
                result["compact"] = run(
                    start_cmd(data, dns.address, args), access, work, "compact", args.seconds,
                    signal.SIGINT, side=[sys.executable, "-m", "crawler", "compact", str(data)])
            if args.kill:
                before = records(str(data))
                log("killed")
                result["killed"] = run(start_cmd(data, dns.address, args), access, work,
                                       "killed", args.seconds / 2, signal.SIGKILL)
                after_killed = records(str(data))
                log("after-kill")
                result["after-kill"] = run(start_cmd(data, dns.address, args), access, work,
                                           "after-kill", args.seconds, signal.SIGINT)
                result["kill"] = {"before": before, "after_killed": after_killed,
                                  "served_killed": result["killed"]["pages"]
                                  + result["killed"]["pages_after_stop"],
                                  "after_resume": records(str(data)),
                                  "served_after": result["after-kill"]["pages"]
                                  + result["after-kill"]["pages_after_stop"]}
    bu.write_results(out_path, result, table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
