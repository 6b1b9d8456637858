"""The broad-crawl benchmark (issue 15): many hosts x few pages on loopback. Not a test.

Usage (from the repository root; needs nginx: ``apt-get install -y nginx-light``):

    python tools/bench_broad.py                                # 100,000 hosts x 10 pages
    python tools/bench_broad.py --hosts 10000 --pages-per-host 10 --json out.json
    python tools/bench_broad.py --hosts 200 --pages-per-host 3 --processes 2   # a quick look

The site (tools/testweb/broadsite.py): hosts ``h0.test ... h{H-1}.test``, each with the
same P pages, every page linking to its host's pages and to the home pages of the host's
children in a 4-ary tree of hosts, so a crawl from ``h0.test/`` spreads host by host and
ends with all H x P pages. nginx builds every answer from its config (``return 200``
with the host's links from a ``map``); nothing is written per page. Why not the graph
site: at 100,000 hosts x 10 pages its generator alone took 66 s and 620 MB here, and its
host sizes are Zipf-skewed (one host with 8,750 pages, 8,000 hosts with 1-2), not a few
pages each. Why not the Python test web server: it is the same graph, and it would
take Python CPU from the crawler on a two-core machine (not measured here; nginx's one
worker used about 9 % of a core at 800 pages/s). Why not an export under nginx: a
million files (and the graph behind them). The broad config for 100,000 hosts is 14 MB,
written in 0.4 s; nginx starts in 0.6 s with about 55 MB per process. Names resolve
through the loopback DNS server (tools/testweb/dnsserver.py) to 127.0.0.1: 100,000
names load in 2 s and 50 MB, and the crawler asks once per host.

Method. Two crawls, each a fresh ``python -m crawler start`` on a fresh data directory,
with ``--broad --delay 0 --sitemaps off`` (sitemaps off: every host would add a 404 for
/sitemap.xml), ``--threads``, ``--per-host`` and ``--processes`` from the options:

1. the *full* crawl runs to the end. While it runs this script polls, every 50 ms, the
   sum of VmRSS over the crawler's process tree (supervisor + shards, from /proc as
   tools/bench_crawl.py does) and tails nginx's access log. A host is *met* once its
   robots.txt was requested (a crawl's first request to a host, robots.txt obeyed): the
   log is the cheapest count there is (no process, no store read) and it is what the
   crawler did, not what it says it did. Reported: the peak tree RSS up to 50 % of the
   hosts met, up to 100 % met, and to the end; the ratio peak@100 % / peak@50 % (target
   <= 1.15); the same by pages served (the peak up to half the site's pages and up to
   all of them: issue 31 §3's "RSS at 1.5M and 3M pages", ratio <= 1.10); a timeline
   every ``--sample`` seconds (pages served, tree RSS) and from it pages/s in each
   quarter of the run's time (flat, or decaying); the crawl directory's allocated
   bytes per page at the end; and at 25/50/75 % of the hosts met (``--points``), PendDB
   bytes per pending URL: the size of the shards' ``pend/`` directories over
   ``pending`` from ``python -m crawler status DIR --json`` (run beside the crawl,
   read-only; the directory is measured when status starts and when it ends, and the
   mean is used);
2. the *restart* crawl is stopped with one SIGINT (a clean stop) once half the hosts are
   met, then resumed with ``start --data DIR`` alone and run to the end. From the access
   log: robots.txt requests per host over both runs, max and mean (target <= 1: the
   answers are kept on disk, crawler/state/robotsstore.py), and page requests made
   twice (what a resume refetches). ``--no-restart`` skips it.

This script's own share (the DNS server's thread, the polling) was about 15 % of a core.
PendDB is reported two ways: per pending URL as asked, and per URL ever admitted
(pending + recorded), because ``pend/`` did not shrink during a crawl (the bulks
already handed out stay in its files: 13 MB with nothing pending at the end of 300,000
pages), so bytes per *pending* URL grows through a crawl while bytes per admitted URL
stays near flat.

Checks against the site (reported, not enforced): pages fetched (``status --json``'s
count over every run) should be H x P, and every host met. pages/s is the full crawl's fetched pages
over the engine's run time (its summary line); wall is the process's, start-up included.

Output: a table on stdout (progress on stderr) and JSON (``--json``, default
``bench-results/broad-<timestamp>.json``, git-ignored) with keys ``machine``, ``config``,
``full``, ``restart``. Nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

from crawler.state.shards import shard_dirs
from tools.testweb.broadsite import LOG_NAME, BroadConfig, read_log, write_nginx
from tools.testweb.dnsserver import DNSServer
from tools.testweb.export import nginx_serving

log, child_env, free_port = bu.log, bu.child_env, bu.free_port

REPO = Path(__file__).resolve().parents[1]
POLL = 0.05  # seconds between two samples of RSS and the log
LOG_FLUSH = 0.5  # nginx writes each log line when it answers: a margin only
STOP_WAIT = 300.0  # seconds a SIGINT-ed crawl may take to stop cleanly





class RequestLog:
    """What nginx was asked from ``offset`` on: robots.txt requests per host (the hosts
    met are its keys) and page requests per URL. ``update`` reads the new lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.robots: Counter[str] = Counter()
        self.pages: Counter[str] = Counter()
        self.other: Counter[str] = Counter()  # status -> count of non-200 answers
        self.served = 0  # 200 answers to page requests (sum(self.pages.values()), kept)

    def update(self) -> None:
        rows, self.offset = read_log(self.path, self.offset)
        for host, uri, status in rows:
            if uri == "/robots.txt":
                self.robots[host] += 1
            elif status == "200":
                self.pages[f"{host}{uri}"] += 1
                self.served += 1
            else:
                self.other[status] += 1

    @property
    def met(self) -> int:
        return len(self.robots)


