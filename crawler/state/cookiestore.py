"""The crawl's cookie jar, on kvstore (``cookies/``), one per shard.

Theory of operation
-------------------
The rules are crawler.web.cookies (RFC 6265); this is where they are kept.
One record per *site* (a registrable domain, or a host that has none:
crawler.web.cookies.site_of), keyed by md5 of the site's name, holds every
cookie of the site, so a request needs one lookup and its answer one write.
A host belongs to one shard (crawler.state.shards), so each shard keeps the
cookies of its own hosts: a cookie set for a whole domain reaches the hosts
of that domain that the same shard owns.

On disk: the site's name and its cookies as UTF-8 JSON, ``{"site": S,
"cookies": [[name, value, domain, path, expires, flags, created], ...]}``,
``expires`` null for a session cookie, ``flags`` 1 host-only, 2 Secure, 4
HttpOnly, times in ``time.time()`` seconds. A record that does not decode (or
names another site) is logged and read as no cookies: cookies are advisory
state, like BadHosts and the robots store.

- A site with no record costs no disk access: ``key in store`` is in memory.
- Write-through: a change is written and flushed to the OS at once, so a
  kill -9 an instant later keeps it. fsync is at close (a power loss may cost
  the cookies set since the last start, as it may cost robots.txt answers).
- Session cookies are kept: a crawl is one long session across its resumes.
- Bounded: a site by crawler.web.cookies' limits, the jar by ``max_sites``
  records: a new site past it evicts a random one (``random_key``, no disk
  access). Memory is the store's keys (~30 bytes a site); nothing else is held.
  Every ``_COMPACT_EVERY`` writes the store is compacted if most of it is dead
  (a site's record is rewritten at each change).

Thread safety: ``header`` from any thread; ``receive`` from any thread (one lock
orders the read-modify-write of records); ``close`` once, at the end.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

from publicsuffixlist import PublicSuffixList

import kvstore

from ..web.cookies import Cookie, Suffixes, cookie_header, receive, site_of
from ..web.urls import URL
from .syncer import compact_if_wasted

__all__ = ["COOKIES_NAME", "MAX_COOKIE_SITES", "CookieJar"]

log = logging.getLogger(__name__)

COOKIES_NAME = "cookies"
# Sites with cookies kept per shard. A record is at most web.cookies.MAX_SITE_BYTES (32 KiB)
# and typically a few hundred bytes: ~15 MB on disk at a typical 300 bytes a site, 1.6 GB at
# worst; ~1.5 MB of keys in memory.
MAX_COOKIE_SITES = 50_000
_COMPACT_EVERY = 4096  # writes between two looks at the store's dead bytes
_COMPACT_MIN_DEAD = 16 << 20
_HOST_ONLY, _SECURE, _HTTP_ONLY = 1, 2, 4


def _key(site: str) -> bytes:
    return hashlib.md5(site.encode("utf-8")).digest()


def encode_site(site: str, cookies: list[Cookie]) -> bytes:
    """A site's record: its name and its cookies (see the module docstring)."""
    rows = [[c.name, c.value, c.domain, c.path, c.expires,
             _HOST_ONLY * c.host_only | _SECURE * c.secure | _HTTP_ONLY * c.http_only,
             c.created] for c in cookies]
    return json.dumps({"site": site, "cookies": rows}, separators=(",", ":")).encode()


def decode_site(data: bytes) -> tuple[str, list[Cookie]]:
    """(site, cookies) of a record; ValueError when it is not one (damaged)."""
    try:
        doc = json.loads(data)
        site = doc["site"]
        if not isinstance(site, str):
            raise TypeError(f"site {site!r}")
        return site, [
            Cookie(str(n), str(v), str(d), str(p), None if e is None else float(e),
                   bool(f & _HOST_ONLY), bool(f & _SECURE), bool(f & _HTTP_ONLY), float(c))
            for n, v, d, p, e, f, c in doc["cookies"]]
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError, UnicodeError too
        raise ValueError(f"not a cookie record: {exc!r}") from exc


