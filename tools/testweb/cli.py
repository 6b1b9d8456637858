"""python -m tools.testweb: serve the test web, export it, or ask the oracle."""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from .export import export
from .faults import KINDS, Fault, parse_cli
from .graph import Graph, SiteConfig
from .harness import TestWeb
from .oracle import Oracle
from .site import Site

PROG = "testweb"


class _Error(Exception):
    pass


def _site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pages", type=int, default=200, help="pages in the site (default 200)")
    p.add_argument("--hosts", type=int, default=4, help="virtual hosts h0.test... (default 4)")
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument("--crawl-delay", type=float, default=1.0,
                   help="Crawl-delay of the hosts whose robots.txt sets one (default 1)")
    p.add_argument("--tls-hosts", default=None,
                   help="comma-separated host indexes served over HTTPS (default: the last)")


def _fault_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="kind[@host][/prefix][:knob=value,...], or 'all'; repeatable. "
                        f"Kinds: {', '.join(KINDS)}")


def _config(ns: argparse.Namespace) -> SiteConfig:
    tls = None
    if ns.tls_hosts is not None:
        tls = tuple(int(x) for x in ns.tls_hosts.split(",") if x.strip())
    try:
        return SiteConfig(pages=ns.pages, hosts=ns.hosts, seed=ns.seed, tls_hosts=tls,
                          crawl_delay=ns.crawl_delay)
    except ValueError as exc:
        raise _Error(str(exc)) from exc


def _faults(ns: argparse.Namespace) -> tuple[Fault, ...]:
    try:
        return parse_cli(ns.fault)
    except ValueError as exc:
        raise _Error(str(exc)) from exc


def cmd_serve(ns: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM; print where everything is."""
    web = TestWeb(_config(ns), faults=_faults(ns), address=ns.address, http_port=ns.port,
                  https_port=ns.https_port, dns_port=None if ns.no_dns else ns.dns_port)
    try:
        web.start()
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise _Error(f"{exc.strerror}: choose another with --port, --https-port or "
                     "--dns-port (0: any free port)") from None
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        print(f"seed: {web.seed_url}")
        print(f"http: {ns.address}:{web.http_port}  https: {ns.address}:{web.https_port}")
        if web.dns is not None:
            ip, port = web.nameserver
            print(f"nameserver: {ip}:{port}  (crawler: --nameserver {ip}:{port})")
        print(f"ca: {web.ca_file}")
        print("hosts: " + " ".join(f"{h.name}={h.ip}" for h in web.site.hosts.values()))
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        web.stop()
        if ns.log:
            n = web.log.dump(ns.log)
            print(f"log: {n} requests written to {ns.log}")
    return 0


def cmd_export(ns: argparse.Namespace) -> int:
    """Write the fault-free site as static files + nginx.conf + hosts."""
    started = time.monotonic()
    conf = export(Graph(_config(ns)), ns.dir, http_port=ns.port, https_port=ns.https_port)
    print(f"wrote {ns.pages} pages in {time.monotonic() - started:.1f} s")
    print(f"run: nginx -p {conf.parent} -c nginx.conf")
    return 0


def cmd_oracle(ns: argparse.Namespace) -> int:
    """Print the URLs a correct crawler fetches, one per line, sorted."""
    site = Site(Graph(_config(ns)), _faults(ns), http_port=ns.port, https_port=ns.https_port)
    result = Oracle(site).crawl(ns.seed_url or None, obey_robots=not ns.ignore_robots,
                                scope=ns.scope.split(",") if ns.scope else None,
                                max_depth=ns.max_depth)
    for url in sorted(result.fetched):
        print(url)
    print(f"# {len(result.fetched)} fetched, {len(result.robots)} robots.txt, "
          f"{len(result.blocked)} blocked, {len(result.unreachable)} unreachable",
          file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve the site over HTTP(S) and DNS on loopback",
                       description="Example: python -m tools.testweb serve --pages 50000 "
                                   "--hosts 20 --port 8080 --dns-port 5353")
    _site_args(p)
    _fault_args(p)
    p.add_argument("--address", default="127.0.0.1", help="loopback address to bind")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (0: any free)")
    p.add_argument("--https-port", type=int, default=8443, help="HTTPS port (0: any free)")
    p.add_argument("--dns-port", type=int, default=5353, help="DNS port, UDP+TCP (0: any free)")
    p.add_argument("--no-dns", action="store_true", help="do not run the DNS server")
    p.add_argument("--log", help="write the request log here (JSON lines) on exit")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("export", help="write static files + nginx config + hosts map",
                       description="Example: python -m tools.testweb export data/site "
                                   "--pages 50000 --hosts 20")
    p.add_argument("dir", help="output directory")
    _site_args(p)
    p.add_argument("--port", type=int, default=8080, help="HTTP port in URLs and nginx.conf")
    p.add_argument("--https-port", type=int, default=8443, help="HTTPS port likewise")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("oracle", help="print what a correct crawler fetches",
                       description="Example: python -m tools.testweb oracle --pages 100 "
                                   "--max-depth 2 --port 8080")
    _site_args(p)
    _fault_args(p)
    p.add_argument("--port", type=int, default=8080, help="HTTP port the site is served on")
    p.add_argument("--https-port", type=int, default=8443, help="HTTPS port likewise")
    p.add_argument("--seed-url", action="append", default=[], help="seed (default h0's home)")
    p.add_argument("--ignore-robots", action="store_true", help="a crawler that ignores robots")
    p.add_argument("--scope", help="comma-separated hosts to stay on")
    p.add_argument("--max-depth", type=int, default=None)
    p.set_defaults(func=cmd_oracle)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "serve" or ns.command == "export":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        return int(ns.func(ns))
    except (_Error, OSError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
