"""The three fuzz targets, shared by the atheris runner (run.py) and the pytest suites in this folder.

Each target takes arbitrary bytes and drives one input-facing part of tidelog the way tidelog itself uses it.
The contract under test: every rejection is a `TidelogError` subclass naming what is wrong. Any other exception
(IndexError, struct.error, UnicodeDecodeError, RecursionError, MemoryError, ...) escapes the target and is a bug;
so is a hang (the runner's -timeout) or a huge allocation (its -rss_limit_mb).

- `record_batch`: the codec as storage and clients reach it - record sets (iter_batches, peek_batch, is_valid,
  decode_batch), the batch-chain walk and recovery's checks (scan_chain, check_stored), check_batch /
  decode_records, the columnar decoder the Spark source reads segment files with, the legacy (magic 0/1) reader,
  every decompressor, and the __consumer_offsets key/value formats. The first byte picks a mode; most modes
  repair lengths and checksums first, so the fuzzer reaches the record parsers behind the CRC.
- `request`: a connection's byte stream as the broker reads it - frame sizes (check_frame_size), then
  decode_request with the broker's own table of supported versions, then the first look a handler takes at the
  records of a Produce (read_header, as ProduceApis._append does).
- `config`: `server.properties` bytes through parse_properties and BrokerConfig.from_mapping (with EngineConfig
  inside), `--override` strings through parse_overrides, and topic configs through LogConfig.with_overrides.
- `rocketmq_read`: stored CommitLog bytes (messages found TOTALSIZE after TOTALSIZE, as the dispatcher walks them)
  rebuilt into Kafka batches as a read of the RocketMQ engine does, by the compiled pass (codec/_rocketmq_rebuild.c)
  and by numpy: numpy's rejection is a CorruptMessageError (the read's KAFKA_STORAGE_ERROR); the compiled pass
  declines what numpy rejects, and whatever it returns is numpy's result. A native crash there is a crash here.
"""

from __future__ import annotations

import contextlib
import struct
import tempfile
import zlib
from collections.abc import Callable
from functools import cache

import numpy as np
from crc32c import crc32c

from tidelog.broker.config import BrokerConfig
from tidelog.broker.run import parse_overrides
from tidelog.codec import batch_chain, batch_columns, group_records, legacy, record_set, rocketmq_batches
from tidelog.codec import rocketmq_message as rm
from tidelog.codec.compression import Compression, compress, decompress
from tidelog.codec.record_batch import (
    HEADER,
    HEADER_SIZE,
    Record,
    build_batch,
    check_batch,
    decode_records,
    read_header,
)
from tidelog.config import LogConfig, parse_properties
from tidelog.errors import TidelogError
from tidelog.protocol.framing import SIZE, check_frame_size
from tidelog.protocol.messages import ApiKey, decode_request

# --- record batches --------------------------------------------------------------------------------------------


def _v2_with_valid_crc(data: bytes) -> bytes:
    """`data` made into a batch whose magic, batchLength and CRC agree with its bytes."""
    batch = bytearray(data.ljust(HEADER_SIZE, b"\x00"))
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    batch[16] = 2
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def _v2_around(section: bytes, count: int, attributes: int) -> bytes:
    """A v2 batch around a records section (already compressed, if at all), with a correct CRC."""
    header = HEADER.pack(0, HEADER_SIZE - 12 + len(section), -1, 2, 0, attributes, count - 1, 0, 0, -1, -1, -1, count)
    return _v2_with_valid_crc(header + section)


def _legacy_with_valid_crc(data: bytes, magic: int) -> bytes:
    """`data` made into a legacy entry whose magic, size and CRC agree with its bytes."""
    entry = bytearray(data.ljust(legacy.LOG_OVERHEAD + legacy.RECORD_OVERHEAD_V1, b"\x00"))
    struct.pack_into(">i", entry, 8, len(entry) - 12)
    entry[16] = magic
    struct.pack_into(">I", entry, 12, zlib.crc32(bytes(entry[legacy.CRC_START :])))
    return bytes(entry)


