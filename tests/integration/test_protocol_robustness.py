"""Raw bytes against the broker's socket: bad frames, bad requests, random garbage, and raw Produce semantics.

Whatever a client sends, the broker answers it or closes that connection - never hangs on a complete frame,
never dies - and afterwards still serves a fresh connection (an ApiVersions round trip and a confluent-kafka
produce and consume), with the data stored before intact. Requests are encoded by hand here (big-endian,
Kafka's non-flexible versions, and ListOffsets v8 for its special targets) so nothing of the broker's own codec
is trusted.
"""

from __future__ import annotations

import dataclasses
import io
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.types import GroupId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import Records

from tidelog.protocol.legacy_schemas import request_schema

SEED_TOPIC = "robustness-seed"
PROBE_TOPIC = "robustness-probe"
SEED_RECORDS = [(f"key-{i}".encode(), f"value-{i}".encode() * (i % 7 + 1)) for i in range(60)]
DEFAULT_REQUEST_MAX_BYTES = 104_857_600  # socket.request.max.bytes
TS = 1_700_000_000_000

API_VERSIONS, PRODUCE, FETCH, METADATA, INIT_PRODUCER_ID, JOIN_GROUP, SYNC_GROUP = 18, 0, 1, 3, 22, 11, 14
UNSUPPORTED_VERSION, CORRUPT_MESSAGE, OUT_OF_ORDER_SEQUENCE, INVALID_PRODUCER_EPOCH = 35, 2, 45, 47
UNKNOWN_TOPIC_OR_PARTITION = 3


# --- encoding by hand ----------------------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def header(api_key: int, api_version: int, correlation_id: int, client_id: str | None = "robustness") -> bytes:
    """Request header v1 (the non-flexible one)."""
    return struct.pack(">hhi", api_key, api_version, correlation_id) + string(client_id)


def api_versions_v0(correlation_id: int) -> bytes:
    return frame(header(API_VERSIONS, 0, correlation_id))


# --- reading -------------------------------------------------------------------------------------------------


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    """n bytes, or None if the peer closed first."""
    data = bytearray()
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


@dataclass
class Outcome:
    kind: str  # "answered", "closed" or "open" (neither within the timeout)
    payload: bytes | None = None


def outcome(sock: socket.socket, timeout: float = 5.0) -> Outcome:
    sock.settimeout(timeout)
    try:
        head = recv_exactly(sock, 4)
        if head is None:
            return Outcome("closed")
        (size,) = struct.unpack(">i", head)
        assert 4 <= size <= 10_000_000, f"answer with an impossible size {size}"
        payload = recv_exactly(sock, size)
        assert payload is not None, "the broker closed the connection in the middle of a response"
        return Outcome("answered", payload)
    except TimeoutError:
        return Outcome("open")


def connect(broker) -> socket.socket:
    return socket.create_connection(("127.0.0.1", broker.port), timeout=10)


@dataclass
class ApiVersionsV0:
    correlation_id: int
    error_code: int
    versions: dict[int, tuple[int, int]]


def parse_api_versions_v0(payload: bytes) -> ApiVersionsV0:
    correlation_id, error_code, count = struct.unpack_from(">ihi", payload, 0)
    entries = struct.iter_unpack(">hhh", payload[10 : 10 + 6 * count])
    assert len(payload) == 10 + 6 * count, "an ApiVersions v0 body is exactly its entries"
    return ApiVersionsV0(correlation_id, error_code, {key: (low, high) for key, low, high in entries})


# --- health checks -------------------------------------------------------------------------------------------


def api_versions_round_trip(broker) -> ApiVersionsV0:
    with connect(broker) as sock:
        sock.sendall(api_versions_v0(4242))
        answer = outcome(sock)
    assert answer.kind == "answered", f"a fresh connection got no ApiVersions answer ({answer.kind})"
    parsed = parse_api_versions_v0(answer.payload)
    assert (parsed.correlation_id, parsed.error_code) == (4242, 0)
    assert {API_VERSIONS, PRODUCE, FETCH, METADATA} <= set(parsed.versions)
    return parsed


