"""Transactions in a cluster: `__transaction_state` is a topic of the cluster, and the coordinator of a transactional
id is the leader of the id's partition of it (Kafka's TransactionStateManager in ZooKeeper mode).

- The topic is created the first time a client looks for a transaction coordinator, as Kafka creates it:
  `transaction.state.log.num.partitions` partitions, replication factor `min(transaction.state.log.replication.factor,
  live brokers)`, `min.insync.replicas` = `min(transaction.state.log.min.isr, replication factor)`, compacted
  (transaction_log.py's configs). Meanwhile FindCoordinator answers COORDINATOR_NOT_AVAILABLE and the client asks
  again.
- FindCoordinator answers the leader of partition `abs(javaHashCode(id)) % partitions` - the same broker whichever
  broker is asked - or COORDINATOR_NOT_AVAILABLE while that partition has none.
- Following the metadata cache (on the loop), this broker has the coordinator replay each partition it comes to
  lead (`TransactionCoordinator.load_partition`) at the coordinator epoch of the partition's leader epoch, which
  the markers it writes carry (a partition's leader refuses markers of an older coordinator epoch): transactions
  found in PrepareCommit or PrepareAbort get their markers again and complete; Ongoing ones stay open. A partition
  it stops leading is unloaded (its transactions in progress stop here), and one led again at a newer epoch is
  loaded again. Requests for ids of partitions led elsewhere answer NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS
  while the partition is replayed.
- A transaction's markers go to the partitions this broker leads directly and to the others through
  txn_marker_channel.py (WriteTxnMarkers to their current leaders, sent again until written).

The metadata cache's listener (a kazoo thread) only schedules `sync` on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from tidelog.broker.cluster_metadata import Role, TopicView
from tidelog.broker.transaction_log import TRANSACTION_STATE_TOPIC
from tidelog.codec.group_records import partition_for_group
from tidelog.errors import ErrorCode, TidelogError, TopicExistsError, UnknownTopicOrPartitionError

if TYPE_CHECKING:
    from tidelog.broker.cluster_membership import ClusterMembership
    from tidelog.broker.cluster_metadata import MetadataCache
    from tidelog.broker.cluster_topics import ClusterTopics
    from tidelog.broker.config import TransactionConfig
    from tidelog.broker.handler import Connection
    from tidelog.broker.transaction_coordinator import TransactionCoordinator
    from tidelog.broker.transaction_log import TransactionLog
    from tidelog.broker.txn_marker_channel import TxnMarkerChannel

log = logging.getLogger("tidelog.cluster")

LOAD_RETRY_S = 0.5  # a partition led here before the local replica exists (the admin thread creates it)


class ClusterTransactions:
    def __init__(
        self,
        membership: ClusterMembership,
        cache: MetadataCache,
        topics: ClusterTopics,
        txn_log: TransactionLog,
        config: TransactionConfig,
        channel: TxnMarkerChannel,
    ) -> None:
        self.membership = membership
        self.cache = cache
        self.topics = topics
        self.log = txn_log
        self.config = config
        self.channel = channel
        self._coordinator: TransactionCoordinator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._creating: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None

    def start(self, coordinator: TransactionCoordinator) -> None:
        """On the loop: place the coordinator's ids on the leaders, follow the leadership of __transaction_state's
        partitions, and start the coordinator's periodic checks."""
        self._coordinator = coordinator
        self._loop = asyncio.get_running_loop()
        coordinator.leads = self.leads
        coordinator.remote_markers = self.channel.send
        coordinator.find_coordinator = self.coordinator_for
        self.cache.add_listener(self._changed)
        self.sync()
        coordinator.start_timers()

    async def close(self) -> None:
        self._coordinator = None
        if self._retry is not None:
            self._retry.cancel()
        if self._creating is not None:
            self._creating.cancel()
        await self.channel.close()

    def _changed(self) -> None:  # a kazoo thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.sync)

    def _topic(self) -> TopicView | None:
        topic = self.cache.view.topics.get(TRANSACTION_STATE_TOPIC)
        return topic if topic is not None and topic.topic_id is not None and topic.partitions else None

    def leads(self, topic: str, partition: int) -> bool:
        replica = self.cache.view.local.get((topic, partition))
        return replica is not None and replica.role is Role.LEADER

    def sync(self) -> None:
        """Load the partitions this broker now leads (again, at a newer leader epoch), unload the others."""
        coordinator = self._coordinator
        if coordinator is None:
            return
        topic = self._topic()
        led: dict[int, int] = {}
        if topic is not None:
            self.log.partitions = len(topic.partitions)
            led = {
                partition: replica.leader_epoch
                for (name, partition), replica in self.cache.view.local.items()
                if name == TRANSACTION_STATE_TOPIC and replica.role is Role.LEADER
            }
        for partition in sorted(coordinator.loaded):
            if coordinator.coordinator_epochs.get(partition) != led.get(partition):
                coordinator.unload_partition(partition)
                log.info("no longer coordinating the transactional ids of %s-%d", TRANSACTION_STATE_TOPIC, partition)
        waiting = False
        for partition, leader_epoch in sorted(led.items()):
            if partition in coordinator.loaded:
                continue
            try:
                coordinator.load_partition(partition, leader_epoch)
            except UnknownTopicOrPartitionError:
                waiting = True  # the local replica is not created yet
            except TidelogError as exc:
                log.error("cannot load the transactions of %s-%d: %s", TRANSACTION_STATE_TOPIC, partition, exc)
                waiting = True
        if waiting and self._loop is not None and (self._retry is None or self._retry.cancelled()):
            self._retry = self._loop.call_later(LOAD_RETRY_S, self._retry_sync)

    def _retry_sync(self) -> None:
        self._retry = None
        self.sync()

    # --- FindCoordinator --------------------------------------------------------------------------------------

    def coordinator_for(self, transactional_id: str, connection: Connection) -> dict[str, Any]:
        """FindCoordinator's node fields and error code for `transactional_id`, at the address for the client's
        listener."""
        unavailable: dict[str, Any] = {
            "node_id": -1,
            "host": "",
            "port": -1,
            "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
        }
        topic = self._topic()
        if topic is None:
            self._create_topic_soon()
            return unavailable
        leader = topic.partitions[partition_for_group(transactional_id, len(topic.partitions))].leader
        if leader == self.membership.broker_id:
            return {
                "node_id": leader,
                "host": connection.advertised_host,
                "port": connection.advertised_port,
                "error_code": ErrorCode.NONE,
            }
        registration = self.membership.live_brokers.get(leader)
        endpoint = registration.endpoint(connection.listener.name) if registration is not None else None
        if endpoint is None:
            return unavailable
        return {"node_id": leader, "host": endpoint.host, "port": endpoint.port, "error_code": ErrorCode.NONE}

    def _create_topic_soon(self) -> None:
        if self._creating is None or self._creating.done():
            self._creating = asyncio.create_task(self._create_topic())

    async def _create_topic(self) -> None:
        factor = min(self.config.transaction_state_log_replication_factor, len(self.membership.live_brokers))
        if not self.topics.replicates:  # the RocketMQ engine: one replica, or a whole group (cluster_topics.py)
            factor = min(factor, 1)
        if factor < 1:
            return
        configs = self.log.topic_configs(factor)
        partitions = self.config.transaction_state_log_num_partitions
        try:
            plan = self.topics.plan_topic(TRANSACTION_STATE_TOPIC, partitions, factor, (), configs, internal=True)
            await self.topics.create_topic(plan, configs)
        except TopicExistsError:
            return  # another broker created it meanwhile
        except Exception as exc:  # ZooKeeper unreachable: the next FindCoordinator tries again
            log.warning("cannot create %s: %s", TRANSACTION_STATE_TOPIC, exc)
            return
        log.info(
            "created %s: %d partitions, replication factor %d",
            TRANSACTION_STATE_TOPIC, partitions, len(plan.partitions[0]),
        )  # fmt: skip
