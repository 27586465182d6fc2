"""Broker configuration: `server.properties` with Kafka's key names, plus `--override key=value`.

Network and coordinator keys live here (with `tidelog.metrics.port`/`tidelog.metrics.host` for the Prometheus
endpoint); storage keys (`log.dirs`, `log.segment.bytes`, ...) go to EngineConfig. Every key of the file must be
known to one of the two, with a value of the right type: otherwise start-up stops with a ConfigError naming the key
(and the file and line that set it). SERVER_KEYS declares each key with its default and description, which
docs/configuration.md shows (`make docs-config`).

Security uses Kafka's keys (README.md, Security): a listener's name maps to its security protocol
(PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) through `listener.security.protocol.map`, which by default maps each
of the four names to itself; `sasl.enabled.mechanisms`; the PEM `ssl.keystore.*`/`ssl.truststore.*` keys and
`ssl.client.auth`; ACLs are enforced when `authorizer.class.name` names Kafka's ACL authorizer, with
`allow.everyone.if.no.acl.found` and `super.users`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.config import (
    BROKER_KEYS,
    INT_MAX,
    VALUE_TYPES,
    EngineConfig,
    Key,
    located,
    parse_bool,
    parse_int,
    parse_list,
    parse_str,
    select,
)
from tidelog.errors import ConfigError

LISTENER = re.compile(r"^(?P<name>[A-Z_][A-Z0-9_]*)://(?P<host>\[[^\]]*\]|[^:]*):(?P<port>[0-9]{1,5})$")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = {protocol: protocol for protocol in SECURITY_PROTOCOLS}
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# authorizer.class.name values that turn on the built-in ACL authorizer (Kafka's KRaft and ZooKeeper-era names).
ACL_AUTHORIZERS = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer", "kafka.security.authorizer.AclAuthorizer")


def parse_principals(key: str, raw: Any) -> frozenset[str]:
    """`User:admin;User:bob` (Kafka separates super.users with semicolons)."""
    principals = [p.strip() for p in parse_str(key, raw).split(";") if p.strip()]
    for principal in principals:
        kind, sep, name = principal.partition(":")
        if not sep or not kind or not name:
            raise ConfigError(f"config {key}: {principal!r} is not a principal of the form User:name")
    return frozenset(principals)


def parse_host(key: str, raw: Any) -> str:
    """A host name or address to bind: not empty, and one the resolver accepts (a label over 63 characters is not)."""
    host = parse_str(key, raw).strip("[]")
    if not host:
        raise ConfigError(f"config {key}: a host name or address is needed")
    try:
        host.encode("idna")
    except UnicodeError as exc:
        raise ConfigError(f"config {key}: {host!r} is not a valid host name ({exc})") from None
    return host


VALUE_TYPES.update({parse_principals: "principals", parse_host: "host"})

# The server-side assignors of the consumer group protocol, and Kafka 3.9's class names for them
CONSUMER_ASSIGNORS = (
    "uniform",
    "range",
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor",
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor",
)
ASSIGNOR_CLASSES = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range",
}

SERVER_KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        Key(
            "listeners",
            parse_list,
            default="PLAINTEXT://127.0.0.1:9092",
            valid="`NAME://host:port`, comma-separated",
            doc="Where the broker listens; an empty host binds every interface, port `0` a free port.",
        ),
        Key(
            "advertised.listeners",
            parse_list,
            valid="`NAME://host:port`, comma-separated",
            doc="The address clients are given for each listener name; unset: the listener's own (127.0.0.1 for "
            "a wildcard bind).",
        ),
        Key(
            "socket.request.max.bytes",
            parse_int,
            minimum=1,
            default="104857600",
            doc="Largest request a client may send; a larger one closes its connection.",
        ),
        Key(
            "auto.create.topics.enable",
            parse_bool,
            default="true",
            doc="Create an unknown topic (`num.partitions` partitions) when a client's metadata request asks for it.",
        ),
        Key("delete.topic.enable", parse_bool, default="true", doc="Whether DeleteTopics requests may delete topics."),
        Key(
            "group.min.session.timeout.ms",
            parse_int,
            minimum=0,
            default="6000",
            doc="Shortest session timeout a consumer-group member may ask for.",
        ),
        Key(
            "group.max.session.timeout.ms",
            parse_int,
            minimum=0,
            default="1800000",
            doc="Longest session timeout a consumer-group member may ask for.",
        ),
        Key(
            "group.initial.rebalance.delay.ms",
            parse_int,
            minimum=0,
            default="3000",
            doc="How long the first rebalance of an empty group waits for more members to join.",
        ),
        Key(
            "group.consumer.session.timeout.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="45000",
            doc="Session timeout of a member of the consumer group protocol (KIP-848): a member that sends no "
            "ConsumerGroupHeartbeat for this long is removed. Between `group.consumer.min.session.timeout.ms` and "
            "`group.consumer.max.session.timeout.ms`.",
        ),
        Key(
            "group.consumer.min.session.timeout.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="45000",
            doc="Lower bound of `group.consumer.session.timeout.ms`.",
        ),
        Key(
            "group.consumer.max.session.timeout.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="60000",
            doc="Upper bound of `group.consumer.session.timeout.ms`.",
        ),
        Key(
            "group.consumer.heartbeat.interval.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="5000",
            doc="How often a member of the consumer group protocol is told to heartbeat; below "
            "`group.consumer.session.timeout.ms`, between the min and max heartbeat intervals.",
        ),
        Key(
            "group.consumer.min.heartbeat.interval.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="5000",
            doc="Lower bound of `group.consumer.heartbeat.interval.ms`.",
        ),
        Key(
            "group.consumer.max.heartbeat.interval.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="15000",
            doc="Upper bound of `group.consumer.heartbeat.interval.ms`.",
        ),
        Key(
            "group.consumer.max.size",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default=str(INT_MAX),
            doc="Most members a group of the consumer protocol may have; one more gets GROUP_MAX_SIZE_REACHED.",
        ),
        Key(
            "group.consumer.assignors",
            parse_list,
            choices=CONSUMER_ASSIGNORS,
            default="uniform,range",
            valid="`uniform`, `range` (or Kafka's class names of them), comma-separated",
            doc="The server-side assignors of the consumer group protocol; the first is used when the members name "
            "none (`group.remote.assignor` in librdkafka).",
        ),
        Key(
            "offsets.topic.num.partitions",
            parse_int,
            minimum=1,
            default="50",
            doc="Partitions of `__consumer_offsets`, where committed offsets are kept (read when it is created).",
        ),
        Key(
            "offsets.topic.segment.bytes",
            parse_int,
            minimum=14,
            maximum=INT_MAX,  # as segment.bytes allows
            default="104857600",
            doc="`segment.bytes` of `__consumer_offsets`.",
        ),
        Key(
            "offsets.retention.minutes",
            parse_int,
            minimum=1,
            maximum=INT_MAX,  # Kafka: type INT
            default="10080",
            doc="An empty group's committed offsets expire this long after their commit or the group becoming "
            "empty, whichever is later.",
        ),
        Key(
            "offsets.retention.check.interval.ms",
            parse_int,
            minimum=1,
            default="600000",
            doc="How often expired committed offsets are removed.",
        ),
        Key(
            "producer.id.expiration.ms",
            parse_int,
            minimum=1,
            default="86400000",
            doc="Accepted for compatibility with Kafka's files; not applied (idempotent-producer state is kept).",
        ),
        Key(
            "max.incremental.fetch.session.cache.slots",
            parse_int,
            minimum=0,
            default="1000",
            doc="Incremental fetch sessions (KIP-227) the broker keeps; a fetcher that finds no slot sends full "
            "requests. Followers always use them.",
        ),
        Key(
            "tidelog.metrics.port",
            parse_int,
            minimum=-1,
            maximum=65535,
            default="-1",
            doc="Port of the Prometheus endpoint (`/metrics`); `-1`: no endpoint, `0`: a free port, logged at start.",
        ),
        Key(
            "tidelog.metrics.host",
            parse_host,
            default="127.0.0.1",
            valid="a host name or address",
            doc="Address the metrics endpoint binds.",
        ),
        Key(
            "tidelog.shutdown.timeout.ms",
            parse_int,
            minimum=0,
            default="30000",
            doc="On SIGTERM or Ctrl-C, how long in-flight requests may take before their connections are closed.",
        ),
        # cluster (ZooKeeper mode, as Kafka 3.x ran it)
        Key(
            "zookeeper.connect",
            parse_str,
            valid="`host:port[,host:port...][/chroot]`",
            doc="The ZooKeeper ensemble that coordinates the cluster; unset: a single broker, no ZooKeeper.",
        ),
        Key(
            "zookeeper.session.timeout.ms",
            parse_int,
            minimum=1,
            default="18000",
            doc="ZooKeeper session timeout: a broker that stops answering for this long leaves the cluster.",
        ),
        Key(
            "zookeeper.connection.timeout.ms",
            parse_int,
            minimum=1,
            doc="How long the broker waits to connect to ZooKeeper at start; unset: zookeeper.session.timeout.ms.",
        ),
        Key(
            "quota.window.num",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="11",
            doc="Client quotas: the number of samples a client's rate is measured over (docs/quotas.md).",
        ),
        Key(
            "quota.window.size.seconds",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="1",
            doc="Client quotas: the time span of each sample.",
        ),
        Key(
            "broker.rack",
            parse_str,
            doc="The broker's rack, for rack-aware replica placement and reads from the nearest replica (KIP-392).",
        ),
        Key(
            "replica.selector.class",
            parse_str,
            choices=("org.apache.kafka.common.replica.RackAwareReplicaSelector",),
            doc="KIP-392: with Kafka's rack-aware selector a consumer whose `client.rack` is a RocketMQ slave's "
            "`broker.rack` is sent to read from that slave (needs `tidelog.rocketmq.slaveReadEnable`); unset: "
            "consumers read from the leader.",
        ),
        Key(
            "default.replication.factor",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="1",
            doc="In a cluster: the replicas of a topic created with replication factor -1 or auto-created.",
        ),
        Key(
            "transaction.state.log.num.partitions",
            parse_int,
            minimum=1,
            default="50",
            doc="Partitions of `__transaction_state`, where the transaction coordinator keeps each transactional "
            "id's state (read when it is created).",
        ),
        Key(
            "transaction.state.log.segment.bytes",
            parse_int,
            minimum=14,
            maximum=INT_MAX,
            default="104857600",
            doc="`segment.bytes` of `__transaction_state`.",
        ),
        Key(
            "transaction.state.log.replication.factor",
            parse_int,
            minimum=1,
            maximum=32767,
            default="3",
            doc="In a cluster: the replicas of `__transaction_state` (at most the live brokers when the first "
            "transactional producer creates it).",
        ),
        Key(
            "transaction.state.log.min.isr",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="2",
            doc="In a cluster: `min.insync.replicas` of `__transaction_state` (at most its replication factor).",
        ),
        Key(
            "transaction.max.timeout.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="900000",
            doc="The longest `transaction.timeout.ms` a producer may ask for; InitProducerId with a longer one gets "
            "INVALID_TRANSACTION_TIMEOUT.",
        ),
        Key(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="10000",
            doc="How often the coordinator looks for transactions open longer than their timeout, and aborts them.",
        ),
        Key(
            "transactional.id.expiration.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="604800000",
            doc="A transactional id with no transaction open and no request for this long is forgotten.",
        ),
        Key(
            "transaction.partition.verification.enable",
            parse_bool,
            default="true",
            doc="Whether a partition leader verifies a producer's transactional batch with the transaction "
            "coordinator before appending it (KIP-890 part 1): a partition not added to the producer's ongoing "
            "transaction is answered INVALID_TXN_STATE and nothing is appended. In a cluster the leader asks a "
            "coordinator on another broker once per transaction and partition (AddPartitionsToTxn v4 `verify_only`). "
            "Static here (dynamic in Kafka).",
        ),
        Key(
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            parse_int,
            minimum=1,
            maximum=INT_MAX,
            default="3600000",
            doc="How often the coordinator looks for expired transactional ids.",
        ),
        Key(
            "offsets.topic.replication.factor",
            parse_int,
            minimum=1,
            maximum=32767,
            default="3",
            doc="In a cluster: the replicas of `__consumer_offsets` (at most the live brokers when the first "
            "group creates it).",
        ),
        Key(
            "controlled.shutdown.enable",
            parse_bool,
            default="true",
            doc="In a cluster: on SIGTERM or Ctrl-C, ask the controller to move this broker's leadership to other "
            "in-sync replicas (and take it out of every ISR) before it stops serving.",
        ),
        Key(
            "controlled.shutdown.max.retries",
            parse_int,
            minimum=0,
            default="3",
            doc="In a cluster: how many times a stopping broker asks again while the controller answers partitions it "
            "could not move (or cannot be reached); then it stops anyway.",
        ),
        Key(
            "controlled.shutdown.retry.backoff.ms",
            parse_int,
            minimum=0,
            default="5000",
            doc="In a cluster: the pause between two controlled shutdown attempts.",
        ),
        Key(
            "auto.leader.rebalance.enable",
            parse_bool,
            default="true",
            doc="In a cluster: the controller moves leadership back to each partition's preferred replica (the first "
            "of its assignment) when that broker's share of partitions led by others passes "
            "leader.imbalance.per.broker.percentage.",
        ),
        Key(
            "leader.imbalance.check.interval.seconds",
            parse_int,
            minimum=1,
            default="300",
            doc="In a cluster: how often the controller checks the leader imbalance.",
        ),
        Key(
            "leader.imbalance.per.broker.percentage",
            parse_int,
            minimum=0,
            maximum=100,
            default="10",
            doc="In a cluster: the percentage of a broker's preferred partitions led elsewhere above which the "
            "controller moves their leadership back.",
        ),
        Key(
            "inter.broker.listener.name",
            parse_str,
            doc="In a cluster: the listener followers fetch from their leaders on (a `PLAINTEXT` one); unset: the "
            "first `PLAINTEXT` listener.",
        ),
        Key(
            "replica.lag.time.max.ms",
            parse_int,
            minimum=1,
            default="30000",
            doc="In a cluster: a follower that has not caught up with its leader's log end for this long leaves the "
            "ISR; one that catches up joins it again.",
        ),
        Key(
            "num.replica.fetchers",
            parse_int,
            minimum=1,
            maximum=64,
            default="1",
            doc="In a cluster: fetchers per leader broker, each copying its share of the partitions that broker leads.",
        ),
        Key(
            "replica.fetch.max.bytes",
            parse_int,
            minimum=0,
            maximum=INT_MAX,
            default="1048576",
            doc="In a cluster: bytes a follower asks for per partition in one Fetch (at least one whole batch).",
        ),
        Key(
            "replica.fetch.response.max.bytes",
            parse_int,
            minimum=0,
            maximum=INT_MAX,
            default="10485760",
            doc="In a cluster: bytes a follower asks for in all in one Fetch.",
        ),
        Key(
            "replica.fetch.wait.max.ms",
            parse_int,
            minimum=0,
            default="500",
            doc="In a cluster: how long a follower's Fetch waits at the leader for new data.",
        ),
        Key(
            "replica.fetch.backoff.ms",
            parse_int,
            minimum=0,
            default="1000",
            doc="In a cluster: how long a follower waits after a failed Fetch before it tries again.",
        ),
        Key(
            "replica.socket.timeout.ms",
            parse_int,
            minimum=1,
            default="30000",
            doc="In a cluster: how long a follower waits for its leader's answer before it connects again.",
        ),
        # security
        Key(
            "listener.security.protocol.map",
            parse_list,
            default="PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            valid="`NAME:PROTOCOL`, comma-separated; PROTOCOL one of "
            + ", ".join(f"`{p}`" for p in SECURITY_PROTOCOLS),
            doc="The security protocol of each listener name.",
        ),
        Key(
            "sasl.enabled.mechanisms",
            parse_list,
            choices=SASL_MECHANISMS,
            default="SCRAM-SHA-256,SCRAM-SHA-512",
            doc="SASL mechanisms offered on `SASL_PLAINTEXT` and `SASL_SSL` listeners (Kafka's default GSSAPI is not "
            "available).",
        ),
        Key(
            "sasl.server.max.receive.size",
            parse_int,
            minimum=1,
            default="524288",
            doc="Largest request accepted from a connection that has not authenticated yet.",
        ),
        Key(
            "connection.failed.authentication.delay.ms",
            parse_int,
            minimum=0,
            default="100",
            doc="Delay before a failed authentication is answered, to slow password guessing.",
        ),
        Key("ssl.keystore.type", parse_str, choices=("PEM",), default="PEM", doc="Format of `ssl.keystore.location`."),
        Key(
            "ssl.keystore.location",
            parse_str,
            valid="a file path",
            doc="PEM file with the private key and certificate chain; needed by `SSL` and `SASL_SSL` listeners.",
        ),
        Key(
            "ssl.keystore.password",
            parse_str,
            valid="refused",
            doc="Refused: a PEM keystore has no store password (`ssl.key.password` decrypts an encrypted key).",
        ),
        Key("ssl.key.password", parse_str, doc="Password of the private key in `ssl.keystore.location`, if encrypted."),
        Key(
            "ssl.truststore.type",
            parse_str,
            choices=("PEM",),
            default="PEM",
            doc="Format of `ssl.truststore.location`.",
        ),
        Key(
            "ssl.truststore.location",
            parse_str,
            valid="a file path",
            doc="PEM CA certificates that client certificates must chain to (for `ssl.client.auth` `requested` or "
            "`required`).",
        ),
        Key(
            "ssl.truststore.password",
            parse_str,
            valid="refused",
            doc="Refused: a PEM truststore has no password.",
        ),
        Key(
            "ssl.client.auth",
            parse_str,
            choices=("none", "requested", "required"),
            default="none",
            doc="Whether TLS clients are asked for, or must present, a certificate.",
        ),
        Key(
            "ssl.enabled.protocols",
            parse_list,
            choices=("TLSv1.2", "TLSv1.3"),
            default="TLSv1.2,TLSv1.3",
            doc="TLS versions accepted.",
        ),
        Key(
            "ssl.cipher.suites",
            parse_list,
            valid="OpenSSL cipher names, comma-separated",
            doc="Cipher suites allowed; unset: OpenSSL's defaults.",
        ),
        Key(
            "authorizer.class.name",
            parse_str,
            valid=" or ".join(f"`{name}`" for name in ACL_AUTHORIZERS),
            doc="Naming Kafka's ACL authorizer turns ACLs on; unset: every authenticated client may do everything.",
        ),
        Key(
            "allow.everyone.if.no.acl.found",
            parse_bool,
            default="false",
            doc="With ACLs on, allow every principal access to a resource that has no ACL.",
        ),
        Key(
            "super.users",
            parse_principals,
            valid="`User:name`, separated by `;`",
            doc="Principals that ACLs never deny.",
        ),
    ]
}


@dataclass(frozen=True)
class Listener:
    name: str
    host: str
    port: int
    protocol: str = "PLAINTEXT"  # its security protocol, from listener.security.protocol.map

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @classmethod
    def parse(cls, key: str, text: str, protocol_map: Mapping[str, str] = DEFAULT_PROTOCOL_MAP) -> Listener:
        match = LISTENER.match(text)
        if match is None:
            raise ConfigError(f"config {key}: {text!r} is not a listener of the form NAME://host:port")
        protocol = protocol_map.get(match["name"])
        if protocol is None:
            raise ConfigError(
                f"config {key}: listener {match['name']} has no security protocol in listener.security.protocol.map"
            )
        host = match["host"].strip("[]") or "0.0.0.0"
        port = int(match["port"])
        if port > 65535:
            raise ConfigError(f"config {key}: port {port} of {text!r} is above 65535")
        try:
            host.encode("idna")  # what the resolver does at bind; a label over 63 characters fails there
        except UnicodeError as exc:
            raise ConfigError(f"config {key}: host {host!r} of {text!r} is not a valid host name ({exc})") from None
        return cls(match["name"], host, port, protocol)


def parse_protocol_map(entries: list[str] | None) -> dict[str, str]:
    """`CLIENT:SASL_SSL,ADMIN:SSL` -> {name: protocol}; unset, each protocol's name maps to itself."""
    if entries is None:
        return dict(DEFAULT_PROTOCOL_MAP)
    mapping = {}
    for entry in entries:
        name, sep, protocol = entry.partition(":")
        if not sep or not LISTENER.match(f"{name.strip()}://h:0") or protocol.strip() not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"config listener.security.protocol.map: {entry!r} is not NAME:PROTOCOL with PROTOCOL one of "
                f"{', '.join(SECURITY_PROTOCOLS)}"
            )
        mapping[name.strip()] = protocol.strip()
    return mapping