def consume_partition(bootstrap: str, topic: str, start: int, count: int) -> list[tuple[bytes, bytes, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"robust-{topic}", "enable.auto.commit": False})
    got: list[tuple[bytes, bytes, int]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=count - len(got), timeout=0.5):
                assert msg.error() is None, msg.error()
                got.append((msg.key(), msg.value(), msg.offset()))
    finally:
        consumer.close()
    return got


def assert_broker_healthy(broker, *, clients: bool = True) -> None:
    assert broker.running, f"the broker died\n{broker.stderr_tail()}"
    api_versions_round_trip(broker)
    if not clients:
        return
    value = f"probe-{time.monotonic_ns()}".encode()
    reports = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    producer.produce(PROBE_TOPIC, key=b"probe", value=value, on_delivery=lambda err, msg: reports.append((err, msg)))
    assert producer.flush(20) == 0
    [(err, msg)] = reports
    assert err is None, err
    assert consume_partition(broker.bootstrap, PROBE_TOPIC, msg.offset(), 1) == [(b"probe", value, msg.offset())]
    stored = consume_partition(broker.bootstrap, SEED_TOPIC, 0, len(SEED_RECORDS))
    assert stored == [(k, v, i) for i, (k, v) in enumerate(SEED_RECORDS)], "the seeded records changed"


def create_topics(bootstrap: str, *names: str) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    for future in client.create_topics([NewTopic(t, 1, 1) for t in names], request_timeout=15).values():
        future.result(timeout=20)


@pytest.fixture(scope="module")
def seeded(broker):
    """The module broker with SEED_RECORDS stored and one probe topic."""
    create_topics(broker.bootstrap, SEED_TOPIC, PROBE_TOPIC)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for key, value in SEED_RECORDS:
        producer.produce(SEED_TOPIC, key=key, value=value)
    assert producer.flush(20) == 0
    return broker


# --- bad frames and requests ---------------------------------------------------------------------------------


def _truncated_frame(sock: socket.socket) -> None:
    sock.sendall(struct.pack(">i", 100) + header(METADATA, 1, 1))  # promises 100 bytes, sends 16, then EOF
    sock.shutdown(socket.SHUT_WR)


BAD_INPUTS: dict[str, Callable[[socket.socket], None]] = {
    "negative size": lambda s: s.sendall(struct.pack(">i", -1) + b"\x00" * 16),
    "most negative size": lambda s: s.sendall(struct.pack(">i", -(2**31)) + b"\x00" * 16),
    "zero size": lambda s: s.sendall(struct.pack(">i", 0)),
    "size below a header": lambda s: s.sendall(frame(b"\x00\x12\x00\x00\x00")),
    "size over socket.request.max.bytes": lambda s: s.sendall(struct.pack(">i", DEFAULT_REQUEST_MAX_BYTES + 1) + b"x"),
    "size 2**31-1": lambda s: s.sendall(struct.pack(">i", 2**31 - 1) + b"x" * 100),
    "unknown api key": lambda s: s.sendall(frame(header(9999, 0, 1))),
    "negative api key": lambda s: s.sendall(frame(header(-1, 0, 1))),
    "unsupported version of Metadata": lambda s: s.sendall(frame(header(METADATA, 99, 1))),
    "negative api version": lambda s: s.sendall(frame(header(METADATA, -1, 1))),
    "truncated request body": lambda s: s.sendall(frame(header(METADATA, 1, 1) + struct.pack(">i", 5))),
    "client id longer than the frame": lambda s: s.sendall(frame(struct.pack(">hhih", METADATA, 1, 1, 500) + b"ab")),
    "client id not utf-8": lambda s: s.sendall(
        frame(struct.pack(">hhih", METADATA, 1, 1, 2) + b"\xff\xfe" + b"\0" * 4)
    ),
    "array count of 2**31-1": lambda s: s.sendall(frame(header(METADATA, 1, 1) + struct.pack(">i", 2**31 - 1))),
    # kio's native reader reserved memory for this many elements before reading one: the allocation failed and
    # aborted the broker process. Now refused up front, as Kafka refuses a collection larger than the bytes left.
    "compact array of 2**32-2 elements": lambda s: s.sendall(
        frame(header(METADATA, 12, 1) + b"\x00" + b"\xff\xff\xff\xff\x0f")  # header v2 tags, then topics
    ),
    "compact string of 2**32-2 bytes": lambda s: s.sendall(
        frame(header(METADATA, 12, 1) + b"\x00" + b"\x02" + b"\x00" * 16 + b"\xff\xff\xff\xff\x0f")
    ),
    "trailing bytes after a request": lambda s: s.sendall(frame(header(API_VERSIONS, 0, 1) + b"trailing")),
    "truncated frame then EOF": _truncated_frame,
}