def pend_bytes(data: Path) -> int:
    """Apparent size of every shard's ``pend/`` directory (0 before it exists)."""
    total = 0
    for shard in shard_dirs(str(data)):
        pend = os.path.join(shard, "pend")
        if os.path.isdir(pend):
            total += bu.disk_usage(pend)[0]
    return total


def status_json(data: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "crawler", "status", str(data), "--json"],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise bu.WorkerError(f"status failed ({proc.returncode}): {proc.stderr[-1000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


class _StatusProbe:
    """``status --json`` run beside the crawl (no wait), with pend/ measured around it."""

    def __init__(self, data: Path, fraction: float, met: int, elapsed: float) -> None:
        self.data = data
        self.point: dict[str, Any] = {"fraction": fraction, "hosts_met": met,
                                      "t_s": round(elapsed, 1)}
        self.before = pend_bytes(data)
        self.out = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "crawler", "status", str(data), "--json"],
            cwd=REPO, env=child_env(), stdout=self.out, stderr=subprocess.DEVNULL)

    def done(self) -> dict[str, Any] | None:
        """The point once status has answered (None while it runs)."""
        if self.proc.poll() is None:
            return None
        after = pend_bytes(self.data)
        self.out.seek(0)
        text = self.out.read().decode()
        self.out.close()
        p = self.point
        p["pend_bytes"] = (self.before + after) // 2
        if self.proc.returncode == 0 and text.strip():
            st = json.loads(text)
            p["pending"] = int(st["pending"])
            p["pending_bulks"] = int(st.get("pending_bulks") or 0)
            p["recorded"] = int(st["recorded"])
            n, admitted = p["pending"], p["pending"] + p["recorded"]
            p["bytes_per_pending"] = round(p["pend_bytes"] / n, 1) if n else None
            # PendDB keeps what it handed out until it is compacted: per URL ever admitted
            p["bytes_per_admitted"] = round(p["pend_bytes"] / admitted, 1) if admitted else None
        else:
            p["error"] = f"status exited {self.proc.returncode}"
        return p


