"""The leader's side of replication: each follower's progress, the high watermark, the ISR, and acks=all.

Kafka's ReplicaManager and Partition, for the partitions this broker leads (the follower's side is
replica_fetcher.py). Everything here runs on the event loop, except the ZooKeeper writes of ISR changes, which run
on a worker thread (kazoo's calls block).

- Roles come from the metadata cache (cluster_metadata.py): after every new view `apply_view` makes this broker
  lead what the view says it leads (stamping the leader epoch into the batches it appends), hands the partitions it
  follows to the fetchers, and forgets the rest. A leader starts with its followers' log end offsets unknown and
  their last caught-up time now (Kafka's makeLeader): its high watermark does not move until every ISR member has
  fetched.
- A follower's Fetch (`replica_id` set) tells the leader the follower's log end offset: its fetch offset
  (`record_follower_fetch`). A follower is caught up while its log end equals the leader's, and its last caught-up
  time is when that last held (or when it fetched at or beyond the leader's end of its previous fetch: Kafka's
  lastCaughtUpTimeMs).
- High watermark = the smallest log end offset among the leader and the ISR followers; it only moves up. When it
  moves, acks=all produces waiting below it are answered and long-polling consumers woken.
- ISR shrink: every replica.lag.time.max.ms / 2, a follower in the ISR not caught up for replica.lag.time.max.ms
  leaves it. ISR expand: a follower outside the ISR whose log end reached the high watermark and this leader
  epoch's start offset joins it - unless a reassignment is removing it (Kafka's leader sees the target replica set
  only and cannot add it back). Either change is written by the leader into the partition's state znode, as a
  Kafka leader did in ZooKeeper mode: read it, check that it still names this broker and this leader epoch, and
  set it with that znode version (a conditional write: a controller write in between makes it fail, and the next
  view decides). The leader uses a new ISR only once it is written.
- A RocketMQ master/slave group (rocketmq_groups.py, `commitlog_replication`) copies the whole CommitLog itself:
  its partitions are neither fetched by followers nor shrunk or grown here (the group's master keeps the ISR, the
  SyncStateSet); the leader's high watermark is its log end, acks=all checks min.insync.replicas against the
  state's ISR, and a SYNC_MASTER's acks=all waits for a slave (`CommitLogReplication`).
- acks=all (`wait_replicated`): answered when the high watermark passes the batch; NOT_ENOUGH_REPLICAS before the
  append when the ISR is smaller than min.insync.replicas, NOT_ENOUGH_REPLICAS_AFTER_APPEND when it shrank below it
  by the time the batch was replicated, REQUEST_TIMED_OUT after the request's timeout, NOT_LEADER_OR_FOLLOWER when
  leadership moved meanwhile (the producer retries at the new leader; an idempotent one without duplicates).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NoNodeError

from tidelog.broker import zk_layout as zk
from tidelog.broker.cluster_metadata import ClusterView, MetadataCache, PartitionView, Role
from tidelog.config import LogConfig
from tidelog.errors import (
    ConfigError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.api import Partition, StorageEngine

if TYPE_CHECKING:
    from tidelog.broker.fetch import AppendNotifier
    from tidelog.broker.replica_fetcher import ReplicaFetchers
    from tidelog.broker.rocketmq_groups import CommitLogReplication

log = logging.getLogger("tidelog.replication")

PartitionKey = tuple[str, int]
UNKNOWN_OFFSET = -1


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class FollowerState:
    log_end_offset: int = UNKNOWN_OFFSET  # unknown until its first fetch
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = UNKNOWN_OFFSET


@dataclass(slots=True)
class _Waiter:
    required_offset: int  # answered once the high watermark reaches it
    future: asyncio.Future[None]


@dataclass(slots=True)
class LeaderState:
    """A partition this broker leads, in one leader epoch."""

    handle: Partition
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    state_version: int  # the state znode's version this ISR was read or written with
    epoch_start_offset: int  # the leader's log end when it came to lead in this epoch
    min_insync_replicas: int
    removing: tuple[int, ...]  # replicas a reassignment removes: they do not join the ISR again
    followers: dict[int, FollowerState] = field(default_factory=dict)
    isr_change_pending: bool = False
    waiters: list[_Waiter] = field(default_factory=list)


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        engine: StorageEngine,
        metadata: MetadataCache,
        zk_client: KazooClient,
        fetchers: ReplicaFetchers,
        notifier: AppendNotifier,
        log_defaults: LogConfig,
        replica_lag_time_max_ms: int,
        clock: Callable[[], int] = now_ms,
        commitlog_replication: CommitLogReplication | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.commitlog_replication = commitlog_replication  # a RocketMQ group's: the HA service copies everything
        self.engine = engine
        self.metadata = metadata
        self.zk_client = zk_client
        self.fetchers = fetchers
        self.notifier = notifier
        self.log_defaults = log_defaults
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.clock = clock
        self.leaders: dict[PartitionKey, LeaderState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._isr_task: asyncio.Task[None] | None = None
        self._closed = False
        self._view_pending = False

    # --- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """On the loop: follow the metadata cache's views from now on, and start the ISR check."""
        self._loop = asyncio.get_running_loop()
        self.metadata.add_listener(self._view_changed)
        self._isr_task = asyncio.create_task(self._check_isr_periodically(), name="tidelog-isr-check")
        self.apply_view()

    async def close(self) -> None:
        self._closed = True
        if self._isr_task is not None:
            self._isr_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._isr_task
        for key in list(self.leaders):
            self._resign(key, "the broker is stopping")

    def _view_changed(self) -> None:
        """A metadata listener (a kazoo or admin thread): apply the new view on the loop, once per burst."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._closed or self._view_pending:
            return
        self._view_pending = True
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self.apply_view)

    # --- roles ------------------------------------------------------------------------------------------------

    def apply_view(self) -> None:
        """Make this broker lead and follow what the current view says (see the module docstring)."""
        self._view_pending = False
        if self._closed:
            return
        view = self.metadata.view
        follow: dict[PartitionKey, tuple[int, int]] = {}
        for key, replica in view.local.items():
            partition = view.partition(*key)
            if partition is None or partition.state is None:
                continue
            if self.commitlog_replication is not None and partition.state is not None:
                if replica.role is not Role.LEADER:
                    self._resign(key, f"broker {replica.leader} is its group's master")
                    continue  # the group's HA connection copies it, no fetcher
                alone = replace(partition.state, isr=(self.broker_id,))
                partition = replace(partition, replicas=(self.broker_id,), state=alone)
            if replica.role is Role.LEADER:
                self._lead(view, key, replica.leader_epoch, partition)
            else:
                if key in self.leaders:
                    self._resign(key, f"broker {replica.leader} leads it now (leader epoch {replica.leader_epoch})")
                if replica.leader != zk.NO_LEADER:
                    follow[key] = (replica.leader, replica.leader_epoch)
        for key in [key for key in self.leaders if key not in view.local]:
            self._resign(key, "this broker no longer holds a replica of it")
        self.fetchers.follow_only(follow)

    def _lead(self, view: ClusterView, key: PartitionKey, leader_epoch: int, partition: PartitionView) -> None:
        replicas, isr, state_version = partition.replicas, partition.isr, partition.state_version
        state = self.leaders.get(key)
        min_insync = self._min_insync_replicas(view, key[0])
        if state is not None and state.leader_epoch == leader_epoch:
            if state.replicas != replicas:  # a reassignment added followers, or completed and dropped some
                state.followers = _followers(self.broker_id, replicas, isr, state.followers, self.clock())
            state.replicas = replicas
            state.removing = partition.removing
            state.min_insync_replicas = min_insync
            if state_version > state.state_version:  # the controller changed the ISR (a broker died)
                state.isr, state.state_version = isr, state_version
                self._maybe_advance_high_watermark(key, state)
                self._check_waiters(state)
            return
        try:
            handle = self.engine.partition(*key)
        except UnknownTopicOrPartitionError:
            return  # its replica is not created yet: the cache calls again once it is
        handle.leader_epoch = leader_epoch  # stamped into every batch appended from now on
        previous = state.followers if state is not None else {}
        followers = _followers(self.broker_id, replicas, isr, previous, self.clock())
        new_state = LeaderState(
            handle,
            leader_epoch,
            replicas,
            isr,
            state_version,
            handle.log_end_offset,
            min_insync,
            partition.removing,
            followers,
            waiters=state.waiters if state is not None else [],
        )
        self.leaders[key] = new_state
        log.info(
            "%s-%d: leading in leader epoch %d from offset %d, ISR %s, high watermark %d",
            *key,
            leader_epoch,
            handle.log_end_offset,
            list(isr),
            handle.high_watermark,
        )
        self._maybe_advance_high_watermark(key, new_state)

    def _resign(self, key: PartitionKey, reason: str) -> None:
        state = self.leaders.pop(key, None)
        if state is None:
            return
        log.info("%s-%d: no longer leading: %s", *key, reason)
        for waiter in state.waiters:
            if not waiter.future.done():
                waiter.future.set_exception(NotLeaderOrFollowerError(f"{key[0]}-{key[1]}: {reason}"))
        state.waiters.clear()

    def _min_insync_replicas(self, view: ClusterView, topic: str) -> int:
        topic_view = view.topics.get(topic)
        overrides = topic_view.configs if topic_view is not None else {}
        try:
            return self.log_defaults.with_overrides(
                {k: v for k, v in overrides.items() if k == "min.insync.replicas"}
            ).min_insync_replicas
        except ConfigError:
            return self.log_defaults.min_insync_replicas

    # --- followers' fetches -----------------------------------------------------------------------------------

    def record_follower_fetch(self, topic: str, partition: int, replica_id: int, fetch_offset: int) -> None:
        """A follower fetched from `fetch_offset`: that is its log end. Raises NotLeaderOrFollowerError when this
        broker does not lead the partition or `replica_id` is not one of its replicas."""
        key = (topic, partition)
        state = self.leaders.get(key)
        if state is None:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} does not lead {topic}-{partition}")
        follower = state.followers.get(replica_id)
        if follower is None:
            raise NotLeaderOrFollowerError(f"broker {replica_id} is not a replica of {topic}-{partition}")
        now = self.clock()
        leader_end = state.handle.log_end_offset
        if fetch_offset >= leader_end:
            follower.last_caught_up_ms = now
        elif follower.leader_end_at_last_fetch != UNKNOWN_OFFSET and fetch_offset >= follower.leader_end_at_last_fetch:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_ms)
        follower.log_end_offset = fetch_offset
        follower.last_fetch_ms = now
        follower.leader_end_at_last_fetch = leader_end
        if replica_id not in state.isr:
            self._maybe_expand_isr(key, state, replica_id, follower)
        self._maybe_advance_high_watermark(key, state)

    # --- the high watermark -----------------------------------------------------------------------------------

    def after_leader_append(self, topic: str, partition: int) -> None:
        """The leader appended: with no other ISR member the high watermark moves at once."""
        key = (topic, partition)
        state = self.leaders.get(key)
        if state is not None:
            self._maybe_advance_high_watermark(key, state)

    def _maybe_advance_high_watermark(self, key: PartitionKey, state: LeaderState) -> None:
        handle = state.handle
        new_high_watermark = handle.log_end_offset
        for replica in state.isr:
            if replica == self.broker_id:
                continue
            follower = state.followers.get(replica)
            if follower is None or follower.log_end_offset == UNKNOWN_OFFSET:
                return  # an ISR member that has not fetched since this broker came to lead
            new_high_watermark = min(new_high_watermark, follower.log_end_offset)
        if new_high_watermark <= handle.high_watermark:
            return
        handle.set_high_watermark(new_high_watermark)
        self._check_waiters(state)
        self.notifier.notify_consumers(key)

    # --- acks=all ---------------------------------------------------------------------------------------------

    def check_enough_replicas(self, topic: str, partition: int) -> None:
        """Before an acks=all append: NOT_ENOUGH_REPLICAS when the ISR is smaller than min.insync.replicas."""
        state = self.leaders.get((topic, partition))
        if state is None:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} does not lead {topic}-{partition}")
        if self.commitlog_replication is not None:
            partition_view = self.metadata.view.partition(topic, partition)
            isr = partition_view.isr if partition_view is not None else ()
            if len(isr) < state.min_insync_replicas:
                raise NotEnoughReplicasError(
                    f"{topic}-{partition} has {len(isr)} brokers in its group's SyncStateSet {list(isr)}, "
                    f"min.insync.replicas is {state.min_insync_replicas}"
                )
            self.commitlog_replication.check_before_append(topic, partition)
            return
        if len(state.isr) < state.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{topic}-{partition} has {len(state.isr)} in-sync replicas {list(state.isr)}, "
                f"min.insync.replicas is {state.min_insync_replicas}"
            )

    async def wait_replicated(self, topic: str, partition: int, end_offset: int, timeout_s: float) -> None:
        """Wait until every ISR member has the records below `end_offset` (see the module docstring)."""
        state = self.leaders.get((topic, partition))
        if state is None:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} no longer leads {topic}-{partition}")
        if self.commitlog_replication is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await self.commitlog_replication.wait_replicated(topic, partition, end_offset)
            except TimeoutError:
                raise RequestTimedOutError(
                    f"{topic}-{partition}: no slave reported offsets below {end_offset} within "
                    f"{timeout_s * 1000:.0f} ms"
                ) from None
            return
        if state.handle.high_watermark >= end_offset:
            self._raise_if_too_few(topic, partition, state)
            return
        waiter = _Waiter(end_offset, asyncio.get_running_loop().create_future())
        state.waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):  # woken by the future itself (no shield or wait_for hops)
                await waiter.future
        except TimeoutError:
            raise RequestTimedOutError(
                f"{topic}-{partition}: offsets below {end_offset} not replicated to the ISR {list(state.isr)} within "
                f"{timeout_s * 1000:.0f} ms (high watermark {state.handle.high_watermark})"
            ) from None
        finally:
            with contextlib.suppress(ValueError):
                state.waiters.remove(waiter)

    def _check_waiters(self, state: LeaderState) -> None:
        high_watermark = state.handle.high_watermark
        remaining = []
        for waiter in state.waiters:
            if waiter.future.done():
                continue
            if waiter.required_offset > high_watermark:
                remaining.append(waiter)
                continue
            if len(state.isr) < state.min_insync_replicas:
                waiter.future.set_exception(
                    NotEnoughReplicasAfterAppendError(
                        f"{state.handle.name}: the ISR {list(state.isr)} shrank below min.insync.replicas "
                        f"({state.min_insync_replicas}) before the records were replicated"
                    )
                )
            else:
                waiter.future.set_result(None)
        state.waiters[:] = remaining

    def _raise_if_too_few(self, topic: str, partition: int, state: LeaderState) -> None:
        if len(state.isr) < state.min_insync_replicas:
            raise NotEnoughReplicasAfterAppendError(
                f"{topic}-{partition}: the ISR {list(state.isr)} is below min.insync.replicas "
                f"({state.min_insync_replicas})"
            )

    # --- the ISR ----------------------------------------------------------------------------------------------

    def _maybe_expand_isr(
        self, key: PartitionKey, state: LeaderState, replica_id: int, follower: FollowerState
    ) -> None:
        if state.isr_change_pending or replica_id in state.removing:
            return
        caught_up = (
            follower.log_end_offset >= state.handle.high_watermark
            and follower.log_end_offset >= state.epoch_start_offset
        )
        if caught_up:
            self._change_isr(key, state, add=(replica_id,), remove=())

    async def _check_isr_periodically(self) -> None:
        interval = max(self.replica_lag_time_max_ms / 2, 10) / 1000
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                self.shrink_isrs()
            except Exception:
                log.exception("the ISR check failed")

    def shrink_isrs(self) -> None:
        """Take out of each ISR the followers that have not caught up for replica.lag.time.max.ms."""
        now = self.clock()
        for key, state in list(self.leaders.items()):
            if state.isr_change_pending:
                continue
            leader_end = state.handle.log_end_offset
            lagging = []
            for replica in state.isr:
                follower = state.followers.get(replica)
                if replica == self.broker_id or follower is None:
                    continue
                caught_up = follower.log_end_offset == leader_end or now - follower.last_caught_up_ms <= (
                    self.replica_lag_time_max_ms
                )
                if not caught_up:
                    lagging.append(replica)
            if lagging:
                for replica in lagging:
                    follower = state.followers[replica]
                    log.info(
                        "%s-%d: follower %d is out of sync (log end %d, leader's %d, last caught up %d ms ago)",
                        *key,
                        replica,
                        follower.log_end_offset,
                        leader_end,
                        now - follower.last_caught_up_ms,
                    )
                self._change_isr(key, state, add=(), remove=tuple(lagging))

    def _change_isr(
        self, key: PartitionKey, state: LeaderState, *, add: tuple[int, ...], remove: tuple[int, ...]
    ) -> None:
        state.isr_change_pending = True
        task = asyncio.create_task(self._write_isr(key, state, add, remove), name=f"tidelog-isr-{key[0]}-{key[1]}")
        task.add_done_callback(_log_task_failure)

    async def _write_isr(
        self, key: PartitionKey, state: LeaderState, add: tuple[int, ...], remove: tuple[int, ...]
    ) -> None:
        try:
            written = await asyncio.to_thread(self._write_isr_znode, key, state.leader_epoch, add, remove)
        except (KazooException, TidelogError) as exc:
            log.warning("%s-%d: cannot write the ISR change (%s); the next check tries again", *key, exc)
            written = None
        finally:
            state.isr_change_pending = False
        if written is None or self.leaders.get(key) is not state:
            return
        new_state, version = written
        if version <= state.state_version:
            return
        log.info("%s-%d: ISR %s -> %s", *key, list(state.isr), list(new_state.isr))
        state.isr, state.state_version = new_state.isr, version
        self._maybe_advance_high_watermark(key, state)
        self._check_waiters(state)

    def _write_isr_znode(
        self, key: PartitionKey, leader_epoch: int, add: tuple[int, ...], remove: tuple[int, ...]
    ) -> tuple[zk.PartitionState, int] | None:
        """On a worker thread: the conditional write of the state znode; None if the state no longer names this
        broker as leader in `leader_epoch` (a controller moved it: the next view says what to do)."""
        path = zk.partition_state_path(*key)
        try:
            data, stat = self.zk_client.get(path)
        except NoNodeError:
            return None
        current = zk.PartitionState.decode(key[0], key[1], data)
        if current.leader != self.broker_id or current.leader_epoch != leader_epoch:
            return None
        isr = tuple(r for r in current.isr if r not in remove) + tuple(r for r in add if r not in current.isr)
        if isr == current.isr:
            return current, stat.version
        new_state = zk.PartitionState(self.broker_id, leader_epoch, isr, current.controller_epoch)
        try:
            new_stat = self.zk_client.set(path, new_state.encode(), version=stat.version)
        except BadVersionError:
            return None  # written by the controller meanwhile: the next fetch or check tries again
        return new_state, int(new_stat.version)


def _followers(
    broker_id: int,
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    previous: dict[int, FollowerState],
    now: int,
) -> dict[int, FollowerState]:
    """The leader's record of each follower among `replicas`: what it knew of it, or a new one (a member of the ISR
    counted as caught up now, as Kafka's makeLeader does)."""
    return {
        replica: previous.get(replica) or FollowerState(last_caught_up_ms=now if replica in isr else 0)
        for replica in replicas
        if replica != broker_id
    }


def _log_task_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("an ISR change failed", exc_info=task.exception())
