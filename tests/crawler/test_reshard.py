"""crawler reshard: all of a crawl's state goes to its new owners; a kill -9 anywhere is safe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import (
    REPO,
    cli_args,
    fetched_urls,
    page_refetches,
    records,
    shard_paths,
)
from test_shards import assert_owned, crawl, summary

import kvstore
from crawler.cli import main
from crawler.state.badhosts import BadHosts
from crawler.state.cookiestore import CookieJar
from crawler.state.outbox import Outbox
from crawler.state.pages import Pending, decode_bulk
from crawler.state.reshard import KILL_ENV
from crawler.state.robotsstore import store_key
from crawler.state.shards import (
    RESHARD_NAME,
    SHARDS_NAME,
    Router,
    ShardPlace,
    owner,
    place,
    read_placement,
    read_started,
    write_placement,
)
from crawler.web.urls import host_key, host_of, parse, url_key
from tools.testweb import SiteConfig, TestWeb

MakeWeb = Callable[..., TestWeb]
# two hosts of one site, owned by shards 0 and 1 of 2; and a host marked bad
COOKIE_HOSTS = [next(h for i in range(100) if owner(h := f"a{i}.example.com", 2) == s)
                for s in (0, 1)]
BAD_HOST = "gone.test"


def crawl_part(web: TestWeb, data: Path, limit: int, *extra: str) -> None:
    """A 2-shard crawl of ``limit`` pages, more until both shards recorded some. The
    shards take from one count, so the shard of the seed's host alone could use it all
    while the other waited for links, DNS and robots.txt: the other shard gets a seed
    of its own, a page the oracle's crawl fetches (so the crawl's pages stay the
    oracle's)."""
    first = owner(host_of(web.seed_url), 2)
    other = sorted(u for u in web.oracle.crawl().fetched if owner(host_of(u), 2) != first)[0]
    seeds = data.parent / f"{data.name}-seeds.txt"
    seeds.write_text(other + "\n")
    for _ in range(5):
        crawl(web, data, 2, "--max-pages", str(limit), "--seeds-file", str(seeds), *extra)
        if all(len(records(p)) for p in shard_paths(data)):
            return
    raise AssertionError("a shard recorded nothing in five runs")


