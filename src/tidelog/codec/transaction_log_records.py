"""Records of the internal topic `__transaction_state`, in Kafka 3.9's key and value formats (big-endian).

Kafka's TransactionLogKey.json and TransactionLogValue.json define them. Each starts with its int16 version.

    key v0:    transactionalId string                                   (int16-length UTF-8)
    value v0:  ProducerId int64 | ProducerEpoch int16 | TransactionTimeoutMs int32 | TransactionStatus int8
               | TransactionPartitions [Topic string | PartitionIds [int32]]?   (int32 count, -1 = null)
               | TransactionLastUpdateTimestampMs int64 | TransactionStartTimestampMs int64
    value v1:  the same fields, flexible: compact strings and arrays (unsigned varint of length + 1, 0 = null), an
               empty tagged-field section after each partitions entry, and after the value its tagged fields:
               tag 0 PreviousProducerId int64, tag 1 NextProducerId int64, tag 2 ClientTransactionVersion int16,
               each written only when it differs from its default (-1, -1, 0).

Kafka 3.9 writes value v0 (v1 only once the `transaction.version` feature is 1 or more); both are read. The
partitions are null in the Empty state, as Kafka writes them. A null value (tombstone) deletes the transactional id:
Kafka writes one when `transactional.id.expiration.ms` passed. A transactional id's partition of the topic is
`abs(javaHashCode(transactionalId)) % partitions`, as for a group (codec/group_records.partition_for_group).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from tidelog.codec.varint import decode_unsigned_varint, encode_unsigned_varint
from tidelog.errors import CorruptRecordError, TruncatedBatchError

KEY_VERSION = 0
VALUE_VERSION = 0  # what Kafka 3.9 writes
FLEXIBLE_VALUE_VERSION = 1

_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_TRANSACTION_VERSION = 2


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    """One transactional id's state as stored. `partitions` maps topic -> partition ids (None: written as null)."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: int
    partitions: Mapping[str, tuple[int, ...]] | None
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = -1  # v1 only (tagged)
    next_producer_id: int = -1  # v1 only (tagged)
    client_transaction_version: int = 0  # v1 only (tagged)
    version: int = field(default=VALUE_VERSION, compare=False)


def encode_key(transactional_id: str) -> bytes:
    raw = transactional_id.encode("utf-8")
    return struct.pack(">hh", KEY_VERSION, len(raw)) + raw


def decode_key(data: bytes) -> str:
    if len(data) < 4:
        raise CorruptRecordError(f"__transaction_state key of {len(data)} bytes is truncated")
    version, length = struct.unpack_from(">hh", data)
    if version != KEY_VERSION:
        raise CorruptRecordError(f"__transaction_state key has unknown version {version}")
    if length < 0 or 4 + length > len(data):
        raise CorruptRecordError("__transaction_state key: the transactional id runs past the end")
    return data[4 : 4 + length].decode("utf-8", "replace")


def encode_value(value: TransactionLogValue) -> bytes:
    if value.version == VALUE_VERSION:
        return _encode_v0(value)
    if value.version == FLEXIBLE_VALUE_VERSION:
        return _encode_v1(value)
    raise ValueError(f"__transaction_state value version {value.version} is not known")


def _encode_v0(v: TransactionLogValue) -> bytes:
    parts = [struct.pack(">hqhib", VALUE_VERSION, v.producer_id, v.producer_epoch, v.timeout_ms, v.state)]
    if v.partitions is None:
        parts.append(struct.pack(">i", -1))
    else:
        parts.append(struct.pack(">i", len(v.partitions)))
        for topic, ids in v.partitions.items():
            raw = topic.encode("utf-8")
            parts.append(struct.pack(">h", len(raw)) + raw + struct.pack(f">i{len(ids)}i", len(ids), *ids))
    parts.append(struct.pack(">qq", v.last_update_ms, v.start_ms))
    return b"".join(parts)


