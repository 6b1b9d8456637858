"""crawler.read.anchors: the anchor text of a real crawl of the test web, gathered through
sorted runs on disk, against an independent reading of the same pages (lxml's tree and
its xpath, urljoin, the crawler's normalize): every target's distinct link texts."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from urllib.parse import urljoin

import lxml.html
import pytest
from crawl_helpers import run_crawl

from crawler.exceptions import URLError
from crawler.read.anchors import MAX_ANCHOR_BYTES, SEPARATOR, anchor_texts
from crawler.read.listing import CrawlReader
from crawler.web.urls import normalize, url_key
from tools.testweb import SiteConfig, TestWeb


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with TestWeb(SiteConfig(pages=120, hosts=3, seed=8, crawl_delay=0.0)) as web:
        data = tmp_path_factory.mktemp("anchors") / "crawl"
        assert run_crawl(web, data).complete
    return data


def expected(data: Path) -> dict[bytes, set[str]]:
    """target key -> the distinct texts of the links to it, read with lxml's tree."""
    out: dict[bytes, set[str]] = defaultdict(set)
    with CrawlReader(str(data)) as reader:
        for page in reader.pages():
            if page.status != 200 or not page.body or b"<html" not in page.body[:2000].lower():
                continue
            tree = lxml.html.fromstring(page.body)
            for a in tree.xpath("//a[@href]"):
                if "nofollow" in (a.get("rel") or "").lower().split():
                    continue
                text = " ".join(a.text_content().split())
                try:
                    key = url_key(normalize(urljoin(page.url, a.get("href").strip()), page.url))
                except (URLError, ValueError):
                    continue
                if text and key != url_key(page.url):
                    out[key].add(text[:200])
    return out


# in memory, or spilled in many sorted runs (the crawl's link lines are ~100 times 2 KiB)
@pytest.mark.parametrize("buffer_bytes", [32 << 20, 2048])
def test_every_page_gets_the_texts_of_the_links_to_it(
    crawl: Path, tmp_path: Path, buffer_bytes: int
) -> None:
    want = expected(crawl)
    with CrawlReader(str(crawl)) as reader:
        got = dict(anchor_texts(reader.pages(), str(tmp_path), buffer_bytes=buffer_bytes))
    assert set(got) == set(want) and len(got) > 50
    keys = list(got)
    assert keys == sorted(keys)  # in key order
    for key, text in got.items():
        texts = text.split(SEPARATOR)
        assert len(texts) == len(set(texts))  # each distinct text once
        assert len(text.encode()) <= MAX_ANCHOR_BYTES + 200
        if sum(len(t.encode()) + len(SEPARATOR) for t in want[key]) <= MAX_ANCHOR_BYTES:
            assert set(texts) == want[key], key.hex()
        else:
            assert set(texts) < want[key]  # cut, never invented
