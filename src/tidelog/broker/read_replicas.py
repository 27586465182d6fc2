"""KIP-392 reads from RocketMQ slaves: which replica a consumer is sent to for a group partition, and whether this
broker serves consumers a group partition it does not lead.

RocketMQ lets consumers read from a slave when `slaveReadEnable` is true (`tidelog.rocketmq.slaveReadEnable`,
default false); Kafka clients are told where to read by KIP-392's preferred read replica. The contract:

- the selector is Kafka's rack-aware one (`replica.selector.class` =
  `org.apache.kafka.common.replica.RackAwareReplicaSelector`; unset, as in Kafka, means the leader serves every
  read). The master answers a consumer's Fetch (v11+) that names a `rack_id` with `preferred_read_replica` = the
  first live member of the partition's ISR (the group's SyncStateSet) other than itself whose `broker.rack` equals
  the consumer's rack and that serves consumers (its member znode says so: its own `slaveReadEnable`) - only when
  the master's own rack is not the consumer's, the master's `slaveReadEnable` is true, and the partition is on a
  RocketMQ group - and with no records (the consumer fetches again from that replica, as Kafka's leader answers).
  Otherwise the master reads as always (preferred read replica -1);
- a broker whose `slaveReadEnable` is true serves consumers the group partitions it holds without leading them: up
  to its own high watermark, which on a slave is what it has dispatched from the CommitLog its master sent (never
  past what it holds). Without it a consumer's Fetch there is NOT_LEADER_OR_FOLLOWER, as for any partition it does
  not lead; producers are refused either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tidelog.broker import zk_layout as zk
from tidelog.broker.cluster_metadata import MetadataCache
from tidelog.broker.rocketmq_groups import RocketMQGroups

RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


class SlaveReads:
    """What fetch.py asks about reads from a RocketMQ group's slaves (module docstring)."""

    def __init__(
        self,
        cache: MetadataCache,
        groups: RocketMQGroups,
        live_brokers: Callable[[], Mapping[int, zk.BrokerRegistration]],
        *,
        broker_id: int,
        rack: str | None,
        slave_read_enable: bool,
        rack_aware: bool,
    ) -> None:
        self.cache = cache
        self.groups = groups
        self.live_brokers = live_brokers
        self.broker_id = broker_id
        self.rack = rack
        self.slave_read_enable = slave_read_enable
        self.rack_aware = rack_aware

    def serves_consumers(self, topic: str, partition: int) -> bool:
        """Whether this broker serves consumers `topic`-`partition` although it does not lead it."""
        if not self.slave_read_enable or (topic, partition) not in self.cache.view.local:
            return False
        view = self.cache.view.partition(topic, partition)
        return view is not None and self.groups.group_of(view.replicas) is not None

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str) -> int:
        """The replica a consumer in `client_rack` should read `topic`-`partition` from, or -1 (this broker)."""
        if not (self.rack_aware and self.slave_read_enable and client_rack) or client_rack == self.rack:
            return -1
        view = self.cache.view.partition(topic, partition)
        if view is None or view.state is None or view.state.leader != self.broker_id:
            return -1
        group = self.groups.group_of(view.replicas)
        if group is None:
            return -1
        live = self.live_brokers()
        for broker in view.state.isr:
            registration = live.get(broker)
            member = group.members.get(broker)
            if (
                broker != self.broker_id
                and registration is not None
                and registration.rack == client_rack
                and member is not None
                and member.serves_reads
            ):
                return broker
        return -1
