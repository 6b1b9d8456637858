"""Benchmark HTTP client libraries as the crawler would use them (issue 29). Not a test.

Usage (from the repository root; needs nginx: ``apt-get install -y nginx-light``, and the
client libraries measured: ``pip install pycurl 'httpx[http2]'``)::

    python tools/bench_fetchers.py --pages 2000 --fetches 20000 --threads 16 --repeat 3

A static site of ``--pages`` HTML files (5-20 KB, like the test web's pages) is served
by nginx on loopback over plain HTTP/1.1 and over TLS with HTTP/1.1 and HTTP/2 (ALPN).
Each client runs in a process of its own and fetches ``--fetches`` URLs with
``--threads`` threads, as a crawler's fetch workers would: every response's status,
headers and body kept, the body counted against a limit as it arrives. Measured per
client and protocol: pages/s, CPU ms per fetch (user + system of the client process:
what the crawler's GIL-bound shard would spend), and peak RSS. The medians of
``--repeat`` runs, clients alternating, are printed as a table and written as JSON.

Clients:

- ``ours``: crawler.net.fetch.Fetcher (http.client, our pool and watchdog); on the h2
  port with ``http2=True`` (crawler.net.h2session: the ``h2`` package, one stream at a
  time per connection, as ``start --http2`` crawls).
- ``pycurl``: libcurl (the manylinux wheel: nghttp2, OpenSSL), one easy handle per
  thread, reused (its connection cache); Python callbacks for headers and body, as the
  crawler's limits need.
- ``httpx``: one shared Client (h2 from the ``h2`` package), streamed.

The URL's host is ``bench.test``, resolved by each client to 127.0.0.1 the way the
crawler does (our resolver's answer handed over: the crawler connects to the address it
checked), with SNI and Host set to the name.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import _benchutil as bu  # noqa: E402
from tools.testweb.export import nginx_serving  # noqa: E402

HOST = "bench.test"
CLIENTS = ("ours", "pycurl", "httpx")
PROTOCOLS = ("http1", "https1", "h2")
LIMIT = 10 << 20
UA = "kvcrawl-bench/1.0"


# -- the site ------------------------------------------------------------------------------


def make_site(root: Path, pages: int, seed: int) -> None:
    rng = random.Random(seed)
    www = root / "www"
    www.mkdir(parents=True)
    words = [b"crawler", b"store", b"page", b"link", b"host", b"index", b"value", b"key"]
    for i in range(pages):
        size = rng.randint(5_000, 20_000)
        links = b"".join(b'<a href="/p%d.html">p%d</a>\n' % (j, j)
                         for j in rng.sample(range(pages), min(pages, 20)))
        text = b" ".join(rng.choice(words) for _ in range(size // 6))
        (www / f"p{i}.html").write_bytes(
            b"<!DOCTYPE html><html><head><title>p%d</title></head><body>\n" % i
            + links + b"<p>" + text[: max(0, size - len(links) - 80)] + b"</p></body></html>\n")


def nginx_conf(root: Path, http_port: int, https_port: int, h2_port: int, cert: Path,
               key: Path) -> Path:
    conf = root / "nginx.conf"
    tls = f"ssl_certificate {cert}; ssl_certificate_key {key};"
    conf.write_text(f"""
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 100000;
  default_type text/html;
  server {{ listen 127.0.0.1:{http_port}; server_name {HOST}; root {root}/www; }}
  server {{ listen 127.0.0.1:{https_port} ssl; server_name {HOST}; root {root}/www; {tls} }}
  server {{ listen 127.0.0.1:{h2_port} ssl http2; server_name {HOST}; root {root}/www;
           http2_max_concurrent_streams 256; {tls} }}
}}
""")
    return conf


# -- the clients (each in its own process) ------------------------------------------------


def _client_ours(args: argparse.Namespace) -> Any:
    from crawler.net.fetch import Fetcher

    f = Fetcher(user_agent=UA, resolve=lambda host: "127.0.0.1", ca_bundle=args.ca,
                max_body_bytes=LIMIT, max_decoded_bytes=LIMIT, http2=args.protocol == "h2")

    def fetch(url: str) -> tuple[int, int, str]:
        r = f.fetch(url)
        return r.status, len(r.body), r.http_version

    return fetch


def _client_pycurl(args: argparse.Namespace) -> Any:
    import pycurl

    local = threading.local()
    version = pycurl.CURL_HTTP_VERSION_2TLS if args.protocol == "h2" \
        else pycurl.CURL_HTTP_VERSION_1_1
    names = {pycurl.CURL_HTTP_VERSION_1_1: "HTTP/1.1", pycurl.CURL_HTTP_VERSION_2_0: "HTTP/2"}

    def handle() -> Any:
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = pycurl.Curl()
            c.setopt(pycurl.RESOLVE, [f"{HOST}:{args.port}:127.0.0.1"])
            c.setopt(pycurl.CAINFO, args.ca)
            c.setopt(pycurl.HTTP_VERSION, version)
            c.setopt(pycurl.NOSIGNAL, 1)
            c.setopt(pycurl.CONNECTTIMEOUT_MS, 10_000)
            c.setopt(pycurl.TIMEOUT_MS, 60_000)
            c.setopt(pycurl.USERAGENT, UA)
            c.setopt(pycurl.HTTPHEADER, ["Accept: text/html", "Accept-Encoding: gzip"])
        return c

    def fetch(url: str) -> tuple[int, int, str]:
        c = handle()
        body = io.BytesIO()
        headers: list[bytes] = []
        size = [0]

        def write(data: bytes) -> int | None:
            size[0] += len(data)
            if size[0] > LIMIT:
                return 0  # libcurl stops the transfer
            body.write(data)
            return None

        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.WRITEFUNCTION, write)
        c.setopt(pycurl.HEADERFUNCTION, headers.append)
        c.perform()
        return (c.getinfo(pycurl.RESPONSE_CODE), len(body.getvalue()),
                names.get(c.getinfo(pycurl.INFO_HTTP_VERSION), "?"))

    return fetch


def _client_httpx(args: argparse.Namespace) -> Any:
    import ssl

    import httpx

    ctx = ssl.create_default_context(cafile=args.ca)
    client = httpx.Client(http2=args.protocol == "h2", http1=args.protocol != "h2",
                          verify=ctx, timeout=60.0,
                          limits=httpx.Limits(max_connections=args.threads,
                                              max_keepalive_connections=args.threads))
    scheme = "http" if args.protocol == "http1" else "https"

    def fetch(url: str) -> tuple[int, int, str]:
        path = url.split(str(args.port), 1)[1]
        size = 0
        chunks = []
        with client.stream("GET", f"{scheme}://127.0.0.1:{args.port}{path}",
                           headers={"Host": HOST, "User-Agent": UA, "Accept": "text/html"},
                           extensions={"sni_hostname": HOST}) as r:
            for chunk in r.iter_raw():
                size += len(chunk)
                if size > LIMIT:
                    break
                chunks.append(chunk)
            return r.status_code, len(b"".join(chunks)), r.http_version

    return fetch


def client_main(args: argparse.Namespace) -> None:
    fetch = {"ours": _client_ours, "pycurl": _client_pycurl, "httpx": _client_httpx}[
        args.client](args)
    scheme = "http" if args.protocol == "http1" else "https"
    rng = random.Random(1)
    urls = [f"{scheme}://{HOST}:{args.port}/p{rng.randrange(args.pages)}.html"
            for _ in range(args.fetches)]
    results: list[tuple[int, int, str]] = []
    lock = threading.Lock()
    nxt = [0]
    errors: list[str] = []

    def worker() -> None:
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(urls):
                return
            try:
                out = fetch(urls[i])
            except Exception as exc:  # a client's error is a result to report, not a crash
                with lock:
                    errors.append(repr(exc)[:200])
                continue
            with lock:
                results.append(out)

    threading.stack_size(512 << 10)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    print(json.dumps({
        "fetched": len(results), "errors": len(errors), "first_errors": errors[:3],
        "ok": sum(1 for s, _, _ in results if s == 200),
        "bytes": sum(n for _, n, _ in results), "versions": sorted({v for _, _, v in results}),
        "wall_s": wall, "cpu_s": cpu, "peak_rss": bu.peak_rss_bytes(),
    }))


# -- the driver ----------------------------------------------------------------------------


def run_client(args: argparse.Namespace, client: str, protocol: str, port: int,
               ca: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--client-run", client,
           "--protocol", protocol, "--port", str(port), "--ca", ca, "--pages", str(args.pages),
           "--fetches", str(args.fetches), "--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=REPO,
                          check=False)
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    out["pages_per_s"] = out["fetched"] / max(out["wall_s"], 1e-9)
    out["cpu_ms_per_fetch"] = 1e3 * out["cpu_s"] / max(out["fetched"], 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=2000)
    p.add_argument("--fetches", type=int, default=20_000)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--protocols", default=",".join(PROTOCOLS))
    p.add_argument("--workdir", help="parent of the temporary site directory")
    p.add_argument("--out", help="JSON path (default bench-results/fetchers-<timestamp>.json)")
    p.add_argument("--client-run", choices=CLIENTS, help=argparse.SUPPRESS)
    p.add_argument("--protocol", choices=PROTOCOLS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ca", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client_run:
        args.client = args.client_run
        client_main(args)
        return 0

    import trustme

    clients = [c for c in args.clients.split(",") if c]
    protocols = [x for x in args.protocols.split(",") if x]
    work = Path(tempfile.mkdtemp(prefix="bench-fetchers-", dir=args.workdir))
    try:
        make_site(work, args.pages, seed=7)
        ca = trustme.CA()
        cert = ca.issue_cert(HOST)
        cert.cert_chain_pems[0].write_to_path(str(work / "cert.pem"))
        for pem in cert.cert_chain_pems[1:]:
            with open(work / "cert.pem", "ab") as f:
                f.write(pem.bytes())
        cert.private_key_pem.write_to_path(str(work / "key.pem"))
        ca.cert_pem.write_to_path(str(work / "ca.pem"))
        ports = {x: bu.free_port() for x in PROTOCOLS}
        nginx_conf(work, ports["http1"], ports["https1"], ports["h2"], work / "cert.pem",
                   work / "key.pem")
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            raise SystemExit("bench_fetchers: nginx not found: apt-get install -y nginx-light")
        with nginx_serving(work, ports["http1"], nginx):  # one nginx: every port or none
            for rep in range(args.repeat):
                for protocol in protocols:
                    for client in clients:
                        r = run_client(args, client, protocol, ports[protocol],
                                       str(work / "ca.pem"))
                        runs.setdefault((client, protocol), []).append(r)
                        bu.log(f"run {rep + 1} {client} {protocol}: " + (
                            f"failed: {r['failed']}" if "failed" in r else
                            f"{r['fetched']} ok={r['ok']} err={r['errors']} "
                            f"{r['pages_per_s']:.0f}/s {r['cpu_ms_per_fetch']:.3f} ms "
                            f"{r['versions']} rss {r['peak_rss'] / 1e6:.1f} MB"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    summary = []
    for (client, protocol), rs in runs.items():
        good = [r for r in rs if "failed" not in r]
        if not good:
            rows.append([client, protocol, "failed", "", "", "", ""])
            continue
        s = {"client": client, "protocol": protocol, "runs": len(good),
             "pages_per_s": bu.median([r["pages_per_s"] for r in good]),
             "cpu_ms_per_fetch": bu.median([r["cpu_ms_per_fetch"] for r in good]),
             "peak_rss": bu.median([r["peak_rss"] for r in good]),
             "versions": sorted({v for r in good for v in r["versions"]}),
             "errors": sum(r["errors"] for r in good)}
        summary.append(s)
        rows.append([client, protocol, f"{s['pages_per_s']:.0f}", f"{s['cpu_ms_per_fetch']:.3f}",
                     f"{s['peak_rss'] / 1e6:.1f} MB", ", ".join(s["versions"]),
                     str(s["errors"])])
    print(bu.markdown_table(["client", "protocol", "pages/s", "CPU ms/fetch", "peak RSS",
                             "negotiated", "errors"], rows))
    out = Path(args.out or REPO / "bench-results" / f"fetchers-{bu.timestamp()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": bu.machine_info(("pycurl", "httpx", "h2")),
                               "args": vars(args), "results": summary}, indent=1))
    bu.log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
