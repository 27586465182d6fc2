"""The offline RocketMQ-store tools (dump-commitlog, dump-consumequeue, query-message) on a store written by the
CommitLog, the dispatcher, the ConsumeQueues and the IndexFile, run through the `tidelog` command line."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tidelog.cli import main
from tidelog.codec import rocketmq_message as rm
from tidelog.storage.common.index_file import IndexService
from tidelog.storage.rocketmq.commitlog import CommitLog
from tidelog.storage.rocketmq.consume_queue import ConsumeQueue
from tidelog.storage.rocketmq.dispatcher import DispatchBatch, ReputMessageService
from tidelog.storage.rocketmq.index_builder import INDEX_DIR, build_index

TS = 1_700_000_000_000
COMMITLOG_FILE_SIZE = 4096
CQ_FILE_SIZE = 20 * 8


class Stored:
    def __init__(self, topic: str, queue_id: int, queue_offset: int, key: bytes | None, body: bytes, ts: int) -> None:
        self.topic, self.queue_id, self.queue_offset = topic, queue_id, queue_offset
        self.key, self.body, self.ts = key, body, ts
        self.physical_offset = -1
        self.uniq_key = f"UNIQ{queue_id}{topic}{queue_offset:04d}"


def write_store(root: Path, messages: Sequence[tuple[str, int, bytes | None, bytes, int]]) -> list[Stored]:
    """Append through the CommitLog, then dispatch to ConsumeQueues and the IndexFile as the engine does."""
    commitlog = CommitLog(root, COMMITLOG_FILE_SIZE, allocator=None)
    commitlog.load()
    next_offset: dict[tuple[str, int], int] = {}
    stored: list[Stored] = []
    for topic, queue_id, key, body, ts in messages:
        queue_offset = next_offset.get((topic, queue_id), 0)
        next_offset[(topic, queue_id)] = queue_offset + 1
        item = Stored(topic, queue_id, queue_offset, key, body, ts)
        record = rm.Record(value=body, key=key, timestamp_ms=ts - 5, headers=[("h", b"v")], offset=0)
        properties = rm.record_properties(record, item.uniq_key)

        def encode(physical_offset: int, item: Stored = item, properties: str = properties) -> bytes:
            return rm.encode_message(
                topic=item.topic,
                queue_id=item.queue_id,
                body=item.body,
                properties=properties,
                queue_offset=item.queue_offset,
                physical_offset=physical_offset,
                born_timestamp=item.ts - 5,
                store_timestamp=item.ts,
            )

        item.physical_offset = commitlog.put(len(encode(0)), encode, ts)
        stored.append(item)
    queues: dict[tuple[str, int], ConsumeQueue] = {}

    def build_consume_queues(batch: DispatchBatch) -> None:
        for run in batch.runs:
            queue = queues.get((run.topic, run.queue_id))
            if queue is None:
                queue = queues[(run.topic, run.queue_id)] = ConsumeQueue(root, run.topic, run.queue_id, CQ_FILE_SIZE)
            rows = slice(run.start, run.stop)
            queue.put(batch.offsets[rows], batch.sizes[rows], batch.tags_codes[rows], batch.queue_offsets[rows])

    index = IndexService(root / INDEX_DIR, 16, 64, clock=lambda: TS)
    reput = ReputMessageService(
        commitlog,
        lambda: commitlog.max_offset,
        [build_consume_queues, functools.partial(build_index, index)],
        background=False,
    )
    reput.do_reput()
    commitlog.flush()
    for queue in queues.values():
        queue.flush()
        queue.close()
    index.flush()
    index.close()
    commitlog.close()
    return stored


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, list[Stored]]:
    messages: list[tuple[str, int, bytes | None, bytes, int]] = []
    for i in range(30):
        key = [b"Aa", b"BB", b"order-7", b"\x00\xff", None][i % 5]
        messages.append(("orders", i % 2, key, " ".join([f"body-{i}"] * (i % 7 + 1)).encode(), TS + i * 1000))
    messages.append(("payments", 0, b"order-7", b"paid", TS + 40_000))
    return tmp_path, write_store(tmp_path, messages)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_dump_commitlog(store: tuple[Path, list[Stored]], capsys: pytest.CaptureFixture[str]) -> None:
    root, stored = store
    code, out = run(capsys, "dump-commitlog", "--store", str(root), "--print-body")
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("commitLogOffset:")]
    assert len(lines) == len(stored)
    files = sorted((root / "commitlog").iterdir())
    assert len(files) >= 2 and out.count("BLANK at ") == len(files) - 1  # every full file ends with a BLANK marker
    for line, item in zip(lines, stored, strict=True):
        fields = dict(re.findall(r"(\w+): (\S+)", line.split(" properties: ")[0]))
        assert int(fields["commitLogOffset"]) == item.physical_offset
        assert (fields["topic"], int(fields["queueId"]), int(fields["queueOffset"])) == (
            item.topic,
            item.queue_id,
            item.queue_offset,
        )
        assert int(fields["storeTimestamp"]) == item.ts and int(fields["bornTimestamp"]) == item.ts - 5
        assert fields["msgId"] == rm.message_id(rm.DEFAULT_STORE_HOST, item.physical_offset)
        assert f"UNIQ_KEY={item.uniq_key}" in line and line.endswith(f" body: {item.body.decode()}")
    assert out.rstrip().endswith(f"{len(stored)} message(s) in {len(files)} file(s)")

    victim = stored[3]  # flip a body byte: the CRC check reports it, and nothing after it in that file
    path = root / "commitlog" / f"{victim.physical_offset // COMMITLOG_FILE_SIZE * COMMITLOG_FILE_SIZE:020d}"
    data = bytearray(path.read_bytes())
    data[victim.physical_offset % COMMITLOG_FILE_SIZE + 84 + 4] ^= 0xFF
    path.write_bytes(bytes(data))
    code, out = run(capsys, "dump-commitlog", "--store", str(root))
    assert code == 1
    assert f"Found invalid bytes at {victim.physical_offset}:" in out and "CRC" in out.upper()


def test_dump_consumequeue(store: tuple[Path, list[Stored]], capsys: pytest.CaptureFixture[str]) -> None:
    root, stored = store
    code, out = run(capsys, "dump-consumequeue", "--store", str(root), "--topic", "orders", "--queue", "1")
    assert code == 0
    units = re.findall(r"queueOffset: (\d+) commitLogOffset: (\d+) size: (\d+) tagsCode: 0 valid: true", out)
    expected = [s for s in stored if (s.topic, s.queue_id) == ("orders", 1)]
    assert [(int(q), int(o)) for q, o, _ in units] == [(s.queue_offset, s.physical_offset) for s in expected]
    assert out.count("Dumping ") == 2  # 15 units in files of 8
    assert "valid: false" not in out

    # a unit pointing at the wrong message is reported
    queue_file = root / "consumequeue" / "orders" / "1" / f"{0:020d}"
    data = bytearray(queue_file.read_bytes())
    data[20:28] = expected[0].physical_offset.to_bytes(8, "big")
    queue_file.write_bytes(bytes(data))
    code, out = run(capsys, "dump-consumequeue", "--store", str(root), "--topic", "orders", "--queue", "1")
    assert code == 1 and "queueOffset: 1 " in out and "valid: false (the message there is orders/1@0" in out

    code = main(["dump-consumequeue", "--store", str(root), "--topic", "nope", "--queue", "0"])
    assert code == 1 and "no ConsumeQueue" in capsys.readouterr().err


def bodies(out: str) -> list[str]:
    return re.findall(r"^Body:\s+(.*)$", out, flags=re.MULTILINE)


def test_query_message_by_key(store: tuple[Path, list[Stored]], capsys: pytest.CaptureFixture[str]) -> None:
    root, stored = store

    def query(*extra: str) -> tuple[int, str]:
        return run(capsys, "query-message", "--store", str(root), *extra)

    code, out = query("--topic", "orders", "--key", "order-7")
    want = [s for s in reversed(stored) if s.topic == "orders" and s.key == b"order-7"]
    assert code == 0 and bodies(out) == [s.body.decode() for s in want]
    assert f"OffsetID:            {rm.message_id(rm.DEFAULT_STORE_HOST, want[0].physical_offset)}" in out
    assert "Keys:                [order-7]" in out and "Topic:               orders" in out

    # "Aa" and "BB" collide in Java's String.hashCode: the index returns both, the tool keeps the right ones
    code, out = query("--topic", "orders", "--key", "BB")
    assert bodies(out) == [s.body.decode() for s in reversed(stored) if s.key == b"BB"]

    # a time window (store time, ms)
    code, out = query("--topic", "orders", "--key", "order-7", "--begin", str(TS + 7000), "--end", str(TS + 17_000))
    assert bodies(out) == [s.body.decode() for s in want if TS + 7000 <= s.ts <= TS + 17_000]
    assert len(bodies(out)) == 3
    code, out = query("--topic", "orders", "--key", "order-7", "--max", "2")
    assert len(bodies(out)) == 2

    # a binary key is indexed under its base64 form; the UNIQ_KEY is a key too; other topics stay apart
    code, out = query("--topic", "orders", "--key", rm.index_key(b"\x00\xff"))
    assert len(bodies(out)) == 6
    code, out = query("--topic", "orders", "--key", stored[4].uniq_key)
    assert bodies(out) == [stored[4].body.decode()]
    code, out = query("--topic", "payments", "--key", "order-7")
    assert bodies(out) == ["paid"]
    code, out = query("--topic", "orders", "--key", "missing")
    assert code == 1 and bodies(out) == [] and "0 message(s)" in out


def test_query_message_by_id(store: tuple[Path, list[Stored]], capsys: pytest.CaptureFixture[str]) -> None:
    root, stored = store
    item = stored[17]
    msg_id = rm.message_id(rm.DEFAULT_STORE_HOST, item.physical_offset)
    code, out = run(capsys, "query-message", "--store", str(root), "--msg-id", msg_id)
    assert code == 0 and bodies(out) == [item.body.decode()]
    assert f"CommitLog Offset:    {item.physical_offset}" in out and f"Queue Offset:        {item.queue_offset}" in out
    code, out = run(capsys, "query-message", "--store", str(root), "--msg-id", rm.message_id(rm.DEFAULT_STORE_HOST, 7))
    assert code == 1 and "no message at CommitLog offset 7" in out
    other_host = rm.message_id(rm.HostAddress(bytes([10, 0, 0, 1]), 10911), item.physical_offset)
    code, out = run(capsys, "query-message", "--store", str(root), "--msg-id", other_host)
    assert code == 1 and "was stored by 127.0.0.1:10911" in out
    code = main(["query-message", "--store", str(root), "--msg-id", "XYZ"])
    assert code == 2 and "tidelog query-message: error:" in capsys.readouterr().err
    code = main(["query-message", "--store", str(root / "nowhere"), "--msg-id", msg_id])
    assert code == 1 and "has no commitlog/ directory" in capsys.readouterr().err


def test_command_line_entry_point(store: tuple[Path, list[Stored]]) -> None:
    root, _stored = store
    command = ["query-message", "--store", str(root), "--topic", "payments", "--key", "order-7"]
    done = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert bodies(done.stdout) == ["paid"]


def test_query_message_time_window_to_the_millisecond(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The IndexFile keeps whole seconds (an entry of a message stored at T0+2700 ms says T0+2000): a window is
    still exact to the millisecond at both ends, and messages just past its end do not take the places of
    matches when --max is small."""
    offsets_ms = [0, 700, 2700, 2900, 3100]
    write_store(tmp_path, [("t", 0, b"k", b"at %d" % ms, TS + ms) for ms in offsets_ms])

    topic_key = ["--topic", "t", "--key", "k"]

    def query(begin: int, end: int | None = None, *extra: str) -> list[str]:
        window = ["--begin", str(TS + begin)] + ([] if end is None else ["--end", str(TS + end)])
        code, out = run(capsys, "query-message", "--store", str(tmp_path), *topic_key, *window, *extra)
        assert code == (0 if bodies(out) else 1)
        return bodies(out)

    assert query(2700) == ["at 3100", "at 2900", "at 2700"]
    assert query(2701) == ["at 3100", "at 2900"]
    assert query(701, 2700) == ["at 2700"]
    assert query(0, 2699) == ["at 700", "at 0"]
    assert query(0, 2700, "--max", "1") == ["at 2700"]  # 2900's entry says T0+2000: a candidate, not a match
    assert query(3101) == []
