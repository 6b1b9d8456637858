"""What a fetch returns (:class:`FetchResult`) and the pure functions that read an answer:
its Retry-After, its content type, the Set-Cookie lines kept, a redirect's target.
crawler.net.fetch makes the results; the crawl (crawler.run) reads them."""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from urllib.parse import urljoin

from ..web.cookies import MAX_COOKIE_BYTES

KEPT_HEADERS = ("content-type", "content-length", "content-encoding", "location",
                "retry-after", "last-modified", "etag", "server", "date", "x-robots-tag")
# Set-Cookie lines kept of one answer, in bytes (newlines included): what a site's cookies
# may take in the jar (crawler.web.cookies.MAX_SITE_BYTES). The rest is not kept.
MAX_SET_COOKIE_BYTES = 32 << 10
VERSIONS = {9: "HTTP/0.9", 10: "HTTP/1.0", 11: "HTTP/1.1", 20: "HTTP/2"}


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One HTTP answer (any status). ``body`` is decoded (its Content-Encoding) and at
    most the Fetcher's limits; ``wire_bytes`` counts body bytes received."""

    url: str
    status: int
    headers: dict[str, str]
    body: bytes
    ip: str
    started: float  # time.time() at the start
    elapsed: float  # seconds, DNS included
    wire_bytes: int
    truncated: bool = False
    truncate_reason: str | None = None  # "too_large" | "decompression_bomb"
    redirect: str | None = None  # absolute Location of a 3xx
    http_version: str = "HTTP/1.1"
    protocol: str = ""  # as WARC-Protocol says it: "h2 tls/1.3", "http/1.1 tls/1.2", ""
    cookie: str = ""  # the Cookie header sent (the page's, from the crawl's jar), for the record


# -- pure helpers ----------------------------------------------------------------------


def parse_retry_after(value: str, now: float) -> float | None:
    """Seconds to wait from a Retry-After value (delay-seconds or an HTTP-date,
    against ``now`` as time.time()), clamped to >= 0; None if unparsable."""
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:  # pragma: no cover - older Pythons returned None
        return None
    return max(0.0, when.timestamp() - now)


def parse_content_type(value: str) -> tuple[str, str | None]:
    """("text/html", "utf-8") from "text/html; charset=UTF-8"; ("", None) when absent."""
    mime, _, params = value.partition(";")
    charset = None
    for param in params.split(";"):
        name, _, val = param.partition("=")
        if name.strip().lower() == "charset":
            charset = val.strip().strip("\"'").strip().lower() or None
    return mime.strip().lower(), charset


def content_type(result: FetchResult) -> tuple[str, str | None]:
    """(mime, charset) of a FetchResult, lowercase; ("", None) when not declared."""
    return parse_content_type(result.headers.get("content-type", ""))


def set_cookie_lines(values: list[str] | None) -> str:
    """An answer's Set-Cookie values as kept: each on one line (a folded one unfolded),
    those over MAX_COOKIE_BYTES left out, joined by a newline, at most
    MAX_SET_COOKIE_BYTES in all; "" for none."""
    kept: list[str] = []
    size = 0
    for value in values or ():
        value = value.replace("\r", " ").replace("\n", " ").replace("\x00", "")
        if len(value) > MAX_COOKIE_BYTES:
            continue  # the cookie jar ignores it (RFC 6265 §6.1)
        size += len(value) + 1
        if size > MAX_SET_COOKIE_BYTES:
            break
        kept.append(value)
    return "\n".join(kept)


def redirect_target(url: str, location: str) -> str | None:
    try:  # http.client decodes header bytes as Latin-1; most servers send UTF-8
        location = location.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    location = location.strip()
    if not location:
        return None
    try:
        return urljoin(url, location)
    except ValueError:  # e.g. a broken IPv6 literal
        return None