def _legacy_wrapper(inner: bytes, codec: Compression, magic: int) -> bytes:
    """A compressed legacy entry (wrapper) whose value is `inner` compressed with `codec`."""
    value = compress(codec, inner)
    timestamp = b"\x00" * 8 if magic == 1 else b""
    body = struct.pack(">bb", magic, int(codec)) + timestamp + struct.pack(">i", -1) + struct.pack(">i", len(value))
    body += value
    entry = struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body
    return entry


def _read_record_set(buf: bytes) -> None:
    """Everything a reader of stored bytes does with a record set."""
    for info in record_set.iter_batches(buf):
        record_set.is_valid(buf, info)
        record_set.decode_batch(buf, info)
    for whole in (True, False):
        batch_chain.scan_chain(buf, whole=whole)
    batch_chain.check_stored(_window(buf), -1, 0)
    pos = 0
    while (peek := record_set.peek_batch(buf, pos)) is not None and peek.size > 0:
        pos += peek.size
    list(record_set.iter_records(buf, include_control=True))


def _window(buf: bytes) -> batch_chain.Window:
    """`buf` as a window of a segment file that ends with it: the entries the chain walk finds."""
    chain = batch_chain.scan_chain(buf)
    return batch_chain.Window(memoryview(buf), 0, chain.positions, chain.sizes)


def _read_columnar(buf: bytes) -> None:
    """What the Spark source does with a chunk of a segment file: walk it, keep the v2 data batches, decode columns."""
    table = batch_chain.batch_table(_window(buf))
    data_batches = (table.magic == 2) & ~table.is_control
    if data_batches.any():
        batch_columns.decode_v2(buf, table.take(data_batches), with_headers=True)


def _read_v2(buf: bytes) -> None:
    header = check_batch(buf)
    decode_records(buf, 0, header)


def fuzz_record_batch(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0] % 8, data[1:]
    try:
        if mode == 0:  # raw bytes as a record set and as one batch
            _read_record_set(rest)
            check_batch(rest)
        elif mode == 1:  # a v2 batch whose CRC and length are right: the record parser sees the bytes
            _read_v2(_v2_with_valid_crc(rest))
        elif mode == 2:  # fuzzed records section, compressed with a real codec, inside a valid batch
            if len(rest) < 3:
                return
            codec = Compression(rest[0] % 5)
            attributes = int(codec) | (rest[2] & 0x78)
            _read_v2(_v2_around(compress(codec, rest[3:]), rest[1] - 8, attributes))
        elif mode == 3:  # fuzzed bytes handed to a decompressor
            if not rest:
                return
            decompress(Compression(rest[0] % 5), rest[1:], legacy_lz4_checksum=rest[0] >= 128)
        elif mode == 4:  # a legacy entry whose CRC and size are right
            entry = _legacy_with_valid_crc(rest, data[0] >> 7)
            legacy.check_legacy_message(entry)
            _read_record_set(entry)
        elif mode == 5:  # a fuzzed inner message set inside a compressed legacy wrapper
            if not rest:
                return
            codec = Compression(rest[0] % 3 + 1)  # legacy wrappers: gzip, snappy, lz4
            _read_record_set(_legacy_wrapper(rest[1:], codec, rest[0] >> 7))
        elif mode == 6:  # fuzzed batches back to back, each with a valid CRC; bit 3 set: the columnar decoder too
            parts = rest.split(b"\xfe\xfe")
            buf = b"".join(_v2_with_valid_crc(p) for p in parts)
            if data[0] & 0x08:  # (numpy costs ~0.5 ms an input: half of this mode keeps the target fast)
                with contextlib.suppress(TidelogError):
                    _read_columnar(buf)
            _read_record_set(buf)
        else:  # the __consumer_offsets record formats the offset store reads back at start-up
            for decode in (
                group_records.decode_key,
                group_records.decode_offset_value,
                group_records.decode_group_value,
            ):
                with contextlib.suppress(TidelogError):
                    decode(rest)
    except TidelogError:
        pass


