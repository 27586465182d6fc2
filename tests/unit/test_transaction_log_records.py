"""`__transaction_state` records (Kafka's TransactionLogKey/TransactionLogValue) and the transaction state machine."""

from __future__ import annotations

import struct

import pytest

from tidelog.broker.transaction_state import (
    NO_PRODUCER_EPOCH,
    IllegalTransitionError,
    TransactionMetadata,
    TxnState,
)
from tidelog.codec import transaction_log_records as records
from tidelog.codec.transaction_log_records import TransactionLogValue
from tidelog.errors import CorruptRecordError


def test_key_is_version_0_and_a_classic_string() -> None:
    assert records.encode_key("tx-1") == b"\x00\x00" + b"\x00\x04tx-1"
    assert records.decode_key(b"\x00\x00\x00\x04tx-1") == "tx-1"
    with pytest.raises(CorruptRecordError):
        records.decode_key(b"\x00\x01\x00\x04tx-1")  # not a transaction log key
    with pytest.raises(CorruptRecordError):
        records.decode_key(b"\x00\x00\x00\x09tx")


def test_value_v0_bytes_as_kafka_writes_them() -> None:
    value = TransactionLogValue(7, 3, 60_000, 1, {"a": (0, 2), "b": (1,)}, 1_700_000_000_001, 1_700_000_000_000)
    expected = (
        struct.pack(">hqhib", 0, 7, 3, 60_000, 1)
        + struct.pack(">i", 2)  # two topics
        + b"\x00\x01a" + struct.pack(">iii", 2, 0, 2)
        + b"\x00\x01b" + struct.pack(">ii", 1, 1)
        + struct.pack(">qq", 1_700_000_000_001, 1_700_000_000_000)
    )  # fmt: skip
    assert records.encode_value(value) == expected
    assert records.decode_value(expected) == value


def test_value_v0_empty_state_has_null_partitions() -> None:
    value = TransactionLogValue(7, 0, 60_000, 0, None, 5, -1)
    data = records.encode_value(value)
    assert data == struct.pack(">hqhibiqq", 0, 7, 0, 60_000, 0, -1, 5, -1)
    assert records.decode_value(data).partitions is None


def test_value_v1_is_flexible_with_tagged_producer_ids() -> None:
    value = TransactionLogValue(
        9, 1, 1000, 2, {"t": (4,)}, 20, 10, previous_producer_id=8, next_producer_id=-1, version=1
    )
    expected = (
        struct.pack(">hqhib", 1, 9, 1, 1000, 2)
        + b"\x02"  # compact array: one topic
        + b"\x02t" + b"\x02" + struct.pack(">i", 4) + b"\x00"
        + struct.pack(">qq", 20, 10)
        + b"\x01" + b"\x00\x08" + struct.pack(">q", 8)  # one tagged field: tag 0 (PreviousProducerId), 8 bytes
    )  # fmt: skip
    assert records.encode_value(value) == expected
    decoded = records.decode_value(expected)
    assert decoded == value and decoded.version == 1
    # a tag this reader does not know is skipped; null partitions are a zero length
    unknown_tag = struct.pack(">hqhib", 1, 9, 1, 1000, 0) + b"\x00" + struct.pack(">qq", 1, 2) + b"\x01\x05\x01\xff"
    assert records.decode_value(unknown_tag) == TransactionLogValue(9, 1, 1000, 0, None, 1, 2)


def test_truncated_or_unknown_values_are_refused() -> None:
    data = records.encode_value(TransactionLogValue(7, 3, 60_000, 1, {"a": (0,)}, 1, 0))
    for cut in (1, 10, len(data) - 1):
        with pytest.raises(CorruptRecordError):
            records.decode_value(data[:cut])
    with pytest.raises(CorruptRecordError):
        records.decode_value(b"\x00\x02" + data[2:])


# --- the state machine ------------------------------------------------------------------------------------------