@pytest.mark.parametrize("send", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_is_answered_or_closed(seeded, send: Callable[[socket.socket], None]) -> None:
    with connect(seeded) as sock:
        send(sock)
        result = outcome(sock)
    assert result.kind in ("answered", "closed"), "the broker neither answered nor closed the connection"
    assert_broker_healthy(seeded)


@pytest.mark.parametrize("client_id", ["robustness", None, ""], ids=["client-id", "null-client-id", "empty-client-id"])
def test_api_versions_with_unsupported_version_is_answered_in_v0(seeded, client_id: str | None) -> None:
    """KIP-511: an ApiVersions version the broker does not know gets a v0 response with UNSUPPORTED_VERSION and the
    versions it does support, and the connection stays open for the client's retry at a version it can speak."""
    with connect(seeded) as sock:
        sock.sendall(frame(header(API_VERSIONS, 99, 77, client_id) + b"\x00" * 7))  # a future body we cannot read
        answer = outcome(sock)
        assert answer.kind == "answered", f"ApiVersions v99 was {answer.kind}, not answered"
        parsed = parse_api_versions_v0(answer.payload)
        assert (parsed.correlation_id, parsed.error_code) == (77, UNSUPPORTED_VERSION)
        low, high = parsed.versions[API_VERSIONS]
        assert low == 0 and high >= 3
        sock.sendall(api_versions_v0(78))  # the retry, on the same connection
        retry = outcome(sock)
        assert retry.kind == "answered"
        assert parse_api_versions_v0(retry.payload).error_code == 0
    assert_broker_healthy(seeded, clients=False)


def test_requests_on_one_connection_are_answered_in_order(seeded) -> None:
    with connect(seeded) as sock:
        sock.sendall(b"".join(api_versions_v0(cid) for cid in range(100, 120)))  # pipelined
        ids = [parse_api_versions_v0(outcome(sock).payload).correlation_id for _ in range(20)]
    assert ids == list(range(100, 120))


def test_a_stalled_client_does_not_block_others(seeded) -> None:
    stalled = [connect(seeded) for _ in range(5)]
    try:
        for sock in stalled:
            sock.sendall(struct.pack(">i", 1000) + header(METADATA, 1, 1))  # half a frame, then silence
        api_versions_round_trip(seeded)
        assert_broker_healthy(seeded)
    finally:
        for sock in stalled:
            sock.close()


def test_connection_churn(seeded) -> None:
    for i in range(200):
        with connect(seeded) as sock:
            if i % 2:
                sock.sendall(struct.pack(">i", 50) + b"\x00\x03")  # leave mid-frame
    assert_broker_healthy(seeded)


def test_fetch_without_partitions_is_answered_at_once(seeded) -> None:
    body = struct.pack(">iiiib", -1, 3000, 1, 1 << 20, 0) + struct.pack(">i", 0)  # Fetch v4, max_wait 3 s, no topics
    with connect(seeded) as sock:
        start = time.monotonic()
        sock.sendall(frame(header(FETCH, 4, 5) + body))
        answer = outcome(sock)
        elapsed = time.monotonic() - start
    assert answer.kind == "answered"
    assert elapsed < 1.0, f"an empty Fetch was answered after {elapsed:.2f} s"


# --- random garbage ------------------------------------------------------------------------------------------

API_KEYS = [PRODUCE, FETCH, 2, METADATA, 8, 9, 10, 11, 12, 13, 14, API_VERSIONS, 19, 20, INIT_PRODUCER_ID]

garbage = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda key, version, cid, tail: struct.pack(">hhi", key, version, cid) + tail,
        st.one_of(st.sampled_from(API_KEYS), st.integers(-(2**15), 2**15 - 1)),
        st.integers(-1, 16),
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=300),
    ),
    st.builds(  # a well-formed header, then garbage: reaches the body decoders
        lambda key, version, tail: header(key, version, 1) + tail,
        st.sampled_from(API_KEYS),
        st.integers(0, 12),
        st.binary(max_size=300),
    ),
)


