"""Torn writes and corruption, at random: every file of a closed log directory in turn - segment `.log`,
`.index`, `.timeindex`, producer `.snapshot`, `recovery-point-offset-checkpoint`, `log-start-offset-checkpoint`,
`leader-epoch-checkpoint`, `partition.metadata`, `tidelog-topics.json`, `meta.properties` - is cut at a random
byte and/or has random bytes of its tail flipped, then the log is opened in-process. The RocketMQ engine's store
likewise: CommitLog, ConsumeQueue and IndexFile files, `checkpoint` and `tidelog-log-start-offsets`; its
preallocated files are zeroed from a random byte (a torn write keeps their length) or really cut short (see
damage_rocketmq).

Every trial must: open without an error; serve exactly the longest valid prefix of what was written (checked
against a model kept while writing: offsets, keys, values, timestamps, headers), nothing beyond it and no batch
failing its CRC (the raw bytes read back are walked and checked by an independent reader); have sound indexes
(rebuilt when damaged: every entry names a real batch); still recognise a retried idempotent batch; accept new
appends; and open again cleanly with the same contents.

Damage to a segment `.log` follows the crash model: a torn write can only hit bytes that were not yet fsynced,
so the clean-shutdown marker is removed and the recovery point is set at or below the damaged segment. Bytes that
no checksum covers (a batch's baseOffset and partitionLeaderEpoch) are not flipped: neither Kafka nor tidelog can
tell a change there (see docs/reliability.md). Index, checkpoint and snapshot damage is tried after both clean
and unclean shutdowns.

`make test` runs TRIALS trials; the `slow` variant (`make crash-long`) runs LONG_TRIALS. Seeded: a failure names
its trial, and `TIDELOG_TORN_SEED=<n>` replays a run.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from crc32c import crc32c

import tidelog
from tidelog import Compression, Record
from tidelog.codec import rocketmq_message as rm
from tidelog.codec.record_batch import build_batch
from tidelog.errors import CorruptCheckpointError
from tidelog.storage.api import KeyLocation, StorageEngine
from tidelog.storage.common.offset_checkpoint import read_offset_checkpoint, write_offset_checkpoint
from tidelog.storage.kafka import checkpoints
from tidelog.storage.kafka.engine import KafkaEngine

TRIALS = 100
LONG_TRIALS = 1000
SEED = int(os.environ.get("TIDELOG_TORN_SEED", "20261122"))
TS = 1_700_000_000_000
CONFIGS = {
    "kafka": {"log.segment.bytes": 3000, "log.index.interval.bytes": 150},
    "rocketmq": {
        "tidelog.rocketmq.mapedFileSizeCommitLog": 4096,
        "tidelog.rocketmq.mapedFileSizeConsumeQueue": 400,
        "tidelog.rocketmq.maxHashSlotNum": 64,  # IndexFiles of 5,416 bytes, so the template has several
        "tidelog.rocketmq.maxIndexNum": 256,
    },
}
ENGINES = tuple(CONFIGS)
LOG_START_FILES = {"kafka": checkpoints.LOG_START_OFFSET_CHECKPOINT, "rocketmq": "tidelog-log-start-offsets"}
TOPICS = {"t": 2, "u": 1}
U_CONFIGS = {"retention.ms": "-1", "max.message.bytes": "500000"}
U_LOG_START = 40  # DeleteRecords moves topic u's log start here (inside a segment, after whole segments)
FLIP_TAIL_BYTES = 400
CQ_UNIT = struct.Struct(">qiq")  # RocketMQ ConsumeQueue unit: CommitLog offset, size, tag hash


# --- the model of what was written ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SentBatch:
    """One appended batch as the producer built it (offsets not yet assigned) and where the log put it."""

    data: bytes
    base_offset: int
    last_offset: int
    producer_id: int  # -1: not idempotent


@dataclass
class PartitionModel:
    records: dict[int, Record] = field(default_factory=dict)  # offset -> record
    batches: list[SentBatch] = field(default_factory=list)
    log_start: int = 0
    end: int = 0


@dataclass(frozen=True)
class Template:
    engine: str
    path: Path
    model: dict[tuple[str, int], PartitionModel]
    topic_ids: dict[str, str]
    # RocketMQ engine: where each record's message is in the CommitLog, (physical offset, size) by queue offset
    messages: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)

    def open(self, path: Path) -> StorageEngine:
        return tidelog.open(path, engine=self.engine, config=CONFIGS[self.engine], background=False)


def _record_tuple(record: Record) -> tuple:
    return (record.offset, record.timestamp_ms, record.key, record.value, [tuple(h) for h in record.headers])


def _write_template(path: Path, engine_name: str) -> Template:
    rng = random.Random(4711)
    model: dict[tuple[str, int], PartitionModel] = {}
    with tidelog.open(path, engine=engine_name, config=CONFIGS[engine_name], background=False) as engine:
        engine.create_topic("t", TOPICS["t"])
        engine.create_topic("u", TOPICS["u"], U_CONFIGS)
        for (topic, partitions), producer_base in zip(TOPICS.items(), (100, 200), strict=True):
            for partition in range(partitions):
                part = model.setdefault((topic, partition), PartitionModel())
                sequences: dict[tuple[int, int], int] = {}
                for b in range(80):
                    # two idempotent producers (one bumps its epoch half way) and plain batches, interleaved
                    kind = b % 3
                    producer_id = producer_base + partition * 10 + kind if kind < 2 else -1
                    epoch = 1 if kind == 1 and b >= 40 else 0
                    count = 1 + rng.randrange(4)
                    records = [
                        Record(
                            rng.randbytes(rng.randrange(0, 60)),
                            key=f"{topic}{partition}-{b}-{i}".encode(),
                            timestamp_ms=TS + 7 * b + i,
                            headers=[("b", str(b).encode())] if i % 2 == 0 else [],
                        )
                        for i in range(count)
                    ]
                    sequence = sequences.get((producer_id, epoch), 0)
                    data = build_batch(
                        records,
                        compression=Compression.GZIP if b % 11 == 0 else Compression.NONE,
                        producer_id=producer_id,
                        producer_epoch=epoch if producer_id >= 0 else -1,
                        base_sequence=sequence if producer_id >= 0 else -1,
                    )
                    sequences[(producer_id, epoch)] = sequence + count
                    result = engine.append(topic, partition, data)
                    for i, record in enumerate(records):
                        record.offset = result.base_offset + i
                        part.records[record.offset] = record
                    part.batches.append(SentBatch(data, result.base_offset, result.last_offset, producer_id))
                part.end = engine.log_end_offset(topic, partition)
        engine.delete_records("u", 0, U_LOG_START)
        model[("u", 0)].log_start = engine.log_start_offset("u", 0)
        assert model[("u", 0)].log_start == U_LOG_START
        topic_ids = {name: description.topic_id for name, description in engine.topics().items()}
    if engine_name == "kafka":
        for topic, partition in model:
            assert len(segment_files(path / f"{topic}-{partition}", ".log")) >= 4
            assert segment_files(path / f"{topic}-{partition}", ".snapshot")
        return Template(engine_name, path, model, topic_ids)
    assert len(list((path / "commitlog").iterdir())) >= 10
    assert len(list((path / "index").iterdir())) >= 4
    messages = {}
    for topic, queue in model:
        units = b"".join(p.read_bytes() for p in sorted((path / "consumequeue" / topic / str(queue)).iterdir()))
        messages[(topic, queue)] = [CQ_UNIT.unpack_from(units, i)[:2] for i in range(0, len(units), CQ_UNIT.size)]
        messages[(topic, queue)] = [unit for unit in messages[(topic, queue)] if unit[1] > 0]
        assert len(messages[(topic, queue)]) == model[(topic, queue)].end
    return Template(engine_name, path, model, topic_ids, messages)


@pytest.fixture(scope="module", params=ENGINES)
def template(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Template:
    return _write_template(tmp_path_factory.mktemp(f"torn-template-{request.param}") / "data", request.param)


# --- an independent reader of stored batches -------------------------------------------------------------------


@dataclass(frozen=True)
class StoredBatch:
    position: int
    size: int
    base_offset: int
    last_offset: int


def walk_valid_batches(data: bytes) -> list[StoredBatch]:
    """Whole v2 batches from the start of `data`, each passing its CRC-32C; raises on a bad one."""
    batches = []
    position = 0
    while position + 61 <= len(data):
        base, length, _epoch, magic, crc = struct.unpack_from(">qiibI", data, position)
        size = length + 12
        if position + size > len(data):
            break  # a read may end with part of a batch
        assert magic == 2, f"batch at byte {position} has magic {magic}"
        assert crc32c(data[position + 21 : position + size]) == crc, f"batch at byte {position} fails its CRC"
        (last_delta,) = struct.unpack_from(">i", data, position + 23)
        batches.append(StoredBatch(position, size, base, base + last_delta))
        position += size
    return batches


def segment_files(partition_dir: Path, suffix: str) -> list[Path]:
    return sorted(p for p in partition_dir.iterdir() if p.name.endswith(suffix) and p.name[:20].isdigit())


# --- damage ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Damage:
    path: Path
    mode: str
    detail: str
    flipped: tuple[int, ...] = ()  # positions of flipped bytes
    cut: int | None = None  # new length after a cut


def damage_file(path: Path, rng: random.Random, mode: str, allowed: list[int] | None = None) -> Damage:
    """Cut `path` at a random byte ("truncate"), flip 1-3 random bytes of its tail ("flip"), or both.
    `allowed` limits the flipped positions (segment files: bytes a checksum covers)."""
    data = bytearray(path.read_bytes())
    cut = None
    if mode in ("truncate", "both") and data:
        cut = rng.randrange(0, len(data))
        del data[cut:]
    flipped: list[int] = []
    if mode in ("flip", "both"):
        tail_start = max(0, len(data) - FLIP_TAIL_BYTES)
        candidates = [p for p in (allowed if allowed is not None else range(len(data))) if tail_start <= p < len(data)]
        for position in rng.sample(candidates, min(len(candidates), rng.randint(1, 3))):
            data[position] ^= rng.randrange(1, 256)
            flipped.append(position)
    path.write_bytes(bytes(data))
    detail = f"{path.name}: {mode}" + (f" cut at {cut}" if cut is not None else "") + f" flipped {sorted(flipped)}"
    return Damage(path, mode, detail, tuple(sorted(flipped)), cut)


def checksummed_positions(batches: list[StoredBatch]) -> list[int]:
    """Byte positions of a segment covered by some check: all but each batch's baseOffset and leader epoch."""
    positions = []
    for batch in batches:
        start = batch.position
        positions += range(start + 8, start + 12)
        positions += range(start + 16, start + batch.size)
    return positions


