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
   - a live leader keeps leading; dead followers leave the ISR (leader epoch + 1, as Kafka's controller bumps it);
4. for each partition being reassigned (`_complete_reassignments`, the end of Kafka's
   KafkaController.onPartitionReassignment) whose target replicas are all in the ISR: a leader outside the target
   gives way to the first target replica that is live and in the ISR, and the removed replicas leave the ISR (one
   state write, leader epoch + 1); then the topic znode gets the target as the partition's replicas and loses its
   adding/removing entries (one write for all of a topic's partitions that completed). Every broker's metadata
   cache then deletes the replicas that were removed. Until then the partition waits: its new replicas are created
   by their brokers' caches, follow the leader, and join the ISR once they have caught up (replica_manager.py).

Leadership moves on request too, each run on the same thread (`submit` hands a job over and returns a future the
event loop awaits), so a job never races a pass:

- a controlled shutdown (`controlled_shutdown`, Kafka's KafkaController.doControlledShutdown): the stopping broker
  joins `shutting_down`; each partition it leads gets another live ISR member as leader (the first in assignment
  order that is not shutting down, Kafka's ControlledShutdownLeaderSelector), leader epoch + 1, the stopping broker
  out of the ISR; each partition it only follows loses it from the ISR (leader epoch + 1). The answer is the
  partitions it still leads (those with no other live ISR member; a partition of one replica is not counted, as in
  Kafka). Brokers in `shutting_down` are never chosen as leaders (new partitions, failovers, preferred elections)
  until their registration goes;
- a leader election (`elect_leaders`, the ElectLeaders API): PREFERRED moves each named partition's leadership to
  its preferred replica (the first of its assignment) when that broker is live, not shutting down and in the ISR;
  UNCLEAN gives a partition without a live leader its first live replica. A partition of a RocketMQ master/slave
  group is never changed by it (its group's master leads it): PREFERRED answers ELECTION_NOT_NEEDED when the master
  is the first replica, PREFERRED_LEADER_NOT_AVAILABLE otherwise; UNCLEAN ELECTION_NOT_NEEDED with a live master,
  ELIGIBLE_LEADERS_NOT_AVAILABLE without (the controller's master election gives it one);
- a partition reassignment (`alter_reassignments`, the AlterPartitionReassignments API; Kafka 2.4+'s KIP-455 in
  ZooKeeper mode): with the original replicas ORS (the replicas but those being added) and the target TRS, the topic
  znode gets replicas = TRS + (ORS - TRS), adding_replicas = TRS - ORS, removing_replicas = ORS - TRS, in one
  conditional write per topic; step 4 of the passes completes it. Replicas null cancels a reassignment: the target
  becomes ORS, and the replicas being added become removing replicas (as do those of an earlier target a new one
  drops), so they leave the ISR before they leave the assignment. The state lives in the topic znodes only, so a new
  controller carries on with an ongoing reassignment where the last one left it;
- the automatic rebalance (`auto.leader.rebalance.enable`, every `leader.imbalance.check.interval.seconds`, Kafka's
  checkAndTriggerAutoLeaderRebalance): for each broker, the partitions it is the preferred replica of; when more
  than `leader.imbalance.per.broker.percentage` of them are led elsewhere, the preferred election runs for those
  where it can succeed.

Every write is a ZooKeeper transaction that also checks the version of /controller_epoch this controller's election
left (`FencedWriter`, Kafka's checkedEphemeral/MultiRequest with a CheckOp): once another broker is elected, the
epoch's znode has a new version and a deposed controller's writes fail with ControllerMovedError. The controller
then stops acting and gives up /controller, and the cluster elects again. A state write also names the state znode's
version, so a write based on a stale view fails and the pass reads again.

RocketMQ master/slave groups (rocketmq_groups.py, when the brokers run them): each pass first elects a new master
for each group whose master's registration is gone (`elect_master`: from the SyncStateSet, master epoch + 1; a
conditional write of the group znode, fenced like every other write), then gives every partition placed on a group
the group's state (`group_state`: leader the live master, leader epoch the master epoch, ISR the SyncStateSet)
instead of `next_state`. The brokers learn both from their watches: the group's members switch roles from the
group znode, clients follow the partition states through Metadata.

Followers copy their leaders (replica_manager.py, replica_fetcher.py); leaders add a follower to the ISR once it has
caught up, through conditional writes of the same state znode.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from enum import IntEnum
from functools import partial
from typing import Any, TypeVar

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
from tidelog.broker.config import LeadershipConfig
from tidelog.broker.rocketmq_groups import RocketMQGroups, elect_master, group_state
from tidelog.config import LogConfig
from tidelog.errors import (
    ConfigError,
    ErrorCode,
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
    NotControllerError,
    StaleBrokerEpochError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.kafka_uuid import new_kafka_uuid

log = logging.getLogger("tidelog.controller")

RETRY_AFTER_FAILURE_S = 1.0
ELECTION_ATTEMPTS = 3  # conditional writes of one partition's state tried before an election gives up on it

T = TypeVar("T")
TopicPartition = tuple[str, int]


class ElectionType(IntEnum):
    """ElectLeaders' election_type."""

    PREFERRED = 0
    UNCLEAN = 1


class ControllerMovedError(TidelogError):
    """A write of a controller whose epoch is no longer current: another broker has been elected since."""


def next_state(
    replicas: Sequence[int],
    state: zk.PartitionState | None,
    live: Collection[int],
    unclean: bool,
    controller_epoch: int,
    shutting_down: Collection[int] = (),
) -> zk.PartitionState | None:
    """The state the controller writes for a partition, or None if `state` is right as it is (see the module
    docstring). `replicas` in assignment order, `live` the registered brokers, `shutting_down` those of them in a
    controlled shutdown: they keep what they lead until their registration goes, but are chosen for nothing."""
    live_replicas = [r for r in replicas if r in live and r not in shutting_down]
    if state is None:
        if not live_replicas:
            return None  # stays new until a replica is live
        return zk.PartitionState(live_replicas[0], 0, tuple(live_replicas), controller_epoch)
    live_isr = tuple(r for r in state.isr if r in live)
    if state.leader != zk.NO_LEADER and state.leader in live:
        if live_isr == state.isr:
            return None
        return zk.PartitionState(state.leader, state.leader_epoch + 1, live_isr, controller_epoch)
    candidates = [r for r in replicas if r in live and r in state.isr and r not in shutting_down]
    if candidates:
        leader, isr = candidates[0], tuple(r for r in live_isr if r not in shutting_down)
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
        leadership: LeadershipConfig | None = None,
        groups: RocketMQGroups | None = None,
    ) -> None:
        self.membership = membership
        self.groups = groups  # RocketMQ master/slave groups: their masters elected here
        self.cache = cache
        self.client = membership.client
        self.log_defaults = log_defaults
        self.delete_topic_enable = delete_topic_enable
        self.leadership = leadership or LeadershipConfig()
        self.shutting_down: frozenset[int] = frozenset()  # brokers in a controlled shutdown: they lead nothing new
        self._jobs: list[tuple[Callable[[FencedWriter], Any], Future[Any]]] = []
        self._jobs_lock = threading.Lock()
        self._next_rebalance_check = time.monotonic() + self.leadership.leader_imbalance_check_interval_seconds
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
        if self.groups is not None:
            self.groups.add_listener(self.wake)
        self.client.ChildrenWatch(zk.DELETE_TOPICS_PATH, self._deletions_marked)
        self._thread.start()

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._fail_jobs(NotControllerError("the controller is stopping"))

    def submit(self, job: Callable[[FencedWriter], T]) -> Future[T]:
        """Run `job` on the controller's thread, after the pass it is woken for, with this epoch's writer; the
        future fails with NotControllerError if this broker is not (or no longer) the controller."""
        future: Future[T] = Future()
        if self._stopping:
            future.set_exception(NotControllerError("the controller is stopping"))
            return future
        with self._jobs_lock:
            self._jobs.append((job, future))
        self.wake()
        return future

    def _run_jobs(self) -> None:
        with self._jobs_lock:
            jobs, self._jobs = self._jobs, []
        for job, future in jobs:
            if not future.set_running_or_notify_cancel():
                continue
            writer = self.writer
            try:
                if writer is None:
                    raise NotControllerError(
                        f"broker {self.membership.broker_id} is not the controller "
                        f"(the controller is broker {self.membership.controller_id})"
                    )
                future.set_result(job(writer))
            except ControllerMovedError as exc:
                future.set_exception(NotControllerError(str(exc)))
                self._fenced(writer)
            except BaseException as exc:
                future.set_exception(exc)

    def _fail_jobs(self, exc: Exception) -> None:
        with self._jobs_lock:
            jobs, self._jobs = self._jobs, []
        for _job, future in jobs:
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)

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
            self._wake.wait(max(0.0, self._next_rebalance_check - time.monotonic()))
            self._wake.clear()
            if self._stopping:
                return
            self._retry_later = False
            try:
                self.act()
            except Exception as exc:  # ZooKeeper unreachable for a while: kazoo reconnects, the pass runs again
                log.warning("controller pass failed (%s); retrying", exc, exc_info=not isinstance(exc, KazooException))
                self._retry_later = True
            self._run_jobs()
            if time.monotonic() >= self._next_rebalance_check:
                self._next_rebalance_check = time.monotonic() + self.leadership.leader_imbalance_check_interval_seconds
                if self.leadership.auto_leader_rebalance_enable and self.writer is not None:
                    self._guarded(self._check_leader_imbalance)
            if self._retry_later and not self._stopping:
                self._wake.wait(RETRY_AFTER_FAILURE_S)
                self._wake.set()

    def _guarded(self, step: Callable[[FencedWriter], object]) -> None:
        """Run a step of the controller's own outside a pass (the rebalance), as a pass's failures are handled."""
        writer = self.writer
        if writer is None:
            return
        try:
            step(writer)
        except ControllerMovedError as exc:
            log.warning("%s: stopping acting as the controller", exc)
            self._fenced(writer)
        except Exception as exc:
            log.warning("controller step failed (%s)", exc, exc_info=not isinstance(exc, KazooException))

    def _fenced(self, writer: FencedWriter | None) -> None:
        if writer is None or self.writer is not writer:
            return
        self.fenced_epoch = writer.role.epoch
        self.writer = None
        self.membership.abdicate()  # give /controller up: the brokers elect again, with a higher epoch

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
            self.shutting_down = frozenset()
            log.info("acting as the controller of epoch %d", role.epoch)
        try:
            self.run_pass(self.writer)
        except ControllerMovedError as exc:
            log.warning("%s: stopping acting as the controller", exc)
            self._fenced(self.writer)

    def run_pass(self, writer: FencedWriter) -> None:
        view = self.cache.view
        live = set(self.membership.live_brokers)
        if not self.shutting_down <= live:  # their registrations went: they may lead again when they come back
            self.shutting_down &= live
        marked = set(self.client.get_children(zk.DELETE_TOPICS_PATH))
        for name in sorted(marked):
            self._delete_topic(writer, name)
        retry = self._elect_masters(writer, live)
        for topic in view.topics.values():
            if topic.name in marked:
                continue
            if topic.topic_id is None:
                self._give_topic_id(writer, topic)
                continue
            unclean = self._unclean(topic)
            for partition in topic.partitions:
                retry |= self._elect(writer, topic, partition, live, unclean)
            if any(p.reassigning for p in topic.partitions):
                retry |= self._complete_reassignments(writer, topic, live)
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
        group = self.groups.group_of(partition.replicas) if self.groups is not None else None
        if group is not None and group.state is not None:
            desired: zk.PartitionState | None = group_state(group.state, live, writer.role.epoch)
            if state is not None and desired is not None:
                if (desired.leader, desired.isr) == (state.leader, state.isr) and (
                    state.leader_epoch >= desired.leader_epoch
                ):
                    return False
                if state.leader_epoch >= desired.leader_epoch:  # leader epochs only grow
                    desired = replace(desired, leader_epoch=state.leader_epoch + 1)
        else:
            desired = next_state(partition.replicas, state, live, unclean, writer.role.epoch, self.shutting_down)
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

    def _in_group(self, partition: PartitionView) -> bool:
        return self.groups is not None and self.groups.group_of(partition.replicas) is not None

    def _elect_masters(self, writer: FencedWriter, live: set[int]) -> bool:
        """A new master for each group whose master is gone (rocketmq_groups.elect_master); True to run again."""
        if self.groups is None:
            return False
        retry = False
        for view in self.groups.view.values():
            if view.state is None:
                continue
            new = elect_master(view.state, live, self.log_defaults.unclean_leader_election_enable)
            if new is None:
                continue
            path = zk.rocketmq_group_path(view.name)
            try:
                writer.commit(partial(_set_group, path, new.encode(), view.version))
            except (BadVersionError, NoNodeError):
                retry = True  # changed meanwhile: the watch brings the new state
                continue
            if new.master == zk.NO_LEADER:
                log.warning(
                    "RocketMQ group %s: master %d is gone and no live broker of the SyncStateSet %s can take over",
                    view.name, view.state.master, list(view.state.sync_state_set),
                )  # fmt: skip
            else:
                log.info(
                    "RocketMQ group %s: master %d -> %d, master epoch %d",
                    view.name, view.state.master, new.master, new.master_epoch,
                )  # fmt: skip
        return retry

    def _reread(self, topic: TopicView, partition: PartitionView) -> None:
        key = (topic.name, partition.partition)
        try:
            data, stat = self.client.get(zk.partition_state_path(*key))
            state = zk.PartitionState.decode(topic.name, partition.partition, data)
        except (NoNodeError, zk.MalformedZnodeError):
            self._written.pop(key, None)
            return
        self._written[key] = _Written(topic.topic_id, state, stat.version)

    # --- moving leadership on request (jobs on the controller's thread) ----------------------------------------

    def controlled_shutdown(self, writer: FencedWriter, broker_id: int, broker_epoch: int = -1) -> list[TopicPartition]:
        """Move leadership away from `broker_id` and take it out of every ISR; the partitions it still leads (see
        the module docstring). Raises StaleBrokerEpochError for an earlier registration of the broker."""
        if broker_epoch >= 0:
            stat = self.client.exists(zk.broker_path(broker_id))
            if stat is not None and broker_epoch < stat.czxid:
                raise StaleBrokerEpochError(
                    f"broker {broker_id}: epoch {broker_epoch} is older than its registration ({stat.czxid})"
                )
        if broker_id in self.membership.live_brokers:
            self.shutting_down |= {broker_id}
        log.info("controlled shutdown of broker %d: moving its leadership away", broker_id)
        for topic in self.cache.view.topics.values():
            if topic.topic_id is None:
                continue
            for partition in topic.partitions:
                if broker_id in partition.replicas:
                    self._retrying(writer, topic.name, partition.partition, partial(self._away_from, broker_id))
        remaining = []
        for topic in self.cache.view.topics.values():
            for partition in topic.partitions:
                state, _version = self._current(topic, partition)
                if state is not None and state.leader == broker_id and len(partition.replicas) > 1:
                    remaining.append((topic.name, partition.partition))
        log.info(
            "controlled shutdown of broker %d: %s",
            broker_id,
            f"it still leads {len(remaining)} partition(s)" if remaining else "it leads no partition any more",
        )
        return remaining

    def _away_from(
        self, broker_id: int, partition: PartitionView, state: zk.PartitionState, epoch: int
    ) -> zk.PartitionState | None:
        """The state that moves `broker_id`'s leadership (Kafka's ControlledShutdownLeaderSelector) or its ISR
        membership away; None to leave the partition as it is."""
        live = self.membership.live_brokers
        if self._in_group(partition):
            return None  # a group's master leads until its registration goes; then the group elects
        if state.leader == broker_id:
            candidates = [r for r in partition.replicas if r in live and r in state.isr and r not in self.shutting_down]
            if not candidates:
                return None  # no other in-sync replica: it stays the leader while it is up
            isr = tuple(r for r in state.isr if r not in self.shutting_down)
            return zk.PartitionState(candidates[0], state.leader_epoch + 1, isr, epoch)
        if broker_id in state.isr and len(state.isr) > 1:
            isr = tuple(r for r in state.isr if r != broker_id)
            return zk.PartitionState(state.leader, state.leader_epoch + 1, isr, epoch)
        return None

    def elect_leaders(
        self, writer: FencedWriter, partitions: Collection[TopicPartition] | None, election_type: ElectionType
    ) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        """The ElectLeaders API: each partition's result (error code, message). `partitions` None: every partition,
        leaving out those that needed no election (as Kafka answers)."""
        view = self.cache.view
        wanted = (
            [(t.name, p.partition) for t in view.topics.values() if t.topic_id is not None for p in t.partitions]
            if partitions is None
            else list(partitions)
        )
        results: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
        for name, index in wanted:
            outcome: list[tuple[ErrorCode, str | None]] = []
            decide = partial(self._elected, election_type, outcome)
            if view.partition(name, index) is None:
                results[(name, index)] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{name}-{index} does not exist")
                continue
            if not self._retrying(writer, name, index, decide):
                outcome.append((ErrorCode.UNKNOWN_SERVER_ERROR, f"{name}-{index}: its state kept changing; try again"))
            result = outcome[-1] if outcome else (ErrorCode.NONE, None)
            if partitions is None and result[0] == ErrorCode.ELECTION_NOT_NEEDED:
                continue
            results[(name, index)] = result
        return results

    def _elected(
        self,
        election_type: ElectionType,
        outcome: list[tuple[ErrorCode, str | None]],
        partition: PartitionView,
        state: zk.PartitionState,
        epoch: int,
    ) -> zk.PartitionState | None:
        live = self.membership.live_brokers
        eligible = [r for r in partition.replicas if r in live and r not in self.shutting_down]
        key = f"{partition.topic}-{partition.partition}"
        outcome.clear()
        if self._in_group(partition):
            outcome.append(_group_election(election_type, partition, state, key, live))
            return None  # the group's master leads: only the group's own election or switch-role moves it
        if election_type == ElectionType.PREFERRED:
            preferred = partition.replicas[0]
            if state.leader == preferred:
                outcome.append((ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."))
                return None
            if preferred not in eligible or preferred not in state.isr:
                outcome.append(
                    (
                        ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                        f"Failed to elect leader for partition {key} under strategy "
                        f"PreferredReplicaPartitionLeaderElectionStrategy: preferred replica {preferred} is "
                        f"{'not live' if preferred not in eligible else 'not in the ISR'}",
                    )
                )
                return None
            return zk.PartitionState(preferred, state.leader_epoch + 1, state.isr, epoch)
        if state.leader in live:
            outcome.append((ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."))
            return None
        in_sync = [r for r in eligible if r in state.isr]
        if in_sync:
            return zk.PartitionState(in_sync[0], state.leader_epoch + 1, tuple(in_sync), epoch)
        if eligible:
            log.warning("%s: unclean leader election (ElectLeaders): broker %d leads outside the ISR", key, eligible[0])
            return zk.PartitionState(eligible[0], state.leader_epoch + 1, (eligible[0],), epoch)
        outcome.append(
            (ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, f"Failed to elect leader for partition {key}: no live replica")
        )
        return None

    def _retrying(
        self,
        writer: FencedWriter,
        name: str,
        index: int,
        decide: Callable[[PartitionView, zk.PartitionState, int], zk.PartitionState | None],
    ) -> bool:
        """Write the state `decide` computes from the partition's current one (nothing when it answers None),
        reading again after a conflicting write; False if the state kept changing."""
        for _attempt in range(ELECTION_ATTEMPTS):
            topic = self.cache.view.topics.get(name)
            partition = self.cache.view.partition(name, index)
            if topic is None or partition is None:
                return True
            state, version = self._current(topic, partition)
            if state is None:
                return True
            desired = decide(partition, state, writer.role.epoch)
            if desired is None:
                return True
            try:
                new_version = writer.set_state(name, index, desired, version)
            except (BadVersionError, NoNodeError):
                self._reread(topic, partition)
                continue
            self._written[(name, index)] = _Written(topic.topic_id, desired, new_version)
            log.info(
                "%s-%d: leader %d -> %d, leader epoch %d, ISR %s -> %s",
                name,
                index,
                state.leader,
                desired.leader,
                desired.leader_epoch,
                list(state.isr),
                list(desired.isr),
            )
            return True
        return False

    def _check_leader_imbalance(self, writer: FencedWriter) -> None:
        """Kafka's checkAndTriggerAutoLeaderRebalance (see the module docstring)."""
        view = self.cache.view
        live = self.membership.live_brokers
        preferred_of: dict[int, list[tuple[TopicPartition, zk.PartitionState]]] = {}
        for topic in view.topics.values():
            if topic.topic_id is None:
                continue
            for partition in topic.partitions:
                state, _version = self._current(topic, partition)
                if state is not None and partition.replicas and not self._in_group(partition):
                    preferred_of.setdefault(partition.replicas[0], []).append(
                        ((topic.name, partition.partition), state)
                    )
        threshold = self.leadership.leader_imbalance_per_broker_percentage / 100
        for broker_id, partitions in sorted(preferred_of.items()):
            led_elsewhere = [(key, state) for key, state in partitions if state.leader != broker_id]
            ratio = len(led_elsewhere) / len(partitions)
            if ratio <= threshold:
                continue
            movable = [
                key
                for key, state in led_elsewhere
                if state.leader != zk.NO_LEADER
                and broker_id in live
                and broker_id not in self.shutting_down
                and broker_id in state.isr
            ]
            if not movable:
                continue
            log.info(
                "leader imbalance of broker %d is %.0f%% (above %d%%): moving the leadership of %d partition(s) back",
                broker_id,
                ratio * 100,
                self.leadership.leader_imbalance_per_broker_percentage,
                len(movable),
            )
            self.elect_leaders(writer, movable, ElectionType.PREFERRED)

    # --- partition reassignment ---------------------------------------------------------------------------------

    def alter_reassignments(
        self, writer: FencedWriter, requested: Mapping[TopicPartition, Sequence[int] | None]
    ) -> dict[TopicPartition, tuple[ErrorCode, str | None]]:
        """The AlterPartitionReassignments API: start (target replicas) or cancel (None) each partition's
        reassignment (see the module docstring); each partition's result (error code, message)."""
        by_topic: dict[str, dict[int, Sequence[int] | None]] = {}
        for (name, index), target in requested.items():
            by_topic.setdefault(name, {})[index] = target
        results: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
        for name, targets in sorted(by_topic.items()):
            for _attempt in range(ELECTION_ATTEMPTS):
                outcome = self._reassign_topic(writer, name, targets)
                if outcome is not None:
                    results.update(outcome)
                    break
            else:
                message = f"topic {name} kept changing while its reassignment was written; try again"
                results.update({(name, i): (ErrorCode.UNKNOWN_SERVER_ERROR, message) for i in targets})
        return results

    def _reassign_topic(
        self, writer: FencedWriter, name: str, targets: Mapping[int, Sequence[int] | None]
    ) -> dict[TopicPartition, tuple[ErrorCode, str | None]] | None:
        """One conditional write of the topic znode with the reassignments of `targets`; None if the znode changed
        since it was read (the caller reads it again)."""
        try:
            data, stat = self.client.get(zk.topic_path(name))
            current = zk.TopicAssignment.decode(name, data)
        except (NoNodeError, zk.MalformedZnodeError):
            current = None
        if current is None or self.client.exists(zk.delete_topic_path(name)):
            missing = f"topic {name} does not exist" if current is None else f"topic {name} is being deleted"
            return {(name, i): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, missing) for i in targets}
        replicas = dict(current.partitions)
        adding = dict(current.adding_replicas)
        removing = dict(current.removing_replicas)
        live = set(self.membership.live_brokers)
        outcome: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
        for index, target in sorted(targets.items()):
            try:
                full, added, removed = _reassigned(
                    name, index, replicas.get(index), adding.get(index, ()), removing.get(index, ()), target, live
                )
            except TidelogError as exc:
                outcome[(name, index)] = (ErrorCode(exc.kafka_error_code), str(exc))
                continue
            replicas[index] = full
            for entries, value in ((adding, added), (removing, removed)):
                if value:
                    entries[index] = value
                else:
                    entries.pop(index, None)
            outcome[(name, index)] = (ErrorCode.NONE, None)
            log.info(
                "%s-%d: reassignment %s: replicas %s, adding %s, removing %s",
                name,
                index,
                "cancelled" if target is None else f"to {list(target)}",
                list(full),
                list(added),
                list(removed),
            )
        assignment = zk.TopicAssignment(name, current.topic_id, replicas, adding, removing)
        if assignment != current:
            try:
                writer.commit(lambda t: t.set_data(zk.topic_path(name), assignment.encode(), version=stat.version))
            except (BadVersionError, NoNodeError):
                return None
        return outcome

    def _complete_reassignments(self, writer: FencedWriter, topic: TopicView, live: set[int]) -> bool:
        """Step 4 of a pass for one topic (see the module docstring); True if the pass should run again."""
        completed: dict[int, tuple[int, ...]] = {}
        for partition in topic.partitions:
            if not partition.reassigning:
                continue
            state, version = self._current(topic, partition)
            target = partition.target_replicas
            if state is None or state.leader == zk.NO_LEADER or not set(target) <= set(state.isr):
                continue  # its new replicas are still catching up (or it has no leader to hand over from)
            removing = set(partition.removing)
            leader = state.leader
            if leader not in target or leader in self.shutting_down:
                candidates = [r for r in target if r in state.isr and r in live and r not in self.shutting_down]
                if not candidates:
                    continue
                leader = candidates[0]
            if leader != state.leader or removing & set(state.isr):
                isr = tuple(r for r in state.isr if r not in removing)
                desired = zk.PartitionState(leader, state.leader_epoch + 1, isr, writer.role.epoch)
                key = (topic.name, partition.partition)
                try:
                    new_version = writer.set_state(topic.name, partition.partition, desired, version)
                except (BadVersionError, NoNodeError):
                    self._reread(topic, partition)
                    return True
                self._written[key] = _Written(topic.topic_id, desired, new_version)
                log.info(
                    "%s-%d: reassignment: leader %s, leader epoch %d, ISR %s -> %s",
                    *key,
                    leader if leader == state.leader else f"{state.leader} -> {leader}",
                    desired.leader_epoch,
                    list(state.isr),
                    list(isr),
                )
            completed[partition.partition] = target
        if not completed:
            return False
        assignment = zk.TopicAssignment(
            topic.name,
            topic.topic_id,
            {p.partition: completed.get(p.partition, p.replicas) for p in topic.partitions},
            {p.partition: p.adding for p in topic.partitions if p.adding and p.partition not in completed},
            {p.partition: p.removing for p in topic.partitions if p.removing and p.partition not in completed},
        )
        path, data = zk.topic_path(topic.name), assignment.encode()
        try:
            writer.commit(lambda t: t.set_data(path, data, version=topic.zk_version))
        except (BadVersionError, NoNodeError):
            return False  # the cache has not seen the latest topic znode yet: its watch wakes the controller again
        for index, target in sorted(completed.items()):
            log.info("%s-%d: reassignment completed: replicas %s", topic.name, index, list(target))
        return False

    # --- topics -----------------------------------------------------------------------------------------------

    def _give_topic_id(self, writer: FencedWriter, topic: TopicView) -> None:
        """A topic znode without an id (an older writer's) gets one, as Kafka's controller does."""
        assignment = zk.TopicAssignment(
            topic.name,
            new_kafka_uuid(),
            {p.partition: p.replicas for p in topic.partitions},
            {p.partition: p.adding for p in topic.partitions if p.adding},
            {p.partition: p.removing for p in topic.partitions if p.removing},
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


def _reassigned(
    name: str,
    index: int,
    replicas: tuple[int, ...] | None,
    adding: tuple[int, ...],
    removing: tuple[int, ...],
    target: Sequence[int] | None,
    live: Collection[int],
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A partition's replicas, adding and removing replicas once its reassignment to `target` starts (None: its
    ongoing reassignment is cancelled), as Kafka's ReplicaAssignment.reassignTo computes them (the original replicas
    ORS are the replicas but those being added, in their current order); raises the error Kafka answers the
    partition with (its messages included)."""
    if replicas is None:
        raise UnknownTopicOrPartitionError(f"topic {name} has no partition {index}")
    origin = tuple(r for r in replicas if r not in adding)
    if target is None:
        if not adding and not removing:
            raise NoReassignmentInProgressError(f"no reassignment of {name}-{index} is in progress")
        target = origin
    elif not target:
        raise InvalidReplicaAssignmentError("Empty replica list specified in partition reassignment.")
    elif len(set(target)) != len(target):
        raise InvalidReplicaAssignmentError(
            f"Duplicate replica ids in partition reassignment replica list: {list(target)}"
        )
    elif any(r < 0 for r in target):
        raise InvalidReplicaAssignmentError(f"Invalid broker id in replica assignment: {list(target)}")
    elif not set(target) <= set(live):
        raise InvalidReplicaAssignmentError(
            f"Replica assignment has brokers that are not alive. Replica list: {list(target)}, live broker list: "
            f"{sorted(live)}"
        )
    # replicas an earlier reassignment was adding that the new target drops are removed like the original ones, so
    # they leave the ISR (and leadership) before they leave the assignment
    dropped = tuple(r for r in replicas if r not in target and r not in origin)
    full = tuple(target) + tuple(r for r in origin if r not in target) + dropped
    return full, tuple(r for r in target if r not in origin), tuple(r for r in full if r not in target)


def _group_election(
    election_type: ElectionType, partition: PartitionView, state: zk.PartitionState, key: str, live: Collection[int]
) -> tuple[ErrorCode, str | None]:
    """ElectLeaders on a partition of a RocketMQ master/slave group, which never changes its state: the group's
    master leads it (controller's master election, `tidelog rocketmq switch-role`)."""
    if election_type == ElectionType.PREFERRED:
        if state.leader == partition.replicas[0]:
            return ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."
        return (
            ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
            f"Failed to elect leader for partition {key}: preferred replica {partition.replicas[0]} is not the master "
            f"of its RocketMQ master/slave group (broker {state.leader} is); `tidelog rocketmq switch-role` moves "
            "the master",
        )
    if state.leader in live:
        return ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."
    return (
        ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
        f"Failed to elect leader for partition {key}: its RocketMQ master/slave group has no live master (the "
        "controller elects one from the SyncStateSet)",
    )


def _set_group(path: str, data: bytes, version: int, transaction: TransactionRequest) -> None:
    transaction.set_data(path, data, version=version)
