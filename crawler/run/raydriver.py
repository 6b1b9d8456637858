"""The driver of a crawl on Ray: places the shard actors, watches them, sees one crawl.

Theory of operation
-------------------
``start --ray ADDRESS --shards N`` runs :class:`RayDriver` in the process the
user started. It holds ``DIR/supervisor.lock`` like the process supervisor,
connects to the cluster (``auto``, ``HOST:PORT``, or ``local`` for a private
one-machine cluster on 127.0.0.1) and places shard i on a node: the node
recorded for it in ``DIR/ray.json``, or, for a new crawl, the alive nodes
round-robin in address order (recorded at once). A shard's state lives on its
node's local disk, so a shard never moves: each actor is pinned to its node
(NodeAffinitySchedulingStrategy, not soft).

Ray restarts an actor whose worker died (``max_restarts``); its constructor
resumes the crawl from the shard's directory, and the driver sees a new
``token`` in its next report (a new incarnation, logged). A shard on a lost
node *waits*: the other shards keep its links in their durable outboxes, the
status line shows fewer shards up, and once a node with its address is alive
again (and Ray let go of the dead actor) the driver creates it there. Nothing
is moved off a lost node's disk, so nothing is lost; the crawl is not
complete until every shard reported idle.

Completion is decided as by the process supervisor (crawler.run.overview's
``quiescent``: two consecutive answered rounds, every shard idle, same
incarnation and activity). Stop and kill as there: ``stop`` sends ``stop`` to
every actor and waits for their ends; ``kill`` kills them at once. The actors
are owned by this driver, so if it dies Ray kills them too (as safe as a kill
-9), and the next start on the same DIR resumes with new actors.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from hashlib import md5
from typing import Any

from ..config import CrawlerConfig
from ..net.raycluster import alive_nodes, connect, node_id, pinned, shutdown
from ..state.shards import (
    PLACEMENT_NAME,
    place,
    placement_of,
    read_started,
    write_placement,
)
from .overview import Overview, Round, ShardTally, Summary, quiescent
from .rayshard import ShardActor, actor_name
from .supervisor import PROBE_INTERVAL, ROUND_TIMEOUT, take_lock

log = logging.getLogger(__name__)

MAX_RESTARTS = 20  # Ray's restarts of one shard's actor in a run
MAX_CONCURRENCY = 32  # actor methods at once: admits from every sender, reports, controls
WAIT_LOG_EVERY = 30.0  # seconds between "shard K is down" lines
# Seconds a shard that answered may miss rounds before it counts as down: on a loaded
# machine a healthy actor's report can take longer than a round (seen: two busy loops
# beside the suite had shards 0 and 1 logged down with the lost node's shard 2).
SLOW_GRACE = 5.0
STOP_WAIT = 120.0  # seconds a stop waits for every shard's end before killing the rest
PROBE_COST = 0.0025  # seconds of probe interval per shard (see RayDriver.__init__)


@dataclass
class _RayShard(ShardTally):
    node: str = ""  # the node's address this shard lives on
    actor: Any = None
    token: str | None = None
    last: dict[str, Any] | None = None  # this incarnation's latest report, kept while down
    down_since: float | None = None
    logged_down: float | None = None  # when this outage was last logged
    recreated: bool = False  # its actor was created again by the driver (a lost node)
    node_ref: str | None = None  # the Ray node id its actor was last created on
    answered_at: float | None = None  # when the round it last answered began

    def is_down(self, now: float) -> bool:
        """It did not answer (or has no actor): whether to log that now. The first
        failure of a shard that was up is logged at once, then every WAIT_LOG_EVERY;
        one that has not answered yet in this run (its actor is starting) only once it
        has been silent that long."""
        if self.down_since is None:
            self.down_since = now
        if self.token is None and now - self.down_since < WAIT_LOG_EVERY:
            return False
        if self.logged_down is not None and now - self.logged_down < WAIT_LOG_EVERY:
            return False
        self.logged_down = now
        return True

    def is_up(self, now: float) -> None:
        """It answered (the round that began at ``now``): the next outage is logged at
        once."""
        self.down_since = self.logged_down = None
        self.answered_at = now

    def late(self, now: float) -> bool:
        """No answer in the round that began at ``now``, but one within SLOW_GRACE:
        slow (a loaded machine), not down yet; its last report stands."""
        return self.answered_at is not None and now - self.answered_at < SLOW_GRACE

    def new_incarnation(self, token: str) -> bool:
        """A report with ``token``: True when it is not the incarnation seen so far (the
        earlier one's fetches are kept from its final or its last report)."""
        if token == self.token:
            return False
        if self.token is not None:
            if self.report is None:
                self.report = self.last
            self.retire()
        self.token, self.last = token, None
        self.incarnation += 1
        return True


class RayDriver(Overview):
    """Runs the ``count`` shards of the crawl in ``config.data_dir`` as Ray actors."""

    def __init__(
        self,
        config: CrawlerConfig,
        count: int,
        seeds: list[str],
        address: str,
        *,
        log_level: int = logging.INFO,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.count = count
        self.seeds = seeds
        self.address = address
        self.log_level = log_level
        # one report call is ~1.3 ms of this process's CPU: 800 shards are probed every
        # 2 s, not every 0.2 (docs/SCALE.md)
        self.probe_interval = max(probe_interval, count * PROBE_COST)
        self.shards: list[_RayShard] = [_RayShard(i) for i in range(count)]
        crawl = md5(os.path.abspath(self.data_dir).encode()).hexdigest()[:8]
        run = uuid.uuid4().hex[:8]  # a new run never meets the last run's dying actors
        self.names = [actor_name(crawl, run, i) for i in range(count)]
        self._stopping = False
        self._stop_sent = False
        self._finishing = False
        self._error: str | None = None
        self._ran_here: list[bool] = [False] * count  # ray.json's "started", once placed
        self._limit = False
        self._round: Round | None = None
        self._lock_fd = take_lock(self.data_dir)
        self._started = time.monotonic()
        self._last_status = self._last_status_t = self._started
        self._last_fetched = 0
        self._actor_class: Any = None

    # -- controls ------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping = True

    def kill(self) -> None:
        import ray

        for s in self.shards:
            if s.actor is not None:
                try:
                    ray.kill(s.actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass

    # -- placing the actors -------------------------------------------------------------

    def _connect(self) -> None:
        import ray

        connect(self.address)
        self._actor_class = ray.remote(ShardActor)

    def _place(self) -> None:
        """Each shard's node: recorded in ray.json, or chosen and recorded now."""

        nodes = placement_of(self.data_dir, self.count)  # DataDirError: damaged, or not ours
        if nodes is None:
            nodes = place(self.count, [n["NodeManagerAddress"] for n in alive_nodes()])
            write_placement(self.data_dir, nodes, [False] * self.count)
        self._ran_here = read_started(self.data_dir, self.count)
        for s, node in zip(self.shards, nodes, strict=True):
            s.node = node

    def _ran(self, s: _RayShard) -> None:
        """Shard ``s`` answered: recorded in ray.json as having run on its node (once),
        so that a later start never creates it empty there (docs/SHARDS.md)."""
        if self._ran_here[s.index]:
            return
        self._ran_here[s.index] = True
        try:
            write_placement(self.data_dir, [x.node for x in self.shards], self._ran_here)
        except OSError as exc:  # the guard is lost for this run only: the crawl goes on
            log.warning("%s not updated: %s", PLACEMENT_NAME, exc)

    def _create(self, s: _RayShard, now: float) -> None:
        """Create shard ``s``'s actor on its node, if that node is alive."""
        import ray

        node = node_id(s.node)
        if node is None:
            self._log_down(s, now, f"its node {s.node} is not in the cluster")
            return
        if self.names[s.index] in ray.util.list_named_actors():
            return  # the dead one's name is not released yet
        s.node_ref = node
        try:
            s.actor = self._actor_class.options(
                name=self.names[s.index],
                max_restarts=MAX_RESTARTS,
                max_task_retries=0,
                max_concurrency=MAX_CONCURRENCY,
                num_cpus=0,  # a shard is threads waiting on the network; never unschedulable
                scheduling_strategy=pinned(node),
            ).remote(self.config, s.index, self.count, self.names, self.seeds, self.log_level,
                     self._ran_here[s.index])
        except ValueError as exc:  # the name is still taken (Ray has not let go of it)
            self._log_down(s, now, str(exc))
            return
        if s.token is not None:  # it ran in this run: its node was lost and is back
            s.recreated = True
            log.warning("shard %d: its node %s is back: its actor is created there again",
                        s.index, s.node)
        if self._finishing:
            s.actor.finish.remote()

    def _log_down(self, s: _RayShard, now: float, why: str) -> None:
        if s.is_down(now):
            assert s.down_since is not None
            log.warning("shard %d is down for %.0f s (%s); its links wait in the others' "
                        "outboxes", s.index, now - s.down_since, why)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> Summary:
        try:
            self._connect()
            # the crawl's clock starts once the cluster is reached (as a process crawl's
            # starts after the interpreter's start-up): pages/s is the crawl's, not Ray's
            self._started = self._last_status = self._last_status_t = time.monotonic()
            self._place()
            now = time.monotonic()
            for s in self.shards:
                self._create(s, now)
            self._maybe_status(initial=True)
            stop_deadline = None
            while not all(s.exited for s in self.shards):
                round_started = time.monotonic()
                if self._stopping and not self._stop_sent:
                    self._stop_sent = True
                    stop_deadline = round_started + STOP_WAIT
                    for s in self.shards:
                        if s.actor is not None:
                            s.actor.stop.remote()
                        else:
                            s.exited = True
                if stop_deadline is not None and round_started > stop_deadline:
                    log.warning("shards did not stop in %.0f s: killing them", STOP_WAIT)
                    break
                self._probe()
                self._maybe_status()
                time.sleep(max(0.0, self.probe_interval - (time.monotonic() - round_started)))
        finally:
            self.kill()
            os.close(self._lock_fd)
        summary = self._summary()
        shutdown()
        return summary

    def _probe(self) -> None:
        """One round of reports; completion on two consecutive all-answered rounds."""
        import ray

        now = time.monotonic()
        asked = {}
        for s in self.shards:
            if s.exited:
                continue
            if s.actor is None:
                self._create(s, now)
                continue
            asked[s.index] = s.actor.report.remote()
        if not asked:  # every shard is waiting for its node (or has ended)
            self._round = None
            return
        ready, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=ROUND_TIMEOUT)
        done = set(ready)
        answered = 0
        for index, ref in asked.items():
            s = self.shards[index]
            try:
                if ref not in done:
                    if s.late(now):
                        continue  # not counted as answered: no completion this round
                    raise TimeoutError("no answer in time")
                got = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - restarting, dead, or unreachable
                s.report = None  # not up; its last report is kept in s.last
                self._log_down(s, now, type(exc).__name__)
                if self._gone(s):
                    s.actor = None  # created again once its node is there
                    if self._crashed_for_good(s):
                        continue
                    log.warning("shard %d: Ray let go of its actor (its node %s was "
                                "lost); it is created again on that node", s.index, s.node)
                continue
            s.is_up(now)
            self._take(s, got)
            answered += 1
        if answered == len(self.shards) and not any(s.exited for s in self.shards):
            self._evaluate()
        else:
            self._round = None

    def _crashed_for_good(self, s: _RayShard) -> bool:
        """Ray let go of ``s``'s actor while the node it ran on is still alive: not a lost
        node but an actor that failed in its constructor or used up its restarts (a bug
        or a broken directory that would fail again). The crawl stops, saying so, rather
        than create it again and again."""
        try:
            alive = {n["NodeID"] for n in alive_nodes()}
        except Exception:  # noqa: BLE001 - the cluster itself is unreachable: not a verdict
            return False
        if s.node_ref is None or s.node_ref not in alive:
            return False
        s.exited = True
        self._fail(f"shard {s.index}: its actor failed for good on its node {s.node}, "
                   f"which is alive (an error in its start, or more than {MAX_RESTARTS} "
                   "crashes: see the log above)")
        return True

    def _gone(self, s: _RayShard) -> bool:
        """Whether Ray gave up on ``s``'s actor (no restart left, or its node lost)."""
        import ray

        try:
            return self.names[s.index] not in ray.util.list_named_actors()
        except Exception:  # noqa: BLE001 - the cluster itself is unreachable: wait
            return False

    def _take(self, s: _RayShard, got: dict[str, Any]) -> None:
        if got["error"] is None:  # its constructor opened (or made) the shard's directory
            self._ran(s)
        if s.new_incarnation(got["token"]):
            if s.recreated:
                s.recreated = False
                log.warning("shard %d resumed on its node %s (now pid %d)", s.index, s.node,
                            got["pid"])
            elif s.incarnation > 1:
                log.warning("shard %d was restarted by Ray (now pid %d)", s.index, got["pid"])
            if s.incarnation > 1 and s.actor is not None:  # restarted: it joins what is on
                if self._stop_sent:
                    s.actor.stop.remote()
                elif self._finishing:
                    s.actor.finish.remote()
        if got["final"] is not None:
            s.final = got["final"]
            s.exited = True
            s.retire()
            if s.final.get("error"):
                self._fail(f"shard {s.index}: {s.final['error']}")
            elif s.final.get("limit"):
                self._reached_limit(s)
            return
        if got["error"]:
            s.exited = True
            self._fail(f"shard {s.index}: {got['error']}")
            return
        s.report = got["report"]
        if s.report is not None:
            s.last = s.report
            s.report["pid"] = got["pid"]
            if s.report.get("limit"):
                self._reached_limit(s)

    def _reached_limit(self, s: _RayShard) -> None:
        if not self._limit:
            self._limit = True
            log.info("shard %d used its share of --max-pages: stopping", s.index)
            self._stopping = True

    def _fail(self, error: str) -> None:
        if self._error is None:
            self._error = error
            log.error("%s", error)
        self._stopping = True

    def _evaluate(self) -> None:
        if self._finishing or self._stopping:
            return
        this = [
            (s.incarnation, int(s.report["activity"]), bool(s.report["idle"]))
            for s in self.shards
            if s.report is not None
        ]
        if len(this) == len(self.shards) and quiescent(self._round, this):
            self._finishing = True
            log.debug("every shard idle twice in a row with nothing between: finishing")
            for s in self.shards:
                if s.actor is not None:
                    s.actor.finish.remote()
        self._round = this
