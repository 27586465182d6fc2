"""The topics of a store and their settings: `tidelog-topics.json`, which both engines keep.

Kafka keeps topic ids, partition counts and config overrides in its metadata log; tidelog keeps them in one JSON
file (at the top of each Kafka log dir, or of the RocketMQ store), which Kafka's and RocketMQ's own loaders ignore:

    {"generation": 7,                      bumped by every save; the newest readable copy wins at load
     "cluster_id": "<kafka uuid>",         the RocketMQ engine's cluster id (Kafka's is in meta.properties)
     "topics": {"orders": {"topic_id": "<kafka uuid>", "partitions": 3, "configs": {"retention.ms": "1000"},
                           "since": 0,                 RocketMQ: the CommitLog offset the topic was created at
                           "local_partitions": [0, 2]  the partitions held here (a broker of a cluster holds
                          }}}                          the replicas assigned to it); absent: all of them

`generation`, `cluster_id`, `since` and `local_partitions` may be absent (files written by earlier versions).
Each save replaces every copy atomically (atomic_files.py). A copy that does not parse is reported; the caller
decides whether that is fatal (the RocketMQ store has no other record of its topics) or recoverable (Kafka partition
directories name their topic, and their partition.metadata its id).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidelog.atomic_files import write_atomically
from tidelog.errors import (
    ConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    KafkaStorageError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.api import TopicDescription, validate_topic_name

log = logging.getLogger("tidelog.storage")

TOPICS_FILE = "tidelog-topics.json"


@dataclass(slots=True)
class TopicRecord:
    topic_id: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    since: int = 0
    local: list[int] | None = None  # the partitions held here (a cluster broker's replicas); None: all

    def held(self) -> Sequence[int]:
        return range(self.partitions) if self.local is None else self.local


@dataclass(slots=True)
class TopicsFile:
    generation: int = 0
    cluster_id: str | None = None
    topics: dict[str, TopicRecord] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> TopicsFile:
        """Check the shape of the file; raises ValueError saying what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("topics"), dict):
            raise ValueError("expected an object with a 'topics' object")
        if not isinstance(data.get("generation", 0), int):
            raise ValueError("'generation' is not an integer")
        if not isinstance(data.get("cluster_id", ""), str):
            raise ValueError("'cluster_id' is not a string")
        topics = {}
        for name, meta in data["topics"].items():
            if not (
                isinstance(meta, dict)
                and isinstance(meta.get("topic_id"), str)
                and isinstance(meta.get("partitions"), int)
                and meta["partitions"] >= 1
                and isinstance(meta.get("configs", {}), dict)
                and isinstance(meta.get("since", 0), int)
            ):
                raise ValueError(f"topic {name!r} needs topic_id, a positive partition count and a configs object")
            local = meta.get("local_partitions")
            if local is not None and not (
                isinstance(local, list)
                and all(isinstance(p, int) and 0 <= p < meta["partitions"] for p in local)
                and local == sorted(set(local))
            ):
                raise ValueError(f"topic {name!r}: local_partitions is not an ascending list of its partitions")
            configs = {str(k): str(v) for k, v in meta.get("configs", {}).items()}
            topics[name] = TopicRecord(meta["topic_id"], meta["partitions"], configs, meta.get("since", 0), local)
        return cls(data.get("generation", 0), data.get("cluster_id"), topics)

    def render(self) -> str:
        data: dict[str, Any] = {"generation": self.generation}
        if self.cluster_id is not None:
            data["cluster_id"] = self.cluster_id
        data["topics"] = {
            name: {"topic_id": t.topic_id, "partitions": t.partitions, "configs": t.configs}
            | ({"since": t.since} if t.since else {})
            | ({"local_partitions": t.local} if t.local is not None else {})
            for name, t in self.topics.items()
        }
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