def crawl(cmd: list[str], rlog: RequestLog, hosts: int, work: Path, tag: str, *,
          data: Path, pages: int, points: Sequence[float] = (),
          stop_at: float | None = None, timeout: float, sample: float = 30.0
          ) -> dict[str, Any]:
    """Run one crawler process to its end (or to a clean stop once ``stop_at`` of the
    hosts are met), polling its tree's RSS and the request log; returns what it saw,
    with a timeline every ``sample`` seconds (``[t_s, pages served, tree RSS]``; the
    last point is the end, its RSS 0: the tree is gone)."""
    out, err = work / f"{tag}.out", work / f"{tag}.err"
    todo = sorted(points)
    probe: _StatusProbe | None = None
    timeline: list[list[float]] = []
    result: dict[str, Any] = {"points": [], "load_before": bu.loadavg(),
                              "timeline": timeline}
    peak = peak50 = peak100 = procs = 0
    page_peak50 = page_peak100 = 0  # by pages served rather than hosts met
    served0 = rlog.served
    stopped_at: float | None = None
    with open(out, "wb") as fo, open(err, "wb") as fe:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=fo, stderr=fe)
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                elapsed = time.monotonic() - started
                rss, count = bu.tree_rss(proc.pid)
                peak, procs = max(peak, rss), max(procs, count)
                rlog.update()
                met = rlog.met
                if met * 2 < hosts:
                    peak50 = peak
                if met < hosts:
                    peak100 = peak
                served = rlog.served - served0
                if served * 2 < pages:
                    page_peak50 = peak
                if served < pages:
                    page_peak100 = peak
                # rss 0: the crawl has exited, not reaped yet (a zombie has no VmRSS):
                # no point of the timeline (the final one is added after the wait)
                if rss and (not timeline or elapsed - timeline[-1][0] >= sample):
                    timeline.append([round(elapsed, 1), served, rss])
                if probe is not None and (point := probe.done()) is not None:
                    result["points"].append(point)
                    probe = None
                if todo and met >= todo[0] * hosts and probe is None:
                    probe = _StatusProbe(data, todo.pop(0), met, elapsed)
                if stop_at is not None and stopped_at is None and met >= stop_at * hosts:
                    stopped_at = elapsed
                    result["stopped_at"] = {"t_s": round(elapsed, 1), "hosts_met": met}
                    proc.send_signal(signal.SIGINT)  # one: a clean stop
                limit = timeout if stopped_at is None else stopped_at + STOP_WAIT
                if elapsed > limit:
                    proc.kill()
                    result["killed"] = True
                time.sleep(POLL)
        except BaseException:  # Ctrl-C of the benchmark: leave no crawler behind
            proc.kill()
            proc.wait()
            raise
        wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
    if probe is not None:
        probe.proc.wait()
        if (point := probe.done()) is not None:
            result["points"].append(point)
    time.sleep(LOG_FLUSH)
    rlog.update()
    served = rlog.served - served0
    said = bu.crawl_summary(out.read_text())
    if said is None or (proc.returncode != 0 and stop_at is None):
        raise bu.WorkerError(f"{tag}: crawler exited {proc.returncode}: {err.read_text()[-2000:]}")
    line, summary = said
    result.update({
        "returncode": proc.returncode,
        "end": line.split(":", 1)[0].removeprefix("crawl "),
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),  # with the shards it reaped
        "fetched": int(summary["fetched"]),
        "crawl_s": float(summary["seconds"]),
        "pages_per_s": round(int(summary["fetched"]) / max(1e-9, float(summary["seconds"])), 1),
        "outcomes": summary.get("outcomes"),
        "peak_rss_bytes": peak,
        "tree_processes": procs,  # the most processes seen in the tree at one poll
        "hosts_met_end": rlog.met,
        # None: that share of the hosts was not met while this process ran
        "peak_rss_50_bytes": peak50 if rlog.met * 2 >= hosts and peak50 else None,
        "peak_rss_100_bytes": peak100 if rlog.met >= hosts and peak100 else None,
        # the same by pages served: the peak up to half of them, and up to all
        "peak_rss_half_pages_bytes": page_peak50 if served * 2 >= pages and page_peak50 else None,
        "peak_rss_all_pages_bytes": page_peak100 if served >= pages and page_peak100 else None,
    })
    timeline.append([round(wall, 1), served, 0])
    result["rates"] = quarter_rates(timeline)
    return result


