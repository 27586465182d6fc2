"""The sans-I/O protocol layer: request decoding, generic response building, the hand-written Fetch encoder."""

from __future__ import annotations

import contextlib
import io
import os
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_writer

from tidelog.codec.record_batch import Record, build_batch
from tidelog.errors import FrameError
from tidelog.protocol.bounds import check_sizes_and_strip_unknown_tags
from tidelog.protocol.fetch_response import NodeEndpoint, PartitionData, TopicData, encode_fetch_response
from tidelog.protocol.framing import check_frame_size
from tidelog.protocol.legacy_schemas import request_schema, response_schema
from tidelog.protocol.messages import (
    ApiKey,
    MalformedRequestError,
    UnsupportedVersionError,
    build,
    decode_request,
    encode_response,
    millis,
    reader,
    request_class,
    response_class,
    response_header,
    writer,
)
from tidelog.protocol.produce_response import encode_produce_response
from tidelog.protocol.replica_fetch_request import VERSION as REPLICA_FETCH_VERSION
from tidelog.protocol.replica_fetch_request import encode_replica_fetch
from tidelog.storage.api import AbortedTransaction, FileSlice

SUPPORTED = {ApiKey.API_VERSIONS: (0, 4), ApiKey.METADATA: (0, 12), ApiKey.PRODUCE: (3, 11), ApiKey.FETCH: (4, 12)}


def request_header(api_key: int, version: int, correlation_id: int, client_id: str, flexible: bool) -> bytes:
    raw = client_id.encode()
    header = struct.pack(">hhih", api_key, version, correlation_id, len(raw)) + raw
    return header + (b"\x00" if flexible else b"")


def test_decode_a_metadata_v12_request() -> None:
    topic = b"\x00" * 16 + b"\x07orders" + b"\x00"
    payload = request_header(3, 12, 7, "cli", True) + b"\x02" + topic + b"\x01\x00\x00"
    request = decode_request(payload, SUPPORTED)
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (3, 12, 7, "cli")
    assert [t.name for t in request.body.topics] == ["orders"]
    assert request.body.allow_auto_topic_creation is True


def test_unsupported_versions_and_apis_are_refused_with_their_correlation_id() -> None:
    with pytest.raises(UnsupportedVersionError) as error:
        decode_request(request_header(18, 99, 42, "x", False), SUPPORTED)
    assert (error.value.api_key, error.value.api_version, error.value.correlation_id) == (18, 99, 42)
    with pytest.raises(UnsupportedVersionError):
        decode_request(request_header(57, 0, 1, "x", False), SUPPORTED)


def test_a_truncated_request_is_malformed() -> None:
    payload = request_header(3, 12, 7, "cli", True) + b"\x02" + b"\x00" * 5
    with pytest.raises(MalformedRequestError):
        decode_request(payload, SUPPORTED)


@settings(max_examples=300, deadline=None)
@given(
    api=st.sampled_from(sorted(SUPPORTED)),
    version=st.integers(-2, 20),
    body=st.binary(max_size=300),
)
def test_arbitrary_bytes_never_escape_as_anything_but_protocol_errors(api: int, version: int, body: bytes) -> None:
    payload = struct.pack(">hhi", api, version, 1) + body
    with contextlib.suppress(MalformedRequestError, UnsupportedVersionError):  # anything else fails the test
        decode_request(payload, SUPPORTED)


@pytest.mark.parametrize("size", [-1, 0, 7, 104_857_601])
def test_frame_sizes_outside_the_limits_are_refused(size: int) -> None:
    with pytest.raises(FrameError):
        check_frame_size(size, 104_857_600)


def test_build_fills_defaults_and_converts_milliseconds_and_ids() -> None:
    response = load_response_schema(3, 12)
    entity = build(
        response,
        {
            "throttle_time": 250,
            "cluster_id": "c",
            "controller_id": 1,
            "topics": [{"name": "t", "topic_id": "AAAAAAAAAAAAAAAAAAAAAQ", "partitions": []}],
        },
    )
    assert entity.throttle_time.total_seconds() == 0.25
    assert entity.brokers == ()
    assert entity.topics[0].topic_id.int == 1
    assert entity.topics[0].error_code == 0