@dataclass(frozen=True)
class SecurityConfig:
    """Authentication (SASL, TLS) and authorization (ACLs) settings, with Kafka's defaults except where noted."""

    sasl_enabled_mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512")  # Kafka: GSSAPI (unsupported)
    sasl_server_max_receive_size: int = 524_288
    failed_authentication_delay_ms: int = 100
    ssl_keystore_location: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_truststore_location: str | None = None
    ssl_client_auth: str = "none"
    ssl_enabled_protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")
    ssl_cipher_suites: tuple[str, ...] = ()
    authorizer_class_name: str = ""
    allow_everyone_if_no_acl_found: bool = False
    super_users: frozenset[str] = frozenset()

    @property
    def acls_enabled(self) -> bool:
        return bool(self.authorizer_class_name)

    @classmethod
    def from_server_keys(cls, server: Mapping[str, Any], listeners: tuple[Listener, ...]) -> SecurityConfig:
        defaults = cls()
        for key in ("ssl.keystore.password", "ssl.truststore.password"):
            if key in server:
                raise ConfigError(
                    f"config {key}: a PEM store has no store password (use ssl.key.password for an encrypted key)"
                )
        authorizer = server.get("authorizer.class.name", "")
        if authorizer and authorizer not in ACL_AUTHORIZERS:
            raise ConfigError(
                f"config authorizer.class.name: {authorizer!r} is not available; tidelog has Kafka's ACL authorizer, "
                f"named {' or '.join(ACL_AUTHORIZERS)}"
            )
        config = cls(
            sasl_enabled_mechanisms=tuple(server.get("sasl.enabled.mechanisms", defaults.sasl_enabled_mechanisms)),
            sasl_server_max_receive_size=server.get(
                "sasl.server.max.receive.size", defaults.sasl_server_max_receive_size
            ),
            failed_authentication_delay_ms=server.get(
                "connection.failed.authentication.delay.ms", defaults.failed_authentication_delay_ms
            ),
            ssl_keystore_location=server.get("ssl.keystore.location") or None,
            ssl_key_password=server.get("ssl.key.password") or None,
            ssl_truststore_location=server.get("ssl.truststore.location") or None,
            ssl_client_auth=server.get("ssl.client.auth", defaults.ssl_client_auth),
            ssl_enabled_protocols=tuple(server.get("ssl.enabled.protocols", defaults.ssl_enabled_protocols)),
            ssl_cipher_suites=tuple(server.get("ssl.cipher.suites", ())),
            authorizer_class_name=authorizer,
            allow_everyone_if_no_acl_found=server.get(
                "allow.everyone.if.no.acl.found", defaults.allow_everyone_if_no_acl_found
            ),
            super_users=server.get("super.users", defaults.super_users),
        )
        tls = [listener.name for listener in listeners if listener.tls]
        if tls and not config.ssl_keystore_location:
            raise ConfigError(
                f"config ssl.keystore.location: listener {tls[0]} (listeners) uses TLS and needs a PEM keystore"
            )
        if tls and config.ssl_client_auth != "none" and not config.ssl_truststore_location:
            raise ConfigError(
                f"config ssl.truststore.location: ssl.client.auth={config.ssl_client_auth} needs the CA certificates "
                "that client certificates chain to"
            )
        return config


