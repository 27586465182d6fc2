"""The produce path's check of the records of one batch a producer sent (Kafka's LogValidator), without building a
Python object per record.

`check_batch_records(buf, pos, header)` takes the v2 batch at `pos` of `buf` and its parsed header (the batch's
CRC and header fields are the caller's to check) and decodes every record (after decompression): `recordsCount`
records exactly filling the batch, each record's fields adding up to its length, offset deltas 0..n-1, key and
value lengths -1 or more, header keys not null, no bytes left over. It returns a RecordsCheck: the records' true
maximum timestamp (a LogAppendTime batch's own maxTimestamp) and how many have no key. Anything else raises
CorruptRecordError naming the batch's byte position and the record.

How, by the shape of the batch (every way gives the same answer; the unit tests force each one):
- Records laid out alike (one size, no headers: what a producer of fixed-size values sends) are checked in runs,
  the first record of a run decoded and the others compared with it a checked byte position at a time (strided
  bytes slices for short runs, about ten numpy operations for long ones; a run ends where the offset delta grows
  a byte, at records 64 and 8192).
- Other batches of more than FEW_RECORDS records are framed with numpy (record_framing.frame_batch) and their
  fields checked for all records at once.
- Smaller ones take a plain loop (numpy's fixed cost per call is larger than the whole walk there).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from tidelog.codec.record_batch import NO_TIMESTAMP, TIMESTAMP_TYPE_MASK, BatchHeader, decode_records
from tidelog.codec.record_framing import (
    TWO_BYTES,
    batch_section,
    decode_headers,
    frame_batch,
    record_prefix,
    varints,
)
from tidelog.codec.varint import decode_varint, decode_varlong
from tidelog.errors import CorruptRecordError, InvalidTimestampError

# Up to this many records a batch that does not come in runs (_check_runs) is walked by a Python loop: below it the
# loop costs less than the general numpy path (measured for 100-byte records: the loop about 0.6 µs a record; numpy
# about 45 µs a batch plus 0.1 µs a record).
FEW_RECORDS = 160
TAIL_BYTES = 24
_INT64_SPAN = 1 << 64


class RecordsCheck(NamedTuple):
    """What check_batch_records learnt about a batch whose records all decode."""

    max_timestamp: int  # the largest record timestamp, at least NO_TIMESTAMP (as Kafka's validator computes it)
    keyless: int  # records without a key (refused by compacted topics)


def check_batch_records(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> RecordsCheck:
    """Decode every record of the v2 batch at `pos` (compressed batches once decompressed) and check what Kafka's
    LogValidator checks of a produced batch: `recordsCount` records fill the records section exactly, each
    record's fields add up to its length, offset deltas run 0..n-1, key and value lengths are -1 or more, header
    keys are not null. Raises CorruptRecordError naming the batch position and the record.

    `max_timestamp` is the records' largest CreateTime (baseTimestamp + timestampDelta, wrapping as Java's long);
    for a batch already stamped LogAppendTime, every record's timestamp is its maxTimestamp, which is returned."""
    section = batch_section(buf, pos, header)
    count = header.records_count
    check = _check_runs(section, count, header.base_timestamp, pos)
    if check is None:
        if count <= FEW_RECORDS:
            check = _walk_records(section, count, header.base_timestamp, pos)
        else:
            check = _check_records_columnar(section, count, header.base_timestamp, pos)
    if header.attributes & TIMESTAMP_TYPE_MASK:
        return check._replace(max_timestamp=header.max_timestamp)
    return check


def check_timestamps_within(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, low: int, high: int
) -> None:
    """Every record timestamp of the v2 batch at `pos` within [low, high] (Kafka's LogValidator under
    message.timestamp.before.max.ms / after.max.ms: low = now - before, high = now + after); records without a
    timestamp pass. Raises InvalidTimestampError naming the first record out of range, as Kafka words it. A walk
    over decoded records: only topics that set a bound pay for it."""
    for index, record in enumerate(decode_records(buf, pos, header)):
        timestamp = record.timestamp_ms
        if timestamp is not None and timestamp != NO_TIMESTAMP and not low <= timestamp <= high:
            raise InvalidTimestampError(
                f"Timestamp {timestamp} of message with offset {index} is out of range. The timestamp should be "
                f"within [{low}, {high}]"
            )


