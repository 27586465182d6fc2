"""Topic administration of a broker in a cluster: CreateTopics, DeleteTopics and CreatePartitions written to
ZooKeeper as Kafka's AdminZkClient writes them (any broker may take the request; the controller and every broker's
metadata cache do the rest).

- Creating a topic checks the request against the live brokers (ZkAdminManager.createTopics): a replication factor
  of -1 is `default.replication.factor`, more replicas than live brokers is INVALID_REPLICATION_FACTOR; an explicit
  assignment must be partitions 0..n-1 of equal size on distinct live brokers (INVALID_REPLICA_ASSIGNMENT), without
  a count or factor beside it (INVALID_REQUEST). Without one, replicas are placed by replica_assignment.py. The
  config overrides (`/config/topics/<t>`) and the assignment with a new topic id (`/brokers/topics/<t>`) are written
  in one transaction; a topic znode that exists, or a topic still marked for deletion, is TOPIC_ALREADY_EXISTS.
- On RocketMQ master/slave groups (rocketmq_groups.py) every topic is placed on one group, whatever its replication
  factor: each partition's replicas are the group's brokers, master first, so a group's master leads it and it
  follows the master through failovers (a slave's store refuses every write; the whole CommitLog is copied to every
  member anyway). A factor below the group's size is raised to it; a factor larger than every group with a master
  is INVALID_REPLICATION_FACTOR, an explicit assignment that is not a group's brokers INVALID_REPLICA_ASSIGNMENT;
  new partitions of a topic go to its group. The internal topics (`__consumer_offsets`, `__transaction_state`) are
  placed the same way.
- Deleting a topic creates `/admin/delete_topics/<t>`; the controller removes the topic's znodes.
- Adding partitions rewrites `/brokers/topics/<t>` with the new partitions appended (a conditional write on the
  znode's version), placed as Kafka's addPartitions places them or as the request says.

The writes are blocking ZooKeeper calls, made off the event loop. The handlers then wait, up to the request's
`timeout_ms` (as Kafka's DelayedCreatePartitions and DelayedDeleteTopics do), until the metadata cache shows every
new partition with a leader, or the topic gone; past it they answer REQUEST_TIMED_OUT (the change still happens).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from tidelog.broker import zk_layout as zk
from tidelog.broker.cluster_metadata import ClusterView, MetadataCache, TopicView
from tidelog.broker.replica_assignment import BrokerPlacement, assign_replicas
from tidelog.broker.topics import INTERNAL_TOPICS
from tidelog.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    RequestTimedOutError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.api import validate_topic_name

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from tidelog.broker.cluster_membership import ClusterMembership
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.rocketmq_groups import RocketMQGroups

Assignment = dict[int, tuple[int, ...]]


class ClusterTopics:
    def __init__(
        self,
        membership: ClusterMembership,
        cache: MetadataCache,
        config: BrokerConfig,
        rng: random.Random | None = None,
        groups: RocketMQGroups | None = None,
    ) -> None:
        self.groups = groups  # RocketMQ master/slave groups: replicated topics are placed on one
        self.membership = membership
        self.cache = cache
        self.client = membership.client
        self.config = config
        self.rng = rng or random.Random()

    def _placements(self) -> list[BrokerPlacement]:
        return [BrokerPlacement(b, r.rack) for b, r in sorted(self.membership.live_brokers.items())]

    # --- CreateTopics -----------------------------------------------------------------------------------------

    def plan_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        assignments: Sequence[tuple[int, Sequence[int]]],
        configs: Mapping[str, str],
        *,
        internal: bool = False,
    ) -> zk.TopicAssignment:
        """Check a topic to create against the cluster and place its replicas; nothing is written. `internal`: one of
        the brokers' own topics (`__consumer_offsets`, cluster_groups.py; `__transaction_state`,
        cluster_transactions.py), which clients may not create."""
        validate_topic_name(name)
        view = self.cache.view
        if name in view.topic_names:
            raise TopicExistsError(f"Topic '{name}' already exists.")
        if name in INTERNAL_TOPICS and not internal:
            raise InvalidTopicError(f"{name} is an internal topic: the brokers create it when they need it")
        collision = next((t for t in view.topic_names if t.replace(".", "_") == name.replace(".", "_")), None)
        if collision is not None:
            raise InvalidTopicError(f"Topic '{name}' collides with existing topic: {collision}")
        self.config.engine.log_defaults.with_overrides(configs)  # ConfigError names a bad key
        live = self._placements()
        if assignments:
            if num_partitions != -1 or replication_factor != -1:
                raise InvalidRequestError(
                    "Both numPartitions or replicationFactor and replicasAssignments were set. "
                    "Both cannot be used at the same time."
                )
            partitions = {index: tuple(brokers) for index, brokers in assignments}
            if sorted(partitions) != list(range(len(assignments))):
                raise InvalidReplicaAssignmentError("Partitions should be a consecutive 0-based integer sequence")
            _check_assignment(partitions, len(partitions[0]), {b.broker_id for b in live})
        else:
            count = self.config.engine.num_partitions if num_partitions == -1 else num_partitions
            factor = self.config.default_replication_factor if replication_factor == -1 else replication_factor
            if count < 1:
                raise InvalidPartitionsError(f"Number of partitions must be larger than 0, got {count}.")
            if factor < 1:
                raise InvalidReplicationFactorError(f"Replication factor must be larger than 0, got {factor}.")
            if factor > len(live):
                raise InvalidReplicationFactorError(
                    f"Replication factor: {factor} larger than available brokers: {len(live)} "
                    f"(live brokers: {', '.join(str(b.broker_id) for b in live) or 'none'})."
                )
            if self.groups is not None:
                try:
                    replicas = self.groups.placement_for(name, factor)
                except ValueError as exc:
                    raise InvalidReplicationFactorError(str(exc)) from None
                partitions = dict.fromkeys(range(count), replicas)
            else:
                partitions = assign_replicas(live, count, factor, rng=self.rng)
        if self.groups is not None:
            self._check_on_groups(partitions)
        elif max(len(replicas) for replicas in partitions.values()) > 1 and not self.replicates:
            raise InvalidReplicationFactorError(
                f"Replication factor {len(partitions[0])} needs the Kafka engine: the RocketMQ engine "
                "(tidelog.storage.engine=rocketmq) keeps one replica of each partition without master/slave groups."
            )
        return zk.TopicAssignment(name, new_kafka_uuid(), partitions)

    @property
    def replicates(self) -> bool:
        """Can this broker's engine hold a partition's replicas in step with a leader? (The Kafka engine can.)"""
        return self.config.engine.engine == "kafka"

    async def create_topic(self, assignment: zk.TopicAssignment, configs: Mapping[str, str]) -> None:
        await asyncio.to_thread(self._write_topic, assignment, configs)

    def _write_topic(self, assignment: zk.TopicAssignment, configs: Mapping[str, str]) -> None:
        name = assignment.topic
        client = self.client
        if client.exists(zk.delete_topic_path(name)):
            raise TopicExistsError(f"Topic '{name}' is marked for deletion.")
        transaction = client.transaction()
        config_path = zk.topic_config_path(name)
        if client.exists(config_path):  # left by an earlier attempt, or a topic deleted meanwhile
            transaction.set_data(config_path, zk.encode_topic_config(configs))
        else:
            transaction.create(config_path, zk.encode_topic_config(configs))
        transaction.create(zk.topic_path(name), assignment.encode())
        results = transaction.commit()
        failure = next((r for r in results if isinstance(r, Exception)), None)
        if isinstance(results[1], NodeExistsError):
            raise TopicExistsError(f"Topic '{name}' already exists.")
        if failure is not None:
            raise InvalidRequestError(f"writing topic {name} to ZooKeeper failed: {results}; try again")

    async def alter_topic_config(self, name: str, configs: Mapping[str, str]) -> None:
        """Replace the topic's overrides in `/config/topics/<t>`, with a change notification, as Kafka's
        AdminZkClient.changeTopicConfig; every broker's cache sees the znode change and applies it."""
        await asyncio.to_thread(write_entity_config, self.client, zk.topic_config_path(name), f"topics/{name}", configs)

    async def wait_for_leaders(
        self, name: str, topic_id: str | None, partitions: Iterable[int], timeout_ms: int
    ) -> None:
        """Wait until each of `partitions` has a leader in this broker's view (REQUEST_TIMED_OUT after
        `timeout_ms`; no wait at all for a timeout of 0 or less, as Kafka does)."""
        wanted = list(partitions)

        def led(view: ClusterView) -> bool:
            topic = view.topics.get(name)
            if topic is None or (topic_id is not None and topic.topic_id != topic_id):
                return False
            return all(p < len(topic.partitions) and topic.partitions[p].leader >= 0 for p in wanted)

        if timeout_ms > 0 and not await self.cache.wait_for(led, timeout_ms / 1000):
            raise RequestTimedOutError(
                f"topic {name} was written to ZooKeeper, but its partitions did not all get a leader within "
                f"{timeout_ms} ms"
            )

    # --- DeleteTopics -----------------------------------------------------------------------------------------

    async def delete_topic(self, name: str, timeout_ms: int) -> None:
        await asyncio.to_thread(self._mark_for_deletion, name)
        if timeout_ms > 0 and not await self.cache.wait_for(
            lambda view: name not in view.topic_names, timeout_ms / 1000
        ):
            raise RequestTimedOutError(
                f"topic {name} is marked for deletion but was not deleted within {timeout_ms} ms"
            )

    def _mark_for_deletion(self, name: str) -> None:
        if not self.client.exists(zk.topic_path(name)):
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        with contextlib.suppress(NodeExistsError):  # marked already: wait for it as well
            self.client.create(zk.delete_topic_path(name), b"", makepath=True)

    # --- CreatePartitions -------------------------------------------------------------------------------------

    def plan_partitions(
        self, name: str, count: int, assignments: Sequence[Sequence[int]] | None
    ) -> tuple[TopicView, Assignment]:
        """The partitions to add to `name` and their replicas; nothing is written."""
        topic = self.cache.view.topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        current = len(topic.partitions)
        if count < current:
            raise InvalidPartitionsError(
                f"Topic currently has {current} partitions, which is higher than the requested {count}."
            )
        if count == current:
            raise InvalidPartitionsError(f"Topic already has {current} partitions.")
        live = self._placements()
        factor = topic.replication_factor
        if assignments is not None:
            if len(assignments) != count - current:
                raise InvalidReplicaAssignmentError(
                    f"Increasing the number of partitions by {count - current} but {len(assignments)} assignments "
                    "provided."
                )
            added = {current + i: tuple(brokers) for i, brokers in enumerate(assignments)}
            _check_assignment(added, factor, {b.broker_id for b in live})
            if self.groups is not None:
                self._check_on_groups(added)
        elif self.groups is not None:
            group = self.groups.placed_on(topic.partitions[0].replicas)
            if group is None or group.state is None:
                raise InvalidReplicaAssignmentError(f"topic {name}'s RocketMQ master/slave group is gone")
            added = dict.fromkeys(range(current, count), topic.partitions[0].replicas)
        else:
            first = topic.partitions[0].replicas[0]
            start = max(0, next((i for i, b in enumerate(live) if b.broker_id >= first), 0))
            added = assign_replicas(live, count - current, factor, start_index=start, start_partition=current)
        return topic, added

    def _check_on_groups(self, partitions: Assignment) -> None:
        """With RocketMQ master/slave groups every partition is led by a group's master: its replicas must be the
        brokers of one group (INVALID_REPLICA_ASSIGNMENT)."""
        assert self.groups is not None
        stray = next((r for r in partitions.values() if self.groups.placed_on(r) is None), None)
        if stray is not None:
            raise InvalidReplicaAssignmentError(
                f"replicas {list(stray)} are not the brokers of one RocketMQ master/slave group: with the RocketMQ "
                "engine a partition's replicas are its group's brokers (its master leads it)"
            )

    async def add_partitions(self, topic: TopicView, added: Assignment) -> None:
        await asyncio.to_thread(self._write_partitions, topic, added)

    def _write_partitions(self, topic: TopicView, added: Assignment) -> None:
        partitions = {p.partition: p.replicas for p in topic.partitions} | added
        assignment = zk.TopicAssignment(  # an ongoing reassignment of the existing partitions carries on
            topic.name,
            topic.topic_id,
            partitions,
            {p.partition: p.adding for p in topic.partitions if p.adding},
            {p.partition: p.removing for p in topic.partitions if p.removing},
        )
        try:
            self.client.set(zk.topic_path(topic.name), assignment.encode(), version=topic.zk_version)
        except BadVersionError:
            raise InvalidPartitionsError(
                f"topic {topic.name} changed while its partitions were being added; try again"
            ) from None
        except NoNodeError:
            raise UnknownTopicOrPartitionError(f"topic {topic.name!r} does not exist") from None


