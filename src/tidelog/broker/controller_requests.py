"""Requests a broker sends the controller on a client's behalf, and waiting until their effect shows here.

Contract, shared by ElectLeaders (leadership.py), AlterPartitionReassignments (reassignment.py) and ControlledShutdown:

- `ask_controller(...)`: the request goes over a fresh connection to the controller's inter-broker listener (as
  registered in `/brokers/ids/<id>`), with `client_id` naming the forwarding (a broker that gets a request with such
  a client id and is not the controller answers NOT_CONTROLLER instead of forwarding it again, so a request is
  forwarded at most once). The connection is closed after the answer. No registered listener, a connection that
  fails, or an answer whose top-level error code is not NONE: NotControllerError, which the handler answers the
  client with (a retriable error: the client asks again and finds the new controller).
- `wait_until_visible(...)`: after the controller accepted partitions, the handler waits until this broker's
  metadata cache shows the change for each of them (so a client that asks this broker next sees it), at most
  `timeout_ms`; the partitions still not showing it get REQUEST_TIMED_OUT in `results`, as Kafka answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidelog.broker.cluster_metadata import ClusterView
from tidelog.broker.controller import TopicPartition
from tidelog.errors import ErrorCode, NotControllerError
from tidelog.protocol.client import BrokerConnection, BrokerConnectionError

if TYPE_CHECKING:
    from tidelog.broker.cluster_membership import ClusterMembership
    from tidelog.broker.cluster_metadata import MetadataCache
    from tidelog.broker.config import BrokerConfig

REQUEST_TIMEOUT_S = 30.0  # Kafka's request.timeout.ms between brokers

PartitionResults = dict[TopicPartition, tuple[int, str | None]]


def controller_connection(config: BrokerConfig, membership: ClusterMembership, broker_id: int) -> BrokerConnection:
    """A connection (not yet open) to the inter-broker listener of `broker_id`, the controller; NotControllerError
    when it has no such listener registered."""
    registration = membership.live_brokers.get(broker_id)
    listener = config.inter_broker_listener.name
    endpoint = registration.endpoint(listener) if registration is not None else None
    if endpoint is None:
        raise NotControllerError(f"no controller to ask: broker {broker_id} has no registered {listener} listener")
    return BrokerConnection(endpoint.host, endpoint.port, f"tidelog-broker-{config.node_id}")


async def ask_controller(
    config: BrokerConfig,
    membership: ClusterMembership,
    api_key: int,
    version: int,
    body: dict[str, Any],
    client_id: str | None = None,
) -> Any:
    """The controller's answer to one request (see the module docstring)."""
    controller_id = membership.controller_id
    connection = controller_connection(config, membership, controller_id)
    if client_id is not None:
        connection.client_id = client_id
    try:
        answer = await connection.request(api_key, version, body, REQUEST_TIMEOUT_S)
    except BrokerConnectionError as exc:
        raise NotControllerError(f"the controller (broker {controller_id}) cannot be reached: {exc}") from exc
    finally:
        await connection.close()
    if answer.error_code != ErrorCode.NONE:
        message = getattr(answer, "error_message", None)
        raise NotControllerError(
            f"the controller (broker {controller_id}) answered error {int(answer.error_code)}"
            + (f": {message}" if message else "")
        )
    return answer


async def wait_until_visible(
    cache: MetadataCache,
    results: PartitionResults,
    visible: Callable[[ClusterView, TopicPartition], bool],
    timeout_ms: int,
    what: str,
) -> None:
    """Wait until `visible` holds here for every partition whose result is NONE (see the module docstring)."""
    accepted = [key for key, (code, _message) in results.items() if code == ErrorCode.NONE]
    if not accepted or timeout_ms <= 0:
        return
    if not await cache.wait_for(lambda view: all(visible(view, key) for key in accepted), timeout_ms / 1000):
        for key in accepted:
            if not visible(cache.view, key):
                results[key] = (ErrorCode.REQUEST_TIMED_OUT, f"the {what} was not visible within the timeout")
