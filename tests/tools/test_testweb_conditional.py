"""The test web answers conditional GETs (RFC 9110 §13): generated pages carry an ETag and
a Last-Modified, and a request whose validators match gets 304 with no body."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tools.testweb import SiteConfig, TestWeb
from tools.testweb.server import LAST_MODIFIED, not_modified

TIMEOUT = 5.0


@pytest.fixture(scope="module")
def web() -> Iterator[TestWeb]:
    with TestWeb(SiteConfig(pages=10, hosts=1, seed=2)) as w:
        yield w


def get(web: TestWeb, url: str, **headers: str) -> requests.Response:
    with web.session() as s:
        return s.get(url, headers=headers, timeout=TIMEOUT, allow_redirects=False)


def test_pages_have_validators_and_match_them(web: TestWeb) -> None:
    first = get(web, web.seed_url)
    etag = first.headers["ETag"]
    assert first.status_code == 200 and etag.startswith('"') and first.content
    assert first.headers["Last-Modified"] == LAST_MODIFIED
    assert get(web, web.seed_url).headers["ETag"] == etag  # the same bytes, the same tag
    hit = get(web, web.seed_url, **{"If-None-Match": etag})
    assert (hit.status_code, hit.content, hit.headers["ETag"]) == (304, b"", etag)
    assert get(web, web.seed_url, **{"If-None-Match": f'"x", W/{etag}'}).status_code == 304
    assert get(web, web.seed_url, **{"If-Modified-Since": LAST_MODIFIED}).status_code == 304
    # If-None-Match wins over a matching date; an older date or a bad one gets the page.
    assert get(web, web.seed_url, **{"If-None-Match": '"other"',
                                     "If-Modified-Since": LAST_MODIFIED}).status_code == 200
    assert get(web, web.seed_url,
               **{"If-Modified-Since": "Sun, 31 Dec 2023 23:59:59 GMT"}).status_code == 200
    assert get(web, web.seed_url, **{"If-Modified-Since": "yesterday"}).status_code == 200
    log = [r for r in web.log.records() if r.path == "/"]
    assert [r.status for r in log[-3:]] == [200, 200, 200]


def test_not_modified_rule() -> None:
    assert not_modified('"a"', "*", None)
    assert not not_modified('"a"', '"b"', "Mon, 01 Jan 2030 00:00:00 GMT")
    assert not_modified('"a"', None, "Mon, 01 Jan 2030 00:00:00 GMT")
    assert not not_modified('"a"', None, "Mon, 01 Jan 2024 00:00:00")  # no zone: invalid
    assert not not_modified('"a"', None, None)
