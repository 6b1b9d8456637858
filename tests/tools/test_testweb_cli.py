"""python -m tools.testweb (serve, export, oracle) and the load generator."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tools.testweb import client, loadgen
from tools.testweb.cli import build_parser, main
from tools.testweb.faults import parse_cli
from tools.testweb.graph import SiteConfig
from tools.testweb.harness import TestWeb

ROOT = Path(__file__).resolve().parents[2]


def test_every_subcommand_has_help_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("serve", "export", "oracle"):
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        assert f"python -m tools.testweb {name}" in capsys.readouterr().out
    assert set(build_parser()._subparsers._group_actions[0].choices) == {  # type: ignore[union-attr]
        "serve", "export", "oracle"}


def test_oracle_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["oracle", "--pages", "30", "--hosts", "2", "--max-depth", "1"]) == 0
    out = capsys.readouterr()
    urls = out.out.split()
    assert urls[0] == "http://h0.test:8080/" and len(urls) > 5
    assert "fetched" in out.err


def test_errors_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["oracle", "--pages", "1", "--hosts", "3"]) == 1
    assert capsys.readouterr().err.startswith("testweb: error: ")
    assert main(["oracle", "--fault", "nosuchfault"]) == 1
    with pytest.raises(SystemExit) as exc:
        main(["oracle", "--pages", "many"])
    assert exc.value.code == 2


def test_export_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "site"), "--pages", "20", "--hosts", "2"]) == 0
    assert (tmp_path / "site/nginx.conf").exists()
    assert (tmp_path / "site/www/h0.test/index.html").exists()
    assert "nginx -p" in capsys.readouterr().out


def test_fault_specs() -> None:
    (f,) = parse_cli(["slow_first_byte@h1.test/s0/:delay=0.5"])
    assert (f.kind, f.host, f.prefix, f.get("delay")) == ("slow_first_byte", "h1.test", "/s0/", 0.5)
    assert len(parse_cli(["all"])) > 20


def test_serve_prints_where_and_stops_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.testweb", "serve", "--pages", "20", "--hosts", "2",
         "--port", "0", "--https-port", "0", "--dns-port", "0", "--log", str(log),
         "--fault", "status_500"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(5)]
        seed = re.search(r"seed: (\S+)", lines[0]).group(1)  # type: ignore[union-attr]
        ip, port = re.search(r"nameserver: ([0-9.]+):([0-9]+)", lines[2]).groups()  # type: ignore[union-attr]
        ca = re.search(r"ca: (\S+)", lines[3]).group(1)  # type: ignore[union-attr]
        s = client.session(client.dns_resolver((ip, int(port))), ca)
        assert s.get(seed, timeout=5).status_code == 200
        assert s.get(seed + "x/status_500/1", timeout=5).status_code == 500
        assert s.get(seed.replace("http://h0", "https://h1").rsplit(":", 1)[0] + ":" +
                     re.search(r"https: [0-9.]+:([0-9]+)", lines[1]).group(1) + "/",  # type: ignore[union-attr]
                     timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "3 requests written" in out
    assert len(log.read_text().splitlines()) == 3


def test_loadgen_serves_pages_with_slow_clients_held() -> None:
    config = SiteConfig(pages=50, hosts=3, seed=0)
    with TestWeb(config, dns_port=None) as web:
        result = asyncio.run(loadgen.run("127.0.0.1", web.http_port, config, connections=8,
                                         requests=300, duration=60, slow=100))
        assert result["pages"] == 300 and result["non_200"] == 0
        assert result["slow_opened"] == 100 and result["slow_open_at_end"] == 100
        assert len(web.log) >= 300


def test_loadgen_refuses_other_addresses() -> None:
    with pytest.raises(ValueError, match="loopback"):
        asyncio.run(loadgen.run("10.1.2.3", 80, SiteConfig(pages=5, hosts=1), connections=1,
                                requests=1, duration=1, slow=0))


def test_loadgen_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    config = SiteConfig(pages=20, hosts=2, seed=0)
    with TestWeb(config, dns_port=None) as web:
        assert loadgen.main(["--port", str(web.http_port), "--pages", "20", "--hosts", "2",
                             "--requests", "50", "--connections", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["pages"] == 50


def test_requests_is_never_sent_off_loopback() -> None:
    """The client helpers resolve only to what they are given (no system DNS)."""
    s = client.session(client.static_resolver({"h0.test": "127.0.0.1"}))
    with pytest.raises(requests.ConnectionError, match="NXDOMAIN"):
        s.get("http://example.com/", timeout=1)


@pytest.mark.parametrize("taken", ["--port", "--dns-port"])
def test_serve_on_a_port_in_use_says_which_port(
    taken: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    kind = socket.SOCK_DGRAM if taken == "--dns-port" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as holder:
        holder.bind(("127.0.0.1", 0))
        if kind == socket.SOCK_STREAM:
            holder.listen(1)
        port = holder.getsockname()[1]
        ports = {"--port": "0", "--https-port": "0", "--dns-port": "0", taken: str(port)}
        args = ["serve", "--pages", "20", "--hosts", "2"]
        assert main([*args, *(x for kv in ports.items() for x in kv)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("testweb: error: "), err
    proto = "dns" if taken == "--dns-port" else "http"
    assert f"{proto} port 127.0.0.1:{port}: Address already in use" in err[0]
    assert "--dns-port" in err[0] and "0: any free port" in err[0]