class TopicRegistry:
    """The topics of one store, kept in a `tidelog-topics.json` in each of `directories`. Changes are made under
    the engine's lock; `descriptions` reads the state last published (at load and by every save) without it, so
    a server can list topics while a long topic change holds the lock."""

    def __init__(self, directories: list[Path]) -> None:
        self.paths = [directory / TOPICS_FILE for directory in directories]
        self.topics: dict[str, TopicRecord] = {}
        self.cluster_id: str | None = None
        self.generation = 0
        self.dirty = False  # a copy was damaged or a stored config was dropped: the next save repairs it
        self._published: dict[str, TopicDescription] = {}

    def load(self, *, damaged_is_fatal: bool, check_configs: Callable[[Mapping[str, str]], object]) -> None:
        """Read the newest readable copy. A damaged copy raises KafkaStorageError when `damaged_is_fatal`, else is
        reported and skipped. Stored configs that `check_configs` rejects (ConfigError) are dropped with a warning."""
        newest: TopicsFile | None = None
        for path in self.paths:
            if not path.exists():
                continue
            try:
                copy = TopicsFile.parse(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                if damaged_is_fatal:
                    raise KafkaStorageError(
                        f"{path} is unreadable ({exc}); without it the store's topics are unknown - "
                        "restore it from a backup"
                    ) from None
                log.warning(
                    "%s is unreadable (%s); topics are adopted from the partition directories "
                    "and their configs fall back to the broker defaults",
                    path,
                    exc,
                )
                self.dirty = True
                continue
            if newest is None or copy.generation >= newest.generation:
                newest = copy
        newest = newest or TopicsFile()
        self.generation, self.cluster_id = newest.generation, newest.cluster_id
        for name, record in newest.topics.items():
            try:
                check_configs(record.configs)
            except ConfigError as exc:
                log.warning("topic %s: stored config is invalid (%s); using the broker defaults", name, exc)
                record.configs = {}
                self.dirty = True
            self.topics[name] = record

    def copies_missing(self) -> bool:
        return any(not path.exists() for path in self.paths)

    def save(self) -> None:
        self.generation += 1
        text = TopicsFile(self.generation, self.cluster_id, self.topics).render()
        for path in self.paths:
            write_atomically(path, text)
        self.dirty = False
        self.publish()

    def publish(self) -> None:
        """Make the current topics what `descriptions` answers (a new dict: readers keep the one they have)."""
        self._published = {name: _describe(name, t) for name, t in sorted(self.topics.items())}

    # --- lookups -----------------------------------------------------------------------------------------------

    def __contains__(self, name: str) -> bool:
        return name in self.topics

    def get(self, name: str) -> TopicRecord:
        record = self.topics.get(name)
        if record is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return record

    def unknown_partition(self, topic: str, partition: int) -> UnknownTopicOrPartitionError:
        """The error for a partition the store does not have, saying whether the topic exists."""
        record = self.topics.get(topic)
        if record is not None and record.local is not None and 0 <= partition < record.partitions:
            return UnknownTopicOrPartitionError(f"no replica of {topic}-{partition} is held here")
        if record is not None:
            return UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {partition} (it has {record.partitions})"
            )
        return UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")

    def describe(self, name: str) -> TopicDescription:
        return _describe(name, self.get(name))

    def descriptions(self) -> dict[str, TopicDescription]:
        """The topics as last published, by name; safe to call without the engine lock."""
        return dict(self._published)

    # --- changes -----------------------------------------------------------------------------------------------

    def check_new(self, name: str) -> None:
        """Refuse a name that is invalid, taken, or that clashes with a topic's metric name ('.' vs '_')."""
        validate_topic_name(name)
        if name in self.topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        collision = next((t for t in self.topics if t.replace(".", "_") == name.replace(".", "_")), None)
        if collision is not None:
            raise InvalidTopicError(f"topic {name!r} collides with existing topic {collision!r} ('.' and '_' clash)")

    def add(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, Any],
        *,
        since: int = 0,
        topic_id: str | None = None,
        local: Collection[int] | None = None,
    ) -> TopicRecord:
        """A new topic record: `topic_id` or a new one; `local`: the partitions held here (None: all)."""
        held = check_local_partitions(name, 0, partitions, local)
        record = TopicRecord(
            topic_id or new_kafka_uuid(), partitions, {k: str(v) for k, v in configs.items()}, since, held
        )
        self.topics[name] = record
        return record

    def remove(self, name: str) -> TopicRecord:
        record = self.get(name)
        del self.topics[name]
        return record


def check_local_partitions(name: str, first: int, total: int, local: Collection[int] | None) -> list[int] | None:
    """`local` as a sorted list, checked to be partitions in [first, total); None stays None (all of them)."""
    if local is None:
        return None
    held = sorted(set(local))
    if any(not first <= p < total for p in held):
        raise InvalidPartitionsError(
            f"topic {name}: the partitions to hold {held} are not all within {first}..{total - 1}"
        )
    return held


def _describe(name: str, record: TopicRecord) -> TopicDescription:
    local = tuple(record.local) if record.local is not None else None
    return TopicDescription(name, record.topic_id, record.partitions, dict(record.configs), local)