def _check_assignment(partitions: Assignment, factor: int, live: set[int]) -> None:
    """Kafka's validateReplicaAssignment: replicas on distinct live brokers, the same number for each partition."""
    for partition, replicas in sorted(partitions.items()):
        if not replicas:
            raise InvalidReplicaAssignmentError(f"Cannot have replication factor of 0 for partition id {partition}.")
        if len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignmentError(
                f"Duplicate brokers not allowed in replica assignment: {', '.join(map(str, replicas))} "
                f"for partition id {partition}."
            )
        unknown = sorted(set(replicas) - live)
        if unknown:
            raise InvalidReplicaAssignmentError(
                f"Unknown broker(s) in replica assignment: {', '.join(map(str, unknown))} (live brokers: "
                f"{', '.join(map(str, sorted(live)))})."
            )
        if len(replicas) != factor:
            raise InvalidReplicaAssignmentError("All partitions should have the same number of replicas.")


def write_entity_config(client: KazooClient, path: str, entity_path: str, configs: Mapping[str, str]) -> None:
    """Set a ConfigEntityZNode (created if missing) and add its `/config/changes` notification, in one
    transaction (blocking: off the event loop)."""
    transaction = client.transaction()
    if client.exists(path):
        transaction.set_data(path, zk.encode_topic_config(configs))
    else:
        transaction.create(path, zk.encode_topic_config(configs))
    transaction.create(zk.CONFIG_CHANGE_PREFIX, zk.encode_config_change(entity_path), sequence=True)
    results = transaction.commit()
    if any(isinstance(r, Exception) for r in results):
        raise InvalidRequestError(f"writing {path} to ZooKeeper failed: {results}; try again")
