"""The request log: what the HTTP servers were asked and what they did.

A record is appended when a request's head has been read and updated in
place while the answer goes out. The server updates ``status``, ``bytes``
and ``end`` *before* it hands the bytes to the socket, so a client that has
read an answer always finds it fully logged (no sleeps in tests). Times are
``time.time()`` seconds, the clock the DNS server's log uses too.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO

from .urls import origin


@dataclass(slots=True)
class Request:
    """One request and its answer (mutable while the answer is being sent)."""

    conn: int  # connection id, unique per server process
    scheme: str
    port: int
    host: str  # from the Host header, lowercase, without the port
    target: str  # path plus query, exactly as sent
    method: str
    start: float  # request head fully read
    end: float | None = None  # last byte handed to the socket; None while in flight
    status: int | None = None
    bytes: int = 0  # body bytes handed to the socket
    outcome: str = "pending"  # pending (in flight, or cut by stop()) | ok | reset | aborted
    sni: str | None = None  # TLS server name the client sent
    agent: str = ""  # the User-Agent header ("" when none was sent)
    encoding: str | None = None  # the Content-Encoding of the answer (None: identity)
    # request headers beyond the ones every crawler request has (OWN_HEADERS), as
    # (lowercase name, value) in the order sent: --header lines, Authorization
    other: tuple[tuple[str, str], ...] = ()
    peer: str = ""  # the client's IP (a proxy's, for a request it carried)

    @property
    def url(self) -> str:
        return origin(self.scheme, self.host, self.port) + self.target

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def cookie(self) -> str | None:
        """The Cookie header sent (None: none was)."""
        for name, value in self.other:
            if name == "cookie":
                return value
        return None


# Request headers not kept in Request.other: what the crawler sends with every request.
OWN_HEADERS = frozenset({"host", "user-agent", "accept", "accept-encoding", "connection",
                         "if-none-match", "if-modified-since", "content-length"})


class RequestLog:
    """Thread-safe; appended by the server thread, read by anyone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[Request] = []
        self._conns = 0

    # -- written by the server ---------------------------------------------------

    def next_conn(self) -> int:
        with self._lock:
            self._conns += 1
            return self._conns

    def add(self, record: Request) -> None:
        with self._lock:
            self._records.append(record)

    # -- queries -------------------------------------------------------------------

    def records(
        self,
        *,
        host: str | None = None,
        path: str | None = None,
        status: int | None = None,
        done: bool | None = None,
    ) -> list[Request]:
        """Records in arrival order, filtered; ``done`` selects finished or in-flight ones."""
        with self._lock:
            recs = list(self._records)
        return [
            r
            for r in recs
            if (host is None or r.host == host)
            and (path is None or r.path == path)
            and (status is None or r.status == status)
            and (done is None or (r.end is not None) == done)
        ]

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.records())

    def urls(self, *, include_robots: bool = True) -> set[str]:
        return {r.url for r in self.records() if include_robots or r.path != "/robots.txt"}

    def counts(self) -> Counter[str]:
        """How many times each URL was requested."""
        return Counter(r.url for r in self.records())

    def duplicates(self) -> dict[str, int]:
        """URLs requested more than once, with their counts."""
        return {u: n for u, n in self.counts().items() if n > 1}

    def hosts(self) -> set[str]:
        return {r.host for r in self.records()}

    def connections(self, host: str | None = None) -> set[int]:
        return {r.conn for r in self.records(host=host)}

    def max_concurrency(self, host: str | None = None) -> int:
        """Most requests (of ``host``) in flight at one instant; in-flight ones count to now."""
        events: list[tuple[float, int]] = []
        for r in self.records(host=host):
            events.append((r.start, 1))
            if r.end is not None:
                events.append((r.end, -1))
        events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
        best = cur = 0
        for _, step in events:
            cur += step
            best = max(best, cur)
        return best

    def gaps(self, host: str) -> list[float]:
        """Seconds from the end of each request of ``host`` to the start of the next one."""
        recs = sorted(self.records(host=host), key=lambda r: r.start)
        out = []
        for a, b in zip(recs, recs[1:], strict=False):
            out.append(b.start - (a.end if a.end is not None else a.start))
        return out

    def start_gaps(self, host: str) -> list[float]:
        """Seconds between the starts of consecutive requests of ``host``."""
        starts = sorted(r.start for r in self.records(host=host))
        return [b - a for a, b in zip(starts, starts[1:], strict=False)]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    # -- JSON lines ------------------------------------------------------------------

    def dump(self, dest: str | Path | IO[str]) -> int:
        """Write one JSON object per record; returns the number written."""
        recs = self.records()
        if isinstance(dest, str | Path):
            with open(dest, "w", encoding="utf-8") as fh:
                return self.dump(fh)
        for r in recs:
            dest.write(json.dumps({**asdict(r), "url": r.url}, ensure_ascii=False) + "\n")
        return len(recs)

    @classmethod
    def load(cls, src: str | Path | Iterable[str]) -> RequestLog:
        """A log read back from :meth:`dump` output."""
        if isinstance(src, str | Path):
            with open(src, encoding="utf-8") as fh:
                return cls.load(list(fh))
        log = cls()
        names = {f.name for f in fields(Request)}
        for line in src:
            if line.strip():
                data = json.loads(line)
                data["other"] = tuple(map(tuple, data.get("other", ())))
                log.add(Request(**{k: v for k, v in data.items() if k in names}))
        return log
