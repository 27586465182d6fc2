"""The consumer group protocol's `__consumer_offsets` records (Kafka's byte formats) and the server-side assignors."""

from __future__ import annotations

import base64
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.consumer_groups import range_assign, uniform_assign
from tidelog.codec import consumer_group_records as records
from tidelog.codec.consumer_group_records import ConsumerGroupKey, TopicMetadata
from tidelog.errors import CorruptRecordError

TOPIC_ID = base64.urlsafe_b64encode(uuid.UUID(int=7).bytes).rstrip(b"=").decode()


def test_keys_carry_their_record_type_and_classic_strings() -> None:
    assert records.encode_key(ConsumerGroupKey(3, "g")) == b"\x00\x03" + b"\x00\x01g"
    member_key = ConsumerGroupKey(8, "g", "m1")
    assert records.encode_key(member_key) == b"\x00\x08" + b"\x00\x01g" + b"\x00\x02m1"
    for key in (ConsumerGroupKey(t, "grp") for t in (3, 4, 6)):
        assert records.decode_key(records.encode_key(key)) == key
    for key in (ConsumerGroupKey(t, "grp", "member") for t in (5, 7, 8)):
        assert records.decode_key(records.encode_key(key)) == key
    assert records.is_consumer_group_key(records.encode_key(member_key))
    assert not records.is_consumer_group_key(struct.pack(">h", 2) + b"\x00\x01g")  # a classic group's
    with pytest.raises(CorruptRecordError):
        records.decode_key(b"\x00\x05\x00\x01g\x00\x09m")


def test_values_are_flexible_version_0() -> None:
    # ConsumerGroupMetadataValue: version 0 | Epoch int32 | no tagged fields
    assert records.encode_group_epoch(5) == b"\x00\x00" + b"\x00\x00\x00\x05" + b"\x00"
    # ConsumerGroupTargetAssignmentMemberValue: one topic (compact array length 2) with partitions [0, 2]
    value = records.encode_target_assignment({TOPIC_ID: frozenset({2, 0})})
    expected = b"\x00\x00" + b"\x02" + uuid.UUID(int=7).bytes + b"\x03" + struct.pack(">ii", 0, 2) + b"\x00" + b"\x00"
    assert value == expected
    assert records.decode_target_assignment(value) == {TOPIC_ID: frozenset({0, 2})}


def test_values_round_trip() -> None:
    member = records.MemberMetadata("inst", None, "client", "/127.0.0.1", ("a", "b"), "^x.*", 5000, "range")
    assert records.decode_member_metadata(records.encode_member_metadata(member)) == member
    current = records.CurrentAssignment(4, 3, 1, {TOPIC_ID: frozenset({1})}, {TOPIC_ID: frozenset({0})})
    assert records.decode_current_assignment(records.encode_current_assignment(current)) == current
    topics = {"t": TopicMetadata(TOPIC_ID, "t", 6)}
    assert records.decode_partition_metadata(records.encode_partition_metadata(topics)) == topics
    assert records.decode_assignment_epoch(records.encode_assignment_epoch(9)) == 9


def test_tagged_fields_of_a_later_kafka_are_skipped() -> None:
    value = records.encode_group_epoch(5)[:-1] + b"\x01" + b"\x00\x02\xab\xcd"  # tag 0, 2 bytes
    assert records.decode_group_epoch(value) == 5


def test_truncated_values_are_refused() -> None:
    with pytest.raises(CorruptRecordError):
        records.decode_current_assignment(
            records.encode_current_assignment(records.CurrentAssignment(1, 0, 0, {TOPIC_ID: frozenset({1})}, {}))[:12]
        )


def topics_of(**counts: int) -> dict[str, TopicMetadata]:
    return {name: TopicMetadata(f"id-{name}", name, n) for name, n in counts.items()}


def counts(assignment: dict[str, dict[str, frozenset[int]]]) -> dict[str, int]:
    return {m: sum(len(ps) for ps in a.values()) for m, a in assignment.items()}


def test_uniform_is_balanced_and_sticky() -> None:
    topics = topics_of(t=6)
    two = uniform_assign({"a": ("t",), "b": ("t",)}, topics, {})
    assert counts(two) == {"a": 3, "b": 3}
    three = uniform_assign({"a": ("t",), "b": ("t",), "c": ("t",)}, topics, two)
    assert counts(three) == {"a": 2, "b": 2, "c": 2}
    for member in ("a", "b"):  # the old members keep two of their three partitions
        assert three[member]["id-t"] <= two[member]["id-t"]
    back = uniform_assign({"a": ("t",), "c": ("t",)}, topics, three)
    assert counts(back) == {"a": 3, "c": 3}
    assert back["a"]["id-t"] >= three["a"]["id-t"] and back["c"]["id-t"] >= three["c"]["id-t"]


@given(
    st.dictionaries(
        st.sampled_from(["m1", "m2", "m3", "m4"]),
        st.sets(st.sampled_from(["x", "y", "z"]), min_size=1),
        min_size=1,
    )
)
def test_uniform_assigns_every_partition_once_to_a_subscriber(subscriptions: dict[str, set[str]]) -> None:
    topics = topics_of(x=5, y=3, z=1)
    assignment = uniform_assign(subscriptions, topics, {})
    owners: dict[tuple[str, int], str] = {}
    for member, partitions in assignment.items():
        for topic_id, ps in partitions.items():
            assert topic_id.removeprefix("id-") in subscriptions[member]
            for p in ps:
                assert (topic_id, p) not in owners
                owners[(topic_id, p)] = member
    subscribed = set().union(*subscriptions.values())
    assert len(owners) == sum(topics[t].partitions for t in subscribed)
    if len({frozenset(s) for s in subscriptions.values()}) == 1:  # everyone subscribes alike: counts within one
        assert max(counts(assignment).values()) - min(counts(assignment).values()) <= 1


def test_range_gives_consecutive_ranges_in_member_id_order() -> None:
    assignment = range_assign({"b": ("t", "u"), "a": ("t", "u")}, topics_of(t=5, u=2), {})
    assert assignment == {
        "a": {"id-t": frozenset({0, 1, 2}), "id-u": frozenset({0})},
        "b": {"id-t": frozenset({3, 4}), "id-u": frozenset({1})},
    }
