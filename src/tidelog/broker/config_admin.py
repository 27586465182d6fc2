"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs: topic configs and dynamic broker configs.

Contract (as Kafka 3.9 answers them; resource types TOPIC = 2, BROKER = 4):

- Each resource is authorized first: ALTER_CONFIGS (DESCRIBE_CONFIGS to describe) on the topic, or on the cluster
  for a broker; refused: TOPIC_AUTHORIZATION_FAILED / CLUSTER_AUTHORIZATION_FAILED. Another resource type, a broker
  resource naming another broker or no integer, a resource named twice, a key named twice in one incremental
  resource, an unknown operation or a null value in AlterConfigs: INVALID_REQUEST. An unknown topic:
  UNKNOWN_TOPIC_OR_PARTITION.
- AlterConfigs replaces the resource's whole set of overrides (dynamic configs for a broker) with the request's;
  IncrementalAlterConfigs changes the current set key by key: SET, DELETE (back to the default), and APPEND /
  SUBTRACT on list-typed keys (`cleanup.policy`, the throttled-replica lists; starting from the key's default when
  it is not set), INVALID_CONFIG for APPEND/SUBTRACT on another key.
- The new set is checked whole before anything changes: topic keys as CreateTopics checks them (an unknown key, a bad
  value, min.compaction.lag.ms above max.compaction.lag.ms: INVALID_CONFIG naming the key and why); broker keys
  must be dynamic (dynamic_config.py). With `validate_only` nothing else happens. Otherwise a topic's overrides go
  where they live: the engine's topic registry on the admin thread (the open partitions take them at once,
  `alter_topic_configs`), or in a cluster `/config/topics/<t>` and a change notification, which every broker's
  metadata cache applies; broker configs go to DynamicBrokerConfig.
