"""robots.txt policy per RFC 9309: the parsed rules of one host (pure, no I/O).

Theory of operation. The engine fetches ``/robots.txt`` through the fetcher
(following up to 5 redirects, RFC 9309 §2.3.1.2) and hands the final status
and body to :meth:`RobotsRules.from_response`, which does no I/O. The
decision table for the final answer:

- 2xx: the body, cut at ``max_bytes`` (RFC 9309 §2.5 asks for at least
  500 KiB; we parse 512 KiB) back to the last whole line, decoded as UTF-8
  with replacement and a leading BOM dropped, is parsed. Nothing in a body is
  fatal: lines that are not rules are ignored.
- 3xx (more redirects than the engine follows) and 4xx: "unavailable", allow
  all (§2.3.1.2, §2.3.1.3). Exception, our choice: 429 Too Many Requests is
  the server asking us to back off, so it is treated like 5xx.
- 5xx, any other status and ``None`` (unreachable, timed out): "unreachable",
  disallow everything until ``retry_at`` (§2.3.1.4); the entry then expires
  and the engine fetches robots.txt again. We do not fall back on an older
  cached copy. ``failing_since`` is carried over from ``previous`` so that
  after ``unreachable_limit`` (30 days, the RFC's example) of uninterrupted
  failure the host is treated as allow all (the RFC's MAY), still re-fetched
  every ``error_retry``. Good answers are kept ``ttl`` (24 h, §2.4).

Parsing and matching are our own, in the pure :mod:`crawler.web._robotstxt`
(~200 lines). They used to be protego's, which departs from RFC 9309 in ways
no rewriting of its input can repair: a group named ``kv`` applied to
``kvcrawl`` and one named ``kvcrawl/1.0`` did not, ``Disallow: /a$`` also
blocked ``/a$x``, ``Allow: /d/index.html`` also allowed ``/d/``, and an
unknown line or a Crawl-delay between two ``User-agent`` lines split their
group. (protego
stays in the tests as a cross-check where it agrees with the RFC.) Our rules:

1. Lines end at CR, LF or CRLF (not at the other characters ``str.splitlines``
   knows); ``#`` starts a comment; field names are case-insensitive and may be
   spelled ``useragent``, ``user agent``, ``crawl delay`` or with the common
   ``disallow`` typos (Google's leniency; reading more Disallows is the polite
   error); ``field value`` without a colon counts when it is exactly two words.
2. Groups (§2.1, §2.2.1): a run of ``User-agent`` lines, then its rules.
   Only a rule (Allow, Disallow) ends the run; lines the RFC does not define
   (Crawl-delay, Sitemap, Host, unknown keys) and blank and comment lines
   neither end a group nor start one (§2.2.4: other records must not
   interfere with the groups; Google's parser agrees). So in ``User-agent: a /
   Crawl-delay: 5 / User-agent: b / Disallow: /x`` both a and b are barred
   from /x, and ``User-agent: * / Crawl-delay: 9 / (blank) / User-agent: a /
   Crawl-delay: 1`` is one group. Rules before any ``User-agent`` belong to
   no group and are ignored. The values of the first 64 ``Sitemap`` lines,
   wherever they are, are kept in ``sitemaps`` (crawler.run.sitemaps reads
   them).
3. Group selection: a ``User-agent`` value applies to us when its leading
   ``[A-Za-z_-]+`` (so ``KVCrawl/1.0`` counts) equals our product token,
   case-insensitively; never by prefix. Every group naming us is merged; with
   none, every ``*`` group is merged; with neither, everything is allowed.
4. Crawl-delay (not in RFC 9309) is read from the selected groups as Bing and
   Yandex define it: the first finite value >= 0 wins; the engine caps it. A
   Crawl-delay line belongs to the group it is in, wherever in the group:
   after its rules, or between its User-agent lines (then it is also the
   delay of the agents named after it). One before any User-agent is ignored.
5. A rule value must start with ``/`` or ``*`` (the RFC's path-pattern);
   others and empty values are ignored. ``*`` matches any run of characters;
   ``$`` is the end anchor only as the last character, a literal elsewhere.
6. Percent-encoding (§2.2.2): the pattern and the URL's path+query are brought
   to one form: escapes of unreserved characters decoded, other escapes in
   uppercase hex, a stray ``%`` as ``%25``, non-ASCII and characters RFC 3986
   does not allow encoded as UTF-8, and a literal ``*`` or ``$`` in the URL
   encoded (``%2A`` in a rule matches a ``*`` in the URL, as the RFC's example).
   ``%2F`` stays distinct from ``/`` in the path (RFC 3986: reserved
   characters and their escapes are not equivalent). In the query only,
   ``:``, ``/``, ``?`` and ``@`` delimit nothing, so their escapes are decoded:
   this is what makes the RFC's table row (``?baz=https://foo.bar`` matches
   ``?baz=https%3A%2F%2Ffoo.bar``) hold.
7. Longest match wins, counted in octets of the rule's normalized form (a
   ``*`` and a final ``$`` count one each); Allow wins a tie (§2.2.2); no
   match means allowed; ``/robots.txt`` itself is always allowed.

The cache of rules per host, and the single fetch of each host's
robots.txt, are :class:`crawler.run.robotscache.RobotsCache`.

Thread-safety: a RobotsRules is immutable once built, so any number of threads
may call ``can_fetch`` at once.
"""

