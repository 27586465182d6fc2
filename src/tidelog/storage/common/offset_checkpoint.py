"""Kafka's framed checkpoint files: a version line, a count line, then one entry per line.

    0                      version (only 0 exists)
    2                      entry count
    my-topic 0 1234        an entry: fields separated by spaces

The offset checkpoints (Kafka's recovery-point-offset-checkpoint and log-start-offset-checkpoint, the RocketMQ
engine's tidelog-log-start-offsets) have entries `topic partition offset`; the leader-epoch checkpoint reuses the
framing with `epoch startOffset`. A file that does not parse raises CorruptCheckpointError naming the file and
the line; an absent file reads as empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tidelog.atomic_files import write_atomically
from tidelog.errors import CorruptCheckpointError

CHECKPOINT_VERSION = 0


def read_framed(path: Path) -> list[list[str]]:
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


def write_framed(path: Path, entries: list[str]) -> None:
    """Write entries (each already joined with spaces) under the version and count lines."""
    write_atomically(path, "\n".join([str(CHECKPOINT_VERSION), str(len(entries)), *entries]) + "\n")


def write_offset_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    write_framed(path, [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())])


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    if not path.exists():
        return {}
    offsets: dict[tuple[str, int], int] = {}
    for fields in read_framed(path):
        if len(fields) != 3:
            raise CorruptCheckpointError(f"{path}: malformed entry {' '.join(fields)!r}")
        topic, partition, offset = fields
        try:
            offsets[(topic, int(partition))] = int(offset)
        except ValueError as exc:
            raise CorruptCheckpointError(f"{path}: malformed entry {' '.join(fields)!r}") from exc
    return offsets
