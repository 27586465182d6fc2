"""Crash recovery on real files, as Kafka's log recovery does it: kill -9 in the middle of producing, torn and corrupted
segment tails, damaged indexes and state files. After any of these, open must succeed, every acknowledged or
intact record must read back exactly once, and nothing past the first invalid byte may be served.

The damage is random but seeded, so a failure reproduces with the case number in its message.
"""

from __future__ import annotations

import logging
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import tidelog
from tidelog import Record
from tidelog.storage.api import StorageEngine

TS = 1_700_000_000_000
TOPIC = "t"
CONFIG = {"log.segment.bytes": 4000, "log.index.interval.bytes": 200}
SRC = Path(__file__).resolve().parents[2] / "src"


# --- independent file readers ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiskBatch:
    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int


def walk_batches(data: bytes) -> list[DiskBatch]:
    batches = []
    pos = 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        (last_delta,) = struct.unpack_from(">i", data, pos + 23)
        (max_ts,) = struct.unpack_from(">q", data, pos + 35)
        if pos + length + 12 > len(data):
            break
        batches.append(DiskBatch(pos, length + 12, base, base + last_delta, max_ts))
        pos += length + 12
    return batches


def segment_logs(partition_dir: Path) -> list[Path]:
    return sorted(p for p in partition_dir.iterdir() if p.name.endswith(".log") and len(p.name) == 24)


def as_tuples(records: list[Record]) -> list[tuple]:
    return [(r.offset, r.timestamp_ms, r.key, r.value, [tuple(h) for h in r.headers]) for r in records]


def open_engine(path: Path, **extra: object) -> StorageEngine:
    return tidelog.open(path, config={**CONFIG, **extra}, background=False)


def check_segment_indexes(engine: StorageEngine, topic: str = TOPIC) -> None:
    """Every segment's indexes pass the sanity check and every entry names a real batch (start, last offset)."""
    partition_log = engine.partition_log(topic, 0)
    for segment in partition_log.segments:
        segment.sanity_check()
        batches = walk_batches(segment.log_path.read_bytes()[: segment.size])
        last_offset_at = {b.position: b.last_offset for b in batches}
        last_offsets = {b.last_offset for b in batches}
        for slot in range(segment.index.entries):
            offset, position = segment.index.entry_at(slot)
            assert last_offset_at.get(position) == offset, (segment.base_offset, slot, offset, position)
        previous = -1
        for slot in range(segment.time_index.entries):
            timestamp, offset = segment.time_index.entry_at(slot)
            assert offset in last_offsets, (segment.base_offset, slot, offset)
            assert timestamp > previous
            previous = timestamp


# --- a closed log to damage -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    path: Path
    records: list[Record]
    segments: dict[str, list[DiskBatch]]  # segment file name -> its batches
    index_files: dict[str, bytes]  # .index and .timeindex files as the clean close left them


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    path = tmp_path_factory.mktemp("template") / "data"
    rng = random.Random(20240601)
    records: list[Record] = []
    with open_engine(path) as engine:
        engine.create_topic(TOPIC, 1)
        for b in range(150):
            batch = [
                Record(
                    rng.randbytes(rng.randrange(5, 80)),
                    key=f"k{b}-{i}".encode(),
                    timestamp_ms=TS + 10 * b + i,
                    headers=[("n", str(i).encode())],
                )
                for i in range(1 + b % 3)
            ]
            base = engine.produce(TOPIC, 0, batch, compression="gzip" if b % 7 == 0 else "none")
            for i, record in enumerate(batch):
                record.offset = base + i
            records += batch
    partition_dir = path / f"{TOPIC}-0"
    segments = {p.name: walk_batches(p.read_bytes()) for p in segment_logs(partition_dir)}
    assert len(segments) >= 4
    index_files = {p.name: p.read_bytes() for p in partition_dir.iterdir() if p.suffix in (".index", ".timeindex")}
    return Template(path, records, segments, index_files)


def copy_of(template: Template, tmp_path: Path, *, clean: bool) -> Path:
    target = tmp_path / "case"
    shutil.copytree(template.path, target)
    if not clean:
        (target / ".kafka_cleanshutdown").unlink()
    return target


