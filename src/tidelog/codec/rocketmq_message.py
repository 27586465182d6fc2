"""A RocketMQ CommitLog message, byte for byte as RocketMQ's store writes it (MessageExtEncoder / CommitLog), and the
mapping of one Kafka record onto one such message. Pure: bytes in, objects out, no I/O.

Layout of a v1 message, big-endian, IPv4 hosts (as RocketMQ's MessageExtEncoder writes it):

    off size field                         off size field
      0   4  TOTALSIZE (whole message)       48   8  BORNHOST (ip 4 | port i32)
      4   4  MAGICCODE v1 0xDAA320A7          56   8  STORETIMESTAMP (broker ms)
      8   4  BODYCRC = crc32(body) & 0x7FFFFFFF 64  8  STOREHOSTADDRESS (ip 4 | port i32)
     12   4  QUEUEID                          72   4  RECONSUMETIMES
     16   4  FLAG                             76   8  PreparedTransactionOffset
     20   8  QUEUEOFFSET (index in the CQ)    84   4  BODY length, then BODY
     28   8  PHYSICALOFFSET                   ..   1  TOPIC length (v1; v2: i16), then TOPIC
     36   4  SYSFLAG                          ..   2  PROPERTIES length, then PROPERTIES (UTF-8)
     40   8  BORNTIMESTAMP (producer ms)

Size = 91 + body + topic + properties (v1). PROPERTIES is `name \\x01 value \\x02` per entry. The end of a CommitLog
file that cannot hold the next message is the 8-byte BLANK marker `[remaining i32][0xCBD43194]`. IPv6 hosts
(SYSFLAG 0x10 / 0x20) take 20 bytes each; we read them, we write IPv4.

Kafka records in this format (tidelog's mapping; nothing of the record is lost):
- BODY = value; a null value is an empty body plus property `KAFKA_NULL_VALUE=1`.
- BORNTIMESTAMP = the record's timestamp (Kafka CreateTime is the producer's clock, which is what BORN means);
  it sits at a fixed position, so a lookup by time reads 8 bytes per probe. STORETIMESTAMP is the broker's clock.
- key: `KEYS` when it is UTF-8 text without separators (space, \\x01, \\x02), else `KAFKA_KEY64` (base64).
  Either way `index_key(key)` is the string the IndexFile is keyed by (`topic#<index_key>`).
- headers: one user property each when every name and value is plain text and the names are distinct and not
  reserved; otherwise all of them in `KAFKA_HEADERS64` (base64 of a length-prefixed list, order and nulls kept).
- `UNIQ_KEY`: a RocketMQ client message id generated per message (MessageClientIDSetter layout).
- batch atomicity and idempotence: messages of a multi-record Kafka batch carry `KAFKA_BATCH=<index>/<count>`;
  the last message of an idempotent batch carries `KAFKA_PRODUCER=<producerId>/<epoch>/<baseSequence>/<count>`.

encode_message and record_properties define a message record by record; encode_records makes the same bytes for a
whole Kafka batch at once (columns from rocketmq_columns.decode_batch; see there), with the IndexFile keys of its
messages as IndexKeys, hashed later (java_hashes: String.hashCode of many ASCII strings with numpy).
"""

from __future__ import annotations

import base64
import calendar
import functools
import itertools
import mmap
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tidelog.codec.record_batch import Record
from tidelog.codec.record_columns import RecordColumns

# What messages are decoded from: a CommitLog file's mapping, or bytes (or a view of them).
MessageBuffer = bytes | bytearray | memoryview | mmap.mmap

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB: 2-byte topic length
BLANK_MAGIC = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8

FIXED = struct.Struct(">iiiiiqqiq4siq4siiqi")  # TOTALSIZE .. BODY length (IPv4 hosts): 88 bytes
FIXED_SIZE = FIXED.size
BLANK = struct.Struct(">ii")
QUEUE_AND_PHYSICAL_OFFSET = struct.Struct(">qq")

MAGIC_POSITION = 4
BODY_CRC_POSITION = 8
QUEUE_ID_POSITION = 12
FLAG_POSITION = 16
QUEUE_OFFSET_POSITION = 20
PHYSICAL_OFFSET_POSITION = 28
SYSFLAG_POSITION = 36
BORN_TIMESTAMP_POSITION = 40
STORE_TIMESTAMP_POSITION = 56  # with an IPv4 born host

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "

# Properties RocketMQ itself reserves (MessageConst.STRING_HASH_SET) plus ours.
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_KEY64 = "KAFKA_KEY64"
PROPERTY_NULL_VALUE = "KAFKA_NULL_VALUE"
PROPERTY_HEADERS64 = "KAFKA_HEADERS64"
PROPERTY_BATCH = "KAFKA_BATCH"
PROPERTY_PRODUCER = "KAFKA_PRODUCER"
RESERVED_PROPERTIES = frozenset(
    {
        "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID",
        "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG",
        "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
        "__STARTDELIVERTIME", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_OUT_MS",
        "INNER_NUM", "INNER_BASE", "__CRC32#", "SHARDING_KEY", "CLUSTER", "TRAN_PREPARED_QUEUE_OFFSET",
        "DUP_INFO", "INSTANCE_ID", "CHECK_IMMUNITY_TIME_IN_SECONDS",
        PROPERTY_KEY64, PROPERTY_NULL_VALUE, PROPERTY_HEADERS64, PROPERTY_BATCH, PROPERTY_PRODUCER,
    }
)  # fmt: skip

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_IPV6_HOSTS = struct.Struct(">16si")
_IPV4_HOST = struct.Struct(">4si")
_UNSAFE_TEXT = frozenset(" \x00\x01\x02")