@settings(max_examples=200, deadline=None, database=None)
@given(payload=garbage)
def test_random_frames_never_hurt_the_broker(seeded, payload: bytes) -> None:
    with connect(seeded) as sock:
        sock.sendall(frame(payload))
        result = outcome(sock, timeout=3.0)
    if result.kind == "open":
        # Only legal for requests that may wait or stay silent: a long-polling Fetch, a Produce with acks=0
        assert len(payload) >= 8 and struct.unpack_from(">h", payload)[0] in (PRODUCE, FETCH), payload
    assert_broker_healthy(seeded, clients=False)


# --- well-formed requests with random field values ----------------------------------------------------------

# Records fields: random bytes or a real batch (the Produce path behind the header check).
st.register_type_strategy(
    Records,
    st.one_of(
        st.binary(max_size=200),
        st.lists(st.binary(max_size=30), min_size=1, max_size=3).map(lambda values: batch(values)),
    ).map(Records),
)
# Names from a small pool (so requests reach topics and groups that exist) or anything at all. The seeded topics
# are left out: their records must stay as they are.
FUZZ_TOPICS = ["robustness-fuzz-a", "robustness-fuzz-b", "__consumer_offsets"]
st.register_type_strategy(TopicName, st.one_of(st.sampled_from(FUZZ_TOPICS), st.text(max_size=30)).map(TopicName))
st.register_type_strategy(GroupId, st.one_of(st.just("robustness-fuzz-group"), st.text(max_size=30)).map(GroupId))
MAY_WAIT = {PRODUCE, FETCH, JOIN_GROUP, SYNC_GROUP}  # long polls, acks=0, rebalances: silence is legal for a while


@st.composite
def kio_requests(draw: st.DrawFn, versions: dict[int, tuple[int, int]]) -> tuple[int, int, bytes]:
    """(api key, version, payload) of a request of a supported API and version, every field drawn at random by
    kio's own type strategies, encoded by kio's writer (a library independent of the broker's decoder); the versions
    kio does not carry (Kafka 3.9's oldest) take their classes from protocol/legacy_schemas.py."""
    api_key = draw(st.sampled_from(sorted(versions)))
    low, high = versions[api_key]
    version = draw(st.integers(low, high))
    request_cls = request_schema(api_key, version)
    body = draw(st.from_type(request_cls))
    buffer = io.BytesIO()
    header_cls = request_cls.__header_schema__
    header_fields = {"request_api_key": api_key, "request_api_version": version, "correlation_id": 4711}
    if "client_id" in {f.name for f in dataclasses.fields(header_cls)}:
        header_fields["client_id"] = draw(st.none() | st.text(max_size=20))
    entity_writer(header_cls)(buffer, header_cls(**header_fields))
    entity_writer(request_cls)(buffer, body)
    return api_key, version, buffer.getvalue()


