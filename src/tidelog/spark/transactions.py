"""The exactly-once sink's transactions: one Kafka transaction per task, committed by the driver with Spark's commit.

Kafka's transactional producer commits its own transaction; Spark commits a micro-batch on the driver, after every
task has finished, and its tasks' producers are gone by then. The sink splits the two as a two-phase commit over
Kafka's transaction protocol (KIP-98), the way Flink's Kafka sink resumes a transaction:

- **A task** (writer.py) runs a confluent-kafka transactional producer with the transactional id
  `<prefix><query id>-[<topic option>-]<task partition>` (Spark sets the query and batch ids on the tasks of a
  micro-batch, also on those of a batch write inside `foreachBatch`). `init_transactions` fences every earlier
  producer of that id (an earlier attempt of the task, or the same task of a run that crashed) and aborts its open
  transaction. The task writes its rows in a transaction and waits until they are acknowledged, reads the id's
  producer id and epoch (DescribeTransactions, while the transaction is Ongoing), adds the batch marker described
  below with `send_offsets_to_transaction`, and returns the id, producer id and epoch to the driver *with the
  transaction still open* (a producer that goes away does not abort its transaction). The marker carries the
  task's epoch, so a newer attempt that fenced the task before the describe makes the task fail rather than hand
  the driver the newer attempt's transaction.
- **The driver's commit** sends EndTxn(commit) for each task's transaction, with that task's producer id and
  epoch: a transaction whose producer was fenced since (a newer attempt bumped the epoch) is refused
  (PRODUCER_FENCED or INVALID_PRODUCER_EPOCH), never committed in the newer attempt's place. The driver's abort
  sends EndTxn(abort); what it does not reach is aborted by the next `init_transactions` of the id or by
  `transaction.timeout.ms`.
- **The batch marker** makes a replayed batch skip what an earlier run already committed. Each task's
  transaction also commits, through TxnOffsetCommit, the offset `batch id + 1` of the consumer group named
  like the transactional id (on partition 0 of the first topic the task wrote): atomically with the rows. (A
  batch write, which is never replayed, commits offset 0 there, which names no batch.)
  A task first reads that group's committed offsets (OffsetFetch, require_stable): when they say the batch is
  in, it writes nothing. This covers a driver that dies after committing some or all of a batch's transactions
  but before Spark recorded the batch as done, which Spark then replays.

The coordinator requests go over tidelog's own Kafka client (protocol/client.py), PLAINTEXT only; the data goes
through librdkafka. Replays must give each task the rows it had (Spark's deterministic replay): the marker is
per task partition.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from tidelog.errors import KafkaClientError
from tidelog.protocol.client import BrokerConnection, BrokerConnectionError

FIND_COORDINATOR, END_TXN, DESCRIBE_TRANSACTIONS, OFFSET_FETCH = 10, 26, 65, 9
GROUP, TRANSACTION = 0, 1
REQUEST_TIMEOUT_S = 30.0
RETRY_S = 0.1
RETRY_FOR_S = 60.0
# error codes: NONE; retried: COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
# CONCURRENT_TRANSACTIONS, UNSTABLE_OFFSET_COMMIT; named: INVALID_PRODUCER_EPOCH, PRODUCER_FENCED
NONE = 0
RETRIABLE = {14, 15, 16, 51, 88}
FENCED = {47, 90}
MARKER_METADATA = "tidelog-spark-sink batch "


class CoordinatorNotYetError(KafkaClientError):
    """FindCoordinator found no coordinator for now (a retriable answer, or no bootstrap server answered)."""


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """What the driver needs to end a task's transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


