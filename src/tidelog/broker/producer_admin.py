"""DescribeProducers (61, v0): the idempotent producers each partition's log knows (KIP-664), as Kafka 3.9 answers.

Contract: per topic READ on the topic is needed (else each partition asked for is TOPIC_AUTHORIZATION_FAILED); per
partition the answer comes from the leader's log (in a cluster, elsewhere NOT_LEADER_OR_FOLLOWER; an unknown
partition UNKNOWN_TOPIC_OR_PARTITION) and lists every producer its idempotence state holds (the storage's
`active_producers`: producers whose state has not expired after producer.id.expiration.ms): id, epoch, the last
sequence and timestamp it wrote, and - with no transactions yet - coordinator epoch -1 and no open transaction
(current_txn_start_offset -1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, LeaderCheck, Response
from tidelog.errors import ErrorCode, TidelogError
from tidelog.protocol.messages import ApiKey, Request

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.storage.api import StorageEngine


class ProducerApis:
    def __init__(self, engine: StorageEngine, authorizer: Authorizer, check_leader: LeaderCheck | None = None) -> None:
        self.engine = engine
        self.authorizer = authorizer
        self.check_leader = check_leader  # a cluster's: only the leader answers for a partition

    def handlers(self) -> HandlerTable:
        return {ApiKey.DESCRIBE_PRODUCERS: ApiHandler(0, 0, self.handle_describe_producers)}

    async def handle_describe_producers(self, request: Request, connection: Connection) -> Response:
        topics = []
        for topic in request.body.topics:
            authorized = self.authorizer.authorize(connection, Operation.READ, ResourceType.TOPIC, topic.name)
            partitions = [
                self._describe(topic.name, index)
                if authorized
                else _error(index, ErrorCode.TOPIC_AUTHORIZATION_FAILED, None)
                for index in topic.partition_indexes
            ]
            topics.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    def _describe(self, topic: str, index: int) -> dict[str, Any]:
        try:
            if self.check_leader is not None:
                self.check_leader(topic, index, -1)
            producers = self.engine.partition(topic, index).active_producers()
        except TidelogError as exc:
            return _error(index, exc.kafka_error_code, str(exc))
        return {
            "partition_index": index,
            "error_code": 0,
            "error_message": None,
            "active_producers": [
                {
                    "producer_id": p.producer_id,
                    "producer_epoch": p.epoch,
                    "last_sequence": p.last_sequence,
                    "last_timestamp": p.last_timestamp,
                    "coordinator_epoch": p.coordinator_epoch,
                    "current_txn_start_offset": p.current_txn_start_offset,
                }
                for p in producers
            ],
        }


def _error(index: int, code: int, message: str | None) -> dict[str, Any]:
    return {"partition_index": index, "error_code": code, "error_message": message, "active_producers": []}