class InvalidMessage(Exception):
    """The bytes at a position are not a valid message; `reason` says what recovery found."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- Java compatibility ----------------------------------------------------------------------------------------


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units, int32 wrap-around)."""
    h = 0
    if text.isascii():
        for c in text.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        units = text.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue's tag field: String.hashCode of TAGS widened to a long; 0 without tags."""
    return java_string_hash(tags) if tags else 0


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """RocketMQ's UtilAll.crc32: CRC-32 (zlib) masked to a positive int."""
    return zlib.crc32(body) & 0x7FFFFFFF


# --- properties ---------------------------------------------------------------------------------------------


def properties_to_string(properties: Mapping[str, str | None]) -> str:
    """MessageDecoder.messageProperties2String: `name\\x01value\\x02` per entry, null values skipped."""
    return "".join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
        for name, value in properties.items()
        if value is not None
    )


def string_to_properties(text: str) -> dict[str, str]:
    """MessageDecoder.string2messageProperties: split on \\x02, then on the first \\x01; an entry needs a non-empty
    name and a non-empty value (Java drops the others)."""
    properties: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        separator = item.find(NAME_VALUE_SEPARATOR)
        if len(item) >= 3 and 0 < separator < len(item) - 1:
            properties[item[:separator]] = item[separator + 1 :]
    return properties


def property_value(properties: bytes | bytearray | memoryview, name: str) -> str | None:
    """One property straight from the encoded bytes, without parsing the others."""
    data = bytes(properties)
    needle = name.encode() + b"\x01"
    if data.startswith(needle):
        start = len(needle)
    else:
        found = data.find(b"\x02" + needle)
        if found < 0:
            return None
        start = found + 1 + len(needle)
    end = data.find(b"\x02", start)
    return data[start : end if end >= 0 else len(data)].decode("utf-8", "surrogateescape")


# --- hosts and message ids --------------------------------------------------------------------------------------


class HostAddress(NamedTuple):
    ip: bytes  # 4 bytes (IPv4) or 16 (IPv6)
    port: int

    def __str__(self) -> str:
        family = socket.AF_INET if len(self.ip) == 4 else socket.AF_INET6
        return f"{socket.inet_ntop(family, self.ip)}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> HostAddress:
        host, _, port = text.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return cls(socket.inet_pton(family, host), int(port))


DEFAULT_STORE_HOST = HostAddress(bytes([127, 0, 0, 1]), 10911)  # RocketMQ's default listenPort
UNKNOWN_BORN_HOST = HostAddress(bytes(4), 0)


def message_id(store_host: HostAddress, physical_offset: int) -> str:
    """The "offsetMsgId": store host ip | port i32 | physical offset i64, as upper-case hex (32 chars for IPv4)."""
    return (store_host.ip + _INT32.pack(store_host.port) + _INT64.pack(physical_offset)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[HostAddress, int]:
    """(store host, physical offset) of an offsetMsgId (MessageDecoder.decodeMessageId)."""
    raw = bytes.fromhex(msg_id)
    if len(raw) not in (16, 28):
        raise ValueError(f"message id {msg_id!r} is neither 32 (IPv4) nor 56 (IPv6) hex digits")
    ip_length = len(raw) - 12
    host = HostAddress(raw[:ip_length], _INT32.unpack_from(raw, ip_length)[0])
    return host, _INT64.unpack_from(raw, ip_length + 4)[0]


class UniqueIdGenerator:
    """Client message ids in MessageClientIDSetter's layout: ip 4 | pid i16 | class-loader hash i32 (here: a
    per-process random) | ms since the start of the month i32 | counter i16, as 32 hex digits."""

    def __init__(self, ip: bytes = DEFAULT_STORE_HOST.ip) -> None:
        salt = int.from_bytes(os.urandom(4), "big")
        self._prefix = (ip + struct.pack(">hI", os.getpid() & 0x7FFF, salt)).hex().upper()
        self._counter = 0
        self._lock = threading.Lock()
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _roll_month(self, now_ms: int) -> None:
        now = time.gmtime(now_ms / 1000)
        start = time.struct_time((now.tm_year, now.tm_mon, 1, 0, 0, 0, 0, 0, 0))
        self._month_start_ms = int(_timegm(start) * 1000)
        year, month = (now.tm_year + 1, 1) if now.tm_mon == 12 else (now.tm_year, now.tm_mon + 1)
        self._next_month_ms = int(_timegm(time.struct_time((year, month, 1, 0, 0, 0, 0, 0, 0))) * 1000)

    def next_block(self, count: int, now_ms: int) -> tuple[str, int]:
        """`count` consecutive ids: their common 28 hex digits and the counter of the first; id i is the prefix
        followed by `(first + i) & 0xFFFF` as 4 hex digits (unique_id)."""
        with self._lock:
            if not self._month_start_ms <= now_ms < self._next_month_ms:
                self._roll_month(now_ms)
            prefix = f"{self._prefix}{(now_ms - self._month_start_ms) & 0xFFFFFFFF:08X}"
            first = self._counter
            self._counter = (first + count) & 0xFFFF
        return prefix, first


def unique_id(prefix: str, counter: int) -> str:
    """One id of a UniqueIdGenerator block."""
    return f"{prefix}{counter & 0xFFFF:04X}"


def _timegm(value: time.struct_time) -> float:
    return calendar.timegm(value)


# --- whole messages -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Message:
    """One decoded CommitLog message (MessageExt)."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: HostAddress
    store_timestamp: int
    store_host: HostAddress
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties_bytes: bytes
    _properties: dict[str, str] | None = field(default=None, repr=False)

    @property
    def properties(self) -> dict[str, str]:
        if self._properties is None:
            self._properties = string_to_properties(self.properties_bytes.decode("utf-8", "surrogateescape"))
        return self._properties

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def tags_code(self) -> int:
        return tags_code(self.properties.get(PROPERTY_TAGS))

    def msg_id(self) -> str:
        return message_id(self.store_host, self.physical_offset)


MAX_PROPERTIES_SIZE = 0x7FFF  # PROPERTIES carries an i16 length: Short.MAX_VALUE (PROPERTIES_SIZE_EXCEEDED)


class PropertiesTooLargeError(ValueError):
    """A message's PROPERTIES would not fit RocketMQ's i16 length field (`record`: which of a batch, when known)."""

    def __init__(self, size: int, record: int = 0) -> None:
        super().__init__(f"PROPERTIES of {size} bytes exceed RocketMQ's limit of {MAX_PROPERTIES_SIZE}")
        self.size = size
        self.record = record


def encode_message(
    *,
    topic: str,
    queue_id: int,
    body: bytes,
    properties: str | bytes,
    queue_offset: int = 0,
    physical_offset: int = 0,
    born_timestamp: int = 0,
    store_timestamp: int = 0,
    born_host: HostAddress = UNKNOWN_BORN_HOST,
    store_host: HostAddress = DEFAULT_STORE_HOST,
    flag: int = 0,
    sys_flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> bytes:
    """One message in RocketMQ's layout (v1 for topics up to 127 bytes, else v2). IPv4 hosts only."""
    topic_bytes = topic.encode()
    properties_bytes = properties.encode("utf-8", "surrogateescape") if isinstance(properties, str) else properties
    if len(properties_bytes) > MAX_PROPERTIES_SIZE:
        raise PropertiesTooLargeError(len(properties_bytes))
    v2 = len(topic_bytes) > 127
    topic_field = struct.pack(">h", len(topic_bytes)) if v2 else bytes([len(topic_bytes)])
    total = FIXED_SIZE + len(body) + len(topic_field) + len(topic_bytes) + 2 + len(properties_bytes)
    header = FIXED.pack(
        total,
        MAGIC_V2 if v2 else MAGIC_V1,
        body_crc(body),
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6),
        born_timestamp,
        born_host.ip,
        born_host.port,
        store_timestamp,
        store_host.ip,
        store_host.port,
        reconsume_times,
        prepared_transaction_offset,
        len(body),
    )
    return b"".join(
        (header, body, topic_field, topic_bytes, struct.pack(">h", len(properties_bytes)), properties_bytes)
    )


