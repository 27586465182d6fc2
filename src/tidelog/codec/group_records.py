"""Records of the internal topic `__consumer_offsets`, in Kafka's key and value formats (big-endian).

Keys (the version says which kind):
    0/1: OffsetCommitKey    group string | topic string | partition int32
    2:   GroupMetadataKey   group string
Values:
    OffsetCommitValue v3:   offset int64 | leaderEpoch int32 | metadata string | commitTimestamp int64
                            (v0: offset, metadata, timestamp; v1: + expireTimestamp; v2: no expire)
    GroupMetadataValue v3:  protocolType string | generation int32 | protocol string? | leader string?
                            | currentStateTimestamp int64 | members: int32 count of
                            memberId string | groupInstanceId string? | clientId string | clientHost string
                            | rebalanceTimeout int32 | sessionTimeout int32 | subscription bytes | assignment bytes
A null value (tombstone) deletes the key. Strings are int16-length UTF-8 (-1 = null), bytes int32-length.
A group's partition of the topic is `abs(javaHashCode(groupId)) % partitions`, as Kafka computes it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from tidelog.errors import CorruptRecordError

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberValue, ...] = field(default=())


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def int16(self, v: int) -> _Writer:
        self.parts.append(struct.pack(">h", v))
        return self

    def int32(self, v: int) -> _Writer:
        self.parts.append(struct.pack(">i", v))
        return self

    def int64(self, v: int) -> _Writer:
        self.parts.append(struct.pack(">q", v))
        return self

    def string(self, v: str | None) -> _Writer:
        if v is None:
            return self.int16(-1)
        raw = v.encode("utf-8")
        self.int16(len(raw))
        self.parts.append(raw)
        return self

    def bytes_(self, v: bytes) -> _Writer:
        self.int32(len(v))
        self.parts.append(v)
        return self

    def done(self) -> bytes:
        return b"".join(self.parts)


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def _take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise CorruptRecordError(f"{self.what} is truncated at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def int64(self) -> int:
        return self._take(">q")

    def string(self) -> str | None:
        length = self.int16()
        if length < 0:
            return None
        if self.pos + length > len(self.data):
            raise CorruptRecordError(f"{self.what}: a string runs past the end")
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("utf-8", "replace")

    def bytes_(self) -> bytes:
        length = self.int32()
        if length < 0:
            return b""
        if self.pos + length > len(self.data):
            raise CorruptRecordError(f"{self.what}: a byte field runs past the end")
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        return raw


def encode_offset_key(key: OffsetKey) -> bytes:
    return _Writer().int16(OFFSET_COMMIT_KEY_VERSION).string(key.group).string(key.topic).int32(key.partition).done()


def encode_group_key(key: GroupKey) -> bytes:
    return _Writer().int16(GROUP_METADATA_KEY_VERSION).string(key.group).done()


def encode_key(key: OffsetKey | GroupKey) -> bytes:
    return encode_offset_key(key) if isinstance(key, OffsetKey) else encode_group_key(key)


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    reader = _Reader(data, "__consumer_offsets key")
    version = reader.int16()
    if version in (0, 1):
        return OffsetKey(reader.string() or "", reader.string() or "", reader.int32())
    if version == 2:
        return GroupKey(reader.string() or "")
    raise CorruptRecordError(f"__consumer_offsets key has unknown version {version}")


def encode_offset_value(value: OffsetValue) -> bytes:
    return (
        _Writer()
        .int16(OFFSET_COMMIT_VALUE_VERSION)
        .int64(value.offset)
        .int32(value.leader_epoch)
        .string(value.metadata)
        .int64(value.commit_timestamp)
        .done()
    )


def decode_offset_value(data: bytes) -> OffsetValue:
    reader = _Reader(data, "offset commit value")
    version = reader.int16()
    if version in (0, 1, 2):  # v1 adds an expire timestamp after these, which nothing reads any more
        offset, metadata, timestamp = reader.int64(), reader.string(), reader.int64()
        return OffsetValue(offset, -1, metadata or "", timestamp)
    if version == 3:
        offset, epoch, metadata, timestamp = reader.int64(), reader.int32(), reader.string(), reader.int64()
        return OffsetValue(offset, epoch, metadata or "", timestamp)
    raise CorruptRecordError(f"offset commit value has unknown version {version}")


def encode_group_value(value: GroupValue) -> bytes:
    writer = (
        _Writer()
        .int16(GROUP_METADATA_VALUE_VERSION)
        .string(value.protocol_type)
        .int32(value.generation)
        .string(value.protocol)
        .string(value.leader)
        .int64(value.current_state_timestamp)
        .int32(len(value.members))
    )
    for m in value.members:
        writer.string(m.member_id).string(m.group_instance_id).string(m.client_id).string(m.client_host)
        writer.int32(m.rebalance_timeout_ms).int32(m.session_timeout_ms).bytes_(m.subscription).bytes_(m.assignment)
    return writer.done()


def decode_group_value(data: bytes) -> GroupValue:
    reader = _Reader(data, "group metadata value")
    version = reader.int16()
    if version not in (0, 1, 2, 3):
        raise CorruptRecordError(f"group metadata value has unknown version {version}")
    protocol_type = reader.string() or ""
    generation = reader.int32()
    protocol = reader.string()
    leader = reader.string()
    timestamp = reader.int64() if version >= 2 else -1
    members = []
    for _ in range(reader.int32()):
        member_id = reader.string() or ""
        instance = reader.string() if version >= 3 else None
        client_id, client_host = reader.string() or "", reader.string() or ""
        rebalance = reader.int32() if version >= 1 else -1
        session = reader.int32()
        members.append(
            MemberValue(
                member_id, instance, client_id, client_host, rebalance, session, reader.bytes_(), reader.bytes_()
            )
        )
    return GroupValue(protocol_type, generation, protocol, leader, timestamp, tuple(members))


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units), as a signed 32-bit int."""
    h = 0
    for unit in struct.unpack(f">{len(text.encode('utf-16-be')) // 2}H", text.encode("utf-16-be")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_group(group: str, partitions: int) -> int:
    """Kafka's Utils.abs(groupId.hashCode) % partitions (abs of Int.MinValue is 0 there)."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