def quarter_rates(timeline: Sequence[Sequence[float]]) -> list[float]:
    """Pages served a second in each quarter of the run's time, from the timeline
    (each quarter's rate between the samples nearest its ends): flat, or decaying."""
    if len(timeline) < 5:
        return []
    end = timeline[-1][0]
    rates = []
    for q in range(4):
        lo = min(timeline, key=lambda s: abs(s[0] - end * q / 4))
        hi = min(timeline, key=lambda s: abs(s[0] - end * (q + 1) / 4))
        rates.append(round((hi[1] - lo[1]) / max(1e-9, hi[0] - lo[0]), 1))
    return rates


def start_cmd(cfg: BroadConfig, data: Path, dns: tuple[str, int], args: argparse.Namespace
              ) -> list[str]:
    return [sys.executable, "-m", "crawler", "start", cfg.seed_url, "--data", str(data),
            "--nameserver", f"{dns[0]}:{dns[1]}", "--allow-private-ips", "--broad",
            "--delay", "0", "--sitemaps", "off", "--timeout", "30",
            "--threads", str(args.threads), "--per-host", str(args.per_host),
            "--processes", str(args.processes), "--quiet"]


def robots_stats(rlog: RequestLog) -> dict[str, Any]:
    counts = list(rlog.robots.values())
    return {"hosts": len(counts), "requests": sum(counts), "max": max(counts, default=0),
            "mean": round(sum(counts) / max(1, len(counts)), 4),
            "hosts_over_1": sum(1 for c in counts if c > 1)}


def page_stats(rlog: RequestLog) -> dict[str, Any]:
    return {"requests": sum(rlog.pages.values()), "distinct": len(rlog.pages),
            "repeated": sum(c - 1 for c in rlog.pages.values() if c > 1),
            "non_200": dict(rlog.other)}


def run_full(cfg: BroadConfig, dns: tuple[str, int], site_dir: Path, work: Path,
             args: argparse.Namespace) -> dict[str, Any]:
    data = work / "full"
    rlog = RequestLog(site_dir / "logs" / LOG_NAME)
    log(f"full crawl: {cfg.hosts} hosts x {cfg.pages_per_host} pages")
    r = crawl(start_cmd(cfg, data, dns, args), rlog, cfg.hosts, work, "full", data=data,
              pages=cfg.hosts * cfg.pages_per_host, points=args.points,
              timeout=args.timeout, sample=args.sample)
    r["status"] = _final_status(data)
    r["robots"] = robots_stats(rlog)
    r["page_requests"] = page_stats(rlog)
    p50, p100 = r["peak_rss_50_bytes"], r["peak_rss_100_bytes"]
    r["rss_ratio_100_50"] = round(p100 / p50, 3) if p50 and p100 else None
    h50, h100 = r["peak_rss_half_pages_bytes"], r["peak_rss_all_pages_bytes"]
    r["rss_ratio_pages"] = round(h100 / h50, 3) if h50 and h100 else None
    r["disk_bytes"] = bu.disk_usage(data)[1]  # allocated, every shard's files
    r["disk_per_page"] = round(r["disk_bytes"] / max(1, r["status"]["recorded"] or 0), 1)
    if not args.keep:
        shutil.rmtree(data, ignore_errors=True)
    return r


