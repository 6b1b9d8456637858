"""Every error the crawler raises on purpose, under one base class.

Third-party errors (requests, urllib3, dnspython, lxml) are wrapped at the
module that talks to them (fetch, dnscache, links), with ``raise ... from``.
"""

from __future__ import annotations


class CrawlerError(Exception):
    """Base class of every crawler error."""


class ConfigError(CrawlerError, ValueError):
    """An invalid setting (bad seed URL, negative limit, unreadable CA bundle...)."""


class UsageError(ConfigError):
    """An option whose value is fine alone but not with this crawl (``--threads`` more
    than its shards may have): a usage error, exit status 2, found before anything is
    written."""


class URLError(CrawlerError, ValueError):
    """A URL that cannot be crawled: not http/https, unparsable, too long, bad host."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url[:200]!r}: {reason}")
        self.url = url
        self.reason = reason


class DNSError(CrawlerError):
    """A host name that did not resolve, or resolved to an address we may not use.
    ``kind`` is one of: nxdomain, nodata, servfail, timeout, private (a private,
    loopback, link-local... address while private IPs are not allowed), error."""

    def __init__(self, host: str, kind: str, detail: str = "") -> None:
        super().__init__(f"{host}: DNS {kind}{': ' + detail if detail else ''}")
        self.host = host
        self.kind = kind
        self.detail = detail


class FetchError(CrawlerError):
    """A fetch that produced no usable response. ``reason`` is one of crawler.outcomes'
    reasons: a host failure (connect_refused, connect_timeout, connect_error, tls), a
    transient one (read_timeout, total_timeout, reset, protocol), or ``aborted`` (the
    fetcher was closed: the crawl is stopping)."""

    def __init__(self, url: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{url[:200]}: {reason}{': ' + detail if detail else ''}")
        self.url = url
        self.reason = reason
        self.detail = detail


class ProxyError(CrawlerError, OSError):
    """A proxy that could not open a tunnel to the target (crawler.net.proxy): it answered
    CONNECT with other than 2xx (403, 407, 502...), refused the credentials, gave a SOCKS5
    error, or did not speak its protocol. The fetch's outcome is ``connect_error``."""


class ContentDecodingError(CrawlerError, ValueError):
    """A body that its Content-Encoding (gzip, deflate, br, zstd) cannot decode: the
    fetch's outcome is ``protocol``."""


class DataDirError(CrawlerError):
    """The data directory cannot be used (locked by a running crawl, unreadable,
    written by a newer version, or the disk is full)."""


class DiskFullError(DataDirError):
    """A write to the data directory failed for lack of space (ENOSPC, EDQUOT, or
    EFBIG from a file size limit). The crawl stopped; what was written before is
    intact and the crawl resumes once there is space again."""

    def __init__(self, data_dir: str, cause: OSError) -> None:
        super().__init__(
            f"{data_dir}: disk full ({cause.strerror or cause}): the crawl stopped; "
            "its data is intact; free some space and run the same command to resume"
        )
        self.data_dir = data_dir
        self.errno = cause.errno


class ShardCountError(ConfigError):
    """``--processes`` differs from the shard count recorded in the data directory
    (shards.json): a crawl keeps the count it was created with."""

    def __init__(self, data_dir: str, recorded: int, requested: int) -> None:
        super().__init__(
            f"{data_dir}: this crawl has {recorded} shard(s) (shards.json), not {requested}: "
            f"resume it with --processes {recorded}, or without --processes"
        )
        self.data_dir = data_dir
        self.recorded = recorded
        self.requested = requested


class ExchangeError(CrawlerError):
    """A batch of links could not be handed to its shard now (the shard is down,
    restarting, stopping, or did not answer in time). The sender keeps the batch
    in its outbox and tries again later; nothing is lost."""

    def __init__(self, dest: int, reason: str) -> None:
        super().__init__(f"shard {dest}: {reason}")
        self.dest = dest
        self.reason = reason


class BrowserError(CrawlerError):
    """The rendering browser (--render-js) failed: it cannot start, a command got no
    answer in time, or it answered with an error."""


class BrowserGone(BrowserError):
    """The browser died or was closed while a call waited on it."""
