"""The log cleaner and transactions (Kafka's CleanedTransactionMetadata) on real files: aborted data removed while
committed data is compacted, markers kept while their transaction has batches and then for `delete.retention.ms`
(a delete horizon on the marker's batch), open transactions never touched, the `.txnindex` files following the
markers, the producer's last entry kept (RETAIN_EMPTY), and read_committed and the producer state after cleaning
and after a reopen with recovery.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tidelog import Record
from tidelog.codec.control_record import read_end_txn_marker
from tidelog.codec.record_batch import DELETE_HORIZON_MASK, BatchHeader, build_batch, decode_records
from tidelog.codec.record_set import iter_batches
from tidelog.config import EngineConfig
from tidelog.errors import InvalidProducerEpochError
from tidelog.storage.kafka.engine import KafkaEngine
from tidelog.storage.kafka.partition_log import PartitionLog

TS = 1_700_000_000_000
HOUR = 3_600_000
RETENTION = 10 * HOUR  # delete.retention.ms of the topic
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": str(RETENTION)}
TXN_ENTRY = struct.Struct(">hqqqq")


class Clock:
    def __init__(self) -> None:
        self.now = TS + HOUR

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def open_engine(path: Path, clock: Clock) -> KafkaEngine:
    settings = {"log.segment.bytes": 400, "log.segment.delete.delay.ms": 0}
    return KafkaEngine(EngineConfig.from_mapping(settings, log_dir=path), background=False, clock=clock)


class Producer:
    """A transactional producer's batches, one record each, keyed, with its sequence and epoch."""

    def __init__(self, log: PartitionLog, producer_id: int) -> None:
        self.log, self.producer_id, self.epoch, self.sequence = log, producer_id, 0, 0

    def send(self, key: str, value: str) -> int:
        batch = build_batch(
            [Record(value.encode(), key=key.encode(), timestamp_ms=TS)],
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=self.sequence,
            is_transactional=True,
        )
        self.sequence += 1
        return self.log.append(batch).base_offset

    def end(self, commit: bool, *, epoch: int | None = None) -> int:
        if epoch is not None:
            self.epoch, self.sequence = epoch, 0
        return self.log.append_marker(self.producer_id, self.epoch, 0, commit).base_offset


def plain(log: PartitionLog, key: str, value: str) -> None:
    log.append(build_batch([Record(value.encode(), key=key.encode(), timestamp_ms=TS)]))


def fill(log: PartitionLog, count: int, *, tag: str = "fill") -> None:
    """Non-transactional records of their own keys, enough to roll a few segments."""
    for n in range(count):
        plain(log, f"{tag}{n}", "x" * 40)


def next_pass(engine: KafkaEngine, log: PartitionLog, clock: Clock, *, advance: int = HOUR) -> None:
    """A little new data (so the log is dirty again), a roll, time passing, and one cleaning pass."""
    fill(log, 2, tag=f"pass{clock.now}-")
    log.roll()
    clock.now += advance
    assert len(engine.clean_logs()) == 1


def batches(log: PartitionLog) -> list[tuple[int, BatchHeader, list[Record]]]:
    """(last offset, header, records) of every stored batch, control ones included."""
    data = log.read(log.log_start_offset, 1 << 24, up_to_log_end=True).read_bytes()
    out = []
    for info in iter_batches(data):
        assert isinstance(info.header, BatchHeader)
        out.append((info.last_offset, info.header, decode_records(data, info.position, info.header)))
    return out


def markers(log: PartitionLog) -> dict[int, tuple[str, bool]]:
    """Marker offset -> (COMMIT/ABORT/empty, has a delete horizon)."""
    found = {}
    data = log.read(log.log_start_offset, 1 << 24, up_to_log_end=True).read_bytes()
    for info in iter_batches(data):
        header = info.header
        assert isinstance(header, BatchHeader)
        if header.is_control:
            marker = read_end_txn_marker(data, info.position, header)
            kind = "empty" if marker is None else ("COMMIT" if marker.commit else "ABORT")
            found[info.last_offset] = (kind, bool(header.attributes & DELETE_HORIZON_MASK))
    return found


