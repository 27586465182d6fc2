"""Produce (InitProducerId is the transaction coordinator's: transaction_coordinator.py).

A Produce request's batch goes to the partition log as received (layout and CRC checked, offsets
assigned by rewriting baseOffset, a retried idempotent batch answered with its original offsets).
acks=0 gets no response, acks=1 an answer once the batch is in the log, acks=all an answer once the
flush policy is satisfied: when `flush.messages` says the batch must be on disk, the producer waits
for a group commit - one fsync round in a worker thread covers every producer waiting at that
moment - so the event loop never blocks on the disk.

In a cluster, acks=all also waits until every in-sync replica has the batch (the high watermark passed it), up to
the request's timeout; the replica manager (replica_manager.py) refuses it before the append when the ISR is
smaller than min.insync.replicas. acks=1 is answered after the leader's append, as Kafka does.

Produce v0-v2 (clients older than Kafka 0.11) carry magic 0/1 message sets: each is up-converted to one v2 batch
before the append, as Kafka 3.x does (codec/legacy_write.py), and answered in the old response shape.

A transactional batch needs the request's transactional id, WRITE on it (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED
for every partition), and - Kafka 3.9's partition verification (KIP-890 part 1) - the partition added to the
producer's ongoing transaction at its coordinator (txn_verification.py, `verification`): INVALID_TXN_STATE when
it was not, INVALID_PRODUCER_EPOCH for a fenced producer, NOT_ENOUGH_REPLICAS (retried) when the coordinator could
not tell; nothing is appended then. A coordinator on another broker of the cluster is asked (AddPartitionsToTxn v4
`verify_only`) before the request appends anything: the handler awaits it, so the connection's next request is not
read meanwhile and a connection's appends stay in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidelog.atomic_files import write_atomically
from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, Deferred, HandlerTable, LeaderCheck, Response
from tidelog.broker.quotas import QuotaKind
from tidelog.broker.topics import INTERNAL_TOPICS
from tidelog.broker.txn_verification import TransactionVerifier, Verdicts
from tidelog.codec.legacy_write import upconvert
from tidelog.codec.record_batch import read_header
from tidelog.errors import (
    ErrorCode,
    InvalidRecordError,
    InvalidTopicError,
    InvalidTxnStateError,
    KafkaStorageError,
    TidelogError,
)
from tidelog.protocol.messages import ApiKey, Request, millis
from tidelog.storage.api import Partition, StorageEngine

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.fetch import AppendNotifier
    from tidelog.broker.metrics import Metrics
    from tidelog.broker.quotas import ClientQuotaManager
    from tidelog.broker.replica_manager import ReplicaManager

log = logging.getLogger("tidelog.broker")

PRODUCER_ID_BLOCK_FILE = "tidelog-producer-id-block"
PRODUCER_ID_BLOCK_SIZE = 1000


@dataclass
class _Pending:
    """An acks=all answer that waits: for the batch's fsync, its replication, or both."""

    answer: dict[str, Any]
    log: Partition
    end_offset: int  # the batch's last offset + 1
    key: tuple[str, int]
    durable: bool  # the flush policy wants it on disk first


@dataclass
class _Waiter:
    log: Partition
    offset: int
    future: asyncio.Future[None]