def _as_int64(value: int) -> int:
    return (value + (1 << 63)) % _INT64_SPAN - (1 << 63)


def _walk_records(
    section: bytes | memoryview, count: int, base_timestamp: int, pos: int, first_index: int = 0
) -> RecordsCheck:
    """check_batch_records for the `count` records filling `section`, the first being record `first_index` of its
    batch: a plain loop, one step per record. Varints of one or two bytes (almost every length, delta and count)
    are decoded inline; a read past the section is an IndexError, turned into CorruptRecordError."""
    data = section
    end = len(data)
    at = 0
    index = first_index
    largest_delta: int | None = None
    keyless = 0
    varint = decode_varint
    try:
        for index in range(first_index, first_index + count):
            b = data[at]
            if b < 0x80:
                length, at = (b >> 1) ^ -(b & 1), at + 1
            elif data[at + 1] < 0x80:  # two bytes: lengths of 64 to 8191
                b = (b & 0x7F) | (data[at + 1] << 7)
                length, at = (b >> 1) ^ -(b & 1), at + 2
            else:
                length, at = varint(data, at)
            record_end = at + length
            if length < 0 or record_end > end:
                raise CorruptRecordError(f"declares length {length}, past the end of the batch")
            b = data[at + 1]  # after the attributes byte
            if b < 0x80:
                timestamp_delta, p = (b >> 1) ^ -(b & 1), at + 2
            elif data[at + 2] < 0x80:
                b = (b & 0x7F) | (data[at + 2] << 7)
                timestamp_delta, p = (b >> 1) ^ -(b & 1), at + 3
            else:
                timestamp_delta, p = decode_varlong(data, at + 1)
            b = data[p]
            if b < 0x80:
                offset_delta, p = (b >> 1) ^ -(b & 1), p + 1
            elif data[p + 1] < 0x80:
                b = (b & 0x7F) | (data[p + 1] << 7)
                offset_delta, p = (b >> 1) ^ -(b & 1), p + 2
            else:
                offset_delta, p = varint(data, p)
            if offset_delta != index:
                raise CorruptRecordError(f"has offset delta {offset_delta}; record {index} must have {index}")
            b = data[p]
            key_length, p = ((b >> 1) ^ -(b & 1), p + 1) if b < 0x80 else varint(data, p)
            if key_length < -1:
                raise CorruptRecordError(f"declares key length {key_length}")
            if key_length > 0:
                p += key_length
            else:
                keyless += key_length == -1
            b = data[p]
            if b < 0x80:
                value_length, p = (b >> 1) ^ -(b & 1), p + 1
            elif data[p + 1] < 0x80:
                b = (b & 0x7F) | (data[p + 1] << 7)
                value_length, p = (b >> 1) ^ -(b & 1), p + 2
            else:
                value_length, p = varint(data, p)
            if value_length < -1:
                raise CorruptRecordError(f"declares value length {value_length}")
            if value_length > 0:
                p += value_length
            if data[p] == 0:  # no headers: the common case
                p += 1
            else:
                header_count, p = varint(data, p)
                if header_count < 0 or header_count * 2 > record_end - p:
                    raise CorruptRecordError(f"declares {header_count} headers in {record_end - p} bytes")
                for _ in range(header_count):
                    key_size, p = varint(data, p)
                    if key_size < 0:
                        raise CorruptRecordError("has a header with a null key")
                    header_value_size, p = varint(data, p + key_size)
                    p += max(header_value_size, 0)
            if p != record_end:
                raise CorruptRecordError(f"declares {length} bytes but its fields take {length + p - record_end}")
            if largest_delta is None or timestamp_delta > largest_delta:
                largest_delta = timestamp_delta
            at = record_end
    except IndexError:
        raise CorruptRecordError(f"batch at byte {pos}: record {index} runs past the end of the batch") from None
    except CorruptRecordError as exc:  # TruncatedBatchError included: a varint running past the section
        raise CorruptRecordError(f"batch at byte {pos}: record {index} {exc}") from exc
    if at != end:
        raise CorruptRecordError(
            f"batch at byte {pos}: incorrect declared batch size, {end - at} bytes left after its {count} records"
        )
    max_timestamp = NO_TIMESTAMP if largest_delta is None else _as_int64(base_timestamp + largest_delta)
    return RecordsCheck(max(max_timestamp, NO_TIMESTAMP), keyless)