@dataclass
class Expectation:
    """What the reopened log must hold, per partition: [start, end) of the model, less the offsets in `lost`."""

    ranges: dict[tuple[str, int], tuple[int, int]]
    lost: dict[tuple[str, int], range] = field(default_factory=dict)
    topics_file_damaged: bool = False
    log_start_checkpoint_damaged: bool = False

    def read_damaged_log_starts(self, log_dir: Path, engine: str) -> None:
        """Kafka's checkpoint format has no checksum: a damaged log-start-offset-checkpoint that still parses names
        other log starts, and they are taken (each moved up to its partition's first segment); one that does not
        parse is ignored (every log starts at its first segment). Either way no record is lost or altered.
        (The RocketMQ engine keeps DeleteRecords in the same format, and its queues all start at 0 here; a log start
        named past a queue's end starts it again there, empty - what it does when a crash cut the CommitLog below a
        DeleteRecords floor, and Kafka's LogLoader when the log end is below the checkpointed log start.)"""
        try:
            named = read_offset_checkpoint(log_dir / LOG_START_FILES[engine])
        except CorruptCheckpointError:
            named = {}
        first_bases = {
            key: min((int(p.name[:20]) for p in log_dir.glob(f"{key[0]}-{key[1]}/*.log")), default=0)
            for key in self.ranges
        }
        for key, (_start, end) in self.ranges.items():
            start = max(named.get(key, 0), first_bases[key])
            self.ranges[key] = (start, start) if engine == "rocketmq" and start > end else (min(start, end), end)


