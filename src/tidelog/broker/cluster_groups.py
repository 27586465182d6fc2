"""Consumer groups in a cluster: `__consumer_offsets` is a topic of the cluster, and each group's coordinator is the
leader of the group's partition of it (Kafka's GroupMetadataManager in ZooKeeper mode).

- The topic is created the first time a client looks for a coordinator, as Kafka creates it:
  `offsets.topic.num.partitions` partitions, replication factor `min(offsets.topic.replication.factor, live
  brokers)`, compacted (offset_store.py's configs). Meanwhile FindCoordinator answers COORDINATOR_NOT_AVAILABLE and
  the client asks again.
- FindCoordinator answers the leader of partition `abs(hash(group)) % partitions` - the same broker whichever broker
  is asked, as every broker reads the same metadata - or COORDINATOR_NOT_AVAILABLE while that partition has none.
- This broker replays the partitions it comes to lead (`GroupCoordinator.load_partition`) and forgets the groups of
  those it stops leading; requests for a group it does not coordinate are answered NOT_COORDINATOR (the client then
  looks for the coordinator again), COORDINATOR_LOAD_IN_PROGRESS while its partition is being replayed.

Everything here runs on the event loop; the metadata cache's listener (a kazoo thread) only schedules `sync`.
Without replication (the next slice) a new leader's replica of a partition is empty, so a group whose coordinator
fails over starts again without committed offsets (its consumers fall back to `auto.offset.reset`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from tidelog.broker.cluster_metadata import Role, TopicView
from tidelog.broker.offset_store import OFFSETS_TOPIC
from tidelog.codec.group_records import partition_for_group
from tidelog.errors import ErrorCode, TidelogError, TopicExistsError, UnknownTopicOrPartitionError

if TYPE_CHECKING:
    from tidelog.broker.cluster_membership import ClusterMembership
    from tidelog.broker.cluster_metadata import MetadataCache
    from tidelog.broker.cluster_topics import ClusterTopics
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.groups import GroupCoordinator
    from tidelog.broker.handler import Connection
    from tidelog.broker.offset_store import OffsetStore

log = logging.getLogger("tidelog.cluster")

LOAD_RETRY_S = 0.5  # a partition led here before the local replica exists (the admin thread creates it)


class ClusterGroups:
    def __init__(
        self,
        membership: ClusterMembership,
        cache: MetadataCache,
        topics: ClusterTopics,
        store: OffsetStore,
        config: BrokerConfig,
    ) -> None:
        self.membership = membership
        self.cache = cache
        self.topics = topics
        self.store = store
        self.config = config
        self.loaded: set[int] = set()  # partitions of __consumer_offsets whose groups this broker coordinates
        self._coordinator: GroupCoordinator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._creating: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None

    def start(self, coordinator: GroupCoordinator) -> None:
        """Follow the leadership of __consumer_offsets' partitions (on the event loop)."""
        self._coordinator = coordinator
        self._loop = asyncio.get_running_loop()
        self.cache.add_listener(self._changed)
        self.sync()

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        if self._creating is not None:
            self._creating.cancel()

    def _changed(self) -> None:  # a kazoo thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.sync)

    def _offsets_topic(self) -> TopicView | None:
        topic = self.cache.view.topics.get(OFFSETS_TOPIC)
        return topic if topic is not None and topic.topic_id is not None and topic.partitions else None

    def _led(self) -> set[int]:
        return {
            partition
            for (topic, partition), replica in self.cache.view.local.items()
            if topic == OFFSETS_TOPIC and replica.role is Role.LEADER
        }

    def sync(self) -> None:
        """Load the groups of the partitions this broker now leads, forget those of the ones it no longer leads."""
        coordinator = self._coordinator
        if coordinator is None:
            return
        topic = self._offsets_topic()
        led = self._led() if topic is not None else set()
        if topic is not None:
            self.store.partitions = len(topic.partitions)
        for partition in sorted(self.loaded - led):
            self.loaded.discard(partition)
            coordinator.unload_partition(partition)
        waiting = False
        for partition in sorted(led - self.loaded):
            try:
                coordinator.load_partition(partition)
            except UnknownTopicOrPartitionError:
                waiting = True  # the local replica is not created yet
                continue
            except TidelogError as exc:
                log.error("cannot load the groups of %s-%d: %s", OFFSETS_TOPIC, partition, exc)
                waiting = True
                continue
            self.loaded.add(partition)
        if waiting and self._loop is not None and (self._retry is None or self._retry.cancelled()):
            self._retry = self._loop.call_later(LOAD_RETRY_S, self._retry_sync)

    def _retry_sync(self) -> None:
        self._retry = None
        self.sync()

    # --- what the group coordinator asks ----------------------------------------------------------------------

    def error_for(self, group_id: str) -> ErrorCode:
        """NONE if this broker coordinates `group_id`, else NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS."""
        topic = self._offsets_topic()
        if topic is None:
            return ErrorCode.NOT_COORDINATOR
        partition = partition_for_group(group_id, len(topic.partitions))
        if partition in self.loaded:
            return ErrorCode.NONE
        if partition in self._led():
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NOT_COORDINATOR

    def coordinator_for(self, group_id: str, connection: Connection) -> dict[str, Any]:
        """FindCoordinator's node fields and error code for `group_id`, at the address for the client's listener."""
        unavailable: dict[str, Any] = {
            "node_id": -1,
            "host": "",
            "port": -1,
            "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
        }
        topic = self._offsets_topic()
        if topic is None:
            self._create_topic_soon()
            return unavailable
        leader = topic.partitions[partition_for_group(group_id, len(topic.partitions))].leader
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

    # --- creating the topic -----------------------------------------------------------------------------------

    def _create_topic_soon(self) -> None:
        if self._creating is None or self._creating.done():
            self._creating = asyncio.create_task(self._create_topic())

    async def _create_topic(self) -> None:
        factor = min(self.config.offsets_topic_replication_factor, len(self.membership.live_brokers))
        if not self.topics.replicates:  # the RocketMQ engine: one replica, or a whole group (cluster_topics.py)
            factor = min(factor, 1)
        if factor < 1:
            return
        configs = self.store.topic_configs
        try:
            plan = self.topics.plan_topic(
                OFFSETS_TOPIC, self.config.offsets_topic_num_partitions, factor, (), configs, internal=True
            )
            await self.topics.create_topic(plan, configs)
        except TopicExistsError:
            return  # another broker created it meanwhile
        except Exception as exc:  # ZooKeeper unreachable: the next FindCoordinator tries again
            log.warning("cannot create %s: %s", OFFSETS_TOPIC, exc)
            return
        log.info(
            "created %s: %d partitions, replication factor %d",
            OFFSETS_TOPIC, plan.partition_count, len(plan.partitions[0]),
        )  # fmt: skip
