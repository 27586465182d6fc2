"""read_committed over log files: a partition's last stable offset and aborted transactions, read-only.

A broker keeps both in memory (its producer state) and answers a read_committed Fetch from them; the path reader
cannot ask it, so it derives them from what the Kafka engine (tidelog's or Kafka's) leaves in the partition
directory, writing nothing and taking no lock:

- **The last stable offset** (LSO): the first offset of the earliest transaction still open, else the readable end
  (the log end, or a cluster replica's checkpointed high watermark), raised to the log start as Kafka raises it.
  The open transactions are those of the newest readable producer snapshot `<offset>.snapshot` at or below the
  readable end (storage/common/producer_state.py: each producer's `currentTxnFirstOffset`), carried forward over the
  batch headers from the snapshot's offset to the readable end: a producer's transactional batch opens its
  transaction, its end-transaction marker (a control batch of that producer) closes it. Without a snapshot the walk
  starts at the log start. A broker writes a snapshot at every segment roll and at shutdown, so the walk covers at
  most the active segment; `StableOffsets` (one per planning backend, so one per streaming query) keeps each
  partition's state between calls and walks only what was appended since.
- **An ABORT marker counts once its `.txnindex` entry is visible.** The broker appends the marker to the log and
  then the entry; a reader in between would see the transaction closed yet find no aborted transaction to drop.
  Until the entry shows, the walk stops at that marker (the transaction counts as open, the LSO stays below it).
- **The aborted transactions** of a range [start, end) below the LSO: the `.txnindex` entries (format in
  storage/kafka/txn_index.py) whose marker is at or after `start` and whose first offset is below `end`, from the
  segment holding `start` on, until an entry's lastStableOffset reaches `end` (Kafka's
  collectAbortedTransactions). `aborted_mask` marks the transactional batches to drop: those of an aborted
  transaction's producer from its first offset to its marker, as a Kafka consumer drops them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tidelog.codec.batch_table import BatchTable
from tidelog.codec.control_record import read_end_txn_marker
from tidelog.codec.record_batch import read_header
from tidelog.errors import CorruptCheckpointError, LogFilesError
from tidelog.spark.logfiles import PartitionFiles
from tidelog.storage.common.aborted_txn import AbortedTxn, parse_entries
from tidelog.storage.common.producer_state import SNAPSHOT_SUFFIX, read_snapshot
from tidelog.storage.kafka.txn_index import SUFFIX as TXN_INDEX_SUFFIX

WALK_CHUNK_BYTES = 4 << 20


def read_txn_index(path: Path) -> list[AbortedTxn]:
    """A `.txnindex` file's whole entries (none when the segment has no aborted transaction yet)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LogFilesError(f"{path}: the transaction index cannot be read: {exc.strerror}") from exc
    return parse_entries(data, path)


def aborted_transactions(files: PartitionFiles, start: int, end: int) -> list[AbortedTxn]:
    """The aborted transactions a read of [start, end) must drop (Kafka's collectAbortedTransactions)."""
    found: list[AbortedTxn] = []
    bases = files.segment_bases()
    first = max(0, int(np.searchsorted(np.array(bases, dtype=np.int64), start, side="right")) - 1)
    for base in bases[first:]:
        for entry in read_txn_index(files.directory / f"{base:020d}{TXN_INDEX_SUFFIX}"):
            if entry.last_offset >= start and entry.first_offset < end:
                found.append(entry)
            if entry.last_stable_offset >= end:
                return found
    return found


def aborted_mask(table: BatchTable, aborted: list[AbortedTxn]) -> np.ndarray:
    """True for each batch of `table` that belongs to one of the `aborted` transactions."""
    mask = np.zeros(len(table), dtype=bool)
    if not aborted:
        return mask
    transactional = table.is_transactional & ~table.is_control
    producer = table.header["producer_id"].astype(np.int64)
    base = table.base_offset
    for txn in aborted:
        mask |= transactional & (producer == txn.producer_id) & (base >= txn.first_offset) & (base <= txn.last_offset)
    return mask


