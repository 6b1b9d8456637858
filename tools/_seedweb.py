"""The synthetic web behind tools/seedscale.py: hosts, URLs, outcomes, links, bodies.

Pure (numpy and strings, no I/O). Every URL is a pair (host ``h``, local index
``l``): ``h0.test`` is the largest host. Host sizes are Zipf-like (weight
``(rank + 1 + offset)**-zipf``, at least one URL each: at 48M URLs over a million
hosts the largest has 213k, half have 4 or fewer), and the ``pages + pending`` URLs
are dealt out by cumulative rounding, so the totals are exact whatever the
shape. Host ``h`` has ``size[h]`` URLs; its first ``rec[h]`` are recorded (a
page record) and the rest are pending: the same share of each host (cumulative
rounding again), so big hosts are half-crawled as in a real broad crawl, and a
host whose share rounds to none was only ever linked.

Time: a host's recorded pages are spread evenly over the crawl with a phase of
its own, so a window ``k`` of ``K`` (a slice of the weeks the crawl took) holds
a little of every big host and the first page of some small ones. Everything a
window holds is drawn from a generator seeded by (seed, shards, shard, window):
the records are the same for the same arguments, whatever order the frontier
hands their URLs out in.
"""

from __future__ import annotations

import email.utils
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from crawler import outcomes as oc
from crawler.state.pages import PageRecord, Pending, encode_page
from crawler.state.shards import owner
from crawler.web.urls import url_key

CRAWL_START = 1_704_067_200.0  # 2024-01-01: fixed, so a seed gives the same records
SECTIONS = ("news", "blog/2023", "products", "docs/guide", "about", "forum/t", "shop/item",
            "wiki")
_WORDS = (
    "river stone market garden window winter paper light engine music harbor valley "
    "letter signal forest bridge castle orange silver planet doctor summer thunder "
    "kitchen lesson number island travel history science mountain village button "
    "camera coffee rocket animal language school garden report season office energy "
    "family health money policy theory health record system method culture nature "
    "weather ticket flower museum library station journey service network program "
    "student teacher account design market public simple modern ancient quiet bright"
).split()
# (status, reason, truncated, weight %) of a URL on a host that answers: broad-crawl
# shares (roughly Common Crawl's: most pages 200, redirects next, then 404).
ANSWERS = (
    (200, "", "", 77.0),
    (200, oc.NOT_HTML, "", 2.0),
    (200, "", oc.TOO_LARGE, 0.05),
    (301, "", "", 5.0), (302, "", "", 3.0), (307, "", "", 0.3), (308, "", "", 0.2),
    (301, oc.REDIRECT_LIMIT, "", 0.05),
    (404, "", "", 4.0), (403, "", "", 0.8), (410, "", "", 0.2), (401, "", "", 0.1),
    (500, "", "", 0.3), (503, "", "", 0.3),
    (0, oc.ROBOTS_DISALLOWED, "", 2.5), (0, oc.ROBOTS_UNAVAILABLE, "", 0.3),
    (0, oc.READ_TIMEOUT, "", 0.4), (0, oc.TOTAL_TIMEOUT, "", 0.2), (0, oc.RESET, "", 0.2),
    (0, oc.PROTOCOL, "", 0.05), (0, oc.INTERNAL_ERROR, "", 0.01),
)
# Hosts that never answer: all their URLs end alike. (reason, weight); DNS first.
DEAD_DNS = ((oc.DNS_NXDOMAIN, 70), (oc.DNS_SERVFAIL, 10), (oc.DNS_TIMEOUT, 10),
            (oc.DNS_NODATA, 10))
DEAD_CONNECT = ((oc.CONNECT_REFUSED, 40), (oc.CONNECT_TIMEOUT, 40), (oc.TLS, 20))
DEAD_SHARE = 0.3  # of the hosts with at most DEAD_MAX_PAGES records (found by one link)
DEAD_MAX_PAGES = 2
_NWORDS = len(_WORDS)
_SERVERS = ("nginx", "Apache", "cloudflare", "Microsoft-IIS/10.0", "LiteSpeed")
_NOT_HTML = ("application/pdf", "image/jpeg", "application/zip")
ALIVE, DNS_DEAD, CONNECT_DEAD = 0, 1, 2
SAME_HOST_LINKS = 0.7  # share of a page's links to its own host (navigation)