def record_batch_seeds() -> list[bytes]:
    """Valid inputs for every mode: the fuzzer starts from real batches and mutates them."""
    records = [Record(b"value-%d" % i, b"k" if i % 2 else None, 1_700_000_000_000 + i, [("h", b"x")]) for i in range(3)]
    seeds = []
    for codec in Compression:
        batch = build_batch(records, compression=codec, producer_id=7, producer_epoch=0, base_sequence=0)
        seeds += [b"\x00" + batch + batch, b"\x01" + batch, b"\x06" + batch + b"\xfe\xfe" + batch]
        seeds.append(b"\x0e" + batch + b"\xfe\xfe" + batch)  # mode 6 with the columnar decoder
        section = batch[HEADER_SIZE:]
        seeds.append(b"\x03" + bytes([int(codec)]) + section)
        if codec is Compression.NONE:
            seeds.append(b"\x02" + bytes([0, 8 + len(records), 0]) + section)
    key = group_records.encode_key(group_records.OffsetKey("group", "topic", 3))
    value = group_records.encode_offset_value(group_records.OffsetValue(42, 1, "meta", 1_700_000_000_000))
    seeds += [b"\x07" + key, b"\x07" + value]
    for magic in (0, 1):
        plain = _legacy_plain(b"key", b"value", magic)
        seeds += [bytes([4 | magic << 7]) + plain, bytes([5 | magic << 7]) + plain + plain]
    return seeds


def _legacy_plain(key: bytes, value: bytes, magic: int) -> bytes:
    timestamp = struct.pack(">q", 1_700_000_000_000) if magic == 1 else b""
    body = struct.pack(">bb", magic, 0) + timestamp + struct.pack(">i", len(key)) + key
    body += struct.pack(">i", len(value)) + value
    return struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body


# --- requests --------------------------------------------------------------------------------------------------

MAX_FRAME_BYTES = 104_857_600  # socket.request.max.bytes default


@cache
def broker_supported_versions() -> dict[int, tuple[int, int]]:
    """The broker's own table of API versions (from its handlers), read from a Broker on a scratch log dir."""
    from tidelog.broker.broker import Broker

    with tempfile.TemporaryDirectory(prefix="tidelog-fuzz-") as log_dir:
        broker = Broker(BrokerConfig.from_mapping({"log.dirs": log_dir}))
        try:
            return dict(broker.server.supported)
        finally:
            broker.admin.close()
            broker.engine.close()


def _handle_payload(payload: bytes, supported: dict[int, tuple[int, int]]) -> None:
    request = decode_request(payload, supported)
    if request.api_key == ApiKey.PRODUCE:  # what ProduceApis._append reads before the engine sees the bytes
        for topic in request.body.topic_data:
            for partition in topic.partition_data:
                if partition.records:
                    read_header(partition.records)


def fuzz_request(data: bytes) -> None:
    if len(data) < 2:
        return
    supported = broker_supported_versions()
    try:
        if data[0] & 1:  # one request of a supported API and version: the body decoders see the bytes
            apis = sorted(supported)
            api_key = apis[(data[0] >> 1) % len(apis)]
            low, high = supported[api_key]
            version = low + data[1] % (high - low + 1)
            _handle_payload(struct.pack(">hh", api_key, version) + data[2:], supported)
            return
        stream, pos = data[1:], 0  # a connection's bytes: frames until one is refused or the bytes end
        while len(stream) - pos >= SIZE.size:
            (size,) = SIZE.unpack_from(stream, pos)
            check_frame_size(size, MAX_FRAME_BYTES)
            payload = stream[pos + SIZE.size : pos + SIZE.size + size]
            if len(payload) < size:
                return  # the server waits for the rest of the frame
            pos += SIZE.size + size
            with contextlib.suppress(TidelogError):  # e.g. an ApiVersions of a newer version: answered, read on
                _handle_payload(payload, supported)
    except TidelogError:
        pass