- DescribeConfigs lists every topic key (or those asked for) with its value, source, synonyms (include_synonyms: the
  topic's override, then the broker keys that set its default, dynamic per broker, dynamic cluster default, static,
  default, in Kafka's order), sensitivity, read-only flag, type and documentation (include_documentation). A broker
  resource lists every broker key with its value in force (this broker's id) or the cluster's dynamic defaults
  (""); a key is read-only unless it is dynamic; password keys are sensitive and have no value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.config import SERVER_KEYS
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.config import (
    BROKER_KEYS,
    BROKER_TO_TOPIC,
    DYNAMIC_BROKER_KEYS,
    INT_MAX,
    TOPIC_KEYS,
    VALUE_TYPES,
    Key,
    LogConfig,
    parse_list,
)
from tidelog.errors import (
    ConfigError,
    ErrorCode,
    InvalidRequestError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.protocol.messages import ApiKey, Request

if TYPE_CHECKING:
    from tidelog.broker.admin import AdminExecutor
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.cluster_topics import ClusterTopics
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.dynamic_config import DynamicBrokerConfig
    from tidelog.storage.api import StorageEngine

log = logging.getLogger("tidelog.broker")

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

# DescribeConfigs' config sources (DescribeConfigsResponse.ConfigSource)
SOURCE_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

# IncrementalAlterConfigs' operations (AlterConfigOp.OpType)
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

# DescribeConfigs' config types (DescribeConfigsResponse.ConfigType)
_TYPE_IDS = {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7, "password": 9}


def config_type(key: Key) -> int:
    """Kafka's type of `key`: a long capped at Integer.MAX_VALUE is an INT there."""
    if _sensitive(key.name):
        return _TYPE_IDS["password"]
    name = VALUE_TYPES.get(key.parse, "string")
    if name == "long" and key.maximum is not None and key.maximum <= INT_MAX:
        name = "int"
    return _TYPE_IDS.get(name, _TYPE_IDS["string"])


def _sensitive(name: str) -> bool:
    return "password" in name or name.endswith("jaas.config")


def _is_list(key: Key) -> bool:
    return VALUE_TYPES.get(key.parse) == "list" or key.parse is parse_list


# Broker keys that are the same setting in other units (DynamicBrokerConfig.brokerConfigSynonyms), finest first.
_SYNONYM_GROUPS = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)
# Each topic key's broker key (ServerTopicConfigSynonyms): the finest spelling.
TOPIC_SYNONYMS = {
    topic: min((b for b, (t, _) in BROKER_TO_TOPIC.items() if t == topic), key=lambda b: BROKER_TO_TOPIC[b][1])
    for topic in {t for t, _ in BROKER_TO_TOPIC.values()}
}


def broker_synonyms(name: str) -> tuple[str, ...]:
    return next((group for group in _SYNONYM_GROUPS if name in group), (name,))


def _text(value: Any) -> str:
    """A value as Kafka's ConfigDef.convertToString writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return ",".join(value)
    return str(value)


class ConfigApis:
    def __init__(
        self,
        engine: StorageEngine,
        config: BrokerConfig,
        authorizer: Authorizer,
        admin: AdminExecutor,
        dynamic: DynamicBrokerConfig,
        cluster: ClusterTopics | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.authorizer = authorizer
        self.admin = admin
        self.dynamic = dynamic
        self.cluster = cluster  # None: a single broker, whose engine holds the topic configs

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.DESCRIBE_CONFIGS: ApiHandler(0, 4, self.handle_describe_configs),
            ApiKey.ALTER_CONFIGS: ApiHandler(0, 2, self.handle_alter_configs),
            ApiKey.INCREMENTAL_ALTER_CONFIGS: ApiHandler(0, 1, self.handle_incremental_alter_configs),
        }

    # --- AlterConfigs, IncrementalAlterConfigs -----------------------------------------------------------------

    async def handle_alter_configs(self, request: Request, connection: Connection) -> Response:
        return await self._alter(request, connection, incremental=False)

    async def handle_incremental_alter_configs(self, request: Request, connection: Connection) -> Response:
        return await self._alter(request, connection, incremental=True)

    async def _alter(self, request: Request, connection: Connection, *, incremental: bool) -> Response:
        body = request.body
        seen: dict[tuple[int, str], int] = {}
        for resource in body.resources:
            key = (resource.resource_type, resource.resource_name)
            seen[key] = seen.get(key, 0) + 1
        responses = []
        for resource in body.resources:
            result: dict[str, Any] = {
                "error_code": 0,
                "error_message": None,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
            }
            responses.append(result)
            try:
                if seen[(resource.resource_type, resource.resource_name)] > 1:
                    raise InvalidRequestError(f"Duplicate resource {resource.resource_name!r} in the request")
                if not self._authorized(connection, Operation.ALTER_CONFIGS, resource):
                    result.update(error_code=_denied(resource.resource_type), error_message="Authorization failed.")
                    continue
                await self._alter_resource(resource, incremental, body.validate_only)
            except TidelogError as exc:
                log.info("alter configs of %s %r refused: %s", resource.resource_type, resource.resource_name, exc)
                result.update(error_code=exc.kafka_error_code, error_message=str(exc))
        return {"throttle_time": 0, "responses": responses}

    def _authorized(self, connection: Connection, operation: Operation, resource: Any) -> bool:
        if resource.resource_type == RESOURCE_TOPIC:
            return self.authorizer.authorize(connection, operation, ResourceType.TOPIC, resource.resource_name)
        if resource.resource_type == RESOURCE_BROKER:
            return self.authorizer.authorize(connection, operation, ResourceType.CLUSTER)
        return True  # answered INVALID_REQUEST next

    async def _alter_resource(self, resource: Any, incremental: bool, validate_only: bool) -> None:
        name = resource.resource_name
        if resource.resource_type == RESOURCE_TOPIC:
            current = self._topic_overrides(name)
            if current is None:
                raise UnknownTopicOrPartitionError(f"Topic '{name}' does not exist.")
            new = _changed(current, resource.configs, TOPIC_KEYS, incremental)
            self.dynamic.log_defaults.with_overrides(new)  # ConfigError: INVALID_CONFIG naming the key
            if validate_only:
                return
            if self.cluster is not None:
                await self.cluster.alter_topic_config(name, new)
            else:
                await self.admin.run(self.engine.alter_topic_configs, name, new)
            log.info("topic %s: configs now %s", name, new)
        elif resource.resource_type == RESOURCE_BROKER:
            self._check_broker_name(name)
            new = _changed(self.dynamic.entity(name), resource.configs, BROKER_KEYS, incremental)
            self.dynamic.defaults_with(name, new)
            if not validate_only:
                await self.dynamic.alter(name, new)
        else:
            raise InvalidRequestError(f"Unexpected resource type {resource.resource_type} for resource {name!r}")

    def _check_broker_name(self, name: str) -> None:
        if name == "":
            return
        try:
            broker_id = int(name)
        except ValueError:
            raise InvalidRequestError(f"Broker id must be an integer, but it is: {name}") from None
        if broker_id != self.config.node_id:
            raise InvalidRequestError(f"Unexpected broker id, expected {self.config.node_id}, but received {name}")

    def _topic_overrides(self, name: str) -> Mapping[str, str] | None:
        """A topic's overrides (None: no such topic): the engine's, or in a cluster /config/topics/<t>."""
        if self.cluster is not None:
            topic = self.cluster.cache.view.topics.get(name)
            return topic.configs if topic is not None else None
        description = self.engine.topics().get(name)
        return description.configs if description is not None else None

    # --- DescribeConfigs --------------------------------------------------------------------------------------

    async def handle_describe_configs(self, request: Request, connection: Connection) -> Response:
        body = request.body
        synonyms = bool(getattr(body, "include_synonyms", False))
        documentation = bool(getattr(body, "include_documentation", False))
        results = []
        for resource in body.resources:
            result: dict[str, Any] = {
                "error_code": 0,
                "error_message": None,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
                "configs": [],
            }
            results.append(result)
            wanted = set(resource.configuration_keys) if resource.configuration_keys is not None else None
            if not self._authorized(connection, Operation.DESCRIBE_CONFIGS, resource):
                result.update(error_code=_denied(resource.resource_type), error_message="Authorization failed.")
                continue
            try:
                if resource.resource_type == RESOURCE_TOPIC:
                    overrides = self._topic_overrides(resource.resource_name)
                    if overrides is None:
                        raise UnknownTopicOrPartitionError(f"topic {resource.resource_name!r} does not exist")
                    entries = self._topic_entries(overrides, synonyms, documentation)
                elif resource.resource_type == RESOURCE_BROKER:
                    self._check_broker_name(resource.resource_name)
                    entries = self._broker_entries(resource.resource_name, synonyms, documentation)
                else:
                    raise InvalidRequestError(f"Unsupported resource type: {resource.resource_type}")
            except TidelogError as exc:
                result.update(error_code=exc.kafka_error_code, error_message=str(exc))
                continue
            result["configs"] = [entry for entry in entries if wanted is None or entry["name"] in wanted]
        if request.api_version == 0:  # v0 has is_default where later versions have config_source
            for config in (c for r in results for c in r["configs"]):
                config["is_default"] = config["config_source"] == SOURCE_DEFAULT
        return {"throttle_time": 0, "results": results}

    def _synonyms(self, name: str, names: tuple[str, ...], sensitive: bool) -> list[dict[str, Any]]:
        """Kafka's configSynonyms: each of `names` set dynamically for this broker, then as the cluster default,
        then statically, then by default; those before the first entry for `name` itself dropped."""
        dynamic = self.dynamic
        levels = (
            (dynamic.per_broker, SOURCE_DYNAMIC_BROKER),
            (dynamic.cluster_default, SOURCE_DYNAMIC_DEFAULT_BROKER),
            (dynamic.static, SOURCE_STATIC_BROKER),
            ({n: k.default for n, k in BROKER_KEYS.items() if k.default is not None}, SOURCE_DEFAULT),
        )
        found = [
            {"name": synonym, "value": None if sensitive else values[synonym], "source": source}
            for values, source in levels
            for synonym in names
            if synonym in values
        ]
        first = next((i for i, entry in enumerate(found) if entry["name"] == name), len(found))
        return found[first:]

    def _topic_entries(self, overrides: Mapping[str, str], synonyms: bool, documentation: bool) -> list[dict]:
        effective: LogConfig = self.dynamic.log_defaults.with_overrides(overrides)
        entries = []
        for name, key in sorted(TOPIC_KEYS.items()):
            value = _text(getattr(effective, name.replace(".", "_")))
            broker_key = TOPIC_SYNONYMS.get(name)
            found = self._synonyms(broker_key, broker_synonyms(broker_key), False) if broker_key else []
            if name in overrides:
                found.insert(0, {"name": name, "value": value, "source": SOURCE_TOPIC})
            entries.append(_entry(name, key, value, found, False, False, synonyms, documentation))
        return entries

    def _broker_entries(self, resource_name: str, synonyms: bool, documentation: bool) -> list[dict]:
        keys = {**SERVER_KEYS, **BROKER_KEYS}
        per_broker = resource_name != ""
        merged = self.dynamic.merged()
        names = sorted(keys) if per_broker else sorted(self.dynamic.cluster_default)
        entries = []
        for name in names:
            key = keys[name]
            sensitive = _sensitive(name)
            found = self._synonyms(name, broker_synonyms(name), sensitive)
            if not per_broker:
                found = [entry for entry in found if entry["source"] == SOURCE_DYNAMIC_DEFAULT_BROKER]
            value = merged.get(name, key.default) if per_broker else self.dynamic.cluster_default.get(name)
            read_only = name not in DYNAMIC_BROKER_KEYS
            entries.append(_entry(name, key, value, found, read_only, sensitive, synonyms, documentation))
        return entries


def _denied(resource_type: int) -> int:
    return (
        ErrorCode.TOPIC_AUTHORIZATION_FAILED
        if resource_type == RESOURCE_TOPIC
        else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    )


def _changed(current: Mapping[str, str], changes: Any, keys: Mapping[str, Key], incremental: bool) -> dict[str, str]:
    """The resource's next set of configs: the request's (AlterConfigs) or `current` changed key by key."""
    if not incremental:
        nulls = [c.name for c in changes if c.value is None]
        if nulls:
            raise InvalidRequestError(f"Null value not supported for : {','.join(nulls)}")
        return {c.name: c.value for c in changes}
    names = [c.name for c in changes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidRequestError(f"Error due to duplicate config keys: {', '.join(duplicates)}")
    new = dict(current)
    for change in changes:
        name, value, operation = change.name, change.value, change.config_operation
        if operation == OP_SET:
            if value is None:
                raise InvalidRequestError(f"Null value not supported for : {name}")
            new[name] = value
        elif operation == OP_DELETE:
            new.pop(name, None)
        elif operation in (OP_APPEND, OP_SUBTRACT):
            key = keys.get(name)
            if key is None:
                raise ConfigError(f"unknown config {name!r}")
            if not _is_list(key):
                verb = "append" if operation == OP_APPEND else "subtract"
                raise ConfigError(f"Config value {verb} is not allowed for config key: {name}")
            old = [item for item in new.get(name, key.default or "").split(",") if item]
            items = [item.strip() for item in (value or "").split(",") if item.strip()]
            if operation == OP_APPEND:
                merged = old + [item for item in items if item not in old]
            else:
                merged = [item for item in old if item not in items]
            new[name] = ",".join(merged)
        else:
            raise InvalidRequestError(f"Unknown config operation {operation} for config key {name}")
    return new


def _entry(
    name: str,
    key: Any,
    value: Any,
    found: list[dict[str, Any]],
    read_only: bool,
    sensitive: bool,
    synonyms: bool,
    documentation: bool,
) -> dict[str, Any]:
    """One DescribeConfigs entry: its source is the first synonym's (the default without any); a sensitive key's
    value is withheld."""
    return {
        "name": name,
        "value": None if sensitive else value,
        "read_only": read_only,
        "config_source": found[0]["source"] if found else SOURCE_DEFAULT,
        "is_sensitive": sensitive,
        "synonyms": found if synonyms else [],
        "config_type": config_type(key),
        "documentation": key.doc if documentation else None,
    }