def set_recovery_point(log_dir: Path, key: tuple[str, int], offset: int) -> None:
    path = log_dir / checkpoints.RECOVERY_POINT_CHECKPOINT
    points = read_offset_checkpoint(path)
    points[key] = offset
    write_offset_checkpoint(path, points)


def damage_trial(template: Template, target: Path, rng: random.Random) -> tuple[Damage, Expectation]:
    """Damage one file of the copy at `target` (a clean close of the template); say what must survive."""
    expected = Expectation({key: (part.log_start, part.end) for key, part in template.model.items()})
    if template.engine == "rocketmq":
        return damage_rocketmq(template, target, rng, expected)
    kind = rng.choice(
        ["log", "log", "log", "index", "timeindex", "snapshot", "log-checkpoint", "partition-file", "log-dir-file"]
    )
    mode = rng.choice(["truncate", "flip", "both"])
    key = rng.choice(sorted(template.model))
    partition_dir = target / f"{key[0]}-{key[1]}"
    marker = target / checkpoints.CLEAN_SHUTDOWN_FILE
    if kind == "log":
        segments = segment_files(partition_dir, ".log")
        victim = rng.choice(segments)
        base = int(victim.name[:20])
        batches = walk_valid_batches(victim.read_bytes())
        marker.unlink()  # a torn write means a crash before the bytes were fsynced
        set_recovery_point(target, key, rng.choice([int(s.name[:20]) for s in segments if int(s.name[:20]) <= base]))
        damage = damage_file(victim, rng, mode, checksummed_positions(batches))
        cut = len(victim.read_bytes()) if damage.cut is None else damage.cut
        # a batch the cut goes through or a flip hit is invalid: the segment is truncated before it and every
        # later segment deleted; batches the cut removed whole just end the segment
        bad = [
            slot
            for slot, batch in enumerate(batches)
            if batch.position < cut < batch.position + batch.size
            or any(batch.position <= p < batch.position + batch.size for p in damage.flipped)
        ]
        removed = [slot for slot, batch in enumerate(batches) if batch.position >= cut]
        start, _ = expected.ranges[key]
        if bad:
            expected.ranges[key] = (start, max(start, batches[bad[0]].base_offset))
        elif removed and victim == segments[-1]:
            expected.ranges[key] = (start, max(start, batches[removed[0]].base_offset))
        elif removed:
            # cut exactly at a batch boundary of an earlier segment: what is left is all valid, so recovery (like
            # Kafka's) keeps it and the later segments; the removed batches leave a gap in the offsets, as a
            # compacted Kafka log has them
            next_base = int(segments[segments.index(victim) + 1].name[:20])
            expected.lost[key] = range(batches[removed[0]].base_offset, next_base)
        return damage, expected
    if rng.random() < 0.5:
        marker.unlink()
    if kind in ("index", "timeindex"):
        victim = rng.choice(segment_files(partition_dir, f".{kind}"))
    elif kind == "snapshot":
        victim = rng.choice(segment_files(partition_dir, ".snapshot"))
    elif kind == "log-checkpoint":
        victim = target / rng.choice([checkpoints.RECOVERY_POINT_CHECKPOINT, checkpoints.LOG_START_OFFSET_CHECKPOINT])
        expected.log_start_checkpoint_damaged = victim.name == checkpoints.LOG_START_OFFSET_CHECKPOINT
    elif kind == "partition-file":
        victim = partition_dir / rng.choice([checkpoints.LEADER_EPOCH_CHECKPOINT, checkpoints.PARTITION_METADATA])
    else:
        victim = target / rng.choice(["tidelog-topics.json", checkpoints.META_PROPERTIES])
        expected.topics_file_damaged = victim.name == "tidelog-topics.json"
    return damage_file(victim, rng, mode), expected


