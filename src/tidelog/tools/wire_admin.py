"""The Kafka-protocol side of the admin tools: requests where librdkafka's AdminClient has no call, or loses detail.

`tidelog reassign` (AlterPartitionReassignments), `tidelog consumer-groups --delete-offsets` (OffsetDelete) and
`tidelog configs` (DescribeConfigs with every synonym, IncrementalAlterConfigs, the client quota and SCRAM APIs)
speak to the brokers with the brokers' own client (protocol/client.py), so they work against any Kafka-protocol
broker that serves those API versions. A `WireAdmin` holds:

- one connection to the first broker of `--bootstrap-server` that answers (`request`);
- a connection per other broker it is asked to reach by id (`request_to`: a broker's own configs are described and
  altered on that broker, as Kafka's AdminClient does), found in a Metadata answer;
- the coordinator of a group (`request_coordinator`: FindCoordinator, then that broker).

Plaintext only (the protocol client has no TLS or SASL). A broker that fails or answers late, or a bootstrap list
none of whose brokers answers, is a ToolError; error codes inside an answer are the caller's (`error_text` names
them as Kafka does).
"""

from __future__ import annotations

from typing import Any

from tidelog.errors import ErrorCode, ToolError
from tidelog.protocol.client import BrokerConnection, BrokerConnectionError
from tidelog.protocol.messages import ApiKey

USAGE = 2
REQUEST_TIMEOUT_S = 30.0
METADATA_VERSION = 12
FIND_COORDINATOR_VERSION = 3  # one key per request; every broker since Kafka 2.0 serves it
GROUP_KEY_TYPE = 0


def error_text(code: int, message: str | None = None) -> str:
    """`GROUP_ID_NOT_FOUND: message` (the error's name, or its number when tidelog has no name for it)."""
    name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else f"error {code}"
    return f"{name}: {message}" if message else name


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ToolError(f"--bootstrap-server: {address!r} is not HOST:PORT", USAGE)
    return host.strip("[]"), int(port)


class WireAdmin:
    def __init__(self, bootstrap_server: str, client_id: str) -> None:
        self.bootstrap_server = bootstrap_server
        self.client_id = client_id
        self.connection: BrokerConnection | None = None
        self._brokers: dict[int, BrokerConnection] = {}

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """Send to the bootstrap broker; the response entity."""
        if self.connection is None:
            self.connection = await self._connect_bootstrap()
        return await self._send(self.connection, api_key, version, body)

    async def request_to(self, broker_id: int, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """Send to the broker with this id (ToolError when the cluster has no such broker)."""
        connection = self._brokers.get(broker_id)
        if connection is None:
            brokers = await self.brokers()
            if broker_id not in brokers:
                raise ToolError(f"the cluster has no broker {broker_id} (brokers: {sorted(brokers)})")
            host, port = brokers[broker_id]
            connection = await self._connect(host, port)
            self._brokers[broker_id] = connection
        return await self._send(connection, api_key, version, body)

    async def request_coordinator(self, group: str, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """Send to the coordinator of `group` (FindCoordinator first)."""
        answer = await self.request(
            ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION, {"key": group, "key_type": GROUP_KEY_TYPE}
        )
        if answer.error_code != ErrorCode.NONE:
            raise ToolError(
                f"no coordinator for group '{group}': {error_text(int(answer.error_code), answer.error_message)}"
            )
        return await self.request_to(int(answer.node_id), api_key, version, body)

    async def metadata(self, topics: list[str] | None) -> Any:
        """Metadata of `topics` (None: every topic), never creating one."""
        body = {
            "topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        }
        return await self.request(ApiKey.METADATA, METADATA_VERSION, body)

    async def brokers(self) -> dict[int, tuple[str, int]]:
        answer = await self.metadata([])
        return {int(b.node_id): (b.host, int(b.port)) for b in answer.brokers}

    async def close(self) -> None:
        for connection in [self.connection, *self._brokers.values()]:
            if connection is not None:
                await connection.close()

    async def _send(self, connection: BrokerConnection, api_key: int, version: int, body: dict[str, Any]) -> Any:
        try:
            return await connection.request(api_key, version, body, REQUEST_TIMEOUT_S)
        except BrokerConnectionError as exc:
            raise ToolError(f"the broker at {connection.address} failed: {exc}") from None

    async def _connect_bootstrap(self) -> BrokerConnection:
        failures = []
        for address in self.bootstrap_server.split(","):
            host, port = parse_address(address)
            try:
                return await self._connect(host, port)
            except ToolError as exc:
                failures.append(str(exc))
        raise ToolError(f"cannot reach a broker at {self.bootstrap_server}: {'; '.join(failures)}")

    async def _connect(self, host: str, port: int) -> BrokerConnection:
        connection = BrokerConnection(host, port, self.client_id)
        try:
            await connection.connect(REQUEST_TIMEOUT_S)
        except BrokerConnectionError as exc:
            raise ToolError(str(exc)) from None
        return connection
