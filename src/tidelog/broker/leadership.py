"""Moving partition leadership on request in a cluster: ControlledShutdown and ElectLeaders (docs/cluster.md).

The controller (controller.py) does the moving, on its own thread; this module is how requests reach it:

- **ControlledShutdown** (API key 7, v1-v3; protocol/controlled_shutdown.py has the messages kio lacks): answered
  by the controller only (another broker answers NOT_CONTROLLER, as Kafka does). The handler hands the work to the
  controller's thread (`Controller.submit`) and awaits it: the partitions the broker still leads come back as
  `remaining_partitions` with error NONE. CLUSTER_ACTION on the cluster is required (with ACLs on).
- `shut_down_controlled` is the stopping broker's side (Broker.stop, before it stops serving): it asks the current
  controller - over the inter-broker listener with protocol/client.py's BrokerConnection, or directly when it is the
  controller itself - and asks again after `controlled.shutdown.retry.backoff.ms` while partitions remain or the
  controller cannot be reached, at most `controlled.shutdown.max.retries` more times; then it stops anyway.
- **ElectLeaders** (API key 43, v0-v2; election type 0 PREFERRED, 1 UNCLEAN; no partitions: all of them) is served
  by every broker: the controller runs the election itself; any other broker forwards the request unchanged to the
  controller's inter-broker listener (an RPC rather than Kafka's `/admin/preferred_replica_election` znode, so
  unclean elections and per-partition answers travel the same way) and passes its answer on. A forwarded request
  reaching a broker that is no longer the controller is answered NOT_CONTROLLER, never forwarded again. Each elected
  partition is then waited for (up to the request's timeout, REQUEST_TIMED_OUT past it) until the new leader shows
  in this broker's metadata cache. ALTER on the cluster is required (with ACLs on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.cluster_metadata import ClusterView
from tidelog.broker.controller import ElectionType, TopicPartition
from tidelog.broker.controller_requests import PartitionResults, ask_controller, wait_until_visible
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.errors import ErrorCode, NotControllerError, TidelogError
from tidelog.protocol.controlled_shutdown import MAX_VERSION as CONTROLLED_SHUTDOWN_MAX_VERSION
from tidelog.protocol.messages import ApiKey, Request, millis

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.cluster_membership import ClusterMembership
    from tidelog.broker.cluster_metadata import MetadataCache
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.controller import Controller

log = logging.getLogger("tidelog.cluster")

ELECT_LEADERS_VERSION = 2  # what a forwarded ElectLeaders is sent as
FORWARDED_CLIENT_ID = "tidelog-forwarded-elect-leaders"  # a request forwarded once is never forwarded again

ElectionResults = PartitionResults


class LeadershipApis:
    def __init__(
        self,
        config: BrokerConfig,
        authorizer: Authorizer,
        membership: ClusterMembership,
        cache: MetadataCache,
        controller: Controller,
    ) -> None:
        self.config = config
        self.authorizer = authorizer
        self.membership = membership
        self.cache = cache
        self.controller = controller

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.CONTROLLED_SHUTDOWN: ApiHandler(1, CONTROLLED_SHUTDOWN_MAX_VERSION, self.handle_controlled_shutdown),
            ApiKey.ELECT_LEADERS: ApiHandler(0, 2, self.handle_elect_leaders),
        }

    # --- ControlledShutdown (the controller's side) -----------------------------------------------------------

    async def handle_controlled_shutdown(self, request: Request, connection: Connection) -> Response:
        body = request.body
        if not self.authorizer.authorize(connection, Operation.CLUSTER_ACTION, ResourceType.CLUSTER):
            return {"error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "remaining_partitions": []}
        broker_id = int(body.broker_id)
        broker_epoch = int(getattr(body, "broker_epoch", -1))
        try:
            remaining = await self.move_leadership_away(broker_id, broker_epoch)
        except TidelogError as exc:
            log.info("controlled shutdown of broker %d refused: %s", broker_id, exc)
            return {"error_code": exc.kafka_error_code, "remaining_partitions": []}
        return {
            "error_code": ErrorCode.NONE,
            "remaining_partitions": [{"topic_name": t, "partition_index": p} for t, p in remaining],
        }

    async def move_leadership_away(self, broker_id: int, broker_epoch: int = -1) -> list[TopicPartition]:
        controller = self.controller
        future = controller.submit(lambda writer: controller.controlled_shutdown(writer, broker_id, broker_epoch))
        return await asyncio.wrap_future(future)

    # --- ControlledShutdown (the stopping broker's side) ------------------------------------------------------

    async def shut_down_controlled(self) -> bool:
        """Ask the controller to move this broker's leadership away, with retries (module docstring); True once
        no partition remains."""
        settings = self.config.leadership
        broker_id = self.config.node_id
        attempts = settings.controlled_shutdown_max_retries + 1
        for attempt in range(1, attempts + 1):
            controller_id = self.membership.controller_id
            try:
                if controller_id == broker_id and self.controller.active:
                    remaining = await self.move_leadership_away(broker_id, self.membership.broker_epoch)
                else:
                    remaining = await self._ask_controller()
            except (TidelogError, OSError) as exc:
                log.warning("controlled shutdown attempt %d of %d failed: %s", attempt, attempts, exc)
            else:
                if not remaining:
                    log.info("controlled shutdown succeeded (attempt %d): this broker leads no partition", attempt)
                    return True
                log.warning(
                    "controlled shutdown attempt %d of %d: %d partition(s) could not be moved: %s",
                    attempt,
                    attempts,
                    len(remaining),
                    ", ".join(f"{t}-{p}" for t, p in sorted(remaining)),
                )
            if attempt < attempts:
                await asyncio.sleep(settings.controlled_shutdown_retry_backoff_ms / 1000)
        log.warning("controlled shutdown did not complete after %d attempt(s): stopping anyway", attempts)
        return False

    async def _ask_controller(self) -> list[TopicPartition]:
        body = {"broker_id": self.config.node_id, "broker_epoch": self.membership.broker_epoch}
        answer = await ask_controller(
            self.config, self.membership, ApiKey.CONTROLLED_SHUTDOWN, CONTROLLED_SHUTDOWN_MAX_VERSION, body
        )
        return [(p.topic_name, int(p.partition_index)) for p in answer.remaining_partitions]

    # --- ElectLeaders -----------------------------------------------------------------------------------------

    async def handle_elect_leaders(self, request: Request, connection: Connection) -> Response:
        body = request.body
        requested: list[TopicPartition] | None = (
            None
            if body.topic_partitions is None
            else [(t.topic, int(p)) for t in body.topic_partitions for p in t.partitions]
        )
        election_type = int(getattr(body, "election_type", ElectionType.PREFERRED))
        timeout_ms = millis(body.timeout)
        if not self.authorizer.authorize(connection, Operation.ALTER, ResourceType.CLUSTER):
            denied: ElectionResults = {tp: (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None) for tp in requested or []}
            return _election_response(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, denied)
        if election_type not in ElectionType._value2member_map_:
            message = f"unknown election type {election_type}"
            invalid: ElectionResults = {tp: (ErrorCode.INVALID_REQUEST, message) for tp in requested or []}
            return _election_response(ErrorCode.INVALID_REQUEST, invalid)
        try:
            results = await self._elect(requested, ElectionType(election_type), request.client_id, timeout_ms)
        except TidelogError as exc:
            failed: ElectionResults = {tp: (exc.kafka_error_code, str(exc)) for tp in requested or []}
            return _election_response(exc.kafka_error_code if requested is None else ErrorCode.NONE, failed)
        await self._wait_until_visible(results, ElectionType(election_type), timeout_ms)
        return _election_response(ErrorCode.NONE, results)

    async def _elect(
        self,
        requested: list[TopicPartition] | None,
        election_type: ElectionType,
        client_id: str | None,
        timeout_ms: int,
    ) -> ElectionResults:
        controller = self.controller
        if controller.active:
            future = controller.submit(lambda w: controller.elect_leaders(w, requested, election_type))
            return {tp: (int(code), message) for tp, (code, message) in (await asyncio.wrap_future(future)).items()}
        if client_id == FORWARDED_CLIENT_ID:
            raise NotControllerError(f"broker {self.config.node_id} is not the controller")
        return await self._forward(requested, election_type, timeout_ms)

    async def _forward(
        self, requested: list[TopicPartition] | None, election_type: ElectionType, timeout_ms: int
    ) -> ElectionResults:
        topics: dict[str, list[int]] = {}
        for topic, partition in requested or []:
            topics.setdefault(topic, []).append(partition)
        body = {
            "election_type": int(election_type),
            "topic_partitions": None
            if requested is None
            else [{"topic": t, "partitions": ps} for t, ps in sorted(topics.items())],
            "timeout": timeout_ms,
        }
        answer = await ask_controller(
            self.config, self.membership, ApiKey.ELECT_LEADERS, ELECT_LEADERS_VERSION, body, FORWARDED_CLIENT_ID
        )
        return {
            (topic.topic, int(result.partition_id)): (int(result.error_code), result.error_message)
            for topic in answer.replica_election_results
            for result in topic.partition_result
        }

    async def _wait_until_visible(self, results: ElectionResults, election_type: ElectionType, timeout_ms: int) -> None:
        """Wait until every partition elected shows its new leader here; past the timeout, REQUEST_TIMED_OUT."""

        def visible(view: ClusterView, key: TopicPartition) -> bool:
            partition = view.partition(*key)
            if partition is None:
                return False
            if election_type == ElectionType.PREFERRED:
                return partition.leader == partition.replicas[0]
            return partition.leader in self.membership.live_brokers

        await wait_until_visible(self.cache, results, visible, timeout_ms, "election")


def _election_response(error_code: int, results: Mapping[TopicPartition, tuple[int, str | None]]) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), (code, message) in sorted(results.items()):
        by_topic.setdefault(topic, []).append(
            {"partition_id": partition, "error_code": code, "error_message": message if code else None}
        )
    return {
        "throttle_time": 0,
        "error_code": error_code,
        "replica_election_results": [
            {"topic": topic, "partition_result": partitions} for topic, partitions in by_topic.items()
        ],
    }