def test_a_null_for_a_field_an_old_version_cannot_leave_null_becomes_its_default() -> None:
    data = encode_response(
        11,
        2,
        9,
        {"error_code": 79, "generation_id": -1, "protocol_name": None, "leader": "", "member_id": "m", "members": []},
    )
    assert data[:8] == struct.pack(">ii", len(data) - 4, 9)


def kio_fetch_response(
    version: int, correlation_id: int, topics: list[TopicData], node_endpoints: list[NodeEndpoint] | None = None
) -> bytes:
    """The same response through kio's generic encoder: the oracle for the hand-written one."""
    response_cls = load_response_schema(1, version)
    body = {
        "throttle_time": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": t.name,
                "topic_id": t.topic_id,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": p.error_code,
                        "high_watermark": p.high_watermark,
                        "last_stable_offset": p.last_stable_offset,
                        "log_start_offset": p.log_start_offset,
                        "aborted_transactions": None
                        if p.aborted_transactions is None
                        else [
                            {"producer_id": a.producer_id, "first_offset": a.first_offset}
                            for a in p.aborted_transactions
                        ],
                        "preferred_read_replica": -1,
                        "records": b"".join(s.read() for s in p.slices),
                        **(
                            {"current_leader": {"leader_id": p.current_leader[0], "leader_epoch": p.current_leader[1]}}
                            if p.current_leader is not None
                            else {}
                        ),
                    }
                    for p in t.partitions
                ],
            }
            for t in topics
        ],
        "node_endpoints": [vars(n) for n in node_endpoints or ()],
    }
    buffer = io.BytesIO()
    entity_writer(response_cls.__header_schema__)(
        buffer, build(response_cls.__header_schema__, {"correlation_id": correlation_id})
    )
    entity_writer(response_cls)(buffer, build(response_cls, body))
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize("version", range(4, 18))
def test_the_hand_written_fetch_response_matches_kio_byte_for_byte(tmp_path: Path, version: int) -> None:
    """Topics by name up to v12 and by id from v13; from v12 a partition's current leader (a tagged field kio writes
    only when it is not the default), from v16 the leaders' endpoints (another; both left out below their
    versions)."""
    segment = tmp_path / "00000000000000000000.log"
    batches = [build_batch([Record(value=b"v%d" % i, key=b"k")], base_offset=i) for i in range(3)]
    segment.write_bytes(b"".join(batches))
    endpoints = [NodeEndpoint(2, "broker-2.example", 9093, "rack-b"), NodeEndpoint(3, "127.0.0.1", 9094)]
    with open(segment, "rb") as handle:
        first = FileSlice(handle, segment, 0, len(batches[0]))
        rest = FileSlice(handle, segment, len(batches[0]), len(batches[1]) + len(batches[2]))
        topics = [
            TopicData(
                "orders",
                [
                    PartitionData(
                        0,
                        0,
                        3,
                        1,
                        0,
                        slices=(first, rest),
                        aborted_transactions=[AbortedTransaction(7, 0), AbortedTransaction(1 << 40, 2)],
                    ),
                    PartitionData(1, 6, -1, -1, -1, current_leader=(2, 7) if version >= 12 else None),
                    PartitionData(3, 74, -1, -1, -1, current_leader=(-1, -1) if version >= 12 else None),
                ],
                topic_id=uuid.UUID(int=0x1234_5678_9ABC_DEF0_0FED_CBA9_8765_4321),
            ),
            TopicData("empty", [PartitionData(2, 0, 0, 0, 0), PartitionData(4, 0, 0, 0, 0, aborted_transactions=[])]),
        ]
        header = response_header(1, version, 77)
        parts, size = encode_fetch_response(version, header, topics, node_endpoints=endpoints)
        wire = b"".join(p.read() if isinstance(p, FileSlice) else p for p in parts)
        assert len(wire) == size
        assert wire == kio_fetch_response(version, 77, topics, endpoints if version >= 16 else None)
        assert any(isinstance(p, FileSlice) for p in parts), "record bytes must stay file slices for sendfile"
    os.remove(segment)


# --- unknown tagged fields: skipped, as the protocol says (kio alone raises KeyError on them) --------------------


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag_section(fields: list[tuple[int, bytes]]) -> bytes:
    return uvarint(len(fields)) + b"".join(uvarint(tag) + uvarint(len(data)) + data for tag, data in fields)