def request_seeds() -> list[bytes]:
    """Requests real clients send (hand-written non-flexible and flexible ones), as both target modes see them."""
    string = lambda s: struct.pack(">h", len(s)) + s  # noqa: E731
    header_v1 = lambda key, version: struct.pack(">hhi", key, version, 7) + string(b"fuzz")  # noqa: E731
    metadata_v1 = header_v1(3, 1) + struct.pack(">i", 1) + string(b"topic")
    api_versions_v3 = header_v1(18, 3) + b"\x00" + b"\x05fuzz" + b"\x040.1" + b"\x00"
    batch = build_batch([Record(b"value", b"key", 1_700_000_000_000)])
    produce_v3 = (
        header_v1(0, 3)
        + struct.pack(">hhi", -1, -1, 1000)
        + struct.pack(">i", 1)
        + string(b"topic")
        + struct.pack(">iii", 1, 0, len(batch))
        + batch
    )
    fetch_v4 = header_v1(1, 4) + struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0) + struct.pack(">i", 1) + string(b"t")
    fetch_v4 += struct.pack(">iiqi", 1, 0, 0, 1 << 20)
    payloads = [metadata_v1, api_versions_v3, produce_v3, fetch_v4]
    supported = broker_supported_versions()
    apis = sorted(supported)
    seeds = [b"\x00" + b"".join(SIZE.pack(len(p)) + p for p in payloads)]
    for payload in payloads:
        api_key, version = struct.unpack_from(">hh", payload)
        selector = apis.index(api_key) << 1 | 1
        low, high = supported[api_key]
        seeds.append(bytes([selector, (version - low) % (high - low + 1)]) + payload[4:])
    return seeds


# --- configuration ---------------------------------------------------------------------------------------------


def fuzz_config(data: bytes) -> None:
    if not data:
        return
    try:
        if data[0] % 3 == 0:  # a server.properties file
            BrokerConfig.from_mapping(parse_properties(data[1:], "server.properties"))
        elif data[0] % 3 == 1:  # --override arguments, one per line
            lines = data[1:].decode("utf-8", "surrogateescape").split("\n")
            BrokerConfig.from_mapping(parse_overrides(lines))
        else:  # topic configs, as CreateTopics and the topic tools pass them
            LogConfig().with_overrides(parse_properties(data[1:], "topic config"))
    except TidelogError:
        pass


def config_seeds() -> list[bytes]:
    properties = (
        b"# a broker\nlisteners=PLAINTEXT://127.0.0.1:9092\nlog.dirs=/tmp/a,/tmp/b\nnum.partitions=3\n"
        b"log.segment.bytes=1048576\nlog.roll.hours=1\nlog.retention.minutes=5\nlog.flush.interval.messages=1\n"
        b"socket.request.max.bytes=1000000\nauto.create.topics.enable=false\nlog.cleanup.policy=delete\n"
        b"advertised.listeners=PLAINTEXT://[::1]:9093\ntidelog.metrics.port=-1\nmessage.max.bytes=1000\n"
    )
    topic = b"segment.bytes=1000\nretention.ms=-1\nmessage.timestamp.type=LogAppendTime\ncleanup.policy=delete\n"
    return [b"\x00" + properties, b"\x01" + properties.replace(b"# a broker\n", b""), b"\x02" + topic]


# --- RocketMQ reads ---------------------------------------------------------------------------------------------

MAX_MESSAGES = 64  # messages of one input