def run_restart(cfg: BroadConfig, dns: tuple[str, int], site_dir: Path, work: Path,
                args: argparse.Namespace) -> dict[str, Any]:
    data = work / "restart"
    rlog = RequestLog(site_dir / "logs" / LOG_NAME)
    log("restart crawl: run 1, stopped at half the hosts")
    pages = cfg.hosts * cfg.pages_per_host
    first = crawl(start_cmd(cfg, data, dns, args), rlog, cfg.hosts, work, "restart-1",
                  data=data, pages=pages, stop_at=0.5, timeout=args.timeout)
    robots_1 = robots_stats(rlog)
    log(f"  {first['end']} after {first['wall_s']} s, {first['fetched']} fetched; run 2")
    resume = [sys.executable, "-m", "crawler", "start", "--data", str(data), "--quiet"]
    second = crawl(resume, rlog, cfg.hosts, work, "restart-2", data=data, pages=pages,
                   timeout=args.timeout)
    r = {"run1": first, "run2": second, "robots_run1": robots_1, "robots": robots_stats(rlog),
         "page_requests": page_stats(rlog), "status": _final_status(data)}
    if not args.keep:
        shutil.rmtree(data, ignore_errors=True)
    return r


def _final_status(data: Path) -> dict[str, Any]:
    st = status_json(data)
    return {k: st.get(k) for k in ("state", "recorded", "fetched", "not_fetched", "pending",
                                   "classes")} | {"pend_bytes": pend_bytes(data)}


