"""Grouping the report's bucketed rows (crawler.read.report): per host, per payload digest.

A bucket of a spill holds every row of the hosts (or payloads) whose key
falls in it. One of up to ``MAX_EXACT_ROWS`` rows is loaded, sorted by key
and grouped with numpy: exact sums, exact medians. A bigger one (a host of
millions of pages: all its rows share a bucket) is read chunk by chunk into
a dict of its groups: the sums stay exact, a median is read off a log
histogram of bins 1% wide (within 0.5%).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _spill

HOST = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("rid", "<u8"), ("elapsed", "<f8"),
                 ("size", "<u8"), ("error", "u1"), ("blocked", "u1")])
DUP = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("rid", "<u8"), ("size", "<u8")])


def groups_of(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of equal (hi, lo) in rows sorted by them."""
    if not len(rows):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    change = (rows["hi"][1:] != rows["hi"][:-1]) | (rows["lo"][1:] != rows["lo"][:-1])
    starts = np.concatenate(([0], np.flatnonzero(change) + 1))
    return starts, np.concatenate((starts[1:], [len(rows)]))


HOST_GROUPS = [("pages", "<i8"), ("errors", "<i8"), ("bytes", "<i8"), ("blocked", "<i8"),
                ("median", "<f8"), ("rid", "<i8")]
# A bucket of more host rows than this (one huge host: all its rows share a bucket) is
# grouped chunk by chunk, its medians read off a log histogram (bins 1% wide: +-0.5%).
MAX_EXACT_ROWS = 1 << 21
_T0, _RATIO, _NBINS = 1e-5, 1.01, 2400  # 10 us .. ~230 s; the last bin takes the rest


def exact_hosts(rows: np.ndarray) -> np.ndarray:
    rows = rows[np.lexsort((rows["elapsed"], rows["lo"], rows["hi"]))]  # NaN last
    starts, ends = groups_of(rows)
    timed = np.add.reduceat(~np.isnan(rows["elapsed"]), starts)
    lo_i = starts + np.maximum(timed - 1, 0) // 2
    hi_i = starts + np.maximum(timed, 1) // 2 - (timed == 0)
    g = np.empty(len(starts), dtype=HOST_GROUPS)
    g["median"] = np.where(timed > 0, (rows["elapsed"][lo_i] + rows["elapsed"][hi_i]) / 2,
                           np.nan)
    g["pages"] = ends - starts
    for name, field in (("errors", "error"), ("bytes", "size"), ("blocked", "blocked")):
        g[name] = np.add.reduceat(rows[field].astype(np.int64), starts)
    g["rid"] = rows["rid"][starts]
    return g


def chunked_hosts(spill: _spill.Spill, b: int, chunk: int) -> np.ndarray:
    acc: dict[tuple[int, int], list[Any]] = {}  # host -> [pages, errors, bytes, blocked, rid, bins]
    for part in spill.chunks(b, chunk):
        part = part[np.lexsort((part["lo"], part["hi"]))]
        starts, ends = groups_of(part)
        sums = [ends - starts] + [np.add.reduceat(part[f].astype(np.int64), starts)
                                  for f in ("error", "size", "blocked")]
        group = np.repeat(np.arange(len(starts)), ends - starts)
        e = part["elapsed"]
        timed = ~np.isnan(e)
        bins = np.clip(np.floor(np.log(np.maximum(e[timed], _T0) / _T0) / math.log(_RATIO)),
                       0, _NBINS - 1).astype(np.int64)
        pairs, n = np.unique(group[timed] * _NBINS + bins, return_counts=True)
        per_group: dict[int, list[tuple[int, int]]] = {}
        for pair, k in zip(pairs.tolist(), n.tolist(), strict=True):
            per_group.setdefault(pair // _NBINS, []).append((pair % _NBINS, k))
        for i, s in enumerate(starts.tolist()):
            key = (int(part["hi"][s]), int(part["lo"][s]))
            entry = acc.setdefault(key, [0, 0, 0, 0, int(part["rid"][s]), Counter()])
            for j in range(4):
                entry[j] += int(sums[j][i])
            entry[5].update(dict(per_group.get(i, [])))
    g = np.empty(len(acc), dtype=HOST_GROUPS)
    for i, (pages, errors, size, blocked, rid, hist) in enumerate(acc.values()):
        g[i] = (pages, errors, size, blocked, _hist_median(hist), rid)
    return g


def _hist_median(hist: Counter[int]) -> float:
    """The median (mean of the two middle values for an even count) read off the bins."""
    total = sum(hist.values())
    if not total:
        return math.nan
    lower, upper = (total - 1) // 2, total // 2  # 0-based ranks of the middle values
    seen = 0
    found: list[float] = []
    for b in sorted(hist):
        seen += hist[b]
        while len(found) < 2 and seen > (lower, upper)[len(found)]:
            found.append(_T0 * _RATIO ** (b + 0.5))
        if len(found) == 2:
            break
    return float(sum(found) / 2)


def dup_groups(spill: _spill.Spill, b: int, chunk: int,
                keep: int) -> Iterator[tuple[int, int, list[int]]]:
    """(copies, bytes, the first ``keep`` rids) of each payload of bucket ``b`` seen more
    than once. A bucket past MAX_EXACT_ROWS (one payload served a million times) is
    grouped chunk by chunk into a dict of its distinct payloads."""
    exact = spill.counts[b] <= MAX_EXACT_ROWS
    parts = [spill.load(b)] if exact else spill.chunks(b, chunk)
    acc: dict[tuple[int, int], list[Any]] = {}
    for rows in parts:
        rows = rows[np.lexsort((rows["rid"], rows["lo"], rows["hi"]))]
        starts, ends = groups_of(rows)
        if exact:  # only the payloads seen more than once (the rare case) get an entry
            many = (ends - starts) > 1
            starts, ends = starts[many], ends[many]
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            key = (int(rows["hi"][s]), int(rows["lo"][s]))
            entry = acc.setdefault(key, [0, int(rows["size"][s]), []])
            entry[0] += e - s
            if len(entry[2]) < keep:
                entry[2].extend(rows["rid"][s : min(e, s + keep - len(entry[2]))].tolist())
    for count, size, rids in acc.values():
        if count > 1:
            yield count, size, sorted(rids)
