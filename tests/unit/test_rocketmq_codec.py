"""codec/rocketmq_message.py against RocketMQ's layout, read back field by field with `struct`,
and the Kafka record <-> message mapping."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog import Record
from tidelog.codec import rocketmq_message as rm

TS = 1_700_000_000_000


def test_java_string_hash_matches_java() -> None:
    assert rm.java_string_hash("") == 0
    assert rm.java_string_hash("abc") == 96354
    assert rm.java_string_hash("hello") == 99162322
    assert rm.java_string_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE
    assert rm.java_string_hash("é") == 0xE9
    assert rm.java_string_hash("😀") == 31 * 0xD83D + 0xDE00  # two UTF-16 code units


def test_message_layout_field_by_field() -> None:
    body = b"hello world"
    properties = "KEYS\x01k1\x02UNIQ_KEY\x01ABC\x02"
    data = rm.encode_message(
        topic="orders",
        queue_id=3,
        body=body,
        properties=properties,
        queue_offset=42,
        physical_offset=1000,
        born_timestamp=TS,
        store_timestamp=TS + 5,
        born_host=rm.HostAddress(bytes([10, 0, 0, 1]), 5555),
        store_host=rm.HostAddress(bytes([10, 0, 0, 2]), 10911),
        flag=7,
        sys_flag=0,
        reconsume_times=2,
        prepared_transaction_offset=9,
    )
    assert len(data) == 91 + len(body) + len("orders") + len(properties)
    (total,) = struct.unpack_from(">i", data, 0)
    assert total == len(data)
    assert struct.unpack_from(">I", data, 4)[0] == 0xDAA320A7
    assert struct.unpack_from(">i", data, 8)[0] == zlib.crc32(body) & 0x7FFFFFFF
    assert struct.unpack_from(">i", data, 12)[0] == 3
    assert struct.unpack_from(">i", data, 16)[0] == 7
    assert struct.unpack_from(">q", data, 20)[0] == 42
    assert struct.unpack_from(">q", data, 28)[0] == 1000
    assert struct.unpack_from(">i", data, 36)[0] == 0
    assert struct.unpack_from(">q", data, 40)[0] == TS
    assert data[48:52] == bytes([10, 0, 0, 1]) and struct.unpack_from(">i", data, 52)[0] == 5555
    assert struct.unpack_from(">q", data, 56)[0] == TS + 5
    assert data[64:68] == bytes([10, 0, 0, 2]) and struct.unpack_from(">i", data, 68)[0] == 10911
    assert struct.unpack_from(">i", data, 72)[0] == 2
    assert struct.unpack_from(">q", data, 76)[0] == 9
    assert struct.unpack_from(">i", data, 84)[0] == len(body)
    assert data[88 : 88 + len(body)] == body
    at = 88 + len(body)
    assert data[at] == 6 and data[at + 1 : at + 7] == b"orders"
    at += 7
    assert struct.unpack_from(">h", data, at)[0] == len(properties)
    assert data[at + 2 :] == properties.encode()

    message = rm.decode_message(data)
    assert isinstance(message, rm.Message)
    assert (message.topic, message.queue_id, message.queue_offset, message.physical_offset) == ("orders", 3, 42, 1000)
    assert message.keys == ["k1"] and message.uniq_key == "ABC" and message.body == body
    assert message.msg_id() == "0A00000200002A9F00000000000003E8"


def test_long_topic_uses_magic_v2() -> None:
    topic = "t" * 200
    data = rm.encode_message(topic=topic, queue_id=0, body=b"x", properties="")
    assert struct.unpack_from(">I", data, 4)[0] == 0xDAA320AB
    assert len(data) == 92 + 1 + 200
    message = rm.decode_message(data)
    assert isinstance(message, rm.Message) and message.topic == topic


def test_blank_and_invalid_messages() -> None:
    assert rm.blank_marker(100) == struct.pack(">iI", 100, 0xCBD43194)
    assert rm.decode_message(rm.blank_marker(100) + bytes(92)) == rm.Blank(100)
    data = bytearray(rm.encode_message(topic="t", queue_id=0, body=b"payload", properties="A\x01b\x02"))
    with pytest.raises(rm.InvalidMessage, match="CRC"):
        flipped = bytearray(data)
        flipped[90] ^= 1
        rm.decode_message(flipped)
    with pytest.raises(rm.InvalidMessage, match="declares"):
        rm.decode_message(data[:-1])  # torn
    with pytest.raises(rm.InvalidMessage, match="zeros"):
        rm.decode_message(bytes(200))
    with pytest.raises(rm.InvalidMessage, match="magic"):
        bad = bytearray(data)
        bad[5] ^= 0xFF
        rm.decode_message(bad)
    with pytest.raises(rm.InvalidMessage, match="disagrees"):
        longer = bytearray(data) + b"zz"
        struct.pack_into(">i", longer, 0, len(longer))
        rm.decode_message(longer, check_crc=False)
    info = rm.decode_dispatch_info(bytes(data), 0, len(data))
    assert isinstance(info, rm.DispatchInfo) and info.topic == "t" and info.properties == b"A\x01b\x02"


def test_properties_follow_javas_parser() -> None:
    text = rm.properties_to_string({"KEYS": "a b", "TAGS": "tag", "SKIPPED": None})
    assert text == "KEYS\x01a b\x02TAGS\x01tag\x02"
    assert rm.string_to_properties(text) == {"KEYS": "a b", "TAGS": "tag"}
    assert rm.string_to_properties("E\x01\x02\x01v\x02ok\x01v") == {"ok": "v"}  # empty value / name dropped
    assert rm.property_value(text.encode(), "TAGS") == "tag"
    assert rm.property_value(text.encode(), "KEYS") == "a b"
    assert rm.property_value(text.encode(), "EYS") is None
    assert rm.tags_code("TagA") == rm.java_string_hash("TagA") and rm.tags_code(None) == 0


def test_message_ids() -> None:
    host = rm.HostAddress.parse("192.168.1.20:10911")
    msg_id = rm.message_id(host, 123456789)
    assert len(msg_id) == 32
    assert rm.decode_message_id(msg_id) == (host, 123456789)
    assert str(host) == "192.168.1.20:10911"
    generator = rm.UniqueIdGenerator()
    prefix, first = generator.next_block(3, TS)
    ids = [rm.unique_id(prefix, first + i) for i in range(3)]
    assert len(set(ids)) == 3 and all(len(i) == 32 and bytes.fromhex(i) for i in ids)
    assert generator.next_block(1, TS) == (prefix, (first + 3) & 0xFFFF)  # the counter goes on


def _roundtrip(record: Record) -> Record:
    properties = rm.record_properties(record, "UNIQ")
    data = rm.encode_message(
        topic="t", queue_id=0, body=record.value or b"", properties=properties, born_timestamp=record.timestamp_ms or 0
    )
    message = rm.decode_message(data)
    assert isinstance(message, rm.Message)
    assert rm.string_to_properties(message.properties_bytes.decode()) == message.properties
    return rm.message_to_record(message)


def test_plain_records_use_rocketmqs_own_properties() -> None:
    record = Record(value=b"v", key=b"user-1", timestamp_ms=TS, headers=[("trace", b"abc"), ("n", b"1")])
    properties = rm.string_to_properties(rm.record_properties(record, "UNIQ"))
    assert properties == {"UNIQ_KEY": "UNIQ", "KEYS": "user-1", "trace": "abc", "n": "1"}
    back = _roundtrip(record)
    assert (back.key, back.value, back.timestamp_ms, list(back.headers)) == (b"user-1", b"v", TS, record.headers)


def test_awkward_records_survive() -> None:
    cases = [
        Record(value=None, key=None, timestamp_ms=TS),
        Record(value=b"", key=b"", timestamp_ms=TS),
        Record(value=b"\x00\x01\x02", key=b"a b", timestamp_ms=TS),
        Record(value=b"v", key=b"\xff\xfe", timestamp_ms=TS, headers=[("h", None), ("h", b"\x01"), ("KEYS", b"x")]),
        Record(value=b"v", key=b"base64:abc", timestamp_ms=TS, headers=[("e", b"")]),
    ]
    for record in cases:
        back = _roundtrip(record)
        assert (back.key, back.value, list(back.headers)) == (record.key, record.value, list(record.headers))
    assert rm.index_key(b"a b").startswith("base64:") and rm.index_key(b"plain") == "plain"


@settings(max_examples=150, deadline=None)
@given(
    key=st.none() | st.binary(max_size=20),
    value=st.none() | st.binary(max_size=50),
    headers=st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=4),
)
def test_any_record_survives(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> None:
    record = Record(value=value, key=key, timestamp_ms=TS, headers=headers)
    back = _roundtrip(record)
    assert (back.key, back.value, list(back.headers)) == (key, value, headers)


def test_batch_and_producer_properties() -> None:
    extra = "KAFKA_BATCH\x012/3\x02KAFKA_PRODUCER\x017/1/10/3\x02"
    properties = rm.record_properties(Record(value=b"v"), "U", extra).encode()
    assert rm.batch_position(properties) == rm.BatchPosition(2, 3)
    assert rm.producer_info(properties) == rm.ProducerInfo(7, 1, 10, 3)
    assert rm.batch_position(b"UNIQ_KEY\x01U\x02") == rm.BatchPosition(0, 1)
    assert rm.producer_info(b"") is None