@pytest.fixture(scope="module")
def broker_versions(seeded) -> dict[int, tuple[int, int]]:
    """The API versions the broker announces (and the topics the random requests aim at)."""
    create_topics(seeded.bootstrap, *FUZZ_TOPICS[:2])
    return api_versions_round_trip(seeded).versions


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_well_formed_requests_with_random_fields_never_hurt_the_broker(seeded, broker_versions, data) -> None:
    """Every API and version the broker announces, with random values in every field (negative partitions,
    huge counts, empty and odd names, null where allowed): each request is answered, or refused by closing the
    connection with a logged reason; no handler fails with an unexpected error and the broker keeps serving."""
    api_key, version, payload = data.draw(kio_requests(broker_versions))
    logged_before = len(seeded.stderr_text())
    with connect(seeded) as sock:
        sock.sendall(frame(payload))
        # A CreateTopics of up to 1,000 partitions takes the broker several seconds on a loaded machine.
        result = outcome(sock, timeout=2.0 if api_key in MAY_WAIT else 60.0)
    logged = seeded.stderr_text()[logged_before:]
    event(f"{api_key}:{result.kind}")
    assert "unexpected error" not in logged, f"API {api_key} v{version} broke a handler:\n{logged}"
    if result.kind == "answered":
        assert struct.unpack_from(">i", result.payload)[0] == 4711, "the answer carries another correlation id"
    elif result.kind == "open":
        assert api_key in MAY_WAIT, f"API {api_key} v{version} got no answer within 60 s"
    assert_broker_healthy(seeded, clients=False)


def test_after_garbage_clients_and_data_are_fine(seeded) -> None:
    """Runs after the random test (file order): real clients still work and the seeded records are unchanged."""
    assert_broker_healthy(seeded)


# --- raw Produce: CRC and idempotence rules ------------------------------------------------------------------


def produce_v3(sock: socket.socket, correlation_id: int, topic: str, partition: int, records: bytes) -> tuple[int, int]:
    """(error code, base offset) of a one-partition Produce v3 with acks=-1."""
    body = (
        string(None)
        + struct.pack(">hi", -1, 10_000)
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">ii", partition, len(records))
        + records
    )
    sock.sendall(frame(header(PRODUCE, 3, correlation_id) + body))
    answer = outcome(sock)
    assert answer.kind == "answered", answer.kind
    payload = answer.payload
    (cid, topics, name_len) = struct.unpack_from(">iih", payload, 0)
    assert (cid, topics) == (correlation_id, 1)
    pos = 10 + name_len
    count, index, error_code, base_offset = struct.unpack_from(">iihq", payload, pos)
    assert (count, index) == (1, partition)
    return error_code, base_offset


def init_producer_id_v0(sock: socket.socket) -> tuple[int, int]:
    sock.sendall(frame(header(INIT_PRODUCER_ID, 0, 9) + string(None) + struct.pack(">i", 60_000)))
    answer = outcome(sock)
    assert answer.kind == "answered"
    cid, _throttle, error_code, producer_id, epoch = struct.unpack(">iihqh", answer.payload)
    assert (cid, error_code) == (9, 0)
    return producer_id, epoch


def batch(values: list[bytes], producer_id: int = -1, epoch: int = -1, sequence: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, producer_id, epoch, sequence, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=TS + i, key=b"k", value=value, headers=[])
    return bytes(builder.build())


def test_raw_produce_to_a_missing_topic_or_partition(seeded) -> None:
    """Produce never creates topics (only Metadata may): UNKNOWN_TOPIC_OR_PARTITION, and nothing appears."""
    create_topics(seeded.bootstrap, "robustness-one-partition")
    with connect(seeded) as sock:
        assert produce_v3(sock, 1, "robustness-no-such-topic", 0, batch([b"a"])) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
        assert produce_v3(sock, 2, "robustness-one-partition", 1, batch([b"a"])) == (UNKNOWN_TOPIC_OR_PARTITION, -1)
        assert produce_v3(sock, 3, "robustness-one-partition", 0, batch([b"a"])) == (0, 0)
    topics = AdminClient({"bootstrap.servers": seeded.bootstrap}).list_topics(timeout=10).topics
    assert "robustness-no-such-topic" not in topics
    assert len(topics["robustness-one-partition"].partitions) == 1


