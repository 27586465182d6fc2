"""The cluster's znodes, in Kafka's ZooKeeper-mode layout and JSON (Kafka 2.x-3.x, `kafka.zk.ZkData`).

An operator who knows a Kafka cluster in ZooKeeper mode finds the same tree with `zkCli.sh`:

    /cluster/id             persistent  {"version":"1","id":"<22-char Kafka Uuid>"}
    /brokers/ids/<id>       ephemeral   {"version":5,"host":"h","port":9092,"jmx_port":-1,"timestamp":"<ms>",
                                         "endpoints":["PLAINTEXT://h:9092"],
                                         "listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},
                                         "features":{}, "rack":"r1" (only with broker.rack)}
    /controller             ephemeral   {"version":1,"brokerid":1,"timestamp":"<ms>"}
    /controller_epoch       persistent  "<epoch>", the decimal text of an integer; each new controller adds one

`host` and `port` repeat the PLAINTEXT endpoint for old tools (null and -1 without one), as Kafka writes them.
The ephemeral nodes belong to the broker's ZooKeeper session: when the session ends (the broker died or stopped
answering for zookeeper.session.timeout.ms) ZooKeeper removes them, which is how the others learn of it.
A znode that does not decode raises MalformedZnodeError naming the path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog.errors import TidelogError

CLUSTER_ID_PATH = "/cluster/id"
BROKER_IDS_PATH = "/brokers/ids"
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
# Persistent paths a Kafka cluster has from its first start (KafkaZkClient.createTopLevelPaths).
PERSISTENT_PATHS = (
    "/brokers/ids",
    "/brokers/topics",
    "/brokers/seqid",
    "/config/topics",
    "/config/changes",
    "/config/brokers",
    "/admin/delete_topics",
    "/isr_change_notification",
    "/latest_producer_id_block",
    "/log_dir_event_notification",
)
BROKER_REGISTRATION_VERSION = 5
CONTROLLER_VERSION = 1


class MalformedZnodeError(TidelogError):
    """A znode's data is not what Kafka's layout says it holds."""


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS_PATH}/{broker_id}"


def _decode_object(path: str, data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedZnodeError(f"znode {path}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise MalformedZnodeError(f"znode {path}: expected a JSON object, got {data[:80]!r}")
    return value


def _encode(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Endpoint:
    listener: str  # the listener name, e.g. PLAINTEXT or CLIENT
    host: str
    port: int
    protocol: str  # its security protocol

    def url(self) -> str:
        return f"{self.listener}://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None = None
    timestamp_ms: int = 0

    def endpoint(self, listener: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.listener == listener), None)

    def encode(self) -> bytes:
        plaintext = next((e for e in self.endpoints if e.protocol == "PLAINTEXT"), None)
        value: dict[str, Any] = {
            "features": {},
            "listener_security_protocol_map": {e.listener: e.protocol for e in self.endpoints},
            "endpoints": [e.url() for e in self.endpoints],
            "jmx_port": -1,
            "port": plaintext.port if plaintext else -1,
            "host": plaintext.host if plaintext else None,
            "version": BROKER_REGISTRATION_VERSION,
            "timestamp": str(self.timestamp_ms),
        }
        if self.rack is not None:
            value["rack"] = self.rack
        return _encode(value)

    @classmethod
    def decode(cls, broker_id: int, data: bytes) -> BrokerRegistration:
        path = broker_path(broker_id)
        value = _decode_object(path, data)
        protocols = value.get("listener_security_protocol_map") or {}
        endpoints = []
        for url in value.get("endpoints", []):
            name, sep, address = str(url).partition("://")
            host, _, port = address.rpartition(":")
            if not sep or not port.isdigit():
                raise MalformedZnodeError(f"znode {path}: endpoint {url!r} is not NAME://host:port")
            endpoints.append(Endpoint(name, host.strip("[]"), int(port), str(protocols.get(name, name))))
        if not endpoints:
            raise MalformedZnodeError(f"znode {path}: no endpoints")
        rack = value.get("rack")
        timestamp = str(value.get("timestamp", "0"))
        return cls(broker_id, tuple(endpoints), rack if isinstance(rack, str) else None, int(timestamp or 0))


def encode_controller(broker_id: int, timestamp_ms: int) -> bytes:
    return _encode({"version": CONTROLLER_VERSION, "brokerid": broker_id, "timestamp": str(timestamp_ms)})


def decode_controller(data: bytes) -> int:
    """The id of the broker the /controller znode names."""
    value = _decode_object(CONTROLLER_PATH, data)
    broker_id = value.get("brokerid")
    if not isinstance(broker_id, int):
        raise MalformedZnodeError(f"znode {CONTROLLER_PATH}: no integer brokerid in {data[:80]!r}")
    return broker_id


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_controller_epoch(data: bytes) -> int:
    try:
        return int(data.decode())
    except (UnicodeDecodeError, ValueError):
        raise MalformedZnodeError(f"znode {CONTROLLER_EPOCH_PATH}: {data[:40]!r} is not an integer") from None


def encode_cluster_id(cluster_id: str) -> bytes:
    return _encode({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    value = _decode_object(CLUSTER_ID_PATH, data)
    cluster_id = value.get("id")
    if not isinstance(cluster_id, str) or not cluster_id:
        raise MalformedZnodeError(f"znode {CLUSTER_ID_PATH}: no id in {data[:80]!r}")
    return cluster_id


def sorted_broker_ids(children: Sequence[str]) -> list[int]:
    """The ids under /brokers/ids (children that are not integers are ignored, as Kafka does)."""
    return sorted(int(child) for child in children if child.isdigit())
