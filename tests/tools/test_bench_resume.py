"""tools/bench_resume.py end to end at a tiny size, and the catch-all web it crawls.

Speed is never asserted; what is asserted is that the numbers are real: every run
fetched pages from the web it was given, the resumed runs wrote into the big crawl,
the compaction was the running crawl's, and a kill -9 lost no more records than nginx
served to the killed run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tools._benchutil import free_port
from tools.testweb.broadsite import write_catchall
from tools.testweb.export import nginx_serving

REPO = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
TOOL_TIMEOUT = 300  # seconds; the tiny run takes about 20 here

pytestmark = pytest.mark.system_packages("nginx-light")


def _get(port: int, host: str, path: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, no proxy
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_the_catch_all_web_answers_every_path_with_two_new_links(tmp_path: Path) -> None:
    port = free_port()
    write_catchall(tmp_path, port)
    with nginx_serving(tmp_path, port, NGINX):
        seen: set[str] = set()
        for host, path in (("h3.test", "/news/a-1"), ("h77.test", "/x"), ("h3.test", "/x")):
            status, body = _get(port, host, path)
            assert status == 200 and f"<title>{host}{path}</title>" in body
            links = re.findall(r"href='([^']+)'", body)
            assert len(links) == 2 and not seen & set(links)
            seen |= set(links)
        status, robots = _get(port, "h3.test", "/robots.txt")
        assert status == 200 and "Disallow:\n" in robots and "Disallow: /" not in robots


@pytest.mark.slow
def test_bench_resume_runs_resume_fresh_compact_and_a_kill_on_a_seedscale_crawl(
        tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "seed"
    built = subprocess.run(
        [sys.executable, "tools/seedscale.py", "--pages", "600", "--pending", "900",
         "--hosts", "40", "--port", str(port), "--data", str(data), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False)
    assert built.returncode == 0, built.stderr[-2000:]
    out = tmp_path / "r.json"
    ran = subprocess.run(
        [sys.executable, "tools/bench_resume.py", "--data", str(data), "--port", str(port),
         "--hosts", "40", "--seconds", "1", "--threads", "16", "--fresh-seeds", "30",
         "--compact", "--kill", "--workdir", str(tmp_path), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = json.loads(out.read_text())
    for tag in ("resume", "fresh", "compact", "killed", "after-kill"):
        r = result[tag]
        assert r["pages"] > 0 and r["peak_rss_bytes"] >= r["peak_anon_bytes"] > 0, (tag, r)
        assert 0 <= r["first_request_s"] <= r["first_page_s"]
    compact = result["compact"]
    assert compact["side_s"] > 0 and compact["pages_per_s_before"] > 0
    assert compact["side_output"].count("(by the running crawl)") == 2
    assert result["killed"]["returncode"] == -9
    assert result["resume"]["returncode"] == result["after-kill"]["returncode"] == 130
    kill = result["kill"]
    assert 600 < kill["before"] <= kill["after_killed"]
    assert kill["after_killed"] - kill["before"] <= kill["served_killed"]
    assert kill["after_killed"] < kill["after_resume"]
    assert "resume / fresh pages/s" in ran.stdout
    assert not list(tmp_path.glob("resume-work-*"))  # its work directory is gone
