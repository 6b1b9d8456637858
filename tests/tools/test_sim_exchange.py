"""tools/sim_exchange.py end to end at a tiny size: a private loopback Ray cluster, 1 and 2
shard actors over real frontiers, every page of the synthetic web fetched exactly once.

Speed is never asserted (that is what the tool is for); what is asserted is that the
simulation crawls what it says (its check, and the counters it is computed from) and writes
the JSON its docstring documents.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools._simshard import SynthWeb

pytest.importorskip("ray", reason="the [ray] extra is not installed")  # CI installs it

REPO = Path(__file__).resolve().parents[2]
TOOL_TIMEOUT = 120  # seconds; a run takes ~15 s here, most of it Ray starting
PAGES = 300
ROW_FIELDS = {
    "shards", "wall_s", "fetched", "admitted", "offered", "sent_urls", "sent_batches",
    "pages_per_s", "admitted_per_s", "offered_per_s", "sent_urls_per_s", "urls_per_batch",
    "send_ms", "admit_ms", "forwarder_busy", "rss_bytes", "pss_bytes", "tree_rss_bytes",
    "actor_start_s", "check_ok", "problems", "shards_detail",
}


def test_synth_web_is_deterministic_and_bounded() -> None:
    web = SynthWeb(pages=1000, hosts=7, links=12, same_host=0.5)
    links = web.links_of(41)
    assert links == web.links_of(41)
    assert links[:2] == [web.url(83), web.url(84)]  # the tree links come first
    assert len(links) == len(set(links)) <= 12
    assert all(0 <= web.page_of(u) < 1000 for u in links)
    on_host = [u for u in links[2:] if u.startswith(f"http://h{41 % 7}.sim/")]
    assert on_host  # 10 draws at 0.5 (+ the random ones landing there): never none
    assert web.links_of(999) == [u for u in web.links_of(999) if web.page_of(u) < 1000]


@pytest.mark.slow
def test_sim_exchange_fetches_every_page_once(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    env = dict(
        os.environ,
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # every Ray server on 127.0.0.1
        RAY_USAGE_STATS_ENABLED="0",
    )
    proc = subprocess.run(
        [sys.executable, "tools/sim_exchange.py", "--shards", "1,2", "--pages", str(PAGES),
         "--hosts", "50", "--calibrate", "3", "--workdir", str(tmp_path), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res) >= {"machine", "config", "calibration", "rows"}
    assert [c["urls"] for c in res["calibration"]] == [100, 1000, 5000]
    assert all(c["calls"] == 3 and c["bytes"] > 0 for c in res["calibration"])
    assert res["config"]["pages"] == PAGES
    rows = res["rows"]
    assert [r["shards"] for r in rows] == [1, 2]
    for r in rows:
        assert set(r) >= ROW_FIELDS
        assert r["check_ok"], r["problems"]
        assert r["fetched"] == r["admitted"] == PAGES
        assert [d["fetched"] for d in r["shards_detail"]] and all(
            d["misrouted"] == 0 for d in r["shards_detail"]
        )
    one, two = rows
    assert one["sent_batches"] == one["sent_urls"] == 0  # one shard has nobody to send to
    assert two["sent_batches"] > 0 and two["sent_urls"] > 0  # links crossed over Ray
    received = sum(d["received_urls"] for d in two["shards_detail"])
    assert received == two["sent_urls"]  # what was sent was admitted durably at its owner
    assert "| shards |" in proc.stdout and "FAILED" not in proc.stdout
    assert not list(tmp_path.glob("sim-exchange-*"))  # the shards' stores are cleaned up
