"""The request parser against hostile input, with hypothesis: every API and version the broker serves.

Requests with every field drawn at random by kio's own type strategies, encoded by kio's writer, must decode back
to the same request; cut short or with bytes changed they must fail as MalformedRequestError or
UnsupportedVersionError (which close the connection or answer it) and nothing else. The fixed cases below are what
fuzzing found; each failed before its fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer
from kio.static.primitive import Records
from targets import broker_supported_versions, fuzz_request

import tidelog
from tidelog.errors import InvalidPartitionsError, MalformedRequestError, UnsupportedVersionError
from tidelog.protocol.legacy_schemas import request_schema
from tidelog.protocol.messages import decode_request, millis
from tidelog.protocol.produce_request import ProduceRequestBody

HERE = Path(__file__).resolve().parent
SUPPORTED = broker_supported_versions()
API_VERSIONS = sorted((key, version) for key, (low, high) in SUPPORTED.items() for version in range(low, high + 1))
st.register_type_strategy(Records, st.binary(max_size=80).map(Records))


@st.composite
def encoded_requests(draw: st.DrawFn) -> tuple[int, int, object, bytes]:
    api_key, version = draw(st.sampled_from(API_VERSIONS))
    request_cls = request_schema(api_key, version)
    body = draw(st.from_type(request_cls))
    header_cls = request_cls.__header_schema__
    fields = {"request_api_key": api_key, "request_api_version": version, "correlation_id": draw(st.integers(0, 99))}
    if "client_id" in {f.name for f in dataclasses.fields(header_cls)}:
        fields["client_id"] = draw(st.none() | st.text(max_size=10))
    buffer = io.BytesIO()
    entity_writer(header_cls)(buffer, header_cls(**fields))
    entity_writer(request_cls)(buffer, body)
    return api_key, version, body, buffer.getvalue()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(encoded_requests(), st.data())
def test_requests_round_trip_and_damage_is_a_protocol_error(request_and_bytes, data: st.DataObject) -> None:
    api_key, version, body, payload = request_and_bytes
    try:
        decoded = decode_request(payload, SUPPORTED)
    except MalformedRequestError as exc:
        # kio writes any int64 duration but reads back only what a timedelta holds (about 2^56 ms): such a
        # request (an OffsetCommit v2-v4 retention_time of centuries) is refused, as a malformed request.
        assert "timedelta" in str(exc), exc
    else:
        assert (decoded.api_key, decoded.api_version) == (api_key, version)
        if isinstance(decoded.body, ProduceRequestBody):  # Produce v3+, decoded by hand (protocol/produce_request.py)
            assert produce_fields(decoded.body) == produce_fields(body)
        else:
            assert decoded.body == body

    cut = data.draw(st.integers(0, len(payload) - 1), label="cut")
    damaged = bytearray(payload[:cut] if data.draw(st.booleans(), label="truncate") else payload)
    for _ in range(data.draw(st.integers(0 if len(damaged) < cut + 1 else 1, 4), label="flips")):
        if damaged:
            damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(MalformedRequestError, UnsupportedVersionError):
        decode_request(bytes(damaged), SUPPORTED)


def produce_fields(body: Any) -> tuple[object, ...]:
    """A Produce body as compared: the hand-decoded one has the timeout in milliseconds, kio's a timedelta."""
    topics = [
        (t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
        for t in body.topic_data
    ]
    return (body.transactional_id, body.acks, millis(body.timeout), topics)


# --- what fuzzing found ----------------------------------------------------------------------------------------


def produce_v3_with_null_topics() -> bytes:
    """ProduceRequest v3 whose topic_data array has length -1 (null), which the schema does not allow."""
    return struct.pack(">hhih", 0, 3, 7, -1) + struct.pack(">hhi", -1, -1, 1000) + struct.pack(">i", -1)


def test_a_null_array_the_schema_forbids_is_malformed() -> None:
    """kio reads any array of length -1 as None; the Produce handler then iterated None (TypeError)."""
    with pytest.raises(MalformedRequestError, match="topic_data"):
        decode_request(produce_v3_with_null_topics(), SUPPORTED)


def test_a_null_array_inside_a_nested_entity_is_malformed() -> None:
    topic = struct.pack(">h", 1) + b"t" + struct.pack(">i", -1)  # partition_data: null
    payload = struct.pack(">hhih", 0, 3, 7, -1) + struct.pack(">hhi", -1, -1, 1000) + struct.pack(">i", 1) + topic
    with pytest.raises(MalformedRequestError, match=r"topic_data\[0\]\.partition_data"):
        decode_request(payload, SUPPORTED)


def test_a_null_array_the_schema_allows_stays_null() -> None:
    metadata_v1_all_topics = struct.pack(">hhih", 3, 1, 7, -1) + struct.pack(">i", -1)
    assert decode_request(metadata_v1_all_topics, SUPPORTED).body.topics is None


@pytest.mark.parametrize("size", range(8))
def test_a_payload_shorter_than_a_header_is_malformed(size: int) -> None:
    """Was struct.error; the server's frame check keeps such payloads away, but the decoder promises its errors."""
    with pytest.raises(MalformedRequestError):
        decode_request(b"\x00\x12\x00\x03\x00\x00\x00\x01"[:size], SUPPORTED)


ABORTING_REQUESTS = {
    # Flexible versions: a compact array or string length near 2^32. kio 0.6.5 reserved memory for the declared
    # length before reading, the reservation failed and Rust aborted the process (the broker, in production).
    "Metadata v12, topics": struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + b"\xff\xff\xff\xff\x0f",
    "Produce v9, topic_data": struct.pack(">hhih", 0, 9, 1, -1)
    + b"\x00\x00"
    + struct.pack(">hi", -1, 1000)
    + b"\xff\xff\xff\xff\x0f",
    "Fetch v12, nested partitions": struct.pack(">hhih", 1, 12, 1, -1)
    + b"\x00"
    + struct.pack(">iiiibii", -1, 500, 1, 1 << 20, 0, 0, -1)
    + b"\x02\x02t"
    + b"\xff\xff\xff\xff\x0f",
}


@pytest.mark.parametrize("payload", list(ABORTING_REQUESTS.values()), ids=list(ABORTING_REQUESTS))
def test_huge_collection_lengths_are_refused_before_anything_is_allocated(payload: bytes) -> None:
    """In a child process: the failure mode was an abort, which would take pytest down with it."""
    code = (
        "import sys; from targets import broker_supported_versions\n"
        "from tidelog.errors import MalformedRequestError\n"
        "from tidelog.protocol.messages import decode_request\n"
        "try:\n"
        f"    decode_request({payload!r}, broker_supported_versions())\n"
        "except MalformedRequestError as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=HERE, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("refused:") and "remain" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    "crash",
    [
        b"\x01\x00" + produce_v3_with_null_topics()[4:],  # the input atheris found, in the harness's form
        b"\x01" + b"\xff" * 8,
    ],
)
def test_fuzz_inputs_that_crashed_the_request_target(crash: bytes) -> None:
    fuzz_request(crash)


def test_a_topic_with_more_partitions_than_open_files_allow_is_refused(tmp_path: Path) -> None:
    """A CreateTopics/CreatePartitions for 2^31-1 partitions opened files until the process hit EMFILE and could
    no longer accept connections. Now the engine refuses more partitions than a few per descriptor of its hard
    open-file limit (idle partitions hold no descriptor: storage/common/file_handles.py)."""
    with tidelog.open(tmp_path, background=False) as engine:
        with pytest.raises(InvalidPartitionsError, match="open-file limit"):
            engine.create_topic("huge", 2**31 - 1)
        assert "huge" not in engine.topics()
        assert not (tmp_path / "huge-0").exists()
        engine.create_topic("small", 2)
        with pytest.raises(InvalidPartitionsError, match="open-file limit"):
            engine.create_partitions("small", 2**31 - 1)
        assert engine.topics()["small"].partitions == 2
        assert sorted(p.name for p in tmp_path.glob("small-*")) == ["small-0", "small-1"]