def fresh() -> TransactionMetadata:
    metadata = TransactionMetadata("tx", 5, NO_PRODUCER_EPOCH, 60_000)
    metadata.complete(metadata.prepare_increment_epoch(60_000, None, now_ms=1))
    return metadata


def test_a_transaction_commits_through_the_valid_states() -> None:
    m = fresh()
    assert (m.state, m.producer_epoch) == (TxnState.EMPTY, 0)
    m.complete(m.prepare_add_partitions([("t", 0)], now_ms=10))
    m.complete(m.prepare_add_partitions([("t", 1)], now_ms=11))
    assert (m.state, m.partitions, m.start_ms) == (TxnState.ONGOING, {("t", 0), ("t", 1)}, 10)
    transit = m.prepare_end(commit=True, now_ms=12)
    assert m.pending_state is TxnState.PREPARE_COMMIT and m.state is TxnState.ONGOING  # not yet durable
    assert transit.log_value().partitions == {"t": (0, 1)}
    m.complete(transit)
    m.complete(m.prepare_complete(now_ms=13))
    assert (m.state, m.partitions) == (TxnState.COMPLETE_COMMIT, set())
    m.complete(m.prepare_add_partitions([("u", 0)], now_ms=14))  # the next transaction starts afresh
    assert (m.partitions, m.start_ms) == ({("u", 0)}, 14)


def test_invalid_transitions_are_refused() -> None:
    m = fresh()
    with pytest.raises(IllegalTransitionError):
        m.prepare_end(commit=True, now_ms=2)  # Empty cannot commit
    m.complete(m.prepare_add_partitions([("t", 0)], now_ms=3))
    m.prepare_end(commit=False, now_ms=4)
    with pytest.raises(IllegalTransitionError):
        m.prepare_add_partitions([("t", 1)], now_ms=5)  # another change is pending
    m.cancel()
    assert m.state is TxnState.ONGOING and m.pending is None
    with pytest.raises(IllegalTransitionError):
        m.prepare_dead(now_ms=6)  # an open transaction does not expire


def test_epoch_bumps_fence_and_retries() -> None:
    m = fresh()
    m.complete(m.prepare_increment_epoch(60_000, None, now_ms=2))  # a new producer instance: epoch 1
    assert (m.producer_epoch, m.last_producer_epoch) == (1, NO_PRODUCER_EPOCH)
    m.complete(m.prepare_increment_epoch(60_000, 1, now_ms=3))  # KIP-360: the producer bumps its own epoch
    assert (m.producer_epoch, m.last_producer_epoch) == (2, 1)
    m.complete(m.prepare_increment_epoch(60_000, 1, now_ms=4))  # its retry: the same answer
    assert m.producer_epoch == 2
    assert m.prepare_increment_epoch(60_000, 0, now_ms=5) is None  # a zombie: PRODUCER_FENCED
    m.complete(m.prepare_add_partitions([("t", 0)], now_ms=6))
    fence = m.prepare_fence_and_abort(now_ms=7)
    assert (fence.state, fence.producer_epoch) == (TxnState.PREPARE_ABORT, 3)
    m.cancel()  # the write failed: the bumped epoch stays, and is not bumped twice
    assert m.prepare_fence_and_abort(now_ms=8).producer_epoch == 3


def test_replayed_values_rebuild_the_metadata() -> None:
    value = TransactionLogValue(7, 3, 9000, int(TxnState.PREPARE_COMMIT), {"a": (0, 1)}, 20, 10)
    m = TransactionMetadata.from_log_value("tx", value)
    assert (m.producer_id, m.producer_epoch, m.state, m.partitions) == (
        7,
        3,
        TxnState.PREPARE_COMMIT,
        {("a", 0), ("a", 1)},
    )
    assert m.current().log_value() == value
    assert TxnState.PREPARE_EPOCH_FENCE.kafka_name == "PrepareEpochFence"
