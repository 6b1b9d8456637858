"""``--header`` and ``--netrc``: what a user adds to requests reaches the hosts it is for
(the test web's request log shows every header beyond the crawler's own), credentials go
to their host over https only, and no secret lands in the data directory, a log line or
an export."""

from __future__ import annotations

import base64
import gzip
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import REPO, cli_args, fetched_urls

from crawler.exceptions import ConfigError
from crawler.net.auth import Credentials, load_netrc, merge_headers, parse_header
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
SECRET = "S3cr3t-pw-7Q"
TOKEN = "tok-9XkZ-bearer"


# -- headers ---------------------------------------------------------------------------


def test_a_header_line_is_a_name_and_a_value() -> None:
    assert parse_header("X-Crawl-Contact:  ops@example.org ") == (
        "X-Crawl-Contact", "ops@example.org")
    assert parse_header("Accept-Language: fr, en;q=0.5") == ("Accept-Language", "fr, en;q=0.5")


@pytest.mark.parametrize("line, words", [
    ("no colon here", "'Name: value'"),
    ("Bad Name: x", "'Name: value'"),
    (": x", "'Name: value'"),
    ("X-A: one\r\nX-B: two", "control character"),
    ("X-A: caf\u00e9", "not ASCII"),
    ("X-A:   ", "empty"),
    ("Authorization: Basic eDp5", "--netrc"),
    ("cookie: a=b", "--netrc"),
    ("Proxy-Authorization: x", "--netrc"),
    ("Host: other.example", "URL's host"),
    ("User-Agent: me", "--user-agent"),
    ("Accept-Encoding: br", "codings"),
    ("Connection: close", "connections"),
])
def test_a_header_that_cannot_be_sent_is_refused_with_its_reason(line: str, words: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_header(line)
    assert words in str(err.value)


def test_a_header_named_like_ours_replaces_it_and_the_rest_follow() -> None:
    ours = (("User-Agent", "ua"), ("Accept", "text/html"), ("Accept-Encoding", "gzip"))
    added = (("accept", "application/json"), ("X-Contact", "me"))
    assert merge_headers(ours, added) == (
        ("User-Agent", "ua"), ("Accept-Encoding", "gzip"), ("accept", "application/json"),
        ("X-Contact", "me"))


# -- netrc -----------------------------------------------------------------------------


def write_netrc(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_netrc_gives_basic_and_bearer_to_their_host_over_https_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_netrc(tmp_path / "netrc", f"machine a.test login me password {SECRET}\n"
                       f"machine B.test account bearer password {TOKEN}\n"
                       "default login anyone password everywhere\n")
    with caplog.at_level(logging.WARNING):
        creds = load_netrc(path)
    basic = "Basic " + base64.b64encode(f"me:{SECRET}".encode()).decode()
    assert creds.header_for("https", "a.test") == basic
    assert creds.header_for("https", "b.test") == f"Bearer {TOKEN}"
    assert creds.header_for("http", "a.test") is None  # never in clear
    assert creds.header_for("https", "sub.a.test") is None  # that host only
    assert creds.header_for("https", "c.test") is None  # `default` is nobody's
    assert "default entry is ignored" in caplog.text and "everywhere" not in caplog.text
    assert SECRET not in repr(creds) and TOKEN not in repr(creds)


@pytest.mark.parametrize("text, words", [
    (f"machine a.test login me password {SECRET} bogus\n", "cannot be parsed near line"),
    ("machine a.test login me password two words\n", "cannot be parsed near line"),
    (f"machine a.test account bearer login x\nmachine b.test password {SECRET}\n",
     "needs its token"),
    (f"machine a.test login me:you password {SECRET}\n", "without ':'"),
])
def test_a_netrc_that_cannot_be_used_is_one_line_without_its_secret(
    tmp_path: Path, text: str, words: str
) -> None:
    path = write_netrc(tmp_path / "netrc", text)
    with pytest.raises(ConfigError) as err:
        load_netrc(path)
    assert words in str(err.value)
    assert SECRET not in str(err.value) and "words" not in str(err.value)
    assert str(err.value).startswith(f"--netrc {path}: ")


def test_a_missing_netrc_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_netrc(str(tmp_path / "nope"))
    assert len(Credentials({})) == 0


# -- the command line --------------------------------------------------------------------


def run_start(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crawler", "start", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("option, value, words", [
    ("--header", "Authorization: Bearer x", "--netrc"),
    ("--header", "X-A: a\x01b", "control character"),
])
def test_start_refuses_a_bad_header_in_one_line(
    tmp_path: Path, option: str, value: str, words: str
) -> None:
    done = run_start("http://a.test/", "--data", str(tmp_path / "d"), option, value)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert words in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "d").exists()


def test_start_refuses_a_bad_netrc_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    bad = write_netrc(tmp_path / "netrc", f"machine a.test login me password {SECRET} junk\n")
    done = run_start("http://a.test/", "--data", str(tmp_path / "d"), "--netrc", bad)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"crawler: error: --netrc {bad}: cannot be parsed")
    assert "junk" not in line and done.returncode == 1
    assert not (tmp_path / "d").exists()


# -- a crawl -----------------------------------------------------------------------------


def test_a_crawl_sends_headers_everywhere_and_credentials_to_their_host_only(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=60, hosts=3, seed=2, crawl_delay=0.0)  # h2.test is https
    tls = [h for h in web.site.hosts.values() if h.scheme == "https"]
    assert [h.name for h in tls] == ["h2.test"]
    netrc = write_netrc(tmp_path / "netrc",
                        f"machine h2.test login crawler password {SECRET}\n"
                        f"machine h1.test account bearer password {TOKEN}\n")  # http: never
    data = tmp_path / "crawl"
    done = subprocess.run(
        cli_args(web, data, "--netrc", netrc, "--header", "X-Crawl-Contact: ops@example.org",
                 "--header", "Accept-Language: fr"),
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)

    basic = "Basic " + base64.b64encode(f"crawler:{SECRET}".encode()).decode()
    requests = web.log.records()
    assert {r.host for r in requests} == {"h0.test", "h1.test", "h2.test"}
    for r in requests:
        sent = dict(r.other)
        assert sent.get("x-crawl-contact") == "ops@example.org", r
        assert sent.get("accept-language") == "fr", r
        # robots.txt and the sitemap of h2.test too: they are requests to that host
        assert sent.get("authorization") == (basic if r.host == "h2.test" else None), r

    # No secret in clear or as sent, in any file of the crawl, its log or an export.
    out = tmp_path / "out"
    out.mkdir()
    export = subprocess.run(
        [sys.executable, "-m", "crawler", "export", str(data), "--warc", str(out / "c.warc.gz"),
         "--jsonl", str(out / "c.jsonl"), "--text"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-2000:]
    secrets = [SECRET, TOKEN, basic.split()[1]]
    files = [p for p in [*data.rglob("*"), *out.rglob("*")] if p.is_file()]
    assert any(p.name == "settings.json" for p in files)
    for path in files:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        for secret in secrets:
            assert secret.encode() not in raw, (path, secret)
    for text in (done.stderr, done.stdout, export.stderr):
        assert not any(s in text for s in secrets)
    settings = (data / "settings.json").read_text()
    assert netrc in settings and "X-Crawl-Contact: ops@example.org" in settings
