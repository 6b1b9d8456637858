"""Running the crawler against a test web (in-process or as a subprocess); reading its results."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

import kvstore
from crawler.config import CrawlerConfig
from crawler.run.engine import Engine
from crawler.state.pages import PageRecord, decode_page
from tools.measure_crawl import crawl_command
from tools.testweb import SiteConfig, TestWeb
from tools.testweb.export import ACCESS_FIELDS, export, nginx_serving
from tools.testweb.graph import Graph
from tools.testweb.site import Site

REPO = Path(__file__).resolve().parents[2]
# Tests of the test web on Debian's nginx with its Brotli filter module.
needs_nginx_brotli = pytest.mark.system_packages("nginx-light", "libnginx-mod-http-brotli-filter")


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now (for a server started next)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
# Requests a crawl makes for each host besides its pages: robots.txt, the default sitemap.
META_PATHS = ("/robots.txt", "/sitemap.xml")


def config_for(web: TestWeb, data_dir: Path, **overrides: Any) -> CrawlerConfig:
    settings: dict[str, Any] = dict(
        data_dir=str(data_dir),
        threads=16,
        delay=0.0,
        per_host=2,
        nameservers=(web.nameserver,),
        allow_private_ips=True,
        ca_bundle=str(web.ca_file),
        broad=True,
        status_interval=3600.0,
        sync_interval=3600.0,
        connect_timeout=5.0,
        read_timeout=5.0,
        total_timeout=10.0,
        backoff=0.05,
        max_retry_after=2.0,
    )
    settings.update(overrides)
    return CrawlerConfig(**settings)


def run_crawl(
    web: TestWeb, data_dir: Path, seeds: list[str] | None = None, **overrides: Any
) -> Engine:
    engine = Engine(config_for(web, data_dir, **overrides))
    engine.add_seeds(seeds or [web.seed_url])
    engine.complete = engine.run()  # type: ignore[attr-defined]
    return engine


def shard_paths(data_dir: Path) -> list[Path]:
    """The crawl's shard directories (``[data_dir]`` for a one-process crawl)."""
    from crawler.state.shards import shard_dirs

    return [Path(d) for d in shard_dirs(str(data_dir))]


def records(data_dir: Path) -> dict[str, PageRecord]:
    """Every page record of a crawl (every shard of it), by URL (bodies left out)."""
    out = {}
    for shard in shard_paths(data_dir):
        with kvstore.open(shard / "main", readonly=True) as main:
            for key in main:
                rec = decode_page(main[key], with_body=False)
                assert rec.url not in out, f"{rec.url} recorded by two shards"
                out[rec.url] = rec
    return out


def fetched_urls(data_dir: Path) -> set[str]:
    """URLs that were answered over HTTP (any status)."""
    return {url for url, rec in records(data_dir).items() if rec.status > 0}


def cli_args(web: TestWeb, data_dir: Path, *extra: str) -> list[str]:
    """``crawler start`` on ``web``, one process unless ``extra`` says ``--processes N``
    (the tests written for the single engine keep testing it; test_shards the rest)."""
    return crawl_command(
        web,
        data_dir,
        "--delay",
        "0",
        "--per-host",
        "2",
        "--threads",
        "8",
        "--status-interval",
        "3600",
        "--timeout",
        "10",
        "--processes",
        "1",
        *extra,
    )


def start_python(args: list[str], **env: str) -> subprocess.Popen[str]:
    """``python ARGS`` from the checkout, its output in text pipes, ``env`` added to its
    environment, and faulthandler on from the interpreter's start: sent SIGABRT, it
    prints its threads' stacks (``ended``)."""
    return subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO),
                                     PYTHONFAULTHANDLER="1", **env))


def ended(proc: subprocess.Popen[str], wait: float) -> str:
    """The stderr of ``proc`` once it has exited. One still running after ``wait`` seconds
    is sent SIGABRT, which prints its threads' stacks if ``start_python`` started it,
    killed if that did not end it, and failed on with the stacks."""
    try:
        return proc.communicate(timeout=wait)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            err = proc.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            err = proc.communicate()[1]
        pytest.fail(f"still running {wait:.0f} s after the signal; its threads:\n{err[-6000:]}")


def start_cli(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs
    )


def crawl_on_nginx(tmp_path: Path, config: SiteConfig, *, codings: tuple[str, ...] = (),
                   nginx_h2: bool = False, **options: Any
                   ) -> tuple[Path, Site, list[dict[str, str]]]:
    """The test web exported to nginx (``codings``; ``nginx_h2``: its https hosts offer h2) and
    crawled in-process with ``options``; the test web only gives the names (its DNS).
    Returns (crawl dir, the site, nginx's access log: a dict of ACCESS_FIELDS a line)."""
    http_port, https_port = free_ports(2)
    root = tmp_path / "site"
    export(Graph(config), root, http_port=http_port, https_port=https_port, codings=codings,
           access_log=True, http2=nginx_h2)
    site = Site(Graph(config), http_port=http_port, https_port=https_port)
    web = TestWeb(config).start()
    data = tmp_path / "crawl"
    try:
        with nginx_serving(root, http_port):
            assert run_crawl(web, data, seeds=[site.seed_url],
                             ca_bundle=str(root / "tls/ca.pem"), **options).complete
    finally:
        web.stop()
    lines = (root / "logs/access.log").read_text().splitlines()
    return data, site, [dict(zip(ACCESS_FIELDS, ln.split("\t"), strict=True)) for ln in lines]


