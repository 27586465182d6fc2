"""The log cleaner's view of stored records: where each lies, and a digest of each key, computed for a chunk of
batches at once.

- `record_layout(buf, table)` takes the v2 data batches of a BatchTable (batch_chain.batch_table; control batches
  and legacy entries dropped by the caller) and returns a RecordLayout: for every record of those batches, in
  batch order, its batch row, absolute offset, CreateTime, offset delta, key (start, length), value length, and
  where the part from its key length on starts and ends in `data` (the batches' records sections, decompressed),
  so a rewriter copies that part as is and rewrites the deltas before it. Empty batches hold no records. Framing
  that does not add up, or a key or value length that does not fit, raises CorruptRecordError naming the batch's
  byte position.
- `key_digest_array(layout, rows)` / `key_digests(layout, rows)`: a 16-byte digest of the key of each record at
  `rows` (all with keys), as a (n, 2) uint64 array or as `bytes` (dict keys). Equal keys give equal digests; for n
  distinct keys a collision has a probability of about n^2 / 2^129. It stands in for the MD5 of Kafka's offset map
  (storage/kafka/offset_map.py).

Both work with numpy over all records or keys of the chunk at once: framing walks records one by one only in
the few batches where that is cheaper (record_framing.frame_records), and the digests take a Python step per
8-byte word of the longest key, not per key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tidelog.codec.batch_table import BatchTable, table_sections
from tidelog.codec.record_batch import COMPRESSION_MASK
from tidelog.codec.record_framing import (
    MIN_RECORD_BYTES,
    eight_byte_windows,
    frame_records,
    record_prefix,
    varints,
)
from tidelog.errors import CorruptRecordError


@dataclass(slots=True)
class RecordLayout:
    """Where each record of some v2 data batches lies, for a rewriter (the log cleaner) that keeps some records
    and re-encodes them: the part from the key length on is copied as is, the deltas before it are rewritten.

    Positions index `data` (the batches' record sections, decompressed). `batch` is the row of each record's
    batch in the table given to `record_layout`."""

    data: bytes | bytearray | memoryview
    batch: np.ndarray  # int64
    offset: np.ndarray  # int64, absolute
    timestamp: np.ndarray  # int64: baseTimestamp + timestampDelta (the record's CreateTime)
    offset_delta: np.ndarray  # int64
    key_start: np.ndarray  # int64
    key_length: np.ndarray  # int64, -1 = null key
    value_length: np.ndarray  # int64, -1 = null value (a tombstone)
    tail_start: np.ndarray  # int64: the keyLength varint
    record_end: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.offset)


def record_layout(buf: bytes | bytearray | memoryview, table: BatchTable) -> RecordLayout:
    """The RecordLayout of every record of the v2 data batches in `table` (empty batches hold none)."""
    header = table.header
    counts = header["records_count"].astype(np.int64)
    rows = np.nonzero(counts > 0)[0]
    z = np.zeros(0, dtype=np.int64)
    if len(rows) == 0:
        return RecordLayout(b"", z, z, z, z, z, z, z, z, z)
    table, header, counts = table.take(rows), header[rows], counts[rows]
    positions = table.position
    codecs = header["attributes"].astype(np.int64) & COMPRESSION_MASK
    data, starts, ends = table_sections(buf, table, codecs)
    if (counts * MIN_RECORD_BYTES > ends - starts).any():
        where = int(np.argmax(counts * MIN_RECORD_BYTES > ends - starts))
        raise CorruptRecordError(f"batch at byte {int(positions[where])} declares more records than it has bytes for")
    arr = np.frombuffer(data, dtype=np.uint8)
    body, length = frame_records(data, arr, starts, ends, counts, positions)
    record_end = body + length
    timestamp_delta, offset_delta, key_length, key_start = record_prefix(arr, body)
    tail_start = key_start - _varint_size(key_length)
    value_at = key_start + np.maximum(key_length, 0)
    value_length, _ = varints(arr, value_at, in_bounds=True)
    bad = (value_at >= record_end) | (key_length < -1) | (value_length < -1)
    if bad.any():
        where = int(positions[np.repeat(np.arange(len(counts)), counts)[np.argmax(bad)]])
        raise CorruptRecordError(f"batch at byte {where}: a record's key or value does not fit its length")
    return RecordLayout(
        data,
        np.repeat(rows, counts),
        np.repeat(header["base_offset"].astype(np.int64), counts) + offset_delta,
        np.repeat(header["base_timestamp"].astype(np.int64), counts) + timestamp_delta,
        offset_delta.astype(np.int64),
        key_start.astype(np.int64),
        key_length.astype(np.int64),
        value_length.astype(np.int64),
        tail_start.astype(np.int64),
        record_end,
    )


_P1 = np.uint64(0x9E3779B97F4A7C15)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser: every input bit affects every output bit."""
    h = h ^ (h >> np.uint64(33))
    h = h * _M1
    h = h ^ (h >> np.uint64(33))
    h = h * _M2
    return h ^ (h >> np.uint64(33))


def key_digests(layout: RecordLayout, rows: np.ndarray) -> list[bytes]:
    """key_digest_array as one 16-byte `bytes` per key (dict keys)."""
    return key_digest_array(layout, rows).view("V16").ravel().tolist()


def key_digest_array(layout: RecordLayout, rows: np.ndarray) -> np.ndarray:
    """A 16-byte digest (two uint64 per row) of the key of each record at `rows` (all with keys), for all at once.

    Kafka's cleaner maps MD5(key); this is a 128-bit non-cryptographic hash (two independent 64-bit lanes fed the
    key 8 bytes at a time, then the length, then MurmurHash3's finaliser), computed with numpy over all keys: a
    Python step per 8-byte word position, not per key. Equal keys give equal digests; for n distinct keys a
    collision has a probability of about n^2 / 2^129."""
    if len(rows) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    arr = np.frombuffer(layout.data, dtype=np.uint8)
    starts = layout.key_start[rows]
    lengths = layout.key_length[rows].astype(np.uint64)
    h1 = np.full(len(rows), 0x243F6A8885A308D3, dtype=np.uint64)
    h2 = np.full(len(rows), 0x13198A2E03707344, dtype=np.uint64)
    longest = int(lengths.max()) if len(lengths) else 0
    for word in range(0, longest, 8):
        live = np.nonzero(lengths > word)[0]
        if len(live) < len(lengths):
            w = eight_byte_windows(arr, starts[live] + word)
            remaining = lengths[live] - np.uint64(word)
        else:
            w = eight_byte_windows(arr, starts + word)
            remaining = lengths - np.uint64(word)
        short = remaining < 8  # the key's last word: bytes after the key do not count
        if short.any():
            shift = np.where(short, (np.uint64(8) - np.minimum(remaining, np.uint64(8))) * np.uint64(8), np.uint64(0))
            w = (w >> shift) << shift
        a, b = h1[live] ^ w, h2[live] ^ w
        h1[live] = ((a << np.uint64(31)) | (a >> np.uint64(33))) * _P1
        h2[live] = ((b << np.uint64(27)) | (b >> np.uint64(37))) * _P2
    h1 = _fmix64(h1 ^ lengths)
    h2 = _fmix64(h2 ^ (lengths * _P3))
    return np.stack([h1, h2], axis=1)


def _varint_size(value: np.ndarray) -> np.ndarray:
    """Bytes of the zig-zag varint encoding of each (int32) value."""
    zigzag = ((value.astype(np.int64) << 1) ^ (value.astype(np.int64) >> 63)).astype(np.uint64)
    size = np.ones(len(value), dtype=np.int64)
    for k in range(1, 5):
        size += zigzag >= np.uint64(1 << (7 * k))
    return size