def _messages(buf: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The messages of `buf` as the dispatcher finds them (each TOTALSIZE leads to the next): positions, sizes."""
    positions, sizes = [], []
    at = 0
    while at + 4 <= len(buf) and len(positions) < MAX_MESSAGES:
        size = int.from_bytes(buf[at : at + 4], "big", signed=True)
        if size <= 0:
            break
        positions.append(at)
        sizes.append(size)
        at += size
    return np.array(positions, dtype=np.int64), np.array(sizes, dtype=np.int64)


def _outcome(rebuilt: rocketmq_batches.Rebuilt) -> tuple[bytes, int, int, bool]:
    return b"".join(rebuilt.batches), rebuilt.next_offset, rebuilt.missing, rebuilt.full


def fuzz_rocketmq_read(data: bytes) -> None:
    if len(data) < 2:
        return
    control, buf = data[0], data[1:]
    positions, sizes = _messages(buf)
    if not len(positions):
        return
    # the first message's QUEUEOFFSET as the read's offset, so that mutated messages get past that check
    first = int.from_bytes(buf[20:28], "big", signed=True) if len(buf) >= 28 else 0
    max_bytes = (1 << 30, 0, 150, 3000)[control & 3]
    min_one, at_end = bool(control & 4), bool(control & 8)
    compiled = rocketmq_batches.compiled_rebuild
    assert compiled is not None, "tidelog.codec._rocketmq_rebuild is not built"
    got = compiled(np.frombuffer(buf, dtype=np.uint8), positions, sizes, first, max_bytes, min_one, at_end)
    small_run = rocketmq_batches.SMALL_RUN
    rocketmq_batches.compiled_rebuild = None  # the numpy path: message by message or (bit 4) column-wise
    rocketmq_batches.SMALL_RUN = 0 if control & 0x10 else small_run
    try:
        want = _outcome(
            rocketmq_batches.rebuild_batches(
                buf, positions, sizes, first, max_bytes, min_one_message=min_one, at_end=at_end
            )
        )
    except rocketmq_batches.CorruptMessageError:
        want = None
    finally:
        rocketmq_batches.compiled_rebuild, rocketmq_batches.SMALL_RUN = compiled, small_run
    if got is None:
        return
    if want is None:
        raise AssertionError("the compiled rebuild accepted a run that numpy rejects")
    outcome = (got[0] or b"", got[1], got[2], got[3])
    if outcome[3] and not want[3]:  # numpy cut the run at the budget before parsing it (rocketmq_batches)
        want = (*want[:3], True)
    if outcome != want:
        raise AssertionError(f"the compiled rebuild differs from numpy's: {outcome[1:]} against {want[1:]}")


def rocketmq_read_seeds() -> list[bytes]:
    """Runs of messages as the RocketMQ engine stores Kafka batches: keys, null values, headers, batches of three,
    a transactional batch with its producer, and foreign properties."""
    born = 1_700_000_000_000

    def message(offset: int, body: bytes, properties: str, flag: int = 0) -> bytes:
        return rm.encode_message(
            topic="t", queue_id=0, body=body, properties=properties, queue_offset=offset, born_timestamp=born + offset,
            flag=flag,
        )  # fmt: skip

    plain = [message(i, b"value-%d" % i, f"KEYS\x01k{i}\x02h\x01x\x02KAFKA_BATCH\x01{i}/3\x02") for i in range(3)]
    nulls = [message(0, b"", "KAFKA_NULL_VALUE\x011\x02"), message(1, b"v" * 40, "UNIQ_KEY\x01AB\x02TAGS\x01t\x02")]
    txn = [
        message(i, b"t%d" % i, f"KAFKA_BATCH\x01{i}/2\x02" + ("KAFKA_PRODUCER\x017/0/5/2\x02" if i else ""), 0x10)
        for i in range(2)
    ]
    return [
        bytes([control]) + b"".join(run)
        for run in (plain, nulls, txn, plain[1:], [*plain, *txn])
        for control in (0, 6, 9, 15, 16, 22, 25, 31)
    ]


TARGETS: dict[str, tuple[Callable[[bytes], None], Callable[[], list[bytes]]]] = {
    "record_batch": (fuzz_record_batch, record_batch_seeds),
    "request": (fuzz_request, request_seeds),
    "config": (fuzz_config, config_seeds),
    "rocketmq_read": (fuzz_rocketmq_read, rocketmq_read_seeds),
}
