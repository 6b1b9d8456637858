"""The shard layout of a crawl: how many shards, where each keeps its state, who owns a host.

Theory of operation
-------------------
A crawl of N shards splits the hosts: host ``h`` belongs to shard
``int.from_bytes(md5(h)[:8], "big") % N``, where ``h`` is the lowercase host
name without the port (:func:`crawler.web.urls.host_key`, the key of BadHosts
and Host2IP). By host, not by registered domain: politeness, robots.txt (per
origin, so per host) and BadHosts are per host, so a single owner keeps each
exact with no coordination; owning registered domains would need the Public
Suffix List (a dependency that changes every week) and would balance worse
(one big site with many subdomains on one shard).

On disk (docs/SHARDS.md):

* ``DIR/shards.json``: ``{"format": 1, "shards": N}``, written atomically when
  the crawl is created; a newer format, or anything but a whole N from 1 to
  config.MAX_SHARDS, is refused (DataDirError naming the file).
* N == 1: ``DIR`` itself is the shard's directory (``main/``, ``pend/``,
  ``badhosts/``, ``urls.log``, ``status.json``): the layout of crawls made
  before shards existed, so such a crawl (``DIR/main/``, no shards.json)
  opens as one shard in place and is given a shards.json.
* N > 1: ``DIR/shard-00`` ... each a whole crawl directory of one shard, plus
  its ``outbox/`` (crawler.state.outbox).

Thread safety: everything here is pure or reads/writes small files once; the
:class:`Router` caches owners in a dict (a race costs a recomputation).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeGuard

from ..config import MAX_PROCESSES, MAX_SHARDS
from ..exceptions import CrawlerError, DataDirError, ShardCountError
from ..web.urls import host_key, host_of_netloc, netloc_of
from .jsonfile import read_json, write_json

PLACEMENT_NAME = "ray.json"  # where a crawl on Ray placed its shards
SHARDS_NAME = "shards.json"
SHARDS_FORMAT = 1
RESHARD_NAME = ".reshard-tmp"  # a reshard's work (crawler.state.reshard): the crawl is refused
_ROUTER_CACHE = 1 << 16  # netlocs remembered by a Router before it starts over


def owner(host: str, count: int) -> int:
    """The shard (0..count-1) that owns ``host`` (as :func:`crawler.web.urls.host_of`
    gives it)."""
    if count == 1:
        return 0
    return int.from_bytes(host_key(host)[:8], "big") % count


def shard_dir(data_dir: str, index: int, count: int) -> str:
    """The directory holding shard ``index``'s state."""
    if count == 1:
        return data_dir
    return os.path.join(data_dir, f"shard-{index:02d}")


def read_count(data_dir: str) -> int | None:
    """The recorded shard count: shards.json's, 1 for a crawl made before shards
    (``main/`` and no shards.json), None if ``data_dir`` holds no crawl yet.

    Raises DataDirError, naming the file and what is wrong with it, when shards.json
    is unreadable or not a shard layout this crawler reads, and while a reshard is half
    done (crawler.state.reshard)."""
    _refuse_half_reshard(data_dir)
    path = os.path.join(data_dir, SHARDS_NAME)
    try:
        info = read_json(path, "a shard layout")
    except FileNotFoundError:
        return 1 if os.path.isdir(os.path.join(data_dir, "main")) else None
    if not isinstance(info, dict):
        raise DataDirError(f"{path}: not a shard layout (a JSON {type(info).__name__})")
    fmt = info.get("format", 0)  # no format: written before formats were
    if not _whole(fmt) or fmt < 0:
        raise DataDirError(f"{path}: bad format {fmt!r}: a shard layout's is a number")
    if fmt > SHARDS_FORMAT:
        raise DataDirError(
            f"{path}: format {fmt} is newer than this crawler reads ({SHARDS_FORMAT})"
        )
    count = info.get("shards")
    if not _whole(count):
        raise DataDirError(f"{path}: not a shard layout (its shard count is {count!r})")
    if not 1 <= count <= MAX_SHARDS:
        raise DataDirError(f"{path}: bad shard count {count}: a crawl has 1 to {MAX_SHARDS}")
    return count


def read_placement(data_dir: str) -> list[str] | None:
    """The Ray node of each shard of a crawl that ran on Ray (``ray.json``, written by
    crawler.run.raydriver), None for a crawl with none. Raises DataDirError, naming the
    file, when it is damaged: it says where each shard's files are, so a damaged one
    is never read as "no placement" (a resume would then start empty shards)."""
    path = os.path.join(data_dir, PLACEMENT_NAME)
    fix = "fix it: it names the Ray node that holds each shard's files"
    try:
        doc = read_json(path, "a Ray placement", fix)
    except FileNotFoundError:
        return None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not (isinstance(nodes, list) and nodes and all(isinstance(n, str) and n for n in nodes)):
        raise DataDirError(f"{path}: not a Ray placement (nodes: {str(nodes)[:80]}): {fix}")
    return nodes


def placement_of(data_dir: str, count: int) -> list[str] | None:
    """``read_placement``, checked to place ``count`` shards (the crawl's count): None
    for a crawl never on Ray; DataDirError, naming the file, for one of another count."""
    nodes = read_placement(data_dir)
    if nodes is not None and len(nodes) != count:
        raise DataDirError(f"{os.path.join(data_dir, PLACEMENT_NAME)}: {len(nodes)} shards "
                           f"placed, not {count}")
    return nodes


