"""The crawler's vocabulary of outcomes: every reason a URL can end with, in one place.

A URL ends as one *record* (crawler.state.pages): an HTTP answer, or status 0
and a *reason* that names what went wrong (``dns_nxdomain``, ``tls``,
``robots_disallowed``...). The reasons are a contract between the parts that
make them (the fetcher, the DNS cache, the robots.txt gate, the engine), the
record on disk, and the parts that read them (status, the report, ``retry``,
the hints a crawl ends with, docs/HOSTILE.md). So they are named here, once,
with what each says about the host and about trying again:

- *transient* (``TRANSIENT``): the request may work a moment later; the URL is
  tried again, within ``--max-retries``, after its host's backoff;
- *host failures* (``HOST_FAILURES``): the host itself cannot be reached; it
  goes to BadHosts, and its other URLs are recorded ``bad_host:<reason>``
  without a request until its retry time;
- everything else is recorded at once.

Outcomes are counted by *key* (``outcome_key``: the record's reason, else why its
body was cut, else its HTTP status; ``retry:<reason>`` for a try that will be
repeated) and grouped into a few *classes* an operator reads at a glance
(``outcome_class``, the table in docs/HOSTILE.md). ``HINTS`` gives each reason's
meaning and its fix (crawler.run.hints words a crawl's summary with them).

Pure: no I/O, safe from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- the reasons a record carries (status 0 unless noted) -------------------------
PRIVATE_IP = "private_ip"  # the host resolved to a private address (refused by default)
DNS_NXDOMAIN = "dns_nxdomain"
DNS_NODATA = "dns_nodata"
DNS_SERVFAIL = "dns_servfail"
DNS_TIMEOUT = "dns_timeout"
DNS_ERROR = "dns_error"
CONNECT_REFUSED = "connect_refused"
CONNECT_TIMEOUT = "connect_timeout"
CONNECT_ERROR = "connect_error"
TLS = "tls"
READ_TIMEOUT = "read_timeout"
TOTAL_TIMEOUT = "total_timeout"
RESET = "reset"
PROTOCOL = "protocol"
ROBOTS_UNAVAILABLE = "robots_unavailable"
ROBOTS_DISALLOWED = "robots_disallowed"
HOST_PAGE_LIMIT = "host_page_limit"
REDIRECT_LIMIT = "redirect_limit"  # on a 3xx record: the redirect was not followed
NOT_HTML = "not_html"  # on a 200 record: neither parsed nor stored
BAD_URL = "bad_url"
INTERNAL_ERROR = "internal_error"
# Why a body was cut (a record's ``truncated``; counted as the key when no reason).
TOO_LARGE = "too_large"
DECOMPRESSION_BOMB = "decompression_bomb"
# A request that ended because the crawl is stopping: never recorded, requeued.
ABORTED = "aborted"

# Why a render in the browser was cut (a record's ``render`` field; "ok" if it was not).
RENDER_OK = "ok"
RENDER_TIMEOUT = "render_timeout"  # the page did not settle within --render-timeout
RENDER_MEMORY = "render_memory"  # its JavaScript heap passed --render-memory
RENDER_TOO_LARGE = "render_too_large"  # its DOM passed the body limit
RENDER_NAVIGATED = "render_navigated"  # it navigated away
RENDER_CRASHED = "render_crashed"  # the tab or the browser died
RENDER_FAILED = "render_failed"  # the browser could not render it at all
RENDER_REFUSED_TYPE = "render_refused_type"  # a subrequest of a type not fetched for it
RENDER_SUBREQUEST_LIMIT = "render_subrequest_limit"  # it asked for too many subrequests
RENDER_REASONS = frozenset({RENDER_TIMEOUT, RENDER_MEMORY, RENDER_TOO_LARGE, RENDER_NAVIGATED,
                            RENDER_CRASHED, RENDER_FAILED, RENDER_REFUSED_TYPE,
                            RENDER_SUBREQUEST_LIMIT})

BAD_HOST = "bad_host:"  # + reason: a URL of a host in BadHosts, recorded without a request
RETRY = "retry:"  # + reason: a try that will be repeated (a count, never a record)

# Unreachable hosts: to BadHosts (a certificate is the host's, not the URL's).
HOST_FAILURES = frozenset({CONNECT_REFUSED, CONNECT_TIMEOUT, CONNECT_ERROR, TLS})
# Worth another try later, within the retry budget, after a host backoff.
TRANSIENT = frozenset({READ_TIMEOUT, TOTAL_TIMEOUT, RESET, PROTOCOL})
# What a DNSError's kind is recorded as (crawler.net.dnscache.KINDS).
DNS_REASONS = {"nxdomain": DNS_NXDOMAIN, "nodata": DNS_NODATA, "servfail": DNS_SERVFAIL,
               "timeout": DNS_TIMEOUT, "private": PRIVATE_IP, "error": DNS_ERROR}


def dns_reason(kind: str) -> str:
    """The reason a DNS failure of ``kind`` is recorded with."""
    return DNS_REASONS.get(kind, DNS_ERROR)


def bad_host(reason: str) -> str:
    """The reason of a URL recorded unrequested because its host is in BadHosts."""
    return BAD_HOST + reason


# The words the outcome log writes as codes (crawler.state.outcomelog: a code is a
# position in LOGGED, on disk). A new word (a reason, and its bad_host form if a host
# can fail with it) is appended at the end; nothing is ever reordered or removed.
_FIRST_LOGGED = (
    "", PRIVATE_IP, DNS_NXDOMAIN, DNS_NODATA, DNS_SERVFAIL, DNS_TIMEOUT, DNS_ERROR,
    CONNECT_REFUSED, CONNECT_TIMEOUT, CONNECT_ERROR, TLS, READ_TIMEOUT, TOTAL_TIMEOUT, RESET,
    PROTOCOL, ROBOTS_UNAVAILABLE, ROBOTS_DISALLOWED, HOST_PAGE_LIMIT, REDIRECT_LIMIT,
    NOT_HTML, BAD_URL, INTERNAL_ERROR, TOO_LARGE, DECOMPRESSION_BOMB, ABORTED,
)
LOGGED: tuple[str, ...] = _FIRST_LOGGED + tuple(bad_host(r) for r in _FIRST_LOGGED[1:])


def http_retry(status: int) -> str:
    """The reason of a retried 429 or 5xx answer (in ``retry:`` counts)."""
    return f"http_{status}"


# -- classes ---------------------------------------------------------------------

CLASSES = (
    "ok", "redirect", "http_4xx", "http_5xx", "not_html", "truncated", "robots", "limit",
    "dns", "connect", "timeout", "broken", "bad_host", "retry", "other",
)
CLASS_OF = {
    NOT_HTML: "not_html",
    TOO_LARGE: "truncated", DECOMPRESSION_BOMB: "truncated",
    ROBOTS_DISALLOWED: "robots", ROBOTS_UNAVAILABLE: "robots",
    REDIRECT_LIMIT: "limit", HOST_PAGE_LIMIT: "limit",
    PRIVATE_IP: "dns", DNS_NXDOMAIN: "dns", DNS_NODATA: "dns", DNS_SERVFAIL: "dns",
    DNS_TIMEOUT: "dns", DNS_ERROR: "dns",
    CONNECT_REFUSED: "connect", CONNECT_TIMEOUT: "connect", CONNECT_ERROR: "connect",
    TLS: "connect",
    READ_TIMEOUT: "timeout", TOTAL_TIMEOUT: "timeout",
    RESET: "broken", PROTOCOL: "broken",
    INTERNAL_ERROR: "other", BAD_URL: "other",
}


def outcome_key(status: int, reason: str, truncated: str = "") -> str:
    """The counter key of a recorded outcome: its reason, else why its body was
    cut, else its HTTP status ("200", "404")."""
    return reason or truncated or str(status)


def outcome_class(key: str) -> str:
    """The class (one of CLASSES) of an outcome key."""
    if key.startswith(RETRY):
        return "retry"
    if key.startswith(BAD_HOST):
        return "bad_host"
    cls = CLASS_OF.get(key)
    if cls is not None:
        return cls
    if key.startswith("dns_"):  # a DNS kind a newer resolver may add
        return "dns"
    if key.isdigit():
        status = int(key)
        if 200 <= status < 300:
            return "ok"
        if 300 <= status < 400:
            return "redirect"
        if 400 <= status < 500:
            return "http_4xx"
        if 500 <= status < 600:
            return "http_5xx"
    return "other"


def by_class(outcomes: dict[str, int]) -> dict[str, int]:
    """Outcome counts summed per class (classes with no outcome left out)."""
    out: dict[str, int] = {}
    for key, n in outcomes.items():
        cls = outcome_class(key)
        out[cls] = out.get(cls, 0) + n
    return {c: out[c] for c in CLASSES if c in out}


# -- what each means, and what addresses it ----------------------------------------


@dataclass(frozen=True, slots=True)
class Hint:
    """One reason's words. ``fix``: what to do ("" if nothing); ``flag``: the ``start``
    option that addresses it, for a resume command ("" if none); ``failure``: False
    for a limit, the site's wish or an answer (not retried by a bare ``retry``);
    ``retry``: whether ``retry`` is worth suggesting at all."""

    meaning: str
    fix: str = ""
    flag: str = ""
    failure: bool = True
    retry: bool = True


# Every reason a record can carry (and the truncations, which stand for a reason in the
# counts), plus the HTTP error classes. crawler.cli.retry accepts prefixes of these.
HINTS: dict[str, Hint] = {
    "private_ip": Hint(
        "the host resolved to a private, loopback or link-local address, which is not "
        "fetched by default (a crawled page must not steer the crawler into your network)",
        "add --allow-private-ips if you mean to crawl it", "--allow-private-ips"),
    "tls": Hint(
        "the HTTPS certificate could not be verified (unknown CA, wrong name, expired) or "
        "the TLS handshake failed",
        "if you trust the site's CA, give it with --ca-bundle FILE (PEM)", "--ca-bundle FILE"),
    "dns_nxdomain": Hint(
        "the host name does not exist in DNS",
        "check the URL, or ask another resolver with --nameserver IP[:PORT]",
        "--nameserver IP[:PORT]"),
    "dns_nodata": Hint(
        "the host name has no IPv4 address (IPv6-only hosts are not crawled)",
        "check the name, or ask another resolver with --nameserver IP[:PORT]",
        "--nameserver IP[:PORT]"),
    "dns_servfail": Hint(
        "the DNS server could not answer for the host",
        "try again later, or ask another resolver with --nameserver IP[:PORT]",
        "--nameserver IP[:PORT]"),
    "dns_timeout": Hint(
        "no DNS answer came within --dns-timeout",
        "raise --dns-timeout S, or ask another resolver with --nameserver IP[:PORT]",
        "--dns-timeout S"),
    "dns_error": Hint(
        "the lookup failed (a bad name, a broken answer, an unreachable resolver)",
        "check the URL and the resolver (--nameserver IP[:PORT])", "--nameserver IP[:PORT]"),
    "connect_refused": Hint(
        "nothing accepted the connection on the host's port (the site is down, or the "
        "port is wrong), or on the --proxy's",
        "try again later"),
    "connect_timeout": Hint(
        "no connection (TCP, then TLS) within --connect-timeout",
        "raise --connect-timeout S, or try again later", "--connect-timeout S"),
    "connect_error": Hint(
        "the connection failed (no route to the host, the network is down, or the --proxy "
        "would not open a tunnel to it: the detail says why)",
        "check the network, then try again"),
    "read_timeout": Hint(
        "the server went silent longer than --read-timeout in its answer, on every try",
        "raise --read-timeout S", "--read-timeout S"),
    "total_timeout": Hint(
        "the fetch took longer than --timeout (connect to last byte), on every try",
        "raise --timeout S", "--timeout S"),
    "reset": Hint(
        "the server closed or reset the connection before its answer was complete, on "
        "every try",
        "try again later"),
    "protocol": Hint(
        "the answer was not valid HTTP (status line, headers, chunking or gzip), on "
        "every try",
        "try again later (the server is at fault)"),
    "robots_unavailable": Hint(
        "robots.txt answered 5xx or 429, or nothing, so the host counted as disallowed "
        "for now (RFC 9309)",
        "try again later"),
    "robots_disallowed": Hint(
        "robots.txt forbids the URL: the site's wish, not a failure",
        "--ignore-robots fetches it anyway: only on sites you own or may crawl so, as "
        "ignoring robots.txt is impolite", "--ignore-robots", failure=False),
    "host_page_limit": Hint(
        "a limit, not a failure: the host had reached --max-pages-per-host in that run",
        "raise --max-pages-per-host N (it counts per run)", "--max-pages-per-host N",
        failure=False),
    "redirect_limit": Hint(
        "a limit, not a failure: more than --max-redirects redirects in a row (the last "
        "one is recorded)",
        "raise --max-redirects N", "--max-redirects N", failure=False),
    "too_large": Hint(
        "a limit, not a failure: the body was cut at --max-body-bytes (its first part "
        "is stored)",
        "raise --max-body-bytes SIZE", "--max-body-bytes SIZE", failure=False),
    "decompression_bomb": Hint(
        "a limit, not a failure: the decoded body was cut at --max-decoded-bytes (its "
        "first part is stored)",
        "raise --max-decoded-bytes SIZE", "--max-decoded-bytes SIZE", failure=False),
    "not_html": Hint(
        "not a failure: pages that are not HTML are recorded with their content type, "
        "their bodies neither stored nor parsed", failure=False, retry=False),
    "bad_url": Hint(
        "a URL that could not be split into host and path for a request", retry=False),
    "internal_error": Hint(
        "a crawler bug (the log has its traceback)",
        "please report it; retry once a fixed version is installed"),
    "4xx": Hint(
        "the server answered with a client error (404 not found, 403 forbidden, 410 "
        "gone...)",
        "usually final (a broken link); retry once the site is fixed"),
    "5xx": Hint(
        "the server answered with an error on every try",
        "try again later, or allow more tries with --max-retries N", "--max-retries N"),
}

# Reasons a record can carry (HTTP classes aside): what --reason prefixes must match.
REASONS: tuple[str, ...] = tuple(k for k in HINTS if not k[0].isdigit())