def test_raw_produce_rejects_a_bad_crc_and_keeps_the_connection(seeded) -> None:
    topic = "robustness-crc"
    create_topics(seeded.bootstrap, topic)
    good = batch([b"a", b"b"])
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # last byte of the last record: covered by the CRC
    with connect(seeded) as sock:
        assert produce_v3(sock, 1, topic, 0, good) == (0, 0)
        assert produce_v3(sock, 2, topic, 0, bytes(bad))[0] == CORRUPT_MESSAGE
        assert produce_v3(sock, 3, topic, 0, good) == (0, 2)  # the connection still works, nothing was stored
    assert [v for _, v, _ in consume_partition(seeded.bootstrap, topic, 0, 4)] == [b"a", b"b", b"a", b"b"]


def test_raw_idempotent_produce_dedups_and_checks_sequences(seeded) -> None:
    topic = "robustness-idempotent"
    create_topics(seeded.bootstrap, topic)
    with connect(seeded) as sock:
        producer_id, epoch = init_producer_id_v0(sock)
        assert epoch == 0
        first = batch([b"0", b"1", b"2"], producer_id, 0, 0)
        assert produce_v3(sock, 1, topic, 0, first) == (0, 0)
        assert produce_v3(sock, 2, topic, 0, first) == (0, 0), "a retried batch gets its original offset"
        assert produce_v3(sock, 3, topic, 0, batch([b"3"], producer_id, 0, 3)) == (0, 3)
        assert produce_v3(sock, 4, topic, 0, first) == (0, 0), "still within the 5-batch window"
        gap = produce_v3(sock, 5, topic, 0, batch([b"x"], producer_id, 0, 10))
        assert gap[0] == OUT_OF_ORDER_SEQUENCE
        assert produce_v3(sock, 6, topic, 0, batch([b"4"], producer_id, 1, 0)) == (0, 4), "a new epoch starts at 0"
        fenced = produce_v3(sock, 7, topic, 0, batch([b"y"], producer_id, 0, 4))
        assert fenced[0] == INVALID_PRODUCER_EPOCH
    got = consume_partition(seeded.bootstrap, topic, 0, 5)
    assert [v for _, v, _ in got] == [b"0", b"1", b"2", b"3", b"4"]
    assert_broker_healthy(seeded, clients=False)


# --- flexible versions by hand: unknown tagged fields, ListOffsets v8's special targets ----------------------

LIST_OFFSETS = 2
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -1, -2, -3, -4


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def compact_string(value: str) -> bytes:
    raw = value.encode()
    return uvarint(len(raw) + 1) + raw


def list_offsets_v8(sock: socket.socket, correlation_id: int, topic: str, target: int) -> tuple[int, int, int]:
    """(error code, timestamp, offset) of partition 0 of `topic` for one ListOffsets v8 target (request header
    v2, compact arrays and strings, an empty tagged-field section after every struct)."""
    partition = struct.pack(">iiq", 0, -1, target) + b"\x00"  # index, current leader epoch, timestamp, tags
    topics = uvarint(2) + compact_string(topic) + uvarint(2) + partition + b"\x00"
    body = struct.pack(">ib", -1, 0) + topics + b"\x00"  # replica id, isolation level, topics, tags
    sock.sendall(frame(header(LIST_OFFSETS, 8, correlation_id) + b"\x00" + body))
    answer = outcome(sock)
    assert answer.kind == "answered", answer.kind
    payload = answer.payload
    cid, header_tags, _throttle = struct.unpack_from(">ibi", payload, 0)
    assert (cid, header_tags) == (correlation_id, 0)
    name = compact_string(topic)
    assert payload[9:10] == uvarint(2) and payload[10 : 10 + len(name)] == name
    pos = 10 + len(name)
    assert payload[pos : pos + 1] == uvarint(2)
    index, error_code, timestamp, offset, _epoch = struct.unpack_from(">ihqqi", payload, pos + 1)
    assert index == 0
    assert payload[pos + 27 :] == b"\x00\x00\x00", "partition, topic and response tags end the answer"
    return error_code, timestamp, offset