def metadata_v12(header_tags: list[tuple[int, bytes]], topic_tags: list[tuple[int, bytes]], body_tags) -> bytes:
    """Metadata v12 for topic "orders": tagged-field sections in the header, the topic entry and the body."""
    topic = b"\x00" * 16 + b"\x07orders" + tag_section(topic_tags)
    body = b"\x02" + topic + b"\x01\x00" + tag_section(body_tags)
    return request_header(3, 12, 7, "cli", False) + tag_section(header_tags) + body


def test_unknown_tagged_fields_are_skipped() -> None:
    tagged = b"\x01" + b"\x63" + b"\x02" + b"hi"  # one tagged field: tag 99, 2 bytes
    payload = request_header(3, 12, 7, "cli", False) + tagged + b"\x01\x01\x00\x00"
    request = decode_request(payload, SUPPORTED)
    assert request.body.topics == ()
    assert (request.correlation_id, request.client_id, request.body.allow_auto_topic_creation) == (7, "cli", True)


def test_unknown_tagged_fields_at_every_level_are_skipped() -> None:
    clean = decode_request(metadata_v12([], [], []), SUPPORTED)
    tagged = metadata_v12([(99, b"hi")], [(3, b"four"), (200, b"")], [(1000, b"x" * 200), (1, b"\x00")])
    request = decode_request(tagged, SUPPORTED)
    assert request.body == clean.body
    assert [t.name for t in request.body.topics] == ["orders"]
    assert (request.correlation_id, request.client_id) == (7, "cli")


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 2**31 - 1), st.binary(max_size=140)), max_size=3), min_size=3, max_size=3
    )
)
def test_any_unknown_tags_decode_as_the_request_without_them(tags: list[list[tuple[int, bytes]]]) -> None:
    clean = decode_request(metadata_v12([], [], []), SUPPORTED)  # Metadata v12 knows no tag at any level
    assert decode_request(metadata_v12(*tags), SUPPORTED) == clean