def committed_view(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """What a read_committed consumer gets: the records below the last stable offset, minus each aborted
    transaction's records from its first offset up to its producer's ABORT marker (the client's own filtering)."""
    lso = log.last_stable_offset
    data = log.read(log.log_start_offset, 1 << 24, max_offset=lso).read_bytes()
    aborted = sorted((txn.first_offset, txn.producer_id) for txn in log.aborted_transactions(log.log_start_offset, lso))
    aborting: set[int] = set()
    out = []
    for info in iter_batches(data):
        header = info.header
        assert isinstance(header, BatchHeader)
        while aborted and aborted[0][0] <= info.last_offset:
            aborting.add(aborted.pop(0)[1])
        if header.is_control:
            marker = read_end_txn_marker(data, info.position, header)
            if marker is not None and not marker.commit:
                aborting.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in aborting:
            continue
        out += [(r.offset, r.key, r.value) for r in decode_records(data, info.position, header)]
    return out


def all_values(log: PartitionLog) -> set[bytes]:
    return {r.value for _last, header, records in batches(log) if not header.is_control for r in records if r.value}


def txn_index_entries(directory: Path) -> list[tuple[int, ...]]:
    return [e for p in sorted(directory.glob("*.txnindex")) for e in TXN_ENTRY.iter_unpack(p.read_bytes())]


def test_aborted_data_goes_and_markers_follow_their_transactions(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        log = engine.partition_log("t", 0)
        committer, aborter = Producer(log, 1), Producer(log, 2)
        committer.send("k", "committed-1")
        committer.send("c", "committed-c")
        commit_marker = committer.end(commit=True)
        first_aborted = aborter.send("k", "aborted-1")
        aborter.send("a", "aborted-a")
        abort_marker = aborter.end(commit=False)
        fill(log, 12)
        # both producers go on later, so their last batches (kept by RETAIN_EMPTY) are past the cleaned range
        committer.send("later1", "v")
        committer.end(commit=True)
        aborter.send("later2", "v")
        aborter.end(commit=True)
        log.roll()
        view_before = committed_view(log)
        end_before = log.log_end_offset
        directory = log.directory
        assert txn_index_entries(directory) == [(0, 2, first_aborted, abort_marker, abort_marker + 1)]

        # pass 1: the aborted records go; the newer aborted value of "k" does not hide the committed one
        [stats] = engine.clean_logs()
        assert stats.end_offset == log.active_segment.base_offset
        values = all_values(log)
        assert b"aborted-1" not in values and b"aborted-a" not in values
        assert {b"committed-1", b"committed-c"} <= values
        assert committed_view(log) == view_before
        # both markers met a batch of their transaction: they stay as they were, the abort with its index entry
        assert markers(log)[commit_marker] == ("COMMIT", False)
        assert markers(log)[abort_marker] == ("ABORT", False)
        assert txn_index_entries(directory) == [(0, 2, first_aborted, abort_marker, abort_marker + 1)]
        assert log.aborted_transactions(0, log.last_stable_offset) != []

        # pass 2: no batch of the aborted transaction left: its marker gets a delete horizon, its entry goes
        next_pass(engine, log, clock)
        assert markers(log)[abort_marker] == ("ABORT", True)
        assert markers(log)[commit_marker] == ("COMMIT", False)  # its records are still there
        assert txn_index_entries(directory) == []
        assert log.aborted_transactions(0, log.last_stable_offset) == []
        assert [r for r in committed_view(log) if r[0] < end_before] == view_before

        # a newer value of "k" and "c" makes the committed transaction's records go, then its marker follows
        plain(log, "k", "newer-k")
        plain(log, "c", "newer-c")
        next_pass(engine, log, clock)
        assert {b"committed-1", b"committed-c"}.isdisjoint(all_values(log))
        assert markers(log)[commit_marker] == ("COMMIT", False)  # the pass still met the emptied batches
        next_pass(engine, log, clock)
        assert markers(log)[commit_marker] == ("COMMIT", True)

        # after delete.retention.ms the horizons have passed: the markers are removed
        next_pass(engine, log, clock, advance=RETENTION)
        assert abort_marker not in markers(log) and commit_marker not in markers(log)
        values = [v for _o, _k, v in committed_view(log)]
        assert b"newer-k" in values and b"aborted-1" not in values


def test_an_open_transaction_is_never_cleaned(tmp_path: Path, clock: Clock) -> None:
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        log = engine.partition_log("t", 0)
        fill(log, 4, tag="early")
        fill(log, 4, tag="early")  # the same keys again: the first four records are obsolete
        opener = Producer(log, 7)
        open_start = opener.send("k", "open-1")
        fill(log, 6, tag="late")
        fill(log, 6, tag="late")  # obsolete values beyond the open transaction's start
        opener.send("k", "open-2")
        log.roll()
        assert log.last_stable_offset == open_start
        before = {r[0] for r in batches(log) if r[0] >= open_start}

        [stats] = engine.clean_logs()
        assert stats.end_offset <= open_start  # the dirty range stops at the last stable offset
        after = batches(log)
        assert min(last for last, _h, _r in after) == 4  # the obsolete early ones went ...
        assert {last for last, _h, _r in after if last >= open_start} == before  # ... nothing at or past the LSO
        assert {b"open-1", b"open-2"} <= all_values(log)

        # once aborted, the transaction's records go and the late duplicates are compacted
        opener.end(commit=False)
        next_pass(engine, log, clock)
        values = all_values(log)
        assert b"open-1" not in values and b"open-2" not in values
        assert [v for _o, k, v in committed_view(log) if k == b"late0"] == [b"x" * 40]


def test_a_fenced_producers_last_marker_stays_as_an_empty_batch(tmp_path: Path, clock: Clock) -> None:
    """The coordinator aborts a fenced producer's transaction with a bumped epoch: that marker is the producer's last
    entry (no data batch at its epoch), so after its horizon it stays as a header-only batch (RETAIN_EMPTY) and the
    old epoch stays fenced."""
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        log = engine.partition_log("t", 0)
        fenced = Producer(log, 9)
        fenced.send("k", "zombie")
        marker = fenced.end(commit=False, epoch=1)
        fill(log, 12)
        log.roll()
        engine.clean_logs()
        assert b"zombie" not in all_values(log)
        assert markers(log)[marker] == ("ABORT", False)
        next_pass(engine, log, clock)
        assert markers(log)[marker] == ("ABORT", True)
        next_pass(engine, log, clock, advance=RETENTION)
        assert markers(log)[marker] == ("empty", False)
        with pytest.raises(InvalidProducerEpochError):
            log.append(
                build_batch(
                    [Record(b"v", key=b"k")], producer_id=9, producer_epoch=0, base_sequence=1, is_transactional=True
                )
            )


def test_cleaned_state_survives_a_reopen_with_recovery(tmp_path: Path, clock: Clock) -> None:
    """After a pass, a reopen that rescans every segment (no clean shutdown, no snapshot) gives the same
    read_committed view, and producers carry on with their sequences. Recovery rebuilds `.txnindex` entries only for
    aborted transactions with a batch left (as Kafka's does): those whose data the pass removed are not needed."""
    with open_engine(tmp_path, clock) as engine:
        engine.create_topic("t", 1, configs=COMPACT)
        log = engine.partition_log("t", 0)
        producers = [Producer(log, pid) for pid in (1, 2, 3)]
        for round_ in range(6):
            for producer in producers:
                producer.send(f"k{round_ % 3}", f"p{producer.producer_id}-r{round_}")
            for producer in producers:
                producer.end(commit=(round_ + producer.producer_id) % 2 == 0)
        fill(log, 8)
        log.roll()
        engine.clean_logs()
        view = committed_view(log)
        entries = txn_index_entries(log.directory)
        assert view and all(b"aborted" not in (v or b"") for _o, _k, v in view)
        directory = log.directory
    for name in ("recovery-point-offset-checkpoint", ".kafka_cleanshutdown"):
        (tmp_path / name).unlink(missing_ok=True)
    for snapshot in directory.glob("*.snapshot"):
        snapshot.unlink()
    with open_engine(tmp_path, clock) as engine:
        log = engine.partition_log("t", 0)
        assert committed_view(log) == view
        rebuilt = txn_index_entries(log.directory)
        assert {(pid, last) for _v, pid, _f, last, _lso in rebuilt} <= {(e[1], e[3]) for e in entries}
        for producer in producers:
            producer.log = log
            producer.send("after", "reopen")  # in sequence: no OutOfOrderSequenceError
            producer.end(commit=True)