@dataclass(frozen=True)
class ReplicationConfig:
    """What a broker of a cluster needs to copy its leaders' logs and to judge its followers (Kafka's names)."""

    inter_broker_listener_name: str | None = None
    replica_lag_time_max_ms: int = 30_000
    num_replica_fetchers: int = 1
    replica_fetch_max_bytes: int = 1_048_576
    replica_fetch_response_max_bytes: int = 10_485_760
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_backoff_ms: int = 1_000
    replica_socket_timeout_ms: int = 30_000

    @classmethod
    def from_server_keys(cls, server: Mapping[str, Any]) -> ReplicationConfig:
        defaults = cls()
        return cls(
            **{name: server.get(name.replace("_", "."), getattr(defaults, name)) for name in cls.__dataclass_fields__}
        )


@dataclass(frozen=True)
class QuotaConfig:
    """How client quotas are measured (quotas.py): `quota.window.num` samples of `quota.window.size.seconds`."""

    quota_window_num: int = 11
    quota_window_size_seconds: int = 1

    @classmethod
    def from_server_keys(cls, server: Mapping[str, Any]) -> QuotaConfig:
        defaults = cls()
        return cls(
            **{name: server.get(name.replace("_", "."), getattr(defaults, name)) for name in cls.__dataclass_fields__}
        )


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """The consumer group protocol's settings (KIP-848; Kafka's names), checked against each other as Kafka does."""

    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_min_session_timeout_ms: int = 45_000
    group_consumer_max_session_timeout_ms: int = 60_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_min_heartbeat_interval_ms: int = 5_000
    group_consumer_max_heartbeat_interval_ms: int = 15_000
    group_consumer_max_size: int = INT_MAX
    group_consumer_assignors: tuple[str, ...] = ("uniform", "range")

    @classmethod
    def from_server_keys(cls, server: Mapping[str, Any]) -> ConsumerGroupConfig:
        defaults = cls()
        values = {
            name: server.get(name.replace("_", "."), getattr(defaults, name)) for name in cls.__dataclass_fields__
        }
        # Kafka's class names stand for the same assignors
        values["group_consumer_assignors"] = tuple(
            dict.fromkeys(ASSIGNOR_CLASSES.get(a, a) for a in values["group_consumer_assignors"])
        )
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        """Kafka's KafkaConfig requirements; a ConfigError naming the key otherwise."""
        if self.group_consumer_max_session_timeout_ms < self.group_consumer_min_session_timeout_ms:
            raise ConfigError(
                "config group.consumer.max.session.timeout.ms: must be at least group.consumer.min.session.timeout.ms"
            )
        if not (
            self.group_consumer_min_session_timeout_ms
            <= self.group_consumer_session_timeout_ms
            <= self.group_consumer_max_session_timeout_ms
        ):
            raise ConfigError(
                "config group.consumer.session.timeout.ms: must be between group.consumer.min.session.timeout.ms and "
                "group.consumer.max.session.timeout.ms"
            )
        if self.group_consumer_max_heartbeat_interval_ms < self.group_consumer_min_heartbeat_interval_ms:
            raise ConfigError(
                "config group.consumer.max.heartbeat.interval.ms: must be at least "
                "group.consumer.min.heartbeat.interval.ms"
            )
        if not (
            self.group_consumer_min_heartbeat_interval_ms
            <= self.group_consumer_heartbeat_interval_ms
            <= self.group_consumer_max_heartbeat_interval_ms
        ):
            raise ConfigError(
                "config group.consumer.heartbeat.interval.ms: must be between group.consumer.min.heartbeat.interval.ms "
                "and group.consumer.max.heartbeat.interval.ms"
            )
        if self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms:
            raise ConfigError(
                "config group.consumer.heartbeat.interval.ms: must be less than group.consumer.session.timeout.ms"
            )