def test_unknown_tagged_fields_are_skipped_not_fatal(seeded) -> None:
    """The protocol says a reader skips tags it does not know (a newer client may send them): a Metadata v12 with
    unknown tags in its header, topic entry and body is answered, and the connection stays open."""
    unknown = b"\x02" + b"\x63\x02hi" + b"\xe8\x07\x00"  # two tagged fields: tag 99 (2 bytes), tag 1000 (empty)
    topic = b"\x00" * 16 + compact_string(SEED_TOPIC) + unknown
    body = uvarint(2) + topic + b"\x00\x00" + unknown  # topics, no auto-creation, no authorized operations, tags
    with connect(seeded) as sock:
        sock.sendall(frame(header(METADATA, 12, 31) + unknown + body))
        answer = outcome(sock)
        assert answer.kind == "answered", f"a request with unknown tags was {answer.kind}"
        assert struct.unpack_from(">i", answer.payload)[0] == 31
        assert compact_string(SEED_TOPIC) in answer.payload
        sock.sendall(api_versions_v0(32))
        assert parse_api_versions_v0(outcome(sock).payload).correlation_id == 32
    assert_broker_healthy(seeded, clients=False)


def test_list_offsets_v8_special_targets(seeded) -> None:
    """-2 earliest and -4 earliest-local (no tiered storage: both the log start, moved here by DeleteRecords), -1
    latest, -3 the record with the largest timestamp (timestamps out of order: not the last record)."""
    topic = "robustness-list-offsets"
    create_topics(seeded.bootstrap, topic)
    stamps = [TS + i for i in range(10)]
    stamps[6] = TS + 100
    producer = Producer({"bootstrap.servers": seeded.bootstrap, "linger.ms": 50})
    for i, stamp in enumerate(stamps):
        producer.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=stamp)
    assert producer.flush(20) == 0
    admin = AdminClient({"bootstrap.servers": seeded.bootstrap})
    [future] = admin.delete_records([TopicPartition(topic, 0, 3)], request_timeout=15).values()
    assert future.result(timeout=20).low_watermark == 3
    with connect(seeded) as sock:
        assert list_offsets_v8(sock, 1, topic, EARLIEST) == (0, -1, 3)
        assert list_offsets_v8(sock, 2, topic, EARLIEST_LOCAL) == (0, -1, 3)
        assert list_offsets_v8(sock, 3, topic, LATEST) == (0, -1, 10)
        assert list_offsets_v8(sock, 4, topic, MAX_TIMESTAMP) == (0, TS + 100, 6)
        assert list_offsets_v8(sock, 5, topic, TS + 4) == (0, TS + 4, 4)
        assert list_offsets_v8(sock, 6, topic, TS + 7) == (0, TS + 100, 6), "the first record at or after it"
        assert list_offsets_v8(sock, 7, topic, TS + 1) == (0, TS + 3, 3), "deleted records are not found"


@pytest.mark.parametrize("partitions", [1001, 100_000])  # librdkafka sends at most 100,000
def test_a_request_for_too_many_partitions_is_refused_at_once(seeded, partitions: int) -> None:
    """Found by the random-request test: CreatePartitions/CreateTopics for 2^31-1 partitions opened files until the
    broker hit its descriptor limit and stopped accepting connections. One request may create 1,000 partitions."""
    admin = AdminClient({"bootstrap.servers": seeded.bootstrap})
    name = f"robustness-huge-{partitions}"
    started = time.monotonic()
    [future] = admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=30).values()
    with pytest.raises(KafkaException) as error:
        future.result(timeout=30)
    assert error.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    grows = f"robustness-grows-{partitions}"
    create_topics(seeded.bootstrap, grows)
    [future] = admin.create_partitions([NewPartitions(grows, min(1 + partitions, 100_000))]).values()
    with pytest.raises(KafkaException) as error:
        future.result(timeout=30)
    assert error.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    assert time.monotonic() - started < 20
    topics = admin.list_topics(timeout=10).topics
    assert name not in topics and len(topics[grows].partitions) == 1
    assert_broker_healthy(seeded)
