"""Kafka's small state files, in Kafka's text formats, each written to `<name>.tmp`, fsynced, then renamed.

- recovery-point-offset-checkpoint, log-start-offset-checkpoint (log-dir level):
      0                      version
      2                      entry count
      my-topic 0 1234        topic partition offset
- leader-epoch-checkpoint (partition level): same framing, entries `epoch startOffset`.
- partition.metadata (partition level): `version: 0` and `topic_id: <22-char base64url Uuid>`.
- meta.properties (log-dir level): a java.util.Properties file with version, cluster.id, node.id, directory.id.
- .kafka_cleanshutdown (log-dir level): JSON `{"version":0,"brokerEpoch":N}`; only its existence matters.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from tidelog.config import parse_properties
from tidelog.errors import ConfigError, CorruptCheckpointError

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
CHECKPOINT_VERSION = 0


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> bool:
    """fsync a file written earlier without it; False when it is gone (deleted meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def write_atomically(path: Path, text: str) -> None:
    """tmp + fsync + rename + directory fsync: after a crash the file is either old or new, never torn."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def _read_framed(path: Path) -> list[list[str]]:
    """Entries of a version-0 checkpoint file, each split on whitespace."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise CorruptCheckpointError(f"{path}: not a text checkpoint file") from exc
    if len(lines) < 2:
        raise CorruptCheckpointError(f"{path}: expected a version line and a count line, found {len(lines)} lines")
    if lines[0].strip() != str(CHECKPOINT_VERSION):
        raise CorruptCheckpointError(f"{path}: unsupported checkpoint version {lines[0].strip()!r}")
    try:
        count = int(lines[1].strip())
    except ValueError as exc:
        raise CorruptCheckpointError(f"{path}: entry count {lines[1].strip()!r} is not a number") from exc
    entries = [line.split() for line in lines[2:] if line.strip()]
    if len(entries) != count:
        raise CorruptCheckpointError(f"{path}: declares {count} entries but holds {len(entries)}")
    return entries


def write_offset_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    write_atomically(path, "\n".join(lines) + "\n")


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    if not path.exists():
        return {}
    offsets: dict[tuple[str, int], int] = {}
    for fields in _read_framed(path):
        if len(fields) != 3:
            raise CorruptCheckpointError(f"{path}: malformed entry {' '.join(fields)!r}")
        topic, partition, offset = fields
        try:
            offsets[(topic, int(partition))] = int(offset)
        except ValueError as exc:
            raise CorruptCheckpointError(f"{path}: malformed entry {' '.join(fields)!r}") from exc
    return offsets


def write_leader_epoch_checkpoint(path: Path, epochs: Iterable[tuple[int, int]]) -> None:
    entries = list(epochs)
    lines = [str(CHECKPOINT_VERSION), str(len(entries))] + [f"{epoch} {start}" for epoch, start in entries]
    write_atomically(path, "\n".join(lines) + "\n")


def read_leader_epoch_checkpoint(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    epochs = []
    for fields in _read_framed(path):
        try:
            epoch, start = (int(f) for f in fields)
        except ValueError as exc:
            raise CorruptCheckpointError(f"{path}: malformed entry {' '.join(fields)!r}") from exc
        epochs.append((epoch, start))
    return epochs


# --- ids ---------------------------------------------------------------------------------------------------------


def new_kafka_uuid() -> str:
    """A random Uuid rendered as Kafka does: 16 bytes, base64url, no padding; never starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


def _check_kafka_uuid(path: Path, text: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except ValueError as exc:
        raise CorruptCheckpointError(f"{path}: {text!r} is not a base64url Uuid") from exc
    if len(raw) != 16:
        raise CorruptCheckpointError(f"{path}: {text!r} is not a 16-byte Uuid")
    return text


# --- partition.metadata -------------------------------------------------------------------------------------------


def write_partition_metadata(path: Path, topic_id: str) -> None:
    write_atomically(path, f"version: 0\ntopic_id: {topic_id}\n")


def read_partition_metadata(path: Path) -> str | None:
    """The topic id, or None when the file is absent."""
    if not path.exists():
        return None
    fields = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = re.split(r":\s+", line.strip(), maxsplit=1)
        if len(parts) == 2:
            fields[parts[0]] = parts[1]
    if fields.get("version") != "0" or "topic_id" not in fields:
        raise CorruptCheckpointError(f"{path}: expected 'version: 0' and 'topic_id: ...'")
    return _check_kafka_uuid(path, fields["topic_id"])


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
