"""CrawlerConfig: every setting of a crawl, built once (by the CLI) and frozen."""

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
DEFAULT_MAX_REDIRECTS = 5
DEFAULT_MAX_RETRIES = 2
DEFAULT_MAX_RETRY_AFTER = 300.0
DEFAULT_BACKOFF = 5.0
DEFAULT_BAD_HOST_RETRY = 3600.0
DEFAULT_STACK_SIZE = 256 * 1024
DEFAULT_STATUS_INTERVAL = 5.0
DEFAULT_MAX_WAITING_PER_HOST = 64


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
    obey_robots: bool = True
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
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    total_timeout: float = 60.0
    dns_timeout: float = 5.0
    max_body_bytes: int = 10 << 20
    max_decoded_bytes: int = 20 << 20
    max_url_length: int = 2048
    stack_size: int = DEFAULT_STACK_SIZE
    max_waiting: int = 0  # URLs held in memory waiting for their host; 0 = 16 per thread
    max_waiting_per_host: int = DEFAULT_MAX_WAITING_PER_HOST
    status_interval: float = DEFAULT_STATUS_INTERVAL
    scope_hosts: frozenset[str] = field(default_factory=frozenset)  # filled from the seeds

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ConfigError("--threads must be at least 1")
        if self.per_host < 1:
            raise ConfigError("--per-host must be at least 1")
        if self.delay < 0:
            raise ConfigError("--delay cannot be negative")
        for name in ("max_pages", "max_pages_per_host", "max_depth"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name.replace('_', '-')} cannot be negative")
        for pattern in self.allow_regex + self.deny_regex:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"bad regex {pattern!r}: {exc}") from None

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