def _check_records_columnar(section: bytes | memoryview, count: int, base_timestamp: int, pos: int) -> RecordsCheck:
    """check_batch_records for a batch of many records: the records framed (frame_batch), then every field of all
    records at once, in place (no copy of the section). Records without headers whose fields are all in order
    pass one combined test; otherwise each condition is tested in field order (naming the first record that fails
    it) and headers are decoded. The vectorised reads look up to TAIL_BYTES past a record's start, so the last
    record and any starting that close to the end of the section are walked instead."""
    arr = np.frombuffer(section, dtype=np.uint8)
    end = len(section)
    body, length = frame_batch(section, arr, end, count, pos)
    record_end = body + length
    inner = min(int(np.searchsorted(body, end - TAIL_BYTES, side="right")), count - 1)
    tail = _walk_records(
        section[int(record_end[inner - 1]) if inner else 0 :], count - inner, base_timestamp, pos, inner
    )
    if inner == 0:
        return tail
    body, record_end = body[:inner], record_end[:inner]
    timestamp_delta, offset_delta, key_length, key_start = record_prefix(arr, body)
    key_end = key_start + np.maximum(key_length, 0)
    value_at = np.minimum(key_end, record_end - 1)  # inside the records even where a length lies
    value_length, size = varints(arr, value_at, in_bounds=True)
    value_end = np.minimum(value_at + size + np.maximum(value_length, 0), record_end)
    plain = (
        (offset_delta == np.arange(inner))
        & (key_length >= -1)
        & (key_end < record_end)
        & (value_length >= -1)
        & (value_end + 1 == record_end)
        & (arr[value_end] == 0)  # the record ends with its header count, 0
    )
    if not plain.all():
        _check_fields_in_order(arr, pos, inner, record_end, offset_delta, key_length, key_end)
    max_timestamp = _as_int64(base_timestamp + int(timestamp_delta.max()))
    return RecordsCheck(
        max(max_timestamp, tail.max_timestamp, NO_TIMESTAMP), int(np.count_nonzero(key_length == -1)) + tail.keyless
    )


# --- the common shape: runs of records laid out alike --------------------------------------------------------

