"""Crawl directories made without crawling: page records written into MainDB the way the
crawler writes them (``encode_page`` under ``url_key``), for tests of the readers
(index, search, export) on pages no test web would serve."""

from __future__ import annotations

from pathlib import Path

import kvstore
from crawler.state.pages import PageRecord, encode_page
from crawler.web.urls import url_key

HOST = "http://pages.test"
WORDS = ("basalt", "granite", "quartz", "feldspar", "obsidian", "pumice", "gneiss", "schist")


def html_page(n: int) -> str:
    """An ordinary page: a title, a heading, paragraphs with the n-th word, links."""
    word = WORDS[n % len(WORDS)]
    links = "".join(f'<li><a href="/p{(n + k) % 12}.html">page {(n + k) % 12}</a></li>'
                    for k in (1, 2, 3))
    return (f"<!DOCTYPE html><html lang=en><head><title>About {word} {n}</title></head>"
            f"<body><nav><ul>{links}</ul></nav><main><h1>{word.title()} {n}</h1>"
            f"<p>This page is about {word}, a rock, and it says so at some length so that "
            f"the main content is plain to see. {word} number {n}.</p>"
            f"<p>More about {word}: where it is found and what it is used for.</p></main>"
            "</body></html>")


def deep_page(depth: int, word: str = "abyssal") -> str:
    """A page of ``depth`` nested ``<div>`` elements around ``word`` (issue 42's hostile
    page: main-content extraction is quadratic in that nesting)."""
    return (f"<!DOCTYPE html><html><head><title>Deep {word}</title></head><body>"
            f"<p>An {word} intro that a reader sees.</p>"
            + "<div>" * depth + f"the {word} bottom" + "</div>" * depth + "</body></html>")


def page_record(url: str, html: str, fetched_at: float = 1.7e9) -> PageRecord:
    return PageRecord(url, 200, fetched_at, 0, final_url=url,
                      content_type="text/html; charset=utf-8", body=html.encode("utf-8"))


def write_crawl(data: Path, pages: dict[str, str], *, level: int = 6) -> Path:
    """A crawl directory (one shard) holding ``pages`` (URL -> HTML) as fetched pages,
    their bodies compressed at zlib ``level``."""
    data.mkdir(parents=True, exist_ok=True)
    with kvstore.open(data / "main") as db:
        for url, html in pages.items():
            db[url_key(url)] = encode_page(page_record(url, html), level=level)
    return data


def ordinary_pages(n: int = 12) -> dict[str, str]:
    return {f"{HOST}/p{i}.html": html_page(i) for i in range(n)}
