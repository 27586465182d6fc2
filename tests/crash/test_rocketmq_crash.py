"""Crash recovery of the RocketMQ engine on real files: kill -9 of a process writing with
SYNC_FLUSH, torn tails, flipped bytes and garbage after the end, with and without the abort file. After each, open
must succeed, every acknowledged (or intact) message must read back exactly once, nothing past the first invalid
message may be served, and no Kafka batch may come back in part.
"""

from __future__ import annotations

import os
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
from tidelog.storage.rocketmq.engine import RocketMQEngine

TS = 1_700_000_000_000
FILE_SIZE = 4096
CONFIG = {"tidelog.rocketmq.mapedFileSizeCommitLog": FILE_SIZE, "tidelog.rocketmq.mapedFileSizeConsumeQueue": 400}
SRC = Path(__file__).resolve().parents[2] / "src"


def open_store(path: Path, **extra: object) -> RocketMQEngine:
    engine = tidelog.open(path, engine="rocketmq", config={**CONFIG, **extra}, background=False)
    assert isinstance(engine, RocketMQEngine)
    return engine


# --- kill -9 while producing with SYNC_FLUSH ------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[3])
    import tidelog
    from tidelog import Record

    path, trial = sys.argv[1], int(sys.argv[2])
    config = {"tidelog.rocketmq.flushDiskType": "SYNC_FLUSH", "tidelog.rocketmq.mapedFileSizeCommitLog": 16384,
              "tidelog.rocketmq.mapedFileSizeConsumeQueue": 400}
    engine = tidelog.open(path, engine="rocketmq", config=config, background=trial % 2 == 0)
    if "crash" not in engine.topics():
        engine.create_topic("crash", 2)
    print("ready", flush=True)
    seq = 0
    while True:
        count = 1 + seq % 3
        records = [Record(f"{trial}:{seq}:{j}".encode() * (1 + j), key=b"%d" % j) for j in range(count)]
        base = engine.produce("crash", seq % 2, records)
        print(seq % 2, base, count, trial, seq, flush=True)
        seq += 1
    """
)


def test_kill_minus_nine_loses_no_acknowledged_message(tmp_path: Path) -> None:
    rng = random.Random(7)
    data = tmp_path / "store"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    acknowledged: list[tuple[int, int, int, int, int]] = []  # (partition, base, count, trial, seq)
    for trial in range(4):
        stderr_path = tmp_path / f"child-{trial}.stderr"
        with stderr_path.open("w") as stderr:
            child = subprocess.Popen(
                [sys.executable, str(script), str(data), str(trial), str(SRC)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        assert child.stdout is not None
        try:
            assert child.stdout.readline() == "ready\n", stderr_path.read_text()
            time.sleep(rng.uniform(0.3, 0.8))
        finally:
            child.send_signal(signal.SIGKILL)
            out = child.stdout.read()  # the buffered pipe readline used: communicate() could miss lines
            child.wait(timeout=30)
        lines = out.split("\n")[:-1]  # a line cut short by the kill is not an acknowledgement
        acknowledged += [tuple(int(f) for f in line.split()) for line in lines]  # type: ignore[misc]
        assert (data / "abort").exists()
    assert len(acknowledged) > 20
    with open_store(data, **{"tidelog.rocketmq.mapedFileSizeCommitLog": 16384}) as engine:
        assert engine.recovery.end == engine.commitlog.max_offset
        for partition in (0, 1):
            got = list(engine.consume("crash", partition))
            assert [r.offset for r in got] == list(range(len(got)))  # no gap, no duplicate
            by_offset = {r.offset: r.value for r in got}
            for p, base, count, trial, seq in acknowledged:
                if p != partition:
                    continue
                for j in range(count):
                    assert by_offset.get(base + j) == f"{trial}:{seq}:{j}".encode() * (1 + j), (trial, seq, j)
            # whole batches only: a batch is there with all its records or not at all
            seqs = [tuple(int(f) for f in r.value.decode().split(":")[:2]) for r in got]
            for key in set(seqs):
                assert seqs.count(key) == 1 + key[1] % 3, key


# --- a clean store to damage ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    path: Path
    values: list[bytes]  # queue 0 of topic t, in offset order
    batch_of: list[int]  # batch number of each offset
    units: list[tuple[int, int]]  # (physical offset, size) of each offset


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    path = tmp_path_factory.mktemp("template") / "store"
    rng = random.Random(20240601)
    values: list[bytes] = []
    batch_of: list[int] = []
    with open_store(path) as engine:
        engine.create_topic("t", 2)
        for b in range(120):
            batch = [Record(rng.randbytes(rng.randrange(5, 60)), key=b"k%d" % b) for _ in range(1 + b % 3)]
            engine.produce("t", 0, batch)
            engine.produce("t", 1, [Record(b"other %d" % b)])
            values += [r.value for r in batch]  # type: ignore[misc]
            batch_of += [b] * len(batch)
        units = [(offset, size) for _, offset, size in engine.partition("t", 0).units(0, len(values))]
    assert len(units) == len(values)
    return Template(path, values, batch_of, units)


def copy_store(template: Template, tmp_path: Path, *, crashed: bool) -> Path:
    path = tmp_path / "store"
    shutil.copytree(template.path, path)
    if crashed:
        (path / "abort").write_text("1\n")
    return path


def commitlog_file(path: Path, physical_offset: int) -> tuple[Path, int]:
    start = physical_offset - physical_offset % FILE_SIZE
    return path / "commitlog" / f"{start:020d}", physical_offset - start


def expect_cut_at(template: Template, path: Path, cut_offset: int) -> None:
    """Everything before the batch of `cut_offset` reads back; nothing from it on; appends continue from there."""
    first_batch_offset = template.batch_of.index(template.batch_of[cut_offset])
    with open_store(path) as engine:
        got = [r.value for r in engine.consume("t", 0)]
        assert got == template.values[:first_batch_offset]
        assert engine.log_end_offset("t", 0) == first_batch_offset
        assert engine.produce("t", 0, [Record(b"after")]) == first_batch_offset
    with open_store(path) as engine:  # and the cut holds across another restart
        assert [r.value for r in engine.consume("t", 0)] == [*template.values[:first_batch_offset], b"after"]


@pytest.mark.parametrize("crashed", [True, False], ids=["abort-file", "no-abort-file"])
def test_torn_last_message(template: Template, tmp_path: Path, crashed: bool) -> None:
    path = copy_store(template, tmp_path, crashed=crashed)
    last = len(template.values) - 1
    physical_offset, size = template.units[last]
    file, position = commitlog_file(path, physical_offset)
    with file.open("r+b") as f:  # the write of the message's second half never reached the disk
        f.seek(position + size // 2)
        f.write(bytes(size - size // 2))
    expect_cut_at(template, path, last)


@pytest.mark.parametrize("crashed", [True, False], ids=["abort-file", "no-abort-file"])
def test_flipped_byte_in_a_body(template: Template, tmp_path: Path, crashed: bool) -> None:
    path = copy_store(template, tmp_path, crashed=crashed)
    victim = len(template.values) - 4  # in the last file, so normal recovery scans it too
    physical_offset, _size = template.units[victim]
    file, position = commitlog_file(path, physical_offset)
    data = bytearray(file.read_bytes())
    data[position + 88] ^= 0x40  # the first byte of the body: only the body CRC can tell
    file.write_bytes(bytes(data))
    expect_cut_at(template, path, victim)


def test_garbage_after_the_end_is_cut_and_loses_nothing(template: Template, tmp_path: Path) -> None:
    path = copy_store(template, tmp_path, crashed=True)
    with open_store(path) as engine:
        end = engine.commitlog.max_offset
    (path / "abort").write_text("1\n")
    file, position = commitlog_file(path, end)
    with file.open("r+b") as f:
        f.seek(position)
        f.write(struct.pack(">iI", 200, 0xDAA320A7) + random.Random(3).randbytes(60))
    with open_store(path) as engine:
        assert engine.recovery.truncated_bytes > 0 and engine.recovery.end == end
        assert [r.value for r in engine.consume("t", 0)] == template.values
        assert engine.commitlog.max_offset == end


def test_damage_in_an_early_file_drops_the_later_files_when_recovery_starts_before_it(
    template: Template, tmp_path: Path
) -> None:
    path = copy_store(template, tmp_path, crashed=True)
    (path / "checkpoint").write_bytes(bytes(4096))  # no trustworthy checkpoint: scan from the first file
    victim = next(i for i, (offset, _size) in enumerate(template.units) if offset >= FILE_SIZE)  # in file 2
    physical_offset, _size = template.units[victim]
    file, position = commitlog_file(path, physical_offset)
    with file.open("r+b") as f:
        f.seek(position + 4)
        f.write(b"\x00\x00\x00\x00")  # a broken magic code
    expect_cut_at(template, path, victim)
    assert sorted(p.name for p in (path / "commitlog").iterdir())[-1] <= f"{FILE_SIZE * 2:020d}"


def test_a_short_commitlog_file_is_extended_and_cut_like_a_torn_tail(
    template: Template, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CommitLog file shorter than the file size (a crash while it was made, a copy cut short), after a clean
    shutdown and with a checkpoint saying all is flushed: open extends it with zeros (a WARNING names it), recovers
    as after a crash from that file, cuts in it at the first invalid message and removes the later files."""
    path = copy_store(template, tmp_path, crashed=False)
    victim = next(i for i, (offset, _size) in enumerate(template.units) if offset >= FILE_SIZE)  # in file 2
    physical_offset, size = template.units[victim]
    file, position = commitlog_file(path, physical_offset)
    os.truncate(file, position + size // 2)
    expect_cut_at(template, path, victim)
    assert f"{file} is {position + size // 2} bytes long" in caplog.text
    assert file.stat().st_size == FILE_SIZE
    assert sorted(p.name for p in (path / "commitlog").iterdir())[-1] == file.name


@pytest.mark.parametrize("which", ["first", "last"])
def test_a_short_consume_queue_file_is_rebuilt_from_the_commitlog(
    template: Template, tmp_path: Path, which: str
) -> None:
    """ConsumeQueues are derived: a file of one cut short after a clean shutdown - the first of several (its later
    files go too) or the last - is extended, and every unit comes back from the CommitLog."""
    path = copy_store(template, tmp_path, crashed=False)
    files = sorted((path / "consumequeue" / "t" / "0").iterdir())
    assert len(files) > 2
    os.truncate(files[0] if which == "first" else files[-1], 147)  # in the middle of the 8th unit
    with open_store(path) as engine:
        assert [r.value for r in engine.consume("t", 0)] == template.values
        assert [r.value for r in engine.consume("t", 1)] == [b"other %d" % b for b in range(120)]
        assert [(o, s) for _, o, s in engine.partition("t", 0).units(0, len(template.values))] == template.units
    assert sorted((path / "consumequeue" / "t" / "0").iterdir()) == files
    assert all(f.stat().st_size == 400 for f in files)


def test_a_short_index_file_is_rebuilt_from_the_commitlog(tmp_path: Path) -> None:
    """IndexFiles are derived: one cut short is dropped with the files after it and rebuilt; every key is found."""
    small_index = {"tidelog.rocketmq.maxHashSlotNum": 8, "tidelog.rocketmq.maxIndexNum": 16}
    path = tmp_path / "store"
    with open_store(path, **small_index) as engine:
        engine.create_topic("t", 1)
        for i in range(40):
            engine.produce("t", 0, [Record(b"v%d" % i, key=b"key-%d" % i, timestamp_ms=TS + i)])
    files = sorted((path / "index").iterdir())
    assert len(files) >= 5
    os.truncate(files[1], 100)
    with open_store(path, **small_index) as engine:
        for i in range(40):
            assert [(k.offset, k.timestamp) for k in engine.lookup_key("t", b"key-%d" % i)] == [(i, TS + i)]
    assert len(list((path / "index").iterdir())) == len(files)
