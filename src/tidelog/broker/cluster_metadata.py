"""Every broker's view of the cluster's topics (the metadata cache) and the local replicas it keeps in step.

A Kafka broker in ZooKeeper mode learns leaders and ISRs from the controller's LeaderAndIsr and UpdateMetadata
requests; a tidelog broker reads the same znodes the controller writes, through ZooKeeper watches:

    /brokers/topics                      children: the topics (ChildrenWatch)
    /brokers/topics/<t>                  each topic's assignment and id (DataWatch)
    /config/topics/<t>                   its config overrides (DataWatch)
    /brokers/topics/<t>/partitions/<p>/state   each partition's leader, leader epoch, ISR (DataWatch)

The callbacks run on kazoo's threads. They update the cache's own tables under a lock and then publish a new
`ClusterView`, an immutable snapshot replaced whole (as cluster_membership.py publishes the live brokers): the event
loop reads `view` without a lock and always sees one consistent state. The view also says, for each partition this
broker holds a replica of, its role (`LocalReplica`: leader or follower, the leader and its epoch) - what the
handlers check (`check_leader`: Produce, Fetch, ListOffsets and DeleteRecords answer NOT_LEADER_OR_FOLLOWER for a
partition this broker does not lead) and what the replica manager (replica_manager.py) follows through
`add_listener`: listeners are called after each new view, and again after the local replicas were brought in step
with it (a replica created just then takes its role).

Local replicas: after every change, the cache makes the engine hold exactly the replicas assigned to this broker
(`_reconcile`, on the admin thread, where every engine topic call runs): a topic gets created with the cluster's
topic id and only the partitions assigned here, grows when partitions are added, gains an empty replica of a
partition a reassignment adds here (its fetcher fills it from the leader) and deletes the replica of one a
reassignment moved away (`StorageEngine.hold_partitions`; the files go after log.segment.delete.delay.ms), takes the
cluster's config overrides, and is deleted when its znode goes (or when the cluster's topic of that name has another
id: it was deleted and created again while this broker was away). Topics the engine holds that the cluster never
assigned (a single broker's topics from before it joined) are left alone: they are not served in cluster mode -
except a `__consumer_offsets` of its own, which makes way for the cluster's (cluster_groups.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient

from tidelog.broker import zk_layout as zk
from tidelog.errors import (
    FencedLeaderEpochError,
    NotLeaderOrFollowerError,
    TidelogError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.api import StorageEngine

if TYPE_CHECKING:
    from tidelog.broker.admin import AdminExecutor

log = logging.getLogger("tidelog.cluster")

OFFSETS_TOPIC = "__consumer_offsets"  # a cluster topic (cluster_groups.py); a broker's own copy from before is dropped


class Role(Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class PartitionView:
    topic: str
    partition: int
    replicas: tuple[int, ...]  # the assignment, preferred leader first
    state: zk.PartitionState | None  # None until the controller writes the partition's first state
    state_version: int = -1  # the state znode's ZooKeeper version (-1: none), which a conditional write names
    adding: tuple[int, ...] = ()  # a reassignment in progress: the replicas being added (in `replicas` already)
    removing: tuple[int, ...] = ()  # and those that go once it completes (still in `replicas`)

    @property
    def leader(self) -> int:
        return self.state.leader if self.state is not None else zk.NO_LEADER

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch if self.state is not None else -1

    @property
    def isr(self) -> tuple[int, ...]:
        return self.state.isr if self.state is not None else ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """Where a reassignment moves the partition (TRS): the replicas but those being removed."""
        return tuple(r for r in self.replicas if r not in self.removing)


@dataclass(frozen=True, slots=True)
class TopicView:
    name: str
    topic_id: str | None  # None: a topic znode written without one (the controller gives it one)
    partitions: tuple[PartitionView, ...]  # by partition id
    configs: Mapping[str, str]
    zk_version: int  # the topic znode's version, which CreatePartitions' conditional write names

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0


@dataclass(frozen=True, slots=True)
class LocalReplica:
    """A partition this broker holds a replica of, with the role the current state gives it."""

    topic: str
    partition: int
    role: Role
    leader: int  # -1: none
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One consistent state of the cluster's topics, as this broker last read them."""

    topic_names: frozenset[str] = frozenset()  # /brokers/topics' children as last read
    topics: Mapping[str, TopicView] = field(default_factory=dict)  # those whose znode has been read
    local: Mapping[tuple[str, int], LocalReplica] = field(default_factory=dict)

    def partition(self, topic: str, partition: int) -> PartitionView | None:
        view = self.topics.get(topic)
        if view is None or not 0 <= partition < len(view.partitions):
            return None
        return view.partitions[partition]


