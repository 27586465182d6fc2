"""A partition leader verifies a transactional batch with the transaction coordinator before appending it (Kafka
3.9's transaction verification, KIP-890 part 1: ReplicaManager's `maybeStartTransactionVerificationForPartition`
and AddPartitionsToTxnManager), under `transaction.partition.verification.enable` (default true; static here,
dynamic in Kafka). With the key false nothing is verified: a transactional batch is appended as Kafka before 3.6
appends it.

The Produce handler (produce.py) asks twice:

- `verify(transactional_id, topic_data)`, awaited before the request appends anything (so one connection's
  requests, answered in order, also append in order, and an idempotent producer's sequence check sees its batches
  in order): for each partition whose batch is transactional, when the transactional id is coordinated by another
  broker of the cluster - the leader of `__transaction_state` partition `partition_of(id)` in the metadata cache's
  view - and the producer has no transaction open in the partition's producer state (the first offset of its
  ongoing transaction, `Partition.active_producers`), the coordinator is asked with AddPartitionsToTxn v4
  `verify_only` whether the partition is in the producer's ongoing transaction. The answer is the request's
  `Verdicts`. A partition whose producer has a transaction open is not asked again (its first batch was verified;
  the transaction's marker ends it), nor is one coordinated by this broker (see `check`).
- `check(transactional_id, tp, producer_id, epoch, verdicts)` at the append, synchronously before it: raises the
  error the partition is answered with, and nothing is appended. A transactional id coordinated here is checked
  with the local coordinator for every batch (`local`, transaction_coordinator.py's `verify_partition`). For the
  others: the coordinator's refusal is raised; otherwise the batch is appended when the producer has a transaction
  open in the partition, or when the partition's verification guard is still the one its verification took.

Verification guard (Kafka's VerificationGuard): taken per (topic, partition, producer id) when a verification
starts and shared by concurrent verifications of the same; a transaction marker written to the partition for the
producer (txn_markers.py, `marker_written`) drops it, so a batch verified just before its transaction ended is
refused INVALID_TXN_STATE instead of opening a transaction the coordinator never ends. A guard lives while a
request holds it (a weak reference here).

What a producer is answered (Kafka 3.9's mapping): INVALID_TXN_STATE when the partition is not in the transaction;
INVALID_PRODUCER_EPOCH for a fenced producer (PRODUCER_FENCED at the coordinator); NOT_ENOUGH_REPLICAS, which
clients retry without a metadata refresh, when the verification could not be made (NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS, a broken or timed-out connection
- NETWORK_EXCEPTION); any other code of the coordinator as it is (INVALID_PRODUCER_ID_MAPPING...). A
CLUSTER_AUTHORIZATION_FAILED of the whole request becomes INVALID_TXN_STATE.

Requests to coordinators (`CoordinatorChannel`, in a cluster): one connection per coordinator broker over the
inter-broker listener (protocol/client.py), one request in flight; the verifications queued while a request is out
go together in the next one, one entry per transactional id (all partitions of a Produce request in one entry). A
second entry for a queued id replaces it as Kafka's manager does: a newer epoch answers the queued one
INVALID_PRODUCER_EPOCH, the same epoch NETWORK_EXCEPTION (a retry), an older epoch is itself answered
INVALID_PRODUCER_EPOCH. An answer that does not come within REQUEST_TIMEOUT_S (Kafka's request.timeout.ms) is
NETWORK_EXCEPTION. Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidelog.broker.broker_channels import BrokerChannels
from tidelog.broker.transaction_log import TRANSACTION_STATE_TOPIC
from tidelog.codec.group_records import partition_for_group
from tidelog.codec.record_batch import read_header
from tidelog.errors import (
    ErrorCode,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    NotEnoughReplicasError,
    TidelogError,
)
from tidelog.protocol.client import BrokerConnection, BrokerConnectionError
from tidelog.protocol.messages import ApiKey

if TYPE_CHECKING:
    from tidelog.broker import zk_layout as zk
    from tidelog.broker.cluster_metadata import MetadataCache
    from tidelog.storage.api import StorageEngine

log = logging.getLogger("tidelog.broker")

TopicPartition = tuple[str, int]
# (transactional id, producer id, epoch, (topic, partition)) -> the local coordinator's verdict
VerifyTransaction = Callable[[str, int, int, TopicPartition], ErrorCode]
ADD_PARTITIONS_TO_TXN_VERSION = 4  # the broker-to-broker version, with verify_only
REQUEST_TIMEOUT_S = 30.0  # Kafka's request.timeout.ms for the verification requests it sends

# the verification could not be made: the producer retries (Kafka maps these to NOT_ENOUGH_REPLICAS for produce)
_UNVERIFIED = frozenset(
    {
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)


class _Guard:
    """A partition's verification guard for one producer: compared by identity."""

    __slots__ = ("__weakref__",)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The coordinator's answer for one partition of a request, and the guard its verification took (None when
    the producer had a transaction open in the partition: not asked)."""

    code: ErrorCode
    guard: _Guard | None


Verdicts = Mapping[TopicPartition, Verdict]


class VerificationError(TidelogError):
    """A coordinator's refusal with a code of its own, answered to the producer as it is."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.kafka_error_code = code


