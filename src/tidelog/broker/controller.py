"""The controller: leaders and in-sync replicas of every partition, chosen by the one broker elected controller.

Every broker builds one (broker.py); it acts only while ClusterMembership says this broker is the controller
(`membership.role`), as Kafka's KafkaController does after its election. It runs on a thread of its own
(`tidelog-controller`, Kafka's ControllerEventManager thread): ZooKeeper callbacks, the metadata cache and the
membership only wake it, and each wake runs one pass over the whole cluster, which computes what each partition's
state should be and writes what differs (level-triggered: a pass after a missed event or a controller failover
repairs everything at once). A pass:

1. deletes the topics marked under /admin/delete_topics: the topic's znodes, its config and the mark go in one
   transaction (every broker then deletes its replicas, as it watches /brokers/topics);
2. gives a topic id to a topic znode written without one;
3. for each partition (`next_state`):
   - a new partition (no state yet) gets leader = its first live replica in assignment order, ISR = its live
     replicas, leader epoch 0 (Kafka's NewPartition -> OnlinePartition);
   - a partition whose leader is gone gets the first live ISR member in assignment order as leader, leader epoch + 1,
     the dead brokers out of its ISR. With no live ISR member it goes offline (leader -1) - unless
     unclean.leader.election.enable (the topic's, else the broker default) lets a live replica outside the ISR
     lead. An offline partition keeps its last ISR member in the ISR (as Kafka does), so that the broker that had
     all its data leads again when it comes back;
   - a live leader keeps leading; dead followers leave the ISR (leader epoch + 1, as Kafka's controller bumps it).

Every write is a ZooKeeper transaction that also checks the version of /controller_epoch this controller's election
left (`FencedWriter`, Kafka's checkedEphemeral/MultiRequest with a CheckOp): once another broker is elected, the
epoch's znode has a new version and a deposed controller's writes fail with ControllerMovedError. The controller
then stops acting and gives up /controller, and the cluster elects again. A state write also names the state znode's
version, so a write based on a stale view fails and the pass reads again.

In this slice followers hold no data (replication is the next slice): moving leadership moves where clients produce
and consume, not the records already written. Brokers that come back are not added to the ISR: the next slice's
leaders add a follower once it has caught up, through the same conditional writes of the state znode.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)

from tidelog.broker import zk_layout as zk
from tidelog.broker.cluster_membership import ClusterMembership, ControllerRole
from tidelog.broker.cluster_metadata import MetadataCache, PartitionView, TopicView
from tidelog.config import LogConfig
from tidelog.errors import ConfigError, TidelogError
from tidelog.kafka_uuid import new_kafka_uuid

log = logging.getLogger("tidelog.controller")

RETRY_AFTER_FAILURE_S = 1.0


class ControllerMovedError(TidelogError):
    """A write of a controller whose epoch is no longer current: another broker has been elected since."""


def next_state(
    replicas: Sequence[int],
    state: zk.PartitionState | None,
    live: Collection[int],
    unclean: bool,
    controller_epoch: int,
) -> zk.PartitionState | None:
    """The state the controller writes for a partition, or None if `state` is right as it is (see the module
    docstring). `replicas` in assignment order, `live` the registered brokers."""
    live_replicas = [r for r in replicas if r in live]
    if state is None:
        if not live_replicas:
            return None  # stays new until a replica is live
        return zk.PartitionState(live_replicas[0], 0, tuple(live_replicas), controller_epoch)
    live_isr = tuple(r for r in state.isr if r in live)
    if state.leader != zk.NO_LEADER and state.leader in live:
        if live_isr == state.isr:
            return None
        return zk.PartitionState(state.leader, state.leader_epoch + 1, live_isr, controller_epoch)
    candidates = [r for r in replicas if r in live and r in state.isr]
    if candidates:
        leader, isr = candidates[0], live_isr
    elif unclean and live_replicas:
        leader, isr = live_replicas[0], (live_replicas[0],)
        log.warning("unclean leader election: broker %d leads without being in the ISR %s", leader, list(state.isr))
    else:
        leader = zk.NO_LEADER
        # keep one member, the one most likely to have every record, so it can lead again when it comes back
        isr = (state.leader,) if state.leader in state.isr else state.isr[:1]
    if leader == state.leader and isr == state.isr:
        return None
    return zk.PartitionState(leader, state.leader_epoch + 1, isr, controller_epoch)


class FencedWriter:
    """The ZooKeeper writes of the controller of one epoch: each transaction first checks that /controller_epoch
    still has the version this controller's election left."""

    def __init__(self, client: KazooClient, role: ControllerRole) -> None:
        self.client = client
        self.role = role

    def commit(self, build: Callable[[TransactionRequest], None]) -> list[Any]:
        """Run the operations `build` adds, fenced; their results. Raises ControllerMovedError if the epoch has
        moved, else the first failed operation's error (BadVersionError, NodeExistsError, NoNodeError, ...)."""
        transaction = self.client.transaction()
        transaction.check(zk.CONTROLLER_EPOCH_PATH, self.role.epoch_zk_version)
        build(transaction)
        results = transaction.commit()
        if isinstance(results[0], (BadVersionError, NoNodeError)):
            raise ControllerMovedError(
                f"controller epoch {self.role.epoch} is no longer current (/controller_epoch has a new version)"
            )
        for result in results[1:]:
            if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
                raise result
        return results[1:]

    def create_state(self, topic: str, partition: int, state: zk.PartitionState) -> int:
        """Write a partition's first state; its znode version."""
        self.client.ensure_path(zk.partition_path(topic, partition))  # parents without data, as Kafka makes them
        self.commit(lambda t: t.create(zk.partition_state_path(topic, partition), state.encode()))
        return 0

    def set_state(self, topic: str, partition: int, state: zk.PartitionState, version: int) -> int:
        """Replace a partition's state if its znode still has `version`; the new version."""
        path = zk.partition_state_path(topic, partition)
        (stat,) = self.commit(lambda t: t.set_data(path, state.encode(), version=version))
        return int(stat.version)


