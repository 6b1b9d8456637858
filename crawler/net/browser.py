"""Headless Chromium, driven over the DevTools protocol (crawler.net.cdp), renders one
page per tab from a body the crawler already fetched.

Theory of operation
-------------------
The browser makes no request of its own. Every request of a tab is paused
(the Fetch domain, pattern ``*``) and answered here:

- the page's document is fulfilled from the fetched body: it is not fetched twice;
- a GET for a script or an XHR / fetch() is handed to ``subfetch``, which the
  crawler answers through its own fetcher, after the checks a page gets
  (private addresses, robots.txt, the host's politeness slot);
- everything else (images, CSS, fonts, media, frames, POSTs, beacons) is refused:
  none of it adds links, and a POST may change something on the server.

Behind that, Chromium starts with a dead proxy (127.0.0.1:9) for every host,
loopback included, and a resolver that finds no name, so a request that
escaped the interception (a WebSocket, say) still goes nowhere.

A page is *settled* once it has loaded, no request is pending, no short timer
(setTimeout of at most 5 s) is due, and neither the DOM nor the network has
changed for ``settle`` seconds. A page that does not settle within
``timeout`` is cut (``render_timeout``); a tab whose JavaScript heap passes
``memory_mb`` is cut (``render_memory``), and V8's own heap limit is set to
the same size, so a page that allocates faster than we look crashes its tab
instead (``render_crashed``). Each render gets a fresh tab, closed after.
"""

from __future__ import annotations

import base64
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import outcomes
from ..config import DEFAULT_RENDER_BROWSER
from ..exceptions import BrowserError, BrowserGone
from .cdp import Connection, Process

log = logging.getLogger(__name__)

DEFAULT_BROWSER = DEFAULT_RENDER_BROWSER  # (crawler.config: the one default)
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
    # Without these Chromium reaches out to Google's hosts at start and on its own timers.
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--disable-quic", "--mute-audio",
    # Nothing escapes the interception: every host, loopback too, goes to a dead proxy.
    "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)
# Requests of these types are answered through the crawler's fetcher (GET only).
FETCHED_TYPES = frozenset({"Script", "XHR", "Fetch"})
MAX_SUBREQUESTS = 64  # a page's scripts and XHRs; more are refused
SHORT_TIMER_MS = 5000  # setTimeout delays the settle waits for
_POLL = 0.05  # seconds between two looks at a loaded page
_CRASH_PROBE = 5.0  # seconds a live browser has to answer after one of its tabs crashed
# Dropped from the fetched answer when it is handed to the browser: the body is
# already decoded and whole.
_HOP_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection"})

# Run in every document before its own scripts: when the DOM last changed, how many
# short timers and requests are pending, the JS heap in use. A request counts from the
# page's fetch() or XHR send until its answer, and its body's read, reached the page (by
# the page's clock, which also restarts the quiet time then): a browser slow to deliver
# an answer (a loaded machine) must not look settled before the page saw it.
_WATCH = """(() => {
  let last = performance.now(), pending = 0;
  const touch = () => { last = performance.now(); };
  new MutationObserver(touch).observe(document,
    {subtree: true, childList: true, attributes: true, characterData: true});
  const live = new Set(), st = window.setTimeout, ct = window.clearTimeout;
  window.setTimeout = function (fn, ms, ...args) {
    let id;
    const run = function () { live.delete(id); if (typeof fn === "function") fn(...args); };
    id = st.call(window, run, ms);
    if (!(ms > SHORT)) live.add(id);
    return id;
  };
  window.clearTimeout = function (id) { live.delete(id); return ct.call(window, id); };
  const track = (promise) => {
    pending++; touch();
    const done = () => { pending--; touch(); };
    promise.then(done, done);
    return promise;
  };
  const fetch0 = window.fetch;
  if (fetch0) window.fetch = function (...args) { return track(fetch0.apply(this, args)); };
  for (const name of ["json", "text", "arrayBuffer", "blob", "formData"]) {
    const read = window.Response && Response.prototype[name];
    if (read) Response.prototype[name] = function (...args) {
      return track(read.apply(this, args));
    };
  }
  const send = window.XMLHttpRequest && XMLHttpRequest.prototype.send;
  if (send) XMLHttpRequest.prototype.send = function (...args) {
    let open = true;
    const done = () => { if (open) { open = false; pending--; touch(); } };
    pending++; touch();
    this.addEventListener("loadend", done, {once: true});
    try { return send.apply(this, args); } catch (e) { done(); throw e; }
  };
  Object.defineProperty(window, "__kvcrawlWatch", {value: () =>
    [performance.now() - last, live.size + pending,
     (performance.memory || {}).usedJSHeapSize || 0]});
})();""".replace("SHORT", str(SHORT_TIMER_MS))


