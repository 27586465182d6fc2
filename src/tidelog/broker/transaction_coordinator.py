"""The transaction coordinator (KIP-98, Kafka 3.9's TransactionCoordinator): InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, DescribeTransactions, ListTransactions, and FindCoordinator's answer for key type
TRANSACTION (which groups.py routes here).

A transactional id's state (transaction_state.py) lives in `__transaction_state` (transaction_log.py); the broker
leading the id's partition coordinates it. What the coordinator does, as Kafka does:

- InitProducerId with a transactional id: `transaction.timeout.ms` must be within 1 ..
  `transaction.max.timeout.ms` (INVALID_TRANSACTION_TIMEOUT). A new id gets a producer id at epoch 0; a known one
  a bumped epoch, which fences the producer before it (its requests get PRODUCER_FENCED from then on, or
  INVALID_PRODUCER_EPOCH in the old versions that lack it); a producer naming its own id and epoch (KIP-360, v3+)
  is answered idempotently. When the epoch would run out the id moves to a new producer id. If the previous
  producer's transaction is still open it is aborted first under the bumped epoch, and the caller is answered
  CONCURRENT_TRANSACTIONS until the markers are written (it retries). Without a transactional id: an idempotent
  producer's id (IDEMPOTENT_WRITE on the cluster, or WRITE on some topic) or its epoch bump (KIP-360).
- AddPartitionsToTxn (v0-v3 from producers; v4's batches from brokers, where `verify_only` checks that each
  partition is already in the transaction: INVALID_TXN_STATE when not) and AddOffsetsToTxn (the group's
  `__consumer_offsets` partition) move the transaction to Ongoing once the new state is durable. An unknown topic
  or partition answers UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED; nothing is added.
- EndTxn writes PrepareCommit or PrepareAbort and answers; then markers go to every partition of the transaction
  (txn_markers.py for those this broker leads; in a cluster txn_marker_channel.py sends WriteTxnMarkers to the
  leaders of the others), sent again after a retriable error until written (the partitions of a deleted topic are
  dropped), then CompleteCommit or CompleteAbort is written. Until then the transactional id's requests answer
  CONCURRENT_TRANSACTIONS. EndTxn repeated after the transaction completed with the same result answers NONE; the
  other result, or EndTxn without an open transaction, INVALID_TXN_STATE.
- The wrong producer id answers INVALID_PRODUCER_ID_MAPPING, an older epoch PRODUCER_FENCED (INVALID_PRODUCER_EPOCH
  to AddPartitionsToTxn v0-v1, AddOffsetsToTxn v0-v1 and EndTxn v0-v1, which predate the code).
- Every `transaction.abort.timed.out.transaction.cleanup.interval.ms` the transactions open longer than their
  timeout are aborted, with the epoch bumped so their producer is fenced (Kafka's KIP-588 behaviour).
  Every `transaction.remove.expired.transaction.cleanup.interval.ms` an id with no open transaction and untouched for
  `transactional.id.expiration.ms` is forgotten (a tombstone).
- On start (a single broker), or when this broker comes to lead a partition of `__transaction_state` (a cluster),
  the partition is replayed; a transaction found in PrepareCommit or PrepareAbort gets its markers and completes.
  While a partition loads its ids answer COORDINATOR_LOAD_IN_PROGRESS; ids of partitions led elsewhere
  NOT_COORDINATOR. In a cluster, cluster_transactions.py places the ids and sets the hooks (`leads`,
  `remote_markers`, `find_coordinator`) and the coordinator epoch of a loaded partition is its leader epoch.

Everything runs on the event loop; a state change is prepared (the id is then busy), written, and completed or
cancelled, so concurrent requests for one id never interleave their writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.broker.offset_store import OFFSETS_TOPIC
from tidelog.broker.transaction_log import TRANSACTION_STATE_TOPIC, TransactionLog
from tidelog.broker.transaction_state import (
    NO_PRODUCER_EPOCH,
    TopicPartition,
    TransactionMetadata,
    Transit,
    TxnState,
)
from tidelog.codec.group_records import partition_for_group
from tidelog.errors import ErrorCode, TidelogError
from tidelog.protocol.messages import ApiKey, Request, millis

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.config import TransactionConfig
    from tidelog.broker.produce import ProducerIdAllocator
    from tidelog.broker.txn_markers import TxnMarkerApis

log = logging.getLogger("tidelog.broker")

NONE = ErrorCode.NONE
MARKER_RETRY_S = 0.5  # a marker refused for a retriable reason (leader moving) is sent again after this
NO_NODE: dict[str, Any] = {"node_id": -1, "host": "", "port": -1}

# (topic, partition) -> whether it exists (the cluster's view in a cluster)
PartitionExists = Callable[[str, int], bool]
# one transaction's markers to the partitions led elsewhere: (producer id, epoch, coordinator epoch, commit,
# partitions) -> the error code of each partition
RemoteMarkers = Callable[[int, int, int, bool, list[TopicPartition]], Awaitable[dict[TopicPartition, ErrorCode]]]

# errors after which a marker is sent again (Kafka's TransactionMarkerRequestCompletionHandler; an unknown partition
# too: a leader that does not know it yet); any other drops the partition from the transaction (a fenced epoch).
# A partition whose topic is gone is dropped before sending, as Kafka's marker channel drops it.
_RETRY_MARKER = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    }
)


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionCoordinator:
    def __init__(
        self,
        config: TransactionConfig,
        node_id: int,
        txn_log: TransactionLog,
        producer_ids: ProducerIdAllocator,
        authorizer: Authorizer,
        markers: TxnMarkerApis,
        partition_exists: PartitionExists,
        offsets_partitions: Callable[[], int],
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.log = txn_log
        self.producer_ids = producer_ids
        self.authorizer = authorizer
        self.markers = markers
        self.partition_exists = partition_exists
        self.offsets_partitions = offsets_partitions  # __consumer_offsets' partition count (AddOffsetsToTxn)
        self.transactions: dict[str, TransactionMetadata] = {}
        self.loaded: set[int] = set()  # partitions of __transaction_state whose ids this broker coordinates
        self.loading: set[int] = set()
        self.coordinator_epochs: dict[int, int] = {}
        # a cluster's: which broker leads which partition; partitions led elsewhere get their markers through it
        self.leads: Callable[[str, int], bool] = lambda _topic, _partition: True
        self.remote_markers: RemoteMarkers | None = None
        self.find_coordinator: Callable[[str, Connection], dict[str, Any]] | None = None  # a cluster's placement
        self._tasks: set[asyncio.Task[None]] = set()

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.INIT_PRODUCER_ID: ApiHandler(0, 5, self.handle_init_producer_id),
            ApiKey.ADD_PARTITIONS_TO_TXN: ApiHandler(0, 4, self.handle_add_partitions_to_txn),
            ApiKey.ADD_OFFSETS_TO_TXN: ApiHandler(0, 4, self.handle_add_offsets_to_txn),
            ApiKey.END_TXN: ApiHandler(0, 4, self.handle_end_txn),
            ApiKey.DESCRIBE_TRANSACTIONS: ApiHandler(0, 0, self.handle_describe_transactions),
            ApiKey.LIST_TRANSACTIONS: ApiHandler(0, 1, self.handle_list_transactions),
        }

    # --- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """A single broker: load every partition (none to replay before the topic's first write), start the periodic
        checks."""
        if self.log.open():
            for partition in range(self.log.partitions):
                self.load_partition(partition)
        else:
            self.loaded.update(range(self.log.partitions))
            self.coordinator_epochs.update(dict.fromkeys(range(self.log.partitions), 0))
        self.start_timers()

    def start_timers(self) -> None:
        self._spawn(self._abort_timed_out_periodically())
        self._spawn(self._expire_ids_periodically())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coroutine: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("transaction coordinator task failed: %r", exc, exc_info=exc)

    def load_partition(self, partition: int, coordinator_epoch: int | None = None) -> None:
        """This broker coordinates the ids of `partition` (in a cluster: as its leader at `coordinator_epoch`, the
        partition's leader epoch): replay it, then complete the transactions it left in PrepareCommit or
        PrepareAbort."""
        started = time.monotonic()
        self.loading.add(partition)
        try:
            loaded = self.log.load_partition(partition)
            self.coordinator_epochs[partition] = (
                self.log.coordinator_epoch(partition) if coordinator_epoch is None else coordinator_epoch
            )
        finally:
            self.loading.discard(partition)
        self.transactions.update(loaded)
        self.loaded.add(partition)
        resumed = 0
        for metadata in loaded.values():
            if metadata.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                resumed += 1
                self._spawn(self._complete(metadata))
        if loaded:
            log.info(
                "coordinating %d transactional id(s) of %s-%d at coordinator epoch %d (%d transaction(s) to "
                "complete) in %.2f s",
                len(loaded),
                TRANSACTION_STATE_TOPIC,
                partition,
                self.coordinator_epochs[partition],
                resumed,
                time.monotonic() - started,
            )

    def unload_partition(self, partition: int) -> None:
        """Another broker coordinates the ids of `partition` now: forget them (their transactions in progress stop
        here; the new coordinator completes them)."""
        self.loaded.discard(partition)
        self.coordinator_epochs.pop(partition, None)
        for transactional_id in [t for t in self.transactions if self.log.partition_of(t) == partition]:
            del self.transactions[transactional_id]

    def _error_for(self, transactional_id: str) -> ErrorCode:
        partition = self.log.partition_of(transactional_id)
        if partition in self.loaded:
            return NONE
        if partition in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NOT_COORDINATOR

    def coordinator_for(self, transactional_id: str, connection: Connection) -> dict[str, Any]:
        """FindCoordinator's answer for key type TRANSACTION (without error_message)."""
        if not self.authorizer.authorize(
            connection, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id
        ):
            return {**NO_NODE, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
        if self.find_coordinator is not None:
            return self.find_coordinator(transactional_id, connection)
        node = {"node_id": self.node_id, "host": connection.advertised_host, "port": connection.advertised_port}
        return {**node, "error_code": NONE}

    # --- writing a state change -------------------------------------------------------------------------------

    async def _write(self, metadata: TransactionMetadata, transit: Transit) -> ErrorCode:
        """Make the prepared `transit` durable and the state; on failure cancel it and answer the error."""
        if self.transactions.get(metadata.transactional_id) is not metadata:  # unloaded (and maybe loaded again)
            metadata.cancel()
            return ErrorCode.NOT_COORDINATOR
        try:
            await self.log.write(metadata.transactional_id, transit.log_value())
        except TidelogError as exc:
            metadata.cancel()
            log.warning("writing the state of transactional id %r failed: %s", metadata.transactional_id, exc)
            code = ErrorCode(exc.kafka_error_code)
            return (
                code
                if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE)
                else (ErrorCode.COORDINATOR_NOT_AVAILABLE)
            )
        if self.transactions.get(metadata.transactional_id) is not metadata:  # unloaded meanwhile
            return ErrorCode.NOT_COORDINATOR
        metadata.complete(transit)
        return NONE

    # --- InitProducerId ---------------------------------------------------------------------------------------

    async def handle_init_producer_id(self, request: Request, connection: Connection) -> Response:
        body = request.body
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "producer_id": -1, "producer_epoch": -1}
        if body.transactional_id is None:
            return await self._init_idempotent(body, connection, answer)
        transactional_id: str = body.transactional_id
        expected_id = getattr(body, "producer_id", -1)
        expected_epoch = getattr(body, "producer_epoch", -1)
        code, producer_id, epoch = await self._init_transactional(
            transactional_id,
            millis(body.transaction_timeout),
            (expected_id, expected_epoch) if expected_id >= 0 else None,
            connection,
        )
        if code == ErrorCode.PRODUCER_FENCED and request.api_version < 4:
            code = ErrorCode.INVALID_PRODUCER_EPOCH  # v4 brought PRODUCER_FENCED
        answer.update(error_code=code, producer_id=producer_id, producer_epoch=epoch)
        return answer

    async def _init_idempotent(self, body: Any, connection: Connection, answer: dict[str, Any]) -> dict[str, Any]:
        authorizer = self.authorizer
        if not authorizer.authorize(
            connection, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, log_denied=False
        ) and not authorizer.authorize_any(connection, Operation.WRITE, ResourceType.TOPIC):
            answer["error_code"] = ErrorCode.CLUSTER_AUTHORIZATION_FAILED  # idempotence needs WRITE on some topic
            return answer
        producer_id = getattr(body, "producer_id", -1)
        epoch = getattr(body, "producer_epoch", -1)
        if producer_id >= 0 and 0 <= epoch < 32766:  # KIP-360: an idempotent producer bumps its epoch
            answer.update(producer_id=producer_id, producer_epoch=epoch + 1)
        else:
            answer.update(producer_id=await self.producer_ids.allocate(), producer_epoch=0)
        return answer

    async def _init_transactional(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected: tuple[int, int] | None,
        connection: Connection,
    ) -> tuple[ErrorCode, int, int]:
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST, -1, -1
        if not self.authorizer.authorize(connection, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1
        if code := self._error_for(transactional_id):
            return code, -1, -1
        if not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
            return ErrorCode.INVALID_TRANSACTION_TIMEOUT, -1, -1
        metadata = self.transactions.get(transactional_id)
        if metadata is None:
            producer_id = await self.producer_ids.allocate()
            if code := self._error_for(transactional_id):  # unloaded meanwhile
                return code, -1, -1
            metadata = self.transactions.setdefault(
                transactional_id, TransactionMetadata(transactional_id, producer_id, NO_PRODUCER_EPOCH, timeout_ms)
            )
        if metadata.pending is not None:
            return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
        if expected is not None and expected[0] not in (metadata.producer_id, metadata.last_producer_id):
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, -1, -1
        now = _now_ms()
        if metadata.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
        if metadata.state is TxnState.ONGOING:
            if expected is not None and expected[1] != metadata.producer_epoch:
                return ErrorCode.PRODUCER_FENCED, -1, -1
            # the previous producer's transaction: fenced and aborted; this producer retries meanwhile
            code = await self._end(metadata, metadata.prepare_fence_and_abort(now))
            return (code or ErrorCode.CONCURRENT_TRANSACTIONS), -1, -1
        if metadata.epoch_exhausted:
            new_id = await self.producer_ids.allocate()
            if metadata.pending is not None:
                return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
            transit = metadata.prepare_producer_id_rotation(new_id, timeout_ms, now, keep_last=expected is not None)
        else:
            retry_epoch = None
            if expected is not None:
                retry_epoch = expected[1] if expected[0] == metadata.producer_id else metadata.last_producer_epoch
            prepared = metadata.prepare_increment_epoch(timeout_ms, retry_epoch, now)
            if prepared is None:
                return ErrorCode.PRODUCER_FENCED, -1, -1
            transit = prepared
        code = await self._write(metadata, transit)
        if code:
            return code, -1, -1
        log.info(
            "transactional id %r: producer %d epoch %d", transactional_id, metadata.producer_id, metadata.producer_epoch
        )
        return NONE, metadata.producer_id, metadata.producer_epoch

    # --- checks shared by the transactional requests ----------------------------------------------------------

    def _check_producer(self, transactional_id: str, producer_id: int, epoch: int) -> tuple[ErrorCode, Any]:
        """NONE and the metadata, or the error for a request of producer (`producer_id`, `epoch`)."""
        if code := self._error_for(transactional_id):
            return code, None
        metadata = self.transactions.get(transactional_id)
        if metadata is None or metadata.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if metadata.producer_epoch != epoch:
            return ErrorCode.PRODUCER_FENCED, None
        if metadata.pending is not None or metadata.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS, metadata
        return NONE, metadata

    async def _add(self, metadata: TransactionMetadata, partitions: set[TopicPartition]) -> ErrorCode:
        if metadata.state is TxnState.ONGOING and partitions <= metadata.partitions:
            return NONE  # nothing new: no write
        return await self._write(metadata, metadata.prepare_add_partitions(partitions, _now_ms()))

    # --- AddPartitionsToTxn -----------------------------------------------------------------------------------

    async def handle_add_partitions_to_txn(self, request: Request, connection: Connection) -> Response:
        body = request.body
        if request.api_version >= 4:
            results = [await self._add_partitions(txn, connection, 4) for txn in body.transactions]
            return {"throttle_time": 0, "error_code": NONE, "results_by_transaction": results}
        result = await self._add_partitions(body, connection, request.api_version)
        return {"throttle_time": 0, "results_by_topic_v3_and_below": result["topic_results"]}

    async def _add_partitions(self, txn: Any, connection: Connection, version: int) -> dict[str, Any]:
        if version < 4:  # one transaction, its fields named for the old versions
            transactional_id = txn.v3_and_below_transactional_id
            producer_id, producer_epoch = txn.v3_and_below_producer_id, txn.v3_and_below_producer_epoch
            topics = {t.name: list(t.partitions) for t in txn.v3_and_below_topics}
        else:
            transactional_id, producer_id, producer_epoch = txn.transactional_id, txn.producer_id, txn.producer_epoch
            topics = {t.name: list(t.partitions) for t in txn.topics}
        codes: dict[TopicPartition, ErrorCode] = {}
        verify_only = version >= 4 and txn.verify_only
        if not self.authorizer.authorize(connection, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            codes = {(t, p): ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for t, ps in topics.items() for p in ps}
        else:
            for topic, partitions in topics.items():
                if not self.authorizer.authorize(connection, Operation.WRITE, ResourceType.TOPIC, topic):
                    codes.update({(topic, p): ErrorCode.TOPIC_AUTHORIZATION_FAILED for p in partitions})
                else:
                    codes.update(
                        {
                            (topic, p): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                            for p in partitions
                            if not self.partition_exists(topic, p)
                        }
                    )
            if codes:  # one refused partition: nothing is added
                for topic, partitions in topics.items():
                    for p in partitions:
                        codes.setdefault((topic, p), ErrorCode.OPERATION_NOT_ATTEMPTED)
            else:
                code, metadata = self._check_producer(transactional_id, producer_id, producer_epoch)
                wanted = {(t, p) for t, ps in topics.items() for p in ps}
                if verify_only:
                    codes = self._verify(code, metadata, wanted)
                else:
                    if code == NONE:
                        code = await self._add(metadata, wanted)
                    if code == ErrorCode.PRODUCER_FENCED and version < 2:
                        code = ErrorCode.INVALID_PRODUCER_EPOCH
                    codes = dict.fromkeys(wanted, code)
        topic_results = [
            {
                "name": topic,
                "results_by_partition": [
                    {"partition_index": p, "partition_error_code": codes[(topic, p)]} for p in partitions
                ],
            }
            for topic, partitions in topics.items()
        ]
        return {"transactional_id": transactional_id, "topic_results": topic_results}

    @staticmethod
    def _verify(
        code: ErrorCode, metadata: TransactionMetadata | None, wanted: set[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4's verify_only (KIP-890): each partition in the ongoing transaction or not."""
        if code == ErrorCode.CONCURRENT_TRANSACTIONS or metadata is None:
            return dict.fromkeys(wanted, ErrorCode.INVALID_TXN_STATE if code == NONE else code)
        if code:
            return dict.fromkeys(wanted, code)
        return {
            tp: NONE
            if metadata.state is TxnState.ONGOING and tp in metadata.partitions
            else ErrorCode.INVALID_TXN_STATE
            for tp in wanted
        }

    def verify_partition(self, transactional_id: str, producer_id: int, epoch: int, tp: TopicPartition) -> ErrorCode:
        """Whether a transactional write to `tp` (a Produce, a TxnOffsetCommit) belongs to the producer's ongoing
        transaction (Kafka 3.9's partition verification, KIP-890 part 1): NONE, INVALID_PRODUCER_EPOCH for an older
        epoch, INVALID_TXN_STATE when `tp` was not added, NOT_COORDINATOR for an id coordinated elsewhere."""
        code, metadata = self._check_producer(transactional_id, producer_id, epoch)
        if code == ErrorCode.PRODUCER_FENCED:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if code == ErrorCode.INVALID_PRODUCER_ID_MAPPING:
            return ErrorCode.INVALID_TXN_STATE
        if code == ErrorCode.CONCURRENT_TRANSACTIONS:
            return ErrorCode.INVALID_TXN_STATE
        if code:
            return code
        return self._verify(code, metadata, {tp})[tp]

    # --- AddOffsetsToTxn --------------------------------------------------------------------------------------

    async def handle_add_offsets_to_txn(self, request: Request, connection: Connection) -> Response:
        body = request.body
        if not self.authorizer.authorize(
            connection, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
        ):
            return {"throttle_time": 0, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
        if not self.authorizer.authorize(connection, Operation.READ, ResourceType.GROUP, body.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED}
        code, metadata = self._check_producer(body.transactional_id, body.producer_id, body.producer_epoch)
        if code == NONE:
            partition = partition_for_group(body.group_id, self.offsets_partitions())
            code = await self._add(metadata, {(OFFSETS_TOPIC, partition)})
        if code == ErrorCode.PRODUCER_FENCED and request.api_version < 2:
            code = ErrorCode.INVALID_PRODUCER_EPOCH
        return {"throttle_time": 0, "error_code": code}

    # --- EndTxn -----------------------------------------------------------------------------------------------

    async def handle_end_txn(self, request: Request, connection: Connection) -> Response:
        body = request.body
        code = await self._end_txn(body, connection)
        if code == ErrorCode.PRODUCER_FENCED and request.api_version < 2:
            code = ErrorCode.INVALID_PRODUCER_EPOCH
        return {"throttle_time": 0, "error_code": code}

    async def _end_txn(self, body: Any, connection: Connection) -> ErrorCode:
        transactional_id: str = body.transactional_id
        if not self.authorizer.authorize(connection, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        commit: bool = body.committed
        code, metadata = self._check_producer(transactional_id, body.producer_id, body.producer_epoch)
        if code == ErrorCode.CONCURRENT_TRANSACTIONS and metadata is not None and metadata.pending is None:
            wanted = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            return ErrorCode.CONCURRENT_TRANSACTIONS if metadata.state is wanted else ErrorCode.INVALID_TXN_STATE
        if code:
            return code
        if metadata.state is TxnState.ONGOING:
            return await self._end(metadata, metadata.prepare_end(commit, _now_ms()))
        if metadata.state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT):
            return NONE  # a retry of an EndTxn that succeeded
        return ErrorCode.INVALID_TXN_STATE  # nothing open, or the opposite result already

    async def _end(self, metadata: TransactionMetadata, transit: Transit) -> ErrorCode:
        """Write PrepareCommit/PrepareAbort, then (in the background) the markers and the completion."""
        code = await self._write(metadata, transit)
        if code == NONE:
            log.debug("transactional id %r: %s", metadata.transactional_id, metadata.state.kafka_name)
            self._spawn(self._complete(metadata))
        return code

    async def _complete(self, metadata: TransactionMetadata) -> None:
        """Write the markers of a prepared transaction to every partition of it, then CompleteCommit/Abort."""
        commit = metadata.state is TxnState.PREPARE_COMMIT
        coordinator_epoch = self.coordinator_epochs.get(self.log.partition_of(metadata.transactional_id), 0)
        remaining = set(metadata.partitions)
        while remaining:
            if self.transactions.get(metadata.transactional_id) is not metadata:
                return  # no longer coordinated here: the new coordinator completes it
            for tp in [tp for tp in remaining if not self.partition_exists(*tp)]:
                remaining.discard(tp)
                log.warning("transactional id %r: %s-%d no longer exists, no marker", metadata.transactional_id, *tp)
            codes = await self._send_markers(metadata, coordinator_epoch, commit, sorted(remaining))
            for tp, code in codes.items():
                if code not in _RETRY_MARKER:
                    remaining.discard(tp)
                    if code:
                        log.warning(
                            "marker of transactional id %r to %s-%d refused (%s): dropped",
                            metadata.transactional_id,
                            *tp,
                            code.name,
                        )
            if remaining:
                await asyncio.sleep(MARKER_RETRY_S)
        while self.transactions.get(metadata.transactional_id) is metadata:
            if metadata.pending is None:
                code = await self._write(metadata, metadata.prepare_complete(_now_ms()))
                if code in (NONE, ErrorCode.NOT_COORDINATOR):
                    return
            await asyncio.sleep(MARKER_RETRY_S)

    async def _send_markers(
        self, metadata: TransactionMetadata, coordinator_epoch: int, commit: bool, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        local = [tp for tp in partitions if self.leads(*tp)]
        elsewhere = [tp for tp in partitions if not self.leads(*tp)]
        written = await asyncio.gather(  # appended one after the other, waited for together
            *(
                self.markers.write_marker(
                    metadata.producer_id, metadata.producer_epoch, coordinator_epoch, commit, topic, partition
                )
                for topic, partition in local
            )
        )
        codes = dict(zip(local, written, strict=True))
        if elsewhere:
            if self.remote_markers is None:
                codes.update(dict.fromkeys(elsewhere, ErrorCode.NOT_LEADER_OR_FOLLOWER))
            else:
                codes.update(
                    await self.remote_markers(
                        metadata.producer_id, metadata.producer_epoch, coordinator_epoch, commit, elsewhere
                    )
                )
        return codes

    # --- timeouts and expiration ------------------------------------------------------------------------------

    async def _abort_timed_out_periodically(self) -> None:
        interval = self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            await self.abort_timed_out(_now_ms())

    async def abort_timed_out(self, now_ms: int) -> int:
        """Abort (with a fencing epoch bump) every transaction open longer than its timeout; how many."""
        aborted = 0
        for metadata in list(self.transactions.values()):
            if (
                metadata.state is TxnState.ONGOING
                and metadata.pending is None
                and metadata.start_ms + metadata.timeout_ms < now_ms
            ):
                log.info(
                    "transactional id %r: transaction open for more than %d ms aborted",
                    metadata.transactional_id,
                    metadata.timeout_ms,
                )
                with contextlib.suppress(TidelogError):
                    if await self._end(metadata, metadata.prepare_fence_and_abort(now_ms)) == NONE:
                        aborted += 1
        return aborted

    async def _expire_ids_periodically(self) -> None:
        interval = self.config.transaction_remove_expired_transaction_cleanup_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            await self.expire_ids(_now_ms())

    async def expire_ids(self, now_ms: int) -> int:
        """Forget the ids idle for transactional.id.expiration.ms with no transaction open (a tombstone each)."""
        expired = 0
        for metadata in list(self.transactions.values()):
            if self.transactions.get(metadata.transactional_id) is not metadata:
                continue  # unloaded meanwhile
            if (
                metadata.state.expiration_allowed
                and metadata.pending is None
                and metadata.last_update_ms + self.config.transactional_id_expiration_ms <= now_ms
            ):
                metadata.prepare_dead(now_ms)
                try:
                    await self.log.write(metadata.transactional_id, None)
                except TidelogError as exc:
                    metadata.cancel()
                    log.warning("expiring transactional id %r failed: %s", metadata.transactional_id, exc)
                    continue
                if self.transactions.get(metadata.transactional_id) is metadata:
                    del self.transactions[metadata.transactional_id]
                    expired += 1
        if expired:
            log.info("expired %d transactional id(s)", expired)
        return expired

    # --- DescribeTransactions, ListTransactions ---------------------------------------------------------------

    async def handle_describe_transactions(self, request: Request, connection: Connection) -> Response:
        states = []
        for transactional_id in request.body.transactional_ids:
            entry: dict[str, Any] = {
                "error_code": NONE,
                "transactional_id": transactional_id,
                "transaction_state": "",
                "transaction_timeout": 0,
                "transaction_start_time": -1,
                "producer_id": -1,
                "producer_epoch": -1,
                "topics": [],
            }
            metadata = self.transactions.get(transactional_id)
            if not self.authorizer.authorize(
                connection, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id
            ):
                entry["error_code"] = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            elif code := self._error_for(transactional_id):
                entry["error_code"] = code
            elif metadata is None:
                entry["error_code"] = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            else:
                by_topic: dict[str, list[int]] = {}
                for topic, partition in sorted(metadata.partitions):
                    by_topic.setdefault(topic, []).append(partition)
                entry.update(
                    transaction_state=metadata.state.kafka_name,
                    transaction_timeout=metadata.timeout_ms,
                    transaction_start_time=metadata.start_ms,
                    producer_id=metadata.producer_id,
                    producer_epoch=metadata.producer_epoch,
                    topics=[{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
                )
            states.append(entry)
        return {"throttle_time": 0, "transaction_states": states}

    async def handle_list_transactions(self, request: Request, connection: Connection) -> Response:
        body = request.body
        names = {state.kafka_name: state for state in TxnState}
        wanted_states = {names[s] for s in body.state_filters if s in names}
        unknown = [s for s in body.state_filters if s not in names]
        producers = set(body.producer_id_filters)
        duration = getattr(body, "duration_filter", -1)
        now = _now_ms()
        listed = []
        for metadata in self._visible(self.transactions.values()):
            if body.state_filters and metadata.state not in wanted_states:
                continue
            if producers and metadata.producer_id not in producers:
                continue
            if duration >= 0 and (metadata.state is not TxnState.ONGOING or now - metadata.start_ms < duration):
                continue
            if not self.authorizer.authorize(
                connection,
                Operation.DESCRIBE,
                ResourceType.TRANSACTIONAL_ID,
                metadata.transactional_id,
                log_denied=False,
            ):
                continue
            listed.append(
                {
                    "transactional_id": metadata.transactional_id,
                    "producer_id": metadata.producer_id,
                    "transaction_state": metadata.state.kafka_name,
                }
            )
        return {"throttle_time": 0, "error_code": NONE, "unknown_state_filters": unknown, "transaction_states": listed}

    def _visible(self, transactions: Iterable[TransactionMetadata]) -> list[TransactionMetadata]:
        return [m for m in transactions if self.log.partition_of(m.transactional_id) in self.loaded]