# Record index where offsetDelta (= the index, as a producer writes it) needs a longer varint: up to 63 it takes one
# byte, up to 8191 two, up to 2^20 - 1 three.
_DELTA_WIDTH_ENDS = (0, 64, 8192, 1 << 20)
# How an offset delta of each width is read in every record of a run at once (one of three bytes is read with the
# byte after it, which is shifted out).
_DELTA_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint8), np.dtype(">u2"), np.dtype(">u4"))
# Timestamp deltas of one and two bytes, read as one and two bytes: the delta, or _NOT_THIS_WIDTH where the bytes
# are not a varint of exactly that width.
_NOT_THIS_WIDTH = 1 << 20
_TIMESTAMP_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint8), np.dtype(">u2"))
_TIMESTAMP_DELTAS = (
    np.zeros(0, dtype=np.int32),
    np.where(TWO_BYTES[::256] & 15 == 1, TWO_BYTES[::256] >> 4, _NOT_THIS_WIDTH).astype(np.int32),
    np.where(TWO_BYTES & 15 == 2, TWO_BYTES >> 4, _NOT_THIS_WIDTH).astype(np.int32),
)
# Up to this many records are walked (_walk_records, about 0.6 µs a record) rather than checked as a run (about
# 5 µs for a run of up to RUN_BYTES_ROWS records, its template decoded in Python included).
RUN_WALK_MAX = 6
# Runs of up to RUN_BYTES_ROWS records with one-byte timestamp deltas are checked with bytes operations, a strided
# slice per checked byte of the records: about 2 µs for 64 records of 100 bytes, where numpy's fixed costs come to
# about 6 µs. Longer runs go to numpy, whose cost per record is lower (bytes' max() of the timestamp deltas is a loop
# in C at about 9 ns a record). A batch of up to RUN_BYTES_ROWS records and RUN_BYTES_MAX bytes is copied to bytes
# for this once (a memoryview's strided slices are slow); larger ones are left where they are.
RUN_BYTES_ROWS = 256
RUN_BYTES_MAX = 256 * 1024
# In a batch left where it is (a memoryview), whose strided slices must be copied, up to this many records a run.
RUN_VIEW_BYTES_ROWS = 64
# Offset deltas 0..8191 as a producer writes them (one byte up to 63, then two): their first and second bytes.
_DELTA_FIRST_BYTES = bytes(2 * i if i < 64 else (2 * i & 0x7F) | 0x80 for i in range(8192))
_DELTA_SECOND_BYTES = bytes(2 * i >> 7 for i in range(8192))
# A one-byte timestamp delta as a byte in the deltas' order (delta + 64); any other byte to 255.
_TIMESTAMP_ORDER = bytes(((b >> 1) ^ -(b & 1)) + 64 if b < 0x80 else 255 for b in range(256))
# A run that stops before RUN_MIN records (at a record laid out otherwise) is short; after SHORT_RUNS_MAX short runs
# the records are taken to vary in size, and the batch is checked the general way.
RUN_MIN = 8
SHORT_RUNS_MAX = 3


@functools.cache
def _offset_delta_codes(width: int) -> np.ndarray:
    """The `width`-byte varints of the offset deltas that take that width, each read as one big-endian number."""
    zigzag = 2 * np.arange(_DELTA_WIDTH_ENDS[width - 1], _DELTA_WIDTH_ENDS[width], dtype=np.uint32)
    code: np.ndarray = np.zeros(len(zigzag), dtype=np.uint32)  # uint32 throughout; the stubs type `| int` as signed
    for k in range(width):
        code = (code << 8) | ((zigzag >> (7 * k)) & 0x7F) | (0x80 if k < width - 1 else 0)
    return code.astype(_DELTA_DTYPES[width].newbyteorder("="))


class _RunTemplate(NamedTuple):
    """The layout of one record, against which the records after it are checked all at once."""

    stride: int  # bytes from the record's start to the next record's (its length varint included)
    timestamp_at: int  # where the timestamp delta starts, from the record's start
    timestamp_width: int  # 1 or 2 bytes
    delta_at: int
    delta_width: int  # 1 to 3 bytes, as offsetDelta = the record's index is written
    same_bytes: tuple[int, ...]  # positions that hold the same byte in every record of the run: the record length,
    # the key and value lengths, and the last byte (a header count of 0)
    keyless: bool
    timestamp_delta: int


def _run_template(data: bytes | memoryview, at: int, end: int, index: int) -> _RunTemplate | None:
    """Record `index`, starting at `at`, decoded and checked as _walk_records does, as a template; None when it does
    not decode (the general way then says what is wrong) or is not of the shape runs take: no headers, a timestamp
    delta of one or two bytes, an offset delta written in its shortest form."""
    try:  # one-byte varints (most timestamp and offset deltas, key lengths) are decoded inline
        length, body = decode_varint(data, at)
        record_end = body + length
        b = data[body + 1]  # after the attributes byte
        if b < 0x80:
            timestamp_delta, delta_at = (b >> 1) ^ -(b & 1), body + 2
        else:
            timestamp_delta, delta_at = decode_varlong(data, body + 1)
        b = data[delta_at]
        if b < 0x80:
            offset_delta, key_length_at = (b >> 1) ^ -(b & 1), delta_at + 1
        else:
            offset_delta, key_length_at = decode_varint(data, delta_at)
        b = data[key_length_at]
        if b < 0x80:
            key_length, key_at = (b >> 1) ^ -(b & 1), key_length_at + 1
        else:
            key_length, key_at = decode_varint(data, key_length_at)
        value_length_at = key_at + max(key_length, 0)
        value_length, value_at = decode_varint(data, value_length_at)
        header_count_at = value_at + max(value_length, 0)
        delta_width = key_length_at - delta_at
        shaped = (
            length >= 0
            and record_end <= end
            and offset_delta == index
            and delta_width <= 3
            and index >= _DELTA_WIDTH_ENDS[delta_width - 1]  # so written in its shortest form
            and delta_at - body - 1 <= 2
            and key_length >= -1
            and value_length >= -1
            and header_count_at + 1 == record_end
            and data[header_count_at] == 0
        )
    except (CorruptRecordError, IndexError):  # TruncatedBatchError included
        return None
    if not shaped:
        return None
    same = (
        *range(0, body - at),
        *range(key_length_at - at, key_at - at),
        *range(value_length_at - at, value_at - at),
        header_count_at - at,
    )
    return _RunTemplate(
        record_end - at, body + 1 - at, delta_at - body - 1, delta_at - at, delta_width, same, key_length < 0,
        timestamp_delta,
    )  # fmt: skip