def test_a_known_tag_stays_beside_unknown_ones() -> None:
    """Fetch v12 knows tag 0 (cluster_id) of its body; tag 7 beside it goes, the cluster id stays."""
    request_cls = load_request_schema(1, 12)
    buffer = io.BytesIO()
    entity_writer(request_cls.__header_schema__)(
        buffer,
        request_cls.__header_schema__(request_api_key=1, request_api_version=12, correlation_id=5, client_id="c"),
    )
    body = build(request_cls, {"replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 1024, "rack_id": ""})
    entity_writer(request_cls)(buffer, body)
    encoded = buffer.getvalue()
    assert encoded.endswith(b"\x00")  # no tagged field written: the body's tag section is its last byte
    cluster_id = b"\x04abc"  # compact string "abc"
    payload = encoded[:-1] + tag_section([(0, cluster_id), (7, b"new")])
    request = decode_request(payload, {ApiKey.FETCH: (4, 12)})
    assert request.body.cluster_id == "abc"
    assert request.body.max_bytes == 1024


@dataclass(frozen=True)
class InnerEntity:
    __flexible__: ClassVar[bool] = True
    value: int = field(metadata={"kafka_type": "int32"})


@dataclass(frozen=True)
class OuterEntity:
    __flexible__: ClassVar[bool] = True
    name: str = field(metadata={"kafka_type": "string"})
    inner: InnerEntity = field(metadata={"tag": 0})


def test_a_known_tagged_struct_holding_unknown_tags_is_rewritten_with_its_new_size() -> None:
    inner = struct.pack(">i", 42) + tag_section([(9, b"zz")])
    payload = b"\x03ab" + tag_section([(0, inner), (5, b"q")])
    expected = b"\x03ab" + tag_section([(0, struct.pack(">i", 42) + b"\x00")])
    assert check_sizes_and_strip_unknown_tags(payload, (OuterEntity,)) == expected


def test_a_request_without_unknown_tags_is_not_copied() -> None:
    payload = metadata_v12([], [], [])
    header_cls = load_request_schema(3, 12).__header_schema__
    assert check_sizes_and_strip_unknown_tags(payload, (header_cls, load_request_schema(3, 12))) is payload


def test_an_unknown_tag_larger_than_the_request_is_malformed() -> None:
    payload = request_header(3, 12, 7, "cli", False) + b"\x01\x63\x7f" + b"hi" + b"\x01\x01\x00\x00"
    with pytest.raises(MalformedRequestError, match="tagged field"):
        decode_request(payload, SUPPORTED)


def test_a_response_field_no_version_has_is_an_error_not_dropped() -> None:
    """Handlers answer with dicts; a key the negotiated version lacks is left out (older clients), but a key that
    no version of the message has is a misspelling and must not vanish silently."""
    from kio.index import load_response_schema

    from tidelog.protocol.messages import build

    create_topics_v2 = load_response_schema(ApiKey.CREATE_TOPICS, 2)
    built = build(create_topics_v2, {"topics": [{"name": "t", "error_code": 0, "num_partitions": 3}]})
    assert built.topics[0].name == "t"  # num_partitions is a v5 field: dropped for v2
    with pytest.raises(ValueError, match="no version has field"):
        build(create_topics_v2, {"topcs": []})
    with pytest.raises(ValueError, match="CreatableTopicResult: no version has field"):
        build(create_topics_v2, {"topics": [{"nme": "t"}]})


@pytest.mark.parametrize(
    ("topics", "forgotten"),
    [
        ({}, {}),  # an incremental request with nothing changed
        ({"t": [(0, 3, 42, 0)]}, {}),
        ({"__consumer_offsets": [(p, 1, 1000 + p, 7) for p in range(17)], "t": [(2, 5, 1 << 40, -1)]}, {}),
        ({"ünïcode-topic": [(1, 0, 5, 5)]}, {"t": [0, 2], "gone": [9]}),
    ],
)
def test_the_hand_written_replica_fetch_matches_kio_byte_for_byte(
    topics: dict[str, list[tuple[int, int, int, int]]], forgotten: dict[str, list[int]]
) -> None:
    ours = encode_replica_fetch(
        3,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=10_485_760,
        partition_max_bytes=1_048_576,
        session_id=123456,
        session_epoch=7,
        topics=topics,
        forgotten=forgotten,
    )
    body = {
        "replica_id": 3,
        "max_wait": 500,
        "min_bytes": 1,
        "max_bytes": 10_485_760,
        "isolation_level": 0,
        "session_id": 123456,
        "session_epoch": 7,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": epoch,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": start,
                        "partition_max_bytes": 1_048_576,
                    }
                    for partition, epoch, offset, start in partitions
                ],
            }
            for topic, partitions in topics.items()
        ],
        "forgotten_topics_data": [{"topic": t, "partitions": p} for t, p in forgotten.items()],
        "rack_id": "",
    }
    request_cls = request_class(ApiKey.FETCH, REPLICA_FETCH_VERSION)
    buffer = io.BytesIO()
    writer(request_cls)(buffer, build(request_cls, body))
    assert ours == buffer.getvalue()


PRODUCE_BODY = {
    "responses": [
        {
            "name": "orders",
            "partition_responses": [
                {"index": 0, "error_code": 0, "base_offset": 41, "log_append_time": None, "log_start_offset": 0},
                {
                    "index": 3,
                    "error_code": 7,
                    "base_offset": -1,
                    "log_append_time": 1_700_000_000_123,
                    "log_start_offset": -1,
                    "error_message": "offsets below 42 not replicated to the ISR [1, 2] within 30000 ms",
                },
            ],
        },
        {"name": "ünïcode", "partition_responses": []},
    ],
    "throttle_time": 250,
}


@pytest.mark.parametrize("version", range(12))
def test_the_hand_written_produce_response_matches_kio_byte_for_byte(version: int) -> None:
    response_cls = response_class(ApiKey.PRODUCE, version)
    buffer = io.BytesIO()
    writer(response_cls)(buffer, build(response_cls, PRODUCE_BODY))
    assert encode_produce_response(version, PRODUCE_BODY) == buffer.getvalue()


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(ApiKey.API_VERSIONS, 3), (ApiKey.PRODUCE, 8), (ApiKey.PRODUCE, 9), (ApiKey.FETCH, 12), (ApiKey.METADATA, 4)],
)
def test_response_headers_match_kio(api_key: int, version: int) -> None:
    header_cls = response_class(api_key, version).__header_schema__
    buffer = io.BytesIO()
    writer(header_cls)(buffer, build(header_cls, {"correlation_id": 123456789}))
    assert response_header(api_key, version, 123456789) == buffer.getvalue()