def blank_marker(remaining: int) -> bytes:
    """The end-of-file filler: only its 8 bytes are written; the rest of the file stays as it was (zeros)."""
    return BLANK.pack(remaining, BLANK_MAGIC)


class Blank(NamedTuple):
    """The BLANK marker: the file ends here; the next message is at the start of the next file."""

    remaining: int


def peek_total_size_and_magic(buf: MessageBuffer, pos: int) -> tuple[int, int]:
    return BLANK.unpack_from(buf, pos)


def decode_message(
    buf: MessageBuffer, pos: int = 0, *, check_crc: bool = True, read_body: bool = True
) -> Message | Blank:
    """The message or BLANK marker at `pos` (CommitLog.checkMessageAndReturnSize). Raises InvalidMessage for bytes
    that are not a message: unknown magic, impossible sizes, a size that disagrees with the fields, a bad body CRC,
    or a message that runs past the end of `buf` (a torn write)."""
    try:
        return _decode_message(buf, pos, check_crc, read_body)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"message at {pos} does not decode: {exc}") from None


def _decode_message(buf: MessageBuffer, pos: int, check_crc: bool, read_body: bool) -> Message | Blank:
    end = len(buf)
    if end - pos < 8:
        raise InvalidMessage(f"only {end - pos} bytes left at {pos}, less than a message header")
    total, magic = BLANK.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return Blank(total)
    if magic not in (MAGIC_V1, MAGIC_V2):
        if total == 0 and magic == 0:
            raise InvalidMessage(f"no message at {pos} (zeros: the end of the written data)")
        raise InvalidMessage(f"illegal magic code {magic & 0xFFFFFFFF:#010x} at {pos}")
    if total < FIXED_SIZE + 3 or total > end - pos:
        raise InvalidMessage(f"message at {pos} declares {total} bytes; {end - pos} are present")
    (sys_flag,) = _INT32.unpack_from(buf, pos + SYSFLAG_POSITION)
    if sys_flag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6):
        return _decode_with_ipv6(buf, pos, total, magic, sys_flag, check_crc, read_body)
    (
        _total,
        _magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        _sys,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume,
        prepared,
        body_length,
    ) = FIXED.unpack_from(buf, pos)
    return _decode_tail(
        buf, pos, total, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts,
        HostAddress(born_ip, born_port), store_ts, HostAddress(store_ip, store_port), reconsume, prepared,
        pos + FIXED_SIZE, body_length, check_crc, read_body,
    )  # fmt: skip


def _decode_with_ipv6(
    buf: MessageBuffer,
    pos: int,
    total: int,
    magic: int,
    sys_flag: int,
    check_crc: bool,
    read_body: bool,
) -> Message:
    crc, queue_id, flag, queue_offset, physical_offset, _sys, born_ts = struct.unpack_from(">iiiqqiq", buf, pos + 8)
    at = pos + 48
    if sys_flag & SYSFLAG_BORNHOST_V6:
        born = HostAddress(*_IPV6_HOSTS.unpack_from(buf, at))
        at += 20
    else:
        born = HostAddress(*_IPV4_HOST.unpack_from(buf, at))
        at += 8
    (store_ts,) = _INT64.unpack_from(buf, at)
    at += 8
    if sys_flag & SYSFLAG_STOREHOST_V6:
        store = HostAddress(*_IPV6_HOSTS.unpack_from(buf, at))
        at += 20
    else:
        store = HostAddress(*_IPV4_HOST.unpack_from(buf, at))
        at += 8
    reconsume, prepared, body_length = struct.unpack_from(">iqi", buf, at)
    return _decode_tail(
        buf, pos, total, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts, born,
        store_ts, store, reconsume, prepared, at + 16, body_length, check_crc, read_body,
    )  # fmt: skip


