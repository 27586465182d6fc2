"""storage/common/positioned_writes.py and the RocketMQ engine's dispatch round that uses it: pieces written in order
and whole, the first failure ending the call with its errno; a round whose write fails keeps the units of the queues
before the failure and writes the rest once it can, nothing twice and nothing missing; a round that finds no
descriptor lets go of open files and goes on. Every test runs with the compiled loop (_positioned_writes.c) and with
the Python one."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tidelog
from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.storage.common import positioned_writes
from tidelog.storage.common.positioned_writes import Piece, write_pieces_in_python
from tidelog.storage.rocketmq import engine as rocketmq_engine
from tidelog.storage.rocketmq.engine import RocketMQEngine

WritePieces = type(write_pieces_in_python)


@pytest.fixture(params=["compiled", "python"])
def write_pieces(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> WritePieces:
    """The loop under test, also put in the RocketMQ engine's hands."""
    if request.param == "python":
        chosen = write_pieces_in_python
    elif positioned_writes.write_pieces is write_pieces_in_python:
        pytest.fail("tidelog.storage.common._positioned_writes is not built: `pip install -e .` needs a C compiler")
    else:
        chosen = positioned_writes.write_pieces
    monkeypatch.setattr(rocketmq_engine, "write_pieces", chosen)
    return chosen


def test_pieces_are_written_in_order_through_descriptors_and_paths(tmp_path: Path, write_pieces: WritePieces) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(bytes(16))
    second.write_bytes(bytes(16))
    fd = os.open(first, os.O_RDWR)
    open_before = len(os.listdir("/proc/self/fd"))
    try:
        pieces: list[Piece] = [
            (fd, 2, b"abc"),
            (os.fsencode(second), 8, memoryview(b"0123456789")[2:6]),
            (fd, 3, bytearray(b"XY")),  # after the first piece: it wins where they overlap
            (os.fsencode(second), 0, b""),
        ]
        assert write_pieces(pieces) == (4, 0)
        assert len(os.listdir("/proc/self/fd")) == open_before  # the paths were closed after their pieces
    finally:
        os.close(fd)
    assert first.read_bytes() == b"\0\0aXY" + bytes(11)
    assert second.read_bytes() == bytes(8) + b"2345" + bytes(4)
    assert write_pieces([]) == (0, 0)


def test_the_first_failure_ends_the_call_with_its_errno(tmp_path: Path, write_pieces: WritePieces) -> None:
    """A path that is not there (never created), a directory, a full device: the pieces before are written, the
    failing one reports its errno, the later ones are not touched, and no descriptor the call opened stays open."""
    target = tmp_path / "target"
    target.write_bytes(bytes(4))
    (tmp_path / "directory").mkdir()
    open_before = len(os.listdir("/proc/self/fd"))
    for failing, code in [
        (tmp_path / "missing", errno.ENOENT),
        (tmp_path / "directory", errno.EISDIR),
        (Path("/dev/full"), errno.ENOSPC),
    ]:
        target.write_bytes(bytes(4))
        pieces: list[Piece] = [
            (os.fsencode(target), 0, b"a"),
            (os.fsencode(failing), 0, b"x"),
            (os.fsencode(target), 1, b"b"),
        ]
        assert write_pieces(pieces) == (1, code), failing
        assert target.read_bytes() == b"a\0\0\0"
    assert not (tmp_path / "missing").exists()
    assert len(os.listdir("/proc/self/fd")) == open_before
    bad_descriptor = os.open(target, os.O_RDONLY)
    try:
        assert write_pieces([(bad_descriptor, 0, b"x")]) == (0, errno.EBADF)
    finally:
        os.close(bad_descriptor)


def test_the_compiled_loop_refuses_what_is_not_a_piece_before_writing() -> None:
    if positioned_writes.write_pieces is write_pieces_in_python:
        pytest.fail("tidelog.storage.common._positioned_writes is not built")
    compiled = positioned_writes.write_pieces
    for bad, error in [
        ([("a path as str", 0, b"x")], TypeError),
        ([(b"/dev/null", 0)], TypeError),
        ([(b"/dev/null", -1, b"x")], ValueError),
        ([(-3, 0, b"x")], ValueError),
        ([(b"/dev/null", 0, "not bytes")], TypeError),
    ]:
        with pytest.raises(error):
            compiled([(b"/dev/full", 0, b"never written"), *bad])  # type: ignore[list-item]


def open_store(path: Path) -> RocketMQEngine:
    """SYNC_FLUSH without threads: appends are dispatched at the flush, all of them in one round."""
    config = {"tidelog.rocketmq.mapedFileSizeCommitLog": 1 << 20, "tidelog.rocketmq.flushDiskType": "SYNC_FLUSH"}
    engine = tidelog.open(path, engine="rocketmq", config=config, background=False)
    assert isinstance(engine, RocketMQEngine)
    return engine