def _encode_v1(v: TransactionLogValue) -> bytes:
    parts = [struct.pack(">hqhib", FLEXIBLE_VALUE_VERSION, v.producer_id, v.producer_epoch, v.timeout_ms, v.state)]
    if v.partitions is None:
        parts.append(b"\x00")
    else:
        parts.append(encode_unsigned_varint(len(v.partitions) + 1))
        for topic, ids in v.partitions.items():
            raw = topic.encode("utf-8")
            parts.append(encode_unsigned_varint(len(raw) + 1) + raw)
            parts.append(encode_unsigned_varint(len(ids) + 1) + struct.pack(f">{len(ids)}i", *ids) + b"\x00")
    parts.append(struct.pack(">qq", v.last_update_ms, v.start_ms))
    tags: list[tuple[int, bytes]] = []
    if v.previous_producer_id != -1:
        tags.append((_TAG_PREVIOUS_PRODUCER_ID, struct.pack(">q", v.previous_producer_id)))
    if v.next_producer_id != -1:
        tags.append((_TAG_NEXT_PRODUCER_ID, struct.pack(">q", v.next_producer_id)))
    if v.client_transaction_version != 0:
        tags.append((_TAG_CLIENT_TRANSACTION_VERSION, struct.pack(">h", v.client_transaction_version)))
    parts.append(encode_unsigned_varint(len(tags)))
    for tag, payload in tags:
        parts.append(encode_unsigned_varint(tag) + encode_unsigned_varint(len(payload)) + payload)
    return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def unpack(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise CorruptRecordError(f"__transaction_state value is truncated at byte {self.pos}")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def varint(self) -> int:
        try:
            value, self.pos = decode_unsigned_varint(self.data, self.pos)
        except TruncatedBatchError as exc:
            raise CorruptRecordError(f"__transaction_state value is truncated at byte {self.pos}") from exc
        return value

    def text(self, length: int) -> str:
        if length < 0 or self.pos + length > len(self.data):
            raise CorruptRecordError("__transaction_state value: a topic name runs past the end")
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("utf-8", "replace")

    def skip_tags(self) -> dict[int, bytes]:
        tags = {}
        for _ in range(self.varint()):
            tag, size = self.varint(), self.varint()
            if self.pos + size > len(self.data):
                raise CorruptRecordError("__transaction_state value: a tagged field runs past the end")
            tags[tag] = self.data[self.pos : self.pos + size]
            self.pos += size
        return tags


def decode_value(data: bytes) -> TransactionLogValue:
    reader = _Reader(data)
    (version,) = reader.unpack(">h")
    if version not in (VALUE_VERSION, FLEXIBLE_VALUE_VERSION):
        raise CorruptRecordError(f"__transaction_state value has unknown version {version}")
    flexible = version == FLEXIBLE_VALUE_VERSION
    producer_id, epoch, timeout_ms, state = reader.unpack(">qhib")
    count = reader.varint() - 1 if flexible else reader.unpack(">i")[0]
    partitions: dict[str, tuple[int, ...]] | None = None
    if count >= 0:
        partitions = {}
        for _ in range(count):
            topic = reader.text(reader.varint() - 1 if flexible else reader.unpack(">h")[0])
            n = reader.varint() - 1 if flexible else reader.unpack(">i")[0]
            if n < 0:
                raise CorruptRecordError("__transaction_state value: null partition ids")
            partitions[topic] = reader.unpack(f">{n}i")
            if flexible:
                reader.skip_tags()
    last_update_ms, start_ms = reader.unpack(">qq")
    previous, following, client_version = -1, -1, 0
    if flexible:
        tags = reader.skip_tags()
        if (raw := tags.get(_TAG_PREVIOUS_PRODUCER_ID)) is not None and len(raw) == 8:
            (previous,) = struct.unpack(">q", raw)
        if (raw := tags.get(_TAG_NEXT_PRODUCER_ID)) is not None and len(raw) == 8:
            (following,) = struct.unpack(">q", raw)
        if (raw := tags.get(_TAG_CLIENT_TRANSACTION_VERSION)) is not None and len(raw) == 2:
            (client_version,) = struct.unpack(">h", raw)
    return TransactionLogValue(
        producer_id,
        epoch,
        timeout_ms,
        state,
        partitions,
        last_update_ms,
        start_ms,
        previous,
        following,
        client_version,
        version,
    )