def _decode_tail(
    buf: MessageBuffer,
    pos: int,
    total: int,
    magic: int,
    crc: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_ts: int,
    born: HostAddress,
    store_ts: int,
    store: HostAddress,
    reconsume: int,
    prepared: int,
    body_at: int,
    body_length: int,
    check_crc: bool,
    read_body: bool,
) -> Message:
    limit = pos + total
    if body_length < 0 or body_at + body_length + 3 > limit:
        raise InvalidMessage(f"message at {pos} declares a body of {body_length} bytes that does not fit")
    body_end = body_at + body_length
    body = bytes(buf[body_at:body_end]) if read_body or check_crc else b""
    if check_crc and body_crc(body) != crc:
        raise InvalidMessage(f"message at {pos} fails its body CRC check")
    if magic == MAGIC_V2:
        (topic_length,) = struct.unpack_from(">h", buf, body_end)
        topic_at = body_end + 2
    else:
        topic_length = buf[body_end]
        topic_at = body_end + 1
    properties_length_at = topic_at + topic_length
    if topic_length < 0 or properties_length_at + 2 > limit:
        raise InvalidMessage(f"message at {pos} declares a topic of {topic_length} bytes that does not fit")
    (properties_length,) = struct.unpack_from(">h", buf, properties_length_at)
    if properties_length < 0 or properties_length_at + 2 + properties_length != limit:
        raise InvalidMessage(
            f"message at {pos}: TOTALSIZE {total} disagrees with the sum of its fields "
            f"({properties_length_at + 2 + max(properties_length, 0) - pos})"
        )
    topic = bytes(buf[topic_at:properties_length_at]).decode("utf-8", "surrogateescape")
    properties = bytes(buf[properties_length_at + 2 : limit])
    return Message(
        total, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts, born, store_ts, store,
        reconsume, prepared, body if read_body else b"", topic, properties,
    )  # fmt: skip


def iter_messages(buf: MessageBuffer, pos: int = 0, *, check_crc: bool = True) -> Iterable[Message | Blank]:
    """Messages from `pos` until a BLANK marker (included), the end of `buf`, or an invalid message (raised)."""
    end = len(buf)
    while pos < end:
        item = decode_message(buf, pos, check_crc=check_crc)
        yield item
        if isinstance(item, Blank):
            return
        pos += item.total_size


# --- Kafka records <-> messages ---------------------------------------------------------------------------------


def index_key(key: bytes) -> str:
    """The string a Kafka key is stored in KEYS and indexed as (`topic#<index_key>`): the key itself when it is
    UTF-8 text without a space or a property separator, else `base64:` + its base64 (`base64:` alone: empty)."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text and not _UNSAFE_TEXT.intersection(text) and not text.startswith("base64:"):
        return text
    return "base64:" + base64.b64encode(key).decode("ascii")


def _plain_property(name: str, value: bytes | None) -> str | None:
    """`name\\x01value\\x02` when a header survives as a RocketMQ user property exactly, else None."""
    if value is None or not value or not name or name in RESERVED_PROPERTIES:
        return None
    if "\x01" in name or "\x02" in name:
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x01" in text or "\x02" in text:
        return None
    return f"{name}\x01{text}\x02"


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> str:
    parts = [struct.pack(">i", len(headers))]
    for name, value in headers:
        encoded = name.encode("utf-8", "surrogateescape")
        parts += [struct.pack(">i", len(encoded)), encoded]
        parts += [struct.pack(">i", -1)] if value is None else [struct.pack(">i", len(value)), value]
    return base64.b64encode(b"".join(parts)).decode("ascii")


def _decode_headers(text: str) -> list[tuple[str, bytes | None]]:
    raw = base64.b64decode(text)
    (count,) = _INT32.unpack_from(raw, 0)
    at = 4
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        (length,) = _INT32.unpack_from(raw, at)
        name = raw[at + 4 : at + 4 + length].decode("utf-8", "surrogateescape")
        at += 4 + length
        (length,) = _INT32.unpack_from(raw, at)
        at += 4
        if length < 0:
            headers.append((name, None))
        else:
            headers.append((name, raw[at : at + length]))
            at += length
    return headers


def record_properties(record: Record, uniq_key: str, extra: str = "") -> str:
    """The PROPERTIES string of the message that carries `record` (see the module docstring)."""
    parts = [f"UNIQ_KEY\x01{uniq_key}\x02"]
    key = record.key
    if key is not None:
        text = index_key(key)
        if not text.startswith("base64:"):
            parts.append(f"KEYS\x01{text}\x02")
        elif key:
            parts.append(f"KAFKA_KEY64\x01{text[7:]}\x02")
        else:
            parts.append("KAFKA_KEY64\x01-\x02")  # Java drops empty values: '-' (not base64) is the empty key
    if record.value is None:
        parts.append("KAFKA_NULL_VALUE\x011\x02")
    headers = record.headers
    if headers:
        plain = [_plain_property(name, value) for name, value in headers]
        if None in plain or len({name for name, _ in headers}) != len(headers):
            parts.append(f"KAFKA_HEADERS64\x01{_encode_headers(headers)}\x02")
        else:
            parts += plain  # type: ignore[arg-type]
    if extra:
        parts.append(extra)
    return "".join(parts)


# --- a Kafka batch -> messages, column-wise -------------------------------------------------------------------

MESSAGE_HEADER = np.dtype(
    [
        ("total_size", ">i4"), ("magic", ">i4"), ("body_crc", ">i4"), ("queue_id", ">i4"), ("flag", ">i4"),
        ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"), ("born_timestamp", ">i8"),
        ("born_host", "V8"), ("store_timestamp", ">i8"), ("store_host", "V8"), ("reconsume_times", ">i4"),
        ("prepared_transaction_offset", ">i8"), ("body_length", ">i4"),
    ]
)  # fmt: skip  # FIXED as a numpy record (IPv4 hosts): 88 bytes
UNIQ_KEY_LENGTH = 32  # hex digits of a UniqueIdGenerator id
HASH_MASK = np.uint64(0xFFFFFFFF)
# 31^k mod 2^32 for k up to the longest string PROPERTIES can hold (uint32 products wrap mod 2^32)
POW31 = np.concatenate(([1], np.cumprod(np.full(MAX_PROPERTIES_SIZE + 1, 31, dtype=np.uint32), dtype=np.uint32)))
POW31 = POW31.astype(np.uint64)
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_HEX_SHIFTS = np.array([12, 8, 4, 0])
_HEX_WEIGHTS = POW31[3::-1].copy()  # 31^3 .. 31^0
# String.hashCode of "%04X" % counter for every 16-bit counter: the last 4 digits of a UNIQ_KEY
_HEX4_HASHES = _HEX_DIGITS[(np.arange(1 << 16)[:, None] >> _HEX_SHIFTS) & 15].astype(np.uint64) @ _HEX_WEIGHTS
_PLAIN_KEY_BYTE = np.ones(256, dtype=bool)  # bytes index_key keeps as they are in the ASCII range
_PLAIN_KEY_BYTE[[0, 1, 2, 0x20]] = False
_PLAIN_KEY_BYTE[0x80:] = False
_PLAIN_KEY_BYTES = bytes(np.flatnonzero(_PLAIN_KEY_BYTE).astype(np.uint8))  # for bytes.translate's delete
_BASE64_PREFIX = int.from_bytes(b"base64:", "big")
_NULL_VALUE_PROPERTY = b"KAFKA_NULL_VALUE\x011\x02"


class BodyTooLargeError(ValueError):
    """A record's value is longer than the `max_body` given to encode_records."""

    def __init__(self, size: int, record: int) -> None:
        super().__init__(f"a record value of {size} bytes is too large")
        self.size = size
        self.record = record


