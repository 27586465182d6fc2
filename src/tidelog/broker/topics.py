"""Metadata, CreateTopics, DeleteTopics: the cluster as clients see it.

One broker is the whole cluster: it is the controller, the leader of every partition and its only
replica. Metadata auto-creates a requested topic when both the client allows it and
`auto.create.topics.enable` is on. CreateTopics validates names, partition counts, the replication
factor (1 or -1 on a single node) and topic configs (Kafka's names) before creating anything.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tidelog.errors import (
    ConfigError,
    InvalidTopicError,
    TidelogError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.protocol.messages import ApiKey, Request, uuid_to_kafka
from tidelog.storage.kafka.engine import validate_topic_name

if TYPE_CHECKING:
    from tidelog.broker.server import ApiHandler, Broker, Connection, Response

log = logging.getLogger("tidelog.broker")

AUTHORIZED_OPERATIONS_OMITTED = -(1 << 31)
INTERNAL_TOPICS = frozenset({"__consumer_offsets"})


class InvalidReplicationFactorError(TidelogError):
    kafka_error_code = 38  # INVALID_REPLICATION_FACTOR


class TopicDeletionDisabledError(TidelogError):
    kafka_error_code = 73  # TOPIC_DELETION_DISABLED


class TopicApis:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, ApiHandler]:
        from tidelog.broker.server import ApiHandler

        return {
            ApiKey.METADATA: ApiHandler(0, 12, self.handle_metadata),
            ApiKey.CREATE_TOPICS: ApiHandler(2, 7, self.handle_create_topics),
            ApiKey.DELETE_TOPICS: ApiHandler(1, 6, self.handle_delete_topics),
        }

    # --- Metadata ---------------------------------------------------------------------------------------------

    async def handle_metadata(self, request: Request, connection: Connection) -> Response:
        body = request.body
        engine = self.broker.engine
        node_id = self.broker.config.node_id
        requested = body.topics
        if requested is None or (request.api_version == 0 and not requested):
            names = [name for name in engine.topics() if name not in INTERNAL_TOPICS]
        else:
            names = [t.name for t in requested if t.name is not None]
        allow_create = getattr(body, "allow_auto_topic_creation", True) and self.broker.config.auto_create_topics_enable
        topics = [self._describe_topic(name, allow_create, node_id) for name in names]
        return {
            "throttle_time": 0,
            "brokers": [
                {
                    "node_id": node_id,
                    "host": connection.advertised_host,
                    "port": connection.advertised_port,
                    "rack": None,
                }
            ],
            "cluster_id": engine.cluster_id,
            "controller_id": node_id,
            "topics": topics,
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    def _describe_topic(self, name: str, allow_create: bool, node_id: int) -> dict[str, Any]:
        engine = self.broker.engine
        description = engine.topics().get(name)
        if description is None and allow_create:
            try:
                validate_topic_name(name)
                description = engine.create_topic(name)
                log.info("auto-created topic %s with %d partition(s)", name, description.partitions)
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

    # --- CreateTopics -----------------------------------------------------------------------------------------

    async def handle_create_topics(self, request: Request, connection: Connection) -> Response:
        body = request.body
        engine = self.broker.engine
        results = []
        for topic in body.topics:
            result: dict[str, Any] = {
                "name": topic.name,
                "error_code": 0,
                "error_message": None,
                "num_partitions": -1,
                "replication_factor": -1,
            }
            results.append(result)
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
                engine.config.log_defaults.with_overrides(configs)
                if getattr(body, "validate_only", False):
                    count = partitions if partitions is not None else engine.config.num_partitions
                    result.update(num_partitions=count, replication_factor=1)
                    continue
                description = engine.create_topic(topic.name, partitions, configs)
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

    # --- DeleteTopics -----------------------------------------------------------------------------------------

    async def handle_delete_topics(self, request: Request, connection: Connection) -> Response:
        body = request.body
        engine = self.broker.engine
        if request.api_version >= 6:
            by_id = {d.topic_id: name for name, d in engine.topics().items()}
            names = [t.name if t.name is not None else by_id.get(uuid_to_kafka(t.topic_id), "") for t in body.topics]
        else:
            names = list(body.topic_names)
        responses = []
        for name in names:
            result: dict[str, Any] = {"name": name, "error_code": 0, "error_message": None}
            try:
                if not self.broker.config.delete_topic_enable:
                    raise TopicDeletionDisabledError("topic deletion is disabled (delete.topic.enable=false)")
                if name in INTERNAL_TOPICS:
                    raise InvalidTopicError(f"the internal topic {name} cannot be deleted")
                description = engine.topics().get(name)
                if description is not None:
                    result["topic_id"] = description.topic_id
                engine.delete_topic(name)
            except TidelogError as exc:
                result.update(error_code=exc.kafka_error_code, error_message=str(exc))
            responses.append(result)
        return {"throttle_time": 0, "responses": responses}
