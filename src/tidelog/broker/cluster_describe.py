"""DescribeCluster (60, v0-v1): the cluster id, the controller and the live brokers (KIP-700), as a Kafka 3.9 broker
answers it.

Contract: the brokers and the controller are Metadata's (topics.py): this broker alone on a single broker, else
the cluster's live brokers at their address for the listener the client came in on, with their racks, and the
elected controller (-1 while there is none). v1's endpoint_type must be BROKERS (1): CONTROLLERS (2) is
MISMATCHED_ENDPOINT_TYPE (a broker is no KRaft controller), another number UNSUPPORTED_ENDPOINT_TYPE (v0 cannot ask
for either). With include_cluster_authorized_operations the answer carries the client's operations on the cluster
as a bit field (0 if it may not DESCRIBE the cluster), else Integer.MIN_VALUE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import CLUSTER_NAME, Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.protocol.messages import ApiKey, Request

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.topics import TopicApis
    from tidelog.storage.api import StorageEngine

ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS = 1, 2
INVALID_REQUEST, MISMATCHED_ENDPOINT_TYPE, UNSUPPORTED_ENDPOINT_TYPE = 42, 114, 115
AUTHORIZED_OPERATIONS_OMITTED = -(1 << 31)


class DescribeClusterApis:
    def __init__(self, engine: StorageEngine, topics: TopicApis, authorizer: Authorizer) -> None:
        self.engine = engine
        self.topics = topics
        self.authorizer = authorizer

    def handlers(self) -> HandlerTable:
        return {ApiKey.DESCRIBE_CLUSTER: ApiHandler(0, 1, self.handle_describe_cluster)}

    async def handle_describe_cluster(self, request: Request, connection: Connection) -> Response:
        body = request.body
        answer: dict[str, Any] = {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": None,
            "endpoint_type": ENDPOINT_BROKERS,
            "cluster_id": self.engine.cluster_id,
            "controller_id": -1,
            "brokers": [],
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }
        endpoint_type = getattr(body, "endpoint_type", ENDPOINT_BROKERS)
        if endpoint_type != ENDPOINT_BROKERS:
            known = endpoint_type == ENDPOINT_CONTROLLERS
            code = MISMATCHED_ENDPOINT_TYPE if known else UNSUPPORTED_ENDPOINT_TYPE
            answer["error_code"] = code if request.api_version >= 1 else INVALID_REQUEST
            answer["error_message"] = (
                "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type CONTROLLER"
                if known
                else f"Unsupported endpoint type {endpoint_type}"
            )
            return answer
        if body.include_cluster_authorized_operations:
            authorizer = self.authorizer
            answer["cluster_authorized_operations"] = (
                authorizer.authorized_operations(connection, ResourceType.CLUSTER, CLUSTER_NAME)
                if authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.CLUSTER, log_denied=False)
                else 0
            )
        answer["controller_id"] = self.topics.controller_id()
        answer["brokers"] = [
            {"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"]}
            for b in self.topics.brokers(connection)
        ]
        return answer
