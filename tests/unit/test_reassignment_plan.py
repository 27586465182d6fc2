"""What a partition reassignment writes (the controller's `_reassigned`, Kafka's ReplicaAssignment.reassignTo) and
what `tidelog reassign` reads and prints (Kafka's reassignment JSON); the moves themselves are in
tests/cluster/test_reassignment.py."""

from __future__ import annotations

import json

import pytest

from tidelog.broker.controller import _reassigned
from tidelog.errors import (
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
    ToolError,
    UnknownTopicOrPartitionError,
)
from tidelog.tools.reassign import ReassignOptions, parse_broker_list, parse_reassignment, render_assignment

LIVE = (1, 2, 3, 4)


def test_a_move_lists_the_target_first_then_the_replicas_it_removes() -> None:
    assert _reassigned("t", 0, (1, 2), (), (), [2, 3], LIVE) == ((2, 3, 1), (3,), (1,))
    assert _reassigned("t", 1, (1, 2), (), (), [3, 1], LIVE) == ((3, 1, 2), (3,), (2,))
    assert _reassigned("t", 0, (1, 2), (), (), [2, 1], LIVE) == ((2, 1), (), ())  # a reordering: nothing to copy


def test_a_new_target_replaces_an_ongoing_one_from_the_original_replicas() -> None:
    # [1, 2] -> [2, 3] is under way (replicas [2, 3, 1], adding [3], removing [1]); now to [4, 1]: 3 is removed too
    assert _reassigned("t", 0, (2, 3, 1), (3,), (1,), [4, 1], LIVE) == ((4, 1, 2, 3), (4,), (2, 3))


def test_a_cancel_goes_back_to_the_original_replicas_removing_those_being_added() -> None:
    # the original replicas in the order the ongoing assignment has them, as Kafka's originReplicas
    assert _reassigned("t", 0, (2, 3, 1), (3,), (1,), None, LIVE) == ((2, 1, 3), (), (3,))
    # which the controller completes once 2 and 1 are in the ISR, taking 3 out of it first
    with pytest.raises(NoReassignmentInProgressError):
        _reassigned("t", 0, (1, 2), (), (), None, LIVE)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ([], "Empty replica list"),
        ([2, 2], "Duplicate replica ids"),
        ([1, 9], "not alive"),
        ([-1, 2], "Invalid broker id"),
    ],
)
def test_invalid_targets_are_refused_as_kafka_refuses_them(target: list[int], message: str) -> None:
    with pytest.raises(InvalidReplicaAssignmentError, match=message):
        _reassigned("t", 0, (1, 2), (), (), target, LIVE)


def test_an_unknown_partition_is_refused() -> None:
    with pytest.raises(UnknownTopicOrPartitionError):
        _reassigned("t", 5, None, (), (), [1], LIVE)


def test_the_reassignment_json_is_kafkas() -> None:
    document = {
        "version": 1,
        "partitions": [
            {"topic": "t", "partition": 1, "replicas": [3, 1], "log_dirs": ["any", "any"]},
            {"topic": "t", "partition": 0, "replicas": [2, 3]},
        ],
    }
    parsed = parse_reassignment(document)
    assert parsed == {("t", 1): (3, 1), ("t", 0): (2, 3)}
    assert json.loads(render_assignment(parsed)) == {
        "version": 1,
        "partitions": [
            {"topic": "t", "partition": 0, "replicas": [2, 3], "log_dirs": ["any", "any"]},
            {"topic": "t", "partition": 1, "replicas": [3, 1], "log_dirs": ["any", "any"]},
        ],
    }
    for bad in (
        {"version": 2, "partitions": []},
        {"version": 1, "partitions": []},
        {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": "2,3"}]},
        {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2], "log_dirs": ["/d"]}]},
        {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2]}] * 2},
    ):
        with pytest.raises(ToolError):
            parse_reassignment(bad)


def test_the_options_belong_to_their_actions() -> None:
    with pytest.raises(ToolError, match="--execute needs --reassignment-json-file"):
        ReassignOptions("h:1", "execute")
    with pytest.raises(ToolError, match="--generate needs"):
        ReassignOptions("h:1", "generate", topics_to_move_json_file="f")
    with pytest.raises(ToolError, match="can't be used with --verify"):
        ReassignOptions("h:1", "verify", reassignment_json_file="f", broker_list="1,2")
    assert parse_broker_list("1, 2,3") == [1, 2, 3]
    with pytest.raises(ToolError):
        parse_broker_list("1,1")
