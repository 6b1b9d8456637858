"""Cookies per RFC 6265: Set-Cookie parsed, the storage model, the Cookie header (pure, no I/O).

Theory of operation
-------------------
A crawl keeps one jar (crawler.state.cookiestore), split into *sites*: a
site is a host's registrable domain (eTLD+1, by the Public Suffix List), or
the host itself when it has none (an IP address, a host that is a public
suffix). Every cookie a host may set or be sent belongs to its host's site:
a Domain attribute must domain-match the host and must not be a public
suffix, so it never names more than the site. So one record per site holds
every cookie a request can need, and this module works on one site's list.

- :func:`parse_set_cookie` is §5.2: name and value, then the attributes
  (Expires with the §5.1.1 date algorithm, Max-Age, Domain, Path, Secure,
  HttpOnly; SameSite is parsed and ignored: a crawler's requests are
  top-level fetches). The last of an attribute wins. A line longer than
  ``MAX_COOKIE_BYTES`` (§6.1's 4096 bytes for name, value and attributes),
  with no ``=`` or an empty name, or whose name or value holds a control
  character (RFC 6265bis: it would corrupt the Cookie header), is ignored.
- :func:`make_cookie` is §5.3 steps 2-10: Max-Age wins over Expires (no
  expiry: a session cookie, ``expires`` None), a public-suffix Domain is
  refused (or, equal to the host, makes a host-only cookie), a Domain the
  host does not domain-match is refused, no Domain makes a host-only cookie,
  no Path the default-path of the request.
- :func:`store` is §5.3 steps 11-12 and the limits: a cookie replacing one
  of the same name, domain and path keeps its creation time; an expired one
  removes its namesake (and is not kept); expired cookies go; past
  ``MAX_COOKIES_PER_SITE`` or ``MAX_SITE_BYTES`` the oldest (by creation:
  the jar keeps no access times) are evicted. It says whether anything
  changed, so an unchanged site is not written again: a cookie set again with
  the same name, value, attributes and an expiry that moved by less than
  ``EXPIRY_SLACK`` (a Max-Age counted from each answer) is no change.
- :func:`cookie_header` is §5.4: the cookies whose domain (exactly, for a
  host-only one) and path match the request, Secure ones only over https,
  unexpired, longest path first, then oldest first.

A Set-Cookie flood is bounded here at every step: each line by its length,
a site by count and bytes; the fetcher keeps at most a bounded number of
lines of an answer (crawler.net.fetch).

Thread safety: every function is pure; a :class:`Suffixes` given in is read only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

__all__ = [
    "EXPIRY_SLACK", "MAX_COOKIES_PER_SITE", "MAX_COOKIE_BYTES", "MAX_SITE_BYTES", "Cookie",
    "SetCookie", "Suffixes", "cookie_header", "default_path", "domain_match", "make_cookie",
    "parse_cookie_date", "parse_set_cookie", "path_match", "receive", "site_of", "store",
]

# RFC 6265 §6.1: at least 4096 bytes per cookie (name, value and attributes: the
# Set-Cookie line) and at least 50 cookies per domain. Longer lines are ignored.
MAX_COOKIE_BYTES = 4096
MAX_COOKIES_PER_SITE = 50
# The bytes one site's cookies may take (their names, values, domains and paths, plus
# ``_COOKIE_OVERHEAD`` each): fifty typical cookies, or eight of the largest. What bounds
# a site's record on disk and the Cookie header sent to it.
MAX_SITE_BYTES = 32 << 10
_COOKIE_OVERHEAD = 32
# A cookie set again unchanged but for an expiry this close to the stored one is no
# change: a Max-Age is counted from each answer, and rewriting the site's record on
# every page of a site that sends one would only grow the store's dead bytes.
EXPIRY_SLACK = 3600.0


class Suffixes(Protocol):
    """The Public Suffix List (publicsuffixlist.PublicSuffixList has these)."""

    def is_public(self, domain: str) -> bool: ...

    def privatesuffix(self, domain: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class SetCookie:
    """One Set-Cookie line, parsed (§5.2); not yet checked against a request."""

    name: str
    value: str
    expires: float | None = None  # Expires, as time.time() seconds
    max_age: int | None = None  # Max-Age in seconds (<= 0: expire now)
    domain: str = ""  # lowercase, a leading dot dropped; "" when absent
    path: str | None = None  # None when absent or not starting with "/"
    secure: bool = False
    http_only: bool = False
    same_site: str = ""  # lowercase, parsed and ignored


@dataclass(frozen=True, slots=True)
class Cookie:
    """A cookie in the jar (§5.3). ``expires`` None: a session cookie (for a crawler,
    the crawl is the session: it lasts across resumes)."""

    name: str
    value: str
    domain: str  # the host, for a host-only cookie; else the Domain attribute
    path: str
    expires: float | None
    host_only: bool
    secure: bool
    http_only: bool
    created: float

    @property
    def size(self) -> int:
        """What the cookie counts against ``MAX_SITE_BYTES``."""
        return (len(self.name) + len(self.value) + len(self.domain) + len(self.path)
                + _COOKIE_OVERHEAD)

    def expired(self, now: float) -> bool:
        return self.expires is not None and self.expires <= now


# -- §5.1.1 dates ------------------------------------------------------------------------

_DELIMITERS = re.compile(r"[\x09\x20-\x2f\x3b-\x40\x5b-\x60\x7b-\x7e]+")
_TIME = re.compile(r"([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})(?:[^0-9].*)?", re.DOTALL)
_DAY = re.compile(r"([0-9]{1,2})(?:[^0-9].*)?", re.DOTALL)
_YEAR = re.compile(r"([0-9]{2,4})(?:[^0-9].*)?", re.DOTALL)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def parse_cookie_date(text: str) -> float | None:
    """A cookie-date (§5.1.1: the lenient algorithm browsers use) as time.time()
    seconds; None when it is no date."""
    hms = day = month = year = None
    for token in _DELIMITERS.split(text):
        if not token:
            continue
        if hms is None and (m := _TIME.fullmatch(token)):
            hms = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif day is None and (m := _DAY.fullmatch(token)):
            day = int(m.group(1))
        elif month is None and token[:3].lower() in _MONTHS:
            month = _MONTHS.index(token[:3].lower()) + 1
        elif year is None and (m := _YEAR.fullmatch(token)):
            year = int(m.group(1))
    if hms is None or day is None or month is None or year is None:
        return None
    if 70 <= year <= 99:
        year += 1900
    elif 0 <= year <= 69:
        year += 2000
    hour, minute, second = hms
    if not 1 <= day <= 31 or year < 1601 or hour > 23 or minute > 59 or second > 59:
        return None
    try:
        return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()
    except ValueError:  # a day the month does not have
        return None


# -- §5.2 parsing --------------------------------------------------------------------------

_WSP = " \t"
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_MAX_AGE = re.compile(r"-?[0-9]+")


def parse_set_cookie(line: str) -> SetCookie | None:
    """One Set-Cookie header value (§5.2); None when it is to be ignored."""
    if len(line) > MAX_COOKIE_BYTES:
        return None
    pair, _, attributes = line.partition(";")
    name, eq, value = pair.partition("=")
    name, value = name.strip(_WSP), value.strip(_WSP)
    if not eq or not name or _CONTROL.search(name) or _CONTROL.search(value):
        return None
    expires: float | None = None
    max_age: int | None = None
    domain, path, same_site = "", None, ""
    secure = http_only = False
    for av in attributes.split(";"):  # each attribute: the last valid one wins
        key, _, raw = av.partition("=")
        key, raw = key.strip(_WSP).lower(), raw.strip(_WSP)
        if key == "expires":
            when = parse_cookie_date(raw)
            expires = expires if when is None else when  # no date: the attribute is ignored
        elif key == "max-age" and _MAX_AGE.fullmatch(raw):
            max_age = int(raw)
        elif key == "domain" and raw:  # an empty Domain is ignored (§5.2.3)
            domain = (raw[1:] if raw.startswith(".") else raw).lower()
        elif key == "path":
            path = raw if raw.startswith("/") else None  # else the default-path (§5.2.4)
        elif key == "secure":
            secure = True
        elif key == "httponly":
            http_only = True
        elif key == "samesite":
            same_site = raw.lower()
    return SetCookie(name, value, expires=expires, max_age=max_age, domain=domain, path=path,
                     secure=secure, http_only=http_only, same_site=same_site)


# -- §5.1.3, §5.1.4: domains and paths -------------------------------------------------------


def _is_ip(host: str) -> bool:
    if host.startswith("["):
        return True
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def domain_match(host: str, domain: str) -> bool:
    """Whether ``host`` (canonical, lowercase) domain-matches ``domain`` (§5.1.3)."""
    if host == domain:
        return True
    return (bool(domain) and host.endswith(domain) and host[-len(domain) - 1] == "."
            and not _is_ip(host))


def default_path(path: str) -> str:
    """The default-path of a request path (§5.1.4): its directory."""
    if not path.startswith("/") or path.count("/") == 1:
        return "/"
    return path[: path.rindex("/")]


def path_match(request_path: str, cookie_path: str) -> bool:
    """Whether ``request_path`` path-matches ``cookie_path`` (§5.1.4)."""
    if request_path == cookie_path:
        return True
    return request_path.startswith(cookie_path) and (
        cookie_path.endswith("/") or request_path[len(cookie_path)] == "/")


def site_of(host: str, suffixes: Suffixes) -> str:
    """The site whose record holds ``host``'s cookies: its registrable domain, or the
    host itself (an IP address, a public suffix, a name the list does not know)."""
    if _is_ip(host):
        return host
    return suffixes.privatesuffix(host) or host


# -- §5.3 the storage model ------------------------------------------------------------------


def make_cookie(parsed: SetCookie, *, host: str, path: str, now: float,
                suffixes: Suffixes) -> Cookie | None:
    """The cookie ``parsed`` makes when set by an answer to a request for ``host`` and
    ``path`` (§5.3 steps 2-10); None when it is refused."""
    if parsed.max_age is not None:
        expires: float | None = now + parsed.max_age if parsed.max_age > 0 else 0.0
    else:
        expires = parsed.expires
    domain = parsed.domain
    if domain and not domain.isascii():
        return None  # an IDN Domain attribute: only its A-label form is understood
    if domain and suffixes.is_public(domain):
        if domain != host:
            return None  # a cookie for a public suffix (co.uk): every site's, refused
        domain = ""
    if domain and not domain_match(host, domain):
        return None
    return Cookie(parsed.name, parsed.value, domain or host,
                  parsed.path if parsed.path is not None else default_path(path),
                  expires, host_only=not domain, secure=parsed.secure,
                  http_only=parsed.http_only, created=now)


def _same(old: Cookie, new: Cookie) -> bool:
    """Whether ``new`` changes nothing worth writing over ``old`` (same key)."""
    if (old.value, old.host_only, old.secure, old.http_only) != (
            new.value, new.host_only, new.secure, new.http_only):
        return False
    if old.expires is None or new.expires is None:
        return old.expires is new.expires
    return abs(old.expires - new.expires) < EXPIRY_SLACK


def store(cookies: Sequence[Cookie], new: Iterable[Cookie], now: float) -> list[Cookie] | None:
    """One site's cookies with ``new`` stored (§5.3 steps 11-12, the limits); None when
    nothing changed (see the module docstring)."""
    jar = {(c.name, c.domain, c.path): c for c in cookies if not c.expired(now)}
    changed = len(jar) != len(cookies)
    for c in new:
        key = (c.name, c.domain, c.path)
        old = jar.pop(key, None)
        if c.expired(now):  # a deletion (Max-Age=0, an Expires in the past)
            changed = changed or old is not None
            continue
        if old is not None and _same(old, c):
            jar[key] = old  # kept as it was, moved last (the newest to be set)
            continue
        jar[key] = c if old is None else replace(c, created=old.created)
        changed = True
    if not changed:
        return None
    kept = sorted(jar.values(), key=lambda c: c.created)  # stable: insertion order ties
    size = sum(c.size for c in kept)
    while kept and (len(kept) > MAX_COOKIES_PER_SITE or size > MAX_SITE_BYTES):
        size -= kept.pop(0).size
    return kept


def receive(cookies: Sequence[Cookie], lines: Iterable[str], *, host: str, path: str,
            now: float, suffixes: Suffixes) -> list[Cookie] | None:
    """A site's cookies after an answer for ``host`` and ``path`` set ``lines`` (its
    Set-Cookie values); None when nothing changed."""
    made = []
    for line in lines:
        parsed = parse_set_cookie(line)
        cookie = None if parsed is None else make_cookie(
            parsed, host=host, path=path, now=now, suffixes=suffixes)
        if cookie is not None:
            made.append(cookie)
    return store(cookies, made, now) if made else None


# -- §5.4 the Cookie header ------------------------------------------------------------------


def cookie_header(cookies: Iterable[Cookie], *, scheme: str, host: str, path: str,
                  now: float) -> str:
    """The Cookie header value for a request of ``scheme://host`` ``path`` ("" for none)."""
    sent = [
        c for c in cookies
        if (c.domain == host if c.host_only else domain_match(host, c.domain))
        and path_match(path, c.path)
        and (scheme == "https" or not c.secure)
        and not c.expired(now)
    ]
    sent.sort(key=lambda c: (-len(c.path), c.created))
    return "; ".join(f"{c.name}={c.value}" for c in sent)
