"""Where client quotas are kept, and how a change reaches every broker's ClientQuotaManager (quotas.py).

Contract:

- On a single broker: `tidelog-client-quotas.json` in the first log dir, replaced whole and atomically
  (atomic_files.py), read at start:

      {"version": 1, "entities": [{"entity": [["client-id", null], ["user", "alice"]],
                                   "config": {"producer_byte_rate": "102400"}}, ...]}

  (a null name is the type's default; values are text as Kafka's ZooKeeper znodes hold them).
- In a cluster: Kafka's znodes, `/config/users/<user>`, `/config/users/<user>/clients/<client-id>` and
  `/config/clients/<client-id>` (zk_layout.py), names URL-encoded as Kafka's Sanitizer does and `<default>` for a
  default, each written with its `/config/changes/config_change_` notification (`users/<u>/clients/<c>`, ...) in one
  transaction. Every broker reads every quota znode at start and then follows the notifications: for each new one
  naming a quota entity it reads that entity's znode again and applies it, so a change made through any broker (or
  by Kafka's own tools on the same ZooKeeper) reaches all of them.
- A value that is not a number, a malformed znode or file entry is logged and skipped, never applied.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kazoo.exceptions import NodeExistsError, NoNodeError

from tidelog.atomic_files import write_atomically
from tidelog.broker import zk_layout as zk
from tidelog.broker.quotas import CLIENT_ID, LONG_KEYS, USER, Entity
from tidelog.errors import ConfigError, InvalidRequestError

if TYPE_CHECKING:
    from kazoo.client import KazooClient

log = logging.getLogger("tidelog.broker")

QUOTAS_FILE = "tidelog-client-quotas.json"
FILE_VERSION = 1
DEFAULT_NAME = "<default>"  # ConfigEntityName.Default
EntityConfigs = dict[Entity, dict[str, float]]


def sanitize(name: str) -> str:
    """Kafka's Sanitizer.sanitize: URL-encoding as Java's URLEncoder does it, with `*` and space percent-encoded."""
    return urllib.parse.quote(name, safe="").replace("~", "%7E")


def desanitize(name: str) -> str:
    return urllib.parse.unquote(name)


def value_text(key: str, value: float) -> str:
    """A quota value as Kafka writes it: a whole number for the LONG keys, Java's double text for the others."""
    return str(int(value)) if key in LONG_KEYS else repr(float(value))


def parse_values(where: str, config: Mapping[str, str]) -> dict[str, float]:
    values = {}
    for key, text in config.items():
        try:
            values[key] = float(text)
        except ValueError:
            log.warning("%s: ignoring %s=%r: not a number", where, key, text)
    return values


def entity_path(quota_entity: Entity) -> str:
    """`users/<u>`, `users/<u>/clients/<c>` or `clients/<c>` (below /config, as notifications name them)."""
    parts = dict(quota_entity)
    name = {t: DEFAULT_NAME if n is None else sanitize(n) for t, n in parts.items()}
    if USER in parts and CLIENT_ID in parts:
        return f"users/{name[USER]}/clients/{name[CLIENT_ID]}"
    if USER in parts:
        return f"users/{name[USER]}"
    return f"clients/{name[CLIENT_ID]}"


def entity_of_path(path: str) -> Entity | None:
    """The entity an entity path names; None for another kind of config (topics/..., brokers/...)."""
    parts = path.split("/")

    def name(text: str) -> str | None:
        return None if text == DEFAULT_NAME else desanitize(text)

    if len(parts) == 2 and parts[0] == "users":
        return ((USER, name(parts[1])),)
    if len(parts) == 4 and parts[0] == "users" and parts[2] == "clients":
        return ((CLIENT_ID, name(parts[3])), (USER, name(parts[1])))
    if len(parts) == 2 and parts[0] == "clients":
        return ((CLIENT_ID, name(parts[1])),)
    return None


class FileQuotaStore:
    """The single broker's client quotas, in its first log dir."""

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / QUOTAS_FILE
        self._configs: EntityConfigs = {}

    def load(self) -> EntityConfigs:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: cannot read the client quotas: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != FILE_VERSION:
            raise ConfigError(f"{self.path}: not a version {FILE_VERSION} client quota file")
        loaded: EntityConfigs = {}
        for item in data.get("entities", []):
            try:
                quota_entity = tuple((str(t), None if n is None else str(n)) for t, n in item["entity"])
                loaded[quota_entity] = parse_values(str(self.path), item["config"])
            except (KeyError, TypeError, ValueError, AttributeError):
                log.warning("%s: ignoring a malformed entry %r", self.path, item)
        self._configs = loaded
        return dict(loaded)

    def write(self, quota_entity: Entity, configs: Mapping[str, float]) -> None:
        """Store the entity's new configs (empty: none) with every other entity's (blocking: the admin thread)."""
        updated = {**self._configs, quota_entity: dict(configs)}
        entities = [
            {"entity": [list(part) for part in e], "config": {k: value_text(k, v) for k, v in sorted(c.items())}}
            for e, c in sorted(updated.items(), key=lambda item: entity_path(item[0]))
            if c
        ]
        write_atomically(self.path, json.dumps({"version": FILE_VERSION, "entities": entities}, indent=1))
        self._configs = {e: c for e, c in updated.items() if c}


