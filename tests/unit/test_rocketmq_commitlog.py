"""CommitLog files on disk, as RocketMQ lays them out: 20-digit names, full-size files, BLANK fill, no message across
two files, preallocation of the next file, recovery cutting torn and corrupt tails, the checkpoint and abort files."""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from tidelog.codec import rocketmq_message as rm
from tidelog.errors import KafkaStorageError, RecordTooLargeError
from tidelog.storage.rocketmq.checkpoint import StoreCheckpoint, read_checkpoint, remove_abort_file, take_abort_file
from tidelog.storage.rocketmq.commitlog import CommitLog
from tidelog.storage.rocketmq.mapped_file import AllocateMappedFileService

FILE_SIZE = 4096
TS = 1_700_000_000_000


def put(log: CommitLog, body: bytes, queue_offset: int = 0, extra: str = "", topic: str = "t") -> int:
    properties = f"UNIQ_KEY\x01U{queue_offset}\x02{extra}"
    size = len(rm.encode_message(topic=topic, queue_id=0, body=body, properties=properties))
    return log.put(
        size,
        lambda phys: rm.encode_message(
            topic=topic,
            queue_id=0,
            body=body,
            properties=properties,
            queue_offset=queue_offset,
            physical_offset=phys,
            store_timestamp=TS + queue_offset,
            born_timestamp=TS - queue_offset,
        ),
        TS + queue_offset,
    )


def walk(directory: Path) -> list[tuple[int, int, int]]:
    """(file start, position, total size) of every message, read with struct; BLANK markers as size -1."""
    found = []
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        position = 0
        while position + 8 <= len(data):
            total, magic = struct.unpack_from(">iI", data, position)
            if magic == 0xCBD43194:
                assert total == len(data) - position
                found.append((int(path.name), position, -1))
                break
            if magic != 0xDAA320A7:
                break
            found.append((int(path.name), position, total))
            position += total
    return found


def test_files_blank_fill_and_roll(tmp_path: Path) -> None:
    allocator = AllocateMappedFileService(background=True)
    log = CommitLog(tmp_path, FILE_SIZE, allocator=allocator)
    offsets = [put(log, bytes([i]) * 300, i) for i in range(30)]
    allocator.shutdown()
    names = sorted(p.name for p in (tmp_path / "commitlog").iterdir())
    assert all(len(n) == 20 and n.isdigit() for n in names)
    assert names[:3] == ["00000000000000000000", "00000000000000004096", "00000000000000008192"]
    assert all((tmp_path / "commitlog" / n).stat().st_size == FILE_SIZE for n in names)
    messages = walk(tmp_path / "commitlog")
    starts = [start + position for start, position, size in messages if size > 0]
    assert starts == offsets
    blanks = [(start, position) for start, position, size in messages if size < 0]
    assert len(blanks) >= 2
    for _start, position, size in messages:  # nothing crosses a file boundary
        assert position + max(size, 8) <= FILE_SIZE
    for i, offset in enumerate(offsets):
        message = log.read_message(offset, 91 + 300 + 1 + len(f"UNIQ_KEY\x01U{i}\x02"), check_crc=True)
        assert message.body == bytes([i]) * 300 and message.physical_offset == offset and message.queue_offset == i
        assert log.read_store_timestamp(offset) == TS + i
    assert log.read_born_timestamps(np.array(offsets)).tolist() == [TS - i for i in range(30)]  # across files
    dispatched = [(o, info.queue_offset) for o, info in log.iter_dispatch(0, log.max_offset)]
    assert dispatched == [(o, i) for i, o in enumerate(offsets)]
    with pytest.raises(RecordTooLargeError):
        put(log, b"x" * FILE_SIZE)
    log.close()


