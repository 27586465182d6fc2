"""The pure rules of RocketMQ master/slave groups (broker/rocketmq_groups.py): electing a master from the
SyncStateSet as RocketMQ 5's controller does, and mirroring a group into its partitions' states."""

from __future__ import annotations

import pytest

from tidelog.broker import zk_layout as zk
from tidelog.broker.rocketmq_groups import NO_MASTER, elect_master, group_state, placement

GROUP = zk.RocketMQGroup((1, 2, 3), 1, 4, (1, 2), 9, "SYNC_MASTER", 1000)


def test_a_live_master_stays() -> None:
    assert elect_master(GROUP, {1, 2, 3}, unclean=False) is None


def test_a_dead_master_is_replaced_from_the_sync_state_set_only() -> None:
    new = elect_master(GROUP, {2, 3}, unclean=False)
    assert new == zk.RocketMQGroup((1, 2, 3), 2, 5, (2,), 10, "SYNC_MASTER", -1)
    offline = elect_master(GROUP, {3}, unclean=False)  # 3 is not in sync: no master rather than lost records
    assert offline is not None and offline.master == NO_MASTER and offline.sync_state_set == (1, 2)
    assert offline.master_epoch == 4
    assert elect_master(offline, {3}, unclean=False) is None
    back = elect_master(offline, {1, 3}, unclean=False)  # a member of the set returns: it leads
    assert back is not None and back.master == 1 and back.master_epoch == 5


def test_unclean_election_takes_any_live_member() -> None:
    new = elect_master(GROUP, {3}, unclean=True)
    assert new is not None and new.master == 3 and new.sync_state_set == (3,)


def test_a_group_that_never_had_a_master_waits_for_its_first_master() -> None:
    fresh = zk.RocketMQGroup((2,), NO_MASTER, 0, (), 1, "SYNC_MASTER")
    assert elect_master(fresh, {2}, unclean=True) is None


def test_partition_state_mirrors_the_group() -> None:
    assert group_state(GROUP, {1, 2}, 7) == zk.PartitionState(1, 4, (1, 2), 7)
    assert group_state(GROUP, {2}, 7).leader == zk.NO_LEADER
    assert placement(zk.RocketMQGroup((1, 2, 3), 2, 5, (2,), 10, "SYNC_MASTER")) == (2, 1, 3)


def test_group_znode_round_trip() -> None:
    assert zk.RocketMQGroup.decode("g", GROUP.encode()) == GROUP
    member = zk.RocketMQMember("127.0.0.1:10912", None)
    assert zk.RocketMQMember.decode("/x", member.encode()) == member
    slave = zk.RocketMQMember(None, "127.0.0.1:50000", 4096, 1_700_000_000_000, serves_reads=True)
    assert zk.RocketMQMember.decode("/x", slave.encode()) == slave
    with pytest.raises(zk.MalformedZnodeError, match="serves_reads"):
        zk.RocketMQMember.decode("/x", b'{"version": 1, "serves_reads": "yes"}')