@dataclass(frozen=True)
class TransactionConfig:
    """The transaction coordinator's keys (Kafka's names)."""

    transaction_state_log_num_partitions: int = 50
    transaction_state_log_segment_bytes: int = 104_857_600
    transaction_state_log_replication_factor: int = 3
    transaction_state_log_min_isr: int = 2
    transaction_max_timeout_ms: int = 900_000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    transactional_id_expiration_ms: int = 604_800_000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    transaction_partition_verification_enable: bool = True

    @classmethod
    def from_server_keys(cls, server: Mapping[str, Any]) -> TransactionConfig:
        defaults = cls()
        return cls(
            **{name: server.get(name.replace("_", "."), getattr(defaults, name)) for name in cls.__dataclass_fields__}
        )


@dataclass(frozen=True)
class LeadershipConfig:
    """Where the leadership of partitions goes when a broker stops and comes back (Kafka's names)."""

    controlled_shutdown_enable: bool = True
    controlled_shutdown_max_retries: int = 3
    controlled_shutdown_retry_backoff_ms: int = 5_000
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_seconds: int = 300
    leader_imbalance_per_broker_percentage: int = 10

    @classmethod
    def from_server_keys(cls, server: Mapping[str, Any]) -> LeadershipConfig:
        defaults = cls()
        return cls(
            **{name: server.get(name.replace("_", "."), getattr(defaults, name)) for name in cls.__dataclass_fields__}
        )