def place(count: int, nodes: list[str]) -> list[str]:
    """Shard i -> node address for a new placement: the distinct ``nodes`` in address
    order, round-robin (a new crawl on Ray, a reshard). Raises CrawlerError when there
    is no node."""
    distinct = sorted(set(nodes))
    if not distinct:
        raise CrawlerError("the Ray cluster has no alive node")
    return [distinct[i % len(distinct)] for i in range(count)]


def read_started(data_dir: str, count: int) -> list[bool]:
    """Which shards of a crawl on Ray have run on their node (``ray.json``'s
    ``started``): such a shard's directory must be there on its next start, never
    created empty. All False when ray.json does not say (none, or an older one)."""
    try:
        doc = read_json(os.path.join(data_dir, PLACEMENT_NAME), "a Ray placement",
                        "fix it: it names the Ray node that holds each shard's files")
    except FileNotFoundError:
        return [False] * count
    started = doc.get("started") if isinstance(doc, dict) else None
    if isinstance(started, list) and len(started) == count and all(
            isinstance(x, bool) for x in started):
        return started
    return [False] * count


def write_placement(data_dir: str, nodes: list[str], started: list[bool]) -> None:
    """Record each shard's Ray node in ``ray.json``, and whether it has run there,
    atomically and durably: a reader (or a crash) sees the old placement or the new
    one, never a mix."""
    path = os.path.join(data_dir, PLACEMENT_NAME)
    write_json(path, {"format": 1, "nodes": nodes, "started": started})


def _refuse_half_reshard(data_dir: str) -> None:
    work = os.path.join(data_dir, RESHARD_NAME)
    if not os.path.lexists(work):
        return
    try:
        count = read_json(os.path.join(work, "PLAN.json"), "a reshard plan").get("to", "N")
    except (FileNotFoundError, DataDirError, AttributeError):
        count = "N"
    raise DataDirError(f"{data_dir}: a reshard was interrupted ({work}): run python -m crawler "
                       f"reshard {data_dir} --shards {count} again to finish it")


def write_count(data_dir: str, count: int) -> None:
    """Replace shards.json with ``count`` (atomically, durably): crawler.state.reshard."""
    _write(data_dir, count)


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def default_count() -> int:
    """The shard count of a new crawl when none is asked for: one per CPU, up to the
    processes one machine may run (config.MAX_PROCESSES)."""
    return max(1, min(os.cpu_count() or 1, MAX_PROCESSES))


def crawl_count(data_dir: str) -> int:
    """The shard count of the crawl in ``data_dir``: what every command that reads a
    crawl first asks. Raises DataDirError when ``data_dir`` does not exist or holds no
    crawl (neither shards.json nor ``main/``), or when its shards.json is damaged."""
    if not os.path.isdir(data_dir):
        raise DataDirError(f"{data_dir}: no such crawl directory")
    count = read_count(data_dir)
    if count is None:
        raise DataDirError(
            f"{data_dir}: not a crawl directory (it has neither {SHARDS_NAME} nor main/)"
        )
    return count


def open_layout(data_dir: str, requested: int | None) -> int:
    """The shard count of the crawl in ``data_dir``, created (with shards.json) if
    there is none yet: ``requested`` shards, or :func:`default_count` when None.

    Raises ShardCountError when ``requested`` differs from the recorded count."""
    recorded = read_count(data_dir)
    if recorded is not None:
        if requested is not None and requested != recorded:
            raise ShardCountError(data_dir, recorded, requested)
        if not os.path.exists(os.path.join(data_dir, SHARDS_NAME)):
            _write(data_dir, recorded)  # a crawl from before shards: record what it is
        return recorded
    count = requested if requested is not None else default_count()
    if not 1 <= count <= MAX_SHARDS:
        raise ShardCountError(data_dir, 1, count)
    _write(data_dir, count)
    return count


def _write(data_dir: str, count: int) -> None:
    os.makedirs(data_dir, exist_ok=True)
    write_json(os.path.join(data_dir, SHARDS_NAME), {"format": SHARDS_FORMAT, "shards": count})


def shard_dirs(data_dir: str) -> list[str]:
    """Every shard directory of the crawl in ``data_dir`` (``[data_dir]`` for one shard
    or a directory that holds no crawl yet), in shard order."""
    count = read_count(data_dir) or 1
    return [shard_dir(data_dir, i, count) for i in range(count)]


@dataclass(frozen=True, slots=True)
class ShardPlace:
    """Which shard of how many: what an engine needs to know about the others."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index} of {self.count}")


class Router:
    """Routes URLs to their owner shard. ``owner_of(url)`` takes a *normalized* URL and
    splits only its netloc (cached: a crawl has far fewer hosts than links)."""

    def __init__(self, place: ShardPlace) -> None:
        self.place = place
        self._cache: dict[str, int] = {}

    def owner_of(self, url: str) -> int:
        netloc = netloc_of(url)
        dest = self._cache.get(netloc)
        if dest is None:
            dest = owner(host_of_netloc(netloc), self.place.count)
            if len(self._cache) >= _ROUTER_CACHE:
                self._cache = {}
            self._cache[netloc] = dest
        return dest

    def ours(self, url: str) -> bool:
        return self.owner_of(url) == self.place.index