from __future__ import annotations

import logging
from typing import Literal
from urllib.parse import urlsplit

from ..exceptions import ConfigError
from ._robotstxt import TOKEN, Group, canon, parse, sitemap_values, target
from .urls import DEFAULT_PORTS, URL

__all__ = [
    "DEFAULT_MAX_ROBOTS_BYTES",
    "DEFAULT_ROBOTS_RETRY",
    "DEFAULT_ROBOTS_TTL",
    "DEFAULT_UNREACHABLE_LIMIT",
    "RobotsRules",
    "product_token",
    "robots_key",
    "robots_url",
]

logger = logging.getLogger(__name__)

#: Bytes of robots.txt parsed; RFC 9309 §2.5: a limit of at least 500 KiB.
DEFAULT_MAX_ROBOTS_BYTES = 512 * 1024
#: How long a fetched (2xx or 4xx) robots.txt is used (RFC 9309 §2.4: 24 h).
DEFAULT_ROBOTS_TTL = 24 * 3600.0
#: After a 5xx or an unreachable robots.txt, when to try again.
DEFAULT_ROBOTS_RETRY = 600.0
#: Sitemap lines of one robots.txt that are read (crawler.run.sitemaps bounds the rest).
MAX_ROBOTS_SITEMAPS = 64
#: Uninterrupted failure after which an unreachable robots.txt means allow all.
DEFAULT_UNREACHABLE_LIMIT = 30 * 86400.0

_ROBOTS_PATH = "/robots.txt"

State = Literal["rules", "allow_all", "disallow_all_for_now"]
_EMPTY = Group([])


def product_token(user_agent: str) -> str:
    """The RFC 9309 §2.2.1 product token of a User-Agent, lowercase:
    ``"KVCrawl/0.1 (+url)"`` -> ``"kvcrawl"``."""
    match = TOKEN.match(user_agent.strip())
    if match is None:
        raise ConfigError(
            f"user agent {user_agent!r} does not start with a product token ([A-Za-z_-]+)"
        )
    return match.group().lower()


def robots_key(url: str) -> str:
    """The cache key of ``url``'s robots.txt: ``scheme://host:port``, lowercase,
    port always explicit (robots.txt is per protocol, host and port, RFC 9309 §2.3)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or DEFAULT_PORTS.get(scheme, 0)
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def robots_url(url: str) -> str:
    """The robots.txt URL for ``url``'s scheme, host and port (default port left out)."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}{_ROBOTS_PATH}"


def _cut(body: bytes, max_bytes: int) -> tuple[bytes, bool]:
    """``body`` cut at ``max_bytes``, back to the end of its last whole line,
    so a rule cut in half (``Allow: /pub`` of ``Allow: /public``) is not applied."""
    if len(body) <= max_bytes:
        return body, False
    head = body[:max_bytes]
    end = max(head.rfind(b"\n"), head.rfind(b"\r"))
    return head[: end + 1], True


_BOM = b"\xef\xbb\xbf"


def _without_bom(data: bytes) -> bytes:
    """``data`` without a leading UTF-8 BOM, or the first one or two bytes of one (seen
    in the wild: a file cut or re-encoded carelessly). Kept, the partial BOM decodes as
    U+FFFD glued to the first line, and the first group's rules would apply to nobody.
    Bytes that begin a real character (EF then a continuation byte other than BB BF)
    are left alone."""
    for n in (3, 2, 1):
        if data.startswith(_BOM[:n]):
            rest = data[n:]
            if n == 3 or not rest or not 0x80 <= rest[0] <= 0xBF:
                return rest
            return data
    return data