@dataclass
class _Walk:
    """Where one partition's walk got to: the offset it continues from, and the transactions open there."""

    position: int
    open: dict[int, int] = field(default_factory=dict)  # producer id -> first offset of its open transaction


class StableOffsets:
    """Last stable offsets of log-file partitions, remembered per partition between calls (see the module)."""

    def __init__(self) -> None:
        self._walks: dict[tuple[str, int], _Walk] = {}

    def last_stable_offset(self, files: PartitionFiles) -> int:
        start = files.log_start_offset()
        end = files.readable_end_offset()
        key = (files.topic, files.partition)
        walk = self._walks.get(key)
        if walk is None or walk.position > end or walk.position < start:  # new, truncated, or retention passed it
            walk = _from_snapshot(files, start, end)
        _advance(files, walk, end)
        self._walks[key] = walk
        first_open = min(walk.open.values(), default=end)
        return min(max(first_open, start), end)


def _from_snapshot(files: PartitionFiles, start: int, end: int) -> _Walk:
    """The open transactions of the newest readable snapshot at or below `end` (none: the log start, none open)."""
    snapshots = []
    with contextlib.suppress(FileNotFoundError):
        for path in files.directory.iterdir():
            stem = path.name[: -len(SNAPSHOT_SUFFIX)]
            if path.name.endswith(SNAPSHOT_SUFFIX) and len(stem) == 20 and stem.isdigit():
                snapshots.append((int(stem), path))
    for offset, path in sorted(snapshots, reverse=True):
        if offset > end or offset < start:
            continue
        try:
            entries = read_snapshot(path)
        except (CorruptCheckpointError, OSError):  # torn by a crash, or deleted by the broker since listed
            continue
        return _Walk(
            offset, {e.producer_id: e.current_txn_first_offset for e in entries if e.current_txn_first_offset >= 0}
        )
    return _Walk(start)


def _advance(files: PartitionFiles, walk: _Walk, end: int) -> None:
    """Carry `walk` over the batches from its position to `end` (see the module docstring)."""
    if walk.position >= end:
        return
    txn_indexes: dict[int, set[int]] = {}  # segment base -> marker offsets of its visible index entries
    for chunk in files.read(walk.position, end, fail_on_data_loss=False, chunk_bytes=WALK_CHUNK_BYTES):
        table = chunk.table
        base = table.base_offset
        keep = (base >= walk.position) & (base < end) & (table.magic == 2)
        producer = table.header["producer_id"].astype(np.int64)
        relevant = keep & (producer >= 0) & table.is_transactional
        for i in np.nonzero(relevant)[0].tolist():
            pid = int(producer[i])
            offset = int(base[i])
            if not table.is_control[i]:
                walk.open.setdefault(pid, offset)
                continue
            if pid in walk.open and not _marker_visible(files, chunk.data, int(table.position[i]), offset, txn_indexes):
                walk.position = offset  # the abort's index entry is not written yet: look again next time
                return
            walk.open.pop(pid, None)
        walk.position = max(walk.position, int(table.last_offset[-1]) + 1)
    walk.position = max(walk.position, end)  # every batch below the readable end was walked


def _marker_visible(
    files: PartitionFiles, data: bytes | memoryview, position: int, offset: int, txn_indexes: dict[int, set[int]]
) -> bool:
    """A COMMIT marker always; an ABORT marker once the `.txnindex` of its segment holds its entry."""
    marker = read_end_txn_marker(data, position, read_header(data, position))
    if marker is None or marker.commit:
        return True
    bases = files.segment_bases()
    segment = bases[max(0, int(np.searchsorted(np.array(bases, dtype=np.int64), offset, side="right")) - 1)]
    if segment not in txn_indexes:
        path = files.directory / f"{segment:020d}{TXN_INDEX_SUFFIX}"
        txn_indexes[segment] = {entry.last_offset for entry in read_txn_index(path)}
    return offset in txn_indexes[segment]