@dataclass(frozen=True, slots=True)
class Answer:
    """A subresource's answer, as the browser gets it."""

    status: int
    headers: dict[str, str]
    body: bytes


# subfetch(url, resource_type, deadline): an Answer, or the reason it is refused.
SubFetch = Callable[[str, str, float], "Answer | str"]


@dataclass(slots=True)
class Rendered:
    reason: str  # "ok" or why the render was cut: render_timeout, render_crashed, ...
    dom: bytes = b""  # the serialized DOM (reason "ok" only)
    fetched: int = 0  # subrequests answered through the crawler's fetcher
    refused: Counter[str] = field(default_factory=Counter)  # refused subrequests, by reason
    seconds: float = 0.0


class Browser:
    """One Chromium process, restarted when it dies. Thread-safe: each render
    thread renders in its own tab."""

    def __init__(self, executable: str = DEFAULT_BROWSER, *, memory_mb: int = 512,
                 user_agent: str = "", settle: float = 0.3, max_dom_bytes: int = 20 << 20,
                 start_timeout: float = 30.0, profile_dir: str | None = None) -> None:
        self.executable = executable
        # Chromium's profile: ``profile_dir`` (a crawl's shard gives one inside its own
        # directory, so a kill -9 leaves it there to be cleared by the next start, not
        # in /tmp for ever), else a new temporary directory at each start.
        self.profile_dir = profile_dir
        self.memory_mb = memory_mb
        self.user_agent = user_agent
        self.settle = settle
        self.max_dom_bytes = max_dom_bytes
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._profile: str | None = None
        self._closed = False  # close() is final: no render starts the browser again
        self.starts = 0  # browser processes started (restarts are starts - 1)

    # -- the process ---------------------------------------------------------------

    def connection(self) -> Connection:
        """The live connection, starting the browser if it is not running."""
        with self._lock:
            if self._closed:
                raise BrowserGone("the browser was closed")
            if self._conn is None or self._conn.closed.is_set():
                self._stop_locked()
                self._conn = self._start()
            return self._conn

    def restart(self, dead: Connection) -> None:
        """Stop ``dead`` if it is still the current connection (the next render starts anew)."""
        with self._lock:
            if self._conn is dead:
                self._stop_locked()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop_locked()

    @property
    def pid(self) -> int | None:
        conn = self._conn
        return conn.proc.pid if conn is not None and not conn.closed.is_set() else None

    def _stop_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    def _new_profile(self) -> str:
        if self.profile_dir is None:
            return tempfile.mkdtemp(prefix="kvcrawl-chromium-")
        shutil.rmtree(self.profile_dir, ignore_errors=True)  # a killed run's, or a dead browser's
        os.makedirs(self.profile_dir, mode=0o700)
        return self.profile_dir

    def _start(self) -> Connection:
        exe = shutil.which(self.executable)
        if exe is None:
            raise BrowserError(
                f"cannot start the browser: {self.executable!r} is not an executable "
                "(install Debian's chromium, or give --render-browser PATH)"
            )
        self._profile = self._new_profile()
        args = [*FLAGS, f"--user-data-dir={self._profile}", "--remote-debugging-pipe",
                f"--js-flags=--max-old-space-size={self.memory_mb}"]
        if self.user_agent:
            args.append(f"--user-agent={self.user_agent}")
        # Chromium talks on fds 3 (in) and 4 (out): posix_spawn moves our pipe ends
        # there in the child (thread-safe, unlike a preexec function).
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            # Its crash reports and caches would go to ~/.config and ~/.cache: into the
            # throwaway profile instead.
            env = dict(os.environ, XDG_CONFIG_HOME=self._profile, XDG_CACHE_HOME=self._profile)
            proc = Process.spawn([exe, *args, "about:blank"], {3: cmd_r, 4: res_w}, env)
        except OSError as exc:
            for fd in (cmd_r, cmd_w, res_r, res_w):
                os.close(fd)
            raise BrowserError(f"cannot start the browser {exe}: {exc}") from None
        os.close(cmd_r)
        os.close(res_w)
        conn = Connection(proc, cmd_w, res_r)
        try:
            version = conn.call("Browser.getVersion", timeout=self.start_timeout)
        except BrowserError as exc:
            conn.close()
            raise BrowserError(f"cannot start the browser {exe}: {exc}") from None
        self.starts += 1
        log.info("browser started: %s (pid %d)", version.get("product", exe), proc.pid)
        return conn

    # -- one page --------------------------------------------------------------------

    def render(self, url: str, status: int, headers: dict[str, str], body: bytes,
               subfetch: SubFetch, timeout: float) -> Rendered:
        """Render ``body`` (the answer fetched for ``url``) in a new tab.

        Raises BrowserGone when the browser died meanwhile (the caller restarts it
        and may try again); every other way a render ends is a Rendered."""
        conn = self.connection()
        started = time.monotonic()
        target = conn.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = None
        try:
            session = conn.call("Target.attachToTarget",
                                {"targetId": target, "flatten": True})["sessionId"]
            tab = _Tab(self, conn, session, url, (status, headers, body), subfetch,
                       started + timeout)
            out = tab.run()
            if out.reason == outcomes.RENDER_CRASHED:
                self._alive_after_crash(conn)
        except BrowserGone:
            raise
        except BrowserError as exc:
            if conn.closed.is_set():
                raise BrowserGone(str(exc)) from None
            log.debug("render of %s cut: %s", url, exc)
            out = Rendered(outcomes.RENDER_TIMEOUT if time.monotonic() >= started + timeout
                           else outcomes.RENDER_FAILED)
        finally:
            if session is not None:
                conn.forget(session)
            if not conn.closed.is_set():
                try:
                    conn.send("Target.closeTarget", {"targetId": target})
                except BrowserGone:
                    pass
        out.seconds = time.monotonic() - started
        return out

    @staticmethod
    def _alive_after_crash(conn: Connection) -> None:
        """BrowserGone if the tab crashed because the whole browser died: a kill of its
        process group can let the browser report the tab's crash just before its own
        end, and the page then deserves the retry a browser death gets."""
        try:
            conn.call("Browser.getVersion", timeout=_CRASH_PROBE)
        except BrowserError as exc:
            if isinstance(exc, BrowserGone) or conn.closed.is_set():
                raise BrowserGone(f"the browser died with the tab: {exc}") from None


