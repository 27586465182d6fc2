"""Where a new topic's replicas go: Kafka's AdminUtils.assignReplicasToBrokers, with the same results.

Without racks (`broker.rack` unset on some broker), the first replica of each partition goes round-robin over the
brokers sorted by id, from a start index; the others follow at a shift that grows by one each time the partitions
have gone once round the brokers, so that the followers of one broker's partitions spread over the other brokers:

    brokers 0..4, 10 partitions, 3 replicas, start index 0, shift 0:
    p0 -> 0,1,2   p1 -> 1,2,3   ...   p5 -> 0,2,3   p6 -> 1,3,4   ...

With racks on every broker, the same round-robin runs over the brokers alternated by rack (rack1's first broker,
rack2's first, ..., rack1's second, ...), and each further replica skips brokers on racks that already have one of
the partition's replicas (until every rack has one) and brokers that already have one (until every broker has one).

Kafka draws the start index and the shift at random; `assign_replicas` takes them (`start_index`) or draws them from
`rng`. CreatePartitions continues an assignment: `start_partition` is the first new partition's id, and the start
index is the position of the broker that holds partition 0's first replica (AdminZkClient.addPartitions).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidelog.errors import InvalidPartitionsError, InvalidReplicationFactorError


@dataclass(frozen=True, slots=True)
class BrokerPlacement:
    """A live broker as assignment sees it: its id and its rack (None without broker.rack)."""

    broker_id: int
    rack: str | None = None


def assign_replicas(
    brokers: Sequence[BrokerPlacement],
    partitions: int,
    replication_factor: int,
    *,
    start_index: int = -1,
    start_partition: int = -1,
    rng: random.Random | None = None,
) -> dict[int, tuple[int, ...]]:
    """Partition id -> its replicas (the first is the preferred leader). Rack-aware when every broker has a rack,
    otherwise rack-unaware (Kafka refuses a mix with RackAwareMode.Enforced; tidelog places as if no rack were set).
    Raises InvalidPartitionsError or InvalidReplicationFactorError as Kafka does."""
    if partitions <= 0:
        raise InvalidPartitionsError("number of partitions must be larger than 0")
    if replication_factor <= 0:
        raise InvalidReplicationFactorError("replication factor must be larger than 0")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"replication factor: {replication_factor} larger than available brokers: {len(brokers)}"
        )
    ordered = sorted(brokers, key=lambda broker: broker.broker_id)
    draw = rng or random.Random()
    if all(broker.rack is not None for broker in ordered):
        racks = {broker.broker_id: str(broker.rack) for broker in ordered}
        return _rack_aware(partitions, replication_factor, racks, start_index, start_partition, draw)
    return _rack_unaware(
        partitions, replication_factor, [b.broker_id for b in ordered], start_index, start_partition, draw
    )


def _replica_index(first_replica_index: int, second_replica_shift: int, replica_index: int, brokers: int) -> int:
    shift = 1 + (second_replica_shift + replica_index) % (brokers - 1)
    return (first_replica_index + shift) % brokers


def _rack_unaware(
    partitions: int,
    replication_factor: int,
    broker_ids: list[int],
    fixed_start_index: int,
    start_partition: int,
    rng: random.Random,
) -> dict[int, tuple[int, ...]]:
    count = len(broker_ids)
    start_index = fixed_start_index if fixed_start_index >= 0 else rng.randrange(count)
    next_replica_shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(count)
    current = max(0, start_partition)
    result: dict[int, tuple[int, ...]] = {}
    for _ in range(partitions):
        if current > 0 and current % count == 0:
            next_replica_shift += 1
        first = (current + start_index) % count
        replicas = [broker_ids[first]]
        replicas += [
            broker_ids[_replica_index(first, next_replica_shift, j, count)] for j in range(replication_factor - 1)
        ]
        result[current] = tuple(replicas)
        current += 1
    return result


def rack_alternated(racks: Mapping[int, str]) -> list[int]:
    """The brokers alternated by rack: the racks in name order, each rack's brokers in id order, one from each rack
    in turn (Kafka's getRackAlternatedBrokerList)."""
    by_rack: dict[str, list[int]] = {}
    for broker_id, rack in sorted(racks.items()):
        by_rack.setdefault(rack, []).append(broker_id)
    iterators = {rack: iter(ids) for rack, ids in by_rack.items()}
    names = sorted(by_rack)
    result: list[int] = []
    index = 0
    while len(result) < len(racks):
        broker = next(iterators[names[index]], None)
        if broker is not None:
            result.append(broker)
        index = (index + 1) % len(names)
    return result


def _rack_aware(
    partitions: int,
    replication_factor: int,
    racks: Mapping[int, str],
    fixed_start_index: int,
    start_partition: int,
    rng: random.Random,
) -> dict[int, tuple[int, ...]]:
    rack_count = len(set(racks.values()))
    arranged = rack_alternated(racks)
    count = len(arranged)
    start_index = fixed_start_index if fixed_start_index >= 0 else rng.randrange(count)
    next_replica_shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(count)
    current = max(0, start_partition)
    result: dict[int, tuple[int, ...]] = {}
    for _ in range(partitions):
        if current > 0 and current % count == 0:
            next_replica_shift += 1
        first = (current + start_index) % count
        leader = arranged[first]
        replicas = [leader]
        racks_with_replicas = {racks[leader]}
        brokers_with_replicas = {leader}
        k = 0
        for _ in range(replication_factor - 1):
            while True:
                broker = arranged[_replica_index(first, next_replica_shift * rack_count, k, count)]
                rack = racks[broker]
                k += 1
                # skip a broker on a rack that has a replica while some rack has none, and a broker that has one
                # while some broker has none
                if (rack not in racks_with_replicas or len(racks_with_replicas) == rack_count) and (
                    broker not in brokers_with_replicas or len(brokers_with_replicas) == count
                ):
                    replicas.append(broker)
                    racks_with_replicas.add(rack)
                    brokers_with_replicas.add(broker)
                    break
        result[current] = tuple(replicas)
        current += 1
    return result
