"""Replicas compared on disk: are the brokers' copies of a partition the same bytes, batch for batch?

A replica is a partition directory `<topic>-<partition>/` in a broker's log dir, holding Kafka segment files
(`00000000000000000000.log`, ...). Its batches are read file after file in base-offset order, walked with tidelog's
batch-chain walker (src/tidelog/codec/batch_chain.py: baseOffset int64, batchLength int32, then batchLength
bytes); segment boundaries do not matter, only the sequence of batches. The log dir's `replication-offset-checkpoint`
(line 1 version `0`, line 2 the count, then `topic partition offset` lines; it may be absent) gives each replica's
high watermark.

Contract:

- `replica_batches(log_dir, topic, partition)`: the replica's batches as `ReplicaBatch(base_offset, last_offset,
  leader_epoch, data)`, `data` the batch's bytes as stored. The walk stops at the end of the last segment, at a
  torn tail, or at damage (a size no format allows, an unknown magic); `read_replica` says where and why.
- `high_watermark(log_dir, topic, partition)`: the partition's entry in the log dir's replication-offset-checkpoint,
  or None (no file, or no entry).
- `compare_replicas(replicas, topic, partition, *, up_to=None, from_offset=0)`: compares the batches that hold an
  offset in [from_offset, up_to) - up_to by default the smallest high watermark among the replicas' checkpoints,
  or, when no checkpoint names the partition, no limit (the whole logs). Every replica must hold the same batches
  there, byte for byte, and reach up_to - 1 (a log that ends earlier while another goes on is a missing batch; one
  that every replica lacks is reported too). `replicas` is a sequence of log dirs (each named by its directory name,
  or its path when names repeat) or a mapping name -> log dir. Returns a `Comparison`: `identical`, and `report`,
  a text that names the first batch where the replicas part (its index and offset), which replicas differ from
  which (the odd ones out: those outside the largest group of equal batches), each side's offsets, leader epoch,
  size and CRC validity, the first differing byte and the header field it falls in, and the segment file and byte
  position of each batch.
- `assert_replicas_identical(...)`: the same, raising AssertionError with the report when they differ.
- `assert_all_replicas_identical(replicas)`: every partition found in two or more of the log dirs, each up to its
  own default limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tidelog.codec.batch_chain import scan_chain
from tidelog.codec.record_batch import MAGIC_OFFSET, MAGIC_V2
from tidelog.codec.record_set import is_valid, read_batch_info
from tidelog.errors import TidelogError
from tidelog.storage.common.offset_checkpoint import read_offset_checkpoint

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
_PARTITION_DIR = re.compile(r"(.+)-(\d+)")
# The v2 batch header's fields by their first byte (src/tidelog/codec/record_batch.py's HEADER), then the records.
_V2_FIELDS = (
    (0, "baseOffset"),
    (8, "batchLength"),
    (12, "partitionLeaderEpoch"),
    (16, "magic"),
    (17, "crc"),
    (21, "attributes"),
    (23, "lastOffsetDelta"),
    (27, "baseTimestamp"),
    (35, "maxTimestamp"),
    (43, "producerId"),
    (51, "producerEpoch"),
    (53, "baseSequence"),
    (57, "recordsCount"),
    (61, "records"),
)


class ReplicaBatch(NamedTuple):
    base_offset: int
    last_offset: int
    leader_epoch: int
    data: bytes


@dataclass(frozen=True)
class StoredAt:
    """Where a batch is stored: its segment file and the byte it starts at."""

    segment: Path
    position: int

    def __str__(self) -> str:
        return f"{self.segment.name} byte {self.position}"


@dataclass
class ReplicaLog:
    """One replica read from disk."""

    name: str
    directory: Path  # <log dir>/<topic>-<partition>
    batches: list[ReplicaBatch] = field(default_factory=list)
    locations: list[StoredAt] = field(default_factory=list)
    stopped: str | None = None  # why the walk ended before the last segment's end (a torn tail, damage)
    high_watermark: int | None = None


@dataclass
class Comparison:
    topic: str
    partition: int
    up_to: int | None
    from_offset: int
    identical: bool
    report: str
    first_difference_offset: int | None = None  # the first offset of the first batch where the replicas part
    differing: list[str] = field(default_factory=list)  # the replicas outside the largest group there

    def __str__(self) -> str:
        return self.report


def high_watermark(log_dir: Path | str, topic: str, partition: int) -> int | None:
    return read_offset_checkpoint(Path(log_dir) / REPLICATION_OFFSET_CHECKPOINT).get((topic, partition))


def _segments(directory: Path) -> list[Path]:
    """The segment files in base-offset order."""
    found = []
    for path in directory.glob("*.log"):
        if path.stem.isdigit():
            found.append((int(path.stem), path))
    return [path for _, path in sorted(found)]


def read_replica(log_dir: Path | str, topic: str, partition: int, name: str | None = None) -> ReplicaLog:
    """The replica of `topic`-`partition` in `log_dir`, batch by batch; a missing directory is an empty replica."""
    log_dir = Path(log_dir)
    directory = log_dir / f"{topic}-{partition}"
    replica = ReplicaLog(name or log_dir.name, directory, high_watermark=high_watermark(log_dir, topic, partition))
    if not directory.is_dir():
        replica.stopped = f"no directory {directory.name} in {log_dir}"
        return replica
    for segment in _segments(directory):
        data = segment.read_bytes()
        chain = scan_chain(data)
        for position, size in zip(chain.positions, chain.sizes, strict=True):
            entry = data[position : position + size]
            try:
                info = read_batch_info(entry, 0)
            except TidelogError as exc:
                replica.stopped = f"{segment.name} byte {position}: {exc}"
                return replica
            assert info is not None  # scan_chain hands whole entries
            base = info.base_offset if info.base_offset >= 0 else info.last_offset
            replica.batches.append(ReplicaBatch(base, info.last_offset, info.partition_leader_epoch, entry))
            replica.locations.append(StoredAt(segment, position))
        if chain.end.position != len(data):
            replica.stopped = f"{segment.name} {chain.end} ({chain.end.stop.value})"
            return replica
    return replica


def replica_batches(log_dir: Path | str, topic: str, partition: int) -> list[ReplicaBatch]:
    return read_replica(log_dir, topic, partition).batches


def _named(replicas: Sequence[Path | str] | Mapping[str, Path | str]) -> dict[str, Path]:
    if isinstance(replicas, Mapping):
        return {name: Path(path) for name, path in replicas.items()}
    paths = [Path(p) for p in replicas]
    names = [p.name for p in paths]
    if len(set(names)) != len(names):
        names = [str(p) for p in paths]
    return dict(zip(names, paths, strict=True))


def _field_at(data: bytes, index: int) -> str:
    if index < 12:
        return "baseOffset" if index < 8 else "batchLength"
    if len(data) <= MAGIC_OFFSET or data[MAGIC_OFFSET] != MAGIC_V2:
        return "a legacy message"
    return [name for start, name in _V2_FIELDS if start <= index][-1]


def _first_differing_byte(a: bytes, b: bytes) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def _valid_crc(data: bytes) -> bool:
    info = read_batch_info(data, 0)
    return info is not None and is_valid(data, info)


def _describe(batch: ReplicaBatch) -> str:
    crc = "CRC valid" if _valid_crc(batch.data) else "CRC INVALID"
    return (
        f"offsets {batch.base_offset}..{batch.last_offset}, leader epoch {batch.leader_epoch}, "
        f"{len(batch.data)} bytes, {crc}"
    )


def _log_end(replica: ReplicaLog) -> str:
    end = f"its log ends after offset {replica.batches[-1].last_offset}" if replica.batches else "it holds no batch"
    return f"{end}: {replica.stopped}" if replica.stopped else end


def compare_replicas(
    replicas: Sequence[Path | str] | Mapping[str, Path | str],
    topic: str,
    partition: int,
    *,
    up_to: int | None = None,
    from_offset: int = 0,
) -> Comparison:
    logs = [read_replica(path, topic, partition, name) for name, path in _named(replicas).items()]
    tp = f"{topic}-{partition}"
    if up_to is None:
        known = [(log.high_watermark, log.name) for log in logs if log.high_watermark is not None]
        if known:
            up_to, owner = min(known)
            limit = f"offsets [{from_offset}, {up_to}): up to the smallest high watermark, {owner}'s {up_to}"
        else:
            limit = f"the whole logs from offset {from_offset} (no {REPLICATION_OFFSET_CHECKPOINT} names {tp})"
    else:
        limit = f"offsets [{from_offset}, {up_to})"
    names = ", ".join(log.name for log in logs)
    heading = f"replicas of {tp} ({names}), comparing {limit}"

    def selected(log: ReplicaLog) -> list[int]:
        return [
            i
            for i, batch in enumerate(log.batches)
            if batch.last_offset >= from_offset and (up_to is None or batch.base_offset < up_to)
        ]

    chosen = {log.name: selected(log) for log in logs}
    by_name = {log.name: log for log in logs}
    length = max((len(indexes) for indexes in chosen.values()), default=0)
    for position in range(length):
        here: dict[str, tuple[ReplicaBatch, StoredAt] | None] = {}
        for log in logs:
            indexes = chosen[log.name]
            here[log.name] = (
                (log.batches[indexes[position]], log.locations[indexes[position]]) if position < len(indexes) else None
            )
        contents = {name: None if entry is None else entry[0].data for name, entry in here.items()}
        if len(set(contents.values())) == 1:
            continue
        groups: dict[bytes | None, list[str]] = {}
        for name, content in contents.items():
            groups.setdefault(content, []).append(name)
        first = logs[0].name
        majority = max(groups.values(), key=lambda members: (len(members), first in members))
        majority_content = contents[majority[0]]
        offset = min(entry[0].base_offset for entry in here.values() if entry is not None)
        differing = [name for name in contents if name not in majority]
        lines = [
            f"{heading}: they differ",
            f"first difference at batch #{position} of the compared range, offset {offset}: "
            f"{', '.join(differing)} differ(s) from {', '.join(majority)}",
        ]
        for content, members in groups.items():
            entry = here[members[0]]
            if entry is None or content is None:
                ends = "; ".join(_log_end(by_name[m]) for m in members)
                lines.append(f"  {', '.join(members)}: no batch here ({ends})")
                continue
            text = _describe(entry[0])
            if members is not majority and majority_content is not None:
                byte = _first_differing_byte(majority_content, content)
                text += f"; first differing byte {byte} of the batch ({_field_at(content, byte)})"
            where = "; ".join(f"{m}: {stored[1]}" for m in members if (stored := here[m]) is not None)
            lines.append(f"  {', '.join(members)}: {text}  [{where}]")
        return Comparison(topic, partition, up_to, from_offset, False, "\n".join(lines), offset, differing)
    if up_to is not None and up_to > from_offset:
        short = [
            log for log in logs if not chosen[log.name] or log.batches[chosen[log.name][-1]].last_offset < up_to - 1
        ]
        if short:
            lines = [f"{heading}: every replica holds the same batches, but not every offset below {up_to}"]
            lines += [f"  {log.name}: {_log_end(log)}" for log in short]
            return Comparison(
                topic, partition, up_to, from_offset, False, "\n".join(lines), None, [s.name for s in short]
            )
    return Comparison(topic, partition, up_to, from_offset, True, f"{heading}: identical, {length} batches")


def assert_replicas_identical(
    replicas: Sequence[Path | str] | Mapping[str, Path | str],
    topic: str,
    partition: int,
    *,
    up_to: int | None = None,
    from_offset: int = 0,
) -> Comparison:
    comparison = compare_replicas(replicas, topic, partition, up_to=up_to, from_offset=from_offset)
    if not comparison.identical:
        raise AssertionError(comparison.report)
    return comparison


def partitions_on_disk(log_dir: Path | str) -> set[tuple[str, int]]:
    """(topic, partition) of every partition directory in the log dir (not those being deleted or moved)."""
    found = set()
    for path in Path(log_dir).iterdir():
        match = _PARTITION_DIR.fullmatch(path.name)
        if match and path.is_dir():
            found.add((match[1], int(match[2])))
    return found


def assert_all_replicas_identical(replicas: Sequence[Path | str] | Mapping[str, Path | str]) -> list[Comparison]:
    """Every partition held in two or more of the log dirs, each compared up to its own default limit; one
    AssertionError lists every partition whose replicas differ."""
    named = _named(replicas)
    held: dict[tuple[str, int], dict[str, Path]] = {}
    for name, path in named.items():
        for tp in partitions_on_disk(path):
            held.setdefault(tp, {})[name] = path
    comparisons = [compare_replicas(dirs, *tp) for tp, dirs in sorted(held.items()) if len(dirs) > 1]
    failed = [c.report for c in comparisons if not c.identical]
    if failed:
        raise AssertionError("\n\n".join(failed))
    return comparisons
