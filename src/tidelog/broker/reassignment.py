"""Moving partition replicas between brokers: AlterPartitionReassignments and ListPartitionReassignments (KIP-455,
as Kafka 2.4+ served them in ZooKeeper mode; docs/cluster.md, "Moving replicas").

- **AlterPartitionReassignments** (API key 45, v0): per partition the target replicas, or null to cancel the
  partition's ongoing reassignment. Every broker serves it: the controller starts each reassignment on its own
  thread (`Controller.alter_reassignments`: the topic znode's replicas, adding_replicas and removing_replicas, in
  one conditional write per topic); any other broker forwards the request unchanged to the controller's inter-broker
  listener and passes its answer on - the same RPC as ElectLeaders (leadership.py), where Kafka's ZooKeeper mode
  also kept the older `/admin/reassign_partitions` znode, which tidelog does not watch. A forwarded request reaching
  a broker that is no longer the controller is answered NOT_CONTROLLER, never forwarded again. Per partition:
  UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (an empty list, a broker twice, a broker that is not
  live; and always with the RocketMQ engine, whose replicas cannot move), NO_REASSIGNMENT_IN_PROGRESS (a cancel of
  nothing). The answer comes once each started partition shows its reassignment in this broker's metadata cache
  (REQUEST_TIMED_OUT for it past the request's timeout: the reassignment still goes ahead). The move itself is the
  controller's passes' (controller.py): the answer says it started, ListPartitionReassignments when it is done.
- **ListPartitionReassignments** (API key 46, v0): the partitions being reassigned (all, or those named; unknown
  or idle ones left out, as Kafka answers) with their replicas, adding and removing replicas, answered from this
  broker's metadata cache, which reads the same topic znodes the controller writes.

With ACLs on, AlterPartitionReassignments needs ALTER on the cluster, ListPartitionReassignments DESCRIBE.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.cluster_metadata import ClusterView
from tidelog.broker.controller import TopicPartition
from tidelog.broker.controller_requests import PartitionResults, ask_controller, wait_until_visible
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.errors import ErrorCode, NotControllerError, TidelogError
from tidelog.protocol.messages import ApiKey, Request, millis

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.cluster_membership import ClusterMembership
    from tidelog.broker.cluster_metadata import MetadataCache
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.controller import Controller

VERSION = 0  # both APIs have only v0
FORWARDED_CLIENT_ID = "tidelog-forwarded-reassignment"  # a request forwarded once is never forwarded again

Targets = dict[TopicPartition, tuple[int, ...] | None]  # None: cancel
Results = PartitionResults


class ReassignmentApis:
    def __init__(
        self,
        config: BrokerConfig,
        authorizer: Authorizer,
        membership: ClusterMembership,
        cache: MetadataCache,
        controller: Controller,
        *,
        replicates: bool,
    ) -> None:
        self.config = config
        self.authorizer = authorizer
        self.membership = membership
        self.cache = cache
        self.controller = controller
        self.replicates = replicates  # the Kafka engine: replicas can move (the RocketMQ engine's cannot)

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.ALTER_PARTITION_REASSIGNMENTS: ApiHandler(VERSION, VERSION, self.handle_alter),
            ApiKey.LIST_PARTITION_REASSIGNMENTS: ApiHandler(VERSION, VERSION, self.handle_list),
        }

    # --- AlterPartitionReassignments --------------------------------------------------------------------------

    async def handle_alter(self, request: Request, connection: Connection) -> Response:
        body = request.body
        targets: Targets = {
            (t.name, int(p.partition_index)): None if p.replicas is None else tuple(int(r) for r in p.replicas)
            for t in body.topics
            for p in t.partitions
        }
        timeout_ms = millis(body.timeout)
        if not self.authorizer.authorize(connection, Operation.ALTER, ResourceType.CLUSTER):
            denied: Results = {tp: (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None) for tp in targets}
            return _alter_response(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None, denied)
        if not self.replicates:
            message = (
                "the RocketMQ engine (tidelog.storage.engine=rocketmq) keeps one replica of each partition, which "
                "cannot move between brokers: reassigning partitions needs the Kafka engine"
            )
            return _alter_response(
                ErrorCode.NONE, None, {tp: (ErrorCode.INVALID_REPLICA_ASSIGNMENT, message) for tp in targets}
            )
        try:
            results = await self._alter(targets, request.client_id, timeout_ms)
        except TidelogError as exc:
            return _alter_response(exc.kafka_error_code, str(exc), {})
        await self._wait_until_visible(targets, results, timeout_ms)
        return _alter_response(ErrorCode.NONE, None, results)

    async def _alter(self, targets: Targets, client_id: str | None, timeout_ms: int) -> Results:
        controller = self.controller
        if controller.active:
            future = controller.submit(lambda w: controller.alter_reassignments(w, targets))
            return {tp: (int(code), message) for tp, (code, message) in (await asyncio.wrap_future(future)).items()}
        if client_id == FORWARDED_CLIENT_ID:
            raise NotControllerError(f"broker {self.config.node_id} is not the controller")
        return await self._forward(targets, timeout_ms)

    async def _forward(self, targets: Targets, timeout_ms: int) -> Results:
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), replicas in sorted(targets.items()):
            topics.setdefault(topic, []).append({"partition_index": partition, "replicas": replicas})
        body = {"timeout": timeout_ms, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
        answer = await ask_controller(
            self.config, self.membership, ApiKey.ALTER_PARTITION_REASSIGNMENTS, VERSION, body, FORWARDED_CLIENT_ID
        )
        return {
            (topic.name, int(result.partition_index)): (int(result.error_code), result.error_message)
            for topic in answer.responses
            for result in topic.partitions
        }

    async def _wait_until_visible(self, targets: Targets, results: Results, timeout_ms: int) -> None:
        """Wait until every partition started (or cancelled) shows it here; past the timeout, REQUEST_TIMED_OUT."""

        def visible(view: ClusterView, key: TopicPartition) -> bool:
            partition = view.partition(*key)
            if partition is None:
                return False
            target = targets.get(key)
            return not partition.adding if target is None else partition.target_replicas == target

        await wait_until_visible(self.cache, results, visible, timeout_ms, "reassignment")

    # --- ListPartitionReassignments ---------------------------------------------------------------------------

    async def handle_list(self, request: Request, connection: Connection) -> Response:
        body = request.body
        if not self.authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.CLUSTER):
            return _list_response(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, [])
        view = self.cache.view
        wanted: Sequence[TopicPartition] = (
            [(name, p.partition) for name, topic in sorted(view.topics.items()) for p in topic.partitions]
            if body.topics is None
            else [(t.name, int(index)) for t in body.topics for index in t.partition_indexes]
        )
        ongoing = []
        for name, index in wanted:
            partition = view.partition(name, index)
            if partition is not None and partition.reassigning:
                ongoing.append(partition)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for partition in ongoing:
            by_topic.setdefault(partition.topic, []).append(
                {
                    "partition_index": partition.partition,
                    "replicas": list(partition.replicas),
                    "adding_replicas": list(partition.adding),
                    "removing_replicas": list(partition.removing),
                }
            )
        return _list_response(ErrorCode.NONE, [{"name": t, "partitions": ps} for t, ps in by_topic.items()])


def _alter_response(
    error_code: int, message: str | None, results: Mapping[TopicPartition, tuple[int, str | None]]
) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), (code, partition_message) in sorted(results.items()):
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "error_code": code, "error_message": partition_message if code else None}
        )
    return {
        "throttle_time": 0,
        "error_code": error_code,
        "error_message": message,
        "responses": [{"name": topic, "partitions": partitions} for topic, partitions in by_topic.items()],
    }


def _list_response(error_code: int, topics: list[dict[str, Any]]) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": error_code, "error_message": None, "topics": topics}
