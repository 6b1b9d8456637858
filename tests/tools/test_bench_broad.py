"""tools/bench_broad.py end to end at a tiny size, and the broad site it crawls.

Speed is never asserted (the benchmark is for that); what is asserted is that the
numbers it reports are real: the crawl fetched exactly the site's pages, met every
host, asked each host's robots.txt at most once across a restart, and polled a
non-zero process-tree RSS. The site half checks that nginx serves what
``BroadConfig`` says (the crawl's checks rest on it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tools.testweb.broadsite import LOG_NAME, ROBOTS_TXT, BroadConfig, read_log, write_nginx
from tools.testweb.export import nginx_serving

REPO = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
TOOL_TIMEOUT = 180  # seconds; the tiny run takes about 10 here

pytestmark = pytest.mark.system_packages("nginx-light")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, host: str, path: str) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, no proxy
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_broad_site_serves_its_pages_and_links_and_logs(tmp_path: Path) -> None:
    cfg = BroadConfig(hosts=30, pages_per_host=3, fanout=4, port=_free_port())
    write_nginx(cfg, tmp_path)
    with nginx_serving(tmp_path, cfg.port, NGINX):
        status, body = _get(cfg.port, "h1.test", "/")
        links = set(re.findall(r"href='([^']+)'", body.decode()))
        # its pages, its children h5..h8 and its parent h0
        assert links == {"/", "/p1.html", "/p2.html"} | {cfg.home(i) for i in (5, 6, 7, 8, 0)}
        assert status == 200 and b"<title>h1.test /</title>" in body
        assert _get(cfg.port, "h29.test", "/p2.html")[0] == 200
        assert _get(cfg.port, "h29.test", "/p3.html")[0] == 404  # past pages_per_host
        assert _get(cfg.port, "h2.test", "/robots.txt") == (200, ROBOTS_TXT.encode())
        # nginx logs a request after its answer is sent: a client may read the log first
        deadline = time.monotonic() + 30
        while True:
            rows, offset = read_log(tmp_path / "logs" / LOG_NAME)
            if len(rows) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    assert rows[-1] == ("h2.test", "/robots.txt", "200") and len(rows) == 4
    assert offset == (tmp_path / "logs" / LOG_NAME).stat().st_size
    # the tree reaches every host from h0, each through its parent
    seen, todo = {0}, [0]
    while todo:
        for j in cfg.linked_hosts(todo.pop()):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    assert seen == set(range(cfg.hosts)) and len(cfg.urls()) == cfg.pages


@pytest.mark.slow
def test_bench_broad_reports_real_numbers(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    hosts, pages = 200, 3
    proc = subprocess.run(
        [sys.executable, "tools/bench_broad.py", "--hosts", str(hosts), "--pages-per-host",
         str(pages), "--processes", "2", "--threads", "8", "--workdir", str(tmp_path),
         "--sample", "0.1", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res: dict[str, Any] = json.loads(out.read_text())
    assert "| peak tree RSS @100% hosts |" in proc.stdout
    full, rs = res["full"], res["restart"]
    # the full crawl: every page once, every host met, robots.txt once per host
    assert full["status"]["fetched"] == full["fetched"] == hosts * pages
    assert full["page_requests"]["distinct"] == hosts * pages
    assert full["hosts_met_end"] == full["robots"]["hosts"] == hosts
    assert full["robots"]["max"] == 1
    assert full["tree_processes"] == 3  # the supervisor and its two shards, summed
    assert 0 < full["peak_rss_50_bytes"] <= full["peak_rss_100_bytes"] <= full["peak_rss_bytes"]
    assert full["rss_ratio_100_50"] == pytest.approx(
        full["peak_rss_100_bytes"] / full["peak_rss_50_bytes"], abs=1e-3)
    assert full["pages_per_s"] > 0 and full["wall_s"] > 0
    assert full["points"] and all(p["pend_bytes"] > 0 for p in full["points"])
    # by pages served: peaks up to half and all of them, a timeline and its quarters
    half, every = full["peak_rss_half_pages_bytes"], full["peak_rss_all_pages_bytes"]
    assert 0 < half <= every <= full["peak_rss_bytes"]
    assert full["rss_ratio_pages"] == pytest.approx(every / half, abs=1e-3)
    times = [t for t, _, _ in full["timeline"]]
    served = [n for _, n, _ in full["timeline"]]
    assert times == sorted(times) and served == sorted(served)
    assert served[-1] == hosts * pages and all(rss > 0 for _, _, rss in full["timeline"][:-1])
    assert len(full["rates"]) == 4 and sum(full["rates"]) > 0
    assert full["disk_per_page"] == pytest.approx(
        full["disk_bytes"] / (hosts * pages), abs=0.1)
    assert full["disk_per_page"] > 100  # a record holds at least its URL and headers
    # the restart: a clean stop part-way, then the rest; robots.txt kept across it
    first = rs["run1"]
    assert first["end"] == "interrupted" and 0 < first["fetched"] < hosts * pages
    assert hosts // 2 <= first["stopped_at"]["hosts_met"] < hosts
    assert rs["status"]["fetched"] == hosts * pages
    assert rs["status"]["pending"] == 0
    assert rs["robots"]["hosts"] == hosts
    assert rs["robots"]["max"] <= 1 and rs["robots"]["requests"] == hosts
    assert rs["run2"]["peak_rss_bytes"] > 0