@dataclass(frozen=True)
class Shape:
    pages: int
    pending: int
    hosts: int
    shards: int = 2
    seed: int = 1
    port: int | None = None  # in every URL (a test web's port); None: plain http
    zipf: float = 1.2  # host weights (rank + offset)**-zipf (Zipf-Mandelbrot)
    zipf_offset: float = 50.0  # at a million hosts (scaled with --hosts): a flatter head
    weeks: float = 6.0  # the fetch times span this
    pad: int = 0  # bytes of incompressible text added to each HTML body (bench_status)
    seeds: int = 10  # home pages of the largest hosts: seeds.txt, depth 0

    def __post_init__(self) -> None:
        if self.pages < 1 or self.pending < 0 or self.hosts < 1:
            raise ValueError("need pages >= 1, pending >= 0, hosts >= 1")
        if self.hosts > self.pages + self.pending:
            raise ValueError("more hosts than URLs: every host has at least one URL")


def _deal(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` split in proportion to ``weights`` by cumulative rounding (exact sum)."""
    edges = np.rint(np.cumsum(weights, dtype=np.float64) * (total / weights.sum()))
    edges[-1] = total
    out: np.ndarray = np.diff(edges, prepend=0.0).astype(np.int64)
    return out


def _unit(seed: int, salt: int, n: int) -> np.ndarray:
    """``n`` uniform draws in [0, 1) of their own stream (one per host property)."""
    out: np.ndarray = np.random.default_rng([seed, salt]).random(n)
    return out


class Web:
    """The hosts of a shape and what each window of a shard holds."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        n_urls = shape.pages + shape.pending
        offset = shape.zipf_offset * shape.hosts / 1_000_000
        weights = (np.arange(1, shape.hosts + 1, dtype=np.float64) + offset) ** -shape.zipf
        self.size = 1 + _deal(n_urls - shape.hosts, weights)
        self.end = np.cumsum(self.size)  # host h's URLs are global ids [end-size, end)
        # recorded per host: cumulative rounding of each host's share
        share = shape.pages / n_urls
        edges = np.rint(self.end * share).astype(np.int64)
        edges[-1] = shape.pages
        self.rec = np.diff(edges, prepend=0)
        self.phase = _unit(shape.seed, 1, shape.hosts)
        self.pphase = _unit(shape.seed, 2, shape.hosts)
        small = (self.rec <= DEAD_MAX_PAGES) & (np.arange(shape.hosts) >= shape.seeds)
        dead = small & (_unit(shape.seed, 3, shape.hosts) < DEAD_SHARE)
        self.kind = np.where(dead, np.where(_unit(shape.seed, 4, shape.hosts) < 0.75,
                                            DNS_DEAD, CONNECT_DEAD), ALIVE).astype(np.int8)
        self.dead_pick = _unit(shape.seed, 5, shape.hosts)
        # host depth: seeds 0, then how many links away from a seed the host was met
        self.hdepth = np.minimum(1 + (-np.log2(_unit(shape.seed, 6, shape.hosts))).astype(
            np.int64), 12)
        self.hdepth[: shape.seeds] = 0
        self.port = f":{shape.port}" if shape.port not in (None, 80) else ""

    # -- ownership and windows ------------------------------------------------------

    def owned(self, shard: int) -> np.ndarray:
        """The hosts of ``shard`` (crawler.state.shards.owner of each host name)."""
        count = self.shape.shards
        marks = np.fromiter((owner(f"h{h}.test", count) == shard
                             for h in range(self.shape.hosts)), dtype=bool,
                            count=self.shape.hosts)
        return np.flatnonzero(marks)

    def windows(self, hosts: np.ndarray, window_pages: int) -> int:
        return max(1, math.ceil(int(self.rec[hosts].sum()) / window_pages))

    def recorded_in(self, hosts: np.ndarray, k: int, windows: int
                    ) -> tuple[np.ndarray, np.ndarray]:
        """(host, local) of the recorded URLs of ``hosts`` in window ``k``."""
        return _slice(hosts, self.rec[hosts], np.zeros(len(hosts), np.int64),
                      self.phase[hosts], k, windows)

    def pending_in(self, hosts: np.ndarray, k: int, windows: int
                   ) -> tuple[np.ndarray, np.ndarray]:
        """(host, local) of the pending URLs of ``hosts`` in window ``k``."""
        rec = self.rec[hosts]
        return _slice(hosts, self.size[hosts] - rec, rec, self.pphase[hosts], k, windows)

    # -- URLs ---------------------------------------------------------------------

    def url(self, h: int, local: int) -> str:
        if local == 0:
            return f"http://h{h}.test{self.port}/"
        return f"http://h{h}.test{self.port}/{SECTIONS[local & 7]}/p{local}.html"

    def depth(self, h: int, local: int) -> int:
        return int(self.hdepth[h]) + (0 if local == 0 else 1 + local.bit_length() // 3)

    def pending_entries(self, hosts: np.ndarray, locals_: np.ndarray) -> list[Pending]:
        hd = self.hdepth
        return [Pending(self.url(h, lo), int(hd[h]) + (0 if lo == 0 else
                                                      1 + lo.bit_length() // 3))
                for h, lo in zip(hosts.tolist(), locals_.tolist(), strict=True)]

    def seed_urls(self) -> list[str]:
        return [self.url(h, 0) for h in range(min(self.shape.seeds, self.shape.hosts))
                if self.rec[h] > 0]


def _slice(hosts: np.ndarray, counts: np.ndarray, offset: np.ndarray, phase: np.ndarray,
           k: int, windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Local indexes ``offset + [ceil(k c/K - phase), ceil((k+1) c/K - phase))`` per
    host: the windows tile ``[0, c)`` exactly (phase in [0, 1))."""
    lo = np.ceil(counts * (k / windows) - phase).astype(np.int64)
    hi = np.ceil(counts * ((k + 1) / windows) - phase).astype(np.int64)
    if k == 0:
        lo[:] = 0
    if k == windows - 1:
        hi = counts.astype(np.int64)
    n = np.maximum(hi - lo, 0)
    keep = n > 0
    n, lo, h = n[keep], (lo + offset)[keep], hosts[keep]
    total = int(n.sum())
    starts = np.repeat(np.cumsum(n) - n, n)
    return np.repeat(h, n), np.repeat(lo, n) + (np.arange(total) - starts)


class Window:
    """The records of one window of one shard, made on demand by position."""

    def __init__(self, web: Web, hosts: np.ndarray, locals_: np.ndarray,
                 pend_hosts: np.ndarray, pend_locals: np.ndarray, rng: np.random.Generator,
                 k: int, windows: int, links: LinkCache) -> None:
        self.web, self.links = web, links
        n = len(hosts)
        self.hosts, self.locals = hosts.tolist(), locals_.tolist()
        s = web.shape
        self.times = (CRAWL_START + (k + rng.random(n)) / windows * s.weeks * 7 * 86400).tolist()
        self.elapsed = np.round(rng.lognormal(-1.3, 0.8, n), 6).tolist()
        probs = np.array([a[3] for a in ANSWERS])
        self.answer = rng.choice(len(ANSWERS), n, p=probs / probs.sum()).tolist()
        self.nlinks = rng.integers(20, 41, n).tolist()
        self.words = rng.integers(0, len(_WORDS), (n, 24)).tolist()
        self.nofollow = (rng.random(n) < 0.1).tolist()
        self.outcomes = [self._outcome(i) for i in range(n)]
        # every pending URL of the window is listed by one of its HTML pages (the one
        # that found it); a window with none (a tiny crawl) leaves them unlisted
        html = [i for i, (status, reason, _) in enumerate(self.outcomes)
                if status == 200 and not reason]
        cuts = np.linspace(0, len(pend_hosts), len(html) + 1).astype(np.int64).tolist()
        self.found: dict[int, tuple[list[int], list[int]]] = {
            i: (pend_hosts[a:b].tolist(), pend_locals[a:b].tolist())
            for i, a, b in zip(html, cuts, cuts[1:], strict=False)}
        # every page's link targets drawn at once, by position: the same records whatever
        # order the frontier hands the URLs out in
        self.first = np.concatenate([[0], np.cumsum(self.nlinks)]).tolist()
        total = self.first[-1]
        own = np.repeat(hosts, self.nlinks)
        size = web.size[own]
        same = rng.random(total) < SAME_HOST_LINKS
        far = np.searchsorted(web.end, rng.integers(0, int(web.end[-1]), total), side="right")
        far_local = np.where(rng.random(total) < 0.5, 0,
                             (web.size[far] * rng.random(total) ** 2).astype(np.int64))
        t_host = np.where(same, own, far)
        t_local = np.where(same, (size * rng.random(total) ** 3).astype(np.int64), far_local)
        self.targets = (t_host.astype(np.int64) << 32 | t_local).tolist()  # LinkCache ids
        pad = s.pad
        self.pad = rng.bytes(max(pad, 1) + 4096).hex() if pad else ""

    def _outcome(self, i: int) -> tuple[int, str, str]:
        h, lo = self.hosts[i], self.locals[i]
        web = self.web
        kind = int(web.kind[h])
        if kind != ALIVE:
            table = DEAD_DNS if kind == DNS_DEAD else DEAD_CONNECT
            reason = _pick(table, float(web.dead_pick[h]))
            if kind == CONNECT_DEAD and lo > 0:  # the host is in BadHosts by now
                reason = oc.bad_host(reason)
            return 0, reason, ""
        if h < web.shape.seeds and lo == 0:
            return 200, "", ""
        status, reason, cut, _ = ANSWERS[self.answer[i]]
        if 300 <= status < 400 and web.size[h] < 2:
            return 200, "", ""  # a host of one URL: nothing to redirect to
        return status, reason, cut

    def record(self, i: int) -> tuple[bytes, str]:
        """Page record ``i`` (encoded, as the crawler writes it) and its outcome key."""
        h, lo = self.hosts[i], self.locals[i]
        web = self.web
        url = web.url(h, lo)
        status, reason, cut = self.outcomes[i]
        key = oc.outcome_key(status, reason, cut)
        base: dict[str, Any] = dict(url=url, status=status, fetched_at=self.times[i],
                                    depth=web.depth(h, lo), reason=reason)
        if status == 0:  # no answer: what the crawler keeps of a failure
            return encode_page(PageRecord(**base)), key
        x = (h * 2654435761) & 0xFFFFFFFF
        ip = f"{16 + (x >> 24) % 200}.{(x >> 16) & 255}.{(x >> 8) & 255}.{x & 255}"
        date = email.utils.formatdate(self.times[i], usegmt=True)
        headers = {"server": _SERVERS[h % len(_SERVERS)], "date": date}
        fields: dict[str, Any] = {}
        if 300 <= status < 400:
            target = web.url(h, (lo + 1) % int(web.size[h]))
            headers.update({"content-type": "text/html", "content-length": "162",
                            "location": target})
            fields = dict(redirect=target, content_type="text/html")
        elif status == 200 and reason == oc.NOT_HTML:
            ctype = _NOT_HTML[lo % len(_NOT_HTML)]
            headers.update({"content-type": ctype, "content-length": str(20000 + lo % 90000)})
            fields = dict(content_type=ctype)
        elif status == 200:
            body, links, outlinks = self._page(i, h, lo)
            ctype = "text/html; charset=utf-8"
            headers.update({"content-type": ctype, "content-length": str(len(body))})
            fields = dict(content_type=ctype, body=body, links=links, outlinks=outlinks,
                          truncated=cut)
        else:
            headers.update({"content-type": "text/html", "content-length": "548"})
            fields = dict(content_type="text/html")
        page = PageRecord(**base, final_url=url, ip=ip, headers=headers,
                          elapsed=self.elapsed[i], **fields)
        return encode_page(page), key

    def _page(self, i: int, h: int, lo: int) -> tuple[bytes, bytes, int]:
        """An HTML body (title, text, the links as anchors) and its pack_links() list."""
        web = self.web
        a, b = self.first[i], self.first[i + 1]
        fh, fl = self.found.get(i, ([], []))
        cache = self.links
        get, miss = cache.hits.get, cache.miss
        targets = self.targets[a:b] + [th << 32 | tl for th, tl in zip(fh, fl, strict=True)]
        # key -> URL, in document order, each target once
        found = dict([get(g) or miss(web, g) for g in targets])
        keys = list(found)
        prefix = web.url(h, 0)
        cut_at = len(prefix) - 1
        hrefs = [u[cut_at:] if u.startswith(prefix) else u for u in found.values()]
        cut = len(keys) - 2 if self.nofollow[i] and len(keys) > 2 else len(keys)
        words = [_WORDS[w] for w in self.words[i]]
        title = " ".join(words[:3])
        anchors = "".join([f'<li><a href="{u}">{_WORDS[k[0] % _NWORDS]}</a></li>'
                           for u, k in zip(hrefs, keys, strict=True)])
        pad = web.shape.pad
        at = (i * 997) % 4096
        filler = f"<p>{self.pad[at:at + pad]}</p>" if pad else ""
        body = (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title>'
                f'</head><body><h1>{title}</h1><p>{" ".join(words[3:])}.</p>{filler}'
                f"<ul>{anchors}</ul></body></html>").encode()
        links = b"".join(keys) + bytes(cut) + bytes([1]) * (len(keys) - cut)
        return body, links, cut


def _pick(table: tuple[tuple[str, int], ...], u: float) -> str:
    total = sum(w for _, w in table)
    acc = 0.0
    for reason, w in table:
        acc += w / total
        if u < acc:
            return reason
    return table[-1][0]


class LinkCache:
    """Link target id (host << 32 | local) -> (url_key, URL), bounded: links repeat
    (home pages, menus), and a hit costs a dict probe instead of a format and an md5."""

    def __init__(self, cap: int = 1 << 18) -> None:
        self.cap = cap
        self.hits: dict[int, tuple[bytes, str]] = {}

    def miss(self, web: Web, target: int) -> tuple[bytes, str]:
        if len(self.hits) >= self.cap:
            self.hits.clear()
        url = web.url(target >> 32, target & 0xFFFFFFFF)
        hit = self.hits[target] = (url_key(url), url)
        return hit


__all__ = ["LinkCache", "Shape", "Web", "Window"]
