"""Broker configuration: `server.properties` with Kafka's key names, plus `--override key=value`.

Network and coordinator keys live here; storage keys (`log.dirs`, `log.segment.bytes`, ...) go to
EngineConfig. Every key of the file must be known to one of the two, with a value of the right type:
otherwise start-up stops with a ConfigError naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.config import BROKER_KEYS, INT_MAX, EngineConfig, Key, parse_bool, parse_int, parse_list
from tidelog.errors import ConfigError

LISTENER = re.compile(r"^(?P<name>[A-Z_][A-Z0-9_]*)://(?P<host>\[[^\]]*\]|[^:]*):(?P<port>[0-9]{1,5})$")

SERVER_KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        Key("listeners", parse_list),
        Key("advertised.listeners", parse_list),
        Key("socket.request.max.bytes", parse_int, minimum=1),
        Key("auto.create.topics.enable", parse_bool),
        Key("delete.topic.enable", parse_bool),
        Key("group.min.session.timeout.ms", parse_int, minimum=0),
        Key("group.max.session.timeout.ms", parse_int, minimum=0),
        Key("group.initial.rebalance.delay.ms", parse_int, minimum=0),
        Key("offsets.topic.num.partitions", parse_int, minimum=1),
        Key("offsets.retention.minutes", parse_int, minimum=1, maximum=INT_MAX),  # Kafka: type INT
        Key("offsets.retention.check.interval.ms", parse_int, minimum=1),
        Key("producer.id.expiration.ms", parse_int, minimum=1),
        Key("tidelog.metrics.port", parse_int, minimum=-1, maximum=65535),
        Key("tidelog.shutdown.timeout.ms", parse_int, minimum=0),
    ]
}


@dataclass(frozen=True)
class Listener:
    name: str
    host: str
    port: int

    @classmethod
    def parse(cls, key: str, text: str) -> Listener:
        match = LISTENER.match(text)
        if match is None:
            raise ConfigError(f"config {key}: {text!r} is not a listener of the form NAME://host:port")
        if match["name"] != "PLAINTEXT":
            raise ConfigError(f"config {key}: listener {match['name']} is not supported yet (only PLAINTEXT)")
        host = match["host"].strip("[]") or "0.0.0.0"
        port = int(match["port"])
        if port > 65535:
            raise ConfigError(f"config {key}: port {port} of {text!r} is above 65535")
        return cls(match["name"], host, port)


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
    offsets_retention_ms: int = 7 * 24 * 3_600_000
    offsets_retention_check_interval_ms: int = 600_000
    producer_id_expiration_ms: int = 86_400_000
    metrics_port: int = -1
    shutdown_timeout_ms: int = 30_000
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def node_id(self) -> int:
        return self.engine.node_id

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> BrokerConfig:
        server: dict[str, Any] = {}
        storage: dict[str, Any] = {}
        for name, raw in settings.items():
            key = SERVER_KEYS.get(name)
            if key is not None:
                server[name] = key.convert(raw)
            elif name in BROKER_KEYS:
                storage[name] = raw
            else:
                raise ConfigError(f"unknown config key {name!r}")
        listeners = tuple(Listener.parse("listeners", text) for text in server.get("listeners", []))
        advertised = server.get("advertised.listeners")
        defaults = cls()
        return cls(
            listeners=listeners or defaults.listeners,
            advertised_listeners=tuple(Listener.parse("advertised.listeners", t) for t in advertised)
            if advertised
            else None,
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
            offsets_retention_ms=server.get("offsets.retention.minutes", defaults.offsets_retention_ms // 60_000)
            * 60_000,
            offsets_retention_check_interval_ms=server.get(
                "offsets.retention.check.interval.ms", defaults.offsets_retention_check_interval_ms
            ),
            producer_id_expiration_ms=server.get("producer.id.expiration.ms", defaults.producer_id_expiration_ms),
            metrics_port=server.get("tidelog.metrics.port", defaults.metrics_port),
            shutdown_timeout_ms=server.get("tidelog.shutdown.timeout.ms", defaults.shutdown_timeout_ms),
            engine=EngineConfig.from_mapping(storage, log_dir=defaults.engine.log_dirs[0]),
        )

    def advertised_for(self, listener: Listener, bound_port: int) -> tuple[str, int]:
        """Host and port clients are told to use for `listener` (bound_port resolves port 0)."""
        for advertised in self.advertised_listeners or ():
            if advertised.name == listener.name:
                return advertised.host, advertised.port
        host = listener.host if listener.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return host, bound_port