def checked_message_bytes(data: bytes, position: int, size: int) -> list[int]:
    """Bytes of a RocketMQ message that recovery checks: TOTALSIZE, MAGICCODE, BODYCRC, PHYSICALOFFSET, the body
    length and the body (the only CRC covers the body; queue id, offsets, timestamps, hosts, topic and properties
    are covered by nothing in RocketMQ's format)."""
    (body_length,) = struct.unpack_from(">i", data, position + 84)
    assert 88 + body_length <= size
    header = [*range(position, position + 12), *range(position + 28, position + 36)]
    return [*header, *range(position + 84, position + 88 + body_length)]


def damage_rocketmq(
    template: Template, target: Path, rng: random.Random, expected: Expectation
) -> tuple[Damage, Expectation]:
    """RocketMQ's files are preallocated: a torn write leaves zeros (never written) or wrong bytes, the length stays.
    So a "truncate" here zeroes the file from a random byte on; flips hit the written part's last FLIP_TAIL_BYTES.
    "shorten" really cuts the file (a crash while it was made, a copy cut short): the engine extends it with zeros
    and recovers as after a crash, whether or not the last run ended cleanly. In the CommitLog cuts and flips start
    at bytes recovery can check (checked_message_bytes): zeros or flips confined to a message's unchecked fields go
    unnoticed in RocketMQ's format (docs/reliability.md). ConsumeQueues and IndexFiles are derived: every record
    must come back, and every key be found."""
    kind = rng.choice(["commitlog", "commitlog", "commitlog", "consumequeue", "index", "checkpoint", "log-dir-file"])
    mode = rng.choice(["truncate", "flip", "both", "shorten"])
    abort = target / "abort"
    if kind == "commitlog":
        files = sorted((target / "commitlog").iterdir())
        victim = rng.choice(files)
        file_base, data = int(victim.name), bytearray(victim.read_bytes())
        if mode != "shorten" or rng.random() < 0.5:
            # a crash, and nothing known flushed: recovery checks every file from the first
            abort.write_text("0")
            (target / "checkpoint").write_bytes(bytes(4096))
        units = sorted(
            (phy - file_base, size)
            for queue_units in template.messages.values()
            for phy, size in queue_units
            if file_base <= phy < file_base + len(data)
        )
        end_of_messages = units[-1][0] + units[-1][1]
        checked = [p for position, size in units for p in checked_message_bytes(bytes(data), position, size)]
        remaining, magic = struct.unpack_from(">ii", data, end_of_messages)
        if magic == rm.BLANK_MAGIC and remaining == len(data) - end_of_messages:  # the end-of-file marker
            units.append((end_of_messages, 8))
            checked += range(end_of_messages, end_of_messages + 8)
        written = units[-1][0] + units[-1][1]
        cut, flipped = None, []
        if mode in ("truncate", "both", "shorten"):  # from a checked byte on: see checked_message_bytes
            cut = rng.choice(checked)
            data[cut:] = b"" if mode == "shorten" else bytes(len(data) - cut)
        if mode in ("flip", "both"):
            tail = [p for p in checked if max(0, written - FLIP_TAIL_BYTES) <= p < (written if cut is None else cut)]
            for position in rng.sample(tail, min(len(tail), rng.randint(1, 3))):
                data[position] ^= rng.randrange(1, 256)
                flipped.append(position)
        victim.write_bytes(bytes(data))
        lost = [
            position
            for position, size in units
            if (cut is not None and position + size > cut) or any(position <= p < position + size for p in flipped)
        ]
        verb = "cut" if mode == "shorten" else "zeroed from"
        damage = Damage(victim, mode, f"commitlog/{victim.name}: {mode} {verb} {cut} flipped {flipped}", cut=cut)
        if lost:
            first_lost = file_base + min(lost)
            for key, queue_units in template.messages.items():
                gone = [offset for offset, (phy, _size) in enumerate(queue_units) if phy >= first_lost]
                if gone:  # a Kafka batch never comes back in part: the queue ends before the batch of the first
                    batch = next(b for b in template.model[key].batches if b.base_offset <= gone[0] <= b.last_offset)
                    start, _ = expected.ranges[key]
                    expected.ranges[key] = (start, max(start, batch.base_offset))
        return damage, expected
    if kind == "consumequeue":
        # the crash model: only the active (last) file of a queue holds units that may not be flushed, and the
        # abort file says so. (After a clean shutdown the engine trusts its ConsumeQueues, as RocketMQ does.)
        # Only cuts (zeros from a byte on, as a torn write leaves them): a flipped unit that still looks valid is
        # trusted by the engine as by RocketMQ - see docs/reliability.md. A shortened file, any of the queue's,
        # is found at load, after a clean shutdown too.
        mode = "shorten" if mode == "shorten" else "truncate"
        topic, queue = rng.choice(sorted(template.messages))
        files = sorted((target / "consumequeue" / topic / str(queue)).iterdir())
        victim = rng.choice(files) if mode == "shorten" else files[-1]
        data = bytearray(victim.read_bytes())
        if mode == "shorten":
            if rng.random() < 0.5:
                abort.write_text("0")
            cut = rng.randrange(0, len(data))
            del data[cut:]
        else:
            abort.write_text("0")
            written = len(data.rstrip(b"\0"))
            cut = rng.randrange(0, written) if written else None
            if cut is not None:
                data[cut:] = bytes(len(data) - cut)
        victim.write_bytes(bytes(data))
        name = "/".join(victim.parts[-3:])
        verb = "cut" if mode == "shorten" else "zeroed from"
        return Damage(victim, mode, f"consumequeue/{name}: {mode} {verb} {cut}", cut=cut), expected
    if rng.random() < 0.5:
        abort.write_text("0")  # a crash
    if kind == "index":  # only cut short: an IndexFile keeps no checksum, so nothing can tell a flipped entry
        victim = rng.choice(sorted((target / "index").iterdir()))
        data = victim.read_bytes()
        cut = rng.randrange(0, len(data))
        victim.write_bytes(data[:cut])
        return Damage(victim, "shorten", f"index/{victim.name}: shorten cut {cut}", cut=cut), expected
    if kind == "checkpoint":
        victim = target / "checkpoint"
        data = bytearray(victim.read_bytes()[:40])  # the fields; the rest of the page is zeros
        victim.write_bytes(bytes(data) + bytes(4096 - 40))
        return damage_file(victim, rng, "truncate" if mode == "shorten" else mode, list(range(40))), expected
    # Not tidelog-topics.json: the RocketMQ engine refuses to start without a readable one, with an error naming
    # it (the store cannot tell its topics' ids, configs and creation points from anything else); it is written
    # atomically, so a crash cannot tear it.
    victim = target / LOG_START_FILES["rocketmq"]
    expected.log_start_checkpoint_damaged = True
    return damage_file(victim, rng, "truncate" if mode == "shorten" else mode), expected