class MetadataCache:
    """The cluster's topics as every broker sees them, and this broker's replicas of them kept in the engine."""

    def __init__(
        self,
        client: KazooClient,
        broker_id: int,
        engine: StorageEngine,
        admin: AdminExecutor,
        on_topic_deleted: Callable[[str], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.view = ClusterView()
        self._client = client
        self._engine = engine
        self._admin = admin
        # run on the event loop when a topic's local replicas are deleted (the group coordinator drops its offsets)
        self.on_topic_deleted = on_topic_deleted
        self._lock = threading.RLock()
        self._names: frozenset[str] = frozenset()  # /brokers/topics' children
        self._tokens: dict[str, object] = {}  # the watches of each topic; a stale token ends its watches
        self._assignments: dict[str, tuple[zk.TopicAssignment, int]] = {}
        self._configs: dict[str, dict[str, str]] = {}
        self._states: dict[tuple[str, int], tuple[zk.PartitionState, int]] = {}
        self._state_watched: set[tuple[str, int]] = set()
        self._topic_views: dict[str, TopicView] = {}
        self._local: dict[str, dict[tuple[str, int], LocalReplica]] = {}  # this broker's replicas, by topic
        self._listeners: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: set[asyncio.Future[None]] = set()
        self._started = False
        self._closed = False
        self._reconcile_lock = threading.Lock()
        self._reconcile_wanted = False
        self._reconcile_running = False
        self._reported: set[tuple[str, str]] = set()  # (topic, reason) warned about once

    # --- start and stop ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the topics and watch them (blocking reads, off the loop), then bring the local replicas in step."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._watch)
        self._started = True
        await self._admin.run(self._reconcile)

    def _watch(self) -> None:
        self._client.ChildrenWatch(zk.TOPICS_PATH, self._topics_changed)

    def close(self) -> None:
        """Stop following the cluster (the watches end at their next event) and stop reconciling."""
        self._closed = True
        with self._reconcile_lock:
            self._reconcile_wanted = False

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (on a kazoo thread, after each new view; it must not block)."""
        self._listeners.append(listener)

    # --- the watches (kazoo threads) --------------------------------------------------------------------------

    def _topics_changed(self, children: list[str]) -> bool | None:
        if self._closed:
            return False
        with self._lock:
            names = frozenset(children)
            # first the names: every view published from here on (each new topic's first reads publish one) lists
            # them, so no view has a topic's data without its name (which a reconcile would take as deleted)
            self._names = names
            for name in sorted(names - self._tokens.keys()):
                token = self._tokens[name] = object()
                self._client.DataWatch(zk.topic_path(name), partial(self._topic_changed, name, token))
                self._client.DataWatch(zk.topic_config_path(name), partial(self._config_changed, name, token))
            for name in self._tokens.keys() - names:
                self._forget(name)
            self._publish(changed=None)
        return None

    def _forget(self, name: str) -> None:
        del self._tokens[name]
        self._assignments.pop(name, None)
        self._configs.pop(name, None)
        self._topic_views.pop(name, None)
        for key in [key for key in self._state_watched if key[0] == name]:
            self._state_watched.discard(key)
            self._states.pop(key, None)

    def _topic_changed(self, name: str, token: object, data: bytes | None, stat: Any, _event: Any = None) -> bool:
        if self._closed or self._tokens.get(name) is not token:
            return False
        with self._lock:
            if self._tokens.get(name) is not token:
                return False
            if data is None:
                self._assignments.pop(name, None)
            else:
                try:
                    assignment = zk.TopicAssignment.decode(name, data)
                except zk.MalformedZnodeError as exc:
                    self._warn_once(name, "malformed", "ignoring topic %s: %s", name, exc)
                    self._assignments.pop(name, None)
                else:
                    self._assignments[name] = (assignment, stat.version)
                    for partition in assignment.partitions:
                        key = (name, partition)
                        if key not in self._state_watched:
                            self._state_watched.add(key)
                            self._client.DataWatch(
                                zk.partition_state_path(name, partition),
                                partial(self._state_changed, name, partition, token),
                            )
            self._publish(changed=name)
        return True

    def _config_changed(self, name: str, token: object, data: bytes | None, _stat: Any, _event: Any = None) -> bool:
        if self._closed or self._tokens.get(name) is not token:
            return False
        with self._lock:
            if self._tokens.get(name) is not token:
                return False
            try:
                self._configs[name] = zk.decode_topic_config(name, data)
            except zk.MalformedZnodeError as exc:
                self._warn_once(name, "config", "topic %s: ignoring its config: %s", name, exc)
                self._configs[name] = {}
            self._publish(changed=name)
        return True

    def _state_changed(
        self, name: str, partition: int, token: object, data: bytes | None, stat: Any, _event: Any = None
    ) -> bool:
        if self._closed or self._tokens.get(name) is not token:
            return False
        with self._lock:
            if self._tokens.get(name) is not token:
                return False
            key = (name, partition)
            if data is None:
                self._states.pop(key, None)
            else:
                try:
                    self._states[key] = (zk.PartitionState.decode(name, partition, data), stat.version)
                except zk.MalformedZnodeError as exc:
                    log.warning("ignoring the state of %s-%d: %s", name, partition, exc)
                    self._states.pop(key, None)
            self._publish(changed=name)
        return True

    def _warn_once(self, topic: str, reason: str, message: str, *args: object) -> None:
        if (topic, reason) not in self._reported:
            self._reported.add((topic, reason))
            log.warning(message, *args)

    # --- publishing -------------------------------------------------------------------------------------------

    def _topic_view(self, name: str) -> TopicView | None:
        entry = self._assignments.get(name)
        if entry is None:
            return None
        assignment, version = entry
        partitions = []
        for partition in range(assignment.partition_count):
            state = self._states.get((name, partition))
            partitions.append(
                PartitionView(
                    name,
                    partition,
                    assignment.partitions[partition],
                    state[0] if state is not None else None,
                    state[1] if state is not None else -1,
                    assignment.adding_replicas.get(partition, ()),
                    assignment.removing_replicas.get(partition, ()),
                )
            )
        return TopicView(name, assignment.topic_id, tuple(partitions), dict(self._configs.get(name, {})), version)

    def _local_replicas(self, topic_view: TopicView | None) -> dict[tuple[str, int], LocalReplica]:
        if topic_view is None:
            return {}
        return {
            (partition.topic, partition.partition): LocalReplica(
                partition.topic,
                partition.partition,
                Role.LEADER if partition.leader == self.broker_id else Role.FOLLOWER,
                partition.leader,
                partition.leader_epoch,
            )
            for partition in topic_view.partitions
            if self.broker_id in partition.replicas and partition.state is not None
        }

    def _publish(self, *, changed: str | None) -> None:
        """A new view, after the topic list or the znodes of topic `changed` changed."""
        if changed is not None:  # only the changed topic is rebuilt; the view's dicts are fresh copies
            topic_view = self._topic_view(changed)
            if topic_view is None:
                self._topic_views.pop(changed, None)
            else:
                self._topic_views[changed] = topic_view
            self._local[changed] = self._local_replicas(topic_view)
        for name in self._local.keys() - self._topic_views.keys():
            del self._local[name]
        self.view = ClusterView(
            self._names,
            dict(self._topic_views),
            {key: replica for replicas in self._local.values() for key, replica in replicas.items()},
        )
        self._notify_listeners()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake_waiters)
        if self._started:
            self.request_reconcile()

    def _notify_listeners(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("a metadata listener failed")

    # --- what the handlers ask (event loop) -------------------------------------------------------------------

    def check_leader(self, topic: str, partition: int, current_leader_epoch: int = -1) -> None:
        """Raise unless this broker leads the partition (and the client's leader epoch, when it sends one, is the
        partition's): UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH or
        NOT_LEADER_OR_FOLLOWER, in Kafka's order."""
        view = self.view
        local = view.local.get((topic, partition))
        if local is None:
            if view.partition(topic, partition) is None:
                raise UnknownTopicOrPartitionError(f"the cluster has no partition {topic}-{partition}")
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} holds no replica of {topic}-{partition}")
        if current_leader_epoch >= 0:
            if current_leader_epoch < local.leader_epoch:
                raise FencedLeaderEpochError(
                    f"{topic}-{partition}: leader epoch {current_leader_epoch} is older than {local.leader_epoch}"
                )
            if current_leader_epoch > local.leader_epoch:
                raise UnknownLeaderEpochError(
                    f"{topic}-{partition}: leader epoch {current_leader_epoch} is newer than {local.leader_epoch}"
                )
        if local.role is not Role.LEADER:
            leader = f"broker {local.leader}" if local.leader != zk.NO_LEADER else "no broker"
            raise NotLeaderOrFollowerError(f"{topic}-{partition} is led by {leader}, not by {self.broker_id}")

    def partition_exists(self, topic: str, partition: int) -> bool:
        return self.view.partition(topic, partition) is not None

    async def wait_for(self, condition: Callable[[ClusterView], bool], timeout_s: float) -> bool:
        """Wait (on the loop) until `condition(view)` holds; False if `timeout_s` passes first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not condition(self.view):
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closed:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                pass
            finally:
                self._waiters.discard(waiter)
        return True

    def _wake_waiters(self) -> None:
        for waiter in list(self._waiters):
            if not waiter.done():
                waiter.set_result(None)

    # --- local replicas (admin thread) ------------------------------------------------------------------------

    def request_reconcile(self) -> None:
        """Bring the local replicas in step with the view soon, on the admin thread (requests made while one runs
        are folded into one more run)."""
        with self._reconcile_lock:
            if self._closed:
                return
            self._reconcile_wanted = True
            if self._reconcile_running:
                return
            self._reconcile_running = True
        try:
            future: Future[None] = self._admin.submit(self._reconcile_while_wanted)
        except RuntimeError:  # the admin thread has stopped: the broker is shutting down
            with self._reconcile_lock:
                self._reconcile_running = False
            return
        future.add_done_callback(_log_failure)

    def _reconcile_while_wanted(self) -> None:
        while True:
            with self._reconcile_lock:
                if not self._reconcile_wanted or self._closed:
                    self._reconcile_running = False
                    return
                self._reconcile_wanted = False
            try:
                self._reconcile()
            except Exception:  # the next change tries again
                log.exception("keeping the local replicas in step failed")
            else:  # replicas created just now can take their roles (leader epochs, fetchers) from the same view
                self._notify_listeners()

    def _reconcile(self) -> None:
        """Make the engine hold this broker's replicas of the view's topics (see the module docstring)."""
        view = self.view
        engine = self._engine
        held = engine.topics()
        for name, topic in view.topics.items():
            if topic.topic_id is None or self._closed:
                continue
            mine = [p.partition for p in topic.partitions if self.broker_id in p.replicas]
            description = held.get(name)
            try:
                if description is not None and description.topic_id != topic.topic_id:
                    if description.local_partitions is None and name == OFFSETS_TOPIC:
                        log.warning(
                            "dropping the %s this broker kept before it joined the cluster (id %s): the cluster's "
                            "(id %s) holds the groups now, and the offsets committed here before are lost",
                            name,
                            description.topic_id,
                            topic.topic_id,
                        )
                    elif description.local_partitions is None:
                        self._warn_once(
                            name,
                            "foreign",
                            "topic %s here (id %s) was not created by the cluster, whose topic %s has id %s: its "
                            "replicas are not created here until the local topic is deleted",
                            name,
                            description.topic_id,
                            name,
                            topic.topic_id,
                        )
                        continue
                    log.info(
                        "topic %s was deleted and created again (id %s): deleting the old replicas",
                        name,
                        topic.topic_id,
                    )
                    self._delete_local(name)
                    description = None
                configs = dict(topic.configs)
                if description is None:
                    if mine:
                        engine.create_topic(
                            name, len(topic.partitions), configs, topic_id=topic.topic_id, local_partitions=mine
                        )
                        log.info("created the replicas of %s: partitions %s", name, ", ".join(map(str, mine)))
                    continue
                holding = set(description.held)
                if len(topic.partitions) > description.partitions:
                    new = [p for p in mine if p >= description.partitions]
                    engine.create_partitions(name, len(topic.partitions), local_partitions=new)
                    log.info("topic %s grew to %d partitions; replicas here: %s", name, len(topic.partitions), new)
                    holding |= set(new)
                if holding != set(mine):  # a reassignment added replicas here, or moved them away
                    engine.hold_partitions(name, mine)
                    log.info(
                        "topic %s: new replicas here: %s; replicas deleted here: %s",
                        name,
                        sorted(set(mine) - holding) or "none",
                        sorted(holding - set(mine)) or "none",
                    )
                if dict(description.configs) != configs:
                    engine.alter_topic_configs(name, configs)
            except TidelogError as exc:
                log.error("cannot bring the replicas of %s in step with the cluster: %s", name, exc)
            except OSError as exc:
                log.error("cannot bring the replicas of %s in step with the cluster: %s", name, exc)
        for name, description in held.items():
            if name in view.topic_names or name in view.topics or self._closed:
                continue
            if description.local_partitions is None:
                self._warn_once(
                    name, "unmanaged", "topic %s here is not a topic of the cluster: it is kept but not served", name
                )
                continue
            log.info("topic %s was deleted from the cluster: deleting its replicas here", name)
            try:
                self._delete_local(name)
            except (TidelogError, OSError) as exc:
                log.error("cannot delete the replicas of %s: %s", name, exc)

    def _delete_local(self, name: str) -> None:
        self._engine.delete_topic(name)
        loop = self._loop
        if self.on_topic_deleted is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                done = asyncio.run_coroutine_threadsafe(self.on_topic_deleted(name), loop)
                done.add_done_callback(_log_failure)


def _log_failure(future: Future[Any]) -> None:
    exc = future.exception()
    if exc is not None:
        log.error("keeping the local replicas in step failed", exc_info=exc)