def test_the_next_file_is_preallocated(tmp_path: Path) -> None:
    allocator = AllocateMappedFileService(background=True)
    log = CommitLog(tmp_path, FILE_SIZE, allocator=allocator)
    put(log, b"x")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the background thread creates file 2 while file 1 is being written
        if (tmp_path / "commitlog" / "00000000000000004096").exists():
            break
        time.sleep(0.005)
    assert (tmp_path / "commitlog" / "00000000000000004096").exists()
    allocator.shutdown()  # not taken: removed
    assert not (tmp_path / "commitlog" / "00000000000000004096").exists()
    log.close()


def test_load_extends_a_short_file_and_refuses_other_sizes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A short file was cut (torn): it is extended with zeros, with a WARNING naming it, for recovery to check. A
    longer file, or one at an offset the file size does not divide, was written with another file size: refused
    before any file is touched."""
    directory = tmp_path / "commitlog"
    directory.mkdir()
    (directory / "00000000000000000000").write_bytes(b"\1" * FILE_SIZE)
    (directory / "00000000000000004096").write_bytes(b"\2" * 100)
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    log.load()
    assert [(f.path.name, f.extended_from) for f in log.queue.extended] == [("00000000000000004096", 100)]
    assert (directory / "00000000000000004096").read_bytes() == b"\2" * 100 + bytes(FILE_SIZE - 100)
    assert any("00000000000000004096 is 100 bytes long" in r.getMessage() for r in caplog.records)
    log.close()
    (directory / "00000000000000008192").write_bytes(b"\3" * (FILE_SIZE + 1))
    with pytest.raises(KafkaStorageError, match=f"{FILE_SIZE + 1} bytes long"):
        CommitLog(tmp_path, FILE_SIZE, allocator=None).load()
    (directory / "00000000000000008192").unlink()
    (directory / "00000000000000002048").write_bytes(b"\4" * 100)
    (directory / "00000000000000004096").write_bytes(b"\2" * 100)
    with pytest.raises(KafkaStorageError, match="does not start at a multiple"):
        CommitLog(tmp_path, FILE_SIZE, allocator=None).load()
    assert (directory / "00000000000000004096").stat().st_size == 100  # untouched


def reopen(tmp_path: Path) -> CommitLog:
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    log.load()
    return log


def test_recovery_keeps_everything_intact(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    offsets = [put(log, b"m" * 500, i) for i in range(12)]
    end = log.max_offset
    log.close()
    log = reopen(tmp_path)
    result = log.recover(0, check_crc=True)
    assert (result.end, result.truncated_bytes, result.messages) == (end, 0, 12)
    assert put(log, b"next", 12) > offsets[-1]
    log.close()


@pytest.mark.parametrize("damage", ["torn", "flipped_body", "flipped_size", "misplaced"])
def test_recovery_cuts_at_the_first_invalid_message(tmp_path: Path, damage: str) -> None:
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    offsets = [put(log, bytes([65 + i]) * 200, i) for i in range(20)]
    end = log.max_offset
    log.close()
    victim = offsets[15]
    path = tmp_path / "commitlog" / f"{victim - victim % FILE_SIZE:020d}"
    data = bytearray(path.read_bytes())
    position = victim % FILE_SIZE
    if damage == "torn":
        data[position + 100 :] = bytes(len(data) - position - 100)
        for later in (tmp_path / "commitlog").iterdir():
            if int(later.name) > int(path.name):
                later.unlink()
    elif damage == "flipped_body":
        data[position + 95] ^= 0x40
    elif damage == "flipped_size":
        struct.pack_into(">i", data, position, 150)
    else:
        struct.pack_into(">q", data, position + 28, 12345)
    path.write_bytes(bytes(data))
    log = reopen(tmp_path)
    result = log.recover(0, check_crc=True)
    assert result.end == victim and result.messages == 15
    assert result.truncated_bytes > 0 and result.reason
    assert log.max_offset == victim
    assert [o for o, _ in log.iter_dispatch(0, log.max_offset)] == offsets[:15]
    # the bytes after the cut are gone: a second crash cannot bring the old messages back
    assert not bytes(log.read(victim, FILE_SIZE)).strip(b"\0")
    assert all(int(p.name) <= victim for p in (tmp_path / "commitlog").iterdir())
    assert put(log, b"new", 15) == victim
    assert end > victim
    log.close()


def test_recovery_drops_an_incomplete_kafka_batch(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    put(log, b"single", 0)
    batch_start = put(log, b"a", 1, "KAFKA_BATCH\x010/3\x02")
    put(log, b"b", 2, "KAFKA_BATCH\x011/3\x02")  # the third record never made it
    log.close()
    log = reopen(tmp_path)
    result = log.recover(0, check_crc=True)
    assert result.end == batch_start and "Kafka batch" in (result.reason or "")
    log.close()


def test_abnormal_recovery_starts_from_the_checkpointed_file(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    offsets = [put(log, b"z" * 900, i) for i in range(16)]  # 4 per file
    assert log.start_for_abnormal_recovery(TS + 9) == (offsets[8] // FILE_SIZE) * FILE_SIZE
    assert log.start_for_abnormal_recovery(TS - 1) == 0
    assert log.start_for_abnormal_recovery(TS + 100) == (offsets[-1] // FILE_SIZE) * FILE_SIZE
    assert log.start_for_normal_recovery(offsets[5]) == (offsets[5] // FILE_SIZE) * FILE_SIZE
    log.close()


def test_checkpoint_and_abort_files(tmp_path: Path) -> None:
    checkpoint = StoreCheckpoint(tmp_path / "checkpoint")
    checkpoint.physic_msg_timestamp = TS + 10_000
    checkpoint.logics_msg_timestamp = TS + 8_000
    checkpoint.index_msg_timestamp = TS
    checkpoint.flush()
    checkpoint.close()
    assert (tmp_path / "checkpoint").stat().st_size == 4096
    assert read_checkpoint(tmp_path / "checkpoint")["logicsMsgTimestamp"] == TS + 8_000
    raw = (tmp_path / "checkpoint").read_bytes()
    assert struct.unpack_from(">qqq", raw) == (TS + 10_000, TS + 8_000, TS)
    again = StoreCheckpoint(tmp_path / "checkpoint")
    assert again.min_timestamp() == TS + 5_000 and again.min_timestamp_index() == TS
    again.close()
    assert take_abort_file(tmp_path) is True
    assert (tmp_path / "abort").read_text().strip() == str(os.getpid())
    assert take_abort_file(tmp_path) is False  # still there: the "last run" crashed
    remove_abort_file(tmp_path)
    assert not (tmp_path / "abort").exists()


def test_body_crc_is_rocketmqs(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    offset = put(log, b"\xff" * 64)
    raw = log.read(offset, 100)
    assert struct.unpack_from(">i", raw, 8)[0] == zlib.crc32(b"\xff" * 64) & 0x7FFFFFFF
    log.close()


def test_flush_after_recovery_ending_exactly_at_a_file_end(tmp_path: Path) -> None:
    """A crash after the BLANK filled a file and before the next file existed: recovery ends on the file boundary,
    where no file holds the flush position. Flushing (as close does) must return, not spin."""
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    offsets = [put(log, b"m" * 500, 0)]
    while len(list((tmp_path / "commitlog").iterdir())) < 3:
        offsets.append(put(log, b"m" * 500, len(offsets)))
    log.close()
    (tmp_path / "commitlog" / "00000000000000008192").unlink()
    log = reopen(tmp_path)
    assert log.recover(0, check_crc=True).end == 2 * FILE_SIZE
    log.flush()  # returns (it used to spin here for ever)
    assert log.flush() is False  # nothing dirty any more
    assert put(log, b"after", len(offsets)) == 2 * FILE_SIZE  # the next message opens the next file
    assert log.flush() is True
    log.close()
