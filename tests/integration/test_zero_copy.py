"""Fetch sends record data zero-copy: `loop.sendfile` straight from the segment file, observed in-process.

A Broker runs in the test's own event loop, whose `sendfile` is wrapped to record each call (then does the real
one). A Fetch over a raw socket for a batch above SENDFILE_MIN_BYTES must go out through exactly one sendfile of
that batch's bytes from its `.log` segment, and the bytes the client receives must be the segment's own; a batch
below the threshold goes by pread + write (one syscall pair beats a drain and a sendfile for small slices). Fetch v17,
which names the topic by id, goes out the same way.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import struct
from pathlib import Path
from typing import Any

import pytest

import kafka_wire
from tidelog.broker.broker import Broker
from tidelog.broker.config import BrokerConfig
from tidelog.broker.server import SENDFILE_MIN_BYTES
from tidelog.codec.record_batch import Record, build_batch

TOPIC = "zero-copy"
FETCH = 1


def fetch_v4(correlation_id: int, offset: int, max_bytes: int = 4 << 20) -> bytes:
    """A framed Fetch v4 for partition 0 of TOPIC (request header v1), answered at once (min_bytes 1)."""
    name = TOPIC.encode()
    header = struct.pack(">hhih", FETCH, 4, correlation_id, 4) + b"test"
    body = struct.pack(">iiiib", -1, 500, 1, max_bytes, 0)  # replica, max wait, min bytes, max bytes, isolation
    body += struct.pack(">ih", 1, len(name)) + name + struct.pack(">iiqi", 1, 0, offset, max_bytes)
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def records_of_fetch_v4(payload: bytes, correlation_id: int) -> bytes:
    cid, _throttle, topics, name_length = struct.unpack_from(">iiih", payload, 0)
    assert (cid, topics) == (correlation_id, 1)
    pos = 14 + name_length
    count, _partition, error, _hw, _lso, aborted = struct.unpack_from(">iihqqi", payload, pos)
    assert (count, error, aborted) == (1, 0, -1 if aborted < 0 else 0)
    pos += 30
    (size,) = struct.unpack_from(">i", payload, pos)
    records = payload[pos + 4 : pos + 4 + size]
    assert len(records) == size and pos + 4 + size == len(payload)
    return records


async def fetch(port: int, correlation_id: int, offset: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(fetch_v4(correlation_id, offset))
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        return records_of_fetch_v4(await reader.readexactly(size), correlation_id)
    finally:
        writer.close()
        await writer.wait_closed()


async def fetch_v17(port: int, correlation_id: int, topic_id: str) -> bytes:
    """The records of partition 0 of the topic `topic_id` names, from offset 0, through Fetch v17 (by topic id)."""
    body = {
        "max_wait": 500,
        "min_bytes": 1,
        "max_bytes": 4 << 20,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {"topic_id": topic_id, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 4 << 20}]}
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(kafka_wire.encode_request(FETCH, 17, body, correlation_id))
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        response = kafka_wire.decode_response(FETCH, 17, await reader.readexactly(size))
        [partition] = response.responses[0].partitions
        assert partition.error_code == 0
        return bytes(partition.records)
    finally:
        writer.close()
        await writer.wait_closed()


async def serve_fetches(log_dir: Path) -> tuple[list[tuple[int, int, int, bool]], dict[str, Any]]:
    settings = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(log_dir), "offsets.topic.num.partitions": "1"}
    broker = Broker(BrokerConfig.from_mapping(settings))
    await broker.start()
    loop = asyncio.get_running_loop()
    calls: list[tuple[int, int, int, bool]] = []  # (inode of the file, offset, count, fallback allowed)
    real_sendfile = loop.sendfile

    async def recording_sendfile(transport: Any, file: Any, offset: int = 0, count: int | None = None, **kw: Any):
        calls.append((os.fstat(file.fileno()).st_ino, offset, count or 0, kw.get("fallback", True)))
        return await real_sendfile(transport, file, offset, count, **kw)

    loop.sendfile = recording_sendfile  # type: ignore[method-assign]
    try:
        broker.engine.create_topic(TOPIC, 1)
        partition = broker.engine.partition(TOPIC, 0)
        large = build_batch([Record(value=os.urandom(40_000), key=b"k%d" % i) for i in range(8)])
        small = build_batch([Record(value=b"small", key=b"s")], base_offset=8)
        partition.append(large)
        partition.append(small)
        segment = log_dir / f"{TOPIC}-0" / "00000000000000000000.log"
        port = broker.bound_ports[0]
        got = {
            "segment": segment.read_bytes(),
            "segment_inode": segment.stat().st_ino,
            "large_size": len(large),
            "large": await fetch(port, 1, 0),
            "calls_after_large": list(calls),
            "small": await fetch(port, 2, 8),
        }
        calls_before_v17 = len(calls)
        got["large_v17"] = await fetch_v17(port, 3, broker.engine.topics()[TOPIC].topic_id)
        got["calls_of_v17"] = calls[calls_before_v17:]
        return calls, got
    finally:
        loop.sendfile = real_sendfile  # type: ignore[method-assign]
        await broker.stop()


def test_a_large_fetch_is_sent_with_sendfile_and_a_small_one_is_not(tmp_path: Path) -> None:
    calls, got = asyncio.run(serve_fetches(tmp_path))
    large_size = got["large_size"]
    assert large_size >= SENDFILE_MIN_BYTES
    assert got["segment"][:large_size] == got["large"][:large_size], "the client got other bytes than the segment's"
    assert got["calls_after_large"] == [(got["segment_inode"], 0, len(got["large"]), False)], "not one sendfile"
    assert len(got["large"]) >= large_size
    assert got["small"] == got["segment"][large_size:], "the small batch came back changed"
    assert got["large_v17"] == got["large"], "Fetch v17 got other bytes than Fetch v4"
    assert got["calls_of_v17"] == got["calls_after_large"], "Fetch v17's records did not go by one sendfile"
    assert calls == got["calls_after_large"] * 2, "a slice under SENDFILE_MIN_BYTES went by sendfile"


async def fetch_with_failing_sendfile(log_dir: Path) -> dict[str, Any]:
    """The same broker, whose sendfile fails with EIO (a segment file the disk cannot read): the client of that
    Fetch must see its connection closed at once, not wait for an answer that never comes; others go on."""
    settings = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(log_dir), "offsets.topic.num.partitions": "1"}
    broker = Broker(BrokerConfig.from_mapping(settings))
    await broker.start()
    loop = asyncio.get_running_loop()
    real_sendfile = loop.sendfile

    async def failing_sendfile(*args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EIO, "Input/output error")

    try:
        broker.engine.create_topic(TOPIC, 1)
        broker.engine.partition(TOPIC, 0).append(build_batch([Record(value=os.urandom(SENDFILE_MIN_BYTES + 1000))]))
        port = broker.bound_ports[0]
        loop.sendfile = failing_sendfile  # type: ignore[method-assign]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(fetch_v4(1, 0))
        started = loop.time()
        try:
            answer = await asyncio.wait_for(reader.read(), 10)  # until EOF (or a reset)
        except ConnectionResetError:
            answer = b""
        closed_after = loop.time() - started
        writer.close()
        loop.sendfile = real_sendfile  # type: ignore[method-assign]
        return {"answer": answer, "closed_after": closed_after, "next": await fetch(port, 2, 0)}
    finally:
        loop.sendfile = real_sendfile  # type: ignore[method-assign]
        await broker.stop()


def test_a_response_that_cannot_be_sent_closes_its_connection(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="tidelog.broker"):
        got = asyncio.run(fetch_with_failing_sendfile(tmp_path))
    assert got["closed_after"] < 5, "the connection was left open: its client would wait for ever"
    assert len(got["answer"]) < SENDFILE_MIN_BYTES, "the failed response cannot have been sent whole"
    assert len(got["next"]) > SENDFILE_MIN_BYTES, "the broker must go on serving other connections"
    assert any("a response could not be sent" in r.getMessage() for r in caplog.records), "the failure is not logged"
