"""``python -m crawler export --wacz``: a WACZ 1.1.1 package valid by the ``wacz`` package,
its files and digests, its CDXJ index against pywb's own indexer, SURT keys against the
``surt`` package, bounded memory, and failures that leave nothing behind.
(tests/crawler/test_pywb_replay.py loads it in pywb and replays every page.)"""

from __future__ import annotations

import hashlib
import json
import random
import resource
import signal
import string
import subprocess
import sys
import tracemalloc
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import surt
from crawl_helpers import REPO, read_lines, start_cli, wait_for
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_progress import export_cli, listed_files
from test_pywb_replay import BIN, Recrawled, recrawled
from test_warc_export import _store_with_a_big_page, _unwritable, read_warc, warcio_check

import kvstore
from crawler.cli import main
from crawler.read._linesort import LineSorter
from crawler.read.cdxj import surt_key
from crawler.read.listing import iso_time
from crawler.state.pages import PageRecord, encode_page
from crawler.web.urls import URLError, normalize, url_key

MEMBERS = ["archive/data.warc.gz", "indexes/index.cdx", "pages/pages.jsonl",
           "datapackage.json", "datapackage-digest.json"]


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Recrawled:
    return recrawled(tmp_path_factory.mktemp("recrawled"))


@pytest.fixture(scope="module")
def unpacked(crawl: Recrawled, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(crawl.wacz) as z:
        z.extractall(out)
    return out


def test_the_wacz_package_validates_it(crawl: Recrawled) -> None:
    done = subprocess.run([str(BIN / "wacz"), "validate", "-f", str(crawl.wacz)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Version detected as 1.1.1" in done.stdout
    assert "Validation succeeded, the passed WACZ is valid" in done.stdout


def test_every_file_is_listed_with_its_digest_and_size(crawl: Recrawled) -> None:
    with zipfile.ZipFile(crawl.wacz) as z:
        infos = {i.filename: i for i in z.infolist()}
        assert sorted(infos) == sorted(MEMBERS)
        # The WARC is stored, not deflated: readers seek into its gzip members.
        assert infos["archive/data.warc.gz"].compress_type == zipfile.ZIP_STORED
        package = json.loads(z.read("datapackage.json"))
        digest = json.loads(z.read("datapackage-digest.json"))
        contents = {name: z.read(name) for name in MEMBERS}
    assert package["profile"] == "data-package" and package["wacz_version"] == "1.1.1"
    assert package["title"] == "crawl crawl" and package["software"].startswith("kvcrawl/")
    assert package["created"].endswith("Z") and package["modified"] == package["created"]
    seeds = [p for p in crawl.pages.values() if p.depth == 0 and p.status == 200]
    assert package["mainPageUrl"] == min(p.url for p in seeds)
    assert package["mainPageDate"] == iso_time(crawl.pages[package["mainPageUrl"]].fetched_at)
    listed = {r["path"]: r for r in package["resources"]}
    assert sorted(listed) == sorted(MEMBERS[:3])
    for path, res in listed.items():
        assert res["name"] == path.rsplit("/", 1)[1]
        assert res["bytes"] == len(contents[path])
        assert res["hash"] == "sha256:" + hashlib.sha256(contents[path]).hexdigest()
    assert digest == {"path": "datapackage.json", "hash": "sha256:" + hashlib.sha256(
        contents["datapackage.json"]).hexdigest()}


def test_the_warc_inside_has_the_records_of_a_warc_export(
    crawl: Recrawled, unpacked: Path
) -> None:
    inside = unpacked / "archive/data.warc.gz"
    warcio_check(inside)
    recs = read_warc(inside)
    assert recs[0].type == "warcinfo" and recs[0].headers["WARC-Filename"] == "data.warc.gz"

    def captures(records: list) -> Counter[tuple[str, str, str, str]]:
        return Counter((r.type, r.headers.get("WARC-Target-URI", ""), r.headers["WARC-Date"],
                        r.headers.get("WARC-Payload-Digest", "")) for r in records[1:])

    assert captures(recs) == captures(read_warc(crawl.warc))


def test_the_index_is_the_one_pywbs_indexer_makes_of_that_warc(unpacked: Path) -> None:
    """Byte for byte: the same SURT keys, timestamps, fields, offsets and lengths, in
    the same (sorted) order."""
    ours = (unpacked / "indexes/index.cdx").read_bytes()
    done = subprocess.run([str(BIN / "cdx-indexer"), "--cdxj", "--sort", "data.warc.gz"],
                          cwd=unpacked / "archive", capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ours.count(b"\n") > 100
    assert ours == done.stdout


def test_pages_lists_every_html_page_with_its_capture_time(crawl: Recrawled,
                                                           unpacked: Path) -> None:
    lines = (unpacked / "pages/pages.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"format": "json-pages-1.0", "id": "pages",
                                    "title": "All Pages"}
    entries = [json.loads(line) for line in lines[1:]]
    html = {u: p for u, p in crawl.pages.items()
            if p.status == 200 and p.content_type.startswith("text/html")}
    assert sorted(e["url"] for e in entries) == sorted(html)
    for e in entries:
        page = html[e["url"]]
        assert e == {"id": url_key(page.url).hex(), "url": page.url,
                     "ts": iso_time(page.fetched_at)}


# -- SURT keys -----------------------------------------------------------------------------


TRICKY = [
    "http://www.example.com/", "http://www2.example.com/a/b/", "https://example.com:443/a",
    "https://example.com:80/a", "http://example.com/A/B/../C/./d//e/",
    "http://example.com/%41%2541/%7e?b=2&a=1&A=3", "http://example.com/a%20b",
    "http://example.com/a?jsessionid=0123456789abcdef0123456789abcdef&x=1",
    "http://example.com/a?x=1&phpsessid=0123456789abcdef0123456789ABCDEF",
    "http://example.com/a?sid=0123456789abcdef0123456789abcdef",
    "http://example.com/a?ASPSESSIONIDabcdefgh=abcdefghijklmnopqrstuvwx&b",
    "http://example.com/a?cfid=12&cftoken=34&z=1",
    "http://example.com/(S(abcdefghijklmnopqrstuvwx))/page.aspx?x",
    "http://example.com/(abcdefghijklmnopqrstuvwx)/page.aspx",
    "http://127.0.0.1:8080/x", "http://2130706433/x", "http://0x7f.1/", "http://017700000001/",
    "http://0.9/", "http://user:pw@Example.COM/x#frag", "http://example.com/?",
    "http://example.com/a?", "http://example.com/a?b", "http://example.com/a?b=&c",
    "http://xn--bcher-kva.example/", "http://bücher.example/ä?ö=ü",
    "http://example.com/%23hash%25pct", "http://example.com/..", "http://example.com/../a",
    "http://http://example.com/x", "http://example..com./x", "http://[::1]:8080/x",
    "http://example.com/a;b?c;d", "http://example.com/A?B=C&b=a",
]


@pytest.mark.parametrize("url", TRICKY)
def test_surt_keys_are_the_surt_packages(url: str) -> None:
    assert surt_key(url) == surt.surt(url)


def test_surt_keys_of_every_url_of_a_crawl(crawl: Recrawled) -> None:
    assert len(crawl.pages) > 50
    for url in crawl.pages:
        assert surt_key(url) == surt.surt(url), url


_part = st.lists(st.one_of(st.sampled_from([*"/.%?&=;()~!$'*,+:@AZaz09_-", "%2F", "%41",
                                            "%25", "%7E", "..", "//"]),
                           st.characters(blacklist_categories=("Cs", "Cc"))),
                 max_size=16).map("".join)
_crawled = st.builds(
    lambda scheme, host, port, path, query: f"{scheme}://{host}{port}/{path}?{query}",
    st.sampled_from(["http", "https"]),
    st.one_of(st.from_regex(r"(www\d?\.)?[a-z0-9-]{1,10}(\.[a-z]{2,5}){1,2}", fullmatch=True),
              st.ip_addresses(v=4).map(str),
              st.text(st.characters(min_codepoint=0xC0, max_codepoint=0x24F), min_size=1,
                      max_size=6).map(lambda label: f"{label}.example")),
    st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}")),
    _part, _part)


@settings(max_examples=400, deadline=None)
@given(_crawled)
def test_surt_keys_of_urls_as_the_crawler_stores_them(url: str) -> None:
    try:
        stored = normalize(url)
    except URLError:
        assume(False)
        return
    assert surt_key(stored) == surt.surt(stored), stored


# -- the sort ------------------------------------------------------------------------------


def test_lines_sort_in_runs_beyond_the_buffer_and_merge_in_passes(tmp_path: Path) -> None:
    rng = random.Random(7)
    lines = ["".join(rng.choices(string.printable[:-5], k=rng.randint(0, 40))).encode() + b"\n"
             for _ in range(5000)]
    sorter = LineSorter(str(tmp_path), buffer_bytes=2000, fan_in=3)
    for line in lines:
        sorter.add(line)
    assert len(list(tmp_path.iterdir())) > 27  # runs: more than three passes of three
    assert list(sorter.sorted()) == sorted(lines)
    assert list(tmp_path.iterdir()) == []  # every run is gone once merged


def test_the_default_merge_keeps_within_the_limit_of_open_files(tmp_path: Path) -> None:
    """Runs merged at once follow RLIMIT_NOFILE: 300 runs under a soft limit of 48 open
    files sort (in passes) where opening them all would fail with EMFILE; under a high
    limit they merge in one pass."""
    code = """
import os, random, resource, sys
from crawler.read._linesort import LineSorter, default_fan_in
soft = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
d = sys.argv[2]; os.makedirs(d)
rng = random.Random(3)
lines = [b"%08d\\n" % rng.randrange(10**8) for _ in range(3000)]
sorter = LineSorter(d, buffer_bytes=90)
for line in lines:
    sorter.add(line)
runs = len(os.listdir(d))
assert list(sorter.sorted()) == sorted(lines) and not os.listdir(d)
print(default_fan_in(), runs, sorter._made)
"""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for soft, fan_in in ((48, 24), (min(hard, 4096), 1024)):
        out = subprocess.run([sys.executable, "-c", code, str(soft), str(tmp_path / str(soft))],
                             capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        got_fan_in, runs, made = map(int, out.stdout.split())
        assert got_fan_in == fan_in and runs == 300
        assert made > runs + 1 if fan_in < runs else made == runs  # passes, or none


# -- the command ---------------------------------------------------------------------------


def test_usage_errors(crawl: Recrawled, tmp_path: Path) -> None:
    out = str(tmp_path / "x.wacz")
    for args, error in [
        (["--wacz", str(tmp_path / "x.zip")], "--wacz needs a name ending in .wacz"),
        (["--wacz", out, "--max-size", "1M"], "--max-size splits the WARC output: give --warc"),
        (["--wacz", out, "--jsonl", out], "--wacz and --jsonl name the same file"),
        (["--warc", out, "--wacz", out], "--warc and --wacz name the same file"),
    ]:
        done = export_cli(str(crawl.data), *args)
        assert done.returncode == 2, (args, done.stderr)
        assert error in done.stderr.strip().splitlines()[-1], done.stderr
        assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_output_that_cannot_be_written_is_one_line_and_leaves_nothing(
    crawl: Recrawled, tmp_path: Path
) -> None:
    cases = [(path.replace(".warc.gz", ".wacz"), hint) for path, hint in _unwritable(tmp_path)]
    (tmp_path / "a-dir.wacz").mkdir()
    before = sorted(tmp_path.rglob("*"))
    for path, hint in cases:
        done = export_cli(str(crawl.data), "--wacz", path)
        assert done.returncode == 1, (path, done.stderr)
        assert done.stderr == f"crawler: error: cannot write the export: {path}: {hint}\n"
        assert done.stdout == ""
    assert sorted(tmp_path.rglob("*")) == before  # no .part, no file


def test_the_listing_names_the_wacz(crawl: Recrawled, tmp_path: Path) -> None:
    done = export_cli(str(crawl.data), "--wacz", str(tmp_path / "a b.wacz"), "--jsonl",
                      str(tmp_path / "a.jsonl"))
    assert done.returncode == 0, done.stderr
    assert listed_files(done.stdout) == [str(tmp_path / "a b.wacz"), str(tmp_path / "a.jsonl")]
    assert f"export: wrote {tmp_path / 'a b.wacz'} (" in done.stderr
    assert "; WACZ: " in done.stderr


def test_a_failure_midway_leaves_no_package(tmp_path: Path) -> None:
    """A file size limit plays the full disk, partway through the WARC entry."""
    limit = 512 << 10  # the 1 MiB page cannot fit

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    data = tmp_path / "crawl"
    _store_with_a_big_page(data)
    out = tmp_path / "out"
    out.mkdir()
    proc = start_cli([sys.executable, "-m", "crawler", "export", str(data), "--wacz",
                      str(out / "p.wacz")], preexec_fn=small_files)
    stdout, stderr = (b.decode() for b in proc.communicate(timeout=120))
    assert proc.returncode == 1, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        f"crawler: error: cannot write the export: {out / 'p.wacz'}: file too large for this "
        "file system or the file size limit (ulimit -f)"), stderr[-3000:]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr and stdout == ""
    assert list(out.iterdir()) == []


def test_interrupted_export_exits_130_and_leaves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "big"
    data.mkdir()
    with kvstore.open(data / "main") as db:  # incompressible: gzip takes its time
        for i in range(128):
            url = f"http://a.test/{i}.html"
            db[url_key(url)] = encode_page(PageRecord(
                url, 200, 1.7e9, 0, content_type="text/html",
                body=random.Random(i).randbytes(512 << 10)))
    out = tmp_path / "out"
    out.mkdir()
    proc = start_cli([sys.executable, "-m", "crawler", "export", str(data), "--wacz",
                      str(out / "i.wacz"), "--progress-interval", "0"])
    lines = read_lines(proc.stderr)
    wait_for(lambda: any("export: " in ln and "pages" in ln for ln in lines), proc,
             "a progress line")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, "".join(lines)[-3000:]
    assert proc.stdout is not None and proc.stdout.read() == b""
    proc.stdout.close()
    text = "".join(lines)
    assert "Traceback" not in text and "Exception ignored" not in text
    assert text.strip().splitlines()[-1] == (
        "crawler: export interrupted: the files it wrote were removed")
    assert list(out.iterdir()) == []


def test_memory_stays_flat_whatever_the_crawl_size(tmp_path: Path) -> None:
    """48 pages of 512 KiB: a package held in memory would be 24 MiB; a streamed one
    holds about one record."""
    data = tmp_path / "big"
    data.mkdir()
    size, n = 512 << 10, 48
    with kvstore.open(data / "main") as db:
        for i in range(n):
            url = f"http://a.test/{i}.html"
            db[url_key(url)] = encode_page(PageRecord(
                url, 200, 1.7e9 + i, 0, content_type="text/html",
                body=random.Random(i).randbytes(size)))
    tracemalloc.start()
    try:
        assert main(["export", str(data), "--wacz", str(tmp_path / "b.wacz"), "--quiet"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * size, peak  # 6 MiB
    with zipfile.ZipFile(tmp_path / "b.wacz") as z:
        assert z.getinfo("archive/data.warc.gz").file_size > n * size
        assert len(z.read("indexes/index.cdx").splitlines()) == n