@dataclass(frozen=True, slots=True)
class _Written:
    topic_id: str | None
    state: zk.PartitionState
    version: int


class Controller:
    def __init__(
        self,
        membership: ClusterMembership,
        cache: MetadataCache,
        log_defaults: LogConfig,
        *,
        delete_topic_enable: bool = True,
    ) -> None:
        self.membership = membership
        self.cache = cache
        self.client = membership.client
        self.log_defaults = log_defaults
        self.delete_topic_enable = delete_topic_enable
        self.writer: FencedWriter | None = None  # set while acting as controller
        self.fenced_epoch = -1  # an epoch this controller was fenced in: it does not act in it again
        self._written: dict[tuple[str, int], _Written] = {}  # own writes the cache may not have seen yet
        self._wake = threading.Event()
        self._retry_later = False  # a pass left work it could not do now: run again after a pause
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tidelog-controller", daemon=True)

    @property
    def active(self) -> bool:
        return self.writer is not None

    def start(self) -> None:
        self.membership.add_listener(self.wake)
        self.cache.add_listener(self.wake)
        self.client.ChildrenWatch(zk.DELETE_TOPICS_PATH, self._deletions_marked)
        self._thread.start()

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def wake(self) -> None:
        self._wake.set()

    def _deletions_marked(self, _children: list[str]) -> bool | None:
        if self._stopping:
            return False
        self.wake()
        return None

    # --- the thread -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            self._retry_later = False
            try:
                self.act()
            except Exception as exc:  # ZooKeeper unreachable for a while: kazoo reconnects, the pass runs again
                log.warning("controller pass failed (%s); retrying", exc, exc_info=not isinstance(exc, KazooException))
                self._retry_later = True
            if self._retry_later and not self._stopping:
                self._wake.wait(RETRY_AFTER_FAILURE_S)
                self._wake.set()

    def act(self) -> None:
        """One pass, if this broker is the controller."""
        role = self.membership.role
        if role is None or role.epoch == self.fenced_epoch:
            if self.writer is not None:
                log.info("no longer the controller (epoch %d)", self.writer.role.epoch)
                self.writer = None
            return
        if self.writer is None or self.writer.role != role:
            self.writer = FencedWriter(self.client, role)
            self._written.clear()
            log.info("acting as the controller of epoch %d", role.epoch)
        try:
            self.run_pass(self.writer)
        except ControllerMovedError as exc:
            log.warning("%s: stopping acting as the controller", exc)
            self.fenced_epoch = role.epoch
            self.writer = None
            self.membership.abdicate()  # give /controller up: the brokers elect again, with a higher epoch

    def run_pass(self, writer: FencedWriter) -> None:
        view = self.cache.view
        live = set(self.membership.live_brokers)
        marked = set(self.client.get_children(zk.DELETE_TOPICS_PATH))
        for name in sorted(marked):
            self._delete_topic(writer, name)
        retry = False
        for topic in view.topics.values():
            if topic.name in marked:
                continue
            if topic.topic_id is None:
                self._give_topic_id(writer, topic)
                continue
            unclean = self._unclean(topic)
            for partition in topic.partitions:
                retry |= self._elect(writer, topic, partition, live, unclean)
        known = {(name, p.partition) for name, topic in view.topics.items() for p in topic.partitions}
        for key in [key for key in self._written if key not in known]:
            del self._written[key]
        if retry:
            self.wake()

    # --- partitions -------------------------------------------------------------------------------------------

    def _unclean(self, topic: TopicView) -> bool:
        try:
            return self.log_defaults.with_overrides(
                {k: v for k, v in topic.configs.items() if k == "unclean.leader.election.enable"}
            ).unclean_leader_election_enable
        except ConfigError:
            return self.log_defaults.unclean_leader_election_enable

    def _current(self, topic: TopicView, partition: PartitionView) -> tuple[zk.PartitionState | None, int]:
        """The partition's state and version: the cache's, or this controller's own newer write."""
        written = self._written.get((topic.name, partition.partition))
        if written is not None and written.topic_id == topic.topic_id and written.version > partition.state_version:
            return written.state, written.version
        return partition.state, partition.state_version

    def _elect(
        self, writer: FencedWriter, topic: TopicView, partition: PartitionView, live: set[int], unclean: bool
    ) -> bool:
        """Write the partition's next state if it changes; True if the pass should run again (a stale view)."""
        state, version = self._current(topic, partition)
        desired = next_state(partition.replicas, state, live, unclean, writer.role.epoch)
        if desired is None:
            return False
        key = (topic.name, partition.partition)
        try:
            if state is None:
                new_version = writer.create_state(topic.name, partition.partition, desired)
            else:
                new_version = writer.set_state(topic.name, partition.partition, desired, version)
        except (BadVersionError, NodeExistsError, NoNodeError) as exc:
            log.info("%s-%d: the state changed meanwhile (%s); reading it again", *key, type(exc).__name__)
            self._reread(topic, partition)
            return True
        self._written[key] = _Written(topic.topic_id, desired, new_version)
        if state is None:
            log.info("%s-%d: leader %d, ISR %s (new partition)", *key, desired.leader, list(desired.isr))
        elif desired.leader != state.leader:
            log.info(
                "%s-%d: leader %d -> %d, leader epoch %d, ISR %s",
                *key,
                state.leader,
                desired.leader,
                desired.leader_epoch,
                list(desired.isr),
            )
        else:
            log.info("%s-%d: ISR %s -> %s", *key, list(state.isr), list(desired.isr))
        return False

    def _reread(self, topic: TopicView, partition: PartitionView) -> None:
        key = (topic.name, partition.partition)
        try:
            data, stat = self.client.get(zk.partition_state_path(*key))
            state = zk.PartitionState.decode(topic.name, partition.partition, data)
        except (NoNodeError, zk.MalformedZnodeError):
            self._written.pop(key, None)
            return
        self._written[key] = _Written(topic.topic_id, state, stat.version)

    # --- topics -----------------------------------------------------------------------------------------------

    def _give_topic_id(self, writer: FencedWriter, topic: TopicView) -> None:
        """A topic znode without an id (an older writer's) gets one, as Kafka's controller does."""
        assignment = zk.TopicAssignment(
            topic.name, new_kafka_uuid(), {p.partition: p.replicas for p in topic.partitions}
        )
        try:
            writer.commit(
                lambda t: t.set_data(zk.topic_path(topic.name), assignment.encode(), version=topic.zk_version)
            )
            log.info("topic %s: topic id %s", topic.name, assignment.topic_id)
        except (BadVersionError, NoNodeError):
            pass  # changed meanwhile: the next pass sees it

    def _delete_topic(self, writer: FencedWriter, name: str) -> None:
        """Remove a topic marked for deletion: its znodes, its config and the mark, in one fenced transaction."""
        if not self.delete_topic_enable:
            log.info("topic %s was marked for deletion, but delete.topic.enable is false: removing the mark", name)
            self._commit_deletion(writer, [zk.delete_topic_path(name)])
            return
        paths = self._subtree(zk.topic_path(name))
        if self.client.exists(zk.topic_config_path(name)):
            paths.append(zk.topic_config_path(name))
        paths.append(zk.delete_topic_path(name))
        if self._commit_deletion(writer, paths) and len(paths) > 1:
            log.info("deleted topic %s", name)

    def _commit_deletion(self, writer: FencedWriter, paths: list[str]) -> bool:
        def build(transaction: TransactionRequest) -> None:
            for path in paths:
                transaction.delete(path)

        try:
            writer.commit(build)
        except KazooException as exc:  # the tree changed while it was read (NoNode, NotEmpty): read it again
            log.info("deleting %s: %s; trying again", paths[-1], type(exc).__name__)
            self._retry_later = True
            return False
        return True

    def _subtree(self, path: str) -> list[str]:
        """`path` and every znode under it, children before their parent ([] if it does not exist)."""
        try:
            children = self.client.get_children(path)
        except NoNodeError:
            return []
        paths: list[str] = []
        for child in sorted(children):
            paths += self._subtree(f"{path}/{child}")
        paths.append(path)
        return paths
