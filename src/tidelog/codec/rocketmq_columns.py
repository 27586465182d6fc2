"""The records of one produced Kafka batch as columns, at a small fixed cost: what RocketMQ's batch encoder
(rocketmq_message.encode_records, called by storage/rocketmq/message_queue.py) turns into CommitLog messages.

`decode_batch(buf, pos, header)` takes the v2 data batch at `pos` of `buf` and its parsed header and returns its
records as RecordColumns, the columns batch_columns.decode_v2 gives for that batch but in a buffer of their own:
offsets baseOffset + offsetDelta, timestamps baseTimestamp + timestampDelta (the batch's maxTimestamp for
LogAppendTime), keys, values and headers as (start, length) into `data`, which is the records section
(decompressed) followed by PADDING zero bytes. An empty batch gives empty columns. Framing that does not add up, a
key or value length below -1, a negative header count or a header with a null key raise CorruptRecordError naming
the batch position and the record.

Unlike decode_v2, which amortises its numpy calls over many stored batches, this serves one batch per call: few
records are walked by a loop (DECODE_WALK_RECORDS), more framed by a walk over their lengths or, past
FRAME_WALK_RECORDS, by record_framing.frame_batch, then decoded field by field for all records at once.
"""

from __future__ import annotations

import numpy as np

from tidelog.codec.record_batch import TIMESTAMP_TYPE_MASK, BatchHeader
from tidelog.codec.record_columns import RecordColumns
from tidelog.codec.record_framing import (
    PADDING,
    TWO_BYTES,
    batch_section,
    decode_headers,
    frame_batch,
    frame_one,
    varints,
)
from tidelog.codec.varint import decode_varint, decode_varlong
from tidelog.errors import CorruptRecordError

_PADDING_BYTES = bytes(PADDING)

# decode_batch walks up to DECODE_WALK_RECORDS records (about 1 µs a record) rather than decoding each field of all
# records at once with numpy (about 25 µs a batch, framing included); up to FRAME_WALK_RECORDS it frames records by
# walking their lengths (0.25 µs a record) rather than by frame_batch's predictions (40 µs and more a batch unless
# its records are all of one size). Measured on batches of 1 KiB records with keys of 4 to 6 bytes.
DECODE_WALK_RECORDS = 32
FRAME_WALK_RECORDS = 256