class _Tab:
    """The events of one render, handled on the render thread."""

    def __init__(self, browser: Browser, conn: Connection, session: str, url: str,
                 answer: tuple[int, dict[str, str], bytes], subfetch: SubFetch,
                 deadline: float) -> None:
        self.browser = browser
        self.conn = conn
        self.session = session
        self.url = url.partition("#")[0]
        self.answer = answer
        self.subfetch = subfetch
        self.deadline = deadline
        self.events = conn.listen(session)
        self.out = Rendered(outcomes.RENDER_OK)
        self.document_served = False
        self.loaded = False
        self.last_net = time.monotonic()

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.conn.call(method, params, session=self.session,
                              timeout=self.deadline - time.monotonic())

    def run(self) -> Rendered:
        for method, params in (
            ("Inspector.enable", None),
            ("Page.enable", None),
            ("Page.addScriptToEvaluateOnNewDocument", {"source": _WATCH}),
            ("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}),
        ):
            self.call(method, params)
        navigated = self.conn.send("Page.navigate", {"url": self.url}, session=self.session)
        last_look = 0.0
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                return self._cut(outcomes.RENDER_TIMEOUT)
            try:
                msg = self.events.get(timeout=min(_POLL, self.deadline - now))
            except queue.Empty:
                msg = None
            if msg is not None:
                cut = self._event(msg)
                if cut:
                    return self._cut(cut)
            if navigated.done() and navigated.exception() is None:
                error = navigated.result().get("errorText")
                if error:
                    return self._cut(outcomes.RENDER_FAILED)
            now = time.monotonic()
            if self.loaded and now - last_look >= _POLL:
                last_look = now
                quiet_ms, waiting, heap = self._eval("window.__kvcrawlWatch()")
                if heap > self.browser.memory_mb << 20:
                    return self._cut(outcomes.RENDER_MEMORY)
                settle = self.browser.settle
                if quiet_ms >= settle * 1000 and not waiting and now - self.last_net >= settle:
                    break
        where, dom = self._eval(
            "[location.href, document.documentElement ? document.documentElement.outerHTML : '']")
        if str(where).partition("#")[0] != self.url:  # a script or meta refresh went elsewhere
            return self._cut(outcomes.RENDER_NAVIGATED)
        data = str(dom).encode("utf-8", "replace")
        if len(data) > self.browser.max_dom_bytes:
            return self._cut(outcomes.RENDER_TOO_LARGE)
        self.out.dom = data
        return self.out

    def _cut(self, reason: str) -> Rendered:
        self.out.reason = reason
        self.out.dom = b""
        return self.out

    def _eval(self, expression: str) -> Any:
        got = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in got:
            raise BrowserError(f"evaluate failed: {got['exceptionDetails'].get('text')}")
        return got.get("result", {}).get("value")

    def _event(self, msg: dict[str, Any]) -> str | None:
        """Handle one event; the reason to cut the render, if it must be."""
        method = msg.get("method")
        params = msg.get("params", {})
        if method == "Fetch.requestPaused":
            self.last_net = time.monotonic()
            self._paused(params)
        elif method == "Page.loadEventFired":
            self.loaded = True
        elif method == "Page.frameNavigated":
            frame = params.get("frame", {})
            if not frame.get("parentId") and str(frame.get("url", "")).partition("#")[0] \
                    != self.url:
                return outcomes.RENDER_NAVIGATED  # a meta refresh or a script went elsewhere
        elif method == "Page.javascriptDialogOpening":  # alert() would hold the page forever
            self.conn.send("Page.handleJavaScriptDialog", {"accept": False},
                           session=self.session)
        elif method in ("Inspector.targetCrashed", "Inspector.detached"):
            return outcomes.RENDER_CRASHED
        elif method == "kvcrawl.gone":
            raise BrowserGone("the browser is gone")
        return None

    def _paused(self, p: dict[str, Any]) -> None:
        rid = p["requestId"]
        request = p.get("request", {})
        url = str(request.get("url", ""))
        kind = p.get("resourceType", "")
        if kind == "Document" and not self.document_served and url.partition("#")[0] == self.url:
            self.document_served = True
            self._fulfill(rid, *self.answer)
            return
        refusal = None
        if kind not in FETCHED_TYPES or request.get("method") != "GET":
            refusal = outcomes.RENDER_REFUSED_TYPE
        elif self.out.fetched + sum(self.out.refused.values()) >= MAX_SUBREQUESTS:
            refusal = outcomes.RENDER_SUBREQUEST_LIMIT
        if refusal is None:
            got = self.subfetch(url, kind, self.deadline)
            if isinstance(got, Answer):
                self.out.fetched += 1
                self._fulfill(rid, got.status, got.headers, got.body)
                self.last_net = time.monotonic()
                return
            refusal = got
        self.out.refused[refusal] += 1
        self.conn.send("Fetch.failRequest", {"requestId": rid, "errorReason": "BlockedByClient"},
                       session=self.session)

    def _fulfill(self, rid: str, status: int, headers: dict[str, str], body: bytes) -> None:
        self.conn.send("Fetch.fulfillRequest", {
            "requestId": rid,
            "responseCode": status,
            "responseHeaders": [{"name": k, "value": v} for k, v in headers.items()
                                if k.lower() not in _HOP_HEADERS],
            "body": base64.b64encode(body).decode("ascii"),
        }, session=self.session)
