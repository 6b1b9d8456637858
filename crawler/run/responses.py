"""What a fetched answer becomes: its page record's fields and the links worth admitting.

The engine (crawler.run.engine) decides what an answer means for its host and
for the URL's retries (429 and 5xx, backoff, Retry-After); what the answer
becomes is read here. That reading is a job of its own: link extraction, the
robots meta tags and X-Robots-Tag, whether the body is kept, and the scope
check of each link. It does no I/O and holds no lock; each worker reads its
own response, so it is thread-safe.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, NamedTuple

from .. import outcomes
from ..config import CrawlerConfig, Scope, stores_type
from ..exceptions import URLError
from ..net.answer import FetchResult, content_type
from ..state.pages import Pending, decode_page, encode_page, pack_links
from ..web.links import Reserve, extract, is_html, robots_directives
from ..web.urls import host_of, normalize, url_key

log = logging.getLogger(__name__)


class Reading(NamedTuple):
    """A read answer: the record's reason and other fields, the links to admit."""

    reason: str
    fields: dict[str, Any]  # PageRecord fields, keyword arguments of a Recorder (pagework)
    links: list[tuple[bytes, Pending]]  # (url_key, entry)


class ResponseReader:
    """Reads answers for one crawl's settings (``agent``: the user agent's product token)."""

    __slots__ = ("config", "scope", "_agent", "_meta_names", "not_reread")

    def __init__(self, config: CrawlerConfig, scope: Scope, agent: str) -> None:
        self.config = config
        self.scope = scope
        self.not_reread = 0  # pages ``expand`` could not read links from (no body kept)
        self._agent = (agent,)
        self._meta_names = ("robots", *self._agent)

    def read(self, e: Pending, r: FetchResult, dom: bytes = b"",
             reserve: Reserve | None = None) -> Reading:
        """An answer that is neither a 429 nor a 5xx, fetched for ``e``; ``dom``: the
        page rendered in the browser, whose links and robots meta tags count too.
        ``reserve(n)``: called before link extraction holds ``n`` more bytes (the
        engine's memory budget; it may wait)."""
        cfg = self.config
        status = r.status
        links: list[tuple[bytes, Pending]] = []
        reason = ""
        noindex = False
        outlinks = 0
        keep = False  # a non-HTML body kept all the same
        graph = b""  # the page's links, kept in its record (the link graph)
        if 300 <= status < 400 and r.redirect:
            if e.hops + 1 > cfg.max_redirects:
                reason = outcomes.REDIRECT_LIMIT
            else:
                links = self.admissible([r.redirect], e.depth, e.hops + 1, normalized=False)
        elif status == 200:
            ctype = r.headers.get("content-type")
            if is_html(ctype, r.body[:512]):
                page = extract(
                    r.body,
                    r.url,
                    content_type=ctype,
                    max_url_length=cfg.max_url_length,
                    follow_rel_nofollow=not cfg.obey_robots,
                    robots_meta_names=self._meta_names,
                    reserve=reserve,
                )
                follow, dont = list(page.links), list(page.nofollow_links)
                page_noindex, page_nofollow = page.noindex, page.nofollow
                if dom:  # the server's links first, then the ones only scripts made
                    shown = extract(
                        dom,
                        r.url,
                        content_type="text/html; charset=utf-8",
                        max_url_length=cfg.max_url_length,
                        follow_rel_nofollow=not cfg.obey_robots,
                        robots_meta_names=self._meta_names,
                        reserve=reserve,
                    )
                    known = set(follow) | set(dont)
                    follow += [u for u in shown.links if u not in known]
                    dont += [u for u in shown.nofollow_links if u not in known]
                    page_noindex = page_noindex or shown.noindex
                    page_nofollow = page_nofollow or shown.nofollow
                outlinks = len(follow)
                tag_nofollow, tag_noindex = robots_directives(
                    r.headers.get("x-robots-tag", ""), self._agent
                )
                noindex = (page_noindex or tag_noindex) and cfg.obey_robots
                nofollow = (page_nofollow or tag_nofollow) and cfg.obey_robots
                keys = [url_key(u) for u in follow]  # once: for the graph and for admission
                graph = pack_links(follow, dont, page_nofollow=nofollow, follow_keys=keys)
                if not nofollow and (cfg.max_depth is None or e.depth + 1 <= cfg.max_depth):
                    links = self.admissible(follow, e.depth + 1, 0, keys=keys)
            else:
                reason = outcomes.NOT_HTML
                if cfg.store_types and stores_type(cfg.store_types, content_type(r)[0]):
                    _, noindex = robots_directives(r.headers.get("x-robots-tag", ""), self._agent)
                    noindex = noindex and cfg.obey_robots
                    keep = not noindex  # an archiving crawl keeps this body (--store-types)
        fields = self.fields(
            r, reason, outlinks=outlinks, noindex=noindex, links=graph, keep_type=keep
        )
        return Reading(reason, fields, links)

    def expand(self, record: bytes, e: Pending) -> tuple[bytes, list[tuple[bytes, Pending]]]:
        """The frontier's ``expand`` (crawler.state.depths): ``reread``, counting the
        pages stored without the body their links would come from. The committer's."""
        again, links, complete = self.reread(record, e)
        if not complete:
            self.not_reread += 1
            log.info("%s: reached at depth %d, but stored without its body: links not "
                     "followed again", e.url, e.depth)
        return again, links

    def reread(self, record: bytes, e: Pending) -> tuple[bytes, list[tuple[bytes, Pending]], bool]:
        """A stored page record read again as if fetched for ``e`` (a shorter path to
        it turned up, crawler.state.depths): (the record at ``e``'s depth, the links
        worth admitting from its stored body, DOM or redirect, whether they are all
        its links). A page stored without its body (noindex) gives no links: False.
        Raises CrawlerError for a damaged record."""
        page = replace(decode_page(record), depth=e.depth)
        again = encode_page(page)
        if page.reason or not (page.status == 200 or 300 <= page.status < 400):
            return again, [], True
        if page.status == 200 and not page.body:
            return again, [], not page.links  # noindex: its links are known by key only
        r = FetchResult(
            page.final_url or page.url, page.status, page.headers, page.body, page.ip,
            page.fetched_at, 0.0, 0, truncated=bool(page.truncated),
            truncate_reason=page.truncated or None,
            redirect=page.redirect or None,
        )
        return again, self.read(e, r, page.dom).links, True

    @staticmethod
    def fields(
        r: FetchResult, reason: str, *, outlinks: int = 0, noindex: bool = False,
        links: bytes = b"", keep_type: bool = False,
    ) -> dict[str, Any]:
        """The page record's fields of an answer, besides url, status, depth and reason."""
        keep_body = r.status == 200 and (not reason or keep_type) and not noindex
        return {
            "final_url": r.url,
            "ip": r.ip,
            "headers": dict(r.headers),
            "content_type": r.headers.get("content-type", ""),
            "redirect": r.redirect or "",
            "outlinks": outlinks,
            "truncated": r.truncate_reason or "",
            "noindex": noindex,
            "elapsed": round(r.elapsed, 6),
            "protocol": r.protocol,
            "cookie": r.cookie,
            "links": links,
            "body": r.body if keep_body else b"",
        }

    def admissible(
        self, urls: list[str], depth: int, hops: int, *, normalized: bool = True,
        keys: list[bytes] | None = None,
    ) -> list[tuple[bytes, Pending]]:
        """The links worth submitting, keyed. ``extract()`` already returns
        normalized URLs; a redirect's Location is normalized here. ``keys``: the
        url_key of each of ``urls`` (normalized ones), if the caller made them."""
        if normalized and self.scope.everything:
            # tuple.__new__ skips the NamedTuple's Python-level __new__: a fifth of the
            # per-link cost here, on every link of every page (most are dropped as known)
            new = tuple.__new__
            if keys is None:
                keys = [url_key(u) for u in urls]
            return [(k, new(Pending, (u, depth, hops, 0))) for k, u in zip(keys, urls, strict=True)]
        out = []
        for j, u in enumerate(urls):
            try:
                if not normalized:
                    u = normalize(u, max_length=self.config.max_url_length)
                host = host_of(u)
            except URLError:
                continue
            if self.scope.allows(u, host):
                key = keys[j] if keys is not None and normalized else url_key(u)
                out.append((key, Pending(u, depth, hops)))
        return out
