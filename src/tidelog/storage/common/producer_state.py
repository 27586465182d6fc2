"""Producer state of one partition, and its `<offset>.snapshot` files (Kafka's ProducerStateManager).

Per producer id the log keeps the epoch and the metadata of its last 5 batches (the client's maximum
in flight), so a retried batch is recognised and answered with its original offsets instead of being
written twice. Rules (Kafka's ProducerAppendInfo): an older epoch is fenced (INVALID_PRODUCER_EPOCH);
a new epoch must start at sequence 0; within an epoch each batch must continue the last sequence
(else OUT_OF_ORDER_SEQUENCE); an unknown producer may start anywhere (KIP-360).

Transactions (KIP-98): a producer's first transactional batch opens its transaction at that batch's first offset
(`current_txn_first_offset`); until an end-transaction marker completes it (`complete_txn`), a non-transactional
batch of that producer is refused (INVALID_TXN_STATE). A marker with an older producer epoch is refused
(INVALID_PRODUCER_EPOCH), one with an older coordinator epoch than the producer's last marker too
(TRANSACTION_COORDINATOR_FENCED); a marker for a producer without an open transaction only updates its epochs.
The open transactions of the partition are kept by first offset (`ongoing`); a completed one stays "unreplicated"
until the high watermark passes its marker. The first unstable offset, the smallest first offset of both, bounds
the last stable offset (what read_committed readers may read). A producer with an open transaction never expires.
Replaying the log (recovery, a follower) checks nothing: the leader did.

Snapshot file, big-endian (non-flexible version 1):

    version i16 = 1 | crc u32 (CRC-32C of the bytes after it) | entryCount i32
    entry: producerId i64 | epoch i16 | lastSequence i32 | lastOffset i64 | offsetDelta i32
           | timestamp i64 | coordinatorEpoch i32 | currentTxnFirstOffset i64

Only each producer's latest batch is stored; the rest of the 5-batch window is rebuilt by replaying
the log after the snapshot offset (the number in the file name, exclusive). `coordinatorEpoch` is that of the
producer's last marker (-1: none), `currentTxnFirstOffset` the first offset of its open transaction (-1: none):
loading a snapshot reopens those transactions.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from tidelog.codec.record_batch import NO_SEQUENCE, BatchHeader
from tidelog.errors import (
    CorruptCheckpointError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from tidelog.storage.api import ProducerSummary

log = logging.getLogger("tidelog.storage")

SNAPSHOT_SUFFIX = ".snapshot"
BATCHES_TO_RETAIN = 5
_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
_VERSION = 1
INT_MAX = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


class CompletedTxn(NamedTuple):
    """A transaction an end-transaction marker completed: `last_offset` is the marker's offset; `last_stable_offset`
    the partition's once it completed (the first offset of the earliest other open transaction, else the offset
    after the marker), what an aborted one's transaction-index entry records."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool
    last_stable_offset: int


@dataclass
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_TO_RETAIN))
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE


def _in_sequence(last_sequence: int, next_first: int) -> bool:
    return next_first == last_sequence + 1 or (next_first == 0 and last_sequence == INT_MAX)