class TransactionVerifier:
    def __init__(self, engine: StorageEngine, local: VerifyTransaction, *, enabled: bool) -> None:
        self.engine = engine
        self.local = local
        self.enabled = enabled
        self.coordinators: CoordinatorChannel | None = None  # a cluster's: set by the broker
        self._guards: weakref.WeakValueDictionary[tuple[str, int, int], _Guard] = weakref.WeakValueDictionary()

    async def verify(self, transactional_id: str, topic_data: Iterable[Any]) -> Verdicts:
        """Ask the coordinator of `transactional_id`, when it is another broker, about each partition of a Produce
        request's `topic_data` whose transactional batch opens its producer's transaction here."""
        coordinators = self.coordinators
        if not self.enabled or coordinators is None:
            return {}
        coordinator = coordinators.coordinator_of(transactional_id)
        if coordinator == coordinators.broker_id:
            return {}  # checked locally at the append
        verdicts: dict[TopicPartition, Verdict] = {}
        asked: dict[tuple[int, int], dict[TopicPartition, _Guard]] = {}  # by (producer id, epoch)
        for topic in topic_data:
            for partition_data in topic.partition_data:
                try:
                    header = read_header(partition_data.records or b"")
                except TidelogError:
                    continue  # the append answers it
                if not header.is_transactional:
                    continue
                tp = (topic.name, partition_data.index)
                if self._ongoing(tp, header.producer_id):
                    verdicts[tp] = Verdict(ErrorCode.NONE, None)
                    continue
                key = (*tp, header.producer_id)
                guard = self._guards.get(key)
                if guard is None:
                    guard = self._guards[key] = _Guard()
                asked.setdefault((header.producer_id, header.producer_epoch), {})[tp] = guard
        if not asked:
            return verdicts
        if coordinator is None:
            codes = {tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for guards in asked.values() for tp in guards}
        else:
            answers = await asyncio.gather(
                *(
                    coordinators.verify(coordinator, transactional_id, producer_id, epoch, list(guards))
                    for (producer_id, epoch), guards in asked.items()
                )
            )
            codes = {tp: code for answer in answers for tp, code in answer.items()}
        for guards in asked.values():
            for tp, guard in guards.items():
                verdicts[tp] = Verdict(codes.get(tp, ErrorCode.NETWORK_EXCEPTION), guard)
        return verdicts

    def check(
        self, transactional_id: str, tp: TopicPartition, producer_id: int, epoch: int, verdicts: Verdicts
    ) -> None:
        """Raise what a transactional batch of (`producer_id`, `epoch`) to `tp` is answered instead of its append."""
        if not self.enabled:
            return
        verdict = verdicts.get(tp)
        if verdict is None:
            coordinators = self.coordinators
            if coordinators is None or coordinators.coordinator_of(transactional_id) == coordinators.broker_id:
                self._check_locally(transactional_id, tp, producer_id, epoch)
                return
            verdict = Verdict(ErrorCode.NOT_COORDINATOR, None)  # it moved away from here during the request
        if verdict.code != ErrorCode.NONE:
            raise _refusal(verdict.code, tp, transactional_id)
        if self._ongoing(tp, producer_id):
            return
        if verdict.guard is not None and self._guards.get((*tp, producer_id)) is verdict.guard:
            return
        raise InvalidTxnStateError(
            f"{tp[0]}-{tp[1]}: the transaction of producer {producer_id} ended while its batch was verified"
        )

    def marker_written(self, topic: str, partition: int, producer_id: int) -> None:
        """A COMMIT or ABORT marker of `producer_id` was appended to the partition: its verifications are void."""
        self._guards.pop((topic, partition, producer_id), None)

    async def close(self) -> None:
        if self.coordinators is not None:
            await self.coordinators.close()

    def _ongoing(self, tp: TopicPartition, producer_id: int) -> bool:
        """Whether the partition's producer state holds an open transaction of `producer_id`."""
        try:
            producers = self.engine.partition(*tp).active_producers()
        except TidelogError:
            return False
        return any(p.producer_id == producer_id and p.current_txn_start_offset >= 0 for p in producers)

    def _check_locally(self, transactional_id: str, tp: TopicPartition, producer_id: int, epoch: int) -> None:
        code = self.local(transactional_id, producer_id, epoch, tp)
        if code == ErrorCode.NONE:
            return
        if code in _UNVERIFIED or code == ErrorCode.INVALID_PRODUCER_EPOCH:
            raise _refusal(code, tp, transactional_id)
        raise InvalidTxnStateError(
            f"{tp[0]}-{tp[1]} is not in an ongoing transaction of {transactional_id!r} (producer {producer_id}"
            f" epoch {epoch}): {code.name}"
        )