class IndexKeys(NamedTuple):
    """The IndexFile keys (without the topic) of messages encode_records made: message i's UNIQ_KEY, by its
    String.hashCode mod 2^32, then its Kafka key as index_key spells it, when it has one: `key_lengths[i]` UTF-16
    code units (-1: no key) of `key_chars`, the keys back to back. Hashed when they are indexed (`hashed`), so a
    dispatcher that takes the keys of many appends at once hashes them together."""

    uniq_hashes: np.ndarray  # uint64
    key_chars: np.ndarray  # uint8 (all keys ASCII) or uint16
    key_lengths: np.ndarray  # int64

    def hashed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """String.hashCode mod 2^32 (uint64) and UTF-16 length of every key, message by message, and how many keys
        each message has."""
        count = len(self.uniq_hashes)
        keyed = self.key_lengths >= 0
        with_keys = np.count_nonzero(keyed)
        if not with_keys:
            return self.uniq_hashes, np.full(count, UNIQ_KEY_LENGTH), np.ones(count, dtype=np.int64)
        hashes = np.empty((count, 2), dtype=np.uint64)
        units = np.empty((count, 2), dtype=np.int64)
        hashes[:, 0] = self.uniq_hashes
        units[:, 0] = UNIQ_KEY_LENGTH
        units[:, 1] = self.key_lengths
        if with_keys == count:
            hashes[:, 1] = java_hashes(self.key_chars, self.key_lengths)
            return hashes.ravel(), units.ravel(), np.full(count, 2)
        hashes[keyed, 1] = java_hashes(self.key_chars, self.key_lengths[keyed])
        chosen = np.empty((count, 2), dtype=bool)
        chosen[:, 0] = True
        chosen[:, 1] = keyed
        return hashes[chosen], units[chosen], 1 + keyed

    def rows(self, start: int, stop: int) -> IndexKeys:
        """The keys of messages [start, stop)."""
        chars_end = np.maximum(self.key_lengths, 0).cumsum()
        first = int(chars_end[start - 1]) if start else 0
        last = int(chars_end[stop - 1]) if stop else 0
        return IndexKeys(self.uniq_hashes[start:stop], self.key_chars[first:last], self.key_lengths[start:stop])

    @classmethod
    def concatenate(cls, parts: Sequence[IndexKeys]) -> IndexKeys:
        return cls(*(np.concatenate(column) for column in zip(*parts, strict=True)))


class EncodedMessages(NamedTuple):
    """Messages back to back, QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP left 0 (set by the put), and their
    IndexFile keys (when asked for)."""

    data: bytearray
    starts: np.ndarray  # int64: where each message starts in `data`
    sizes: np.ndarray  # int64: TOTALSIZE of each
    keys: IndexKeys | None


