"""JavaScript rendering (--render-js) in a real headless Chromium, against the test web's
scripted pages (tools/testweb/scripted.py): links made by inline scripts, by a timer,
from fetch()ed JSON and by an external script; a page that never settles and one that
allocates until its tab dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import cli_args, config_for, record, records, run_crawl, start_cli, status_json

from crawler.config import CrawlerConfig
from crawler.net.browser import Answer, Browser
from crawler.run.engine import Engine
from crawler.run.subfetch import SubTask
from crawler.web.urls import normalize, parse
from tools.testweb import TestWeb, fault
from tools.testweb.graph import SiteConfig

MakeWeb = Callable[..., TestWeb]
RENDER_TIMEOUT = 5.0  # what the endless page costs a crawl (under load a page may take 2 s)
H0 = r"^h0\.test$"


def scripted_web(make: MakeWeb) -> TestWeb:
    return make([fault("scripts")], hosts=2, pages=12, seed=7)


def assert_cut_as_designed(web: TestWeb, data: Path) -> None:
    """Only the endless page and the memory hog had their renders cut."""
    cut = {u: r.render for u, r in records(data).items() if r.render not in ("", "ok")}
    assert set(cut) == {scripts(web, "endless.html"), scripts(web, "hog.html")}, cut
    assert cut[scripts(web, "endless.html")] == "render_timeout", cut


def wait_requested(web: TestWeb, proc: subprocess.Popen[bytes], url: str) -> None:
    """Until the running crawl ``proc`` has requested ``url`` (two minutes at most)."""
    deadline = time.monotonic() + 120
    while url not in requested(web):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def resume_and_match(web: TestWeb, data: Path, args: list[str]) -> None:
    """Run the crawl ``args`` started again (renders cut at 5 s) to its end: the designed
    renders are cut, the rest matches the oracle."""
    at = args.index("--render-timeout") + 1
    done = subprocess.run([*args[:at], "5", *args[at + 1 :]], capture_output=True,
                          timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert_cut_as_designed(web, data)
    got = {u for u, r in records(data).items() if r.status}
    assert got == set(web.oracle.crawl(render={"h0.test"}).fetched)
    assert record(data, scripts(web, "endless.html")).render == "render_timeout"


def requested(web: TestWeb) -> list[str]:
    return [r.url for r in web.log.records()]


def scripts(web: TestWeb, name: str) -> str:
    return web.site.url("h0.test", "/x/scripts/" + name)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path, Engine]]:
    """One rendered crawl of h0.test, shared by the tests that read it."""
    web = TestWeb(SiteConfig(hosts=2, pages=12, seed=7), faults=[fault("scripts")]).start()
    data = tmp_path_factory.mktemp("rendered") / "c"
    try:
        engine = run_crawl(web, data, render_js=(H0,), render_timeout=RENDER_TIMEOUT,
                           render_memory=64, status_interval=0.2)
        yield web, data, engine
    finally:
        web.stop()


@pytest.mark.system_packages("chromium")
def test_rendered_crawl_fetches_what_the_oracle_renders(
    rendered: tuple[TestWeb, Path, Engine],
) -> None:
    web, data, engine = rendered
    assert engine.complete
    want = web.oracle.crawl(render={"h0.test"})
    plain = web.oracle.crawl()
    assert want.fetched - plain.fetched, "the site has script-only pages"
    recs = records(data)
    assert {u for u, r in recs.items() if r.status} == set(want.fetched)
    # Nothing else reached the server: no second request for a page the browser showed,
    # nothing for images or favicons, and each script and JSON file once.
    log = requested(web)
    assert set(log) == set(want.requests)
    assert sorted(set(log)) == sorted(log), "a URL requested twice"
    assert want.subresources == {scripts(web, "app.js"), scripts(web, "data.json")}


@pytest.mark.system_packages("chromium")
def test_render_outcomes_are_recorded_with_the_dom(
    rendered: tuple[TestWeb, Path, Engine],
) -> None:
    web, data, engine = rendered
    for name, target in (("inline.html", "t/inline.html"), ("timeout.html", "t/timeout.html"),
                         ("fetch.html", "t/fetch-2.html"), ("external.html", "t/external.html")):
        rec = record(data, scripts(web, name))
        assert rec.render == "ok", name
        assert f'href="{target}"'.encode() in rec.dom, name
        assert f'href="{target}"'.encode() not in rec.body, name  # only the DOM has it
    never = record(data, scripts(web, "endless.html"))
    assert never.render == "render_timeout" and never.dom == b""
    hog = record(data, scripts(web, "hog.html"))
    assert hog.render in ("render_crashed", "render_memory") and hog.dom == b""
    # A cut render keeps the server's links: the page after each was fetched.
    for name in ("t/after-endless.html", "t/after-hog.html"):
        assert record(data, scripts(web, name)).status == 200
    # Pages of hosts not matched by --render-js are not rendered.
    others = [r for u, r in records(data).items() if "//h1.test" in u and r.status == 200]
    assert others and all(r.render == "" for r in others)
    snap = status_json(data)
    failed = sum(1 for r in records(data).values() if r.render not in ("", "ok"))
    assert snap["rendered"] == sum(1 for r in records(data).values() if r.render == "ok")
    assert snap["render_failed"] == failed == 2
    assert snap["render_queued"] == snap["rendering"] == 0
    assert snap["subrequests"] == 2 and snap["browser_starts"] == 1
    shown = subprocess.run(
        [sys.executable, "-m", "crawler", "status", str(data)], capture_output=True, text=True,
        timeout=60, env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    assert shown.returncode == 0, shown.stderr
    assert f"renders (last run): {snap['rendered']} rendered, 2 cut, 0 queued" in shown.stdout


def test_without_rendering_exactly_the_script_only_pages_are_missing(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = scripted_web(make_testweb)
    run_crawl(web, tmp_path / "c")
    got = {u for u, r in records(tmp_path / "c").items() if r.status}
    plain = web.oracle.crawl()
    assert got == set(plain.fetched)
    missing = web.oracle.crawl(render={"h0.test"}).fetched - got
    assert missing == {scripts(web, t) for t in (
        "t/inline.html", "t/timeout.html", "t/fetch-1.html", "t/fetch-2.html",
        "t/external.html")}
    assert not any(u.endswith((".js", ".json")) for u in requested(web))
    assert all(r.render == "" and r.dom == b"" for r in records(tmp_path / "c").values())


@pytest.mark.system_packages("chromium")
def test_a_browser_killed_mid_crawl_is_restarted_and_loses_nothing(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = scripted_web(make_testweb)
    # A render time limit with room: the pages the kill cut are rendered again at once on
    # a browser just started, beside the endless page spinning a core. Once in CI one of
    # them lost its script's link (the render outcomes were not printed then; they are now).
    engine = Engine(config_for(web, tmp_path / "c", render_js=(H0,),
                               render_timeout=2 * RENDER_TIMEOUT, render_memory=64))
    engine.add_seeds([web.seed_url])
    killed: list[int] = []

    def kill_once() -> None:  # kill the browser while it holds the endless page
        endless = scripts(web, "endless.html")
        while not killed and not engine.stopping_event.is_set():
            if endless in requested(web) and engine.renderer and engine.renderer.browser.pid:
                time.sleep(0.5)
                pid = engine.renderer.browser.pid
                if pid is not None:
                    os.killpg(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.02)

    killer = threading.Thread(target=kill_once, daemon=True)
    killer.start()
    assert engine.run()
    killer.join()
    assert killed
    assert engine.renderer is not None and engine.renderer.browser.starts == 2
    got = {u for u, r in records(tmp_path / "c").items() if r.status}
    renders = {u: r.render for u, r in records(tmp_path / "c").items() if r.render}
    # why, if not: every render's outcome, whole (a dict would be cut short in the report)
    assert got == set(web.oracle.crawl(render={"h0.test"}).fetched), str(sorted(renders.items()))
    # The page the browser died on was rendered again, and cut by its own time limit.
    assert record(tmp_path / "c", scripts(web, "endless.html")).render == "render_timeout"


@pytest.mark.system_packages("chromium")
def test_a_full_render_pool_holds_only_the_rendered_hosts(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """Workers never wait on the browser: while every place of the pool is taken, the
    rendered host's URLs wait (nothing of it is fetched) and the other hosts' go on.
    Sitemaps off: h0's /sitemap.xml is no page to render, and fetched while the pool is
    full (on a loaded machine within the window watched below), rightly."""
    web = scripted_web(make_testweb)
    seeds = [web.site.url("h0.test"), web.site.url("h1.test")]
    engine = Engine(config_for(web, tmp_path / "c", render_js=(H0,), render_timeout=RENDER_TIMEOUT,
                               render_memory=64, sitemaps="off"))
    engine.add_seeds(seeds)
    assert engine.renderer is not None
    held = 0
    while engine.renderer.reserve():
        held += 1
    assert held == 2 * engine.config.render_tabs
    result: list[bool] = []
    runner = threading.Thread(target=lambda: result.append(engine.run()), daemon=True)
    runner.start()
    deadline = time.monotonic() + 60
    while sum("//h1.test" in u and not u.endswith("/robots.txt") for u in requested(web)) < 3:
        assert time.monotonic() < deadline and runner.is_alive()
        time.sleep(0.05)
    time.sleep(0.5)
    assert [u for u in requested(web) if "//h0.test" in u and not u.endswith("/robots.txt")] == []
    for _ in range(held):
        engine.renderer.unreserve()
    runner.join(timeout=120)
    assert result == [True]
    got = {u for u, r in records(tmp_path / "c").items() if r.status}
    assert got == set(web.oracle.crawl(seeds, render={"h0.test"}).fetched)


@pytest.mark.system_packages("chromium")
def test_scripts_cannot_reach_private_addresses(make_testweb: MakeWeb, tmp_path: Path) -> None:
    """Without --allow-private-ips a script's request to a loopback or private address is
    refused before any connection; the browser itself reaches nothing on its own."""
    web = make_testweb(hosts=2, pages=4, seed=3)
    port = web.site.http_port
    engine = Engine(config_for(web, tmp_path / "c", allow_private_ips=False, render_all=True))
    page = web.site.url("h0.test", "/page.html")
    body = f"""<html><body><script>
      for (const u of ["http://127.0.0.1:{port}/a.json", "http://h1.test:{port}/b.json",
                       "http://10.0.0.1/c.json"])
        fetch(u).then(r => r.json()).then(d => {{
          const a = document.createElement("a"); a.href = d.href; document.body.append(a);
        }}).catch(() => {{}});
      new WebSocket("ws://127.0.0.1:{port}/socket");
      const i = document.createElement("img"); i.src = "http://127.0.0.1:{port}/i.png";
      document.body.append(i);
    </script></body></html>""".encode()

    def subfetch(url: str, kind: str, deadline: float) -> Answer | str:
        u = parse(normalize(url))
        task = SubTask(engine.subrequests, u, deadline)
        assert task.run(engine.scheduler.slot(u.host)) is None
        return task.future.result(timeout=0)  # type: ignore[no-any-return]

    browser = Browser(memory_mb=64)
    try:
        out = browser.render(page, 200, {"content-type": "text/html"}, body, subfetch, 5.0)
    finally:
        browser.close()
        engine.close()
    assert out.reason == "ok"
    assert out.refused["private_ip"] == 3
    assert out.refused["render_refused_type"] >= 1  # the image
    assert out.fetched == 0
    assert web.log.records() == []  # nothing reached the server: not the socket either
    assert b"<a " not in out.dom


@pytest.mark.system_packages("chromium")
def test_kill9_while_rendering_then_resume_matches_the_oracle(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = scripted_web(make_testweb)
    data = tmp_path / "c"
    args = cli_args(web, data, "--render-js", H0, "--render-timeout", "6",
                    "--render-memory", "64")
    proc = start_cli(args)
    endless = scripts(web, "endless.html")
    wait_requested(web, proc, endless)  # the endless page is being rendered now
    time.sleep(0.5)
    browsers = children(proc.pid)
    assert browsers, "no browser process under the crawler"
    proc.kill()
    proc.communicate()
    gone_by = time.monotonic() + 30
    while any(alive(p) for p in browsers):  # the browser quits with the crawler's pipe
        assert time.monotonic() < gone_by, [p for p in browsers if alive(p)]
        time.sleep(0.05)
    # The killed browser's profile stays in the crawl's directory, not in /tmp, and the
    # resume clears it (and its own at the end).
    assert [p.relative_to(data).parts[-1] for p in data.rglob("browser-profile")] == [
        "browser-profile"]
    resume_and_match(web, data, args)
    assert not list(data.rglob("browser-profile"))


@pytest.mark.slow
@pytest.mark.system_packages("chromium")
def test_ctrl_c_while_rendering_stops_without_waiting_for_the_render(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """SIGINT while a page that never settles is in a tab: the crawl stops at once (the
    browser is killed, the page goes back to PendDB), and the resume renders it."""
    web = scripted_web(make_testweb)
    data = tmp_path / "c"
    limit = 60.0  # the render time limit: the stop must not wait for it
    args = cli_args(web, data, "--render-js", H0, "--render-timeout", str(limit),
                    "--render-memory", "64", "--status-interval", "0.2")
    proc = start_cli(args)
    endless = scripts(web, "endless.html")
    wait_requested(web, proc, endless)
    deadline = time.monotonic() + 120
    # The endless page is in a tab once nothing waits for one and a render stays under
    # way (every other page renders in well under a second).
    busy_since = None
    while busy_since is None or time.monotonic() - busy_since < 1.5:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        snap = status_json(data)
        if snap.get("rendering", 0) >= 1 and snap.get("render_queued", 1) == 0:
            busy_since = busy_since or time.monotonic()
        else:
            busy_since = None
        time.sleep(0.1)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=limit)
    assert time.monotonic() - signalled < limit / 2, "the stop waited for the render"
    assert proc.returncode == 128 + signal.SIGINT, err.decode()[-2000:]
    assert endless not in records(data)  # not recorded: it was put back, not cut
    web.log.clear()
    resume_and_match(web, data, args)
    assert endless in requested(web)  # fetched again by the resume


def test_a_browser_that_cannot_start_is_one_line(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(hosts=1, pages=2, seed=1)
    args = cli_args(web, tmp_path / "c", "--render-js-all", "--render-browser",
                    str(tmp_path / "no-such-chromium"))
    done = subprocess.run(args, capture_output=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    err = done.stderr.decode().strip().splitlines()
    assert done.returncode != 0
    assert "Traceback" not in done.stderr.decode()
    assert any("cannot start the browser" in line and "no-such-chromium" in line
               for line in err), err
    assert web.log.records() == []  # it failed before fetching anything


def test_render_settings_are_checked(tmp_path: Path) -> None:
    for bad, text in (({"render_tabs": 0}, "--render-tabs"),
                      ({"render_timeout": 0.0}, "--render-timeout"),
                      ({"render_js": ("(",)}, "bad regex")):
        kw: dict[str, Any] = {"data_dir": str(tmp_path), **bad}
        with pytest.raises(ValueError, match=text):
            CrawlerConfig(**kw)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