def reshard_cli(data: Path, n: int, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if kill_at:
        env[KILL_ENV] = kill_at
    return subprocess.run([sys.executable, "-m", "crawler", "reshard", str(data), "--shards",
                           str(n)], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=env)


def pending_urls(data: Path) -> dict[str, int]:
    """URL -> the shard whose PendDB holds it in a live bulk."""
    return {u: i for u, (i, _) in pending_depths(data).items()}


def pending_depths(data: Path) -> dict[str, tuple[int, int]]:
    """URL -> (the shard whose PendDB holds it in a live bulk, its smallest depth there)."""
    out: dict[str, tuple[int, int]] = {}
    for i, shard in enumerate(shard_paths(data)):
        with kvstore.open(shard / "pend", readonly=True) as pend:
            for bk in pend:
                for e in decode_bulk(pend[bk]):
                    out[e.url] = (i, min(e.depth, out.get(e.url, (i, e.depth))[1]))
    return out


def deep_foreign_pending(data: Path) -> list[str]:
    """Shard 1's pending URLs below depth 0: a depth-0 link to one is a shorter path
    (not its seed, pending at depth 0 when its shard had not claimed it yet)."""
    return foreign({u for u, (_, d) in pending_depths(data).items() if d > 0}, 2)


def inject_outbox(data: Path, count: int, urls: list[str], depth: int = 1) -> None:
    """Links waiting in shard 0's outbox for their owners (what a stop leaves when the
    owner had not answered), written through the crawler's own Outbox."""
    box = Outbox(str(data / "shard-00"), Router(ShardPlace(0, count)))
    box.route([(url_key(u), Pending(u, depth)) for u in urls])
    assert box.write() == len(urls)
    box.close()


def foreign(urls: set[str], count: int) -> list[str]:
    return sorted(u for u in urls if owner(host_of(u), count) != 0)


def counters_are_exact(data: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """status from the counters the reshard wrote equals a recount of every record."""
    capsys.readouterr()
    assert main(["status", str(data), "--json"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert main(["status", str(data), "--json", "--recount"]) == 0
    slow = json.loads(capsys.readouterr().out)
    assert fast["counts_from"] == "counters", fast["counts_from"]
    for k in ("recorded", "fetched", "pending", "pending_bulks", "outcomes"):
        assert fast[k] == slow[k], k
    return fast


def test_reshard_between_runs_ends_at_the_oracle_with_no_page_fetched_twice(
    make_testweb: MakeWeb, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = make_testweb(pages=700, hosts=8, seed=11, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    # a part of the crawl, more until shard 1 has recorded pages and there are pages
    # nobody holds yet (which pages a part reaches depends on the machine's load: CI once
    # saw shard 1 record none outside its bulks after 60)
    for limit in (60, 120, 240):
        crawl_part(web, data, limit)
        done = set(records(data))
        queued = pending_urls(data)
        unknown = foreign(want - done - set(queued), 2)[:5]  # links nobody holds yet
        known = foreign(done - set(queued), 2)[:3]  # and links recorded (in no live bulk)
        if unknown and known:
            break
    assert unknown and known
    inject_outbox(data, 2, unknown + known)
    # 2 -> 3 -> 2 -> 4 -> 1 -> 2, a part of the crawl between each
    for n, limit in [(3, 80), (2, 60), (4, 80), (1, 40), (2, 0)]:
        capsys.readouterr()
        assert main(["reshard", str(data), "--shards", str(n)]) == 0
        out = capsys.readouterr().out
        assert f"-> {n} shard(s)" in out and f"--processes {n}" in out
        assert json.loads((data / SHARDS_NAME).read_text())["shards"] == n
        assert not (data / RESHARD_NAME).exists()
        assert (n == 1) == (data / "main").is_dir()  # and no old shard left behind:
        assert sorted(p.name for p in data.glob("shard-*")) == (
            [f"shard-{i:02d}" for i in range(n)] if n > 1 else [])
        assert_owned(data, n)
        after = pending_urls(data)
        for u in unknown:  # nothing the outboxes held is lost...
            assert u in after or u in records(data), u
            if u in after:
                assert after[u] == owner(host_of(u), n)
        if limit == 80 and n == 3:
            assert "outbox links admitted" in out
            assert all(u not in after for u in known)  # ...and nothing known is queued again
        counters_are_exact(data, capsys)
        got = summary(crawl(web, data, n, *(["--max-pages", str(limit)] if limit else [])))
        assert got["complete"] is (not limit)
    assert fetched_urls(data) == want
    assert page_refetches(web) == {}  # no page fetched twice across six runs and five reshards


@pytest.mark.slow
def test_a_crawl_on_ray_resumes_with_another_count_after_a_reshard(
    make_testweb: MakeWeb, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray", reason="the [ray] extra is not installed")  # CI installs it
    from tools.rayenv import new_token, ray_env, stop_cluster

    web = make_testweb(pages=300, hosts=6, seed=13, crawl_delay=0.0)
    want = set(web.oracle.crawl().fetched)
    data = tmp_path / "c"
    token = new_token()
    base = [a for a in cli_args(web, data) if a not in ("--processes", "1")]

    def on_ray(shards: int, *extra: str) -> dict[str, object]:
        done = subprocess.run([*base, "--ray", "local", "--shards", str(shards), *extra],
                              cwd=REPO, env=ray_env(token), capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        return summary(done.stdout)

    try:
        assert on_ray(2, "--max-pages", "60")["complete"] is False
        assert read_placement(str(data)) == ["127.0.0.1"] * 2
        capsys.readouterr()
        assert main(["reshard", str(data), "--shards", "3"]) == 0
        out = capsys.readouterr().out
        assert "round-robin over 1 node(s)" in out and "--ray ADDRESS --shards 3" in out
        assert read_placement(str(data)) == ["127.0.0.1"] * 3
        assert on_ray(3)["complete"] is True
    finally:
        stop_cluster(token)
    assert fetched_urls(data) == want
    assert page_refetches(web) == {}
    assert_owned(data, 3)


# -- kills at every phase, on one partial crawl ---------------------------------------------


@pytest.fixture(scope="module")
def partial(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 2-shard crawl stopped part-way, with links waiting in an outbox."""
    web = TestWeb(SiteConfig(pages=300, hosts=6, seed=12, crawl_delay=0.0)).start()
    try:
        data = tmp_path_factory.mktemp("reshard") / "base"
        # (due.bin, prior/) ...and on, until shard 1 has a link pending: the "shorter"
        # outbox link below is one of them (under load a run once stopped with none)
        for limit in (100, 60, 120):
            crawl_part(web, data, limit, "--revisit-after", "1h")
            if deep_foreign_pending(data):
                break
        else:
            raise AssertionError("shard 1 had no link pending after three runs")
        want = set(web.oracle.crawl().fetched)
        inject_outbox(data, 2, foreign(want - set(records(data)) - set(pending_urls(data)), 2))
        inject_outbox(data, 2, deep_foreign_pending(data)[:1], depth=0)  # shorter
        # A host whose shard keeps records of other hosts after its recrawl (which takes
        # its records out of MainDB): the tests after it need records in both shards.
        hosts = sorted({host_of(u) for u in records(data)})
        per_shard = Counter(owner(h, 2) for h in hosts)
        host = next(h for h in hosts if per_shard[owner(h, 2)] > 1)
        assert main(["recrawl", str(data), "--older-than", "0", "--host", host]) == 0
        for i, cookie_host in enumerate(COOKIE_HOSTS):  # each set by its host's shard
            jar = CookieJar(str(data / f"shard-0{i}"), clock=lambda i=i: 1000.0 + i)
            assert jar.receive(parse(f"http://{cookie_host}/"),
                               f"own{i}=x\nshared=from{i}; Domain=example.com")
            jar.close()
        bad = BadHosts(str(data / f"shard-0{owner(BAD_HOST, 2)}"))
        bad.mark(host_key(BAD_HOST), BAD_HOST, "connect_refused", 2e9)
        bad.close()
        yield data
    finally:
        web.stop()


def snapshot(data: Path) -> dict[str, Any]:
    """Every file of a crawl directory, a store as its key -> value mapping."""
    out: dict[str, Any] = {}
    for root, dirs, files in os.walk(data):
        rel = os.path.relpath(root, data)
        if any(f.endswith(".key") for f in files):
            with kvstore.open(root, readonly=True) as store:
                out[rel] = {k: store[k] for k in store}
            dirs.clear()
            continue
        for f in files:
            if f != "supervisor.lock" and Path(root, f).is_file():  # not inbox.sock
                out[os.path.join(rel, f)] = Path(root, f).read_bytes()
    return out


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("inbox.sock"))
    return dst


@pytest.fixture(scope="module")
def resharded(partial: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The partial crawl resharded without a kill: to 3, to 1, and that one back to 2."""
    root = tmp_path_factory.mktemp("ref")
    out = {}
    for n in (3, 1):
        out[n] = copy(partial, root / f"to{n}")
        assert main(["reshard", str(out[n]), "--shards", str(n)]) == 0
    out[12] = copy(out[1], root / "1to2")
    assert main(["reshard", str(out[12]), "--shards", "2"]) == 0
    return out


@pytest.mark.parametrize(("source", "n", "point"), [
    (2, 3, "record:15"), (2, 3, "built"), (2, 3, "committed"), (2, 3, "swap:3"),
    (2, 3, "swapped"), (2, 1, "swap:4"), (1, 2, "swap:3"),
])
def test_a_kill9_anywhere_then_the_same_command_ends_as_an_uninterrupted_run(
    partial: Path, resharded: dict[int, Path], tmp_path: Path, source: int, n: int, point: str,
) -> None:
    data = copy(partial if source == 2 else resharded[1], tmp_path / "c")
    killed = reshard_cli(data, n, kill_at=point)
    assert killed.returncode == -9, killed.stderr
    assert (data / RESHARD_NAME).exists()
    for command in (["start", "--data", str(data)], ["status", str(data)]):
        refused = subprocess.run([sys.executable, "-m", "crawler", *command], cwd=REPO,
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and f"reshard {data} --shards {n} again" in lines[0], lines
    again = reshard_cli(data, n)
    assert again.returncode == 0, again.stderr
    assert snapshot(data) == snapshot(resharded[n if source == 2 else 12])


def test_every_record_and_pending_url_moved_once(partial: Path, resharded: dict[int, Path]
                                                 ) -> None:
    before = {u: r.status for u, r in records(partial).items()}
    for n in (3, 1):
        assert {u: r.status for u, r in records(resharded[n]).items()} == before
        queued = pending_urls(resharded[n])
        assert set(pending_urls(partial)) <= set(queued)
        assert all(i == owner(host_of(u), n) for u, i in queued.items())
    # 2 -> 1 -> 2 is where it started, the outbox's links now pending at their owner
    again = snapshot(resharded[12])
    first = snapshot(partial)
    for shard in ("shard-00", "shard-01"):
        assert again[f"{shard}/main"] == first[f"{shard}/main"]


def test_a_dry_run_after_a_reshard_reads_no_record(resharded: dict[int, Path]) -> None:
    """Each new shard's outcome log is written with its MainDB: its rows stand."""
    from crawler.state.retry import Selection, requeue

    for n, data in resharded.items():
        report = requeue(str(data), Selection(statuses=("2xx", "3xx", "4xx", "5xx", "0")),
                         dry_run=True)
        robots = sum(c for k, c in report.counts.items() if k.startswith("robots_"))
        assert report.from_log == len(records(data)) > 0, n
        assert report.heads_read == robots, n


def stores(data: Path, name: str) -> dict[bytes, tuple[int, bytes]]:
    """Key -> (shard, value) of one store over every shard (a key in two: a failure)."""
    out: dict[bytes, tuple[int, bytes]] = {}
    for i, shard in enumerate(shard_paths(data)):
        if (shard / name).is_dir():
            with kvstore.open(shard / name, readonly=True) as store:
                for k in store:
                    assert k not in out, (name, k.hex())
                    out[k] = (i, store[k])
    return out


def log_records(data: Path, name: str, width: int) -> list[tuple[int, bytes]]:
    """(shard, record) of a depths.bin or due.bin over every shard."""
    out = []
    for i, shard in enumerate(shard_paths(data)):
        if (shard / name).exists():
            raw = (shard / name).read_bytes()
            out += [(i, raw[j : j + width]) for j in range(0, len(raw), width)]
    return out


def test_every_kind_of_state_goes_to_the_owner_of_its_host(
    partial: Path, resharded: dict[int, Path]
) -> None:
    old_urls = set(records(partial)) | set(pending_urls(partial))
    for n in (3, 1):
        data = resharded[n]
        urls = set(records(data)) | set(pending_urls(data))
        assert old_urls <= urls  # the outbox's links came in too
        key_owner = {url_key(u): owner(host_of(u), n) for u in urls}
        origin_owner = {store_key(parse(u).robots_key): owner(host_of(u), n) for u in urls}
        for name, to_owner in [("main", key_owner), ("prior", key_owner),
                               ("robots", origin_owner), ("badhosts", None),
                               ("sitemaps", None)]:
            before = {k: v for k, (_, v) in stores(partial, name).items()}
            after = stores(data, name)
            assert before and {k: v for k, (_, v) in after.items()} == before, name
            for k, (i, v) in after.items():
                if name == "badhosts":
                    assert i == owner(json.loads(v)["host"], n)
                elif name == "sitemaps":
                    assert i == owner(host_of(json.loads(zlib.decompress(v[5:]))["url"]), n)
                else:
                    assert to_owner is not None and i == to_owner[k], (name, k.hex())
        for name, width in [("depths.bin", 18), ("due.bin", 24)]:
            before_log = Counter(r for _, r in log_records(partial, name, width))
            after_log = log_records(data, name, width)
            assert before_log and before_log <= Counter(r for _, r in after_log), name
            assert all(i == key_owner[r[:16]] for i, r in after_log), name
        # the pending link that came from the outbox at depth 0 is remembered at it
        with kvstore.open(partial / "shard-00" / "outbox", readonly=True) as box:
            short = [url_key(e.url) for k in box for e in decode_bulk(box[k]) if e.depth == 0]
        depths = [r for _, r in log_records(data, "depths.bin", 18) if r[:16] == short[0]]
        assert len(short) == 1 and len(depths) >= 2 and depths[-1][16:] == b"\0\0"
        lines = [(i, u) for i, shard in enumerate(shard_paths(data))
                 for u in (shard / "urls.log").read_text().splitlines()]
        assert all(i == owner(host_of(u), n) for i, u in lines)
        assert Counter(u for _, u in lines) >= Counter(
            u for shard in shard_paths(partial) for u in (shard / "urls.log").read_text().split())
        # cookies: a host-only one at its host's owner, a domain one at every shard (newest)
        for i, shard in enumerate(shard_paths(data)):
            jar = CookieJar(str(shard), readonly=True)
            got = {c.name: c.value for c in jar.cookies("example.com")}
            jar.close()
            mine = {f"own{j}": "x" for j, h in enumerate(COOKIE_HOSTS) if owner(h, n) == i}
            assert got == {**mine, "shared": "from1"}, (n, i)


# -- refusals -----------------------------------------------------------------------------


def one_error_line(args: list[str], capsys: pytest.CaptureFixture[str], code: int = 1) -> str:
    capsys.readouterr()
    assert main(args) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_ray_placement_is_rewritten_and_absent_shards_are_refused(
    partial: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = copy(partial, tmp_path / "ray")
    write_placement(str(data), ["10.0.0.2", "10.0.0.1"], [True, False])
    shutil.move(data / "shard-01", tmp_path / "elsewhere")
    line = one_error_line(["reshard", str(data), "--shards", "3"], capsys)
    assert "shard(s) 1 of this Ray crawl are not on this machine" in line
    assert not (data / RESHARD_NAME).exists()
    shutil.move(tmp_path / "elsewhere", data / "shard-01")
    assert main(["reshard", str(data), "--shards", "3"]) == 0
    assert "10.0.0.1: shard-00 shard-02" in capsys.readouterr().out
    nodes = read_placement(str(data))
    assert nodes == place(3, ["10.0.0.2", "10.0.0.1"]) == ["10.0.0.1", "10.0.0.2", "10.0.0.1"]
    # every new shard is written here: wherever it is copied, it must be found there
    assert read_started(str(data), 3) == [True] * 3


@pytest.mark.parametrize("victim", ["first", "last"])
def test_mistakes_and_damage_are_one_line_and_change_nothing(
    partial: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], victim: str
) -> None:
    """The damaged record is the first live one, or the last, whose value ends in the
    VAL tail that the clean close's stamp covers (CI once flipped a byte there by
    chance: the open cut the record as a torn write and the reshard went on)."""
    data = copy(partial, tmp_path / "c")
    assert "1 to " in one_error_line(["reshard", str(data), "--shards", "0"], capsys, 2)
    capsys.readouterr()
    assert main(["reshard", str(data), "--shards", "2"]) == 0
    assert "has 2 shard(s) already" in capsys.readouterr().out
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    with kvstore.open(data / "shard-01" / "main") as store:  # a crawl holds the stores
        line = one_error_line(["reshard", str(data), "--shards", "3"], capsys)
        assert "a crawl is running" in line
        if victim == "last":  # a live value written again: the last record of VAL
            _, keys, _ = store.versions()
            store[bytes(keys[0])] = store[bytes(keys[0])]
        _, _, offsets = store.versions()  # a live record's place in the VAL file
    val = next((data / "shard-01" / "main").glob("*.val"))
    raw = bytearray(val.read_bytes())
    if victim == "first":
        at = int(offsets.min()) + 40  # inside the record's value: its CRC fails
    else:  # the value's last byte (a record: u32 length, u32 CRC, 16-byte key, value)
        start = int(offsets.max())
        at = start + 24 + int.from_bytes(raw[start : start + 4], "little") - 1
        assert len(raw) - at <= kvstore._indexfile.TAIL_BYTES, "not in the stamped tail"
    raw[at] ^= 0xFF
    val.write_bytes(bytes(raw))
    line = one_error_line(["reshard", str(data), "--shards", "3"], capsys)
    assert "damaged" in line and "the crawl is as it was" in line
    assert not (data / RESHARD_NAME).exists()
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before
    assert json.loads((data / SHARDS_NAME).read_text())["shards"] == 2