def table(result: dict[str, Any]) -> str:
    cfg, rows = result["config"], []
    full, rs = result.get("full"), result.get("restart")
    pages = cfg["hosts"] * cfg["pages_per_host"]
    if full:
        rows += [
            ("pages fetched (status, of site)", f"{full['status']['fetched']} of {pages}"),
            ("hosts met (robots.txt asked)", f"{full['hosts_met_end']} of {cfg['hosts']}"),
            ("peak tree RSS @50% hosts", bu.fmt_bytes(full["peak_rss_50_bytes"])),
            ("peak tree RSS @100% hosts", bu.fmt_bytes(full["peak_rss_100_bytes"])),
            ("peak tree RSS to the end", bu.fmt_bytes(full["peak_rss_bytes"])),
            ("RSS ratio 100%/50% (<= 1.15)", str(full["rss_ratio_100_50"])),
            ("peak tree RSS @50% / @100% of pages served",
             f"{bu.fmt_bytes(full['peak_rss_half_pages_bytes'])} / "
             f"{bu.fmt_bytes(full['peak_rss_all_pages_bytes'])} "
             f"(ratio {full['rss_ratio_pages']})"),
            ("pages/s by quarter of the run", ", ".join(f"{r:.0f}" for r in full["rates"])),
            ("disk per page (allocated)", f"{full['disk_per_page']:.0f} B "
                                          f"({bu.fmt_bytes(full['disk_bytes'])})"),
            ("pages/s (engine time)", f"{full['pages_per_s']:.0f}"),
            ("wall s (crawl s)", f"{full['wall_s']:.1f} ({full['crawl_s']:.1f})"),
            ("CPU s", f"{full['cpu_s']:.1f}"),
        ]
        for p in full["points"]:
            rows.append((f"PendDB B/pending @{p['fraction']:.0%} hosts",
                         f"{p.get('bytes_per_pending')} ({bu.fmt_bytes(p['pend_bytes'])} / "
                         f"{p.get('pending')} pending; {p.get('bytes_per_admitted')} B per "
                         "URL admitted)"))
        st = full["status"]
        rows.append(("PendDB at the end", f"{bu.fmt_bytes(st['pend_bytes'])}, "
                     f"{st['pending']} pending, {st['recorded']} recorded"))
        rows.append(("DNS queries per host", f"{full['dns_queries'] / cfg['hosts']:.2f}"))
        rows.append(("robots.txt per host, one run (max/mean)",
                     f"{full['robots']['max']} / {full['robots']['mean']}"))
    if rs:
        rows += [
            ("restart: stopped at", f"{rs['run1'].get('stopped_at', {}).get('hosts_met')} "
                                    f"hosts met, {rs['run1']['fetched']} fetched"),
            ("restart: pages fetched (status)", f"{rs['status']['fetched']} of {pages}"),
            ("restart: robots.txt per host (max/mean)",
             f"{rs['robots']['max']} / {rs['robots']['mean']} "
             f"({rs['robots']['hosts_over_1']} hosts > 1)"),
            ("restart: page requests repeated", str(rs["page_requests"]["repeated"])),
            ("restart: peak tree RSS run 1 / run 2",
             f"{bu.fmt_bytes(rs['run1']['peak_rss_bytes'])} / "
             f"{bu.fmt_bytes(rs['run2']['peak_rss_bytes'])}"),
        ]
    return bu.markdown_table(["measure", "value"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=100_000)
    p.add_argument("--pages-per-host", type=int, default=10)
    p.add_argument("--fanout", type=int, default=4, help="child hosts linked from each host")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="crawler shards (default: the CPUs)")
    p.add_argument("--threads", type=int, default=64, help="fetch threads in all")
    p.add_argument("--per-host", type=int, default=1, help="connections to one host at a time")
    p.add_argument("--points", type=lambda s: [float(x) for x in s.split(",")],
                   default=[0.25, 0.5, 0.75],
                   help="shares of the hosts met at which PendDB is measured "
                   "(default: %(default)s)")
    p.add_argument("--no-restart", action="store_true", help="skip the restart crawl")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds one crawl may run")
    p.add_argument("--sample", type=float, default=30.0,
                   help="seconds between two points of the full crawl's timeline")
    p.add_argument("--nginx-workers", type=int, default=1)
    p.add_argument("--workdir", help="parent of the temporary directory (default: the system's)")
    p.add_argument("--keep", action="store_true", help="keep the crawl directories")
    p.add_argument("--json", dest="out", help="results file "
                   "(default: bench-results/broad-<timestamp>.json, git-ignored)")
    args = p.parse_args(argv)
    nginx = bu.nginx_binary("bench_broad")
    out_path = Path(args.out or REPO / "bench-results" / f"broad-{bu.timestamp()}.json")
    cfg = BroadConfig(hosts=args.hosts, pages_per_host=args.pages_per_host,
                      fanout=args.fanout, port=free_port())
    result: dict[str, Any] = {
        "machine": bu.machine_info(()) | {"load_start": bu.loadavg(),
                                          "git": bu.git_revision(REPO)},
        "config": {"hosts": cfg.hosts, "pages_per_host": cfg.pages_per_host,
                   "fanout": cfg.fanout, "processes": args.processes, "threads": args.threads,
                   "per_host": args.per_host, "points": args.points},
    }
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="broad-work-") as tmp:
        work = Path(tmp)
        site_dir = work / "site"
        started = time.monotonic()
        write_nginx(cfg, site_dir, workers=args.nginx_workers)
        dns = DNSServer(dict.fromkeys(cfg.host_names(), "127.0.0.1"))
        log(f"site written in {time.monotonic() - started:.1f} s; starting nginx and DNS")
        with nginx_serving(site_dir, cfg.port, nginx), dns:
            result["site_setup_s"] = round(time.monotonic() - started, 2)
            result["full"] = run_full(cfg, dns.address, site_dir, work, args)
            result["full"]["dns_queries"] = len(dns.log)
            dns.clear_log()
            if not args.no_restart:
                result["restart"] = run_restart(cfg, dns.address, site_dir, work, args)
                result["restart"]["dns_queries"] = len(dns.log)
    bu.write_results(out_path, result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
