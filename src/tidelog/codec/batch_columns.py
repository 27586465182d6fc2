"""Columnar decoding of stored record batches for the Spark reader: bytes in, numpy columns out, no per-record
Python objects.

`decode_v2(buf, table)` decodes every record of the batches of a BatchTable (batch_chain.batch_table) at once.
Records inside a batch are varint-framed, so where record i+1 starts depends on record i's length; that chain is
the only sequential part (record_framing.frame_records: runs of equal-sized records verified with a few vectorised
operations, other batches walked in lockstep or, when few are left, by a tight Python loop). Every field after the
length is then decoded for all records together; keys, values and headers come back as (start, length) pairs into
one buffer (RecordColumns), ready for Arrow to gather without a per-record copy in Python.

Contract: `decode_v2` takes complete v2 data batches (callers drop control batches and legacy entries, and check
CRCs when they want to) and returns their records in batch order; empty batches (left by compaction) contribute
none. Compressed batches are decompressed once per batch. Offsets are baseOffset + offsetDelta; timestamps
baseTimestamp + timestampDelta, or the batch's maxTimestamp for a LogAppendTime batch. With with_headers=False
the header columns come back empty and every header count 0 (headers are then not decoded, only bounded by their
record's length). Framing that does not add up raises CorruptRecordError naming the batch's byte position in
`buf`.
"""

from __future__ import annotations

import numpy as np

from tidelog.codec.batch_table import BatchTable, table_sections
from tidelog.codec.record_batch import COMPRESSION_MASK, TIMESTAMP_TYPE_MASK
from tidelog.codec.record_columns import RecordColumns
from tidelog.codec.record_framing import (
    MIN_RECORD_BYTES,
    PADDING,
    decode_headers,
    frame_records,
    record_prefix,
    varints,
)
from tidelog.errors import CorruptRecordError


def decode_v2(buf: bytes | bytearray | memoryview, table: BatchTable, *, with_headers: bool = True) -> RecordColumns:
    """Columns of every record of the v2 data batches in `table` (which lie in `buf`), in batch order."""
    header = table.header
    counts = header["records_count"].astype(np.int64)
    keep = counts > 0  # an empty batch (left by compaction) holds nothing to decode
    if not keep.all():
        table, header, counts = table.take(keep), header[keep], counts[keep]
    if len(table) == 0:
        return RecordColumns.empty()
    positions = table.position
    attributes = header["attributes"].astype(np.int64)
    codecs = attributes & COMPRESSION_MASK
    data, starts, ends = table_sections(buf, table, codecs)
    # A record takes at least 7 bytes (length, attributes, timestamp and offset deltas, key and value lengths,
    # header count): a count that cannot fit is damage, caught before anything is sized by it.
    too_many = counts * MIN_RECORD_BYTES > ends - starts
    if too_many.any():
        where = int(np.argmax(too_many))
        raise CorruptRecordError(
            f"batch at byte {int(positions[where])} declares {int(counts[where])} records in "
            f"{int(ends[where] - starts[where])} bytes"
        )
    arr = np.frombuffer(data, dtype=np.uint8)
    if len(arr) == PADDING:
        raise CorruptRecordError(f"batch at byte {int(positions[0])} declares records but holds no bytes")
    body, length = frame_records(data, arr, starts, ends, counts, positions)
    record_end = body + length
    batch_of = np.repeat(np.arange(len(counts)), counts)

    def check(p: np.ndarray, what: str) -> None:
        bad = p > record_end
        if bad.any():
            index = int(np.argmax(bad))
            raise CorruptRecordError(
                f"batch at byte {int(positions[batch_of[index]])}: a record is shorter than its {what}"
            )

    # attributes (1 byte, unused), timestampDelta, offsetDelta, keyLength: one 8-byte read per record decodes all
    # three when each is 1 or 2 bytes long (the usual case); the others take the general path.
    timestamp_delta, offset_delta, key_length, p = record_prefix(arr, body)
    key_start = p
    p = key_start + np.maximum(key_length, 0)
    check(p, "key")
    value_length, size = varints(arr, p, in_bounds=True)
    value_start = p + size
    p = value_start + np.maximum(value_length, 0)
    check(p, "value")
    header_count, size = varints(arr, p, in_bounds=True)
    p = p + size
    if (header_count < 0).any():
        where = int(positions[batch_of[int(np.argmax(header_count < 0))]])
        raise CorruptRecordError(f"batch at byte {where}: a record declares a negative header count")
    empty = np.zeros(0, dtype=np.int64)
    hks = hkl = hvs = hvl = empty
    has_headers = bool(header_count.any())
    if has_headers and ((header_count * 2 > record_end - p) & (header_count > 0)).any():  # 2+ bytes per header
        where = int(positions[batch_of[int(np.argmax(header_count * 2 > record_end - p))]])
        raise CorruptRecordError(f"batch at byte {where}: a record declares more headers than it has bytes for")
    if has_headers and with_headers:
        p, hks, hkl, hvs, hvl = decode_headers(arr, p, header_count, record_end, positions, batch_of)
    elif has_headers:  # not wanted: trust each record's length for the part after its header count
        p = np.where(header_count == 0, p, record_end)
        header_count = np.zeros(len(body), dtype=np.int64)
    mismatch = p != record_end
    if mismatch.any():
        where = int(positions[batch_of[int(np.argmax(mismatch))]])
        raise CorruptRecordError(f"batch at byte {where}: a record's fields do not add up to its declared length")

    log_append = (attributes & TIMESTAMP_TYPE_MASK) != 0
    offsets = np.repeat(header["base_offset"].astype(np.int64), counts) + offset_delta
    record_log_append = np.repeat(log_append, counts)
    create_time = np.repeat(header["base_timestamp"].astype(np.int64), counts) + timestamp_delta
    if log_append.any():
        timestamps = np.where(
            record_log_append, np.repeat(header["max_timestamp"].astype(np.int64), counts), create_time
        )
    else:
        timestamps = create_time
    return RecordColumns(
        data,
        offsets,
        timestamps,
        record_log_append.astype(np.int32),
        key_start,
        key_length,
        value_start,
        value_length,
        header_count,
        hks,
        hkl,
        hvs,
        hvl,
    )
