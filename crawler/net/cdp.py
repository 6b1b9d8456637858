"""A Chrome DevTools Protocol connection over ``--remote-debugging-pipe``.

Chromium reads commands from its fd 3 and writes answers and events to its
fd 4, each message one JSON object ended by a NUL byte. A pipe needs no port
(nothing listens, nothing else can connect) and dies with us: when this
process exits, even by kill -9, Chromium reads end-of-file and quits.

One reader thread parses what Chromium writes: an answer completes the
caller waiting on its id, an event goes to the queue of its session (one per
tab, ``flatten`` sessions) or is dropped when no one listens. ``call`` is
thread-safe: every tab's thread sends through the same pipe.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future
from typing import Any

from ..exceptions import BrowserError, BrowserGone

log = logging.getLogger(__name__)

_READ = 1 << 16


class Process:
    """A browser process, leader of its own process group (its renderers are in it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def spawn(cls, argv: list[str], fds: dict[int, int], env: dict[str, str]) -> Process:
        """Start ``argv`` with ``fds`` (child fd -> our fd) and /dev/null for stdio."""
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
        ]
        actions += [(os.POSIX_SPAWN_DUP2, ours, child) for child, ours in fds.items()]
        return cls(os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True))

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the whole group and reap the leader (``timeout`` seconds at most)."""
        if self.poll() is not None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.returncode is None:
            log.warning("browser pid %d did not exit", self.pid)


class Connection:
    """The pipe to one running browser process (``proc``)."""

    def __init__(self, proc: Process, to_browser: int, from_browser: int) -> None:
        self.proc = proc
        self._out = to_browser
        self._in = from_browser
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # one writer at a time; guards _pending, _sessions
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._sessions: dict[str, queue.Queue[dict[str, Any]]] = {}
        self._browser_events: queue.Queue[dict[str, Any]] | None = None
        self.closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()

    # -- sending -----------------------------------------------------------------

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """Send one command and wait for its answer (``timeout`` seconds at most)."""
        future = self.send(method, params, session=session)
        try:
            return future.result(timeout=max(0.0, timeout))
        except TimeoutError:
            raise BrowserError(f"{method}: no answer in {timeout:.1f} s") from None

    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None) -> Future[dict[str, Any]]:
        """Send one command; its answer completes the returned future."""
        msg: dict[str, Any] = {"id": next(self._ids), "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\0"
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            if self.closed.is_set():
                raise BrowserGone("the browser is gone")
            self._pending[msg["id"]] = future
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._out, view) :]
            except OSError as exc:
                self._pending.pop(msg["id"], None)
                raise BrowserGone(f"the browser is gone ({exc.strerror})") from None
        return future

    # -- events ------------------------------------------------------------------

    def listen(self, session: str | None) -> queue.Queue[dict[str, Any]]:
        """The queue the events of ``session`` (None: the browser's own) go to from now on."""
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            if session is None:
                self._browser_events = q
            else:
                self._sessions[session] = q
        return q

    def forget(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)

    # -- reading -----------------------------------------------------------------

    def _read_loop(self) -> None:
        buf = bytearray()
        try:
            while True:
                chunk = os.read(self._in, _READ)
                if not chunk:
                    break
                buf += chunk
                while True:
                    end = buf.find(b"\0")
                    if end < 0:
                        break
                    raw = bytes(buf[:end])
                    del buf[: end + 1]
                    self._dispatch(raw)
        except OSError:
            pass
        finally:
            self._gone()

    def _dispatch(self, raw: bytes) -> None:
        try:
            msg = json.loads(raw)
        except ValueError:
            log.warning("unparsable message from the browser (%d bytes)", len(raw))
            return
        if "id" in msg:
            with self._lock:
                future = self._pending.pop(msg["id"], None)
            if future is None:
                return
            if "error" in msg:
                err = msg["error"]
                future.set_exception(BrowserError(f"{err.get('message', err)}"))
            else:
                future.set_result(msg.get("result", {}))
            return
        session = msg.get("sessionId")
        with self._lock:
            q = self._browser_events if session is None else self._sessions.get(session)
        if q is not None:
            q.put(msg)

    def _gone(self) -> None:
        with self._lock:
            self.closed.set()
            pending = list(self._pending.values())
            self._pending.clear()
            queues = list(self._sessions.values())
            if self._browser_events is not None:
                queues.append(self._browser_events)
        for future in pending:
            future.set_exception(BrowserGone("the browser is gone"))
        for q in queues:  # wakes whoever waits on an event
            q.put({"method": "kvcrawl.gone"})

    def close(self) -> None:
        """Kill the browser and its renderers (its own process group) and wake every
        waiting call."""
        self.proc.kill()
        try:
            os.close(self._out)
        except OSError:
            pass
        self._reader.join(timeout=10)
        try:
            os.close(self._in)
        except OSError:
            pass
