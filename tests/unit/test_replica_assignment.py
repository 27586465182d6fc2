"""Replica placement as Kafka's AdminUtils.assignReplicasToBrokers computes it (broker/replica_assignment.py): the
examples of its documentation, the properties its tests check, and the errors it raises."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tidelog.broker.replica_assignment import BrokerPlacement, assign_replicas, rack_alternated
from tidelog.errors import InvalidPartitionsError, InvalidReplicationFactorError


def brokers(*ids: int, racks: dict[int, str] | None = None) -> list[BrokerPlacement]:
    return [BrokerPlacement(i, (racks or {}).get(i)) for i in ids]


def test_rack_unaware_as_kafkas_documentation_draws_it() -> None:
    """broker-0..4, 10 partitions, 3 replicas: the first replicas round-robin, the followers at a growing shift."""
    assignment = assign_replicas(brokers(0, 1, 2, 3, 4), 10, 3, start_index=0)
    assert [assignment[p][0] for p in range(10)] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert assignment[0] == (0, 1, 2) and assignment[4] == (4, 0, 1)
    assert assignment[5] == (0, 2, 3) and assignment[9] == (4, 1, 2)  # the shift grew by one after a round


def test_rack_alternated_broker_list() -> None:
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert rack_alternated(racks) == [0, 3, 1, 5, 4, 2]
    three = {i: f"rack{i // 3 + 1}" for i in range(9)}
    assert rack_alternated(three) == [0, 3, 6, 1, 4, 7, 2, 5, 8]


def test_rack_aware_as_kafkas_documentation_draws_it() -> None:
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assignment = assign_replicas(brokers(*racks, racks=racks), 7, 3, start_index=0)
    assert assignment == {
        0: (0, 3, 1),
        1: (3, 1, 5),
        2: (1, 5, 4),
        3: (5, 4, 2),
        4: (4, 2, 0),
        5: (2, 0, 3),
        6: (0, 4, 2),  # the followers shift after the first round
    }
    for replicas in assignment.values():
        assert len({racks[b] for b in replicas}) == 3  # one replica on each rack


def test_spread_is_even_and_replicas_distinct() -> None:
    for seed in range(20):
        assignment = assign_replicas(brokers(1, 2, 3), 6, 3, rng=random.Random(seed))
        assert sorted(assignment) == list(range(6))
        assert all(sorted(r) == [1, 2, 3] for r in assignment.values())
        assert Counter(r[0] for r in assignment.values()) == {1: 2, 2: 2, 3: 2}  # leaders spread evenly


def test_a_mix_of_brokers_with_and_without_racks_is_placed_rack_unaware() -> None:
    mixed = [BrokerPlacement(1, "a"), BrokerPlacement(2, None), BrokerPlacement(3, "b")]
    assert assign_replicas(mixed, 3, 2, start_index=0) == assign_replicas(brokers(1, 2, 3), 3, 2, start_index=0)


def test_partitions_added_later_continue_the_assignment() -> None:
    whole = assign_replicas(brokers(1, 2, 3), 8, 2, start_index=1)
    added = assign_replicas(brokers(1, 2, 3), 3, 2, start_index=1, start_partition=5)
    assert sorted(added) == [5, 6, 7]
    assert [added[p][0] for p in added] == [whole[p][0] for p in (5, 6, 7)]  # the leaders' round-robin goes on
    assert added == {5: (1, 3), 6: (2, 3), 7: (3, 1)}  # the followers' shift is counted afresh, as in Kafka


def test_errors_are_kafkas() -> None:
    with pytest.raises(InvalidReplicationFactorError, match="replication factor: 4 larger than available brokers: 3"):
        assign_replicas(brokers(1, 2, 3), 1, 4)
    with pytest.raises(InvalidReplicationFactorError, match="larger than 0"):
        assign_replicas(brokers(1), 1, 0)
    with pytest.raises(InvalidPartitionsError, match="larger than 0"):
        assign_replicas(brokers(1), 0, 1)