@dataclass(frozen=True)
class BrokerConfig:
    listeners: tuple[Listener, ...] = (Listener("PLAINTEXT", "127.0.0.1", 9092),)
    advertised_listeners: tuple[Listener, ...] | None = None
    socket_request_max_bytes: int = 104_857_600
    auto_create_topics_enable: bool = True
    delete_topic_enable: bool = True
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 3_000
    offsets_topic_num_partitions: int = 50
    offsets_topic_segment_bytes: int = 104_857_600
    offsets_retention_ms: int = 7 * 24 * 3_600_000
    offsets_retention_check_interval_ms: int = 600_000
    producer_id_expiration_ms: int = 86_400_000
    max_incremental_fetch_session_cache_slots: int = 1_000
    metrics_port: int = -1  # -1: no metrics endpoint; 0: an ephemeral port (logged at start)
    metrics_host: str = "127.0.0.1"
    shutdown_timeout_ms: int = 30_000
    zookeeper_connect: str | None = None
    zookeeper_session_timeout_ms: int = 18_000
    zookeeper_connection_timeout_ms: int | None = None
    broker_rack: str | None = None
    replica_selector_class: str | None = None
    default_replication_factor: int = 1
    offsets_topic_replication_factor: int = 3
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    leadership: LeadershipConfig = field(default_factory=LeadershipConfig)
    transactions: TransactionConfig = field(default_factory=TransactionConfig)
    quotas: QuotaConfig = field(default_factory=QuotaConfig)
    consumer_groups: ConsumerGroupConfig = field(default_factory=ConsumerGroupConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # The keys as the file and --override gave them (DescribeConfigs' STATIC_BROKER_CONFIG; the base that dynamic
    # broker configs are laid over, tidelog.broker.dynamic_config). Not compared: equal configs are equal values.
    static_settings: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def node_id(self) -> int:
        return self.engine.node_id

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> BrokerConfig:
        server: dict[str, Any] = {}
        storage: list[str] = []
        for name, raw in settings.items():
            key = SERVER_KEYS.get(name)
            if key is not None:
                try:
                    server[name] = key.convert(raw)
                except ConfigError as exc:
                    raise located(settings, name, exc) from None
            elif name in BROKER_KEYS:
                storage.append(name)
            else:
                raise located(settings, name, ConfigError(f"unknown config key {name!r}"))
        try:
            protocols = parse_protocol_map(server.get("listener.security.protocol.map"))
        except ConfigError as exc:
            raise located(settings, "listener.security.protocol.map", exc) from None
        try:
            listeners = tuple(Listener.parse("listeners", text, protocols) for text in server.get("listeners", []))
            if len({listener.name for listener in listeners}) != len(listeners):
                raise ConfigError("config listeners: each listener needs its own name")
        except ConfigError as exc:
            raise located(settings, "listeners", exc) from None
        advertised = server.get("advertised.listeners")
        try:
            advertised_listeners = (
                tuple(Listener.parse("advertised.listeners", t, protocols) for t in advertised) if advertised else None
            )
        except ConfigError as exc:
            raise located(settings, "advertised.listeners", exc) from None
        defaults = cls()
        listeners = listeners or defaults.listeners
        try:
            if server.get("zookeeper.connect") is not None:  # a single broker replicates nothing
                inter_broker_listener(listeners, server.get("inter.broker.listener.name"))
        except ConfigError as exc:
            raise located(settings, "inter.broker.listener.name", exc) from None
        try:
            security = SecurityConfig.from_server_keys(server, listeners)
        except ConfigError as exc:  # "config KEY: ..."
            raise located(settings, str(exc).removeprefix("config ").partition(":")[0], exc) from None
        try:
            consumer_groups = ConsumerGroupConfig.from_server_keys(server)
        except ConfigError as exc:
            raise located(settings, str(exc).removeprefix("config ").partition(":")[0], exc) from None
        return cls(
            listeners=listeners,
            advertised_listeners=advertised_listeners,
            socket_request_max_bytes=server.get("socket.request.max.bytes", defaults.socket_request_max_bytes),
            auto_create_topics_enable=server.get("auto.create.topics.enable", defaults.auto_create_topics_enable),
            delete_topic_enable=server.get("delete.topic.enable", defaults.delete_topic_enable),
            group_min_session_timeout_ms=server.get(
                "group.min.session.timeout.ms", defaults.group_min_session_timeout_ms
            ),
            group_max_session_timeout_ms=server.get(
                "group.max.session.timeout.ms", defaults.group_max_session_timeout_ms
            ),
            group_initial_rebalance_delay_ms=server.get(
                "group.initial.rebalance.delay.ms", defaults.group_initial_rebalance_delay_ms
            ),
            offsets_topic_num_partitions=server.get(
                "offsets.topic.num.partitions", defaults.offsets_topic_num_partitions
            ),
            offsets_topic_segment_bytes=server.get("offsets.topic.segment.bytes", defaults.offsets_topic_segment_bytes),
            offsets_retention_ms=server.get("offsets.retention.minutes", defaults.offsets_retention_ms // 60_000)
            * 60_000,
            offsets_retention_check_interval_ms=server.get(
                "offsets.retention.check.interval.ms", defaults.offsets_retention_check_interval_ms
            ),
            producer_id_expiration_ms=server.get("producer.id.expiration.ms", defaults.producer_id_expiration_ms),
            max_incremental_fetch_session_cache_slots=server.get(
                "max.incremental.fetch.session.cache.slots", defaults.max_incremental_fetch_session_cache_slots
            ),
            metrics_port=server.get("tidelog.metrics.port", defaults.metrics_port),
            metrics_host=server.get("tidelog.metrics.host", defaults.metrics_host),
            shutdown_timeout_ms=server.get("tidelog.shutdown.timeout.ms", defaults.shutdown_timeout_ms),
            zookeeper_connect=server.get("zookeeper.connect"),
            zookeeper_session_timeout_ms=server.get(
                "zookeeper.session.timeout.ms", defaults.zookeeper_session_timeout_ms
            ),
            zookeeper_connection_timeout_ms=server.get("zookeeper.connection.timeout.ms"),
            broker_rack=server.get("broker.rack"),
            replica_selector_class=server.get("replica.selector.class"),
            default_replication_factor=server.get("default.replication.factor", defaults.default_replication_factor),
            offsets_topic_replication_factor=server.get(
                "offsets.topic.replication.factor", defaults.offsets_topic_replication_factor
            ),
            replication=ReplicationConfig.from_server_keys(server),
            leadership=LeadershipConfig.from_server_keys(server),
            transactions=TransactionConfig.from_server_keys(server),
            quotas=QuotaConfig.from_server_keys(server),
            consumer_groups=consumer_groups,
            engine=EngineConfig.from_mapping(select(settings, storage), log_dir=defaults.engine.log_dirs[0]),
            security=security,
            static_settings={name: _setting_text(raw) for name, raw in settings.items()},
        )

    @property
    def inter_broker_listener(self) -> Listener:
        """The listener other brokers' followers fetch from (checked when the config was read)."""
        return inter_broker_listener(self.listeners, self.replication.inter_broker_listener_name)

    def advertised_for(self, listener: Listener, bound_port: int) -> tuple[str, int]:
        """Host and port clients are told to use for `listener` (bound_port resolves port 0)."""
        for advertised in self.advertised_listeners or ():
            if advertised.name == listener.name:
                return advertised.host, advertised.port
        host = listener.host if listener.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return host, bound_port


def _setting_text(raw: Any) -> str:
    """A setting as a properties file spells it (`true`, not Python's `True`; lists comma-separated)."""
    if isinstance(raw, bool):
        return str(raw).lower()
    if isinstance(raw, list | tuple):
        return ",".join(map(str, raw))
    return str(raw)


def inter_broker_listener(listeners: tuple[Listener, ...], name: str | None) -> Listener:
    """The listener named `name`, else the first PLAINTEXT one. Replication between brokers speaks PLAINTEXT only
    for now: a named listener with TLS or SASL is refused here rather than failing at every fetch."""
    if name is None:
        chosen = next((listener for listener in listeners if listener.protocol == "PLAINTEXT"), None)
        if chosen is None:
            raise ConfigError(
                "config inter.broker.listener.name: no PLAINTEXT listener for the brokers' replication; add one to "
                "`listeners` (it may listen on 127.0.0.1 only)"
            )
        return chosen
    chosen = next((listener for listener in listeners if listener.name == name), None)
    if chosen is None:
        raise ConfigError(f"config inter.broker.listener.name: {name!r} is not one of the listeners")
    if chosen.protocol != "PLAINTEXT":
        raise ConfigError(
            f"config inter.broker.listener.name: listener {name} uses {chosen.protocol}; replication between "
            "brokers speaks PLAINTEXT only for now"
        )
    return chosen
