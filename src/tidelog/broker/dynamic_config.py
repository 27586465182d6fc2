"""Dynamic broker configs: the broker keys AlterConfigs and IncrementalAlterConfigs change while brokers run.

Contract (Kafka's DynamicBrokerConfig, for the keys tidelog has):

- Two levels: this broker's own (resource name = its id) and the cluster's default (resource name ""), each a map
  of key -> value as text. Only `config.DYNAMIC_BROKER_KEYS` may be set (the topic defaults: `log.retention.ms`,
  `log.segment.bytes`, `log.cleanup.policy`, `log.flush.interval.*`, `message.max.bytes`, ...); any other key is
  refused with INVALID_REQUEST "Cannot update these configs dynamically: ..." (`DynamicConfigError`), a bad value
  with ConfigError (INVALID_CONFIG), and a change every topic's overrides cannot live with (min.compaction.lag.ms
  above max.compaction.lag.ms) too.
- What applies is one properties map: the static settings (server.properties and --override), the cluster's default
  laid over them, this broker's own over that, resolved as at start-up (so a `log.retention.ms` anywhere beats a
  `log.retention.hours`). Its topic defaults (`log_defaults`) go to the engine (`set_log_defaults`, on the admin
  thread: every topic without its own override follows at once) and to the listeners (the controller's unclean
  elections, the replica manager's min.insync.replicas).
- Stored where Kafka keeps them: on a single broker `tidelog-dynamic-configs.json` in the first log dir, replaced
  atomically (`{"version": 1, "default": {...}, "broker": {...}}`), read back at start; in a cluster
  `/config/brokers/<id>` and `/config/brokers/<default>` (zk_layout.py) with a `/config/changes` notification.
  Every broker watches its own and the default znode, so a change made through any broker reaches all of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidelog.atomic_files import write_atomically
from tidelog.broker import zk_layout as zk
from tidelog.broker.cluster_topics import write_entity_config
from tidelog.config import BROKER_KEYS, DYNAMIC_BROKER_KEYS, EngineConfig, LogConfig
from tidelog.errors import ConfigError, InvalidRequestError

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from tidelog.broker.admin import AdminExecutor
    from tidelog.broker.config import BrokerConfig
    from tidelog.storage.api import StorageEngine

log = logging.getLogger("tidelog.broker")

DYNAMIC_CONFIG_FILE = "tidelog-dynamic-configs.json"
FILE_VERSION = 1


class DynamicConfigError(InvalidRequestError):
    """Keys that cannot change while the broker runs (Kafka's "Cannot update these configs dynamically")."""


def check_dynamic_keys(configs: Mapping[str, str]) -> None:
    """Each key one of DYNAMIC_BROKER_KEYS with a valid value (DynamicConfigError, ConfigError)."""
    refused = sorted(name for name in configs if name not in DYNAMIC_BROKER_KEYS)
    if refused:
        raise DynamicConfigError(f"Cannot update these configs dynamically: {', '.join(refused)}")
    for name, value in configs.items():
        BROKER_KEYS[name].convert(value)


class FileStore:
    """The single broker's dynamic configs, in its first log dir."""

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / DYNAMIC_CONFIG_FILE

    def load(self) -> tuple[dict[str, str], dict[str, str]]:
        """(cluster default, this broker's); both empty when the file does not exist."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}, {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: cannot read the dynamic broker configs: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != FILE_VERSION:
            raise ConfigError(f"{self.path}: not a version {FILE_VERSION} dynamic config file")
        return _strings(self.path, data.get("default", {})), _strings(self.path, data.get("broker", {}))

    def save(self, default: Mapping[str, str], broker: Mapping[str, str]) -> None:
        text = json.dumps({"version": FILE_VERSION, "default": dict(default), "broker": dict(broker)}, sort_keys=True)
        write_atomically(self.path, text)


def _strings(path: Path, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{path}: a config map is not an object of strings: {value!r}")
    return {str(k): v for k, v in value.items()}


class DynamicBrokerConfig:
    """This broker's dynamic configs and the defaults they make; see the module docstring."""

    def __init__(
        self,
        config: BrokerConfig,
        engine: StorageEngine,
        admin: AdminExecutor,
        *,
        store: FileStore | None = None,
        client: KazooClient | None = None,
    ) -> None:
        self.config = config
        self.broker_id = config.node_id
        self.static: Mapping[str, str] = config.static_settings
        self.engine = engine
        self.admin = admin
        self.store = store
        self.client = client  # a cluster's: the znodes are the store
        self.cluster_default: dict[str, str] = {}
        self.per_broker: dict[str, str] = {}
        self.log_defaults: LogConfig = config.engine.log_defaults
        self.listeners: list[Callable[[LogConfig], None]] = []
        self._lock = threading.Lock()  # the kazoo threads' updates against the loop's

    def load(self) -> None:
        """Read the stored configs and apply them (at start, before the broker serves): on a single broker from
        the file, in a cluster from the znodes, which are then watched."""
        if self.store is not None:
            default, broker = self.store.load()
            self._set(default, broker, apply_now=True)
        if self.client is not None:
            client = self.client
            for entity in (zk.DEFAULT_BROKER_ENTITY, str(self.broker_id)):
                path = zk.broker_config_path(entity)
                client.DataWatch(path, lambda data, _stat, *_, path=path: self._znode_changed(path, data))

    def entity(self, resource_name: str) -> dict[str, str]:
        """The dynamic configs of `""` (the cluster default) or this broker's id."""
        return dict(self.cluster_default if resource_name == "" else self.per_broker)

    def defaults_with(self, resource_name: str, configs: Mapping[str, str]) -> LogConfig:
        """The topic defaults if `resource_name`'s dynamic configs were `configs`; raises what the change would."""
        check_dynamic_keys(configs)
        default, broker = (configs, self.per_broker) if resource_name == "" else (self.cluster_default, configs)
        defaults = self._log_defaults(default, broker)
        for name, description in self.engine.topics().items():
            try:
                defaults.with_overrides(description.configs)
            except ConfigError as exc:
                raise ConfigError(f"topic {name} would not accept the new defaults: {exc}") from None
        return defaults

    async def alter(self, resource_name: str, configs: Mapping[str, str]) -> None:
        """Store `configs` as `resource_name`'s dynamic configs and apply them (checked with defaults_with first)."""
        self.defaults_with(resource_name, configs)
        if self.client is not None:
            entity = zk.DEFAULT_BROKER_ENTITY if resource_name == "" else str(self.broker_id)
            await self.admin.run(
                write_entity_config, self.client, zk.broker_config_path(entity), f"brokers/{entity}", configs
            )
        default, broker = (
            (dict(configs), self.per_broker) if resource_name == "" else (self.cluster_default, dict(configs))
        )
        if self.store is not None:
            await self.admin.run(self.store.save, default, broker)
        await self.admin.run(self._set, default, broker, True)

    def merged(self) -> dict[str, str]:
        """The settings in force: static < cluster default < this broker's."""
        return {**self.static, **self.cluster_default, **self.per_broker}

    def _log_defaults(self, default: Mapping[str, str], broker: Mapping[str, str]) -> LogConfig:
        merged = {**self.static, **default, **broker}
        storage = {name: value for name, value in merged.items() if name in BROKER_KEYS}
        return EngineConfig.from_mapping(storage).log_defaults

    def _set(self, default: Mapping[str, str], broker: Mapping[str, str], apply_now: bool) -> None:
        """Take new maps and apply their defaults where they changed (on the admin thread, or at load)."""
        with self._lock:
            defaults = self._log_defaults(default, broker)
            self.cluster_default, self.per_broker = dict(default), dict(broker)
            if defaults == self.log_defaults:
                return
            self.log_defaults = defaults
        if apply_now:
            self.engine.set_log_defaults(defaults)
        for listener in self.listeners:
            listener(defaults)
        log.info("dynamic broker configs: default %s, broker %d %s", dict(default), self.broker_id, dict(broker))

    def _znode_changed(self, path: str, data: bytes | None) -> None:
        """A kazoo thread: `/config/brokers/<id>` or `<default>` changed; apply it on the admin thread."""
        try:
            configs = zk.decode_config(path, data)
            check_dynamic_keys(configs)
        except (zk.MalformedZnodeError, ConfigError, InvalidRequestError) as exc:
            log.warning("ignoring %s: %s", path, exc)
            return
        default_path = zk.broker_config_path(zk.DEFAULT_BROKER_ENTITY)
        with self._lock:
            default = configs if path == default_path else self.cluster_default
            broker = self.per_broker if path == default_path else configs
        with contextlib.suppress(RuntimeError):  # the broker is stopping
            self.admin.submit(self._apply_logged, default, broker)

    def _apply_logged(self, default: Mapping[str, str], broker: Mapping[str, str]) -> None:
        try:
            self._set(default, broker, True)
        except ConfigError as exc:
            log.warning("cannot apply the dynamic broker configs: %s", exc)
