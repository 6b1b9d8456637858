"""A resume's one line about failures recorded before that a changed option addresses.

A recorded outcome is final: a resume never fetches a recorded URL again. So a
resume that adds, say, ``--allow-private-ips`` after the seeds were refused as
private does nothing for them, and says so, naming the ``retry`` command that
re-queues them (docs/RETRY.md).
"""

from __future__ import annotations

import os
import shlex
import sys

from .. import outcomes
from ..exceptions import CrawlerError
from ..run.hints import lifted_by, selection
from ..state.jsonfile import read_json
from ..state.shards import shard_dirs
from ._common import say

# What each shard's committer counts its records in, by outcome key (crawler.state.tally).
_COUNTS_NAME = "counts.json"


def _recorded_outcomes(data_dir: str) -> dict[str, int] | None:
    """The crawl's records by outcome key over every run, from each shard's counters
    file, read as plain JSON (start loads no kvstore, and retry rewrites the file); None
    when a shard has none or it cannot be read (a crawl from before the counters)."""
    total: dict[str, int] = {}
    for shard in shard_dirs(data_dir):
        try:
            counts = read_json(os.path.join(shard, _COUNTS_NAME), "a counters file")
        except (OSError, CrawlerError):
            return None
        outcomes = counts.get("outcomes") if isinstance(counts, dict) else None
        if not isinstance(outcomes, dict):
            return None
        for key, n in outcomes.items():
            if isinstance(n, int):
                total[key] = total.get(key, 0) + n
    return total


def say_still_recorded(data_dir: str, changes: list[str]) -> None:
    """A resume that changed an option which addresses failures recorded before (adds
    --allow-private-ips after private_ip refusals, a --ca-bundle after tls...) does not
    fetch those again: a recorded outcome is final. Say so in one line, with the retry
    command that re-queues them (docs/RETRY.md)."""
    changed = list(dict.fromkeys(change.split(" ", 1)[0] for change in changes))
    reasons = [(flag, r) for flag in changed for r in lifted_by(flag)]
    if not reasons:
        return
    recorded = _recorded_outcomes(data_dir)
    if recorded is None:  # no counters: name the command all the same
        found = {r: 0 for _, r in reasons}
    else:
        found = {r: n for _, r in reasons
                 if (n := recorded.get(r, 0) + recorded.get(outcomes.bad_host(r), 0))}
    if not found:
        return
    flags = ", ".join(dict.fromkeys(flag for flag, r in reasons if r in found))
    total = sum(found.values())
    urls = f" ({total} URL{'s' if total != 1 else ''})" if recorded is not None else ""
    retry = f"python -m crawler retry {shlex.quote(data_dir)} {selection(list(found))}"
    say(f"crawler: {flags} changed, but the URLs recorded before as {', '.join(found)}"
        f"{urls} stay as recorded: a resume never fetches a recorded URL again; to fetch "
        f"them with the new setting, stop the crawl, run `{retry}` and resume", sys.stderr)
