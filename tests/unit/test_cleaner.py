"""Log compaction (cleanup.policy=compact) on real files: what a pass keeps, tombstones and their delete horizon
(KIP-534), codecs, offsets and indexes after cleaning, idempotent producers (RETAIN_EMPTY), the crash-safe swap,
the cleaner-offset-checkpoint, keyless produce, and cleaned segments read by dump-log and kafka-python.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import struct
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from tidelog import Record
from tidelog.codec.batch_chain import Window, batch_table, scan_chain
from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import build_batch
from tidelog.codec.record_layout import key_digests, record_layout
from tidelog.config import EngineConfig
from tidelog.errors import ConfigError, CorruptRecordError, InvalidRecordError, OutOfOrderSequenceError
from tidelog.storage.kafka import cleaner
from tidelog.storage.kafka.engine import KafkaEngine
from tidelog.storage.kafka.offset_map import OffsetMap
from tidelog.tools.dump_log import DumpOptions, dump_files

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.memory_records import MemoryRecords

TS = 1_700_000_000_000
HOUR = 3_600_000
HEADER = struct.Struct(">qiibIhiqqqhii")
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}


class Clock:
    def __init__(self, now: int = TS + HOUR) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def open_engine(path: Path, clock: Clock, **config: object) -> KafkaEngine:
    settings = {"log.segment.bytes": 600, "log.segment.delete.delay.ms": 0, **config}
    return KafkaEngine(EngineConfig.from_mapping(settings, log_dir=path), background=False, clock=clock)


def produce_rounds(engine: KafkaEngine, topic: str, rounds: int, keys: int, *, start: int = 0, **kw: object) -> None:
    """`rounds` batches, each one record per key k0..k{keys-1} with value r<round>-k<key>."""
    for r in range(start, start + rounds):
        records = [Record(f"r{r}-k{k}".encode(), key=f"k{k}".encode(), timestamp_ms=TS + r) for k in range(keys)]
        engine.append(topic, 0, build_batch(records, **kw))  # type: ignore[arg-type]


def contents(engine: KafkaEngine, topic: str) -> list[tuple[int, bytes | None, bytes | None, int | None]]:
    return [(r.offset, r.key, r.value, r.timestamp_ms) for r in engine.consume(topic, 0)]


def disk_batches(path: Path) -> list[tuple[int, ...]]:
    data = path.read_bytes()
    out, pos = [], 0
    while pos + 61 <= len(data):
        fields = HEADER.unpack_from(data, pos)
        out.append(fields)
        pos += fields[1] + 12
    assert pos == len(data)
    return out


@pytest.fixture
def clock() -> Clock:
    return Clock()


# --- configuration ------------------------------------------------------------------------------------------------


def test_config_keys_with_kafka_names_and_defaults(tmp_path: Path) -> None:
    config = EngineConfig.from_mapping({}, log_dir=tmp_path)
    assert config.log_defaults.min_cleanable_dirty_ratio == 0.5
    assert config.log_defaults.delete_retention_ms == 86_400_000
    assert config.log_defaults.min_compaction_lag_ms == 0
    assert config.cleaner.enabled and config.cleaner.backoff_ms == 15_000
    assert config.cleaner.dedupe_buffer_size == 128 * 1024 * 1024
    broker = EngineConfig.from_mapping(
        {
            "log.cleanup.policy": "compact,delete",
            "log.cleaner.min.cleanable.ratio": "0.2",
            "log.cleaner.delete.retention.ms": "10",
            "log.cleaner.min.compaction.lag.ms": "5",
            "log.cleaner.max.compaction.lag.ms": "1000",
            "log.cleaner.enable": "false",
            "log.cleaner.backoff.ms": "50",
            "log.cleaner.dedupe.buffer.size": "4096",
        },
        log_dir=tmp_path,
    )
    defaults = broker.log_defaults
    assert defaults.cleanup_policy == ("compact", "delete") and defaults.compact
    assert (defaults.min_cleanable_dirty_ratio, defaults.delete_retention_ms) == (0.2, 10)
    assert (defaults.min_compaction_lag_ms, defaults.max_compaction_lag_ms) == (5, 1000)
    assert (broker.cleaner.enabled, broker.cleaner.backoff_ms, broker.cleaner.dedupe_buffer_size) == (False, 50, 4096)
    with pytest.raises(ConfigError, match=r"cleanup\.policy"):
        defaults.with_overrides({"cleanup.policy": "shrink"})
    with pytest.raises(ConfigError, match=r"min\.cleanable\.dirty\.ratio"):
        defaults.with_overrides({"min.cleanable.dirty.ratio": "1.5"})


# --- produce -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.ZSTD])
def test_keyless_records_are_refused_by_a_compacted_topic(tmp_path: Path, clock: Clock, codec: Compression) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("c", 1, configs=COMPACT)
        engine.create_topic("d", 1)
        batch = build_batch([Record(b"a", key=b"k"), Record(b"b")], compression=codec)
        with pytest.raises(InvalidRecordError, match="Compacted topic cannot accept message without key"):
            engine.append("c", 0, batch)
        assert engine.log_end_offset("c", 0) == 0
        assert engine.append("d", 0, batch).base_offset == 0  # a delete-policy topic takes them
        assert engine.append("c", 0, build_batch([Record(b"a", key=b"k")], compression=codec)).base_offset == 0


# --- what a pass keeps -------------------------------------------------------------------------------------------


def test_latest_value_per_key_survives_and_older_ones_go(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        produce_rounds(engine, "t", 20, 4)
        partition = engine.partition_log("t", 0)
        active_base = partition.active_segment.base_offset
        before = contents(engine, "t")
        size_before = partition.size_in_bytes
        stats = engine.clean_logs()
        assert len(stats) == 1 and stats[0].end_offset == active_base
        after = contents(engine, "t")
        latest: dict[bytes | None, int] = {}
        for offset, key, _v, _t in before:
            if offset < active_base:
                latest[key] = offset
        expected = [r for r in before if r[0] >= active_base or latest[r[1]] == r[0]]
        assert after == expected
        assert len([r for r in after if r[0] < active_base]) == 4
        assert partition.size_in_bytes < size_before
        assert engine.log_end_offset("t", 0) == 80
        # the pass is checkpointed in Kafka's text format, and nothing is left to clean
        assert (tmp_path / "cleaner-offset-checkpoint").read_text() == f"0\n1\nt 0 {active_base}\n"
        assert engine.clean_logs() == []
        assert not [p for p in (tmp_path / "t-0").iterdir() if p.name.endswith((".cleaned", ".swap", ".deleted"))]
    with open_engine(tmp_path, clock) as engine:  # reopened: the same records, the checkpoint read back
        assert contents(engine, "t") == expected
        assert engine.cleaner.first_dirty[("t", 0)] == active_base
        produce_rounds(engine, "t", 20, 4, start=20)
        engine.clean_logs()
        values = {key: value for _o, key, value, _t in contents(engine, "t")}
        assert values == {f"k{k}".encode(): f"r39-k{k}".encode() for k in range(4)}


def test_delete_policy_topics_and_low_dirty_ratio_are_not_cleaned(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("plain", 1)
        engine.create_topic("lazy", 1, configs={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.9"})
        produce_rounds(engine, "plain", 10, 4)
        produce_rounds(engine, "lazy", 10, 4)
        engine.clean_logs()  # lazy: all dirty, ratio 1.0 -> cleaned once
        produce_rounds(engine, "lazy", 2, 4, start=10)
        before = contents(engine, "lazy")
        assert engine.clean_logs() == []  # now mostly clean: below 0.9
        assert contents(engine, "lazy") == before
        assert len(contents(engine, "plain")) == 40


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs={**COMPACT, "min.compaction.lag.ms": str(HOUR // 2)})
        produce_rounds(engine, "t", 10, 4)  # record time TS..TS+9, clock at TS + 1h: old enough
        clock.now = TS + 10  # now the records are 10 ms old: too young
        before = contents(engine, "t")
        assert engine.clean_logs() == []
        clock.now = TS + HOUR
        assert len(engine.clean_logs()) == 1
        assert len(contents(engine, "t")) < len(before)


def test_a_full_offset_map_ends_the_pass_early(tmp_path: Path, clock: Clock) -> None:
    # 24 bytes per entry at load factor 0.9: 240 bytes hold 9 keys
    with open_engine(tmp_path, clock, **{"log.cleaner.dedupe.buffer.size": 240}) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        for r in range(12):  # 4 fresh keys per batch: the map fills after 3 batches
            records = [Record(b"v", key=f"r{r}k{k}".encode(), timestamp_ms=TS) for k in range(4)]
            engine.append("t", 0, build_batch(records))
        produce_rounds(engine, "t", 3, 4)
        stats = engine.clean_logs()[0]
        assert stats.end_offset == 12  # the batch that filled the map ends at offset 11
        assert engine.cleaner.first_dirty[("t", 0)] == 12
        assert len(contents(engine, "t")) == 60  # nothing had a duplicate yet
        stats = engine.clean_logs()[0]  # the next pass goes on from there
        assert stats.end_offset > 12


# --- how a pass reads segments ------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.ZSTD])
def test_any_read_size_cleans_the_same(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch, codec: Compression
) -> None:
    """A pass reads segments in windows of whole batches (batch_chain's ChainReader): windows of many batches, of
    about one, or smaller than any batch (read again, as large as the batch) give the same cleaned log."""
    big = [Record(os.urandom(1500), key=f"k{k}".encode(), timestamp_ms=TS + 30) for k in range(3)]
    results = []
    for window in (cleaner.READ_CHUNK_BYTES, 700, 50):
        monkeypatch.setattr(cleaner, "READ_CHUNK_BYTES", window)
        path = tmp_path / str(window)
        with open_engine(path, clock, **{"log.segment.bytes": 6000}) as engine:
            engine.create_topic("t", 1, configs=COMPACT)
            produce_rounds(engine, "t", 30, 6, compression=codec)
            engine.append("t", 0, build_batch(big, compression=codec))  # larger than the small windows
            produce_rounds(engine, "t", 30, 3, start=31, compression=codec)  # k3..k5 stay in a batch of six
            engine.partition_log("t", 0).roll()
            first = engine.clean_logs()[0]
            produce_rounds(engine, "t", 10, 2, start=61, compression=codec)  # the next pass maps from mid-log
            engine.partition_log("t", 0).roll()
            second = engine.clean_logs()[0]
            files = {p.name: p.read_bytes() for p in sorted((path / "t-0").glob("*.log"))}
            results.append((first, second, files, contents(engine, "t")))
    assert results[0][0].segments_cleaned > 1 and results[0][0].batches_rewritten > 0
    assert results[1] == results[0] and results[2] == results[0]


@pytest.mark.parametrize("phase", ["offset map", "recopy"])
@pytest.mark.parametrize("damage", ["magic", "size"])
def test_a_damaged_segment_stops_the_pass_and_leaves_the_log_as_it_was(
    tmp_path: Path, clock: Clock, phase: str, damage: str
) -> None:
    """Damage in the chain of a segment a pass reads (a dirty one while mapping keys, a clean one while recopying)
    is a CorruptRecordError naming the file and byte; nothing is swapped in and no `.cleaned` file stays."""
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        produce_rounds(engine, "t", 20, 4)
        for r in range(10):  # batches the first pass keeps
            engine.append("t", 0, build_batch([Record(b"v", key=b"once-%d" % r, timestamp_ms=TS)]))
        if phase == "recopy":
            engine.clean_logs()  # the segments below the first dirty offset are clean now
            produce_rounds(engine, "t", 20, 4, start=20)
        partition = engine.partition_log("t", 0)
        first_dirty = engine.cleaner.first_dirty.get(("t", 0), 0)
        segment, second = next(
            (s, second)
            for s in partition.segments[:-1]
            if (s.base_offset >= first_dirty) == (phase == "offset map")
            and s.size > 0
            and (second := struct.unpack_from(">i", s.read_bytes(8, 4))[0] + 12) < s.size
        )
        if damage == "magic":
            os.pwrite(segment.file.fileno(), b"\x07", second + 16)
            message = "entry has unknown magic 7"
        else:
            os.pwrite(segment.file.fileno(), struct.pack(">i", 5), second + 8)
            message = "entry declares size 5"
        files = {p.name: p.read_bytes() for p in (tmp_path / "t-0").iterdir()}
        with pytest.raises(CorruptRecordError, match=f"{segment.log_path.name}: at byte {second}: {message}"):
            engine.clean_logs()
        assert {p.name: p.read_bytes() for p in (tmp_path / "t-0").iterdir()} == files


# --- tombstones --------------------------------------------------------------------------------------------------


def test_tombstone_lifecycle_with_the_delete_horizon(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs={**COMPACT, "delete.retention.ms": str(HOUR)})
        produce_rounds(engine, "t", 5, 3)
        engine.append("t", 0, build_batch([Record(None, key=b"k1", timestamp_ms=TS + 5)]))  # tombstone for k1
        produce_rounds(engine, "t", 6, 1, start=6)  # k0 only: pushes the tombstone out of the active segment
        partition = engine.partition_log("t", 0)
        clean_time = clock.now
        engine.clean_logs()
        records = contents(engine, "t")
        assert (15, b"k1", None, TS + 5) in records  # the tombstone stays, older k1 values are gone
        assert not [r for r in records if r[1] == b"k1" and r[0] != 15]
        # its batch now carries the delete horizon: attribute bit 6, baseTimestamp = clean time + delete.retention.ms
        tombstone_batches = [
            b for s in partition.segments for b in disk_batches(s.log_path) if b[0] <= 15 <= b[0] + b[6]
        ]
        assert len(tombstone_batches) == 1
        attributes, base_timestamp, max_timestamp = (tombstone_batches[0][i] for i in (5, 7, 8))
        assert attributes & 0x40 and base_timestamp == clean_time + HOUR and max_timestamp == TS + 5
        # before the horizon a later pass keeps it (and the horizon stays the same)
        clock.now = clean_time + HOUR - 1
        produce_rounds(engine, "t", 6, 1, start=12)
        engine.clean_logs()
        assert (15, b"k1", None, TS + 5) in contents(engine, "t")
        # once the horizon has passed the next pass drops it, even with little new dirt
        clock.now = clean_time + HOUR
        assert len(engine.clean_logs()) == 1
        assert not [r for r in contents(engine, "t") if r[1] == b"k1"]


# --- codecs, offsets, indexes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.ZSTD, Compression.LZ4, Compression.SNAPPY])
def test_compressed_batches_are_recompressed_with_their_codec(tmp_path: Path, clock: Clock, codec: Compression) -> None:
    with open_engine(tmp_path, clock, **{"log.segment.bytes": 400}) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        produce_rounds(engine, "t", 12, 5, compression=codec)
        partition = engine.partition_log("t", 0)
        active_base = partition.active_segment.base_offset
        engine.clean_logs()
        for segment in partition.segments[:-1]:
            for fields in disk_batches(segment.log_path):
                assert fields[5] & 0x07 == int(codec)
                assert fields[6] == 4  # lastOffsetDelta kept although only the last rounds stay
        values = {key: value for offset, key, value, _t in contents(engine, "t") if offset < active_base}
        last_round = (active_base - 1) // 5
        assert values == {f"k{k}".encode(): f"r{last_round}-k{k}".encode() for k in range(5)}


def test_offsets_and_lookups_by_offset_and_timestamp_after_cleaning(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock, **{"log.segment.bytes": 1500, "log.index.interval.bytes": 100}) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        for r in range(40):  # one batch per record, keys cycling over 8; timestamps ascending
            engine.append("t", 0, build_batch([Record(b"x" * 30, key=f"k{r % 8}".encode(), timestamp_ms=TS + r)]))
        partition = engine.partition_log("t", 0)
        active_base = partition.active_segment.base_offset
        engine.clean_logs()
        survivors = [r[0] for r in contents(engine, "t")]
        assert survivors == sorted(survivors)
        cleaned = [o for o in survivors if o < active_base]
        assert len(cleaned) == 8
        for segment in partition.segments[:-1]:
            assert segment.index.entries > 0 or segment.size < 100  # rebuilt, sparse
        for target in range(active_base):
            # a fetch at any offset starts at the first survivor at or after it
            got = next(iter(engine.consume("t", 0, target)))
            assert got.offset == min(o for o in survivors if o >= target)
            found = engine.offset_for_timestamp("t", 0, TS + target)
            assert found is not None and found.offset == min(o for o in survivors if o >= target)
            assert found.timestamp == TS + found.offset


# --- idempotent producers ----------------------------------------------------------------------------------------


def test_an_idempotent_producer_continues_after_its_last_batch_was_emptied(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        pid, epoch = 4242, 0
        sequence = 0
        for r in range(6):
            records = [Record(f"p{r}".encode() * 10, key=b"k0", timestamp_ms=TS + r) for _ in range(3)]
            engine.append("t", 0, build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=sequence))
            sequence += 3
        # another client then overwrites the key, so every record of the producer's batches is obsolete
        produce_rounds(engine, "t", 12, 1)
        partition = engine.partition_log("t", 0)
        last_producer_offset = 17
        engine.clean_logs()
        batches = [b for s in partition.segments for b in disk_batches(s.log_path)]
        producer_batches = [b for b in batches if b[9] == pid]
        # only the producer's last batch stays, header-only: count 0, same offsets, sequence, epoch
        assert len(producer_batches) == 1
        empty = producer_batches[0]
        assert (empty[0], empty[6], empty[12], empty[11], empty[10]) == (15, 2, 0, 15, epoch)
        assert empty[7] == -1 and empty[5] & 0x07 == 0
        assert last_producer_offset == empty[0] + empty[6]
        # the producer goes on with its next sequence: no OUT_OF_ORDER_SEQUENCE, even after a reopen
    with open_engine(tmp_path, clock) as engine:
        result = engine.append(
            "t", 0, build_batch([Record(b"next", key=b"k0")], producer_id=pid, producer_epoch=epoch, base_sequence=18)
        )
        assert result.base_offset == 30
        with pytest.raises(OutOfOrderSequenceError):
            gap = build_batch([Record(b"gap", key=b"k0")], producer_id=pid, producer_epoch=epoch, base_sequence=25)
            engine.append("t", 0, gap)


# --- crash-safe swap ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["cleaned", "swap", "deleted", "some-final"])
def test_a_crash_in_the_middle_of_a_swap_leaves_a_consistent_log(tmp_path: Path, clock: Clock, step: str) -> None:
    """The files each step of the swap leaves behind, made by hand from a real pass, then a reopen."""
    reference = tmp_path / "reference"
    crashed = tmp_path / "crashed"
    with open_engine(reference, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        produce_rounds(engine, "t", 20, 4)
        engine.clean_logs()  # small cleaned segments, which the next pass merges into one
        produce_rounds(engine, "t", 20, 2, start=20)  # k2 and k3 keep their values from the first rounds
        before = contents(engine, "t")
        old_bases = [s.base_offset for s in engine.partition_log("t", 0).segments]
    shutil.copytree(reference, crashed)
    merging = {"log.segment.bytes": 2000}  # the next pass merges all but the active segment into one
    with open_engine(reference, clock, **merging) as engine:
        stats = engine.clean_logs()[0]
        assert stats.segments_cleaned > 1
        after = contents(engine, "t")
        cleaned_bases = [s.base_offset for s in engine.partition_log("t", 0).segments]
    assert len([b for b in old_bases if b < cleaned_bases[1]]) > 1  # the first group merged several segments
    # the crash hits the swap of the first group, whose output is the first segment of the reference log
    ref_dir, dir_ = reference / "t-0", crashed / "t-0"
    first = f"{0:020d}"
    replaced = sorted(p.name[:20] for p in dir_.iterdir() if p.name.endswith(".log"))
    replaced = [b for b in replaced if int(b) < cleaned_bases[1]]
    new_files = {s: (ref_dir / f"{first}{s}").read_bytes() for s in (".log", ".index", ".timeindex")}
    (crashed / ".kafka_cleanshutdown").unlink()  # it crashed
    if step == "cleaned":  # step 1: the .cleaned files were being written
        for suffix, data in new_files.items():
            (dir_ / f"{first}{suffix}.cleaned").write_bytes(data[: len(data) // 2])
        expected = before
    else:
        for suffix, data in new_files.items():
            (dir_ / f"{first}{suffix}.swap").write_bytes(data)  # step 2 done
        if step in ("deleted", "some-final"):  # step 3: old segments renamed .deleted (the first one of them only)
            for suffix in (".log", ".index", ".timeindex"):
                os.rename(dir_ / f"{replaced[0]}{suffix}", dir_ / f"{replaced[0]}{suffix}.deleted")
        if step == "some-final":  # step 4 begun: the indexes have their final names, the .log not yet
            for suffix in (".index", ".timeindex"):
                os.rename(dir_ / f"{first}{suffix}.swap", dir_ / f"{first}{suffix}")
        expected = [r for r in after if r[0] < cleaned_bases[1]] + [r for r in before if r[0] >= cleaned_bases[1]]
    with open_engine(crashed, clock, **merging) as engine:
        assert contents(engine, "t") == expected
        names = [p.name for p in dir_.iterdir()]
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))]
        bases = sorted(int(n[:20]) for n in names if n.endswith(".log"))
        assert bases == (old_bases if step == "cleaned" else [0] + [b for b in old_bases if b >= cleaned_bases[1]])
        # the log goes on working: append, clean again, read
        produce_rounds(engine, "t", 4, 4, start=40)
        engine.clean_logs()
        values = {key: value for _o, key, value, _t in contents(engine, "t")}
        assert values == {f"k{k}".encode(): f"r43-k{k}".encode() for k in range(4)}


def test_a_swap_covers_the_offsets_of_its_batch_headers_up_to_a_partial_tail(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Completing a `.log.swap` at load replaces the segments below the offset after its last whole batch, read from
    the batch headers over several reads (bodies larger than a read skipped unread), not from a torn tail; a damaged
    chain in it stops the load with a CorruptRecordError."""
    with open_engine(tmp_path / "log", clock, **{"log.segment.bytes": 2000}) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        produce_rounds(engine, "t", 100, 4)
        before = contents(engine, "t")
        bases = [s.base_offset for s in engine.partition_log("t", 0).segments]
    cut = bases[2]
    assert bases[0] == 0 and len(bases) > 4
    bigs = {cut // 2, cut - 1}  # batches larger than a header read

    def value(offset: int) -> bytes:
        return (bytes(100_000) if offset in bigs else b"") + b"new-%d" % offset

    batches = [build_batch([Record(value(o), key=b"n%d" % o, timestamp_ms=TS)], base_offset=o) for o in range(cut)]
    swap = b"".join(batches)
    assert len(swap) > 3 * 64 * 1024
    for name in ("torn", "damaged"):
        shutil.copytree(tmp_path / "log", tmp_path / name)
    swap_name = f"{0:020d}.log.swap"
    (tmp_path / "log" / "t-0" / swap_name).write_bytes(swap)
    with open_engine(tmp_path / "log", clock) as engine:
        assert [s.base_offset for s in engine.partition_log("t", 0).segments] == [0, *bases[2:]]
        got = contents(engine, "t")
    assert [(r[0], r[2]) for r in got[:cut]] == [(o, value(o)) for o in range(cut)]
    assert got[cut:] == [r for r in before if r[0] >= cut]

    # a torn batch after the last whole one, reaching past bases[4], covers nothing (recovery then cuts it off)
    torn = build_batch([Record(b"torn", key=b"t", timestamp_ms=TS)] * 200, base_offset=cut)[:80]
    (tmp_path / "torn" / "t-0" / swap_name).write_bytes(swap + torn)
    with caplog.at_level(logging.INFO, logger="tidelog.storage"), open_engine(tmp_path / "torn", clock) as engine:
        assert contents(engine, "t")[:cut] == got[:cut]
    replaced = {m.split()[1] for m in caplog.messages if " is replaced by " in m}
    assert replaced == {f"{base:020d}{suffix}" for base in bases[:2] for suffix in (".log", ".index", ".timeindex")}

    damaged = bytearray(swap)
    position = sum(len(b) for b in batches[: cut // 2 + 1])  # the batch after the first large one
    damaged[position + 8 : position + 12] = bytes(4)
    (tmp_path / "damaged" / "t-0" / swap_name).write_bytes(damaged)
    with pytest.raises(CorruptRecordError, match=rf"{swap_name}: at byte {position}: entry declares size 0"):
        open_engine(tmp_path / "damaged", clock)


def test_readers_holding_slices_keep_reading_through_a_swap(tmp_path: Path, clock: Clock) -> None:
    settings = {"log.segment.bytes": 600, "log.segment.delete.delay.ms": 60_000, "log.cleaner.enable": False}
    config = EngineConfig.from_mapping(settings, log_dir=tmp_path)
    with KafkaEngine(config, background=True, clock=clock) as engine:  # a scheduler delays the file deletion
        engine.create_topic("t", 1, configs=COMPACT)
        produce_rounds(engine, "t", 20, 4)
        slices = engine.read("t", 0, 0, 1 << 20)  # a fetch in progress
        expected = b"".join(s.read() for s in slices.slices)
        engine.clean_logs()
        assert b"".join(s.read() for s in slices.slices) == expected  # the old files stay open until deleted
        assert any(p.name.endswith(".deleted") for p in (tmp_path / "t-0").iterdir())


# --- Kafka-compatible output -------------------------------------------------------------------------------------


def test_cleaned_segments_read_by_dump_log_and_kafka_python(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs={**COMPACT, "delete.retention.ms": str(HOUR)})
        produce_rounds(engine, "t", 8, 3, compression=Compression.GZIP)
        engine.append("t", 0, build_batch([Record(None, key=b"k2", timestamp_ms=TS + 9)], compression=Compression.GZIP))
        produce_rounds(engine, "t", 8, 1, start=10)
        engine.clean_logs()
        partition = engine.partition_log("t", 0)
        tombstone_segment = next(s for s in partition.segments if s.base_offset <= 24 and s.size)
        cleaned = tombstone_segment.log_path
        upper = partition.segments[partition.segments.index(tombstone_segment) + 1].base_offset
        expected = [r for r in contents(engine, "t") if tombstone_segment.base_offset <= r[0] < upper]
        assert (24, b"k2", None, TS + 9) in expected
    out, err = io.StringIO(), io.StringIO()
    assert dump_files([str(cleaned)], DumpOptions(print_data_log=True), out=out, err=err) == 0
    text = out.getvalue()
    assert "isvalid: false" not in text
    assert err.getvalue().startswith("Non-consecutive offsets")  # as kafka-dump-log says of a compacted segment
    assert f"deleteHorizonMs: OptionalLong[{clock.now + HOUR}]" in text
    assert "compresscodec: gzip" in text
    # kafka-python's record parser: the same records, CRCs valid
    records = MemoryRecords(cleaned.read_bytes())
    seen = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        seen += [(r.offset, r.key, r.value, r.timestamp) for r in batch]
    assert seen == expected


def test_key_digests_tell_keys_apart_and_match_equal_keys() -> None:
    keys = [b"", b"a", b"a\x00", b"\x00a", b"b", b"12345678", b"123456789", b"12345678\x00", b"x" * 100, b"x" * 101]
    keys += [k for k in keys]  # each twice
    keys += [f"key-{i}".encode() for i in range(2000)]
    batch = build_batch([Record(b"v" * (i % 7), key=k, timestamp_ms=TS) for i, k in enumerate(keys)])
    chain = scan_chain(batch)
    layout = record_layout(batch, batch_table(Window(batch, 0, chain.positions, chain.sizes)))
    digests = key_digests(layout, np.arange(len(keys)))
    assert all(len(d) == 16 for d in digests)
    by_key: dict[bytes, set[bytes]] = {}
    for key, digest in zip(keys, digests, strict=True):
        by_key.setdefault(key, set()).add(digest)
    assert all(len(d) == 1 for d in by_key.values())  # equal keys, equal digests
    assert len({next(iter(d)) for d in by_key.values()}) == len(by_key)  # distinct keys, distinct digests


def test_offset_map_lookup_tells_apart_digests_sharing_their_first_half() -> None:
    offset_map = OffsetMap(24 * 100)
    same_high = [struct.pack("=QQ", 7, low) for low in (3, 1, 2)]
    offset_map.put_many([*same_high, struct.pack("=QQ", 1, 1), same_high[1]], [10, 11, 12, 13, 14])
    assert len(offset_map) == 4
    offset_map.freeze()
    queries = np.frombuffer(b"".join([*same_high, struct.pack("=QQ", 7, 9), struct.pack("=QQ", 9, 1)]), np.uint64)
    assert offset_map.get_many(queries.reshape(-1, 2)).tolist() == [10, 14, 12, -1, -1]


def test_compact_delete_also_applies_time_retention(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        configs = {**COMPACT, "cleanup.policy": "compact,delete", "retention.ms": str(2 * HOUR)}
        engine.create_topic("t", 1, configs=configs)
        produce_rounds(engine, "t", 10, 4)  # record time TS..: three hours old at the clock below
        clock.now = TS + 3 * HOUR
        for r in range(10, 20):
            records = [Record(f"r{r}-k{k}".encode(), key=f"k{k}".encode(), timestamp_ms=clock.now) for k in range(4)]
            engine.append("t", 0, build_batch(records))
        assert engine.delete_old_segments() > 0  # the old rounds' segments expire
        start = engine.log_start_offset("t", 0)
        assert start > 0
        records = contents(engine, "t")
        assert records[0][0] >= start and all(r[3] == clock.now for r in records)
        produce_rounds(engine, "t", 6, 4, start=20)
        engine.clean_logs()  # the first dirty offset moves along with the log start
        values = {key: value for _o, key, value, _t in contents(engine, "t")}
        assert values == {f"k{k}".encode(): f"r25-k{k}".encode() for k in range(4)}


def test_max_compaction_lag_rolls_the_active_segment_and_forces_a_clean(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock, **{"log.segment.bytes": 1 << 20}) as engine:
        lag = {"cleanup.policy": "compact", "max.compaction.lag.ms": "1000", "min.cleanable.dirty.ratio": "0.99"}
        engine.create_topic("t", 1, configs=lag)
        engine.create_topic("plain", 1, configs={"max.compaction.lag.ms": "1000"})  # delete policy: no effect
        for topic in ("t", "plain"):
            for r in range(3):  # record time moves 2 s per round: past the lag, so each round rolls (KIP-354)
                records = [Record(b"v%d" % r, key=b"k", timestamp_ms=TS + 2000 * r)]
                engine.append(topic, 0, build_batch(records))
        assert [s.base_offset for s in engine.partition_log("t", 0).segments] == [0, 1, 2]
        assert len(engine.partition_log("plain", 0).segments) == 1
        engine.clean_logs()  # the dirty ratio is below 0.99 after a first pass, but the lag is exceeded
        produce = build_batch([Record(b"v3", key=b"k", timestamp_ms=TS + 6000)])
        engine.append("t", 0, produce)
        to_clean = engine.cleaner.log_to_clean(engine.partition_log("t", 0))
        assert to_clean.cleanable_ratio < 0.99 and to_clean.must_clean  # overdue, not dirty enough
        assert len(engine.clean_logs()) == 1
        assert [r[2] for r in contents(engine, "t")] == [b"v2", b"v3"]  # v3 is in the active segment


def test_an_aborted_pass_leaves_the_log_as_it_was(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        produce_rounds(engine, "t", 20, 4)
        before = contents(engine, "t")
        engine.cleaner.abort()  # what closing the engine does to a pass in progress
        assert engine.clean_logs() == []
        assert contents(engine, "t") == before
        assert not [p for p in (tmp_path / "t-0").iterdir() if p.name.endswith((".cleaned", ".swap", ".deleted"))]
        assert not (tmp_path / "cleaner-offset-checkpoint").exists()


def test_the_background_cleaner_runs_on_its_own_thread(tmp_path: Path) -> None:
    settings = {"log.segment.bytes": 600, "log.cleaner.backoff.ms": 50}
    with KafkaEngine(EngineConfig.from_mapping(settings, log_dir=tmp_path), background=True) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        produce_rounds(engine, "t", 20, 4)
        active_base = engine.partition_log("t", 0).active_segment.base_offset
        for _ in range(600):  # up to 60 s on a loaded machine (it may clean while the rounds are produced, too)
            if engine.cleaner.first_dirty.get(("t", 0), 0) == active_base:
                break
            time.sleep(0.1)
        assert engine.cleaner.first_dirty[("t", 0)] == active_base
        assert len(contents(engine, "t")) < 80


def test_a_deleted_topic_leaves_the_cleaner_checkpoint(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        for topic in ("gone", "kept"):
            engine.create_topic(topic, 1, configs=COMPACT)
            produce_rounds(engine, topic, 20, 4)
        assert len(engine.clean_logs()) == 2
        engine.delete_topic("gone")
        assert ("gone", 0) not in engine.cleaner.first_dirty
        engine.create_topic("gone", 1, configs=COMPACT)
        produce_rounds(engine, "gone", 20, 4)
        to_clean = engine.cleaner.log_to_clean(engine.partition_log("gone", 0))
        assert to_clean.first_dirty_offset == 0  # the new topic is cleaned from its start
        engine.clean_logs()
        text = (tmp_path / "cleaner-offset-checkpoint").read_text().splitlines()
        assert text[:2] == ["0", "2"] and {line.split()[0] for line in text[2:]} == {"gone", "kept"}
        values = {key: value for _o, key, value, _t in contents(engine, "gone")}
        assert values == {f"k{k}".encode(): f"r19-k{k}".encode() for k in range(4)}
