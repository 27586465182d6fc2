"""Records as columns: the form a columnar engine (Spark through Arrow) and RocketMQ's batch encoder take records in.

- `RecordColumns` holds records as parallel numpy arrays: offset, timestamp, timestamp type, and keys, values and
  header keys and values as (start, length) pairs into one buffer `data` (length -1: null), so a consumer gathers
  them without a per-record copy in Python. Headers are flat: record i owns `header_count[i]` consecutive entries.
- `from_records(records)` builds the same columns from decoded `Record`s (legacy v0/v1 entries, client messages),
  copying keys, values and headers once into a new buffer.

The decoders that make columns straight from batch bytes are batch_columns.decode_v2 (stored batches, for the
Spark reader) and rocketmq_columns.decode_batch (one produced batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidelog.codec.record_batch import Record


@dataclass(slots=True)
class RecordColumns:
    """Records as parallel arrays. Keys, values and header parts are (start, length) into `data`; length -1 = null.

    Header arrays are flat: record i owns `header_count[i]` consecutive entries, in record order.
    """

    data: bytes | bytearray | memoryview
    offset: np.ndarray  # int64
    timestamp: np.ndarray  # int64, milliseconds
    timestamp_type: np.ndarray  # int32: -1 none, 0 CreateTime, 1 LogAppendTime
    key_start: np.ndarray  # int64
    key_length: np.ndarray  # int64
    value_start: np.ndarray
    value_length: np.ndarray
    header_count: np.ndarray  # int64
    header_key_start: np.ndarray
    header_key_length: np.ndarray
    header_value_start: np.ndarray
    header_value_length: np.ndarray

    def __len__(self) -> int:
        return len(self.offset)

    @classmethod
    def empty(cls) -> RecordColumns:
        z = np.zeros(0, dtype=np.int64)
        return cls(b"", z, z, z.astype(np.int32), z, z, z, z, z, z, z, z, z)

    def rows(self, start: int, stop: int) -> RecordColumns:
        """Records [start, stop) as views (their headers come along)."""
        if start == 0 and stop >= len(self):
            return self
        first = int(self.header_count[:start].sum()) if len(self.header_key_start) else 0
        last = first + int(self.header_count[start:stop].sum()) if len(self.header_key_start) else 0
        return RecordColumns(
            self.data,
            self.offset[start:stop],
            self.timestamp[start:stop],
            self.timestamp_type[start:stop],
            self.key_start[start:stop],
            self.key_length[start:stop],
            self.value_start[start:stop],
            self.value_length[start:stop],
            self.header_count[start:stop],
            self.header_key_start[first:last],
            self.header_key_length[first:last],
            self.header_value_start[first:last],
            self.header_value_length[first:last],
        )

    def select(self, mask: np.ndarray) -> RecordColumns:
        """The records where `mask` is true (their headers come along)."""
        if mask.all():
            return self
        flat = len(self.header_key_start) > 0
        header_mask = np.repeat(mask, self.header_count) if flat else None

        def headers(a: np.ndarray) -> np.ndarray:
            return a[header_mask] if header_mask is not None else a

        return RecordColumns(
            self.data,
            self.offset[mask],
            self.timestamp[mask],
            self.timestamp_type[mask],
            self.key_start[mask],
            self.key_length[mask],
            self.value_start[mask],
            self.value_length[mask],
            self.header_count[mask],
            headers(self.header_key_start),
            headers(self.header_key_length),
            headers(self.header_value_start),
            headers(self.header_value_length),
        )


def from_records(records: Sequence[Record], timestamp_types: Sequence[int] | int = 0) -> RecordColumns:
    """The same columns built from decoded records: keys, values and headers copied once into one buffer."""
    n = len(records)
    if n == 0:
        return RecordColumns.empty()
    parts: list[bytes] = []
    cursor = 0

    def place(blob: bytes | None) -> tuple[int, int]:
        nonlocal cursor
        if blob is None:
            return cursor, -1
        parts.append(blob)
        start = cursor
        cursor += len(blob)
        return start, len(blob)

    key_start = np.empty(n, dtype=np.int64)
    key_length = np.empty(n, dtype=np.int64)
    value_start = np.empty(n, dtype=np.int64)
    value_length = np.empty(n, dtype=np.int64)
    header_count = np.empty(n, dtype=np.int64)
    flat: list[tuple[int, int, int, int]] = []
    for i, record in enumerate(records):
        key_start[i], key_length[i] = place(record.key)
        value_start[i], value_length[i] = place(record.value)
        header_count[i] = len(record.headers)
        for header_key, header_value in record.headers:
            flat.append((*place(header_key.encode("utf-8", "surrogateescape")), *place(header_value)))
    headers = np.array(flat, dtype=np.int64).reshape(-1, 4)
    if isinstance(timestamp_types, int):
        types = np.full(n, timestamp_types, dtype=np.int32)
    else:
        types = np.asarray(timestamp_types, dtype=np.int32)
    return RecordColumns(
        b"".join(parts),
        np.fromiter((r.offset for r in records), dtype=np.int64, count=n),
        np.fromiter((-1 if r.timestamp_ms is None else r.timestamp_ms for r in records), dtype=np.int64, count=n),
        types,
        key_start,
        key_length,
        value_start,
        value_length,
        header_count,
        headers[:, 0].copy(),
        headers[:, 1].copy(),
        headers[:, 2].copy(),
        headers[:, 3].copy(),
    )