def _check_run(section: bytes | memoryview, at: int, index: int, rows: int, template: _RunTemplate) -> tuple[int, int]:
    """(records accepted, their largest timestamp delta): of the `rows` records that follow at `at` if they are all
    laid out as `template` (record `index`, at `at`), the ones before the first that is not. Each accepted record
    was read where the one before it ends, with the same length, key and value lengths and no headers, its offset
    delta its index and its timestamp delta of the template's width: it decodes exactly as the template does."""
    stride = template.stride
    records = np.ndarray((rows, stride), dtype=np.uint8, buffer=section, offset=at, strides=(stride, 1))
    same = records.take(np.array(template.same_bytes, dtype=np.intp), axis=1)
    same_differs = same != same[0]
    width = template.delta_width
    first = index - _DELTA_WIDTH_ENDS[width - 1]
    delta = np.ndarray((rows,), _DELTA_DTYPES[width], section, at + template.delta_at, (stride,))
    delta_differs = (delta >> 8 if width == 3 else delta) != _offset_delta_codes(width)[first : first + rows]
    timestamp_width = template.timestamp_width
    timestamp = np.ndarray((rows,), _TIMESTAMP_DTYPES[timestamp_width], section, at + template.timestamp_at, (stride,))
    timestamp_delta = _TIMESTAMP_DELTAS[timestamp_width][timestamp]
    largest = int(np.maximum.reduce(timestamp_delta))
    if largest < _NOT_THIS_WIDTH and not np.count_nonzero(same_differs) and not np.count_nonzero(delta_differs):
        return rows, largest
    differs = same_differs.any(axis=1) | delta_differs | (timestamp_delta == _NOT_THIS_WIDTH)
    accepted = int(np.argmax(differs))  # record 0 is the template itself
    return accepted, int(np.maximum.reduce(timestamp_delta[:accepted]))


def _check_run_bytes(data: bytes | memoryview, at: int, index: int, rows: int, template: _RunTemplate) -> int | None:
    """_check_run with bytes operations, for a run whose records all match (template.timestamp_width 1,
    delta_width 1 or 2): their largest timestamp delta, or None when one does not match (_check_run then finds
    which). Each strided slice of a memoryview is copied to bytes (bytes() of bytes is the same object)."""
    stride = template.stride
    stop = at + rows * stride
    for position in template.same_bytes:
        found = bytes(data[at + position : stop : stride])
        if found.count(found[0]) != rows:
            return None
    delta_at = at + template.delta_at
    if data[delta_at:stop:stride] != _DELTA_FIRST_BYTES[index : index + rows]:
        return None
    if template.delta_width == 2 and data[delta_at + 1 : stop : stride] != _DELTA_SECOND_BYTES[index : index + rows]:
        return None
    largest = max(bytes(data[at + template.timestamp_at : stop : stride]).translate(_TIMESTAMP_ORDER))
    return None if largest == 255 else largest - 64