@dataclass
class Flusher:
    """Group commit: callers wait until their offset is durable; fsync rounds run in a worker thread."""

    _waiting: list[_Waiter] = field(default_factory=list)
    _round: asyncio.Task[None] | None = None

    async def wait_durable(self, partition_log: Partition, offset: int) -> None:
        if partition_log.flushed_offset < offset:
            await self._enqueue(partition_log, offset)

    def flush_later(self, partition_log: Partition, on_done: Callable[[], None]) -> None:
        """Start a flush round without waiting for it (the policy says flush, the producer asked acks=1);
        `on_done` runs after the round."""
        if partition_log.flushed_offset < partition_log.log_end_offset:
            future = self._enqueue(partition_log, partition_log.log_end_offset)
            future.add_done_callback(lambda _done: on_done())  # the round itself logs a failure

    def _enqueue(self, partition_log: Partition, offset: int) -> asyncio.Future[None]:
        waiter = _Waiter(partition_log, offset, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        if self._round is None or self._round.done():
            self._round = asyncio.create_task(self._run())
        return waiter.future

    async def _run(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            targets: dict[Partition, int] = {}
            for waiter in batch:
                targets[waiter.log] = max(targets.get(waiter.log, 0), waiter.offset)
            errors = await asyncio.to_thread(_flush_all, targets)
            for waiter in batch:
                if waiter.future.done():
                    continue
                error = errors.get(waiter.log)
                if error is None:
                    waiter.future.set_result(None)
                else:
                    waiter.future.set_exception(error)

    async def drain(self) -> None:
        if self._round is not None:
            await asyncio.gather(self._round, return_exceptions=True)


def _flush_all(targets: dict[Partition, int]) -> dict[Partition, Exception]:
    errors: dict[Partition, Exception] = {}
    for partition_log, offset in targets.items():
        try:
            partition_log.flush(offset)
        except Exception as exc:  # reported to the waiting producers as KAFKA_STORAGE_ERROR or similar
            log.error("flush of %s failed: %s", partition_log.name, exc)
            errors[partition_log] = exc
    return errors


class FileProducerIdBlocks:
    """A single broker's blocks of producer ids, reserved in a file of its log dir so that ids are never reused after
    a restart (the file holds the end of the last block handed out)."""

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / PRODUCER_ID_BLOCK_FILE
        try:
            self._next = int(self.path.read_text().strip()) if self.path.exists() else 0
        except ValueError:
            log.warning("%s is unreadable; starting producer ids after a safe gap", self.path)
            self._next = 1 << 40

    def next_block(self) -> range:
        block = range(self._next, self._next + PRODUCER_ID_BLOCK_SIZE)
        write_atomically(self.path, f"{block.stop}\n")
        self._next = block.stop
        return block


class ProducerIdAllocator:
    """Hands out producer ids from blocks `next_block` reserves (a blocking call, run on a worker thread): a file on
    a single broker, `/latest_producer_id_block` in a cluster (cluster_producer_ids.py), so that no two producers
    anywhere share an id."""

    def __init__(self, next_block: Callable[[], range]) -> None:
        self._next_block = next_block
        self._block = range(0)
        self._next = 0
        self._lock = asyncio.Lock()

    async def allocate(self) -> int:
        async with self._lock:
            if self._next >= self._block.stop:
                self._block = await asyncio.to_thread(self._next_block)
                self._next = self._block.start
            producer_id = self._next
            self._next += 1
            return producer_id


LAST_LEGACY_PRODUCE_VERSION = 2  # v0-v2 carry magic 0/1 message sets; v3 brought the v2 record batch


class ProduceApis:
    """Produce: appends through the engine's data calls, fsyncs grouped by `flusher`, waiting fetches woken through
    `notifier`; transactional batches checked with `verification` (set by the broker)."""

    def __init__(
        self,
        engine: StorageEngine,
        authorizer: Authorizer,
        metrics: Metrics,
        flusher: Flusher,
        notifier: AppendNotifier,
        check_leader: LeaderCheck | None = None,
        replication: ReplicaManager | None = None,
        quotas: ClientQuotaManager | None = None,
    ) -> None:
        self.engine = engine
        self.quotas = quotas  # producer_byte_rate: throttle time in the answer, the connection muted
        self.check_leader = check_leader  # a cluster's: NOT_LEADER_OR_FOLLOWER for a partition led elsewhere
        self.replication = replication  # a cluster's: acks=all waits for the ISR
        self.authorizer = authorizer
        self.metrics = metrics
        self.flusher = flusher
        self.notifier = notifier
        self.verification: TransactionVerifier | None = None

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.PRODUCE: ApiHandler(0, 11, self.handle_produce),
        }

    async def handle_produce(self, request: Request, connection: Connection) -> Response:
        body = request.body
        acks = body.acks
        verdicts: Verdicts = {}
        legacy = request.api_version <= LAST_LEGACY_PRODUCE_VERSION
        if self.verification is not None and body.transactional_id is not None and not legacy:
            verdicts = await self.verification.verify(body.transactional_id, body.topic_data)  # awaited: in order
        pending: list[_Pending] = []
        responses = []
        for topic_data in body.topic_data:
            partition_responses = []
            authorized = self.authorizer.authorize(connection, Operation.WRITE, ResourceType.TOPIC, topic_data.name)
            refused = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            if body.transactional_id is not None and not self.authorizer.authorize(
                connection, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
            ):
                authorized, refused = False, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            for partition_data in topic_data.partition_data:
                answer: dict[str, Any] = {
                    "index": partition_data.index,
                    "error_code": 0,
                    "base_offset": -1,
                    "log_append_time": None,
                    "log_start_offset": -1,
                }
                partition_responses.append(answer)
                if not authorized:
                    answer["error_code"] = refused
                    continue
                try:
                    partition_log, end_offset = self._append(
                        topic_data.name,
                        partition_data.index,
                        partition_data.records,
                        body.transactional_id,
                        answer,
                        acks,
                        verdicts,
                        legacy=legacy,
                    )
                except TidelogError as exc:
                    answer["error_code"] = exc.kafka_error_code
                    answer["error_message"] = str(exc)
                    # a storage failure (a full disk) is the operator's business; a bad request is the client's
                    level = logging.ERROR if isinstance(exc, KafkaStorageError) else logging.DEBUG
                    log.log(level, "produce to %s-%d failed: %s", topic_data.name, partition_data.index, exc)
                    continue
                key = (topic_data.name, partition_data.index)
                durable = partition_log.flush_due()
                if acks == -1 and (durable or self.replication is not None):
                    pending.append(_Pending(answer, partition_log, end_offset, key, durable))
                elif durable:
                    self.flusher.flush_later(partition_log, partial(self.notifier.notify, key))
            responses.append({"name": topic_data.name, "partition_responses": partition_responses})
        throttle_ms = 0
        if self.quotas is not None:
            produced = sum(len(p.records or b"") for t in body.topic_data for p in t.partition_data)
            throttle_ms = self.quotas.record(QuotaKind.PRODUCE, connection.principal, request.client_id, produced)
            connection.throttle(throttle_ms)
        if acks == 0:
            return None
        body = {"responses": responses, "throttle_time": throttle_ms}
        if not pending:
            return body
        return Deferred(self._when_complete(body, pending, millis(request.body.timeout) / 1000))

    async def _when_complete(self, body: dict[str, Any], pending: list[_Pending], timeout_s: float) -> dict[str, Any]:
        """Wait for each acks=all batch: its fsync when the flush policy asks for one, then its replication to the
        ISR in a cluster (the two overlap: the followers fetch while the leader syncs)."""
        if self.replication is not None and len(pending) == 1 and not pending[0].durable:
            # the usual acks=all in a cluster: waited for in place, without a task of its own (one loop pass sooner)
            item = pending[0]
            try:
                await self.replication.wait_replicated(*item.key, item.end_offset, timeout_s)
            except Exception as exc:
                _answer_failure(item.answer, exc)
            return body
        replicated = [
            asyncio.ensure_future(self.replication.wait_replicated(*item.key, item.end_offset, timeout_s))
            if self.replication is not None
            else None
            for item in pending
        ]
        for item, replication in zip(pending, replicated, strict=True):
            try:
                if item.durable:
                    await self.flusher.wait_durable(item.log, item.end_offset)
                    self.notifier.notify(item.key)  # an engine may show only flushed data (RocketMQ SYNC_FLUSH)
                if replication is not None:
                    await replication
            except Exception as exc:
                _answer_failure(item.answer, exc)
        for replication in replicated:  # those left after an earlier failure: their errors are answered already
            if replication is not None and not replication.done():
                replication.cancel()
            if replication is not None and replication.done() and not replication.cancelled():
                replication.exception()  # retrieved, so asyncio does not log it as never retrieved
        return body

    def _append(
        self,
        topic: str,
        partition: int,
        records: bytes | None,
        transactional_id: str | None,
        answer: dict[str, Any],
        acks: int,
        verdicts: Verdicts,
        *,
        legacy: bool,
    ) -> tuple[Partition, int]:
        """Append one partition's batch; the log and the end offset of the batch (its last offset + 1). A `legacy`
        request (v0-v2) carries a magic 0/1 message set, appended as one v2 batch (codec/legacy_write.py)."""
        if topic in INTERNAL_TOPICS:
            raise InvalidTopicError(f"clients may not produce to the internal topic {topic}")
        if not records:
            raise InvalidRecordError("produce request carries no record batch")
        if legacy:
            records = upconvert(records)
        header = read_header(records)
        if header.is_transactional:
            if transactional_id is None:
                raise InvalidTxnStateError("a transactional batch in a produce request without a transactional id")
            if self.verification is not None:
                tp = (topic, partition)
                self.verification.check(transactional_id, tp, header.producer_id, header.producer_epoch, verdicts)
        if self.check_leader is not None:
            self.check_leader(topic, partition, -1)
        if acks == -1 and self.replication is not None:
            self.replication.check_enough_replicas(topic, partition)
        partition_log = self.engine.partition(topic, partition)
        result = partition_log.append(records)
        if self.replication is not None:
            self.replication.after_leader_append(topic, partition)
        answer["base_offset"] = result.base_offset
        answer["log_start_offset"] = result.log_start_offset
        if result.log_append_time_ms >= 0:
            answer["log_append_time"] = result.log_append_time_ms
        if result.size_in_bytes:
            if self.replication is None or partition_log.high_watermark > result.last_offset:
                self.notifier.notify((topic, partition))  # visible at once
            else:  # consumers see the records when the followers' fetches move the high watermark past them
                self.notifier.notify_followers((topic, partition))
            bytes_in, messages_in, _ = self.metrics.of_topic(topic)
            bytes_in.inc(result.size_in_bytes)
            messages_in.inc(result.record_count)
        return partition_log, result.last_offset + 1


def _answer_failure(answer: dict[str, Any], exc: Exception) -> None:
    """An acks=all batch that was appended but not made durable or replicated: its error in its answer."""
    answer["error_code"] = exc.kafka_error_code if isinstance(exc, TidelogError) else ErrorCode.KAFKA_STORAGE_ERROR
    answer["error_message"] = str(exc)