class CookieJar:
    """The cookies of one shard's hosts, on kvstore; see the module docstring."""

    def __init__(self, data_dir: str, *, max_sites: int = MAX_COOKIE_SITES,
                 suffixes: Suffixes | None = None, readonly: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = kvstore.open(os.path.join(data_dir, COOKIES_NAME), readonly=readonly)
        self._suffixes: Suffixes = suffixes if suffixes is not None else PublicSuffixList()
        self.max_sites = max_sites
        self._clock = clock
        self._lock = threading.Lock()
        self._writes = 0
        self._compacting = threading.Lock()  # one compaction at a time

    def site(self, host: str) -> str:
        """The site whose record holds ``host``'s cookies."""
        return site_of(host, self._suffixes)

    def cookies(self, site: str) -> list[Cookie]:
        """The stored cookies of ``site`` (expired ones included until its next change)."""
        key = _key(site)
        if key not in self._store:  # in memory: a site without cookies costs no read
            return []
        try:
            named, cookies = decode_site(self._store[key])
            if named != site:  # a value that names its key: a damaged pointer shows here
                raise ValueError(f"the record of {named!r}")
        except (ValueError, KeyError, kvstore.exceptions.KVStoreError) as exc:
            log.warning("cookie jar: %s: %s (read as none)", site, exc)
            return []
        return cookies

    def header(self, url: URL) -> str:
        """The Cookie header to send with a request of ``url`` ("" for none)."""
        cookies = self.cookies(self.site(url.host))
        if not cookies:
            return ""
        return cookie_header(cookies, scheme=url.scheme, host=url.host,
                             path=url.target.partition("?")[0], now=self._clock())

    def receive(self, url: URL, set_cookie: str) -> bool:
        """Store what an answer to a request of ``url`` set: ``set_cookie`` is its
        Set-Cookie lines joined by a newline (as crawler.net.fetch keeps them). True when
        the jar changed (written and flushed); False when nothing was accepted or nothing
        changed. A write that fails (a full disk) is logged: the cookies are not kept."""
        if not set_cookie:
            return False
        site = self.site(url.host)
        with self._lock:
            old = self.cookies(site)
            new = receive(old, set_cookie.split("\n"), host=url.host,
                          path=url.target.partition("?")[0], now=self._clock(),
                          suffixes=self._suffixes)
            if new is None:
                return False
            try:
                self._write(site, new)
            except (OSError, kvstore.exceptions.KVStoreError) as exc:
                log.warning("cookie jar: %s not kept: %s", site, exc)
                return False
            self._writes += 1
            upkeep = self._writes % _COMPACT_EVERY == 0
        if upkeep and self._compacting.acquire(blocking=False):
            try:  # outside the lock: writes go on beside a compaction (kvstore allows it)
                compact_if_wasted(self._store, _COMPACT_MIN_DEAD, "cookie jar")
            finally:
                self._compacting.release()
        return True

    def _write(self, site: str, cookies: list[Cookie]) -> None:
        key, store = _key(site), self._store
        if not cookies:
            if key in store:
                del store[key]
        else:
            if key not in store and len(store) >= self.max_sites:
                del store[store.random_key()]  # the jar is full: a random site gives way
            store[key] = encode_site(site, cookies)
        store.flush()

    def sites(self) -> Iterator[tuple[str, list[Cookie]]]:
        """(site, cookies) of every record (for reading a jar; not while it changes)."""
        for key in list(self._store):
            try:
                yield decode_site(self._store[key])
            except (ValueError, KeyError, kvstore.exceptions.KVStoreError) as exc:
                log.warning("cookie jar: record %s: %s", key.hex(), exc)

    def __len__(self) -> int:
        """Sites with a record."""
        return len(self._store)

    def close(self) -> None:
        """Flush, fsync and close. Idempotent."""
        try:
            self._store.close()
        except OSError as exc:  # a full disk: the cookies since the last flush are lost
            log.warning("cookie jar: %s", exc)
            self._store.abandon()