def _refusal(code: ErrorCode, tp: TopicPartition, transactional_id: str) -> TidelogError:
    """The error a producer is answered for the coordinator's `code` (Kafka 3.9's ReplicaManager mapping)."""
    where = f"{tp[0]}-{tp[1]} of {transactional_id!r}"
    if code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH):
        return InvalidProducerEpochError(f"{where}: the producer is fenced")
    if code == ErrorCode.INVALID_TXN_STATE:
        return InvalidTxnStateError(f"{where}: Partition was not added to the transaction")
    if code in _UNVERIFIED:
        return NotEnoughReplicasError(
            f"{where}: Unable to verify the partition has been added to the transaction. Underlying error: {code.name}"
        )
    return VerificationError(code, f"{where}: the transaction coordinator answered {code.name}")


class CoordinatorChannel:
    """A cluster's transaction coordinators: who coordinates an id, and the verification requests to them."""

    def __init__(
        self,
        broker_id: int,
        cache: MetadataCache,
        live_brokers: Callable[[], Mapping[int, zk.BrokerRegistration]],
        listener_name: str,
    ) -> None:
        self.broker_id = broker_id
        self.cache = cache
        self._destinations = BrokerChannels(
            live_brokers, listener_name, f"tidelog-txn-verification-{broker_id}", _Destination
        )

    def coordinator_of(self, transactional_id: str) -> int | None:
        """The broker leading the id's partition of `__transaction_state`, or None (no topic, no leader)."""
        topic = self.cache.view.topics.get(TRANSACTION_STATE_TOPIC)
        if topic is None or not topic.partitions:
            return None
        leader = topic.partitions[partition_for_group(transactional_id, len(topic.partitions))].leader
        return leader if leader >= 0 else None

    async def verify(
        self, coordinator: int, transactional_id: str, producer_id: int, epoch: int, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """The coordinator's code for each of `partitions` (NONE: in the producer's ongoing transaction)."""
        if self._destinations.closed:  # the broker is stopping
            return dict.fromkeys(partitions, ErrorCode.NETWORK_EXCEPTION)
        destination = self._destinations.get(coordinator)
        if destination is None:
            return dict.fromkeys(partitions, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return await destination.enqueue(transactional_id, producer_id, epoch, partitions)

    async def close(self) -> None:
        await self._destinations.close()


@dataclass
class _Entry:
    producer_id: int
    epoch: int
    partitions: list[TopicPartition]
    future: asyncio.Future[dict[TopicPartition, ErrorCode]]

    def answer(self, codes: dict[TopicPartition, ErrorCode]) -> None:
        if not self.future.done():  # a waiter cancelled (its connection closed) is not answered
            self.future.set_result(codes)

    def answer_all(self, code: ErrorCode) -> None:
        self.answer(dict.fromkeys(self.partitions, code))

    def body(self, transactional_id: str) -> dict[str, Any]:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in self.partitions:
            by_topic.setdefault(topic, []).append(partition)
        return {
            "transactional_id": transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.epoch,
            "verify_only": True,
            "topics": [{"name": topic, "partitions": partitions} for topic, partitions in by_topic.items()],
        }


class _Destination:
    """One coordinator's queue of verifications and the task that sends them, a request at a time."""

    def __init__(self, connection: BrokerConnection) -> None:
        self.connection = connection
        self.host, self.port = connection.host, connection.port
        self._queue: dict[str, _Entry] = {}
        self._task: asyncio.Task[None] | None = None

    def enqueue(
        self, transactional_id: str, producer_id: int, epoch: int, partitions: list[TopicPartition]
    ) -> asyncio.Future[dict[TopicPartition, ErrorCode]]:
        entry = _Entry(producer_id, epoch, partitions, asyncio.get_running_loop().create_future())
        queued = self._queue.get(transactional_id)
        if queued is not None:
            if epoch < queued.epoch:
                entry.answer_all(ErrorCode.INVALID_PRODUCER_EPOCH)
                return entry.future
            queued.answer_all(ErrorCode.INVALID_PRODUCER_EPOCH if queued.epoch < epoch else ErrorCode.NETWORK_EXCEPTION)
        self._queue[transactional_id] = entry
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name=f"tidelog-txn-verification-{self.host}:{self.port}")
        return entry.future

    async def _drain(self) -> None:
        batch: dict[str, _Entry] = {}
        try:
            while self._queue:
                batch, self._queue = self._queue, {}
                try:
                    response = await self.connection.request(
                        ApiKey.ADD_PARTITIONS_TO_TXN,
                        ADD_PARTITIONS_TO_TXN_VERSION,
                        {"transactions": [entry.body(txn_id) for txn_id, entry in batch.items()]},
                        REQUEST_TIMEOUT_S,
                    )
                except BrokerConnectionError as exc:
                    log.info("transaction verification with %s: %s", self.connection.address, exc)
                    _answer_all(batch, ErrorCode.NETWORK_EXCEPTION)
                    continue
                _answer(batch, response)
        finally:  # cancelled (retired) with a request out
            _answer_all(batch, ErrorCode.NETWORK_EXCEPTION)

    def retire(self) -> None:
        """Stop sending: what is queued answers NETWORK_EXCEPTION (the producer retries)."""
        if self._task is not None:
            self._task.cancel()
        _answer_all(self._queue, ErrorCode.NETWORK_EXCEPTION)
        self._queue = {}

    async def closed(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.connection.close()


def _answer_all(batch: Mapping[str, _Entry], code: ErrorCode) -> None:
    for entry in batch.values():
        entry.answer_all(code)


def _answer(batch: Mapping[str, _Entry], response: Any) -> None:
    """Each entry's codes from an AddPartitionsToTxn v4 response; what it lacks is NETWORK_EXCEPTION."""
    if response.error_code:
        code = _code(response.error_code)
        _answer_all(batch, ErrorCode.INVALID_TXN_STATE if code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED else code)
        return
    results = {result.transactional_id: result for result in response.results_by_transaction}
    for transactional_id, entry in batch.items():
        codes = dict.fromkeys(entry.partitions, ErrorCode.NETWORK_EXCEPTION)
        result = results.get(transactional_id)
        if result is not None:
            for topic in result.topic_results:
                for partition in topic.results_by_partition:
                    if (topic.name, partition.partition_index) in codes:
                        codes[(topic.name, partition.partition_index)] = _code(partition.partition_error_code)
        entry.answer(codes)


def _code(value: int) -> ErrorCode:
    """A code of an answer; one tidelog has no name for is an unknown server error."""
    return ErrorCode(value) if value in ErrorCode._value2member_map_ else ErrorCode.UNKNOWN_SERVER_ERROR