class ZooKeeperQuotaStore:
    """A cluster's client quotas: the znodes, and the change notifications each broker follows."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self._last_change: int | None = None  # the sequence number of the last notification seen (None: not started)
        self._lock = threading.Lock()

    def load(self) -> EntityConfigs:
        """Every quota znode (blocking)."""
        loaded: EntityConfigs = {}
        for path in self._entity_paths():
            quota_entity = entity_of_path(path)
            if quota_entity is not None:
                values = self._read(path)
                if values:
                    loaded[quota_entity] = values
        return loaded

    def _entity_paths(self) -> list[str]:
        client = self.client
        paths = []
        with contextlib.suppress(NoNodeError):
            for user in client.get_children("/config/users"):
                paths.append(f"users/{user}")
                with contextlib.suppress(NoNodeError):
                    clients = client.get_children(f"/config/users/{user}/clients")
                    paths.extend(f"users/{user}/clients/{c}" for c in clients)
        with contextlib.suppress(NoNodeError):
            paths.extend(f"clients/{c}" for c in client.get_children("/config/clients"))
        return paths

    def _read(self, path: str) -> dict[str, float]:
        znode = f"/config/{path}"
        try:
            data, _stat = self.client.get(znode)
        except NoNodeError:  # removed: no quotas there
            return {}
        try:
            return parse_values(znode, zk.decode_config(znode, data))
        except zk.MalformedZnodeError as exc:
            log.warning("ignoring %s", exc)
            return {}

    def write(self, quota_entity: Entity, configs: Mapping[str, float]) -> None:
        """Set the entity's znode (its parents created if missing) and add its notification, in one transaction
        (blocking: off the event loop)."""
        path = entity_path(quota_entity)
        znode = f"/config/{path}"
        client = self.client
        if "/clients/" in path:  # the user's znode holds a config (an empty one), as Kafka's readers expect
            user_znode = znode.split("/clients/")[0]
            if not client.exists(user_znode):
                with contextlib.suppress(NodeExistsError):
                    client.create(user_znode, zk.encode_topic_config({}))
            client.ensure_path(f"{user_znode}/clients")
        data = zk.encode_topic_config({k: value_text(k, v) for k, v in configs.items()})
        transaction = client.transaction()
        if client.exists(znode):
            transaction.set_data(znode, data)
        else:
            transaction.create(znode, data)
        transaction.create(zk.CONFIG_CHANGE_PREFIX, zk.encode_config_change(path), sequence=True)
        results = transaction.commit()
        if any(isinstance(r, Exception) for r in results):
            raise InvalidRequestError(f"writing {znode} to ZooKeeper failed: {results}; try again")

    def follow(
        self, apply: Callable[[Entity, dict[str, float]], None], replace_all: Callable[[EntityConfigs], None]
    ) -> None:
        """Load everything, then apply each quota entity a new change notification names (kazoo's threads)."""

        def changed(children: list[str]) -> None:
            try:
                follow_changes(children)
            except Exception:  # kazoo would drop the watch: log it and keep following
                log.exception("client quotas: a config change could not be applied")

        def follow_changes(children: list[str]) -> None:
            sequences = sorted(_sequence(child) for child in children if _sequence(child) >= 0)
            with self._lock:
                if self._last_change is None:  # the first call: everything as it is now
                    self._last_change = sequences[-1] if sequences else -1
                    replace_all(self.load())
                    return
                fresh = [s for s in sequences if s > self._last_change]
                if fresh:
                    self._last_change = fresh[-1]
            for sequence in fresh:
                self._apply_change(sequence, apply)

        self.client.ChildrenWatch(zk.CONFIG_CHANGES_PATH, changed)

    def _apply_change(self, sequence: int, apply: Callable[[Entity, dict[str, float]], None]) -> None:
        znode = f"{zk.CONFIG_CHANGE_PREFIX}{sequence:010d}"
        try:
            data, _stat = self.client.get(znode)
            path = zk.decode_config_change(znode, data)
        except zk.MalformedZnodeError as exc:
            log.warning("ignoring %s", exc)
            return
        except NoNodeError:  # removed meanwhile (Kafka purges old notifications)
            return
        quota_entity = entity_of_path(path)
        if quota_entity is not None:
            apply(quota_entity, self._read(path))


def _sequence(child: str) -> int:
    prefix = zk.CONFIG_CHANGE_PREFIX.rpartition("/")[2]
    if not child.startswith(prefix):
        return -1
    try:
        return int(child[len(prefix) :])
    except ValueError:
        return -1