def java_hashes(chars: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """String.hashCode mod 2^32 (uint64) of ASCII strings back to back in `chars` (uint8), `lengths[i]` bytes each,
    all at once: the sum of byte * 31^(bytes after it in its string), wrapping mod 2^64, which keeps it exact mod
    2^32."""
    if not len(chars):
        return np.zeros(len(lengths), dtype=np.uint64)
    ends = lengths.cumsum()
    sums = np.zeros(len(chars) + 1, dtype=np.uint64)
    (chars * POW31[(ends - 1).repeat(lengths) - np.arange(len(chars))]).cumsum(out=sums[1:])
    return (sums[ends] - sums[ends - lengths]) & HASH_MASK


def java_hash_and_units(text: str) -> tuple[int, int]:
    """(String.hashCode mod 2^32, length in UTF-16 units) of one string."""
    units = len(text) if text.isascii() else len(text.encode("utf-16-be", "surrogatepass")) // 2
    return java_string_hash(text) & 0xFFFFFFFF, units


def encode_records(
    records: RecordColumns,
    *,
    topic: str,
    queue_id: int,
    born_timestamps: np.ndarray,
    uniq_prefix: str,
    uniq_first: int,
    producer: str = "",
    store_host: HostAddress = DEFAULT_STORE_HOST,
    max_body: int = 1 << 31,
    index_keys: bool = True,
) -> EncodedMessages:
    """The messages for the records of one Kafka batch (rocketmq_columns.decode_batch), byte for byte what
    encode_message makes of record_properties(record, uniq id, extra) for each, where extra is `KAFKA_BATCH` in a
    batch of several records and `KAFKA_PRODUCER\\x01<producer>\\x02` on the last (when `producer` is given).
    Record i takes the id unique_id(uniq_prefix, uniq_first + i).

    A batch at a time, no Python bytecode per record: sizes, positions and the 88-byte headers (a MESSAGE_HEADER
    array) of all messages are computed with numpy, and the per-record pieces are made by C functions that map()
    applies over the columns - memoryview slices for keys, bodies and headers, zlib.crc32 for BODYCRC, one %-format
    of a per-batch template for the properties, struct packing for their lengths - and written in place by one
    bytearray.join (an index per byte, numpy's way to move bytes, costs more than these copies). The template covers
    a record without headers whose key is plain ASCII (or absent) - checked for the whole batch on the joined keys
    first - the common case; any other record's properties come from record_properties, a record at a time
    (headers, keys kept base64 or not ASCII). Index keys are hashed with numpy (the ids from a table of their last 4
    digits, plain keys on the joined keys) or exactly (the others). Raises BodyTooLargeError or
    PropertiesTooLargeError for the first record whose value exceeds `max_body` or whose PROPERTIES exceed
    MAX_PROPERTIES_SIZE."""
    count = len(records)
    if count == 0:
        z = np.zeros(0, dtype=np.int64)
        return EncodedMessages(bytearray(), z, z, IndexKeys(z.astype(np.uint64), z.astype(np.uint8), z))
    view = memoryview(records.data)
    key_start, key_length, value_start, value_length = (
        records.key_start, records.key_length, records.value_start, records.value_length
    )  # fmt: skip
    key_bytes = np.maximum(key_length, 0)
    body_bytes = np.maximum(value_length, 0)
    keys = list(map(view.__getitem__, map(slice, key_start.tolist(), (key_start + key_bytes).tolist())))
    bodies = list(map(view.__getitem__, map(slice, value_start.tolist(), (value_start + body_bytes).tolist())))
    variant = (key_length >= 0) * 2 + (value_length < 0)  # has a key, has a null value: 0..3
    variants = variant.tolist()
    joined = b"".join(keys)

    # plain keys: 1..n bytes in _PLAIN_KEY_BYTE, not starting with "base64:" (index_key keeps them as they are)
    if (
        not np.count_nonzero(records.header_count)
        and not joined.translate(None, _PLAIN_KEY_BYTES)
        and b"base64:" not in joined
        and not np.count_nonzero(key_length == 0)
    ):
        general_rows: list[int] = []  # the common case, seen on the joined keys at once
    else:
        key_ends = key_bytes.cumsum()
        padded = joined + bytes(8)
        odd = np.zeros(len(joined) + 1, dtype=np.int64)
        (~_PLAIN_KEY_BYTE[np.frombuffer(joined, dtype=np.uint8)]).cumsum(out=odd[1:])
        windows = np.ndarray((len(joined) + 1,), dtype=">u8", buffer=padded, strides=(1,))  # 8 bytes from each byte
        key_firsts = key_ends - key_bytes
        base64_prefixed = ((windows[key_firsts] >> np.uint64(8)) == _BASE64_PREFIX) & (key_length >= 7)
        plain_key = (odd[key_ends] == odd[key_firsts]) & (key_length > 0) & ~base64_prefixed
        general_rows = np.flatnonzero((records.header_count != 0) | (key_length >= 0) & ~plain_key).tolist()

    # PROPERTIES: UNIQ_KEY | (KEYS) | (KAFKA_NULL_VALUE) | (KAFKA_BATCH) | (KAFKA_PRODUCER)
    uniq_part = f"{PROPERTY_UNIQ_KEY}\x01{uniq_prefix}%04X\x02%b%b%b".encode()
    counters: Iterable[int] = range(uniq_first, uniq_first + count)
    if uniq_first + count > 0x10000:
        counters = [counter & 0xFFFF for counter in counters]  # the counter wraps (rarely)
    fields = [counters, map(_KEYS_NAMES.__getitem__, variants), keys, map(_KEY_ENDS.__getitem__, variants)]
    if count > 1:
        uniq_part += f"{PROPERTY_BATCH}\x01%d/{count}\x02".encode()
        fields.append(range(count))
    properties = list(map(uniq_part.__mod__, zip(*fields, strict=True)))
    producer_part = f"{PROPERTY_PRODUCER}\x01{producer}\x02".encode() if producer else b""
    properties[-1] += producer_part
    if general_rows:
        header_first = records.header_count.cumsum() - records.header_count
        for row in general_rows:
            record = _record_at(records, view, row, int(header_first[row]))
            extra = f"{PROPERTY_BATCH}\x01{row}/{count}\x02" if count > 1 else ""
            if row == count - 1:
                extra += producer_part.decode()
            text = record_properties(record, unique_id(uniq_prefix, uniq_first + row), extra)
            properties[row] = text.encode("utf-8", "surrogateescape")
    lengths = list(map(len, properties))
    properties_length = np.array(lengths)
    too_large = (value_length > max_body) | (properties_length > MAX_PROPERTIES_SIZE)
    if np.count_nonzero(too_large):
        row = int(np.argmax(too_large))
        if value_length[row] > max_body:
            raise BodyTooLargeError(int(value_length[row]), row)
        raise PropertiesTooLargeError(lengths[row], row)

    topic_bytes = topic.encode()
    topic_part = struct.pack(">h", len(topic_bytes)) if len(topic_bytes) > 127 else bytes([len(topic_bytes)])
    topic_part += topic_bytes
    total_size = body_bytes + properties_length + (FIXED_SIZE + len(topic_part) + 2)
    header_rows = np.empty((count, FIXED_SIZE), dtype=np.uint8)
    header_rows[:] = _header_template(store_host, len(topic_bytes) > 127)
    headers = header_rows.view(MESSAGE_HEADER).ravel()
    headers["queue_id"] = queue_id
    headers["total_size"] = total_size
    headers["body_crc"] = np.fromiter(map(zlib.crc32, bodies), dtype=np.int64, count=count) & 0x7FFFFFFF
    headers["born_timestamp"] = born_timestamps
    headers["body_length"] = body_bytes
    header_view = header_rows.data.cast("B")
    header_slices = map(
        slice, range(0, count * FIXED_SIZE, FIXED_SIZE), range(FIXED_SIZE, (count + 1) * FIXED_SIZE, FIXED_SIZE)
    )
    messages = bytearray().join(
        itertools.chain.from_iterable(
            zip(
                map(header_view.__getitem__, header_slices), bodies, itertools.repeat(topic_part, count),
                map(_I16.pack, lengths), properties, strict=True,
            )
        )
    )  # fmt: skip
    starts = total_size.cumsum() - total_size

    if not index_keys:
        return EncodedMessages(messages, starts, total_size, None)
    hex_hashes = (
        _HEX4_HASHES[uniq_first : uniq_first + count] if isinstance(counters, range) else _HEX4_HASHES[counters]
    )
    uniq_hashes = (hex_hashes + _uniq_prefix_hash(uniq_prefix)) & HASH_MASK
    key_chars = np.frombuffer(joined, dtype=np.uint8)
    if np.count_nonzero(key_length[general_rows] >= 0):  # keys that index_key spells otherwise: as UTF-16
        key_length = key_length.copy()
        encoded = [
            index_key(bytes(key)).encode("utf-16-be", "surrogatepass")
            for key, size in zip(keys, key_length.tolist(), strict=True)
            if size >= 0
        ]
        key_chars = np.frombuffer(b"".join(encoded), dtype=">u2").astype(np.uint16)
        key_length[key_length >= 0] = [len(units) // 2 for units in encoded]
    return EncodedMessages(messages, starts, total_size, IndexKeys(uniq_hashes, key_chars, key_length))


_I16 = struct.Struct(">h")
# after the id, by has-a-key * 2 + has-a-null-value: the KEYS name (the key follows), then what ends the key
_KEYS_NAMES = (b"", b"", f"{PROPERTY_KEYS}\x01".encode(), f"{PROPERTY_KEYS}\x01".encode())
_KEY_ENDS = (b"", _NULL_VALUE_PROPERTY, b"\x02", b"\x02" + _NULL_VALUE_PROPERTY)


@functools.lru_cache(maxsize=8)
def _uniq_prefix_hash(prefix: str) -> int:
    """String.hashCode of an id prefix (the same for every id of a millisecond) times 31^4, mod 2^32: added to the
    hash of an id's last 4 digits, it gives the id's hash."""
    return (java_string_hash(prefix) & 0xFFFFFFFF) * 31**4 & 0xFFFFFFFF


@functools.lru_cache(maxsize=8)
def _header_template(store_host: HostAddress, v2: bool) -> np.ndarray:
    """The header every message of a broker starts from (the fields that differ 0), as 88 bytes: one per store host
    and magic, not per queue, so thousands of queues appended to in turn never miss the cache."""
    packed = FIXED.pack(
        0, MAGIC_V2 if v2 else MAGIC_V1, 0, 0, 0, 0, 0, 0, 0, UNKNOWN_BORN_HOST.ip, UNKNOWN_BORN_HOST.port,
        0, store_host.ip, store_host.port, 0, 0, 0,
    )  # fmt: skip
    return np.frombuffer(packed, dtype=np.uint8)


def _record_at(records: RecordColumns, view: memoryview, row: int, header_first: int) -> Record:
    """Record `row` of the columns as a Record (key, value, headers; the timestamp is not needed here)."""
    key_length, value_length = int(records.key_length[row]), int(records.value_length[row])
    key_at, value_at = int(records.key_start[row]), int(records.value_start[row])
    headers: list[tuple[str, bytes | None]] = []
    for h in range(header_first, header_first + int(records.header_count[row])):
        name_at, name_length = int(records.header_key_start[h]), int(records.header_key_length[h])
        at, size = int(records.header_value_start[h]), int(records.header_value_length[h])
        name = bytes(view[name_at : name_at + name_length]).decode("utf-8", "surrogateescape")
        headers.append((name, None if size < 0 else bytes(view[at : at + size])))
    return Record(
        value=None if value_length < 0 else bytes(view[value_at : value_at + value_length]),
        key=None if key_length < 0 else bytes(view[key_at : key_at + key_length]),
        headers=headers,
    )


def message_to_record(message: Message) -> Record:
    """The Kafka record a message stands for (offset = QUEUEOFFSET, timestamp = BORNTIMESTAMP)."""
    properties = message.properties
    key: bytes | None
    if PROPERTY_KEY64 in properties:
        encoded = properties[PROPERTY_KEY64]
        key = b"" if encoded == "-" else base64.b64decode(encoded)
    elif PROPERTY_KEYS in properties:
        key = properties[PROPERTY_KEYS].encode("utf-8", "surrogateescape")
    else:
        key = None
    value: bytes | None = None if PROPERTY_NULL_VALUE in properties else message.body
    if PROPERTY_HEADERS64 in properties:
        headers = _decode_headers(properties[PROPERTY_HEADERS64])
    else:
        headers = [
            (name, text.encode("utf-8", "surrogateescape"))
            for name, text in properties.items()
            if name not in RESERVED_PROPERTIES
        ]
    return Record(
        value=value, key=key, timestamp_ms=message.born_timestamp, headers=headers, offset=message.queue_offset
    )


# Fields named `index` and `count` shadow tuple's methods (mypy flags each as an incompatible override); kept, as
# ProducerInfo.count is read by name (storage/rocketmq) and the two types name their count alike.
class BatchPosition(NamedTuple):
    index: int  # type: ignore[assignment]  # see above
    count: int  # type: ignore[assignment]


def batch_position(properties: bytes | bytearray | memoryview) -> BatchPosition:
    """Where a message sits in the Kafka batch it came from (0/1 for a single-record batch)."""
    text = property_value(properties, PROPERTY_BATCH)
    if text is None:
        return BatchPosition(0, 1)
    index, _, count = text.partition("/")
    return BatchPosition(int(index), int(count))


def ends_batch(properties: Mapping[str, str]) -> bool:
    """Is the message with these (parsed) properties the last of the Kafka batch it came from?"""
    text = properties.get(PROPERTY_BATCH)
    if text is None:
        return True
    index, _, count = text.partition("/")
    return int(index) == int(count) - 1


class ProducerInfo(NamedTuple):
    producer_id: int
    epoch: int
    base_sequence: int
    count: int  # type: ignore[assignment]  # shadows tuple.count, as BatchPosition's


def producer_info(properties: bytes | bytearray | memoryview) -> ProducerInfo | None:
    text = property_value(properties, PROPERTY_PRODUCER)
    return None if text is None else parse_producer_info(text)


def parse_producer_info(text: str) -> ProducerInfo:
    """A KAFKA_PRODUCER value: `<producer id>/<epoch>/<base sequence>/<record count>`."""
    producer_id, epoch, base_sequence, count = (int(part) for part in text.split("/"))
    return ProducerInfo(producer_id, epoch, base_sequence, count)


class DispatchInfo(NamedTuple):
    """What the dispatcher needs of a message (DispatchRequest), read without copying the body."""

    total_size: int
    queue_id: int
    flag: int  # FLAG: tidelog keeps a Kafka batch's transactional and control attributes there
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp: int
    topic: str
    properties: bytes


_DISPATCH_HEAD = struct.Struct(">iiiiiqqi")  # TOTALSIZE .. SYSFLAG


def decode_dispatch_info(buf: MessageBuffer, pos: int, end: int) -> DispatchInfo | Blank:
    """The fields the dispatcher needs of the message at `pos`, which must end by `end`; no CRC check (the reput
    service's checkMessageAndReturnSize(checkCRC=false, readBody=false)). Raises InvalidMessage."""
    try:
        return _decode_dispatch_info(buf, pos, end)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"message at {pos} does not decode: {exc}") from None


def _decode_dispatch_info(buf: MessageBuffer, pos: int, end: int) -> DispatchInfo | Blank:
    if end - pos < 8:
        raise InvalidMessage(f"only {end - pos} bytes left at {pos}")
    total, magic = BLANK.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return Blank(total)
    if magic not in (MAGIC_V1, MAGIC_V2) or total < FIXED_SIZE + 3 or total > end - pos:
        raise InvalidMessage(f"no valid message at {pos} (magic {magic & 0xFFFFFFFF:#010x}, size {total})")
    _total, _magic, _crc, queue_id, flag, queue_offset, physical_offset, sys_flag = _DISPATCH_HEAD.unpack_from(buf, pos)
    at = pos + 48 + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
    (store_ts,) = _INT64.unpack_from(buf, at)
    at += 8 + (20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8) + 12
    (body_length,) = _INT32.unpack_from(buf, at)
    at += 4 + body_length
    limit = pos + total
    if body_length < 0 or at + 3 > limit:
        raise InvalidMessage(f"message at {pos} declares a body of {body_length} bytes that does not fit")
    if magic == MAGIC_V2:
        (topic_length,) = struct.unpack_from(">h", buf, at)
        at += 2
    else:
        topic_length = buf[at]
        at += 1
    if topic_length < 0 or at + topic_length + 2 > limit:
        raise InvalidMessage(f"message at {pos} declares a topic of {topic_length} bytes that does not fit")
    topic = bytes(buf[at : at + topic_length]).decode("utf-8", "surrogateescape")
    at += topic_length
    (properties_length,) = struct.unpack_from(">h", buf, at)
    if at + 2 + properties_length != limit:
        raise InvalidMessage(f"message at {pos}: TOTALSIZE {total} disagrees with its fields")
    return DispatchInfo(
        total,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        store_ts,
        topic,
        bytes(buf[at + 2 : pos + total]),
    )
