"""The records of the consumer group protocol (KIP-848) in `__consumer_offsets`, in Kafka 3.9's formats.

Kafka's group-coordinator/src/main/resources/common/message/ConsumerGroup*{Key,Value}.json define them. A key starts
with its int16 version, which is the record type, then the key fields in the classic (non-flexible) encoding:
int16-length UTF-8 strings.

    type 3  ConsumerGroupMetadataKey                 group
    type 4  ConsumerGroupPartitionMetadataKey        group
    type 5  ConsumerGroupMemberMetadataKey           group | memberId
    type 6  ConsumerGroupTargetAssignmentMetadataKey group
    type 7  ConsumerGroupTargetAssignmentMemberKey   group | memberId
    type 8  ConsumerGroupCurrentMemberAssignmentKey  group | memberId

A value starts with its int16 version (0) and is encoded flexibly: compact strings and arrays (unsigned varint of
length + 1, 0 = null), uuids as 16 bytes, and an empty tagged-field section after each struct (tags that a later
Kafka adds are skipped on read).

    3  ConsumerGroupMetadataValue                Epoch int32
    4  ConsumerGroupPartitionMetadataValue       Topics [TopicId uuid | TopicName string | NumPartitions int32
                                                 | PartitionRacks [Partition int32 | Racks [string]]]
    5  ConsumerGroupMemberMetadataValue          InstanceId string? | RackId string? | ClientId string
                                                 | ClientHost string | SubscribedTopicNames [string]
                                                 | SubscribedTopicRegex string? | RebalanceTimeoutMs int32
                                                 | ServerAssignor string?
    6  ConsumerGroupTargetAssignmentMetadataValue AssignmentEpoch int32
    7  ConsumerGroupTargetAssignmentMemberValue  TopicPartitions [TopicId uuid | Partitions [int32]]
    8  ConsumerGroupCurrentMemberAssignmentValue MemberEpoch int32 | PreviousMemberEpoch int32 | State int8
                                                 | AssignedPartitions [TopicPartitions]
                                                 | PartitionsPendingRevocation [TopicPartitions]

A null value (tombstone) deletes the key. Topic ids are carried here as Kafka's base64 text form (what the broker
uses everywhere) and written as their 16 bytes.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from tidelog.codec.varint import decode_unsigned_varint, encode_unsigned_varint
from tidelog.errors import CorruptRecordError

GROUP_METADATA = 3
PARTITION_METADATA = 4
MEMBER_METADATA = 5
TARGET_ASSIGNMENT_METADATA = 6
TARGET_ASSIGNMENT_MEMBER = 7
CURRENT_MEMBER_ASSIGNMENT = 8
RECORD_TYPES = frozenset(range(GROUP_METADATA, CURRENT_MEMBER_ASSIGNMENT + 1))
_PER_MEMBER = frozenset({MEMBER_METADATA, TARGET_ASSIGNMENT_MEMBER, CURRENT_MEMBER_ASSIGNMENT})
VALUE_VERSION = 0

# topic id (base64 text) -> partitions
Assignment = Mapping[str, frozenset[int]]


@dataclass(frozen=True, slots=True)
class ConsumerGroupKey:
    """The key of one consumer-group record: its type, the group, and for the per-member types the member id."""

    record_type: int
    group: str
    member_id: str | None = None


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic_id: str
    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@dataclass(frozen=True, slots=True)
class CurrentAssignment:
    member_epoch: int
    previous_member_epoch: int
    state: int  # Kafka's MemberState: 0 stable, 1 unrevoked partitions, 2 unreleased partitions
    assigned: Assignment
    pending_revocation: Assignment


def is_consumer_group_key(data: bytes) -> bool:
    """Whether a `__consumer_offsets` key is one of these record types (its leading int16 version)."""
    return len(data) >= 2 and struct.unpack_from(">h", data)[0] in RECORD_TYPES


# --- keys -------------------------------------------------------------------------------------------------------


def _classic_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def encode_key(key: ConsumerGroupKey) -> bytes:
    data = struct.pack(">h", key.record_type) + _classic_string(key.group)
    if key.record_type in _PER_MEMBER:
        data += _classic_string(key.member_id or "")
    return data


def decode_key(data: bytes) -> ConsumerGroupKey:
    try:
        (record_type,) = struct.unpack_from(">h", data)
        if record_type not in RECORD_TYPES:
            raise CorruptRecordError(f"__consumer_offsets key type {record_type} is not a consumer-group record")
        (length,) = struct.unpack_from(">h", data, 2)
        group = data[4 : 4 + length].decode("utf-8", "replace")
        member_id = None
        if record_type in _PER_MEMBER:
            (member_length,) = struct.unpack_from(">h", data, 4 + length)
            start = 6 + length
            if start + member_length > len(data):
                raise CorruptRecordError("consumer-group key: the member id runs past the end")
            member_id = data[start : start + member_length].decode("utf-8", "replace")
        return ConsumerGroupKey(record_type, group, member_id)
    except struct.error as exc:
        raise CorruptRecordError(f"consumer-group key is truncated: {exc}") from None


# --- flexible values --------------------------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = [struct.pack(">h", VALUE_VERSION)]

    def int8(self, v: int) -> _Writer:
        self.parts.append(struct.pack(">b", v))
        return self

    def int32(self, v: int) -> _Writer:
        self.parts.append(struct.pack(">i", v))
        return self

    def length(self, n: int | None) -> _Writer:
        self.parts.append(encode_unsigned_varint(0 if n is None else n + 1))
        return self

    def string(self, v: str | None) -> _Writer:
        if v is None:
            return self.length(None)
        raw = v.encode("utf-8")
        self.length(len(raw))
        self.parts.append(raw)
        return self

    def uuid(self, topic_id: str) -> _Writer:
        self.parts.append(base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))
        return self

    def no_tags(self) -> _Writer:
        self.parts.append(b"\x00")
        return self

    def topic_partitions(self, assignment: Assignment) -> _Writer:
        self.length(len(assignment))
        for topic_id, partitions in sorted(assignment.items()):
            self.uuid(topic_id).length(len(partitions))
            for p in sorted(partitions):
                self.int32(p)
            self.no_tags()
        return self

    def done(self) -> bytes:
        return b"".join(self.parts)


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what
        (version,) = self._unpack(">h")
        if version < VALUE_VERSION:
            raise CorruptRecordError(f"{what} has unknown version {version}")

    def _unpack(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise CorruptRecordError(f"{self.what} is truncated at byte {self.pos}")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def int8(self) -> int:
        return self._unpack(">b")[0]

    def int32(self) -> int:
        return self._unpack(">i")[0]

    def length(self) -> int | None:
        value = self._count()
        return None if value == 0 else value - 1

    def string(self) -> str | None:
        n = self.length()
        if n is None:
            return None
        if self.pos + n > len(self.data):
            raise CorruptRecordError(f"{self.what}: a string runs past the end")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", "replace")

    def uuid(self) -> str:
        if self.pos + 16 > len(self.data):
            raise CorruptRecordError(f"{self.what}: a topic id runs past the end")
        raw = self.data[self.pos : self.pos + 16]
        self.pos += 16
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def skip_tags(self) -> None:
        for _ in range(self._count()):
            self._count()  # the tag
            self.pos += self._count()  # its size: skipped

    def _count(self) -> int:
        value, self.pos = decode_unsigned_varint(self.data, self.pos)  # TruncatedBatchError: a CorruptRecordError
        return value

    def topic_partitions(self) -> dict[str, frozenset[int]]:
        out: dict[str, frozenset[int]] = {}
        for _ in range(self.length() or 0):
            topic_id = self.uuid()
            out[topic_id] = frozenset(self.int32() for _ in range(self.length() or 0))
            self.skip_tags()
        return out


def encode_group_epoch(epoch: int) -> bytes:
    return _Writer().int32(epoch).no_tags().done()


def decode_group_epoch(data: bytes) -> int:
    return _Reader(data, "consumer group metadata value").int32()


encode_assignment_epoch = encode_group_epoch


def decode_assignment_epoch(data: bytes) -> int:
    return _Reader(data, "consumer group target assignment metadata value").int32()


def encode_partition_metadata(topics: Mapping[str, TopicMetadata]) -> bytes:
    writer = _Writer().length(len(topics))
    for name in sorted(topics):
        topic = topics[name]
        writer.uuid(topic.topic_id).string(topic.name).int32(topic.partitions).length(0).no_tags()
    return writer.no_tags().done()


def decode_partition_metadata(data: bytes) -> dict[str, TopicMetadata]:
    reader = _Reader(data, "consumer group partition metadata value")
    topics = {}
    for _ in range(reader.length() or 0):
        topic_id, name, partitions = reader.uuid(), reader.string() or "", reader.int32()
        for _ in range(reader.length() or 0):  # partition racks: not used by these assignors
            reader.int32()
            for _ in range(reader.length() or 0):
                reader.string()
            reader.skip_tags()
        reader.skip_tags()
        topics[name] = TopicMetadata(topic_id, name, partitions)
    return topics


def encode_member_metadata(m: MemberMetadata) -> bytes:
    writer = _Writer().string(m.instance_id).string(m.rack_id).string(m.client_id).string(m.client_host)
    writer.length(len(m.subscribed_topic_names))
    for name in m.subscribed_topic_names:
        writer.string(name)
    return (
        writer.string(m.subscribed_topic_regex).int32(m.rebalance_timeout_ms).string(m.server_assignor).no_tags().done()
    )


def decode_member_metadata(data: bytes) -> MemberMetadata:
    reader = _Reader(data, "consumer group member metadata value")
    instance_id, rack_id = reader.string(), reader.string()
    client_id, client_host = reader.string() or "", reader.string() or ""
    names = tuple(reader.string() or "" for _ in range(reader.length() or 0))
    return MemberMetadata(
        instance_id, rack_id, client_id, client_host, names, reader.string(), reader.int32(), reader.string()
    )


def encode_target_assignment(assignment: Assignment) -> bytes:
    return _Writer().topic_partitions(assignment).no_tags().done()


def decode_target_assignment(data: bytes) -> dict[str, frozenset[int]]:
    return _Reader(data, "consumer group target assignment member value").topic_partitions()


def encode_current_assignment(a: CurrentAssignment) -> bytes:
    writer = _Writer().int32(a.member_epoch).int32(a.previous_member_epoch).int8(a.state)
    return writer.topic_partitions(a.assigned).topic_partitions(a.pending_revocation).no_tags().done()


def decode_current_assignment(data: bytes) -> CurrentAssignment:
    reader = _Reader(data, "consumer group current member assignment value")
    epoch, previous, state = reader.int32(), reader.int32(), reader.int8()
    return CurrentAssignment(epoch, previous, state, reader.topic_partitions(), reader.topic_partitions())
