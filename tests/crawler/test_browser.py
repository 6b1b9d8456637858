"""crawler.net.browser against a real headless Chromium: when a render has settled, and
a crashed tab against a dead browser.

A render settles once the page is quiet: no DOM change, no short timer and no request
of its own (fetch, XHR, a body being read) for a moment, by the page's clock. The
render pool retries a page once when the browser died under it (BrowserGone)
and records a crashed tab as ``render_crashed`` with its server links only. A kill
of the browser's whole process group could let the browser report the tab's crash
just before its own end (not seen here: the group-kill test below passes without the
check too); ``Browser.render`` then asks the browser whether it is still there.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from crawler.exceptions import BrowserGone
from crawler.net.browser import Answer, Browser, Rendered

ENDLESS = b"<html><body><a href='/next.html'>next</a><script>for(;;){}</script></body></html>"
PLAIN = b"<html><body><p>plain</p></body></html>"
HTML = {"content-type": "text/html"}


def no_subfetch(url: str, kind: str, deadline: float) -> Answer | str:
    return "refused"


def renderers(browser_pid: int) -> list[int]:
    """The browser's renderer processes (the tabs' and a spare), by their command lines."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read()  # Chromium rewrites it: one string, not one per argument
            if os.getpgid(int(entry)) == browser_pid and b" --type=renderer " in argv:
                found.append(int(entry))
        except OSError:  # gone meanwhile
            continue
    return found


def render_while(browser: Browser, kill: Callable[[int], None]) -> Rendered | BrowserGone:
    """Render the endless page, run ``kill(browser_pid)`` once it runs, and return what
    the render ended with."""
    out: list[Rendered | BrowserGone] = []

    def render() -> None:
        try:
            out.append(browser.render("http://h.test/endless.html", 200, HTML, ENDLESS,
                                      no_subfetch, 60.0))
        except BrowserGone as exc:
            out.append(exc)

    thread = threading.Thread(target=render)
    thread.start()
    pid = None
    deadline = time.monotonic() + 60
    while pid is None or not renderers(pid):
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
        pid = browser.pid
    time.sleep(1.0)  # the page's script is spinning now
    kill(pid)
    thread.join(90)
    assert not thread.is_alive() and len(out) == 1
    return out[0]


def cpu_ticks(pid: int) -> int:
    """user + system clock ticks a process has used (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def spinner(browser_pid: int) -> tuple[int | None, list[tuple[int, int]]]:
    """The renderer that used a core in the last 0.5 s (at least 0.2 s of CPU, three
    times any other's), or None; and each renderer's (ticks, pid), most first."""
    before = {p: cpu_ticks(p) for p in renderers(browser_pid)}
    time.sleep(0.5)
    used = sorted(((cpu_ticks(p) - t, p) for p, t in before.items()), reverse=True)
    ticks = os.sysconf("SC_CLK_TCK")
    if used and used[0][0] >= 0.2 * ticks and (len(used) == 1 or used[0][0] >= 3 * used[1][0]):
        return used[0][1], used
    return None, used


def spinning_renderer(browser_pid: int) -> int:
    """The renderer that runs the endless page's loop: the spinner of two windows in a
    row (a spare renderer starting up can lead one window on a loaded machine)."""
    deadline = time.monotonic() + 60
    last = None
    while True:
        pid, used = spinner(browser_pid)
        if pid is not None and pid == last:
            return pid
        last = pid
        assert time.monotonic() < deadline, used


@pytest.mark.system_packages("chromium")
def test_a_tab_killed_alone_is_a_crashed_render_and_the_browser_goes_on() -> None:
    """Only the tab's renderer is killed (as the kernel's OOM killer would): killing the
    browser's other renderers too (its spare, its own UI's) once left the next tab
    unrendered for 30 s on a loaded machine."""
    browser = Browser(memory_mb=64)
    try:
        def kill_tabs(pid: int) -> None:
            os.kill(spinning_renderer(pid), signal.SIGKILL)

        out = render_while(browser, kill_tabs)
        # not crashed: did the kill miss the tab (its loop still spins), or did the
        # browser's news of the crash go unheard?
        assert isinstance(out, Rendered) and out.reason == "render_crashed", (
            out, "renderers after the kill (ticks in 0.5 s, pid):",
            spinner(browser.pid or 0)[1])
        after = browser.render("http://h.test/plain.html", 200, HTML, PLAIN, no_subfetch, 30.0)
        assert after.reason == "ok" and b"plain" in after.dom
        assert browser.starts == 1  # the browser lived on: no restart
    finally:
        browser.close()


@pytest.mark.system_packages("chromium")
def test_a_browser_killed_with_its_tabs_is_browser_gone_every_time() -> None:
    """The process group killed at once, three times: each render ends as BrowserGone
    (the pool's retry), never as a crashed tab, whichever news came first."""
    browser = Browser(memory_mb=64)
    try:
        for _ in range(3):
            conn = browser.connection()
            out = render_while(browser, lambda pid: os.killpg(pid, signal.SIGKILL))
            assert isinstance(out, BrowserGone), out
            browser.restart(conn)
        assert browser.starts == 3
    finally:
        browser.close()


# The page writes, right after each call, how much the watch says it waits for: the
# requests count from the call (neither can have been answered yet), and the render
# still settles once both are answered and read.
WAITING = b"""<html><body><p id="w"></p><script>
const w = document.getElementById("w");
fetch("a.json").then(r => r.json()).then(d => { w.dataset.json = d.v; });
w.dataset.afterFetch = window.__kvcrawlWatch()[1];
const x = new XMLHttpRequest();
x.open("GET", "b.json");
x.onload = () => { w.dataset.xhr = x.responseText.trim(); };
x.send();
w.dataset.afterXhr = window.__kvcrawlWatch()[1];
</script></body></html>"""


@pytest.mark.system_packages("chromium")
def test_a_request_of_the_page_keeps_the_render_waiting_until_it_is_read() -> None:
    asked: list[str] = []

    def subfetch(url: str, kind: str, deadline: float) -> Answer | str:
        asked.append(url)
        name = url.rsplit("/", 1)[1]
        return Answer(200, {"content-type": "application/json"}, b'{"v": "%s"}' % name.encode())

    browser = Browser(memory_mb=64)
    try:
        out = browser.render("http://h.test/w.html", 200, HTML, WAITING, subfetch, 30.0)
    finally:
        browser.close()
    assert out.reason == "ok", out
    assert b'data-after-fetch="1"' in out.dom and b'data-after-xhr="2"' in out.dom, out.dom
    assert b'data-json="a.json"' in out.dom and b"data-xhr=" in out.dom
    assert sorted(asked) == ["http://h.test/a.json", "http://h.test/b.json"]