class RobotsRules:
    """What robots.txt says about one host, for one user agent. Immutable, thread-safe.

    Build it with :meth:`from_response` (or :meth:`allow_all`). ``state`` is
    ``"rules"`` (a parsed file), ``"allow_all"`` or ``"disallow_all_for_now"``
    (until ``retry_at``). Times are in the caller's clock (``now``).
    """

    __slots__ = (
        "_group",
        "crawl_delay",
        "expires_at",
        "failing_since",
        "fetched_at",
        "retry_at",
        "sitemaps",
        "size",
        "state",
        "status",
        "truncated",
    )

    def __init__(
        self,
        state: State,
        *,
        fetched_at: float,
        expires_at: float,
        retry_at: float | None = None,
        failing_since: float | None = None,
        status: int | None = None,
        group: Group | None = None,
        size: int = 0,
        truncated: bool = False,
        sitemaps: tuple[str, ...] = (),
    ) -> None:
        self.state: State = state
        self.fetched_at = fetched_at
        #: After this the rules are stale and robots.txt should be fetched again.
        self.expires_at = expires_at
        #: For an unreachable robots.txt: when to try again (equal to expires_at).
        self.retry_at = retry_at
        #: When an uninterrupted run of failed robots.txt fetches began, if one is going on.
        self.failing_since = failing_since
        self.status = status
        self.size = size
        self.truncated = truncated
        #: The values of the file's Sitemap lines, as written (relative ones too).
        self.sitemaps = sitemaps
        self._group = group or _EMPTY
        #: Crawl-delay in seconds from our group (None if absent); the engine caps it.
        self.crawl_delay: float | None = self._group.crawl_delay

    @classmethod
    def allow_all(cls, *, now: float, ttl: float = DEFAULT_ROBOTS_TTL) -> RobotsRules:
        """No restrictions (e.g. for a crawl that does not obey robots.txt)."""
        return cls("allow_all", fetched_at=now, expires_at=now + ttl)

    @classmethod
    def from_response(
        cls,
        status: int | None,
        body: bytes | None,
        *,
        user_agent: str,
        now: float,
        max_bytes: int = DEFAULT_MAX_ROBOTS_BYTES,
        ttl: float = DEFAULT_ROBOTS_TTL,
        error_retry: float = DEFAULT_ROBOTS_RETRY,
        unreachable_limit: float = DEFAULT_UNREACHABLE_LIMIT,
        previous: RobotsRules | None = None,
    ) -> RobotsRules:
        """The rules for the final answer to a robots.txt fetch (see the module doc).

        ``status`` None means no HTTP answer (DNS, connection, timeout).
        ``previous`` is the host's last entry, even expired (RobotsCache.peek),
        which carries ``failing_since`` across failed fetches. Never raises on
        a bad body; raises ConfigError for a user agent without a product token.
        """
        token = product_token(user_agent)
        if status is not None and 200 <= status < 300:
            return cls._parse(status, body or b"", token, now, max_bytes, ttl)
        if status is not None and 300 <= status < 500 and status != 429:
            return cls("allow_all", fetched_at=now, expires_at=now + ttl, status=status)
        since = now
        if previous is not None and previous.failing_since is not None:
            since = min(previous.failing_since, now)
        retry = now + error_retry
        if now - since >= unreachable_limit:
            logger.info("robots.txt unreachable for %.0f days: allowing all", (now - since) / 86400)
            return cls(
                "allow_all",
                fetched_at=now,
                expires_at=retry,
                retry_at=retry,
                failing_since=since,
                status=status,
            )
        return cls(
            "disallow_all_for_now",
            fetched_at=now,
            expires_at=retry,
            retry_at=retry,
            failing_since=since,
            status=status,
        )

    @classmethod
    def _parse(
        cls, status: int, body: bytes, token: str, now: float, max_bytes: int, ttl: float
    ) -> RobotsRules:
        data, truncated = _cut(body, max_bytes)
        if truncated:
            logger.info("robots.txt of %d bytes parsed up to %d", len(body), len(data))
        text = _without_bom(data).decode("utf-8", "replace")
        return cls(
            "rules",
            fetched_at=now,
            expires_at=now + ttl,
            status=status,
            group=parse(text, token),
            size=len(data),
            truncated=truncated,
            sitemaps=sitemap_values(text, MAX_ROBOTS_SITEMAPS),
        )

    def can_fetch(self, url: str | URL) -> bool:
        """Whether ``url`` (absolute, a path with query, or a parsed URL) may be fetched.

        ``/robots.txt`` itself is always allowed. Thread-safe.
        """
        if self.state == "allow_all":
            return True
        # A parsed URL's target is already the path+query that target() would cut out.
        path = canon(url.target) if isinstance(url, URL) else target(url)
        if path == _ROBOTS_PATH:
            return True
        return self.state == "rules" and self._group.allowed(path)

    def expired(self, now: float) -> bool:
        return now >= self.expires_at

    def __repr__(self) -> str:
        return (
            f"<RobotsRules {self.state} status={self.status} "
            f"expires_at={self.expires_at:.0f} crawl_delay={self.crawl_delay}>"
        )
