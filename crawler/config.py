"""CrawlerConfig: every setting of a crawl, built once (by the CLI) and frozen.

What the limits do against the hostile web (timeouts, retries, backoff, body
and decompression caps, redirect hops, URL length) is tabled in docs/HOSTILE.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .exceptions import ConfigError

DEFAULT_THREADS = 64
DEFAULT_DELAY = 1.0
DEFAULT_PER_HOST = 1
DEFAULT_USER_AGENT = "kvcrawl/0.1 (+https://example.invalid/kvcrawl)"
DEFAULT_SYNC_INTERVAL = 5.0
DEFAULT_MAX_CRAWL_DELAY = 30.0
# Redirect hops followed in a row: Googlebot's documented 10 (browsers allow ~20).
DEFAULT_MAX_REDIRECTS = 10
# Retries of a URL after a transient failure (timeout, reset, 429/5xx): 3 tries in all.
DEFAULT_MAX_RETRIES = 2
# The longest one answer puts a host off: a Retry-After, or the doubled error backoff.
DEFAULT_MAX_RETRY_AFTER = 300.0
# A host's first backoff after a failure; doubled for each consecutive one.
DEFAULT_BACKOFF = 5.0
DEFAULT_BAD_HOST_RETRY = 3600.0
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 20.0
DEFAULT_TOTAL_TIMEOUT = 60.0  # connect to last byte: what bounds a slow drip
DEFAULT_DNS_TIMEOUT = 5.0  # one lookup, every retry included
DEFAULT_MAX_BODY_BYTES = 10 << 20  # on the wire
DEFAULT_MAX_DECODED_BYTES = 20 << 20  # after Content-Encoding (gzip, deflate, br, zstd)
# Bytes of response bodies and parse buffers a shard holds at once (crawler.run.budget);
# None: twice what the largest page may hold (crawler.run.engine.largest_lease: its
# body, its parse, its record; 165 MiB with the default limits).
DEFAULT_MEMORY_BUDGET = None
# Sitemaps' limit and what most servers accept; longer links are dropped, not recorded.
# Longer URLs are dropped (about the old Internet Explorer limit of 2,083 that sites were
# built around; Scrapy's URLLENGTH_LIMIT is the same): anything longer is almost always a
# session-id or calendar trap. The one default: crawler.web.urls uses it too.
DEFAULT_MAX_URL_LENGTH = 2048
DEFAULT_STACK_SIZE = 256 * 1024
DEFAULT_STATUS_INTERVAL = 5.0
DEFAULT_MAX_WAITING_PER_HOST = 64
DEFAULT_RENDER_TABS = 4
DEFAULT_RENDER_TIMEOUT = 10.0  # seconds a page may take to settle in the browser
DEFAULT_RENDER_MEMORY = 512  # MiB of JavaScript heap per tab
DEFAULT_RENDER_BROWSER = "chromium"
# Which sitemaps a crawl reads (docs/SITEMAPS.md): robots.txt's Sitemap lines and
# /sitemap.xml ("all"), only the lines ("robots"), or none ("off").
SITEMAP_MODES = ("all", "robots", "off")
DEFAULT_SITEMAPS = "all"
# A cookie jar per crawl (RFC 6265; crawler.state.cookiestore): --no-cookies sends none.
DEFAULT_COOKIES = True


# -- bounds -----------------------------------------------------------------------------
# Every number an option takes has a range; docs/BOUNDS.md gives each one's reason. The
# command line refuses a value outside (a usage error, before anything is written) and
# so does a resume that reads one back from a crawl's settings.json (naming the file).

# Fetch threads of one shard process (--threads is split over the shards). A thread costs
# a 256 KiB stack (reserved) and some 20-90 KiB resident (docs/PERFORMANCE.md: 5,000
# threads in 471 MB over 2 shards); starting 10,000 takes seconds, and past a few
# thousand the switches under one GIL cost more CPU per page than the fetches. Twice the
# original's 5,000.
MAX_THREADS_PER_SHARD = 10_000
# Shard processes on one machine (--processes): a shard is at most about one core (the
# GIL) and 60-90 MB at rest, so more processes than cores add memory, not speed.
MAX_PROCESSES = 64
# Shards of a crawl on Ray (--shards), and the most a shards.json may record: docs/SCALE.md
# plans 800 for 10^9 pages on 100 nodes; the driver asks each for a report every round.
MAX_SHARDS = 1_024
# A limit that only ends something sooner (--max-pages, --max-pages-per-host, pages
# --limit, rank --top): 1,000x the 10^9 pages of docs/SCALE.md; more is a typo.
MAX_COUNT = 10**12
# --max-depth: depths are remembered in two bytes (crawler.state.depths.MAX_TRACKED_DEPTH).
MAX_DEPTH = 32_767
# Any option in seconds (delays, timeouts, intervals, backoffs): a day. A longer wait is a
# stalled crawl, and Python's waits overflow on numbers far past it (threading.TIMEOUT_MAX).
MAX_SECONDS = 86_400.0
# --revisit-after and recrawl --older-than: ten years (a page comes back at most 8 AGE
# after its fetch, and its due time must fit the due store).
MAX_AGE = 3_650 * 86_400.0
# Retries of one URL: each is another request to a server that is failing.
MAX_RETRIES = 10
# Redirect hops: Chrome and Firefox give up after 20, so a longer chain reaches no reader.
MAX_REDIRECTS = 20
# A link's length: at least a scheme and a host; at most 64 KiB, 8x what common servers
# take in a request line (Apache's 8,190 bytes, nginx's 8 KiB buffers).
MIN_URL_LENGTH = 16
MAX_URL_LENGTH = 65_536
# Body bytes (on the wire, decoded): a page record (its body compressed, its links and
# headers, a rendered DOM) is one kvstore value, and those stop at 64 MiB.
MAX_BODY_BYTES = 32 << 20
# Tabs of the rendering browser: each is a renderer process of 50-200 MB.
MAX_RENDER_TABS = 64
# A tab's JavaScript heap in MiB: Chromium's V8 compresses pointers, which caps a heap at 4 GiB.
MIN_RENDER_MEMORY = 16
MAX_RENDER_MEMORY = 4_096
# The read commands. rank: PageRank at 0.85 reaches 1e-9 in ~130 iterations; a block costs
# ~35 B a node (2^27: 4.4 GiB) and a step ~300 B an edge (2^24: 4.7 GiB). report and serve:
# every list is kept and drawn whole. export: a WARC file past 1 TiB is no split at all.
MAX_RANK_ITERATIONS = 10_000
MAX_BLOCK_NODES = 1 << 27
MAX_CHUNK = 1 << 24
MAX_REPORT_ROWS = 10_000
MAX_REFERRERS = 10_000
MAX_WARC_SIZE = 1 << 40


def header_problem(value: str) -> str | None:
    """Why ``value`` cannot be an HTTP header value, or None. Printable ASCII only
    (RFC 9110 5.5): a CR or LF would end the header and start another (and every request
    would then fail), and http.client cannot send what Latin-1 does not encode."""
    if not value.strip():
        return "it is empty"
    for i, ch in enumerate(value):
        if not " " <= ch <= "~":
            kind = "a control character" if ch.isascii() or not ch.isprintable() else (
                "a character that is not ASCII")
            return (f"it holds {kind} (U+{ord(ch):04X}) at position {i}: a header value "
                    "is printable ASCII, with no line breaks")
    return None


# A --store-types entry: type/subtype, type/*, or *.
_MEDIA_PATTERN = re.compile(r"\*|[a-z0-9][a-z0-9!#$&^_.+-]*/(\*|[a-z0-9][a-z0-9!#$&^_.+-]*)")


def stores_type(patterns: tuple[str, ...], media_type: str) -> bool:
    """Whether ``media_type`` (lowercase, no parameters) matches one of --store-types."""
    family = media_type.partition("/")[0] + "/*"
    return any(p in ("*", media_type, family) for p in patterns)


@dataclass(frozen=True)
class CrawlerConfig:
    data_dir: str
    seeds: tuple[str, ...] = ()
    threads: int = DEFAULT_THREADS
    delay: float = DEFAULT_DELAY
    per_host: int = DEFAULT_PER_HOST
    max_pages: int | None = None
    max_pages_per_host: int | None = None
    max_depth: int | None = None
    nameservers: tuple[tuple[str, int], ...] = ()
    user_agent: str = DEFAULT_USER_AGENT
    allow_private_ips: bool = False
    sync_interval: float = DEFAULT_SYNC_INTERVAL
    ca_bundle: str | None = None
    # --header lines sent with every request, as (name, value), checked by
    # crawler.net.auth.parse_header; --netrc: the credentials file's path (its secrets
    # are read by each shard, never kept here: a config is logged and saved)
    headers: tuple[tuple[str, str], ...] = ()
    netrc: str | None = None
    http2: bool = False  # offer HTTP/2 to https hosts (crawler.net.h2session)
    # --proxy values, [TARGET=]URL or [TARGET=]none (crawler.net.proxy; the credentials in
    # them are never shown: left out of repr, redacted in settings.json and logs)
    proxy: tuple[str, ...] = field(default=(), repr=False)
    obey_robots: bool = True
    cookies: bool = DEFAULT_COOKIES  # keep a cookie jar and send its cookies back
    broad: bool = False
    allow_domains: tuple[str, ...] = ()
    allow_regex: tuple[str, ...] = ()
    deny_regex: tuple[str, ...] = ()
    max_crawl_delay: float = DEFAULT_MAX_CRAWL_DELAY
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    max_retries: int = DEFAULT_MAX_RETRIES
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    backoff: float = DEFAULT_BACKOFF
    bad_host_retry: float = DEFAULT_BAD_HOST_RETRY
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    total_timeout: float = DEFAULT_TOTAL_TIMEOUT
    dns_timeout: float = DEFAULT_DNS_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
    memory_budget: int | None = DEFAULT_MEMORY_BUDGET
    max_url_length: int = DEFAULT_MAX_URL_LENGTH
    stack_size: int = DEFAULT_STACK_SIZE
    max_waiting: int = 0  # URLs held in memory waiting for their host; 0 = 16 per thread
    max_waiting_per_host: int = DEFAULT_MAX_WAITING_PER_HOST
    status_interval: float = DEFAULT_STATUS_INTERVAL
    store_types: tuple[str, ...] = ()  # non-HTML media types whose bodies are kept too
    sitemaps: str = DEFAULT_SITEMAPS  # one of SITEMAP_MODES
    # start --revisit-after: seconds (D) after which a fetched page is due again; None:
    # a page is fetched once and the crawl ends when nothing is pending (crawler.state.due)
    revisit_after: float | None = None
    render_js: tuple[str, ...] = ()  # host regexes whose HTML pages are rendered (docs/RENDER.md)
    render_all: bool = False  # every HTML page is rendered
    render_tabs: int = DEFAULT_RENDER_TABS
    render_timeout: float = DEFAULT_RENDER_TIMEOUT
    render_memory: int = DEFAULT_RENDER_MEMORY
    render_browser: str = DEFAULT_RENDER_BROWSER
    scope_hosts: frozenset[str] = field(default_factory=frozenset)  # filled from the seeds

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ConfigError("--threads must be at least 1")
        problem = header_problem(self.user_agent)
        if problem:
            raise ConfigError(f"--user-agent {self.user_agent[:200]!r}: {problem}")
        if self.per_host < 1:
            raise ConfigError("--per-host must be at least 1")
        if self.delay < 0:
            raise ConfigError("--delay cannot be negative")
        for name in ("max_pages", "max_pages_per_host", "max_depth"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name.replace('_', '-')} cannot be negative")
        for name in (
            "max_redirects",
            "max_retries",
            "backoff",
            "max_retry_after",
            "bad_host_retry",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} cannot be negative")
        for media in self.store_types:
            if not _MEDIA_PATTERN.fullmatch(media):
                raise ConfigError(
                    f"--store-types {media!r}: give a media type (application/pdf), "
                    "a family (image/*) or * for every type"
                )
        if self.revisit_after is not None and not self.revisit_after >= 0:
            raise ConfigError("--revisit-after cannot be negative")
        if self.sitemaps not in SITEMAP_MODES:
            modes = ", ".join(SITEMAP_MODES)
            raise ConfigError(f"--sitemaps {self.sitemaps!r}: give one of {modes}")
        if self.memory_budget is not None and self.memory_budget < 1:
            raise ConfigError("--memory-budget must be at least 1 byte")
        if self.render_tabs < 1:
            raise ConfigError("--render-tabs must be at least 1")
        if not self.render_timeout > 0:
            raise ConfigError("--render-timeout must be more than 0 seconds")
        if self.render_memory < 16:
            raise ConfigError("--render-memory must be at least 16 (MiB)")
        for pattern in self.allow_regex + self.deny_regex + self.render_js:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"bad regex {pattern!r}: {exc}") from None

    @property
    def rendering(self) -> bool:
        return self.render_all or bool(self.render_js)

    @property
    def waiting_limit(self) -> int:
        return self.max_waiting or 16 * self.threads


class Scope:
    """Which URLs a crawl may admit: seed hosts by default, or --broad, domains, regexes."""

    def __init__(self, config: CrawlerConfig) -> None:
        self.broad = config.broad
        self.hosts = config.scope_hosts
        self.domains = tuple(d.lower().strip(".") for d in config.allow_domains)
        self.allow = [re.compile(p) for p in config.allow_regex]
        self.deny = [re.compile(p) for p in config.deny_regex]

    @property
    def everything(self) -> bool:
        """Every URL is in scope (no need to look at its host)."""
        return self.broad and not self.deny and not self.allow

    def allows(self, url: str, host: str) -> bool:
        if self.deny and any(p.search(url) for p in self.deny):
            return False
        if self.allow and not any(p.search(url) for p in self.allow):
            return False
        if self.broad:
            return True
        if host in self.hosts:
            return True
        return any(host == d or host.endswith("." + d) for d in self.domains)