def produce_frame(version: int, body: dict, client_id: str | None = "rdkafka", header_tags: bytes = b"") -> bytes:
    """A Produce request (header and body, no size) as kio encodes it; `header_tags` replaces the flexible
    header's empty tagged fields (b"\\x00")."""
    request_cls = request_class(ApiKey.PRODUCE, version)
    header_cls = request_cls.__header_schema__
    header = io.BytesIO()
    writer(header_cls)(
        header,
        build(
            header_cls,
            {"request_api_key": 0, "request_api_version": version, "correlation_id": 77, "client_id": client_id},
        ),
    )
    encoded_header = header.getvalue()
    if header_tags:
        encoded_header = encoded_header[:-1] + header_tags
    body_buffer = io.BytesIO()
    writer(request_cls)(body_buffer, build(request_cls, body))
    return encoded_header + body_buffer.getvalue()


PRODUCE_REQUESTS = [
    {"transactional_id": None, "acks": -1, "timeout": 30_000, "topic_data": []},
    {
        "transactional_id": "tx-ünï",
        "acks": 1,
        "timeout": 1500,
        "topic_data": [
            {
                "name": "orders",
                "partition_data": [{"index": 0, "records": b"\x01" * 70}, {"index": 5, "records": None}],
            },
            {"name": "ünïcode", "partition_data": [{"index": 2, "records": b""}]},
        ],
    },
]


@pytest.mark.parametrize("version", range(3, 12))
@pytest.mark.parametrize("body", PRODUCE_REQUESTS)
def test_hand_decoded_produce_requests_match_kio(version: int, body: dict) -> None:
    payload = produce_frame(version, body, client_id=None if version == 4 else "rdkafka")
    if version >= 9:  # an unknown tagged field in the header: skipped
        payload = produce_frame(version, body, header_tags=b"\x01\x05\x02hi")
    ours = decode_request(payload, {ApiKey.PRODUCE: (0, 11)})
    request_cls = request_class(ApiKey.PRODUCE, version)
    offset = len(payload) - len(_body_bytes(version, body))  # where the body starts, after the header
    theirs, _ = reader(request_cls)(payload, offset)
    assert ours.correlation_id == 77
    assert ours.client_id == (None if version == 4 else "rdkafka")
    assert (ours.body.transactional_id, ours.body.acks, millis(ours.body.timeout)) == (
        theirs.transactional_id,
        theirs.acks,
        millis(theirs.timeout),
    )
    assert [(t.name, [(p.index, p.records) for p in t.partition_data]) for t in ours.body.topic_data] == [
        (t.name, [(p.index, p.records) for p in t.partition_data]) for t in theirs.topic_data
    ]


def _body_bytes(version: int, body: dict) -> bytes:
    request_cls = request_class(ApiKey.PRODUCE, version)
    buffer = io.BytesIO()
    writer(request_cls)(buffer, build(request_cls, body))
    return buffer.getvalue()


@pytest.mark.parametrize("version", [7, 9])
def test_a_truncated_or_lying_produce_request_is_malformed_never_anything_else(version: int) -> None:
    payload = produce_frame(version, PRODUCE_REQUESTS[1])
    for end in range(8, len(payload)):  # cut anywhere past the fixed header start
        with pytest.raises(MalformedRequestError):
            decode_request(payload[:end], {ApiKey.PRODUCE: (0, 11)})
    body_start = len(payload) - len(_body_bytes(version, PRODUCE_REQUESTS[1]))
    transactional_id_length = 2 if version < 9 else 1
    topics_at = body_start + transactional_id_length + len("tx-ünï".encode()) + 6
    lying = bytearray(payload)
    if version < 9:
        struct.pack_into(">i", lying, topics_at, 1 << 30)  # a billion topics in a 200-byte frame
    else:
        lying[topics_at : topics_at + 1] = b"\xff\xff\xff\xff\x03"
    with pytest.raises(MalformedRequestError):
        decode_request(bytes(lying), {ApiKey.PRODUCE: (0, 11)})


def test_a_legacy_version_is_one_class_however_its_api_key_is_named() -> None:
    """The legacy classes are built on first use: an ApiKey and its int (cached apart by functools) get the same class,
    so a request decoded through either equals one built with the other."""
    for api_key in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS):
        for version in (0,):
            assert request_schema(api_key, version) is request_schema(int(api_key), version)
            assert response_schema(int(api_key), version) is response_schema(api_key, version)