def decode_batch(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> RecordColumns:
    """decode_v2 for the one v2 data batch at `pos` (a batch a producer sent, `header` read from it), with a small
    fixed cost: up to DECODE_WALK_RECORDS records are walked one by one (_walk_batch); more are framed by a walk
    over their length varints (the sequential chain), or beyond FRAME_WALK_RECORDS by frame_batch (runs of
    equal-sized records checked at once), then every field of all records is decoded at once, each varint with one
    gather through a 2-byte window view of the records and one table lookup, and records that end with a header
    count of 0 are recognised with one byte read each. Offsets are baseOffset + offsetDelta; timestamps
    baseTimestamp + timestampDelta, or the batch's maxTimestamp for a LogAppendTime batch (as decode_records). `data`
    of the result is the records section (decompressed) followed by PADDING zero bytes. Raises CorruptRecordError
    naming the batch position and the record for framing that does not add up, a key or value length below -1, a
    negative header count or a header with a null key."""
    count = header.records_count
    if count <= 0:  # an empty batch (left by compaction) holds nothing to decode
        return RecordColumns.empty()
    section = batch_section(buf, pos, header)
    data = b"".join((section, _PADDING_BYTES))  # room for the vectorised reads past the last record
    if count <= DECODE_WALK_RECORDS:
        return _walk_batch(data, len(section), count, pos, header)
    arr = np.frombuffer(data, dtype=np.uint8)
    if count <= FRAME_WALK_RECORDS:
        body = np.empty(count, dtype=np.int64)
        length = np.empty(count, dtype=np.int64)
        frame_one(data, 0, len(section), count, 0, body, length, pos)
    else:
        body, length = frame_batch(data, arr, len(section), count, pos)
    record_end = body + length
    windows = np.ndarray((len(data) - 1,), dtype=">u2", buffer=data, strides=(1,))  # bytes [i, i+2) at i

    def window_varints(p: np.ndarray, max_bytes: int = 5) -> tuple[np.ndarray, np.ndarray]:
        packed = TWO_BYTES[windows[p]]
        size = packed & 15
        if np.count_nonzero(size) == count:  # all of one or two bytes (count_nonzero: the cheapest reduction)
            return packed >> 4, size
        return varints(arr, p, max_bytes, in_bounds=True)

    timestamp_delta, size = window_varints(body + 1, 10)  # after the unused attributes byte
    offset_delta, size2 = window_varints(body + 1 + size)
    key_start = body + 1 + size + size2
    key_length, size = window_varints(key_start)
    key_start = key_start + size
    value_start = key_start + np.maximum(key_length, 0)
    value_length, size = window_varints(value_start)
    value_start = value_start + size
    p = value_start + np.maximum(value_length, 0)
    bad = (key_length < -1) | (value_length < -1) | (p >= record_end)
    if np.count_nonzero(bad):
        record = int(np.argmax(bad))
        what = (
            "declares a key length below -1" if key_length[record] < -1
            else "declares a value length below -1" if value_length[record] < -1
            else "has a key or value running past its end"
        )  # fmt: skip
        raise CorruptRecordError(f"batch at byte {pos}: record {record} {what}")
    empty = np.zeros(0, dtype=np.int64)
    hks = hkl = hvs = hvl = empty
    if np.count_nonzero((arr[p] == 0) & (p + 1 == record_end)) == count:  # all end with a header count of 0
        header_count = np.zeros(count, dtype=np.int64)
    else:
        header_count, size = varints(arr, p, in_bounds=True)
        header_count = header_count.astype(np.int64)
        p = p + size
        for bad, what in (
            (header_count < 0, "declares a negative header count"),
            (header_count * 2 > record_end - p, "declares more headers than it has bytes for"),
        ):
            if bad.any():
                raise CorruptRecordError(f"batch at byte {pos}: record {int(np.argmax(bad))} {what}")
        if header_count.any():
            p, hks, hkl, hvs, hvl = decode_headers(
                arr, p, header_count, record_end, np.array([pos], dtype=np.int64), np.zeros(count, dtype=np.int64)
            )
        if (p != record_end).any():
            record = int(np.argmax(p != record_end))
            raise CorruptRecordError(
                f"batch at byte {pos}: record {record} has fields that do not add up to its length"
            )
    log_append_time = bool(header.attributes & TIMESTAMP_TYPE_MASK)
    if log_append_time:
        timestamps = np.full(count, header.max_timestamp, dtype=np.int64)
    else:
        timestamps = timestamp_delta.astype(np.int64) + header.base_timestamp
    return RecordColumns(
        data,
        offset_delta.astype(np.int64) + header.base_offset,
        timestamps,
        np.full(count, int(log_append_time), dtype=np.int32),
        key_start,
        key_length.astype(np.int64),
        value_start,
        value_length.astype(np.int64),
        header_count,
        hks,
        hkl,
        hvs,
        hvl,
    )


def _walk_batch(data: bytes, end: int, count: int, pos: int, header: BatchHeader) -> RecordColumns:
    """decode_batch for a batch of few records: one step per record, varints of one or two bytes decoded inline;
    `data` is the records section followed by PADDING zero bytes."""
    timestamp_delta: list[int] = []
    offset_delta: list[int] = []
    key_start: list[int] = []
    key_length: list[int] = []
    value_start: list[int] = []
    value_length: list[int] = []
    header_count: list[int] = []
    headers: list[int] = []  # key start, key length, value start, value length of each header
    at = 0
    index = 0
    try:
        while index < count:
            b = data[at]
            if b < 0x80:
                length, at = (b >> 1) ^ -(b & 1), at + 1
            elif data[at + 1] < 0x80:
                b = (b & 0x7F) | (data[at + 1] << 7)
                length, at = (b >> 1) ^ -(b & 1), at + 2
            else:
                length, at = decode_varint(data, at)
            record_end = at + length
            if length < 0 or record_end > end:
                raise CorruptRecordError(f"declares length {length}, past the end of the batch")
            b = data[at + 1]  # after the unused attributes byte
            if b < 0x80:
                delta, p = (b >> 1) ^ -(b & 1), at + 2
            else:
                delta, p = decode_varlong(data, at + 1)
            timestamp_delta.append(delta)
            b = data[p]
            if b < 0x80:
                delta, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                delta, p = decode_varint(data, p)
            offset_delta.append(delta)
            b = data[p]
            if b < 0x80:
                size, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                size, p = decode_varint(data, p)
            if size < -1:
                raise CorruptRecordError("declares a key length below -1")
            key_start.append(p)
            key_length.append(size)
            p += max(size, 0)
            b = data[p]
            if b < 0x80:
                size, p = (b >> 1) ^ -(b & 1), p + 1
            elif data[p + 1] < 0x80:
                b = (b & 0x7F) | (data[p + 1] << 7)
                size, p = (b >> 1) ^ -(b & 1), p + 2
            else:
                size, p = decode_varint(data, p)
            if size < -1:
                raise CorruptRecordError("declares a value length below -1")
            value_start.append(p)
            value_length.append(size)
            p += max(size, 0)
            if p >= record_end:
                raise CorruptRecordError("has a key or value running past its end")
            if data[p] == 0 and p + 1 == record_end:  # no headers: the common case
                header_count.append(0)
            else:
                headers_here, p = decode_varint(data, p)
                if headers_here < 0 or headers_here * 2 > record_end - p:
                    raise CorruptRecordError(f"declares {headers_here} headers in {record_end - p} bytes")
                header_count.append(headers_here)
                for _ in range(headers_here):
                    size, p = decode_varint(data, p)
                    if size < 0:
                        raise CorruptRecordError("has a header with a null key")
                    headers += (p, size)
                    size, p = decode_varint(data, p + size)
                    headers += (p, size)
                    p += max(size, 0)
                if p != record_end:
                    raise CorruptRecordError("has fields that do not add up to its length")
            at = record_end
            index += 1
    except CorruptRecordError as exc:  # TruncatedBatchError included: a varint running past the data
        raise CorruptRecordError(f"batch at byte {pos}: record {index} {exc}") from exc
    if at != end:
        raise CorruptRecordError(
            f"batch at byte {pos}: incorrect declared batch size, {end - at} bytes left after its {count} records"
        )
    log_append_time = bool(header.attributes & TIMESTAMP_TYPE_MASK)
    if log_append_time:
        timestamps = np.full(count, header.max_timestamp, dtype=np.int64)
    else:
        timestamps = np.array(timestamp_delta, dtype=np.int64) + header.base_timestamp
    flat = np.array(headers, dtype=np.int64).reshape(-1, 4).T
    return RecordColumns(
        data,
        np.array(offset_delta, dtype=np.int64) + header.base_offset,
        timestamps,
        np.full(count, int(log_append_time), dtype=np.int32),
        np.array(key_start, dtype=np.int64),
        np.array(key_length, dtype=np.int64),
        np.array(value_start, dtype=np.int64),
        np.array(value_length, dtype=np.int64),
        np.array(header_count, dtype=np.int64),
        *flat,
    )
