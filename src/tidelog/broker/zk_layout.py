"""The cluster's znodes, in Kafka's ZooKeeper-mode layout and JSON (Kafka 2.x-3.x, `kafka.zk.ZkData`).

An operator who knows a Kafka cluster in ZooKeeper mode finds the same tree with `zkCli.sh`:

    /cluster/id             persistent  {"version":"1","id":"<22-char Kafka Uuid>"}
    /brokers/ids/<id>       ephemeral   {"version":5,"host":"h","port":9092,"jmx_port":-1,"timestamp":"<ms>",
                                         "endpoints":["PLAINTEXT://h:9092"],
                                         "listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},
                                         "features":{}, "rack":"r1" (only with broker.rack)}
    /controller             ephemeral   {"version":1,"brokerid":1,"timestamp":"<ms>"}
    /controller_epoch       persistent  "<epoch>", the decimal text of an integer; each new controller adds one
    /brokers/topics/<t>     persistent  {"version":3,"partitions":{"0":[1,2,3],...},"topic_id":"<Kafka Uuid>",
                                         "adding_replicas":{},"removing_replicas":{}}
                                        the replica assignment: partition -> broker ids, the first the preferred
                                        leader (Kafka's TopicZNode)
    /brokers/topics/<t>/partitions/<p>/state
                            persistent  {"controller_epoch":N,"leader":L,"version":1,"leader_epoch":E,"isr":[...]}
                                        written by the controller only, each write checked against /controller_epoch
                                        (leader -1: no leader; TopicPartitionStateZNode)
    /config/topics/<t>      persistent  {"version":1,"config":{"retention.ms":"1000"}}, the topic's overrides, values
                                        as strings (ConfigEntityZNode)
    /config/brokers/<id>    persistent  {"version":1,"config":{"log.retention.ms":"1000"}}, broker <id>'s dynamic
                                        configs
    /config/brokers/<default>
                            persistent  the same, the cluster's default for every broker
    /config/users/<user>, /config/users/<user>/clients/<client-id>, /config/clients/<client-id>
                            persistent  {"version":1,"config":{"producer_byte_rate":"1024"}}, client quotas (names
                                        URL-encoded as Kafka's Sanitizer does, `<default>` for a default entity)
    /config/changes/config_change_<seq>
                            persistent sequential  {"version":2,"entity_path":"topics/<t>"} (or "brokers/<id>",
                                        "brokers/<default>", "users/<u>", "users/<u>/clients/<c>", "clients/<c>"): a
                                        config change notification, as Kafka's AdminZkClient writes one beside each
                                        config change (tidelog's brokers watch topic and broker config znodes
                                        themselves, and these notifications for client quotas)
    /admin/delete_topics/<t>
                            persistent  no data: the topic is marked for deletion; the controller removes the
                                        topic's znodes and then this one (DeleteTopicsTopicZNode)

    /latest_producer_id_block
                            persistent  {"version":1,"broker":2,"block_start":"1000","block_end":"1999"}, the last
                                        block of producer ids a broker reserved (ProducerIdBlockZNode; the ends
                                        inclusive, as decimal strings)

tidelog's own, for RocketMQ master/slave groups (rocketmq_groups.py; RocketMQ 5's controller keeps the same state in
its ReplicasInfoManager: SyncStateInfo and BrokerReplicaInfo):

    /tidelog/rocketmq/<brokerName>
                            persistent  {"version":1,"brokers":[1,2],"master":1,"master_epoch":3,
                                         "sync_state_set":[1,2],"sync_state_set_epoch":7,"master_role":"SYNC_MASTER",
                                         "epoch_start_offset":123456,"epochs":[[1,0],[2,5000],[3,123456]]}
                                        the group: every broker that ever joined it, the master (-1: none), the master
                                        epoch (one higher at each election), the brokers in sync with the master and
                                        that set's epoch, the master flavour a promoted slave takes, and the CommitLog
                                        offset the master's epoch began at (-1 until the master wrote it) and that
                                        of the last 100 epochs (a returning broker cuts its CommitLog at the start
                                        of the first epoch after the one its records come from); changed
                                        only with conditional writes on the znode's version
    /tidelog/rocketmq/<brokerName>/brokers/<id>
                            persistent  {"version":1,"ha_address":"127.0.0.1:10912","ha_client":null,
                                         "commitlog_end":123456,"updated_ms":1700000000000}: where the member's HA
                                        service listens (null while it serves no slave), on a slave the address of
                                        its connection to the master (how the master tells which connection is
                                        which member), and its CommitLog end, written at most once a second when it
                                        moved (`tidelog rocketmq ha-status`); liveness is /brokers/ids
    /tidelog/rocketmq/<brokerName>/topics/<topic>
                            persistent  {"version":1,"topic_id":"...","since":123456}: the CommitLog offset the
                                        master created the topic at (no message of it is older), written by the
                                        master; a slave that created the topic later dispatches its messages from
                                        there

`host` and `port` repeat the PLAINTEXT endpoint for old tools (null and -1 without one), as Kafka writes them.
The ephemeral nodes belong to the broker's ZooKeeper session: when the session ends (the broker died or stopped
answering for zookeeper.session.timeout.ms) ZooKeeper removes them, which is how the others learn of it.
A znode that does not decode raises MalformedZnodeError naming the path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import TidelogError
from tidelog.kafka_uuid import is_kafka_uuid

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
    "/config/users",
    "/config/clients",
    "/admin/delete_topics",
    "/isr_change_notification",
    "/latest_producer_id_block",
    "/log_dir_event_notification",
)
TOPICS_PATH = "/brokers/topics"
CONFIG_TOPICS_PATH = "/config/topics"
CONFIG_BROKERS_PATH = "/config/brokers"
CONFIG_CHANGES_PATH = "/config/changes"
CONFIG_CHANGE_PREFIX = "/config/changes/config_change_"
DEFAULT_BROKER_ENTITY = "<default>"  # the cluster's default broker configs (ConfigEntityName.DEFAULT)
CONFIG_CHANGE_VERSION = 2
DELETE_TOPICS_PATH = "/admin/delete_topics"
PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
PRODUCER_ID_BLOCK_VERSION = 1
BROKER_REGISTRATION_VERSION = 5
CONTROLLER_VERSION = 1
TOPIC_VERSION = 3
PARTITION_STATE_VERSION = 1
CONFIG_VERSION = 1
NO_LEADER = -1  # a partition state's leader when no replica can lead (LeaderAndIsr.NoLeader)
ROCKETMQ_GROUPS_PATH = "/tidelog/rocketmq"
ROCKETMQ_GROUP_VERSION = 1


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


# --- topics ---------------------------------------------------------------------------------------------------


def topic_path(topic: str) -> str:
    return f"{TOPICS_PATH}/{topic}"


def topic_partitions_path(topic: str) -> str:
    return f"{TOPICS_PATH}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS_PATH}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS_PATH}/{topic}/partitions/{partition}/state"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS_PATH}/{topic}"


def broker_config_path(entity: str) -> str:
    """`/config/brokers/<id>`, or `/config/brokers/<default>` for DEFAULT_BROKER_ENTITY."""
    return f"{CONFIG_BROKERS_PATH}/{entity}"


def encode_config_change(entity_path: str) -> bytes:
    """A `/config/changes/config_change_` notification for `topics/<t>` or `brokers/<id>`."""
    return _encode({"version": CONFIG_CHANGE_VERSION, "entity_path": entity_path})


def decode_config_change(path: str, data: bytes | None) -> str:
    """The entity path a `/config/changes/config_change_<seq>` notification names."""
    value = _decode_object(path, data or b"")
    entity_path = value.get("entity_path")
    if not isinstance(entity_path, str):
        raise MalformedZnodeError(f"znode {path}: entity_path is not a string: {entity_path!r}")
    return entity_path


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS_PATH}/{topic}"


def _broker_ids(path: str, what: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in value):
        raise MalformedZnodeError(f"znode {path}: {what} is not a list of broker ids: {value!r}")
    return tuple(value)


def _partition_map(path: str, what: str, value: Any) -> dict[int, tuple[int, ...]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedZnodeError(f"znode {path}: {what} is not an object: {value!r}")
    result = {}
    for key, replicas in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise MalformedZnodeError(f"znode {path}: {what} has the partition key {key!r}, not a partition number")
        result[int(key)] = _broker_ids(path, f"{what}[{key}]", replicas)
    return result


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """A topic's replica assignment, `/brokers/topics/<t>`: each partition's replicas in preference order."""

    topic: str
    topic_id: str | None
    partitions: Mapping[int, tuple[int, ...]]
    adding_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0]) if 0 in self.partitions else 0

    def encode(self) -> bytes:
        value: dict[str, Any] = {
            "version": TOPIC_VERSION,
            "partitions": {str(p): list(r) for p, r in sorted(self.partitions.items())},
        }
        if self.topic_id is not None:
            value["topic_id"] = self.topic_id
        value["adding_replicas"] = {str(p): list(r) for p, r in sorted(self.adding_replicas.items())}
        value["removing_replicas"] = {str(p): list(r) for p, r in sorted(self.removing_replicas.items())}
        return _encode(value)

    @classmethod
    def decode(cls, topic: str, data: bytes) -> TopicAssignment:
        path = topic_path(topic)
        value = _decode_object(path, data)
        version = value.get("version")
        if not isinstance(version, int) or not 1 <= version <= TOPIC_VERSION:
            raise MalformedZnodeError(f"znode {path}: unsupported version {version!r}")
        partitions = _partition_map(path, "partitions", value.get("partitions"))
        if sorted(partitions) != list(range(len(partitions))):
            raise MalformedZnodeError(f"znode {path}: partitions {sorted(partitions)} are not 0..n-1")
        topic_id = value.get("topic_id")
        if topic_id is not None and (not isinstance(topic_id, str) or not is_kafka_uuid(topic_id)):
            raise MalformedZnodeError(f"znode {path}: topic_id {topic_id!r} is not a Kafka Uuid")
        return cls(
            topic,
            topic_id,
            partitions,
            _partition_map(path, "adding_replicas", value.get("adding_replicas")),
            _partition_map(path, "removing_replicas", value.get("removing_replicas")),
        )


@dataclass(frozen=True, slots=True)
class PartitionState:
    """`/brokers/topics/<t>/partitions/<p>/state`: the leader, its epoch, the in-sync replicas, and the epoch of the
    controller that wrote it (Kafka's LeaderIsrAndControllerEpoch)."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def encode(self) -> bytes:
        return _encode(
            {
                "controller_epoch": self.controller_epoch,
                "leader": self.leader,
                "version": PARTITION_STATE_VERSION,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
            }
        )

    @classmethod
    def decode(cls, topic: str, partition: int, data: bytes) -> PartitionState:
        path = partition_state_path(topic, partition)
        value = _decode_object(path, data)
        fields = {}
        for name in ("leader", "leader_epoch", "controller_epoch"):
            number = value.get(name)
            if not isinstance(number, int) or isinstance(number, bool):
                raise MalformedZnodeError(f"znode {path}: {name} is not an integer: {number!r}")
            fields[name] = number
        return cls(
            fields["leader"],
            fields["leader_epoch"],
            _broker_ids(path, "isr", value.get("isr")),
            fields["controller_epoch"],
        )


def encode_topic_config(configs: Mapping[str, Any]) -> bytes:
    """`/config/topics/<t>`: the topic's overrides, every value as a string (Java Properties)."""
    return _encode({"version": CONFIG_VERSION, "config": {k: str(v) for k, v in sorted(configs.items())}})


def decode_topic_config(topic: str, data: bytes | None) -> dict[str, str]:
    return decode_config(topic_config_path(topic), data)


def decode_config(path: str, data: bytes | None) -> dict[str, str]:
    """A ConfigEntityZNode (`/config/topics/<t>`, `/config/brokers/<id>`): its config, values as strings."""
    if not data:
        return {}
    value = _decode_object(path, data)
    config = value.get("config", {})
    if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
        raise MalformedZnodeError(f"znode {path}: config is not an object of strings: {config!r}")
    return {str(k): v for k, v in config.items()}


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """`/latest_producer_id_block`: producer ids `start`..`end` (inclusive) reserved by broker `broker_id`."""

    broker_id: int
    start: int
    end: int

    def encode(self) -> bytes:
        return _encode(
            {
                "version": PRODUCER_ID_BLOCK_VERSION,
                "broker": self.broker_id,
                "block_start": str(self.start),
                "block_end": str(self.end),
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> ProducerIdBlock:
        value = _decode_object(PRODUCER_ID_BLOCK_PATH, data)
        try:
            return cls(int(value["broker"]), int(value["block_start"]), int(value["block_end"]))
        except (KeyError, TypeError, ValueError):
            raise MalformedZnodeError(
                f"znode {PRODUCER_ID_BLOCK_PATH}: not a producer id block: {data[:120]!r}"
            ) from None


def rocketmq_group_path(broker_name: str) -> str:
    return f"{ROCKETMQ_GROUPS_PATH}/{broker_name}"


def rocketmq_members_path(broker_name: str) -> str:
    return f"{ROCKETMQ_GROUPS_PATH}/{broker_name}/brokers"


def rocketmq_member_path(broker_name: str, broker_id: int) -> str:
    return f"{rocketmq_members_path(broker_name)}/{broker_id}"


def rocketmq_topic_path(broker_name: str, topic: str) -> str:
    return f"{rocketmq_group_path(broker_name)}/topics/{topic}"


@dataclass(frozen=True, slots=True)
class RocketMQGroup:
    """`/tidelog/rocketmq/<brokerName>`: a RocketMQ master/slave group (see the module docstring)."""

    brokers: tuple[int, ...]
    master: int
    master_epoch: int
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int
    master_role: str
    epoch_start_offset: int = -1
    epochs: tuple[tuple[int, int], ...] = ()  # (master epoch, start offset), oldest first (RocketMQ's epoch file)

    def encode(self) -> bytes:
        return _encode(
            {
                "version": ROCKETMQ_GROUP_VERSION,
                "brokers": list(self.brokers),
                "master": self.master,
                "master_epoch": self.master_epoch,
                "sync_state_set": list(self.sync_state_set),
                "sync_state_set_epoch": self.sync_state_set_epoch,
                "master_role": self.master_role,
                "epoch_start_offset": self.epoch_start_offset,
                "epochs": [list(entry) for entry in self.epochs],
            }
        )

    @classmethod
    def decode(cls, broker_name: str, data: bytes) -> RocketMQGroup:
        path = rocketmq_group_path(broker_name)
        value = _decode_object(path, data)
        numbers = {}
        for name in ("master", "master_epoch", "sync_state_set_epoch", "epoch_start_offset"):
            number = value.get(name)
            if not isinstance(number, int) or isinstance(number, bool):
                raise MalformedZnodeError(f"znode {path}: {name} is not an integer: {number!r}")
            numbers[name] = number
        role = value.get("master_role")
        if role not in ("SYNC_MASTER", "ASYNC_MASTER"):
            raise MalformedZnodeError(f"znode {path}: master_role {role!r} is not SYNC_MASTER or ASYNC_MASTER")
        epochs = value.get("epochs", [])
        if not isinstance(epochs, list) or not all(
            isinstance(entry, list)
            and len(entry) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in entry)
            for entry in epochs
        ):
            raise MalformedZnodeError(f"znode {path}: epochs is not a list of [epoch, start offset]: {epochs!r}")
        return cls(
            _broker_ids(path, "brokers", value.get("brokers")),
            numbers["master"],
            numbers["master_epoch"],
            _broker_ids(path, "sync_state_set", value.get("sync_state_set")),
            numbers["sync_state_set_epoch"],
            role,
            numbers["epoch_start_offset"],
            tuple((entry[0], entry[1]) for entry in epochs),
        )


@dataclass(frozen=True, slots=True)
class RocketMQTopic:
    """`/tidelog/rocketmq/<brokerName>/topics/<topic>`: the CommitLog offset the master created the topic at."""

    topic_id: str
    since: int

    def encode(self) -> bytes:
        return _encode({"version": ROCKETMQ_GROUP_VERSION, "topic_id": self.topic_id, "since": self.since})

    @classmethod
    def decode(cls, path: str, data: bytes) -> RocketMQTopic:
        value = _decode_object(path, data)
        topic_id, since = value.get("topic_id"), value.get("since")
        if not isinstance(topic_id, str) or not isinstance(since, int) or isinstance(since, bool):
            raise MalformedZnodeError(f"znode {path}: topic_id {topic_id!r} / since {since!r} are not a string / int")
        return cls(topic_id, since)


@dataclass(frozen=True, slots=True)
class RocketMQMember:
    """`/tidelog/rocketmq/<brokerName>/brokers/<id>`: where a member's HA service listens (None: it serves no
    slave now) and, on a slave, its HA connection's own address (as the master's connection names it); whether it
    serves consumers the group's partitions while a slave (its `slaveReadEnable`: a master sends consumers of another
    rack only to a member that does)."""

    ha_address: str | None = None
    ha_client: str | None = None
    commitlog_end: int = -1  # the member's CommitLog end when it wrote the znode (-1: not yet)
    updated_ms: int = 0  # when that was (ms since the epoch)
    serves_reads: bool = False

    def encode(self) -> bytes:
        return _encode(
            {
                "version": ROCKETMQ_GROUP_VERSION, "ha_address": self.ha_address, "ha_client": self.ha_client,
                "commitlog_end": self.commitlog_end, "updated_ms": self.updated_ms, "serves_reads": self.serves_reads,
            }
        )  # fmt: skip

    @classmethod
    def decode(cls, path: str, data: bytes) -> RocketMQMember:
        value = _decode_object(path, data)
        fields = []
        for name in ("ha_address", "ha_client"):
            text = value.get(name)
            if text is not None and not isinstance(text, str):
                raise MalformedZnodeError(f"znode {path}: {name} is not a string: {text!r}")
            fields.append(text)
        numbers = [value.get("commitlog_end", -1), value.get("updated_ms", 0)]
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
            raise MalformedZnodeError(f"znode {path}: commitlog_end / updated_ms are not integers: {numbers!r}")
        serves_reads = value.get("serves_reads", False)
        if not isinstance(serves_reads, bool):
            raise MalformedZnodeError(f"znode {path}: serves_reads is not a boolean: {serves_reads!r}")
        return cls(fields[0], fields[1], numbers[0], numbers[1], serves_reads)