def stored_whole(data: Path, site: Site) -> dict[str, PageRecord]:
    """Every 200 page of a crawl of ``site``, checked stored whole (its body the site's),
    by URL (bodies left out)."""
    out = {}
    for url, rec in records(data).items():
        if rec.status != 200:
            continue
        host, _, path = url.split("://", 1)[1].partition("/")
        host = host.split(":")[0]
        full = record(data, url)
        assert not full.truncated and full.body == site.body(
            host, site.lookup(host, "/" + path)), url
        out[url] = rec
    return out


# -- helpers for the hostile-web tests ---------------------------------------------------


def record(data_dir: Path, url: str) -> PageRecord:
    """The page record of one URL, body included (KeyError if the URL was never recorded)."""
    from crawler.web.urls import url_key

    for shard in shard_paths(data_dir):
        with kvstore.open(shard / "main", readonly=True) as main:
            key = url_key(url)
            if key in main:
                return decode_page(main[key])
    raise KeyError(url)


def status_json(data_dir: Path) -> dict[str, Any]:
    """The status.json a crawl left in its data directory."""
    from crawler.state.statusfile import read_status

    snap = read_status(str(data_dir))
    assert snap is not None, f"no status.json in {data_dir}"
    return snap


def bad_hosts(data_dir: Path) -> dict[str, dict[str, Any]]:
    """The persisted BadHosts entries, by host name."""
    import json

    entries = []
    for shard in shard_paths(data_dir):
        with kvstore.open(shard / "badhosts", readonly=True) as bad:
            entries += [json.loads(bad[k]) for k in bad]
    return {e["host"]: e for e in entries}


def tries(web: TestWeb, url: str) -> list[Any]:
    """The request log's records of one URL (canonical form), in order of arrival."""
    return sorted((r for r in web.log.records() if r.url == url), key=lambda r: r.start)


def host_name(url: str) -> str:
    from tools.testweb.urls import split

    parts = split(url)
    assert parts is not None, url
    return parts.host


# -- waiting on a running crawl (never a fixed sleep: machines differ) -------------------


def wait_for(
    condition: Callable[[], bool],
    proc: subprocess.Popen[bytes] | None,
    what: str,
    timeout: float = 60.0,
) -> None:
    """Poll until ``condition()`` holds, failing if ``proc`` (the crawl) ends first or
    nothing happens within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, f"the crawl ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.01)


def answered_pages(web: TestWeb) -> int:
    """Page requests (robots.txt and /sitemap.xml aside) the test web has answered so far."""
    return sum(1 for r in web.log.records(done=True) if r.path not in META_PATHS)


def read_lines(stream: IO[bytes] | None) -> list[str]:
    """The lines of a running process's pipe, as they come (a daemon thread reads it):
    a test can wait for a message without blocking on the pipe."""
    assert stream is not None
    lines: list[str] = []

    def pump() -> None:
        with stream:
            for line in stream:
                lines.append(line.decode("utf-8", "replace"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


# -- a scripted HTTP server, for what the test web cannot be made to do -------------------


@dataclass
class Hit:
    """One request to a LocalServer, timed like the test web's log (time.time())."""

    path: str
    start: float  # request head read
    end: float  # answer handed to the socket
    status: int
    headers: dict[str, str]  # request headers, names lower-cased


Answer = tuple[int, list[tuple[str, str]], bytes]  # status, headers, body


class LocalServer:
    """An HTTP/1.0 server on 127.0.0.1 that answers ``answer(path, hits so far)`` and logs
    every request in ``hits``. A context manager; thread-safe."""

    def __init__(self, answer: Callable[[str, list[Hit]], Answer]) -> None:
        self.hits: list[Hit] = []
        lock = threading.Lock()
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                start = time.time()
                with lock:
                    status, headers, body = answer(self.path, list(hits))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                sent = {k.lower(): v for k, v in self.headers.items()}
                with lock:
                    hits.append(Hit(self.path, start, time.time(), status, sent))
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def html_links(paths: list[str]) -> Answer:
    """A 200 HTML page linking ``paths``."""
    body = "".join(f'<a href="{p}">{p}</a>\n' for p in paths)
    return 200, [("Content-Type", "text/html")], f"<html><body>{body}</body></html>".encode()


def run_cli(args: list[str], timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """Run a crawler command to its end; its exit code and text output."""
    proc = start_cli(args)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


def page_refetches(web: TestWeb) -> dict[str, int]:
    """URLs (robots.txt and /sitemap.xml aside: a run reads robots.txt again, and a kill
    between a sitemap's fetch and its record costs one more) requested more than once,
    and how often."""
    counts = Counter(r.url for r in web.log.records() if r.path not in META_PATHS)
    return {url: n for url, n in counts.items() if n > 1}


def wait_for_answers(web: TestWeb, proc: subprocess.Popen[bytes], n: int) -> None:
    """Wait until the test web has answered ``n`` more page requests: the crawl made
    progress (a kill then lands in the middle of a crawl, not in its start-up)."""
    goal = answered_pages(web) + n
    wait_for(lambda: answered_pages(web) >= goal, proc, f"{n} more answers")


def help_entries(text: str) -> dict[str, str]:
    """Each option's entry in argparse's help, by its first flag, on one line."""
    entries: dict[str, str] = {}
    flag = ""
    for line in text.splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = line
        elif flag and line.startswith("   "):
            entries[flag] += " " + line.strip()
        else:
            flag = ""
    return {k: " ".join(v.split()) for k, v in entries.items()}