# --- verification ---------------------------------------------------------------------------------------------


def check_indexes(engine: StorageEngine, key: tuple[str, int]) -> None:
    """Kafka engine: every index entry names a real batch: (last offset, start position); time entries increase.
    (The RocketMQ engine's ConsumeQueues are checked through the reads: every record at its offset.)"""
    if not isinstance(engine, KafkaEngine):
        return
    partition_log = engine.partition(*key)
    for segment in partition_log.segments:
        segment.sanity_check()
        batches = walk_valid_batches(os.pread(segment.file.fileno(), segment.size, 0))
        assert sum(b.size for b in batches) == segment.size, f"segment {segment.base_offset} has unreadable bytes"
        last_offset_at = {b.position: b.last_offset for b in batches}
        for slot in range(segment.index.entries):
            offset, position = segment.index.entry_at(slot)
            assert last_offset_at.get(position) == offset, (segment.base_offset, slot, offset, position)
        last_offsets = set(last_offset_at.values())
        previous = -1
        for slot in range(segment.time_index.entries):
            timestamp, offset = segment.time_index.entry_at(slot)
            assert offset in last_offsets, (segment.base_offset, slot, offset)
            assert timestamp > previous
            previous = timestamp


def check_partition(
    engine: StorageEngine, template: Template, key: tuple[str, int], start: int, end: int, lost: range
) -> None:
    part = template.model[key]
    topic, partition = key
    assert engine.log_start_offset(topic, partition) == start
    assert engine.log_end_offset(topic, partition) == end
    present = [o for o in range(start, end) if o not in lost]
    expected = [part.records[o] for o in present]
    assert [_record_tuple(r) for r in engine.consume(topic, partition)] == [_record_tuple(r) for r in expected]
    # the raw bytes served: whole batches, each passing its CRC, offsets dense from the first served batch on
    # (across the lost range, if any)
    if present:
        raw = engine.read(topic, partition, start, 1 << 24).read_bytes()
        batches = walk_valid_batches(raw)
        assert sum(b.size for b in batches) == len(raw), "a read served bytes that are not whole valid batches"
        assert batches[0].base_offset <= present[0] <= batches[0].last_offset
        assert batches[-1].last_offset == end - 1
        for before, after in itertools.pairwise(batches):
            assert after.base_offset == before.last_offset + 1 or (before.last_offset + 1, after.base_offset) == (
                lost.start,
                lost.stop,
            )
    assert engine.read(topic, partition, end, 1 << 20).slices == ()
    check_indexes(engine, key)
    # positioned reads and time lookups go through the (possibly rebuilt) indexes
    for offset in present[::7]:
        first = walk_valid_batches(engine.read(topic, partition, offset, 1).read_bytes())[0]
        assert first.base_offset <= offset <= first.last_offset
        found = engine.offset_for_timestamp(topic, partition, part.records[offset].timestamp_ms)
        assert found is not None
        assert found.offset == offset


