"""Fetch responses (v0-v17) encoded by hand, so record data can follow as file slices sent with sendfile.

    throttle_time_ms i32 (v1+) | error_code i16 (v7+) | session_id i32 (v7+) | responses:
      topic string (v0-v12) | topic_id uuid (v13+) | partitions:
        partition_index i32 | error_code i16 | high_watermark i64 | last_stable_offset i64 (v4+)
        | log_start_offset i64 (v5+) | aborted_transactions nullable [producer_id i64, first_offset i64] (v4+)
        | preferred_read_replica i32 (v11+) | records nullable bytes
        | tagged fields (v12+): 1 current_leader {leader_id i32, leader_epoch i32} when known
      | tagged fields (v12+)
    | tagged fields (v12+): 0 node_endpoints [node_id i32, host string, port i32, rack nullable string] (v16+)

From v12 on (flexible) arrays, strings and bytes carry unsigned-varint lengths plus one; a tagged field is
`tag | size | value` after the count of those present, and one holding its default is left out (KIP-482). From
v16 (KIP-951) a partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH carries its current leader, and
the response the endpoints of those leaders, so a client can go there without asking Metadata first. The encoder
returns a list of parts: bytes, and FileSlice objects standing for the record bytes in their place.
`aborted_transactions` is null (None) for a read_uncommitted fetch, as Kafka answers it, and the aborted
transactions of the data for a read_committed one. Its output is
tested byte for byte against kio's generic encoder.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.codec.varint import encode_unsigned_varint
from tidelog.storage.api import AbortedTransaction, FileSlice, MemorySlice

FLEXIBLE_FROM = 12
TOPIC_IDS_FROM = 13  # KIP-516: topics named by id
NODE_ENDPOINTS_FROM = 16  # KIP-951
_CURRENT_LEADER_TAG = 1  # PartitionData's tagged field
_NODE_ENDPOINTS_TAG = 0  # the response's tagged field
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION_FIXED = struct.Struct(">ihq")  # index, error code, high watermark
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_I64 = struct.Struct(">q")
_ZERO_UUID = uuid.UUID(int=0)


@dataclass
class PartitionData:
    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    slices: Sequence[FileSlice | MemorySlice] = ()
    records: bytes | None = None  # used instead of slices when the bytes are already in memory
    current_leader: tuple[int, int] | None = None  # (leader id, leader epoch), v12+ when set
    aborted_transactions: Sequence[AbortedTransaction] | None = None  # a read_committed fetch's, v4+
    preferred_read_replica: int = -1  # KIP-392, v11+: the replica the consumer should read from (-1: this one)

    @property
    def records_size(self) -> int:
        if self.records is not None:
            return len(self.records)
        return sum(s.length for s in self.slices)


@dataclass
class TopicData:
    name: str  # what v0-v12 answer
    partitions: list[PartitionData] = field(default_factory=list)
    topic_id: uuid.UUID | None = None  # what v13+ answer (the zero Uuid when None)


@dataclass(frozen=True)
class NodeEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None = None


Part = bytes | FileSlice | MemorySlice


def encode_fetch_response(
    version: int,
    header: bytes,
    topics: Sequence[TopicData],
    *,
    error_code: int = 0,
    session_id: int = 0,
    throttle_time_ms: int = 0,
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> tuple[list[Part], int]:
    """(parts, total size) of the framed response; header is the already-encoded response header."""
    flexible = version >= FLEXIBLE_FROM
    by_id = version >= TOPIC_IDS_FROM
    out = bytearray(b"\x00\x00\x00\x00")
    out += header
    if version >= 1:
        out += _I32.pack(throttle_time_ms)
    if version >= 7:
        out += _I16.pack(error_code) + _I32.pack(session_id)
    out += _array_length(len(topics), flexible)
    parts: list[Part] = []
    total = 0
    for topic in topics:
        out += (topic.topic_id or _ZERO_UUID).bytes if by_id else _string(topic.name, flexible)
        out += _array_length(len(topic.partitions), flexible)
        for partition in topic.partitions:
            out += _PARTITION_FIXED.pack(partition.partition_index, partition.error_code, partition.high_watermark)
            if version >= 4:
                out += _I64.pack(partition.last_stable_offset)
            if version >= 5:
                out += _I64.pack(partition.log_start_offset)
            if version >= 4:
                out += _aborted_transactions(partition.aborted_transactions, flexible)
            if version >= 11:
                out += _I32.pack(partition.preferred_read_replica)
            size = partition.records_size
            out += encode_unsigned_varint(size + 1) if flexible else _I32.pack(size)
            if partition.records is not None:
                out += partition.records
            elif partition.slices:
                parts.append(bytes(out))
                total += len(out)
                out = bytearray()
                parts.extend(partition.slices)
                total += size
            if flexible:
                out += _partition_tags(partition.current_leader)
        if flexible:
            out += b"\x00"  # topic tagged fields
    if flexible:
        out += _response_tags(node_endpoints if version >= NODE_ENDPOINTS_FROM else ())
    parts.append(bytes(out))
    total += len(out)
    first = bytearray(parts[0])  # type: ignore[arg-type]
    struct.pack_into(">i", first, 0, total - 4)
    parts[0] = bytes(first)
    return parts, total


def _aborted_transactions(aborted: Sequence[AbortedTransaction] | None, flexible: bool) -> bytes:
    if aborted is None:
        return b"\x00" if flexible else _I32.pack(-1)
    entry_tags = b"\x00" if flexible else b""
    return _array_length(len(aborted), flexible) + b"".join(_ABORTED.pack(*txn) + entry_tags for txn in aborted)


def _partition_tags(current_leader: tuple[int, int] | None) -> bytes:
    if current_leader is None or current_leader == (-1, -1):  # the default: left out
        return b"\x00"
    value = _I32.pack(current_leader[0]) + _I32.pack(current_leader[1]) + b"\x00"
    return b"\x01" + _tagged(_CURRENT_LEADER_TAG, value)


def _response_tags(node_endpoints: Sequence[NodeEndpoint]) -> bytes:
    if not node_endpoints:
        return b"\x00"
    value = bytearray(_array_length(len(node_endpoints), True))
    for node in node_endpoints:
        value += _I32.pack(node.node_id) + _string(node.host, True) + _I32.pack(node.port)
        value += _string(node.rack, True) if node.rack is not None else b"\x00"
        value += b"\x00"
    return b"\x01" + _tagged(_NODE_ENDPOINTS_TAG, bytes(value))


def _tagged(tag: int, value: bytes) -> bytes:
    return encode_unsigned_varint(tag) + encode_unsigned_varint(len(value)) + value


def _array_length(count: int, flexible: bool) -> bytes:
    return encode_unsigned_varint(count + 1) if flexible else _I32.pack(count)


def _string(text: str, flexible: bool) -> bytes:
    raw = text.encode("utf-8")
    return (encode_unsigned_varint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw
