"""One transactional id's state at its coordinator (Kafka's TransactionMetadata), and the states' valid transitions.

    state               id  reached from                                   meaning
    Empty               0   Empty, CompleteCommit, CompleteAbort           no transaction open (after InitProducerId)
    Ongoing             1   Ongoing, Empty, CompleteCommit, CompleteAbort  partitions or offsets were added
    PrepareCommit       2   Ongoing                                        EndTxn(commit) logged; markers to write
    PrepareAbort        3   Ongoing, PrepareEpochFence                     EndTxn(abort), a timeout or a fence logged
    CompleteCommit      4   PrepareCommit                                  every marker written
    CompleteAbort       5   PrepareAbort                                   every marker written
    Dead                6   Empty, CompleteCommit, CompleteAbort           expired (transactional.id.expiration.ms)
    PrepareEpochFence   7   Ongoing                                        Kafka's pending state while a new producer
                                                                           fences the old one's open transaction (see
                                                                           `prepare_fence_and_abort`); read, not written

A change is made in two steps, as Kafka makes it: `prepare_*` checks the transition against the table above and
returns the target (`Transit`) while the metadata remembers it as pending (no other change may start meanwhile:
the coordinator answers CONCURRENT_TRANSACTIONS); once the target is durable in `__transaction_state`,
`complete(transit)` makes it the state; if the write failed, `cancel()` drops the pending target. Nothing here does
I/O: the coordinator (transaction_coordinator.py) owns the writes and the clock.

The epoch: InitProducerId bumps it (a new producer fences the one before it); when it would pass 32766 (Short.MaxValue
- 1) the coordinator moves the transactional id to a new producer id at epoch 0 (`prepare_producer_id_rotation`).
`last_producer_epoch` is the epoch before the last bump, so a retried InitProducerId of the same producer (KIP-360:
it names its epoch) gets the same answer rather than PRODUCER_FENCED.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import IntEnum

from tidelog.codec.transaction_log_records import TransactionLogValue

NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767  # Short.MaxValue


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use ("Ongoing", "PrepareEpochFence", ...)."""
        return "".join(word.capitalize() for word in self.name.split("_"))

    @property
    def expiration_allowed(self) -> bool:
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def completed(self) -> bool:
        return self in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}


class IllegalTransitionError(Exception):
    """A transition the table does not allow, or one started while another is pending: a coordinator bug."""


TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Transit:
    """The target of a change: what is written to `__transaction_state` and then becomes the state."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int
    last_update_ms: int

    def log_value(self) -> TransactionLogValue:
        """The stored form (value v0, as Kafka 3.9 writes it; partitions null when Empty)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(self.partitions):
            by_topic.setdefault(topic, []).append(partition)
        return TransactionLogValue(
            self.producer_id,
            self.producer_epoch,
            self.timeout_ms,
            int(self.state),
            None if self.state is TxnState.EMPTY else {t: tuple(ps) for t, ps in by_topic.items()},
            self.last_update_ms,
            self.start_ms,
        )


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    last_producer_id: int = -1
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    pending: Transit | None = None
    failed_fence: bool = False  # a fence's write failed: its bumped epoch may be in the log already

    @classmethod
    def from_log_value(cls, transactional_id: str, value: TransactionLogValue) -> TransactionMetadata:
        """The metadata a replay of `__transaction_state` rebuilds (raises ValueError for an unknown state id)."""
        partitions = {(t, p) for t, ps in (value.partitions or {}).items() for p in ps}
        state = TxnState(value.state)
        return cls(
            transactional_id,
            value.producer_id,
            value.producer_epoch,
            value.timeout_ms,
            state,
            set() if state is TxnState.EMPTY else partitions,
            value.start_ms,
            value.last_update_ms,
            value.previous_producer_id,
        )

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= MAX_EPOCH - 1

    @property
    def pending_state(self) -> TxnState | None:
        return None if self.pending is None else self.pending.state

    def current(self) -> Transit:
        return Transit(
            self.producer_id,
            self.last_producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            self.state,
            frozenset(self.partitions),
            self.start_ms,
            self.last_update_ms,
        )

    def _prepare(self, target: Transit) -> Transit:
        if self.pending is not None:
            raise IllegalTransitionError(
                f"{self.transactional_id}: {target.state.kafka_name} while {self.pending.state.kafka_name} is pending"
            )
        if self.state not in VALID_PREVIOUS[target.state]:
            raise IllegalTransitionError(
                f"{self.transactional_id}: {self.state.kafka_name} cannot become {target.state.kafka_name}"
            )
        self.pending = target
        return target

    def complete(self, transit: Transit) -> None:
        """`transit`, now durable, becomes the state."""
        if self.pending is not transit:
            raise IllegalTransitionError(f"{self.transactional_id}: completing a transition that is not pending")
        self.pending = None
        self.producer_id = transit.producer_id
        self.last_producer_id = transit.last_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.timeout_ms = transit.timeout_ms
        self.state = transit.state
        self.partitions = set(transit.partitions)
        self.start_ms = transit.start_ms
        self.last_update_ms = transit.last_update_ms

    def cancel(self) -> None:
        """The pending transition's write failed: the state stays as it was."""
        if self.pending is not None and self.pending.producer_epoch > self.producer_epoch:
            self.failed_fence = self.pending.state is TxnState.PREPARE_ABORT
            if self.failed_fence:  # Kafka keeps the bumped epoch: the old producer stays fenced
                self.producer_epoch = self.pending.producer_epoch
        self.pending = None

    # --- the transitions the coordinator makes ---------------------------------------------------------------

    def prepare_increment_epoch(self, timeout_ms: int, expected_epoch: int | None, now_ms: int) -> Transit | None:
        """InitProducerId on a transactional id whose transaction is complete or empty: bump the epoch (to Empty).
        `expected_epoch` is the producer's own (KIP-360: InitProducerId v3+ names it): its retry is answered with
        the current epoch. None: PRODUCER_FENCED (the producer named an epoch that is neither)."""
        if expected_epoch is None or self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            last = NO_PRODUCER_EPOCH if expected_epoch is None else self.producer_epoch
            epoch = self.producer_epoch + 1
        elif expected_epoch == self.last_producer_epoch:
            epoch, last = self.producer_epoch, self.last_producer_epoch
        else:
            return None
        target = replace(
            self.current(),
            producer_epoch=epoch,
            last_producer_epoch=last,
            timeout_ms=timeout_ms,
            state=TxnState.EMPTY,
            partitions=frozenset(),
            start_ms=-1,
            last_update_ms=now_ms,
        )
        return self._prepare(target)

    def prepare_producer_id_rotation(
        self, producer_id: int, timeout_ms: int, now_ms: int, *, keep_last: bool
    ) -> Transit:
        """A new producer id at epoch 0 (the epoch is exhausted, or the id was new)."""
        target = replace(
            self.current(),
            producer_id=producer_id,
            last_producer_id=self.producer_id if keep_last else -1,
            producer_epoch=0,
            last_producer_epoch=self.producer_epoch if keep_last else NO_PRODUCER_EPOCH,
            timeout_ms=timeout_ms,
            state=TxnState.EMPTY,
            partitions=frozenset(),
            start_ms=-1,
            last_update_ms=now_ms,
        )
        return self._prepare(target)

    def prepare_fence_and_abort(self, now_ms: int) -> Transit:
        """A new producer's InitProducerId while a transaction of the old one is open: the epoch is bumped (the old
        producer is fenced) and the transaction goes to PrepareAbort under the new epoch, in one write, as Kafka does
        it (PrepareEpochFence is its pending state in between, never written). A fence whose write failed is not
        bumped again on the next try."""
        if self.producer_epoch >= MAX_EPOCH:
            raise IllegalTransitionError(f"{self.transactional_id}: the epoch cannot be bumped past {MAX_EPOCH}")
        epoch = self.producer_epoch if self.failed_fence else self.producer_epoch + 1
        target = replace(
            self.current(),
            producer_epoch=epoch,
            last_producer_epoch=NO_PRODUCER_EPOCH,
            state=TxnState.PREPARE_ABORT,
            last_update_ms=now_ms,
        )
        if self.state is not TxnState.ONGOING:
            raise IllegalTransitionError(f"{self.transactional_id}: {self.state.kafka_name} cannot be fenced")
        self.failed_fence = False
        return self._prepare(target)

    def prepare_add_partitions(self, added: Iterable[TopicPartition], now_ms: int) -> Transit:
        """AddPartitionsToTxn (and AddOffsetsToTxn: the group's `__consumer_offsets` partition): Ongoing."""
        start = (
            now_ms
            if self.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
            else self.start_ms
        )
        partitions = frozenset(self.partitions if self.state is TxnState.ONGOING else ()) | frozenset(added)
        target = replace(
            self.current(), state=TxnState.ONGOING, partitions=partitions, start_ms=start, last_update_ms=now_ms
        )
        return self._prepare(target)

    def prepare_end(self, commit: bool, now_ms: int) -> Transit:
        """EndTxn (or a timeout's abort): PrepareCommit or PrepareAbort, the partitions kept for the markers."""
        state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        return self._prepare(replace(self.current(), state=state, last_update_ms=now_ms))

    def prepare_complete(self, now_ms: int) -> Transit:
        """Every marker is written: CompleteCommit or CompleteAbort, no partitions left."""
        state = TxnState.COMPLETE_COMMIT if self.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
        return self._prepare(replace(self.current(), state=state, partitions=frozenset(), last_update_ms=now_ms))

    def prepare_dead(self, now_ms: int) -> Transit:
        """The transactional id expired: its tombstone is written, then it is forgotten."""
        return self._prepare(
            replace(self.current(), state=TxnState.DEAD, partitions=frozenset(), last_update_ms=now_ms)
        )