def check_key_lookups(
    engine: StorageEngine, template: Template, key: tuple[str, int], start: int, end: int, lost: range
) -> None:
    """RocketMQ engine: the IndexFiles (kept, cut back or rebuilt) find every surviving record by its key (each
    record of the template has a key of its own), and none that is gone."""
    if template.engine != "rocketmq":
        return
    topic, partition = key
    records = template.model[key].records
    for offset in range(start, end, 11):
        if offset not in lost:
            record = records[offset]
            assert engine.lookup_key(topic, record.key) == [KeyLocation(partition, offset, record.timestamp_ms)]
    if end in records:
        assert engine.lookup_key(topic, records[end].key) == []


def check_producer_state(
    engine: StorageEngine, template: Template, key: tuple[str, int], start: int, end: int, lost: range
) -> None:
    """The newest surviving batch of each idempotent producer, sent again, is answered with its original offsets."""
    newest: dict[int, SentBatch] = {}
    for batch in template.model[key].batches:
        survived = start <= batch.base_offset and batch.last_offset < end and batch.base_offset not in lost
        if batch.producer_id >= 0 and survived:
            newest[batch.producer_id] = batch
    partition = engine.partition(*key)
    for batch in newest.values():
        result = partition.append(batch.data)
        assert (result.base_offset, result.last_offset, result.size_in_bytes) == (
            batch.base_offset,
            batch.last_offset,
            0,
        ), f"producer {batch.producer_id}: the retry of its batch at {batch.base_offset} was not recognised"
    assert engine.log_end_offset(*key) == end


