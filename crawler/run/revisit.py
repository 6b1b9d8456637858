"""Revisits: the conditional GET of a page a recrawl re-queued, and what a 304 records.

``python -m crawler recrawl`` (crawler.state.recrawl) moves each selected record
to the shard's ``prior/`` store before its URL is pending again. When a worker
fetches such a URL, it sends the record's validators: ``If-None-Match`` with
its ETag and ``If-Modified-Since`` with its Last-Modified (RFC 9110 §13.1; a
server uses If-None-Match when both come). A 304 answer records the earlier
record again: its body, links and fields, with the new fetch time, the
validators the 304 sent, ``revisit = "not_modified"`` and ``revisit_of`` the time
of the fetch whose body it is (kept across several 304s in a row). Its links
are not admitted again: they were when the body was first fetched. Any other
HTTP answer is recorded as usual, replacing the page. The prior record is
forgotten once an HTTP answer came; a failure (a dead host) keeps it, for the
next try. With ``start --revisit-after`` (crawler.state.due) the frontier itself
sets records aside as they come due, keeping them in MainDB meanwhile, and
every outcome forgets the prior record (the new one is the next visit's).

Crash safety: ``prior/`` is advisory. Losing an entry (a kill before its write
reached the disk) costs an unconditional fetch, never a URL: the URL itself is
in PendDB (the recrawl wrote it there first).

Thread safety: any worker (kvstore is thread-safe). Opened only when the
data directory has a ``prior/``: a crawl never recrawled pays nothing.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import fields
from typing import Any

import kvstore

from ..exceptions import CrawlerError
from ..net.answer import FetchResult
from ..state.due import next_interval
from ..state.pages import PageRecord, decode_page
from ..state.retry import PRIOR_NAME

log = logging.getLogger(__name__)

# A validator worth sending back: visible ASCII and spaces, not too long (a header a
# server sent is already bounded; this keeps a damaged record from breaking the request).
_VALIDATOR = re.compile(r"[\x20-\x7e]{1,512}")
_COPIED = tuple(f.name for f in fields(PageRecord)
                if f.name not in ("url", "status", "fetched_at", "depth", "reason",
                                  "revisit_interval"))


class Revisits:
    """The records one shard's recrawl set aside."""

    def __init__(self, data_dir: str, *, create: bool = False) -> None:
        """``create``: open ``prior/`` even if absent (a crawl with --revisit-after
        re-queues pages itself)."""
        path = os.path.join(data_dir, PRIOR_NAME)
        self.store = kvstore.open(path) if create or os.path.isdir(path) else None

    def prior(self, key: bytes) -> PageRecord | None:
        """The record set aside for ``key`` (None: not a revisit, or unreadable)."""
        if self.store is None or key not in self.store:  # no disk: the index answers
            return None
        try:
            return decode_page(self.store[key])
        except (kvstore.exceptions.KVStoreError, CrawlerError, ValueError, TypeError) as exc:
            log.warning("prior record %s unreadable (%s): fetched unconditionally", key.hex(), exc)
            return None

    def conditional(self, key: bytes) -> tuple[PageRecord | None, tuple[tuple[str, str], ...]]:
        """The prior record of ``key`` (None: not a recrawl) and the headers to send."""
        prior = self.prior(key)
        if prior is None:
            return None, ()
        if prior.status != 200:
            return prior, ()  # nothing to validate: a redirect or an error is fetched anew
        sent = []
        for name, header in (("etag", "If-None-Match"), ("last-modified", "If-Modified-Since")):
            value = prior.headers.get(name, "")
            if _VALIDATOR.fullmatch(value):
                sent.append((header, value))
        return prior, tuple(sent)

    @staticmethod
    def not_modified(prior: PageRecord, r: FetchResult) -> dict[str, Any]:
        """A Recorder's fields (run.pagework) for a 304 to a conditional GET: the prior record's."""
        out = {name: getattr(prior, name) for name in _COPIED}
        headers = dict(prior.headers)
        for name in ("etag", "last-modified", "date"):  # what a 304 may update (RFC 9110)
            if name in r.headers:
                headers[name] = r.headers[name]
        # ip stays the earlier fetch's: the body is that fetch's, and the WARC export
        # writes its response record (WARC-IP-Address) from this record.
        out.update(headers=headers, elapsed=round(r.elapsed, 6), revisit="not_modified",
                   cookie=r.cookie,
                   revisit_of=prior.revisit_of or prior.fetched_at)
        return out

    def interval(self, base: float, key: bytes, status: int, reason: str,
                 fields: dict[str, Any], prior: PageRecord | None) -> float:
        """start --revisit-after ``base``: the interval of the record about to be made
        (crawler.state.due's rule). ``prior``: the record a fetch set aside; None for
        an outcome decided without one (a failure, a robots verdict), which is then
        read here and forgotten (the new record is the next visit's prior)."""
        if prior is None:
            prior = self.prior(key)
            self.forget(key)
        if prior is None:
            return next_interval(base, 0.0, None)  # a first visit
        changed = fields.get("revisit") != "not_modified" and (
            prior.status != status or prior.reason != reason
            or prior.body != fields.get("body", b""))
        return next_interval(base, prior.revisit_interval, changed)

    def forget(self, key: bytes) -> None:
        """An HTTP answer came for ``key``: its prior record is no longer needed."""
        if self.store is None:
            return
        try:
            del self.store[key]
        except KeyError:
            pass
        except (OSError, kvstore.exceptions.KVStoreError) as exc:
            log.warning("prior record %s not forgotten: %s", key.hex(), exc)

    def close(self) -> None:
        if self.store is not None:
            try:
                self.store.close()
            except OSError as exc:
                log.warning("prior store: %s", exc)
                self.store.abandon()
