"""Load generator for the test web's HTTP server: pages/s on loopback.

    python -m tools.testweb.loadgen --spawn --pages 5000 --hosts 20 \\
        --connections 50 --requests 20000 --duration 30 --slow 5000

``--spawn`` starts ``python -m tools.testweb serve`` in a subprocess (its own
core and GIL) on a free port and stops it afterwards; otherwise give the
``--port`` of a server started with the same --pages/--hosts/--seed. The
request targets come from the same deterministic graph: random pages of
random hosts (plain HTTP hosts only), over keep-alive connections.

``--slow N`` first opens N slowloris connections that send a request head
one byte every few seconds and never finish it; they stay open during the
measurement, and the report says how many were still open at the end.

Bounded: stops after ``--requests`` answers or ``--duration`` seconds,
whichever comes first. Loopback only (the address must be in 127.0.0.0/8).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Sequence

from . import graph as g
from .graph import Graph, SiteConfig

SLOW_INTERVAL = 5.0  # seconds between the bytes of a slow client's request head


def _targets(config: SiteConfig) -> list[tuple[str, str]]:
    gr = Graph(config)
    tls = config.tls
    return [
        (g.host_name(gr.host_of[pid]), gr.page_path(pid))
        for pid in range(config.pages)
        if gr.host_of[pid] not in tls
    ]


async def _worker(address: str, port: int, targets: list[tuple[str, str]], rng: random.Random,
                  stats: dict[str, int], deadline: float, budget: list[int]) -> None:
    reader, writer = await asyncio.open_connection(address, port)
    try:
        while budget[0] > 0 and time.monotonic() < deadline:
            budget[0] -= 1
            host, path = targets[int(rng.random() * len(targets))]
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"\r\ncontent-length: *([0-9]+)", head, re.IGNORECASE)
            body = await reader.readexactly(int(m.group(1))) if m else b""
            status = int(head[9:12])
            stats["ok" if status == 200 else "other"] += 1
            stats["bytes"] += len(body)
    finally:
        writer.close()


async def _slow_client(address: str, port: int, stop: asyncio.Event,
                       opened: list[int]) -> bool:
    """Hold a never-finished request; True if the server still had it open at the end."""
    try:
        reader, writer = await asyncio.open_connection(address, port)
    except OSError:
        return False
    opened.append(1)
    request = b"GET / HTTP/1.1\r\nHost: h0.test\r\nX-Slow: " + b"z" * 10_000
    try:
        for byte in request:
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                await asyncio.wait_for(stop.wait(), SLOW_INTERVAL)
                break
            except TimeoutError:
                pass
        return not reader.at_eof()
    except OSError:
        return False
    finally:
        writer.close()


async def run(address: str, port: int, config: SiteConfig, *, connections: int, requests: int,
              duration: float, slow: int, seed: int = 1) -> dict[str, float]:
    """Drive the server at ``address:port``; returns the measurements."""
    if ipaddress.ip_address(address) not in ipaddress.ip_network("127.0.0.0/8"):
        raise ValueError(f"loopback only, not {address}")
    targets = _targets(config)
    stop = asyncio.Event()
    opened: list[int] = []
    slow_tasks = []
    for i in range(slow):
        slow_tasks.append(asyncio.create_task(_slow_client(address, port, stop, opened)))
        if i % 500 == 499:
            await asyncio.sleep(0.05)  # do not overflow the accept backlog at once
    await asyncio.sleep(0.5 if slow else 0)
    stats = {"ok": 0, "other": 0, "bytes": 0}
    budget = [requests]
    started = time.monotonic()
    deadline = started + duration
    rngs = [random.Random(seed * 1000 + i) for i in range(connections)]
    await asyncio.gather(*(_worker(address, port, targets, rngs[i], stats, deadline, budget)
                           for i in range(connections)))
    elapsed = time.monotonic() - started
    stop.set()
    still_open = sum(r is True for r in await asyncio.gather(*slow_tasks, return_exceptions=True))
    return {
        "pages": stats["ok"],
        "non_200": stats["other"],
        "seconds": round(elapsed, 3),
        "pages_per_s": round(stats["ok"] / elapsed, 1),
        "mb_per_s": round(stats["bytes"] / elapsed / 1e6, 1),
        "connections": connections,
        "slow_opened": len(opened),
        "slow_open_at_end": still_open,
    }


def _spawn(config: SiteConfig) -> tuple[subprocess.Popen[str], int]:
    cmd = [sys.executable, "-m", "tools.testweb", "serve", "--pages", str(config.pages),
           "--hosts", str(config.hosts), "--seed", str(config.seed), "--port", "0",
           "--https-port", "0", "--no-dns"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.match(r"http: [0-9.]+:([0-9]+)", line)
        if m:
            return proc, int(m.group(1))
    proc.wait()
    raise RuntimeError(f"the server did not start (exit {proc.returncode})")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="127.0.0.1")
    p.add_argument("--port", type=int, help="a running server (else use --spawn)")
    p.add_argument("--spawn", action="store_true", help="start a server subprocess")
    p.add_argument("--pages", type=int, default=5000)
    p.add_argument("--hosts", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--connections", type=int, default=50)
    p.add_argument("--requests", type=int, default=20_000, help="stop after this many answers")
    p.add_argument("--duration", type=float, default=30.0, help="stop after this many seconds")
    p.add_argument("--slow", type=int, default=0, help="slowloris connections held meanwhile")
    ns = p.parse_args(argv)
    if ns.port is None and not ns.spawn:
        p.error("give --port or --spawn")
    config = SiteConfig(pages=ns.pages, hosts=ns.hosts, seed=ns.seed)
    proc = None
    port = ns.port
    if ns.spawn:
        proc, port = _spawn(config)
    try:
        result = asyncio.run(run(ns.address, port, config, connections=ns.connections,
                                 requests=ns.requests, duration=ns.duration, slow=ns.slow))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
