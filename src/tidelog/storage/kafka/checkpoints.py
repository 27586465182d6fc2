"""Kafka's small state files, in Kafka's text formats, each replaced atomically (atomic_files.py).

- recovery-point-offset-checkpoint, log-start-offset-checkpoint, replication-offset-checkpoint (log-dir level;
  the last holds each partition's high watermark, written only in a cluster): offset checkpoints
  (storage/common/offset_checkpoint.py).
- leader-epoch-checkpoint (partition level): the same framing, entries `epoch startOffset`.
- partition.metadata (partition level): `version: 0` and `topic_id: <22-char base64url Uuid>`.
- meta.properties (log-dir level): a java.util.Properties file with version, cluster.id, node.id, directory.id.
- .kafka_cleanshutdown (log-dir level): JSON `{"version":0,"brokerEpoch":N}`; only its existence matters.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from tidelog.atomic_files import fsync_directory, write_atomically
from tidelog.config import parse_properties
from tidelog.errors import ConfigError, CorruptCheckpointError
from tidelog.kafka_uuid import is_kafka_uuid
from tidelog.storage.common.offset_checkpoint import read_framed, write_framed

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


def write_leader_epoch_checkpoint(path: Path, epochs: Iterable[tuple[int, int]]) -> None:
    write_framed(path, [f"{epoch} {start}" for epoch, start in epochs])


def read_leader_epoch_checkpoint(path: Path) -> list[tuple[int, int]] | None:
    """The (epoch, start offset) entries, or None when the file is absent."""
    try:
        framed = read_framed(path)
    except FileNotFoundError:
        return None
    epochs = []
    for fields in framed:
        try:
            epoch, start = (int(f) for f in fields)
        except ValueError as exc:
            raise CorruptCheckpointError(f"{path}: malformed entry {' '.join(fields)!r}") from exc
        epochs.append((epoch, start))
    return epochs


# --- partition.metadata -------------------------------------------------------------------------------------------


def write_partition_metadata(path: Path, topic_id: str) -> None:
    write_atomically(path, f"version: 0\ntopic_id: {topic_id}\n")


def read_partition_metadata(path: Path) -> str | None:
    """The topic id, or None when the file is absent."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    fields = {}
    for line in text.splitlines():
        parts = re.split(r":\s+", line.strip(), maxsplit=1)
        if len(parts) == 2:
            fields[parts[0]] = parts[1]
    if fields.get("version") != "0" or "topic_id" not in fields:
        raise CorruptCheckpointError(f"{path}: expected 'version: 0' and 'topic_id: ...'")
    if not is_kafka_uuid(fields["topic_id"]):
        raise CorruptCheckpointError(f"{path}: {fields['topic_id']!r} is not a 16-byte base64url Uuid")
    return fields["topic_id"]


# --- meta.properties ----------------------------------------------------------------------------------------------


def write_meta_properties(path: Path, properties: Mapping[str, str]) -> None:
    stamp = time.strftime("%a %b %d %H:%M:%S %Z %Y")
    body = "".join(f"{key}={value}\n" for key, value in sorted(properties.items()))
    write_atomically(path, f"#\n#{stamp}\n{body}")


def read_meta_properties(path: Path) -> dict[str, str]:
    """Read as java.util.Properties does (tidelog.config.parse_properties; bytes that are not UTF-8 are replaced,
    as in a comment they do no harm). A key without a value (a torn line) or a bad escape makes the file corrupt."""
    if not path.exists():
        return {}
    try:
        properties = dict(parse_properties(path.read_text(encoding="utf-8", errors="replace"), str(path)))
    except ConfigError as exc:
        raise CorruptCheckpointError(str(exc)) from None
    for key, value in properties.items():
        if not value:
            raise CorruptCheckpointError(f"{path}: {key!r} has no value")
    return properties


# --- clean shutdown marker ----------------------------------------------------------------------------------------


def write_clean_shutdown_marker(log_dir: Path, broker_epoch: int = 0) -> None:
    write_atomically(log_dir / CLEAN_SHUTDOWN_FILE, json.dumps({"version": 0, "brokerEpoch": broker_epoch}))


def take_clean_shutdown_marker(log_dir: Path) -> bool:
    """Was the last shutdown clean? The marker is removed at once, so a crash while loading counts as unclean."""
    marker = log_dir / CLEAN_SHUTDOWN_FILE
    if not marker.exists():
        return False
    marker.unlink()
    fsync_directory(log_dir)
    return True