def values(engine: RocketMQEngine, queue: int) -> list[bytes | None]:
    return [record.value for record in engine.consume("t", queue)]


def test_a_round_that_cannot_write_one_queue(
    tmp_path: Path, write_pieces: WritePieces, caplog: pytest.LogCaptureFixture
) -> None:
    """Six queues written in one round; the third one's file replaced by a directory for the next round: the two
    before it get their units, it and the later ones wait (not readable, the appends succeeded), the failure is
    logged once; with the file back the next round writes the rest. Each queue ends with its two units, none twice,
    and a reopen reads the same."""
    store = tmp_path / "store"
    with open_store(store) as engine:
        engine.create_topic("t", 6)
        for queue in range(6):
            engine.partition("t", queue).append(build_batch([Record(b"first %d" % queue)]))
        engine.flush()
        assert [engine.high_watermark("t", q) for q in range(6)] == [1] * 6
        while len(engine.file_handles):  # let go of every open file, as at the open-file limit: the round's
            engine.file_handles.shrink()  # writes go by path, and the path is what is blocked below
        unit_file = store / "consumequeue" / "t" / "2" / f"{0:020d}"
        aside = unit_file.with_name("aside")
        unit_file.rename(aside)
        unit_file.mkdir()
        for queue in range(6):
            engine.partition("t", queue).append(build_batch([Record(b"second %d" % queue)]))
        with caplog.at_level(logging.WARNING, logger="tidelog.storage.rocketmq"):
            engine.flush()
            engine.catch_up()
        assert [engine.high_watermark("t", q) for q in range(6)] == [2, 2, 1, 1, 1, 1]
        assert [engine.partition("t", q).log_end_offset for q in range(6)] == [2] * 6
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "cannot dispatch" in errors[0] and "Is a directory" in errors[0], errors
        unit_file.rmdir()
        aside.rename(unit_file)
        engine.catch_up()
        assert [engine.high_watermark("t", q) for q in range(6)] == [2] * 6
        for queue in range(6):
            assert values(engine, queue) == [b"first %d" % queue, b"second %d" % queue]
    with open_store(store) as engine:
        for queue in range(6):
            assert values(engine, queue) == [b"first %d" % queue, b"second %d" % queue]
            units = engine.partition("t", queue).units(0, 10)
            assert [queue_offset for queue_offset, _, _ in units] == [0, 1]


NO_DESCRIPTOR_LEFT = """
import logging, os, resource, sys
from pathlib import Path
import tidelog
from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.storage.rocketmq import engine as rocketmq_engine
from tidelog.storage.common.positioned_writes import write_pieces_in_python

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
if sys.argv[2] == "python":
    rocketmq_engine.write_pieces = write_pieces_in_python
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # 32 store files kept open
QUEUES = 40
config = {"tidelog.rocketmq.mapedFileSizeCommitLog": 1 << 20, "tidelog.rocketmq.flushDiskType": "SYNC_FLUSH"}
with tidelog.open(Path(sys.argv[1]), engine="rocketmq", config=config, background=False) as engine:
    engine.create_topic("t", QUEUES)
    for queue in range(QUEUES):
        engine.partition("t", queue).append(build_batch([Record(b"first %d" % queue)]))
    engine.flush()
    for queue in range(QUEUES):  # reads open the files: the engine keeps 32 of them
        assert [r.value for r in engine.consume("t", queue)] == [b"first %d" % queue]
    print("open store files:", len(engine.file_handles))
    for queue in range(QUEUES):
        engine.partition("t", queue).append(build_batch([Record(b"second %d" % queue)]))
    hogs = []
    try:
        while True:
            hogs.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    engine.flush()  # the round: 32 files written through their descriptors, 8 by path with none left to open
    for fd in hogs:
        os.close(fd)
    print("readable:", sum(engine.high_watermark("t", q) == 2 for q in range(QUEUES)))
    print("open store files:", len(engine.file_handles))
"""


@pytest.mark.parametrize("loop", ["compiled", "python"])
def test_a_round_with_no_descriptor_left(tmp_path: Path, loop: str) -> None:
    """At its open-file limit, a round that must open a file by path lets go of half the open ones and writes the
    rest through paths: every queue is written in that round, nothing is logged as failed."""
    if loop == "compiled" and positioned_writes.write_pieces is write_pieces_in_python:
        pytest.fail("tidelog.storage.common._positioned_writes is not built")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NO_DESCRIPTOR_LEFT), str(tmp_path / "store"), loop],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["open store files: 32", "readable: 40"], done.stdout
    assert lines[2].startswith("open store files:") and int(lines[2].split(":")[1]) <= 32, done.stdout
    assert "cannot dispatch" not in done.stderr and "ERROR" not in done.stderr, done.stderr
