"""Decoded record columns -> the Arrow record batch Spark's Kafka schema expects, without per-record Python work.

Spark checks a data source's Arrow batches against `to_arrow_schema(schema, timezone="UTC")`: `binary`/`string`
(not the large variants), int32 for `int`, int64 for `long`, `timestamp[us, tz=UTC]`, every field nullable, and
`headers` as `list<element: struct<key: string, value: binary>>`. Keys and values are gathered from the decode
buffer without a per-record Python step: slices of one size as rows of a strided view (numpy copies them in one
call), slices of varying sizes by Arrow's own `take` kernel (the buffer is seen as one binary array whose elements
alternate between a wanted slice and the bytes between slices, and every other element is taken).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tidelog.codec.record_columns import RecordColumns

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

KAFKA_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("timestampType", pa.int32()),
]
SCHEMA = pa.schema(KAFKA_FIELDS)
SCHEMA_WITH_HEADERS = pa.schema([*KAFKA_FIELDS, pa.field("headers", HEADERS_TYPE)])


def arrow_schema(include_headers: bool) -> pa.Schema:
    return SCHEMA_WITH_HEADERS if include_headers else SCHEMA


def _validity(length: np.ndarray) -> pa.Buffer | None:
    """Arrow validity bitmap of the entries whose length is not -1 (None when nothing is null)."""
    valid = length >= 0
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def gather_binary(data: bytes | bytearray | memoryview, start: np.ndarray, length: np.ndarray) -> pa.Array:
    """A `binary` array of data[start[i] : start[i] + length[i]], null where length is -1.

    The slices must be in increasing, non-overlapping order in `data` (as records lie in a batch)."""
    n = len(start)
    if n == 0:
        return pa.array([], type=pa.binary())
    if int(length.min()) == int(length.max()) >= 0:  # all the same size (fixed-size keys or values): rows of bytes
        width = int(length[0])
        offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32) * width)
        if width == 0:
            return pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(b"")])
        raw = np.frombuffer(data, dtype=np.uint8)
        rows = np.lib.stride_tricks.as_strided(raw, (len(raw) - width + 1, width), (1, 1), writeable=False)[start]
        return pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(rows)])
    size = np.maximum(length, 0)
    bounds = np.empty(2 * n + 1, dtype=np.int64)
    bounds[0:-1:2] = start
    bounds[1::2] = start + size
    bounds[-1] = bounds[-2]
    if bounds[-1] >= 1 << 31:  # int32 offsets; callers decode in chunks far below this
        raise ValueError("a decode buffer of 2 GiB or more cannot be gathered at once")
    if n > 1 and (np.diff(bounds) < 0).any():
        raise ValueError("slices to gather are not in buffer order")
    whole = pa.BinaryArray.from_buffers(
        pa.binary(), 2 * n, [None, pa.py_buffer(bounds.astype(np.int32)), pa.py_buffer(data)]
    )
    picked = whole.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))
    validity = _validity(length)
    if validity is None:
        return picked
    _, offsets, values = picked.buffers()
    return pa.BinaryArray.from_buffers(pa.binary(), n, [validity, offsets, values])


def _constant_string(text: str, n: int) -> pa.Array:
    raw = text.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def _headers(cols: RecordColumns) -> pa.Array:
    n = len(cols)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(cols.header_count, out=offsets[1:])
    keys = gather_binary(cols.data, cols.header_key_start, cols.header_key_length)
    try:
        key_strings = keys.cast(pa.string())
    except pa.ArrowInvalid:  # a key that is not UTF-8: decode as Java's String(bytes, UTF_8) would
        key_strings = pa.array([k.decode("utf-8", "replace") for k in keys.to_pylist()], type=pa.string())
    values = gather_binary(cols.data, cols.header_value_start, cols.header_value_length)
    entries = pa.StructArray.from_arrays([key_strings, values], fields=list(HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(offsets), entries, type=HEADERS_TYPE)


def to_record_batch(cols: RecordColumns, topic: str, partition: int, include_headers: bool) -> pa.RecordBatch:
    n = len(cols)
    arrays = [
        gather_binary(cols.data, cols.key_start, cols.key_length),
        gather_binary(cols.data, cols.value_start, cols.value_length),
        _constant_string(topic, n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(cols.offset.astype(np.int64, copy=False)),
        pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, pa.py_buffer(cols.timestamp * 1000)]),
        pa.array(cols.timestamp_type.astype(np.int32, copy=False)),
    ]
    if include_headers:
        arrays.append(_headers(cols))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))