class ProducerStateManager:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.producers: dict[int, ProducerEntry] = {}
        self.unsynced: dict[int, Path] = {}  # snapshots written without fsync (take_snapshot(sync=False)), by offset
        self.ongoing: OrderedDict[int, int] = OrderedDict()  # producer id -> first offset of its open transaction
        self.unreplicated: list[CompletedTxn] = []  # completed, the marker not yet below the high watermark

    def summaries(self) -> list[ProducerSummary]:
        """Every producer held, by id (the caller holds its partition's lock)."""
        return [
            ProducerSummary(
                entry.producer_id,
                entry.epoch,
                entry.last_sequence,
                entry.last_timestamp,
                entry.coordinator_epoch,
                entry.current_txn_first_offset,
            )
            for _pid, entry in sorted(self.producers.items())
        ]

    # --- the append path ------------------------------------------------------------------------------------------

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """For a client batch with a producer id: the original metadata if it is a retried duplicate,
        None if it may be appended; raises on a fenced epoch or a sequence gap."""
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None
        if header.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than the current {entry.epoch}"
            )
        if header.base_sequence == NO_SEQUENCE:
            self._check_txn_state(entry, header)
            return None
        if header.producer_epoch == entry.epoch:
            for batch in entry.batches:
                if batch.first_sequence == header.base_sequence and batch.last_sequence == header.last_sequence:
                    return batch
        if header.producer_epoch > entry.epoch:
            if header.base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {header.producer_id} starts epoch {header.producer_epoch} at sequence "
                    f"{header.base_sequence}; a new epoch must start at 0"
                )
        elif entry.batches and not _in_sequence(entry.last_sequence, header.base_sequence):
            raise OutOfOrderSequenceError(
                f"producer {header.producer_id} sent sequence {header.base_sequence} after {entry.last_sequence}"
            )
        self._check_txn_state(entry, header)
        return None

    @staticmethod
    def _check_txn_state(entry: ProducerEntry, header: BatchHeader) -> None:
        if entry.current_txn_first_offset >= 0 and not header.is_transactional:
            raise InvalidTxnStateError(
                f"producer {entry.producer_id} sent a non-transactional batch while its transaction from offset "
                f"{entry.current_txn_first_offset} is open"
            )

    def update(self, header: BatchHeader, first_offset: int, timestamp: int) -> None:
        """Record an appended data batch of a producer (called for client appends and while replaying the log); a
        transactional one opens the producer's transaction at `first_offset` unless one is open."""
        if header.producer_id < 0:
            return
        entry = self._entry(header.producer_id, header.producer_epoch)
        if header.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = first_offset
            self.ongoing[header.producer_id] = first_offset
        if header.base_sequence != NO_SEQUENCE:
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence,
                    header.last_sequence,
                    first_offset + header.last_offset_delta,
                    header.last_offset_delta,
                    timestamp,
                )
            )
        entry.last_timestamp = max(entry.last_timestamp, timestamp)

    def _entry(self, producer_id: int, epoch: int) -> ProducerEntry:
        """The producer's entry (a new one if unknown) at `epoch`: another epoch than its own forgets its batches
        (Kafka's maybeUpdateProducerEpoch), not its open transaction or coordinator epoch."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        elif entry.epoch != epoch:
            entry.epoch = epoch
            entry.batches.clear()
        return entry

    # --- transactions -----------------------------------------------------------------------------------------

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Raise if the leader may not write this end-transaction marker (see the module's docstring)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"transaction marker of producer {producer_id} has epoch {producer_epoch}, older than the current "
                f"{entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"transaction marker of producer {producer_id} has coordinator epoch {coordinator_epoch} (zombie), "
                f"{entry.coordinator_epoch} (current)"
            )

    def complete_txn(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        marker_offset: int,
        timestamp: int,
    ) -> CompletedTxn | None:
        """Apply an end-transaction marker written at `marker_offset`: the producer's open transaction, if any, is
        complete (returned; None without one) and the producer takes the marker's epochs."""
        entry = self._entry(producer_id, producer_epoch)
        completed = None
        if entry.current_txn_first_offset >= 0:
            last_stable = next((first for pid, first in self.ongoing.items() if pid != producer_id), marker_offset + 1)
            completed = CompletedTxn(
                producer_id, entry.current_txn_first_offset, marker_offset, not commit, last_stable
            )
            self.ongoing.pop(producer_id, None)
            self.unreplicated.append(completed)
        entry.coordinator_epoch = coordinator_epoch
        entry.current_txn_first_offset = -1
        entry.last_timestamp = timestamp
        return completed

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset read_committed readers may not read yet whatever the high watermark (None: none): the
        earliest open transaction's first offset, or that of a completed one whose marker is not yet below
        `high_watermark` (those whose marker is are forgotten here)."""
        if self.unreplicated and self.unreplicated[0].last_offset < high_watermark:
            self.unreplicated = [txn for txn in self.unreplicated if txn.last_offset >= high_watermark]
        first = next(iter(self.ongoing.values()), None)
        for txn in self.unreplicated:
            if first is None or txn.first_offset < first:
                first = txn.first_offset
        return first

    def _reopen_transactions(self) -> None:
        """After loading a snapshot: the open transactions its entries name, by first offset."""
        open_txns = sorted(
            (e.current_txn_first_offset, pid) for pid, e in self.producers.items() if e.current_txn_first_offset >= 0
        )
        self.ongoing = OrderedDict((pid, first) for first, pid in open_txns)
        self.unreplicated = []

    def remove_expired(self, now_ms: int, expiration_ms: int) -> None:
        """Forget producers idle for `expiration_ms`, except those with an open transaction."""
        expired = [
            pid
            for pid, e in self.producers.items()
            if e.current_txn_first_offset < 0 and now_ms - e.last_timestamp >= expiration_ms
        ]
        for pid in expired:
            del self.producers[pid]

    # --- snapshots --------------------------------------------------------------------------------------------

    def snapshot_files(self) -> list[tuple[int, Path]]:
        try:
            names = os.listdir(self.directory)  # not Path.glob, which stats every name (opening many partitions)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            stem = name[: -len(SNAPSHOT_SUFFIX)]
            if name.endswith(SNAPSHOT_SUFFIX) and len(stem) == 20 and stem.isdigit():
                found.append((int(stem), self.directory / name))
        return sorted(found)

    def take_snapshot(self, end_offset: int, *, keep: int = 2, sync: bool = True) -> None:
        """Write `<end_offset>.snapshot` (tmp + fsync + rename) and delete all but the newest `keep`.

        With sync=False the fsync is left to the caller (a roll leaves it to the flush of the rolled segment, as
        Kafka's roll does): the snapshot stays in `unsynced` until the caller has fsynced it (`mark_synced`).
        Until then a crash may leave it torn; loading then deletes it (its CRC fails) and replays from an older
        one."""
        self.write_snapshot(end_offset, self.snapshot_bytes(), keep=keep, sync=sync)

    def snapshot_bytes(self) -> bytes:
        """The state as a snapshot file's bytes (the caller keeps appends out while this runs)."""
        entries = [
            _ENTRY.pack(
                e.producer_id,
                e.epoch,
                e.last_sequence,
                e.batches[-1].last_offset if e.batches else -1,
                e.batches[-1].offset_delta if e.batches else 0,
                e.last_timestamp,
                e.coordinator_epoch,
                e.current_txn_first_offset,
            )
            for e in self.producers.values()
        ]
        body = struct.pack(">i", len(entries)) + b"".join(entries)
        return struct.pack(">h", _VERSION) + struct.pack(">I", crc32c(body)) + body

    def write_snapshot(self, end_offset: int, data: bytes, *, keep: int = 2, sync: bool = True) -> None:
        """take_snapshot's file work, for bytes taken earlier by `snapshot_bytes` (appends may go on meanwhile)."""
        path = self.directory / f"{end_offset:020d}{SNAPSHOT_SUFFIX}"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
        if sync:
            self.unsynced.pop(end_offset, None)
        else:
            self.unsynced[end_offset] = path
        for offset, old in self.snapshot_files()[:-keep]:
            old.unlink(missing_ok=True)
            self.unsynced.pop(offset, None)

    def delete_snapshots_after(self, end_offset: int) -> None:
        """The log was cut at `end_offset`: snapshots of offsets beyond it describe batches that are gone."""
        for offset, path in self.snapshot_files():
            if offset > end_offset:
                path.unlink(missing_ok=True)
                self.unsynced.pop(offset, None)

    def truncate_fully(self) -> None:
        """The log starts over empty: every producer is forgotten and every snapshot deleted."""
        self.producers = {}
        self._reopen_transactions()
        self.delete_snapshots_after(-1)

    def unsynced_snapshots(self, up_to_offset: int) -> list[tuple[int, Path]]:
        """The snapshots written without fsync at offsets up to `up_to_offset`, oldest first; once the caller has
        fsynced them (or found them deleted meanwhile), `mark_synced` takes them off the list."""
        return sorted((offset, path) for offset, path in self.unsynced.items() if offset <= up_to_offset)

    def mark_synced(self, offsets: Iterable[int]) -> None:
        for offset in offsets:
            self.unsynced.pop(offset, None)

    def load_latest_snapshot(self, log_end_offset: int) -> int:
        """Load the newest readable snapshot at or below the log end; returns its offset (0 if none).

        Snapshots beyond the log end (the log was truncated) and unreadable ones are deleted."""
        self.delete_snapshots_after(log_end_offset)
        return self.load_snapshot_at_or_below(log_end_offset)

    def load_snapshot_at_or_below(self, offset: int) -> int:
        """Load the newest readable snapshot at or below `offset`, leaving later ones; returns its offset (0 and no
        producers if none). Unreadable ones are deleted."""
        for snapshot_offset, path in reversed(self.snapshot_files()):
            if snapshot_offset > offset:
                continue
            try:
                self.producers = {e.producer_id: e for e in read_snapshot(path)}
                self._reopen_transactions()
                return snapshot_offset
            except CorruptCheckpointError as exc:
                log.warning("%s; deleting it and replaying the log instead", exc)
                path.unlink(missing_ok=True)
        self.producers = {}
        self._reopen_transactions()
        return 0


def read_snapshot(path: Path) -> Iterable[ProducerEntry]:
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        raise CorruptCheckpointError(f"producer snapshot {path} is truncated ({len(data)} bytes)")
    version, crc, count = _HEADER.unpack_from(data, 0)
    if version != _VERSION:
        raise CorruptCheckpointError(f"producer snapshot {path} has unknown version {version}")
    if crc32c(data[6:]) != crc:
        raise CorruptCheckpointError(f"producer snapshot {path} fails its CRC check")
    if count < 0 or len(data) != _HEADER.size + count * _ENTRY.size:
        raise CorruptCheckpointError(f"producer snapshot {path} declares {count} entries but has {len(data)} bytes")
    entries = []
    for fields in _ENTRY.iter_unpack(data[_HEADER.size :]):
        producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp, coordinator_epoch, txn_first = fields
        entry = ProducerEntry(
            producer_id,
            epoch,
            last_timestamp=timestamp,
            coordinator_epoch=coordinator_epoch,
            current_txn_first_offset=txn_first,
        )
        if last_sequence != NO_SEQUENCE and last_offset >= 0:
            first_sequence = (last_sequence - offset_delta) & 0x7FFFFFFF
            entry.batches.append(BatchMetadata(first_sequence, last_sequence, last_offset, offset_delta, timestamp))
        entries.append(entry)
    return entries
