"""Metadata, CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords: the cluster as clients see it (topic
configs are config_admin.py's).

A single broker (no zookeeper.connect) is the whole cluster: it is the controller, the leader of every partition and
its only replica, and topic changes are the engine's topic calls on the admin thread. CreateTopics validates names,
partition counts, the replication factor (1 or -1 on a single node) and topic configs (Kafka's names) before
creating anything.

A broker of a cluster (`cluster`, cluster_topics.py) answers from its metadata cache instead: Metadata lists every
topic of the cluster with each partition's leader, leader epoch, replicas, ISR and offline replicas (a partition
without a live leader is LEADER_NOT_AVAILABLE), and topic changes are written to ZooKeeper; the controller and each
broker's cache carry them out. DeleteRecords goes to the partition's leader (NOT_LEADER_OR_FOLLOWER elsewhere).

Metadata auto-creates a requested topic when both the client allows it and `auto.create.topics.enable` is on.
The internal topics `__consumer_offsets` and `__transaction_state` belong to the brokers: Metadata marks them
internal, and no client may delete them, add partitions to them or delete records from them
(INVALID_TOPIC_EXCEPTION, as Kafka answers).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import CLUSTER_NAME, Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.broker.zk_layout import NO_LEADER
from tidelog.errors import (
    ConfigError,
    ErrorCode,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TidelogError,
    TopicDeletionDisabledError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.protocol.messages import ApiKey, Request, millis, uuid_to_kafka
from tidelog.storage.api import StorageEngine, validate_topic_name

if TYPE_CHECKING:
    from tidelog.broker.admin import AdminExecutor
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.cluster_topics import ClusterTopics
    from tidelog.broker.config import BrokerConfig

log = logging.getLogger("tidelog.broker")

AUTHORIZED_OPERATIONS_OMITTED = -(1 << 31)
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})  # the brokers' own: offsets, transactions
# Creating a partition takes ~5-10 ms (files, index mappings, checkpoints) on the admin thread (admin.py): one
# request may add at most this many, so it holds that thread - and the admin requests queued behind it - for seconds
# at most.
MAX_NEW_PARTITIONS_PER_REQUEST = 1000


def _take_partition_budget(budget: list[int], topic: str, count: int) -> None:
    if count > budget[0]:
        raise InvalidPartitionsError(
            f"topic {topic}: {count} new partitions exceed what one request may create "
            f"({MAX_NEW_PARTITIONS_PER_REQUEST}, {budget[0]} left in this request)"
        )
    budget[0] -= count


class TopicApis:
    """Metadata, topic administration and DeleteRecords. Topic changes run on the admin thread;
    `on_topic_deleted` lets the group coordinator drop the topic's committed offsets."""

    def __init__(
        self,
        engine: StorageEngine,
        config: BrokerConfig,
        authorizer: Authorizer,
        admin: AdminExecutor,
        on_topic_deleted: Callable[[str], Awaitable[None]],
        cluster: ClusterTopics | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.authorizer = authorizer
        self.admin = admin
        self.on_topic_deleted = on_topic_deleted
        self.cluster = cluster  # None: a single broker, which is the whole cluster

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.METADATA: ApiHandler(0, 12, self.handle_metadata),
            ApiKey.CREATE_TOPICS: ApiHandler(0, 7, self.handle_create_topics),
            ApiKey.DELETE_TOPICS: ApiHandler(0, 6, self.handle_delete_topics),
            ApiKey.CREATE_PARTITIONS: ApiHandler(0, 3, self.handle_create_partitions),
            ApiKey.DELETE_RECORDS: ApiHandler(0, 2, self.handle_delete_records),
        }

    # --- Metadata ---------------------------------------------------------------------------------------------

    async def handle_metadata(self, request: Request, connection: Connection) -> Response:
        body = request.body
        engine = self.engine
        node_id = self.config.node_id
        requested = body.topics
        authorizer = self.authorizer
        if requested is None or (request.api_version == 0 and not requested):
            # internal topics too, marked is_internal, as Kafka answers; only those the client may describe
            names = [
                name
                for name in self._topic_names()
                if authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.TOPIC, name, log_denied=False)
            ]
            denied: set[str] = set()
            unknown_ids: list[str] = []
        else:
            names, unknown_ids = self._requested_names(requested)
            denied = {
                n for n in names if not authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.TOPIC, n)
            }
        allow_create = getattr(body, "allow_auto_topic_creation", True) and self.config.auto_create_topics_enable
        if allow_create and not authorizer.authorize(
            connection, Operation.CREATE, ResourceType.CLUSTER, log_denied=False
        ):
            existing = self._topic_names()
            denied |= {  # auto-creation needs CREATE on the cluster or on the topic
                n
                for n in names
                if n not in existing
                and n not in denied
                and not authorizer.authorize(connection, Operation.CREATE, ResourceType.TOPIC, n)
            }
        budget = [MAX_NEW_PARTITIONS_PER_REQUEST]
        topics = [
            {"error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": []}
            if name in denied
            else await self._describe_topic(name, allow_create, node_id, budget)
            for name in names
        ]
        topics += [  # Kafka answers an unknown topic id (or one the client may not see) without a name
            {"error_code": ErrorCode.UNKNOWN_TOPIC_ID, "name": None, "topic_id": topic_id, "partitions": []}
            for topic_id in unknown_ids
        ]
        if getattr(body, "include_topic_authorized_operations", False):
            for topic in topics:
                if topic["error_code"] == 0:
                    topic["topic_authorized_operations"] = authorizer.authorized_operations(
                        connection, ResourceType.TOPIC, str(topic["name"])
                    )
        cluster_operations = AUTHORIZED_OPERATIONS_OMITTED
        if getattr(body, "include_cluster_authorized_operations", False):
            cluster_operations = authorizer.authorized_operations(connection, ResourceType.CLUSTER, CLUSTER_NAME)
        return {
            "throttle_time": 0,
            "brokers": self.brokers(connection),
            "cluster_id": engine.cluster_id,
            "controller_id": self.controller_id(),
            "topics": topics,
            "cluster_authorized_operations": cluster_operations,
        }

    def controller_id(self) -> int:
        """This broker on its own; the elected controller in a cluster (-1 while there is none)."""
        return self.config.node_id if self.cluster is None else self.cluster.membership.controller_id

    def _requested_names(self, requested: Any) -> tuple[list[str], list[str]]:
        """The topic names a Metadata request asks for (v10+ may name a topic by id alone, as librdkafka does for
        the topic ids of a consumer-protocol assignment), and the ids that name no topic."""
        names: list[str] = []
        unknown: list[str] = []
        by_id: dict[str, str] | None = None
        for topic in requested:
            if topic.name is not None:
                names.append(topic.name)
                continue
            if by_id is None:
                by_id = {topic_id: name for name, topic_id in self._topic_ids().items()}
            topic_id = uuid_to_kafka(getattr(topic, "topic_id", None))
            if topic_id in by_id:
                names.append(by_id[topic_id])
            else:
                unknown.append(topic_id)
        return names, unknown

    def _topic_ids(self) -> dict[str, str]:
        if self.cluster is not None:
            return {n: t.topic_id for n, t in self.cluster.cache.view.topics.items() if t.topic_id is not None}
        return {name: d.topic_id for name, d in self.engine.topics().items()}

    def brokers(self, connection: Connection) -> list[dict[str, Any]]:
        """The live brokers, each at its address for the listener this client connected to (Metadata's and
        DescribeCluster's list)."""
        me = {
            "node_id": self.config.node_id,
            "host": connection.advertised_host,
            "port": connection.advertised_port,
            "rack": self.config.broker_rack,
        }
        if self.cluster is None:
            return [me]
        brokers = []
        for broker_id, registration in sorted(self.cluster.membership.live_brokers.items()):
            endpoint = registration.endpoint(connection.listener.name)
            if broker_id != self.config.node_id and endpoint is not None:
                brokers.append(
                    {"node_id": broker_id, "host": endpoint.host, "port": endpoint.port, "rack": registration.rack}
                )
        return sorted([me, *brokers], key=lambda broker: broker["node_id"])

    def _topic_names(self) -> Collection[str]:
        """The topics clients see: the engine's on a single broker, the cluster's in a cluster."""
        if self.cluster is None:
            return self.engine.topics().keys()
        return self.cluster.cache.view.topics.keys()

    async def _describe_topic(self, name: str, allow_create: bool, node_id: int, budget: list[int]) -> dict[str, Any]:
        if self.cluster is not None:
            return await self._describe_cluster_topic(self.cluster, name, allow_create, budget)
        engine = self.engine
        description = engine.topics().get(name)
        if description is None and allow_create:
            try:
                validate_topic_name(name)
                _take_partition_budget(budget, name, self.config.engine.num_partitions)
                description = await self.admin.run(engine.create_topic, name)
                log.info("auto-created topic %s with %d partition(s)", name, description.partitions)
            except TopicExistsError:  # another request's auto-creation ran first on the admin thread
                description = engine.topics().get(name)
            except TidelogError as exc:
                return {"error_code": exc.kafka_error_code, "name": name, "partitions": []}
        if description is None:
            return {"error_code": UnknownTopicOrPartitionError.kafka_error_code, "name": name, "partitions": []}
        return {
            "error_code": 0,
            "name": name,
            "topic_id": description.topic_id,
            "is_internal": name in INTERNAL_TOPICS,
            "partitions": [
                {
                    "error_code": 0,
                    "partition_index": p,
                    "leader_id": node_id,
                    "leader_epoch": 0,
                    "replica_nodes": [node_id],
                    "isr_nodes": [node_id],
                    "offline_replicas": [],
                }
                for p in range(description.partitions)
            ],
            "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    async def _describe_cluster_topic(
        self, cluster: ClusterTopics, name: str, allow_create: bool, budget: list[int]
    ) -> dict[str, Any]:
        topic = cluster.cache.view.topics.get(name)
        if topic is None and allow_create:
            try:
                plan = cluster.plan_topic(name, -1, -1, (), {})
                _take_partition_budget(budget, name, plan.partition_count)
                await cluster.create_topic(plan, {})
                log.info(
                    "auto-created topic %s with %d partition(s), replication factor %d",
                    name,
                    plan.partition_count,
                    plan.replication_factor,
                )
            except TopicExistsError:
                pass  # created meanwhile (by another client, through another broker)
            except TidelogError as exc:
                return {"error_code": exc.kafka_error_code, "name": name, "partitions": []}
            # the controller elects its leaders next: the client asks again, as Kafka answers a topic just created
            return {"error_code": ErrorCode.LEADER_NOT_AVAILABLE, "name": name, "partitions": []}
        if topic is None:
            return {"error_code": UnknownTopicOrPartitionError.kafka_error_code, "name": name, "partitions": []}
        if topic.topic_id is None:
            return {"error_code": ErrorCode.LEADER_NOT_AVAILABLE, "name": name, "partitions": []}
        live = cluster.membership.live_brokers
        partitions = []
        for partition in topic.partitions:
            leader = partition.leader if partition.leader in live else NO_LEADER
            partitions.append(
                {
                    "error_code": 0 if leader != NO_LEADER else ErrorCode.LEADER_NOT_AVAILABLE,
                    "partition_index": partition.partition,
                    "leader_id": leader,
                    "leader_epoch": partition.leader_epoch,
                    "replica_nodes": list(partition.replicas),
                    "isr_nodes": list(partition.isr),
                    "offline_replicas": [r for r in partition.replicas if r not in live],
                }
            )
        return {
            "error_code": 0,
            "name": name,
            "topic_id": topic.topic_id,
            "is_internal": name in INTERNAL_TOPICS,
            "partitions": partitions,
            "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    # --- CreateTopics -----------------------------------------------------------------------------------------

    async def handle_create_topics(self, request: Request, connection: Connection) -> Response:
        body = request.body
        engine = self.engine
        authorizer = self.authorizer
        may_create_any = authorizer.authorize(connection, Operation.CREATE, ResourceType.CLUSTER, log_denied=False)
        results = []
        budget = [MAX_NEW_PARTITIONS_PER_REQUEST]
        for topic in body.topics:
            result: dict[str, Any] = {
                "name": topic.name,
                "error_code": 0,
                "error_message": None,
                "num_partitions": -1,
                "replication_factor": -1,
            }
            results.append(result)
            if not may_create_any and not authorizer.authorize(
                connection, Operation.CREATE, ResourceType.TOPIC, topic.name
            ):
                result.update(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, error_message="Authorization failed.")
                continue
            if self.cluster is not None:
                await self._create_cluster_topic(self.cluster, topic, body, result, budget)
                continue
            try:
                partitions = None if topic.num_partitions == -1 else topic.num_partitions
                if topic.replication_factor not in (-1, 1):
                    raise InvalidReplicationFactorError(
                        f"replication factor {topic.replication_factor} is larger than the 1 available broker"
                    )
                if topic.assignments:
                    partitions = len(topic.assignments)
                configs = {c.name: c.value for c in topic.configs if c.value is not None}
                validate_topic_name(topic.name)
                if topic.name in engine.topics():
                    raise TopicExistsError(f"topic {topic.name!r} already exists")
                self.config.engine.log_defaults.with_overrides(configs)
                count = partitions if partitions is not None else self.config.engine.num_partitions
                if getattr(body, "validate_only", False):
                    result.update(num_partitions=count, replication_factor=1)
                    continue
                _take_partition_budget(budget, topic.name, count)
                description = await self.admin.run(engine.create_topic, topic.name, partitions, configs)
                result.update(
                    topic_id=description.topic_id,
                    num_partitions=description.partitions,
                    replication_factor=1,
                    configs=[
                        {"name": k, "value": str(v), "read_only": False, "config_source": 1, "is_sensitive": False}
                        for k, v in sorted(configs.items())
                    ],
                )
            except ConfigError as exc:
                result.update(error_code=exc.kafka_error_code, error_message=str(exc))
            except TidelogError as exc:
                result.update(error_code=exc.kafka_error_code, error_message=str(exc))
        return {"throttle_time": 0, "topics": results}

    async def _create_cluster_topic(
        self, cluster: ClusterTopics, topic: Any, body: Any, result: dict[str, Any], budget: list[int]
    ) -> None:
        try:
            configs = {c.name: c.value for c in topic.configs if c.value is not None}
            plan = cluster.plan_topic(
                topic.name,
                topic.num_partitions,
                topic.replication_factor,
                [(a.partition_index, a.broker_ids) for a in topic.assignments],
                configs,
            )
            count, factor = plan.partition_count, plan.replication_factor
            if getattr(body, "validate_only", False):
                result.update(num_partitions=count, replication_factor=factor)
                return
            _take_partition_budget(budget, topic.name, count)
            await cluster.create_topic(plan, configs)
            result.update(
                topic_id=plan.topic_id,
                num_partitions=count,
                replication_factor=factor,
                configs=[
                    {"name": k, "value": str(v), "read_only": False, "config_source": 1, "is_sensitive": False}
                    for k, v in sorted(configs.items())
                ],
            )
            log.info("created topic %s: %d partition(s) over brokers %s", topic.name, count, dict(plan.partitions))
            await cluster.wait_for_leaders(topic.name, plan.topic_id, range(count), millis(body.timeout))
        except TidelogError as exc:
            result.update(error_code=exc.kafka_error_code, error_message=str(exc))

    # --- DeleteTopics -----------------------------------------------------------------------------------------

    async def handle_delete_topics(self, request: Request, connection: Connection) -> Response:
        body = request.body
        engine = self.engine
        if request.api_version >= 6:
            if self.cluster is not None:
                by_id = {t.topic_id: name for name, t in self.cluster.cache.view.topics.items()}
            else:
                by_id = {d.topic_id: name for name, d in engine.topics().items()}
            names = [t.name if t.name is not None else by_id.get(uuid_to_kafka(t.topic_id), "") for t in body.topics]
        else:
            names = list(body.topic_names)
        responses = []
        for name in names:
            result: dict[str, Any] = {"name": name, "error_code": 0, "error_message": None}
            if not self.authorizer.authorize(connection, Operation.DELETE, ResourceType.TOPIC, name):
                result.update(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, error_message="Authorization failed.")
                responses.append(result)
                continue
            try:
                if not self.config.delete_topic_enable:
                    raise TopicDeletionDisabledError("topic deletion is disabled (delete.topic.enable=false)")
                if name in INTERNAL_TOPICS:
                    raise InvalidTopicError(f"the internal topic {name} cannot be deleted")
                if self.cluster is not None:  # the brokers' caches delete their replicas and the offsets
                    cluster_topic = self.cluster.cache.view.topics.get(name)
                    if cluster_topic is not None:
                        result["topic_id"] = cluster_topic.topic_id
                    await self.cluster.delete_topic(name, millis(body.timeout))
                    log.info("deleted topic %s from the cluster", name)
                else:
                    description = engine.topics().get(name)
                    if description is not None:
                        result["topic_id"] = description.topic_id
                    await self.admin.run(engine.delete_topic, name)
                    await self.on_topic_deleted(name)
            except TidelogError as exc:
                result.update(error_code=exc.kafka_error_code, error_message=str(exc))
            responses.append(result)
        return {"throttle_time": 0, "responses": responses}

    # --- CreatePartitions, DeleteRecords ----------------------------------------------------------------------

    async def handle_create_partitions(self, request: Request, connection: Connection) -> Response:
        body = request.body
        engine = self.engine
        results = []
        budget = [MAX_NEW_PARTITIONS_PER_REQUEST]
        for topic in body.topics:
            result: dict[str, Any] = {"name": topic.name, "error_code": 0, "error_message": None}
            results.append(result)
            if not self.authorizer.authorize(connection, Operation.ALTER, ResourceType.TOPIC, topic.name):
                result.update(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, error_message="Authorization failed.")
                continue
            try:
                if topic.name in INTERNAL_TOPICS:
                    raise InvalidTopicError(f"the internal topic {topic.name} cannot get more partitions")
                if self.cluster is not None:
                    await self._create_cluster_partitions(self.cluster, topic, body, budget)
                    continue
                current = engine.topics().get(topic.name)
                if current is None:
                    raise UnknownTopicOrPartitionError(f"topic {topic.name!r} does not exist")
                if topic.count <= current.partitions:
                    raise InvalidPartitionsError(
                        f"topic {topic.name} has {current.partitions} partitions; {topic.count} is not more"
                    )
                if not body.validate_only:
                    _take_partition_budget(budget, topic.name, topic.count - current.partitions)
                    await self.admin.run(engine.create_partitions, topic.name, topic.count)
            except TidelogError as exc:
                result.update(error_code=exc.kafka_error_code, error_message=str(exc))
        return {"throttle_time": 0, "results": results}

    async def _create_cluster_partitions(
        self, cluster: ClusterTopics, topic: Any, body: Any, budget: list[int]
    ) -> None:
        assignments = None if topic.assignments is None else [list(a.broker_ids) for a in topic.assignments]
        current, added = cluster.plan_partitions(topic.name, topic.count, assignments)
        if body.validate_only:
            return
        _take_partition_budget(budget, topic.name, len(added))
        await cluster.add_partitions(current, added)
        log.info("topic %s: added partitions %s", topic.name, dict(added))
        await cluster.wait_for_leaders(topic.name, current.topic_id, sorted(added), millis(body.timeout))

    async def handle_delete_records(self, request: Request, connection: Connection) -> Response:
        engine = self.engine
        topics = []
        for topic in request.body.topics:
            partitions = []
            authorized = self.authorizer.authorize(connection, Operation.DELETE, ResourceType.TOPIC, topic.name)
            for partition in topic.partitions:
                result: dict[str, Any] = {
                    "partition_index": partition.partition_index,
                    "low_watermark": -1,
                    "error_code": 0,
                }
                if not authorized:
                    result["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    partitions.append(result)
                    continue
                try:
                    if topic.name in INTERNAL_TOPICS:  # Kafka's answer: the internal topics are the brokers' to trim
                        raise InvalidTopicError(f"Cannot delete records of internal topic {topic.name}")
                    if self.cluster is not None:
                        self.cluster.cache.check_leader(topic.name, partition.partition_index)
                    partition_log = engine.partition(topic.name, partition.partition_index)
                    offset = partition_log.high_watermark if partition.offset == -1 else partition.offset
                    result["low_watermark"] = partition_log.delete_records(offset)
                except TidelogError as exc:
                    result["error_code"] = exc.kafka_error_code
                partitions.append(result)
            topics.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}