class CoordinatorClient:
    """Synchronous requests to a transaction or group coordinator, found through the bootstrap servers."""

    def __init__(self, bootstrap_servers: str, client_id: str = "tidelog-spark-sink") -> None:
        self.bootstrap = [_address(a) for a in bootstrap_servers.split(",") if a.strip()]
        self.client_id = client_id

    def _run(self, key: str, key_type: int, api_key: int, version: int, body: dict[str, Any]) -> Any:
        return asyncio.run(self._call(key, key_type, api_key, version, body))

    async def _call(self, key: str, key_type: int, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """The request sent to `key`'s coordinator; retried for RETRY_FOR_S while no coordinator is found or it
        answers with a retriable code."""
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                host, port = await self._coordinator(key, key_type)
            except CoordinatorNotYetError as exc:  # e.g. its leader just died: a new one is being elected
                if time.monotonic() > deadline:
                    raise KafkaClientError(f"{exc} (for {RETRY_FOR_S:.0f} s)") from None
                await asyncio.sleep(RETRY_S)
                continue
            connection = BrokerConnection(host, port, self.client_id)
            try:
                response = await connection.request(api_key, version, body, REQUEST_TIMEOUT_S)
            except BrokerConnectionError as exc:
                if time.monotonic() > deadline:
                    raise KafkaClientError(f"the coordinator of {key!r} cannot be reached: {exc}") from exc
                response = None
            finally:
                await connection.close()
            code = _error_code(response) if response is not None else 15
            if code not in RETRIABLE or time.monotonic() > deadline:
                return response
            await asyncio.sleep(RETRY_S)

    async def _coordinator(self, key: str, key_type: int) -> tuple[str, int]:
        """`key`'s coordinator from the first bootstrap server that answers FindCoordinator; CoordinatorNotYetError
        when none answers or the answer is retriable (COORDINATOR_NOT_AVAILABLE while a coordinator moves)."""
        last: Exception | None = None
        for host, port in self.bootstrap:
            connection = BrokerConnection(host, port, self.client_id)
            try:
                response = await connection.request(
                    FIND_COORDINATOR, 4, {"key_type": key_type, "coordinator_keys": [key]}, REQUEST_TIMEOUT_S
                )
            except BrokerConnectionError as exc:
                last = exc
                continue
            finally:
                await connection.close()
            (found,) = response.coordinators
            if found.error_code != NONE:
                error = CoordinatorNotYetError if found.error_code in RETRIABLE else KafkaClientError
                raise error(f"no coordinator for {key!r}: error {found.error_code} {found.error_message}")
            return found.host, int(found.port)
        raise CoordinatorNotYetError(f"no bootstrap server answered FindCoordinator for {key!r}: {last}")

    def describe(self, transactional_id: str) -> OpenTransaction:
        """The producer id and epoch of the id's open transaction (its coordinator's DescribeTransactions)."""
        response = self._run(
            transactional_id,
            TRANSACTION,
            DESCRIBE_TRANSACTIONS,
            0,
            {"transactional_ids": [transactional_id]},
        )
        (state,) = response.transaction_states
        if state.error_code != NONE:
            raise KafkaClientError(f"DescribeTransactions of {transactional_id!r} failed: error {state.error_code}")
        if state.transaction_state != "Ongoing":
            raise KafkaClientError(
                f"transaction {transactional_id!r} is {state.transaction_state}, not Ongoing: another producer of the "
                "id took over"
            )
        return OpenTransaction(transactional_id, int(state.producer_id), int(state.producer_epoch))

    def end(self, txns: list[OpenTransaction], commit: bool) -> list[KafkaClientError]:
        """EndTxn for each of `txns` (concurrently): commit or abort them; the refusals, one error each."""
        return asyncio.run(self._end_all(txns, commit))

    async def _end_all(self, txns: list[OpenTransaction], commit: bool) -> list[KafkaClientError]:
        outcomes = await asyncio.gather(*(self._end(txn, commit) for txn in txns), return_exceptions=True)
        refused = []
        for outcome in outcomes:
            if isinstance(outcome, KafkaClientError):
                refused.append(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        return refused

    async def _end(self, txn: OpenTransaction, commit: bool) -> None:
        body = {
            "transactional_id": txn.transactional_id,
            "producer_id": txn.producer_id,
            "producer_epoch": txn.producer_epoch,
            "committed": commit,
        }
        response = await self._call(txn.transactional_id, TRANSACTION, END_TXN, 3, body)
        code = int(response.error_code)
        if code != NONE:
            verb = "commit" if commit else "abort"
            raise KafkaClientError(
                f"{verb} of transaction {txn.transactional_id!r} (producer {txn.producer_id}, epoch "
                f"{txn.producer_epoch}) refused with error {code}"
                + (" (the producer was fenced: a newer attempt of the task took over)" if code in FENCED else "")
            )

    def committed_batch(self, group: str) -> int | None:
        """The last batch id a task's group marker holds (stable offsets only), None when it holds none."""
        body = {"groups": [{"group_id": group, "topics": None}], "require_stable": True}
        response = self._run(group, GROUP, OFFSET_FETCH, 8, body)
        (found,) = response.groups
        if found.error_code != NONE:
            raise KafkaClientError(f"OffsetFetch of group {group!r} failed: error {found.error_code}")
        batches = [
            int(p.committed_offset) - 1
            for topic in found.topics
            for p in topic.partitions
            if p.error_code == NONE and p.committed_offset > 0 and (p.metadata or "").startswith(MARKER_METADATA)
        ]
        return max(batches, default=None)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _error_code(response: Any) -> int:
    """The response's error code: its own, a transactional id's, a group's or the first retriable partition's."""
    if hasattr(response, "error_code"):
        return int(response.error_code)
    codes = [int(s.error_code) for s in getattr(response, "transaction_states", ())]
    for group in getattr(response, "groups", ()):
        codes.append(int(group.error_code))
        codes += [int(p.error_code) for topic in group.topics for p in topic.partitions]
    return next((code for code in codes if code in RETRIABLE), max(codes, default=NONE))
