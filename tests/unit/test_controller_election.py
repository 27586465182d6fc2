"""The controller's choice of each partition's next state (broker/controller.py next_state), as Kafka's
PartitionStateMachine makes it in ZooKeeper mode: the first leader of a new partition, the election from the live
in-sync replicas when the leader dies, an offline partition keeping its last in-sync replica, unclean election, and
a dead follower leaving the ISR."""

from __future__ import annotations

from tidelog.broker.controller import next_state
from tidelog.broker.zk_layout import NO_LEADER, PartitionState


def state(leader: int, epoch: int, isr: tuple[int, ...], controller_epoch: int = 1) -> PartitionState:
    return PartitionState(leader, epoch, isr, controller_epoch)


def test_a_new_partition_is_led_by_its_first_live_replica() -> None:
    assert next_state((2, 3, 1), None, {1, 2, 3}, False, 5) == state(2, 0, (2, 3, 1), 5)
    assert next_state((2, 3, 1), None, {1, 3}, False, 5) == state(3, 0, (3, 1), 5)
    assert next_state((2,), None, {1, 3}, False, 5) is None  # no live replica: it waits


def test_a_healthy_partition_is_left_alone() -> None:
    assert next_state((1, 2, 3), state(1, 4, (1, 2, 3)), {1, 2, 3}, False, 9) is None


def test_a_dead_leader_is_replaced_by_the_first_live_isr_member_in_assignment_order() -> None:
    current = state(1, 4, (1, 3, 2))
    assert next_state((1, 2, 3), current, {2, 3}, False, 9) == state(2, 5, (3, 2), 9)
    assert next_state((1, 2, 3), state(1, 4, (1, 3)), {2, 3}, False, 9) == state(3, 5, (3,), 9)  # 2 is not in sync


def test_a_dead_follower_leaves_the_isr() -> None:
    assert next_state((1, 2, 3), state(1, 4, (1, 2, 3)), {1, 3}, False, 9) == state(1, 5, (1, 3), 9)


def test_without_a_live_isr_member_the_partition_goes_offline_keeping_its_last_one() -> None:
    offline = next_state((1, 2), state(1, 4, (1,)), {2}, False, 9)
    assert offline == state(NO_LEADER, 5, (1,), 9)
    assert next_state((1, 2), offline, {2}, False, 10) is None  # stays as it is
    assert next_state((1, 2, 3), state(2, 4, (2, 1)), {3}, False, 9) == state(NO_LEADER, 5, (2,), 9)


def test_the_last_isr_member_leads_again_when_it_comes_back() -> None:
    offline = state(NO_LEADER, 5, (1,))
    assert next_state((1, 2), offline, {1, 2}, False, 10) == state(1, 6, (1,), 10)


def test_unclean_election_takes_a_live_replica_outside_the_isr() -> None:
    assert next_state((1, 2, 3), state(1, 4, (1,)), {2, 3}, True, 9) == state(2, 5, (2,), 9)
    assert next_state((1, 2, 3), state(NO_LEADER, 5, (1,)), {3}, True, 9) == state(3, 6, (3,), 9)
