"""The link graph of the synthetic site, deterministic from (pages, hosts, seed).

Theory of operation: page ``i < hosts`` is the home page (``/``) of host
``hi.test``; every other page sits on a host drawn with Zipf-like weights, in
one of four sections (``/s{k}/p{id}.html``). Each page ``i >= 1`` gets one
link from a random earlier page (a spanning tree rooted at page 0, so every
page is reachable from ``h0.test/``), then links to targets drawn with weights
``1 / rank**ALPHA`` over a random ranking of pages until it has 10-40 links:
a few pages collect most of the in-links (a power-law-like in-degree).

Links are stored as tagged ints (``code``) so a 50,000-page graph stays a few
MB: a page, a query variant of a page (``?v=1``/``?v=2``, served as the page
itself), a redirect (``/r/{k}`` single or ``/rc/{k}/{hop}`` chained) or a
missing page (``/missing/{k}.html``, 404). How a link is written in the HTML
(relative, absolute, with a fragment) is chosen at render time and never
changes the URL it resolves to.

Only ``Random.random()`` is used (its sequence is the one thing Python
promises to keep across versions), so a seed gives the same site everywhere.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect
from dataclasses import dataclass
from itertools import accumulate
from random import Random

from .encodings import CODINGS

SECTIONS = 4
ALPHA = 1.1  # in-degree skew: weight of the page ranked r is 1 / r**ALPHA
HOST_ALPHA = 0.7  # host size skew
VARIANT_RATE = 0.03  # share of links that get a ?v= query variant
REDIRECTS_PER_PAGE = 1 / 40
MISSING_PER_PAGE = 1 / 60

PAGE, VARIANT, REDIRECT, MISSING = range(4)
_SHIFT = 40
_MASK = (1 << _SHIFT) - 1
_PAGE_PATH = re.compile(r"/s([0-9])/p([0-9]+)\.html")


def encode(kind: int, payload: int) -> int:
    return (kind << _SHIFT) | payload


def decode(code: int) -> tuple[int, int]:
    return code >> _SHIFT, code & _MASK


def host_name(index: int) -> str:
    return f"h{index}.test"


@dataclass(frozen=True, slots=True)
class SiteConfig:
    """What a site is generated from; equal configs give byte-identical sites."""

    pages: int = 200
    hosts: int = 4
    seed: int = 0
    # Host indexes served over HTTPS; None: the last host when there are >= 2.
    tls_hosts: tuple[int, ...] | None = None
    crawl_delay: float = 1.0  # the Crawl-delay of hosts whose robots.txt sets one
    min_links: int = 10
    max_links: int = 40
    min_size: int = 5_000  # page body size range, bytes
    max_size: int = 20_000
    # Content-Encodings pages are answered in, the first the request accepts (as nginx's
    # gzip and brotli filters do); () answers identity always.
    encodings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.pages < self.hosts:
            raise ValueError(f"need 1 <= hosts <= pages, got hosts={self.hosts} pages={self.pages}")
        if not 0 <= self.min_links <= self.max_links:
            raise ValueError("need 0 <= min_links <= max_links")
        if not 0 < self.min_size <= self.max_size:
            raise ValueError("need 0 < min_size <= max_size")
        for coding in self.encodings:
            if coding not in CODINGS:
                raise ValueError(f"unknown encoding {coding!r}: one of {CODINGS}")
        for i in self.tls_hosts or ():
            if not 0 <= i < self.hosts:
                raise ValueError(f"tls host index {i} out of range")

    @property
    def tls(self) -> frozenset[int]:
        if self.tls_hosts is not None:
            return frozenset(self.tls_hosts)
        return frozenset({self.hosts - 1}) if self.hosts >= 2 else frozenset()


@dataclass(frozen=True, slots=True)
class Redirect:
    host: int  # the host the redirect lives on
    target: int  # page id it ends at
    status: int  # 301 or 302
    hops: int  # 1: /r/{k}; 2-3: /rc/{k}/0 -> /rc/{k}/1 ... -> the page


class Graph:
    """The generated graph. Immutable after construction; safe to share between threads."""

    def __init__(self, config: SiteConfig) -> None:
        self.config = config
        rng = Random(config.seed)
        n, h = config.pages, config.hosts
        self.host_of = array("i", range(h))
        self.section = array("b", [-1] * h)
        host_cum = list(accumulate(1 / (i + 1) ** HOST_ALPHA for i in range(h)))
        for _ in range(h, n):
            self.host_of.append(bisect(host_cum, rng.random() * host_cum[-1]))
            self.section.append(int(rng.random() * SECTIONS))
        ranking = list(range(n))
        for i in range(n - 1, 0, -1):  # Fisher-Yates on random() only
            j = int(rng.random() * (i + 1))
            ranking[i], ranking[j] = ranking[j], ranking[i]
        weight = [0.0] * n
        for rank, pid in enumerate(ranking):
            weight[pid] = 1 / (rank + 1) ** ALPHA
        cum = list(accumulate(weight))
        total = cum[-1]
        children: list[list[int]] = [[] for _ in range(n)]
        for pid in range(1, n):
            children[int(rng.random() * pid)].append(pid)
        self.out: list[array[int]] = []
        span = config.max_links - config.min_links + 1
        for pid in range(n):
            want = config.min_links + int(rng.random() * span)
            links = [encode(PAGE, c) for c in children[pid]]
            seen = set(children[pid])
            seen.add(pid)
            tries = 0
            while len(links) < want and len(seen) < n and tries < 4 * want:
                tries += 1
                t = min(bisect(cum, rng.random() * total), n - 1)
                if t in seen:
                    continue
                seen.add(t)
                if rng.random() < VARIANT_RATE:
                    links.append(encode(VARIANT, t << 2 | (1 + int(rng.random() * 2))))
                else:
                    links.append(encode(PAGE, t))
            self.out.append(array("q", links))
        self.redirects: list[Redirect] = []
        for k in range(max(1, int(n * REDIRECTS_PER_PAGE))):
            src = int(rng.random() * n)
            target = min(bisect(cum, rng.random() * total), n - 1)
            status = 301 if rng.random() < 0.5 else 302
            r = rng.random()
            hops = 1 if r < 0.6 else 2 if r < 0.85 else 3
            self.redirects.append(Redirect(self.host_of[src], target, status, hops))
            self.out[src].append(encode(REDIRECT, k))
        self.missing: list[int] = []  # host of each missing page
        for k in range(max(1, int(n * MISSING_PER_PAGE))):
            src = int(rng.random() * n)
            self.missing.append(self.host_of[src])
            self.out[src].append(encode(MISSING, k))
        # One draw per page for its body size, kept so rendering needs no rng replay.
        self.size_seed = [rng.random() for _ in range(n)]

    @property
    def pages(self) -> int:
        return self.config.pages

    def page_path(self, pid: int) -> str:
        if pid < self.config.hosts:
            return "/"
        return f"/s{self.section[pid]}/p{pid}.html"

    def page_at(self, host: int, path: str) -> int | None:
        """The page id served at ``path`` on host index ``host``, or None."""
        if path == "/":
            return host
        m = _PAGE_PATH.fullmatch(path)
        if m is None:
            return None
        pid = int(m.group(2))
        if (
            pid < self.config.hosts
            or pid >= self.config.pages
            or self.host_of[pid] != host
            or self.section[pid] != int(m.group(1))
            or str(pid) != m.group(2)
        ):
            return None
        return pid

    def page_size(self, pid: int) -> int:
        c = self.config
        return c.min_size + int(self.size_seed[pid] * (c.max_size - c.min_size + 1))

    def in_degree(self) -> list[int]:
        """In-links per page (plain and variant links), for tests and stats."""
        deg = [0] * self.config.pages
        for links in self.out:
            for code in links:
                kind, payload = decode(code)
                if kind == PAGE:
                    deg[payload] += 1
                elif kind == VARIANT:
                    deg[payload >> 2] += 1
        return deg