def verify_recovered(engine: StorageEngine, template: Template, end_offset: int, context: str) -> None:
    """Exactly the records below `end_offset` come back; nothing beyond is served; the indexes are sound."""
    expected = [r for r in template.records if r.offset < end_offset]
    assert engine.log_end_offset(TOPIC, 0) == end_offset, context
    assert as_tuples(list(engine.consume(TOPIC, 0))) == as_tuples(expected), context
    assert engine.read(TOPIC, 0, end_offset, 1 << 20).slices == (), context
    check_segment_indexes(engine)
    for record in expected[:: max(1, len(expected) // 25)]:  # positioned reads go through the rebuilt indexes
        first = walk_batches(engine.read(TOPIC, 0, record.offset, 1).read_bytes())[0]
        assert first.base_offset <= record.offset <= first.last_offset, context
    if expected:
        found = engine.offset_for_timestamp(TOPIC, 0, expected[-1].timestamp_ms)
        assert found is not None
        assert found.offset == expected[-1].offset, context


# =====================================================================================================================
# kill -9 while producing
# =====================================================================================================================

CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[3])
    import tidelog
    from tidelog import Record

    path, trial = sys.argv[1], int(sys.argv[2])
    config = {"log.flush.interval.messages": 1, "log.segment.bytes": 1500, "log.index.interval.bytes": 100}
    engine = tidelog.open(path, config=config, background=trial % 2 == 0)
    if "crash" not in engine.topics():
        engine.create_topic("crash", 1)
    print("ready", flush=True)
    seq = 0
    while True:
        count = 1 + seq % 3
        records = [
            Record(f"{trial}:{seq}:{j}".encode() * (1 + j), key=b"%d" % j, timestamp_ms=1_700_000_000_000 + seq)
            for j in range(count)
        ]
        base = engine.produce("crash", 0, records)
        print(base, count, trial, seq, flush=True)
        seq += 1
    """
)


def test_kill_minus_nine_loses_no_acknowledged_record(tmp_path: Path) -> None:
    rng = random.Random(99)
    data = tmp_path / "data"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    acknowledged: list[tuple[int, int, int, int]] = []  # (base offset, count, trial, seq)
    for trial in range(5):
        started = time.monotonic()
        stderr_path = tmp_path / f"child-{trial}.stderr"
        with stderr_path.open("w") as stderr:
            child = subprocess.Popen(
                [sys.executable, str(script), str(data), str(trial), str(SRC)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        try:
            ready = child.stdout.readline()
            assert ready == "ready\n", stderr_path.read_text()
            time.sleep(rng.uniform(0.05, 0.6))
        finally:
            child.send_signal(signal.SIGKILL)
            # read through the same buffered pipe as readline: communicate() would read the raw descriptor and
            # miss the acknowledgements readline() had already buffered
            out = child.stdout.read()
            child.wait()
        err = stderr_path.read_text()
        assert child.returncode == -signal.SIGKILL, err
        assert not (data / ".kafka_cleanshutdown").exists()  # the next open must recover
        lines = out.split("\n")[:-1]  # a line cut short by the kill is not an acknowledgement
        trial_acks = [tuple(int(x) for x in line.split()) for line in lines]
        assert trial_acks, f"trial {trial}: the child acknowledged nothing: {err}"
        acknowledged += trial_acks

        with tidelog.open(data, background=False) as engine:
            records = list(engine.consume("crash", 0))
            end = engine.log_end_offset("crash", 0)
            # offsets are dense and the log reads to its end
            assert [r.offset for r in records] == list(range(end))
            by_offset = {r.offset: r for r in records}
            for base, count, ack_trial, seq in acknowledged:
                for j in range(count):
                    record = by_offset[base + j]
                    assert record.value == f"{ack_trial}:{seq}:{j}".encode() * (1 + j)
                    assert record.key == b"%d" % j
            # exactly once, in order, whole batches; what is not acknowledged can only be the batch each kill
            # interrupted (appended, but killed before it printed its offset)
            batches: dict[tuple[int, int], int] = {}
            for record in records:
                t, s, _ = record.value.split(b":", 2)
                batches[(int(t), int(s))] = batches.get((int(t), int(s)), 0) + 1
            assert list(batches) == sorted(batches)
            assert all(count == 1 + s % 3 for (_, s), count in batches.items())
            assert sum(batches.values()) == len(records)  # no batch appears twice
            last_acked: dict[int, int] = {}
            for _, _, t, s in acknowledged:
                last_acked[t] = max(last_acked.get(t, -1), s)
            acked = {(t, s) for _, _, t, s in acknowledged}
            for t, s in batches:
                assert (t, s) in acked or s == last_acked[t] + 1, (t, s)
            for segment in engine.partition_log("crash", 0).segments:
                segment.sanity_check()
        assert time.monotonic() - started < 5


# =====================================================================================================================
# torn tails and flipped bytes
# =====================================================================================================================


@dataclass(frozen=True)
class Damage:
    kind: str
    segment: str
    detail: str
    end_offset: int  # first offset that must be gone
    valid_bytes: int  # the damaged segment's expected size after recovery


def damage_last_segment(template: Template, target: Path, rng: random.Random, kind: str) -> Damage:
    name = sorted(template.segments)[-1]
    return damage_segment(template, target, rng, kind, name)


def damage_segment(template: Template, target: Path, rng: random.Random, kind: str, name: str) -> Damage:
    path = target / f"{TOPIC}-0" / name
    data = bytearray(path.read_bytes())
    batches = template.segments[name]
    next_base = batches[-1].last_offset + 1
    if kind == "truncate":
        cut = rng.randrange(0, len(data))
        path.write_bytes(data[:cut])
        survivors = [b for b in batches if b.position + b.size <= cut]
        end = survivors[-1].last_offset + 1 if survivors else batches[0].base_offset
        valid = survivors[-1].position + survivors[-1].size if survivors else 0
        return Damage(kind, name, f"cut at {cut}/{len(data)}", end, valid)
    if kind == "garbage":
        garbage = rng.randbytes(rng.randrange(1, 300))
        if rng.random() < 0.3:  # garbage that starts like a plausible v2 header
            garbage = struct.pack(">qiib", next_base, rng.randrange(49, 2000), 0, 2) + garbage
        path.write_bytes(bytes(data) + garbage)
        return Damage(kind, name, f"{len(garbage)} garbage bytes", next_base, len(data))
    assert kind == "flip"
    victim = batches[-1 - rng.randrange(min(3, len(batches)))]
    # bytes 8.. except the leader epoch (12-15): batchLength, magic and everything the CRC covers.
    # baseOffset and partitionLeaderEpoch lie outside the CRC, and Kafka does not detect changes there either.
    relative = rng.choice([*range(8, 12), *range(16, victim.size)])
    data[victim.position + relative] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))
    return Damage(
        kind, name, f"flip at byte {relative} of batch {victim.base_offset}", victim.base_offset, victim.position
    )


TORN_CASES = 51


INDEX_TAIL_CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    import tidelog
    from tidelog import Record

    # an index entry for every batch, one segment, a flush every 500 records: at the kill, the active segment's
    # indexes hold entries written at a flush or when their tail filled, and entries only in memory
    config = {"log.index.interval.bytes": 1, "log.flush.interval.messages": 500}
    engine = tidelog.open(sys.argv[1], config=config, background=True)
    engine.create_topic("crash", 1)
    seq = 0
    while True:
        base = engine.produce("crash", 0, [Record(b"%d" % seq, timestamp_ms=1_700_000_000_000 + seq)])
        print(base, seq, flush=True)
        seq += 1
    """
)