def _check_runs(section: bytes | memoryview, count: int, base_timestamp: int, pos: int) -> RecordsCheck | None:
    """check_batch_records for records that come in runs laid out alike (records of one size without headers, as
    producers of fixed-size values write them): the first record of a run is decoded (_run_template), the rest of
    the run checked against it in a few numpy operations (_check_run). A run ends where the offset delta grows a
    byte, the batch ends, or a record is laid out otherwise; the last RUN_WALK_MAX records are walked. None when
    a record cannot start a run or too many runs are short: the batch is then checked the general way."""
    end = len(section)
    if RUN_WALK_MAX < count <= RUN_BYTES_ROWS and end <= RUN_BYTES_MAX and not isinstance(section, bytes):
        section = bytes(section)
    at = index = 0
    largest: int | None = None
    keyless = short_runs = 0
    while count - index > RUN_WALK_MAX:
        template = _run_template(section, at, end, index)
        if template is None:
            return None
        rows = min(count, _DELTA_WIDTH_ENDS[template.delta_width]) - index
        rows = min(rows, (end - at) // template.stride)
        if index + rows == count and at + rows * template.stride != end:
            rows -= 1  # the batch does not end where the run would: its last record is laid out otherwise
        predicted = rows
        length_bytes = template.timestamp_at - 1
        following = at + template.stride
        if rows > 1 and section[following : following + length_bytes] != section[at : at + length_bytes]:
            rows = 1  # the next record has another length (records vary in size): a short run, found cheaply
        by_bytes = (
            _check_run_bytes(section, at, index, rows, template)
            if 1 < rows <= (RUN_BYTES_ROWS if isinstance(section, bytes) else RUN_VIEW_BYTES_ROWS)
            and template.timestamp_width == 1
            and template.delta_width <= 2
            else None
        )
        if by_bytes is not None:
            accepted, run_largest = rows, by_bytes
        elif rows > 1:
            accepted, run_largest = _check_run(section, at, index, rows, template)
        else:
            accepted, run_largest = 1, template.timestamp_delta
        if accepted < min(predicted, RUN_MIN):
            short_runs += 1
            if short_runs > SHORT_RUNS_MAX:
                return None
        if largest is None or run_largest > largest:
            largest = run_largest
        keyless += accepted if template.keyless else 0
        at += accepted * template.stride
        index += accepted
    if index < count:
        tail = _walk_records(section[at:] if at else section, count - index, base_timestamp, pos, index)
    elif at != end:
        return None
    else:
        tail = RecordsCheck(NO_TIMESTAMP, 0)
    max_timestamp = NO_TIMESTAMP if largest is None else _as_int64(base_timestamp + largest)
    return RecordsCheck(max(max_timestamp, tail.max_timestamp, NO_TIMESTAMP), keyless + tail.keyless)


def _check_fields_in_order(
    arr: np.ndarray,
    pos: int,
    count: int,
    record_end: np.ndarray,
    offset_delta: np.ndarray,
    key_length: np.ndarray,
    key_end: np.ndarray,
) -> None:
    """The fields of every record after the key length, condition by condition; headers decoded."""

    def refuse(bad: np.ndarray, what: str) -> None:
        if bad.any():
            raise CorruptRecordError(f"batch at byte {pos}: record {int(np.argmax(bad))} {what}")

    refuse(offset_delta != np.arange(count), "has an offset delta other than its index")
    refuse(key_length < -1, "declares a key length below -1")
    refuse(key_end >= record_end, "has a key running past its end")
    value_length, size = varints(arr, key_end, in_bounds=True)
    refuse(value_length < -1, "declares a value length below -1")
    p = key_end + size + np.maximum(value_length, 0)
    refuse(p >= record_end, "has a value running past its end")
    header_count, size = varints(arr, p, in_bounds=True)
    p = p + size
    refuse(header_count < 0, "declares a negative header count")
    refuse(header_count * 2 > record_end - p, "declares more headers than it has bytes for")
    if header_count.any():
        positions = np.array([pos], dtype=np.int64)
        p = decode_headers(arr, p, header_count, record_end, positions, np.zeros(count, dtype=np.int64))[0]
    refuse(p != record_end, "has fields that do not add up to its declared length")