def run_trial(template: Template, work: Path, trial: int, rng: random.Random) -> str:
    target = work / f"trial-{trial}"
    shutil.copytree(template.path, target)
    damage, expected = damage_trial(template, target, rng)
    if expected.log_start_checkpoint_damaged:
        expected.read_damaged_log_starts(target, template.engine)
    context = f"trial {trial} (seed {SEED}): {damage.detail}"
    try:
        with template.open(target) as engine:
            topics = engine.topics()
            assert {name: d.partitions for name, d in topics.items()} == TOPICS
            assert {name: d.topic_id for name, d in topics.items()} == template.topic_ids
            if not expected.topics_file_damaged:
                assert topics["u"].configs == U_CONFIGS
            for key, (start, end) in sorted(expected.ranges.items()):
                lost = expected.lost.get(key, range(0))
                check_partition(engine, template, key, start, end, lost)
                check_key_lookups(engine, template, key, start, end, lost)
                check_producer_state(engine, template, key, start, end, lost)
            topic, partition = rng.choice(sorted(expected.ranges))
            next_offset = engine.log_end_offset(topic, partition)
            appended = engine.produce(topic, partition, [Record(b"after", key=b"k", timestamp_ms=TS + 10**6)])
            assert appended == next_offset
        with template.open(target) as engine:  # the repair is durable
            for key, (_start, end) in expected.ranges.items():
                assert engine.log_end_offset(*key) == end + ((topic, partition) == key)
                check_indexes(engine, key)
            last = list(engine.consume(topic, partition, next_offset))
            assert [(r.offset, r.value) for r in last] == [(next_offset, b"after")]
    except Exception as exc:
        raise AssertionError(f"{context}: {exc!r}") from exc
    shutil.rmtree(target)
    for store_dir in ("commitlog", "consumequeue", "index"):  # RocketMQ's
        if store_dir in damage.path.relative_to(target).parts:
            return store_dir + (" shortened" if damage.mode == "shorten" else "")
    name = damage.path.name
    return name[20:] if name[:20].isdigit() else name  # ".log", ".index", ... or the state file's name


