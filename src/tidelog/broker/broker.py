"""The broker's composition root: it opens the engine, builds every part with exactly the collaborators it uses,
builds the one handler table, and starts and stops the parts in order. No part holds a pointer back to the broker.

    engine (storage/api.py)          the partitions; data calls on the loop, topic calls on the admin thread
    admin (admin.py)                 the thread topic changes run on
    authorizer (authorizer.py)       ACL checks every handler makes
    metrics (metrics.py)             counters handlers bump, the state gauges, the /metrics endpoint
    flusher (produce.py)             group commit of fsyncs for acks=all produces and offset commits
    fetch, produce, topics, configs, groups, consumer_groups, sasl, acls    the handlers of one area each
    dynamic (dynamic_config.py)      dynamic broker configs: stored, watched in a cluster, applied to the engine
    quotas (quotas.py)               client quotas enforced: produce, fetch and the server's request-time records
    quota_store (quota_store.py)     where quotas are kept: a file, or the znodes and their change notifications
    quota_apis (quota_admin.py)      DescribeClientQuotas, AlterClientQuotas
    scram_credentials (scram_admin.py)  Describe/AlterUserScramCredentials over the users file `tidelog users` edits
    log_dirs, producer_states, describe_cluster   DescribeLogDirs (log_dirs.py), DescribeProducers
                                     (producer_admin.py), DescribeCluster (cluster_describe.py, Metadata's brokers)
    offset_store (offset_store.py)   __consumer_offsets, which the group coordinator writes and replays
    transactions (transaction_coordinator.py)  the transaction coordinator over __transaction_state
                                     (transaction_log.py): InitProducerId (the producer-id allocator), AddPartitions-
                                     and AddOffsetsToTxn, EndTxn, Describe/ListTransactions, FindCoordinator's
                                     TRANSACTION answer (through groups); its markers written by
    txn_markers (txn_markers.py)     WriteTxnMarkers: the control batches of a transaction's partitions, which also
                                     end the pending TxnOffsetCommit offsets of the group coordinator
    verification (txn_verification.py)  produce's transactional batches checked with the coordinator (KIP-890):
                                     the local one, or in a cluster AddPartitionsToTxn v4 verify_only to another
    server (server.py)               listeners, framing, routing through the table, sending

With zookeeper.connect, a broker of a cluster (docs/cluster.md) also has:

    cluster (cluster_membership.py)  its ZooKeeper session, registration, the live brokers, the controller election
    metadata (cluster_metadata.py)   the cluster's topics, leaders and ISRs from ZooKeeper watches; the local replicas
                                     kept in step through the engine's topic calls on the admin thread; the leader
                                     check produce, fetch and DeleteRecords make
    controller (controller.py)       acts on the broker elected controller: leaders, ISRs, topic deletion,
                                     controlled shutdowns, preferred-leader elections and the auto rebalance
    leadership (leadership.py)       ControlledShutdown and ElectLeaders, handed to the controller's thread (or
                                     forwarded to the controller broker); the stopping broker's controlled shutdown
    reassignment (reassignment.py)   AlterPartitionReassignments (handed or forwarded to the controller, like
                                     ElectLeaders) and ListPartitionReassignments (from `metadata`)
    cluster_topics (cluster_topics.py)  CreateTopics, DeleteTopics, CreatePartitions written to ZooKeeper
    cluster_groups (cluster_groups.py)  __consumer_offsets as a cluster topic: each group's coordinator is the
                                     leader of its partition, whose groups it loads when it comes to lead it
    cluster_transactions (cluster_transactions.py)  the same for __transaction_state and transactional ids; the
                                     markers of partitions led elsewhere sent by txn_marker_channel.py
    replicas (replica_manager.py)    the leader's side of replication: followers' progress, the high watermark,
                                     the ISR, acks=all; it follows `metadata`'s views and stamps leader epochs
    fetchers (replica_fetcher.py)    the follower's side: one connection per leader broker copying its logs
    rocketmq_groups (rocketmq_groups.py)  with the RocketMQ engine's master/slave replication (haEnable): the
                                     broker's group in ZooKeeper, its role, the SyncStateSet; the controller elects
                                     masters, topics are placed on groups, acks=all waits for a SYNC_MASTER's slave

The engine of a cluster broker is opened `replicated`: its high watermark is the replica manager's to move.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from tidelog.broker.admin import AdminExecutor
from tidelog.broker.authorizer import AclApis, Authorizer
from tidelog.broker.cluster_describe import DescribeClusterApis
from tidelog.broker.cluster_groups import ClusterGroups
from tidelog.broker.cluster_membership import ClusterMembership
from tidelog.broker.cluster_metadata import MetadataCache
from tidelog.broker.cluster_producer_ids import ZooKeeperProducerIdBlocks
from tidelog.broker.cluster_topics import ClusterTopics
from tidelog.broker.cluster_transactions import ClusterTransactions
from tidelog.broker.config import BrokerConfig
from tidelog.broker.config_admin import ConfigApis
from tidelog.broker.consumer_groups import ConsumerGroupCoordinator
from tidelog.broker.controller import Controller
from tidelog.broker.dynamic_config import DynamicBrokerConfig, FileStore
from tidelog.broker.fetch import FetchApis
from tidelog.broker.fetch_sessions import FetchSessionCache
from tidelog.broker.groups import GroupCoordinator
from tidelog.broker.handler import HandlerTable
from tidelog.broker.leadership import LeadershipApis
from tidelog.broker.log_dirs import LogDirApis
from tidelog.broker.metrics import Metrics
from tidelog.broker.offset_store import OffsetStore
from tidelog.broker.produce import FileProducerIdBlocks, Flusher, ProduceApis, ProducerIdAllocator
from tidelog.broker.producer_admin import ProducerApis
from tidelog.broker.quota_admin import QuotaApis
from tidelog.broker.quota_store import FileQuotaStore, ZooKeeperQuotaStore
from tidelog.broker.quotas import ClientQuotaManager
from tidelog.broker.read_replicas import RACK_AWARE_SELECTOR, SlaveReads
from tidelog.broker.reassignment import ReassignmentApis
from tidelog.broker.replica_fetcher import ReplicaFetchers
from tidelog.broker.replica_manager import ReplicaManager
from tidelog.broker.rocketmq_groups import CommitLogReplication, RocketMQGroups
from tidelog.broker.sasl import SaslApis
from tidelog.broker.scram_admin import ScramCredentialApis
from tidelog.broker.server import KafkaServer
from tidelog.broker.topics import TopicApis
from tidelog.broker.transaction_coordinator import TransactionCoordinator
from tidelog.broker.transaction_log import TransactionLog
from tidelog.broker.txn_marker_channel import TxnMarkerChannel
from tidelog.broker.txn_markers import TxnMarkerApis
from tidelog.broker.txn_verification import CoordinatorChannel, TransactionVerifier
from tidelog.storage import open_engine

log = logging.getLogger("tidelog.broker")


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.stop_started = False
        self.stopping = False  # what handlers see: long polls and rebalances end early
        self.cluster = _cluster_membership(config)  # None: a single broker, no ZooKeeper
        cluster_id = self.cluster.connect() if self.cluster is not None else None
        engine_config = replace(config.engine, replicated=True) if self.cluster is not None else config.engine
        try:
            self.engine = open_engine(engine_config, cluster_id=cluster_id)
        except BaseException:
            if self.cluster is not None:
                self.cluster.close()
            raise
        log_dir = Path(config.engine.log_dirs[0]).resolve()  # where the broker keeps its own files
        self.admin = AdminExecutor()
        self.metrics = Metrics()
        self.authorizer = Authorizer(config.security, log_dir)
        self.flusher = Flusher()
        self.quotas = ClientQuotaManager(config.quotas)
        self.quota_store = FileQuotaStore(log_dir) if self.cluster is None else ZooKeeperQuotaStore(self.cluster.client)
        self.metadata: MetadataCache | None = None
        self.controller: Controller | None = None
        cluster_topics: ClusterTopics | None = None
        check_leader = None
        self.rocketmq_groups: RocketMQGroups | None = None
        store = self.engine.master_slave()
        if self.cluster is not None and store is not None:
            membership = self.cluster
            rocketmq = config.engine.rocketmq
            self.rocketmq_groups = RocketMQGroups(
                self.cluster.client,
                config.node_id,
                rocketmq.broker_name,
                store,
                configured_role=rocketmq.broker_role,
                housekeeping_interval_ms=rocketmq.ha_housekeeping_interval,
                slave_fallbehind_max=rocketmq.ha_slave_fallbehind_max,
                live_brokers=lambda: membership.live_brokers.keys(),
                log_dir=log_dir,
                serves_reads=rocketmq.slave_read_enable,
            )
        if self.cluster is not None:
            self.metadata = MetadataCache(self.cluster.client, config.node_id, self.engine, self.admin)
            self.controller = Controller(
                self.cluster,
                self.metadata,
                config.engine.log_defaults,
                delete_topic_enable=config.delete_topic_enable,
                leadership=config.leadership,
                groups=self.rocketmq_groups,
            )
            cluster_topics = ClusterTopics(self.cluster, self.metadata, config, groups=self.rocketmq_groups)
            check_leader = self.metadata.check_leader
        slave_reads: SlaveReads | None = None
        if self.cluster is not None and self.metadata is not None and self.rocketmq_groups is not None:
            cluster = self.cluster
            slave_reads = SlaveReads(
                self.metadata,
                self.rocketmq_groups,
                lambda: cluster.live_brokers,
                broker_id=config.node_id,
                rack=config.broker_rack,
                slave_read_enable=config.engine.rocketmq.slave_read_enable,
                rack_aware=config.replica_selector_class == RACK_AWARE_SELECTOR,
            )
        self.fetch = FetchApis(
            self.engine,
            self.authorizer,
            self.metrics,
            self.is_stopping,
            check_leader,
            log_defaults=config.engine.log_defaults,
            quotas=self.quotas,
            cluster=cluster_topics,
            sessions=FetchSessionCache(config.max_incremental_fetch_session_cache_slots),
            read_replicas=slave_reads,
        )
        self.replicas: ReplicaManager | None = None
        self.fetchers: ReplicaFetchers | None = None
        if self.cluster is not None and self.metadata is not None:
            membership = self.cluster
            self.fetchers = ReplicaFetchers(
                config.node_id,
                self.engine,
                lambda: membership.live_brokers,
                config.inter_broker_listener.name,
                config.replication,
            )
            self.replicas = ReplicaManager(
                config.node_id,
                self.engine,
                self.metadata,
                self.cluster.client,
                self.fetchers,
                self.fetch.notifier,
                config.engine.log_defaults,
                config.replication.replica_lag_time_max_ms,
                commitlog_replication=CommitLogReplication(store, self.rocketmq_groups.waits)
                if store is not None and self.rocketmq_groups is not None
                else None,
            )
            self.fetch.record_follower_fetch = self.replicas.record_follower_fetch
        self.produce = ProduceApis(
            self.engine,
            self.authorizer,
            self.metrics,
            self.flusher,
            self.fetch.notifier,
            check_leader,
            self.replicas,
            self.quotas,
        )
        self.offset_store = OffsetStore(
            self.engine,
            config.offsets_topic_num_partitions,
            config.offsets_topic_segment_bytes,
            self.flusher,
            engine_compacts=self.engine.compacts_topics,
            replication=self.replicas,
        )
        self.cluster_groups: ClusterGroups | None = None
        if self.cluster is not None and self.metadata is not None and cluster_topics is not None:
            self.cluster_groups = ClusterGroups(self.cluster, self.metadata, cluster_topics, self.offset_store, config)
        self.consumer_groups = ConsumerGroupCoordinator(
            config.consumer_groups,
            self.authorizer,
            self.offset_store,
            self._topic_lookup,
            self.is_stopping,
            self.cluster_groups,
        )
        self.groups = GroupCoordinator(
            config,
            self.engine,
            self.authorizer,
            self.offset_store,
            self.is_stopping,
            self.consumer_groups,
            self.metadata.partition_exists if self.metadata is not None else None,
            self.cluster_groups,
        )
        self.txn_markers = TxnMarkerApis(
            self.engine, self.authorizer, self.flusher, self.fetch.notifier, check_leader, self.replicas
        )
        txn_log = TransactionLog(
            self.engine, config.transactions, self.flusher, self.admin, self.replicas, check_leader
        )
        self.transactions = TransactionCoordinator(
            config.transactions,
            config.node_id,
            txn_log,
            ProducerIdAllocator(
                ZooKeeperProducerIdBlocks(self.cluster.client, config.node_id).next_block
                if self.cluster is not None
                else FileProducerIdBlocks(log_dir).next_block
            ),
            self.authorizer,
            self.txn_markers,
            self.metadata.partition_exists if self.metadata is not None else self._local_partition_exists,
            lambda: self.offset_store.partitions,
        )
        self.cluster_transactions: ClusterTransactions | None = None
        if self.cluster is not None and self.metadata is not None and cluster_topics is not None:
            membership = self.cluster
            self.cluster_transactions = ClusterTransactions(
                self.cluster,
                self.metadata,
                cluster_topics,
                txn_log,
                config.transactions,
                TxnMarkerChannel(
                    config.node_id,
                    self.metadata,
                    lambda: membership.live_brokers,
                    config.inter_broker_listener.name,
                    self.txn_markers,
                ),
            )
        self.groups.transactions = self.transactions
        self.txn_markers.on_offsets_marker = self.groups.complete_transaction
        self.verification = TransactionVerifier(
            self.engine,
            self.transactions.verify_partition,
            enabled=config.transactions.transaction_partition_verification_enable,
        )
        if self.cluster is not None and self.metadata is not None:
            membership = self.cluster
            self.verification.coordinators = CoordinatorChannel(
                config.node_id, self.metadata, lambda: membership.live_brokers, config.inter_broker_listener.name
            )
        self.produce.verification = self.verification
        self.txn_markers.on_marker = self.verification.marker_written
        if self.metadata is not None:  # a topic deleted from the cluster takes its committed offsets along
            self.metadata.on_topic_deleted = self.groups.forget_topic
        self.topics = TopicApis(
            self.engine, config, self.authorizer, self.admin, self.groups.forget_topic, cluster_topics
        )
        self.dynamic = DynamicBrokerConfig(
            config,
            self.engine,
            self.admin,
            store=FileStore(log_dir) if self.cluster is None else None,
            client=self.cluster.client if self.cluster is not None else None,
        )
        self.dynamic.listeners.extend(
            lambda defaults, part=part: setattr(part, "log_defaults", defaults)  # type: ignore[misc]
            for part in (self.controller, self.replicas)
            if part is not None
        )
        self.configs = ConfigApis(self.engine, config, self.authorizer, self.admin, self.dynamic, cluster_topics)
        self.sasl = SaslApis(config.security, config.listeners, log_dir)
        self.acls = AclApis(self.authorizer)
        self.quota_apis = QuotaApis(self.quotas, self.quota_store, self.authorizer, self.admin)
        self.scram_credentials = ScramCredentialApis(self.sasl.users, self.authorizer, self.admin)
        self.log_dirs = LogDirApis(self.engine, self.authorizer)
        self.producer_states = ProducerApis(self.engine, self.authorizer, check_leader)
        self.describe_cluster = DescribeClusterApis(self.engine, self.topics, self.authorizer)
        self.leadership: LeadershipApis | None = None
        self.reassignment: ReassignmentApis | None = None
        if self.cluster is not None and self.metadata is not None and self.controller is not None:
            self.leadership = LeadershipApis(config, self.authorizer, self.cluster, self.metadata, self.controller)
            self.reassignment = ReassignmentApis(
                config,
                self.authorizer,
                self.cluster,
                self.metadata,
                self.controller,
                replicates=cluster_topics is not None and cluster_topics.replicates,
            )
        self.server = KafkaServer(config, self._handler_table(), self.metrics, self.quotas)
        self.metrics.expect_apis(self.server.handlers)
        self.metrics.watch(self.engine.partitions, lambda: len(self.groups.groups), lambda: self.connection_count)

    def _handler_table(self) -> HandlerTable:
        """Every API the broker serves (ApiVersions aside, which the server answers from this table)."""
        table: HandlerTable = {}
        areas: list[Any] = [
            self.fetch,
            self.produce,
            self.topics,
            self.configs,
            self.groups,
            self.consumer_groups,
            self.sasl,
            self.acls,
            self.quota_apis,
            self.scram_credentials,
            self.log_dirs,
            self.producer_states,
            self.describe_cluster,
            self.transactions,
            self.txn_markers,
        ]
        if self.leadership is not None:
            areas.append(self.leadership)
        if self.reassignment is not None:
            areas.append(self.reassignment)
        for area in areas:
            handlers = area.handlers()
            clash = table.keys() & handlers.keys()
            assert not clash, f"API keys served twice: {sorted(clash)}"
            table.update(handlers)
        return table

    def _ha_host(self) -> str:
        """Where the other brokers reach this one's HA port: haListenHost, or the inter-broker listener's host."""
        host = self.config.engine.rocketmq.ha_listen_host
        if host not in ("0.0.0.0", "::", ""):
            return host
        listener = self.config.inter_broker_listener
        return self.config.advertised_for(listener, listener.port)[0]

    def _topic_lookup(self) -> dict[str, tuple[str, int]]:
        """The topics consumer groups may subscribe to: name -> (topic id, partition count); the cluster's in a
        cluster (this broker may hold no replica of them)."""
        if self.metadata is not None:
            return {
                name: (topic.topic_id, len(topic.partitions))
                for name, topic in self.metadata.view.topics.items()
                if topic.topic_id is not None
            }
        return {name: (d.topic_id, d.partitions) for name, d in self.engine.topics().items()}

    def _local_partition_exists(self, topic: str, partition: int) -> bool:
        description = self.engine.topics().get(topic)
        return description is not None and 0 <= partition < description.partitions

    def is_stopping(self) -> bool:
        return self.stopping

    @property
    def connection_count(self) -> int:
        return self.server.connection_count

    @property
    def bound_ports(self) -> list[int]:
        return self.server.bound_ports

    async def start(self) -> None:
        self.dynamic.load()  # the stored dynamic broker configs, applied before anything is served
        if isinstance(self.quota_store, ZooKeeperQuotaStore):  # the client quotas, followed in a cluster
            self.quota_store.follow(self.quotas.set_entity, self.quotas.replace_all)
        else:
            self.quotas.replace_all(self.quota_store.load())
        if self.cluster is None:
            self.offset_store.open()  # in a cluster, the partitions this broker leads are loaded as it comes to
        self.groups.start()
        if self.cluster is None:
            self.transactions.start()  # in a cluster: the partitions of __transaction_state this broker comes to lead
        self.metrics.serve(self.config.metrics_host, self.config.metrics_port)
        if self.metadata is not None and self.controller is not None and self.cluster_groups is not None:
            await self.metadata.start()  # the cluster's topics, and this broker's replicas of them
            if self.replicas is not None:
                self.replicas.start()  # leads and follows what the views say from now on
            self.controller.start()  # before the registration, which runs the election
            self.cluster_groups.start(self.groups)
            if self.cluster_transactions is not None:
                self.cluster_transactions.start(self.transactions)
        await self.server.start()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.register, self.server.endpoints())
        if self.rocketmq_groups is not None:  # after the topics were created here, before a slave follows
            await asyncio.to_thread(self.rocketmq_groups.start, self._ha_host())

    async def stop(self) -> None:
        """In a cluster, first a controlled shutdown (controlled.shutdown.enable): the controller moves this
        broker's leadership away while it still serves everything (followers keep fetching from it until their
        leadership moved). Then stop accepting, wake long polls and parked rebalances, finish in-flight requests,
        close connections, then flush and close the engine (which writes the clean-shutdown marker)."""
        if self.stop_started:
            return
        self.stop_started = True
        if (
            self.leadership is not None
            and self.cluster is not None
            and self.cluster.broker_epoch >= 0  # registered: start() went that far
            and self.config.leadership.controlled_shutdown_enable
        ):
            await self.leadership.shut_down_controlled()
        self.stopping = True
        if self.controller is not None:
            await asyncio.to_thread(self.controller.close)
        if self.rocketmq_groups is not None:
            await asyncio.to_thread(self.rocketmq_groups.close)
        if self.cluster_groups is not None:
            self.cluster_groups.close()
        if self.metadata is not None:
            self.metadata.close()
        if self.fetchers is not None:
            await self.fetchers.close()
        if self.replicas is not None:
            await self.replicas.close()
        if self.cluster is not None:  # the others elect a new controller now, not after the session timeout
            await asyncio.to_thread(self.cluster.resign)
        self.server.stop_accepting()
        self.fetch.wake_all()
        await self.transactions.stop()
        if self.cluster_transactions is not None:
            await self.cluster_transactions.close()
        await self.verification.close()  # produces waiting for a coordinator answer NOT_ENOUGH_REPLICAS
        await self.groups.stop()  # answers joins and syncs parked in a rebalance, which would hold their connection
        await self.server.close_connections(self.config.shutdown_timeout_ms / 1000)
        self.metrics.close()
        await self.flusher.drain()
        await asyncio.to_thread(self.admin.close)
        await asyncio.to_thread(self.engine.close)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.close)
        log.info("stopped cleanly")


def _cluster_membership(config: BrokerConfig) -> ClusterMembership | None:
    if config.zookeeper_connect is None:
        return None
    return ClusterMembership(
        config.zookeeper_connect,
        config.node_id,
        session_timeout_ms=config.zookeeper_session_timeout_ms,
        connection_timeout_ms=config.zookeeper_connection_timeout_ms or config.zookeeper_session_timeout_ms,
        rack=config.broker_rack,
    )