def test_kill_minus_nine_with_index_entries_still_in_memory(tmp_path: Path) -> None:
    """Index entries wait in memory until a page of them is there, a flush, or the scheduler's next round of index
    tails (abstract_index.py): a kill leaves the active segment's index files behind the log. After recovery every
    entry names a real batch, a positioned read finds each acknowledged record and a timestamp lookup each
    acknowledged timestamp."""
    data = tmp_path / "data"
    script = tmp_path / "child.py"
    script.write_text(INDEX_TAIL_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(data), str(SRC)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    acknowledged: list[tuple[int, int]] = []
    try:
        assert child.stdout is not None
        while len(acknowledged) < 1700:  # past three pages of offset entries (512 a page) and two flushes
            line = child.stdout.readline()
            assert line, child.stderr.read() if child.stderr else ""
            base, seq = (int(x) for x in line.split())
            acknowledged.append((base, seq))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    with tidelog.open(data, config={"log.index.interval.bytes": 1}, background=False) as engine:
        assert engine.log_end_offset("crash", 0) >= len(acknowledged)
        check_segment_indexes(engine, "crash")
        segment = engine.partition_log("crash", 0).active_segment
        assert segment.index.entries >= len(acknowledged)  # rebuilt: one entry per batch again
        for base, seq in acknowledged[::7]:
            [batch] = walk_batches(engine.read("crash", 0, base, 1).read_bytes())[:1]
            assert batch.base_offset == base, (base, seq)
            found = engine.offset_for_timestamp("crash", 0, TS + seq)
            assert found is not None and found.offset == base, (base, seq, found)


@pytest.mark.parametrize("kind", ["truncate", "garbage", "flip"])
def test_torn_tail_of_the_last_segment(template: Template, tmp_path: Path, kind: str) -> None:
    rng = random.Random(f"torn-{kind}")
    for case in range(TORN_CASES // 3):
        case_dir = tmp_path / f"{case}"
        target = copy_of(template, case_dir, clean=False)
        damage = damage_last_segment(template, target, rng, kind)
        context = f"{kind} case {case}: {damage}"
        with open_engine(target) as engine:
            verify_recovered(engine, template, damage.end_offset, context)
            assert engine.partition_log(TOPIC, 0).active_segment.size == damage.valid_bytes, context
            assert engine.produce(TOPIC, 0, [Record(b"after", timestamp_ms=TS)]) == damage.end_offset
        with open_engine(target) as engine:  # the repaired log opens cleanly and keeps the new record
            assert engine.log_end_offset(TOPIC, 0) == damage.end_offset + 1
            check_segment_indexes(engine)
        shutil.rmtree(case_dir)


@pytest.mark.parametrize("kind", ["truncate", "flip"])
def test_damage_in_an_earlier_unflushed_segment_drops_later_segments(
    template: Template, tmp_path: Path, kind: str
) -> None:
    rng = random.Random(f"earlier-{kind}")
    names = sorted(template.segments)
    for case in range(4):
        case_dir = tmp_path / f"{case}"
        target = copy_of(template, case_dir, clean=False)
        victim = names[rng.randrange(0, len(names) - 1)]
        victim_base = int(victim[:20])
        # the last checkpointed recovery point lies at or before the damaged segment
        recovery_point = rng.choice([0, victim_base])
        (target / "recovery-point-offset-checkpoint").write_text(f"0\n1\n{TOPIC} 0 {recovery_point}\n")
        damage = damage_segment(template, target, rng, kind, victim)
        context = f"{kind} case {case}: {damage}, recovery point {recovery_point}"
        with open_engine(target) as engine:
            verify_recovered(engine, template, damage.end_offset, context)
            bases = [s.base_offset for s in engine.partition_log(TOPIC, 0).segments]
            assert bases == [int(n[:20]) for n in names if int(n[:20]) <= victim_base], context
        remaining = [p.name for p in segment_logs(target / f"{TOPIC}-0")]
        assert remaining == [n for n in names if n <= victim], context
        leftovers = [
            p.name
            for p in (target / f"{TOPIC}-0").iterdir()
            if p.name[:20].isdigit()
            and p.name[:20] > victim[:20]
            # the producer snapshot a clean close writes at the recovered log end is not a leftover
            and not (p.name.endswith(".snapshot") and int(p.name[:20]) == damage.end_offset)
        ]
        assert leftovers == [], context
        shutil.rmtree(case_dir)


def test_full_recovery_of_an_undamaged_log_changes_nothing(template: Template, tmp_path: Path) -> None:
    target = copy_of(template, tmp_path, clean=False)
    (target / "recovery-point-offset-checkpoint").write_text(f"0\n1\n{TOPIC} 0 0\n")
    before = {p.name: p.read_bytes() for p in segment_logs(target / f"{TOPIC}-0")}
    with open_engine(target) as engine:
        verify_recovered(engine, template, len(template.records), "full recovery")
    assert {p.name: p.read_bytes() for p in segment_logs(target / f"{TOPIC}-0")} == before


def test_recovery_of_a_multi_segment_log_with_a_torn_header(template: Template, tmp_path: Path) -> None:
    """Fewer than 17 bytes of a next header (offset, length, epoch, no magic yet) is a partial tail."""
    target = copy_of(template, tmp_path, clean=False)
    last = segment_logs(target / f"{TOPIC}-0")[-1]
    with last.open("ab") as handle:
        handle.write(struct.pack(">qi", len(template.records), 70) + b"\x00\x00")
    with open_engine(target) as engine:
        verify_recovered(engine, template, len(template.records), "torn header")


# =====================================================================================================================
# damaged index files
# =====================================================================================================================


def _index_damage(kind: str, path: Path, log_size: int, rng: random.Random) -> None:
    data = path.read_bytes()
    if kind == "index-truncated":
        path.write_bytes(data[: max(0, len(data) - 3)])
    elif kind == "index-garbage":
        path.write_bytes(rng.randbytes(len(data) + 5))
    elif kind == "index-beyond-log":
        path.write_bytes(data + struct.pack(">ii", 10_000, log_size + 100))
    elif kind == "index-below-base":
        path.write_bytes(data + struct.pack(">ii", -3, 0))
    elif kind == "index-missing":
        path.unlink()
    elif kind == "timeindex-truncated":
        path.write_bytes(data[: max(0, len(data) - 5)])
    elif kind == "timeindex-garbage":
        path.write_bytes(rng.randbytes(len(data) + 7))
    elif kind == "timeindex-going-back":
        path.write_bytes(data + struct.pack(">qi", TS - 10**6, 10_000))
    elif kind == "timeindex-missing":
        path.unlink()
    else:
        raise AssertionError(kind)


INDEX_DAMAGE = [
    "index-truncated",
    "index-garbage",
    "index-beyond-log",
    "index-below-base",
    "index-missing",
    "timeindex-truncated",
    "timeindex-garbage",
    "timeindex-going-back",
    "timeindex-missing",
]


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("kind", INDEX_DAMAGE)
def test_damaged_index_files_are_rebuilt(
    template: Template, tmp_path: Path, kind: str, clean: bool, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(kind)
    target = copy_of(template, tmp_path, clean=clean)
    names = sorted(template.segments)
    victim = names[1]  # an inactive segment: a clean open trusts it unless its indexes fail the check
    suffix = ".timeindex" if kind.startswith("timeindex") else ".index"
    index_path = target / f"{TOPIC}-0" / victim.replace(".log", suffix)
    log_size = (target / f"{TOPIC}-0" / victim).stat().st_size
    _index_damage(kind, index_path, log_size, rng)

    caplog.set_level(logging.WARNING, logger="tidelog.storage")
    with open_engine(target) as engine:
        verify_recovered(engine, template, len(template.records), kind)
        for record in template.records[::17]:  # time lookups through the rebuilt time index
            found = engine.offset_for_timestamp(TOPIC, 0, record.timestamp_ms)
            assert found is not None
            assert found.offset == record.offset
    assert any(victim[:20].lstrip("0") in r.getMessage() or "rebuild" in r.getMessage() for r in caplog.records)

    # on disk, after the close: trimmed, and every entry names a real batch start / last offset
    batches = template.segments[victim]
    base = int(victim[:20])
    index_bytes = index_path.with_suffix(".index").read_bytes()
    assert len(index_bytes) % 8 == 0
    starts = {b.position: b.last_offset for b in batches}
    for i in range(0, len(index_bytes), 8):
        relative, position = struct.unpack_from(">ii", index_bytes, i)
        assert starts.get(position) == base + relative
    time_bytes = index_path.with_suffix(".timeindex").read_bytes()
    assert len(time_bytes) % 12 == 0
    entries = [struct.unpack_from(">qi", time_bytes, i) for i in range(0, len(time_bytes), 12)]
    assert [t for t, _ in entries] == sorted({t for t, _ in entries})
    # the rebuild follows the same rule as the appends did: the very same files come back
    assert index_bytes == template.index_files[victim.replace(".log", ".index")]
    assert entries[-1][0] == max(b.max_timestamp for b in batches), "the final max-timestamp entry is missing"
    assert time_bytes == template.index_files[victim.replace(".log", ".timeindex")]

    with open_engine(target) as engine:  # the next open trusts what the rebuild left behind
        for record in template.records:
            found = engine.offset_for_timestamp(TOPIC, 0, record.timestamp_ms)
            assert found is not None
            assert found.offset == record.offset, record.timestamp_ms


def test_untrimmed_preallocated_index_after_a_crash(template: Template, tmp_path: Path) -> None:
    """A crash leaves the active segment's indexes at their preallocated size, full of zero entries."""
    target = copy_of(template, tmp_path, clean=False)
    last = segment_logs(target / f"{TOPIC}-0")[-1]
    for suffix in (".index", ".timeindex"):
        path = last.with_suffix(suffix)
        with path.open("r+b") as handle:
            handle.truncate(10 * 1024 * 1024)
    with open_engine(target) as engine:
        verify_recovered(engine, template, len(template.records), "preallocated")


# =====================================================================================================================
# damaged state files
# =====================================================================================================================


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage\n", b"0\n5\nt 0 3\n", b"1\n1\nt 0 3\n", b"0\n1\nt zero 3\n", b"\xff\xfe\x00binary"],
    ids=["empty", "text", "short", "version", "malformed", "binary"],
)
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
def test_corrupt_recovery_point_checkpoint(template: Template, tmp_path: Path, content: bytes, clean: bool) -> None:
    target = copy_of(template, tmp_path, clean=clean)
    (target / "recovery-point-offset-checkpoint").write_bytes(content)
    with open_engine(target) as engine:
        verify_recovered(engine, template, len(template.records), "recovery point")
    lines = (target / "recovery-point-offset-checkpoint").read_text().splitlines()
    assert lines == ["0", "1", f"{TOPIC} 0 {len(template.records)}"]


def test_corrupt_log_start_offset_checkpoint(template: Template, tmp_path: Path) -> None:
    target = copy_of(template, tmp_path, clean=False)
    (target / "log-start-offset-checkpoint").write_text("0\nnot a number\n")
    with open_engine(target) as engine:
        assert engine.log_start_offset(TOPIC, 0) == 0
        verify_recovered(engine, template, len(template.records), "log start")


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("content", [b"garbage\n", b"0\n2\n0 0\n", b"0\n1\nx y\n", b"\x00\x01"])
def test_corrupt_leader_epoch_checkpoint_keeps_data(
    template: Template, tmp_path: Path, content: bytes, clean: bool
) -> None:
    target = copy_of(template, tmp_path, clean=clean)
    (target / f"{TOPIC}-0" / "leader-epoch-checkpoint").write_bytes(content)
    with open_engine(target) as engine:
        verify_recovered(engine, template, len(template.records), "leader epoch")
        assert engine.produce(TOPIC, 0, [Record(b"more", timestamp_ms=TS)]) == len(template.records)


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
def test_corrupt_leader_epoch_checkpoint_is_rebuilt_from_the_log(
    template: Template, tmp_path: Path, clean: bool
) -> None:
    target = copy_of(template, tmp_path, clean=clean)
    checkpoint = target / f"{TOPIC}-0" / "leader-epoch-checkpoint"
    checkpoint.write_text("garbage\n")
    with open_engine(target) as engine:
        # every stored batch carries partitionLeaderEpoch 0 from offset 0 on
        assert engine.offset_for_timestamp(TOPIC, 0, -2).leader_epoch == 0
        assert engine.partition_log(TOPIC, 0).leader_epoch_cache.entries() == [(0, 0)]
    assert checkpoint.read_text() == "0\n1\n0 0\n"


def test_corrupt_partition_metadata_is_rewritten(template: Template, tmp_path: Path) -> None:
    target = copy_of(template, tmp_path, clean=False)
    metadata = target / f"{TOPIC}-0" / "partition.metadata"
    original = metadata.read_text()
    metadata.write_text("version: 7\ntopic_id: ???\n")
    with open_engine(target) as engine:
        topic_id = engine.topics()[TOPIC].topic_id
        verify_recovered(engine, template, len(template.records), "partition.metadata")
    assert metadata.read_text() == original == f"version: 0\ntopic_id: {topic_id}\n"


@pytest.mark.parametrize(
    "content",
    [
        b"{garbage",
        b"",
        b'{"topics": 5}',
        b"\xff\xff",
        b'{"generation": 3, "topics": {"t": {"topic_id": "x", "partitions": 1, "con',  # torn write
        b"[]",
        b"null",
        b'{"topics": {"t": 5}}',
        b'{"topics": {"t": {}}}',
        b'{"generation": "7", "topics": {}}',
    ],
)
def test_corrupt_topics_file(template: Template, tmp_path: Path, content: bytes) -> None:
    target = copy_of(template, tmp_path, clean=False)
    topic_id = (target / f"{TOPIC}-0" / "partition.metadata").read_text().split("topic_id: ")[1].strip()
    (target / "tidelog-topics.json").write_bytes(content)
    with open_engine(target) as engine:
        topics = engine.topics()
        assert list(topics) == [TOPIC]
        assert topics[TOPIC].topic_id == topic_id  # adopted from partition.metadata
        assert topics[TOPIC].partitions == 1
        verify_recovered(engine, template, len(template.records), "topics file")


def test_topic_id_survives_corrupt_topics_file_and_one_corrupt_partition_metadata(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_engine(data) as engine:
        topic_id = engine.create_topic(TOPIC, 3).topic_id
        for p in range(3):
            engine.produce(TOPIC, p, [Record(b"x", timestamp_ms=TS)])
    (data / "tidelog-topics.json").write_text("{garbage")
    (data / f"{TOPIC}-0" / "partition.metadata").write_text("junk")
    with open_engine(data) as engine:
        assert engine.topics()[TOPIC].topic_id == topic_id
    for p in range(3):
        assert (data / f"{TOPIC}-{p}" / "partition.metadata").read_text() == f"version: 0\ntopic_id: {topic_id}\n"


def test_corrupt_meta_properties_is_rewritten(template: Template, tmp_path: Path) -> None:
    target = copy_of(template, tmp_path, clean=True)
    (target / "meta.properties").write_text("this is not a properties file\n")
    with open_engine(target) as engine:
        verify_recovered(engine, template, len(template.records), "meta.properties")
    keys = {
        line.split("=", 1)[0]
        for line in (target / "meta.properties").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert keys == {"version", "cluster.id", "node.id", "directory.id"}


def test_everything_damaged_at_once(template: Template, tmp_path: Path) -> None:
    rng = random.Random(7)
    target = copy_of(template, tmp_path, clean=False)
    partition_dir = target / f"{TOPIC}-0"
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "tidelog-topics.json"):
        (target / name).write_bytes(rng.randbytes(40))
    (partition_dir / "leader-epoch-checkpoint").write_bytes(rng.randbytes(10))
    for path in partition_dir.iterdir():
        if path.suffix in (".index", ".timeindex"):
            path.write_bytes(rng.randbytes(rng.randrange(0, 100)))
    (partition_dir / f"{0:020d}.index.tmp").write_bytes(b"left over")  # an interrupted rename
    damage = damage_last_segment(template, target, rng, "truncate")
    with open_engine(target) as engine:
        verify_recovered(engine, template, damage.end_offset, f"everything: {damage}")
    assert not (partition_dir / f"{0:020d}.index.tmp").exists()
    with open_engine(target) as engine:
        verify_recovered(engine, template, damage.end_offset, "second open")