def run_trials(template: Template, work: Path, trials: int) -> None:
    rng = random.Random(SEED)
    started = time.monotonic()
    kinds: Counter[str] = Counter()
    for trial in range(trials):
        kinds[run_trial(template, work, trial, rng)] += 1
    elapsed = time.monotonic() - started
    print(
        f"\ntorn writes: {trials} trials in {elapsed:.1f} s ({1000 * elapsed / trials:.0f} ms each), "
        f"seed {SEED}; damaged files by kind: {dict(sorted(kinds.items()))}"
    )


def test_torn_writes_and_flipped_bytes(template: Template, tmp_path: Path) -> None:
    run_trials(template, tmp_path, TRIALS)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_torn_writes_and_flipped_bytes_long(template: Template, tmp_path: Path) -> None:
    run_trials(template, tmp_path, LONG_TRIALS)


def test_rocketmq_queue_cut_below_its_delete_records_floor(tmp_path: Path) -> None:
    """A CommitLog cut before all of topic u's messages (u's log start was moved to 40 by DeleteRecords): the queue
    goes on, empty, at 40 - as a Kafka log does - and is never handed offsets below it again."""
    template = _write_template(tmp_path / "template", "rocketmq")
    target = tmp_path / "case"
    shutil.copytree(template.path, target)
    first_u = min(phy for phy, _ in template.messages[("u", 0)])
    for path in sorted((target / "commitlog").iterdir()):
        base, data = int(path.name), bytearray(path.read_bytes())
        if base + len(data) > first_u:
            cut = max(0, first_u - base)
            path.write_bytes(bytes(data[:cut]) + bytes(len(data) - cut))
    (target / "abort").write_text("0")
    (target / "checkpoint").write_bytes(bytes(4096))
    with template.open(target) as engine:
        assert (engine.log_start_offset("u", 0), engine.log_end_offset("u", 0)) == (U_LOG_START, U_LOG_START)
        assert list(engine.consume("u", 0)) == []
        assert engine.produce("u", 0, [Record(b"after", timestamp_ms=TS)]) == U_LOG_START
        assert engine.log_end_offset("t", 0) == template.model[("t", 0)].end  # written before u: untouched
    with template.open(target) as engine:
        assert [(r.offset, r.value) for r in engine.consume("u", 0)] == [(U_LOG_START, b"after")]
