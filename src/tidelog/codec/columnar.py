"""Columnar decoding of stored record batches: bytes in, numpy columns out, no per-record Python objects.

A reader that hands records to a columnar engine (Spark through Arrow) wants arrays, not `Record`s.

- `scan_batches(buf)` walks the batch chain of a record set (a Python step per *batch*: each batch's size says
  where the next starts), stops quietly at a partial tail like Kafka's FileLogInputStream, and gathers every
  61-byte v2 header into a numpy structured array in one go.
- `decode_v2(buf, table)` decodes every record of those batches at once. Records inside a batch are
  varint-framed, so where record i+1 starts depends on record i's length; that chain is the only sequential part.
  It is first guessed: when a batch's records all have the same size (fixed-size payloads, the common case for
  generated or schema'd data) the guess is verified with a few vectorised operations over all records. Batches
  that fail the check are walked either in lockstep (step i decodes record i of every such batch as numpy
  operations over the batches) or, when few batches are left, by a tight Python loop. Every field after the
  length is then decoded for all records together; keys, values and headers come back as (start, length) pairs
  into one buffer, ready for Arrow to gather without a per-record copy in Python.
- `from_records(records)` builds the same columns from decoded `Record`s (legacy v0/v1 entries, client messages).
- `check_batch_records(buf, pos, header)` is Kafka's LogValidator walk over the records of one batch a producer
  sent: every record decoded (after decompression), `recordsCount` records exactly filling the batch, offset deltas
  0..n-1, no bytes left over; it returns the records' true maximum timestamp and how many have no key. Records
  laid out alike (one size, no headers: what a producer of fixed-size values sends) are checked in runs, the
  first record of a run decoded and the others compared with it a checked byte position at a time (strided bytes
  slices for short runs, about ten numpy operations for long ones; a run ends where the offset delta grows a byte,
  at records 64 and 8192). Other batches of more than FEW_RECORDS
  records take the numpy framing above; smaller ones a plain loop (numpy's fixed cost per call is larger than the
  whole walk there).

Contract: `decode_v2` takes complete v2 data batches (callers drop control batches and legacy entries, and check
CRCs when they want to) and returns their records in batch order. Compressed batches are decompressed once per
batch. Framing that does not add up raises CorruptRecordError naming the batch's byte position in `buf`.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tidelog.codec.compression import Compression, decompress
from tidelog.codec.legacy import RECORD_OVERHEAD_V0
from tidelog.codec.record_batch import (
    COMPRESSION_MASK,
    CONTROL_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Record,
)
from tidelog.codec.varint import decode_varint, decode_varlong
from tidelog.errors import CorruptRecordError

# The v2 batch header as a packed big-endian numpy record (see record_batch.py for the layout).
HEADER_DTYPE = np.dtype(
    [
        ("base_offset", ">i8"),
        ("batch_length", ">i4"),
        ("partition_leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("records_count", ">i4"),
    ]
)
assert HEADER_DTYPE.itemsize == HEADER_SIZE

MIN_RECORD_BYTES = 7
# Below this many batches still walking at one record index, a Python loop beats one round of numpy calls.
LOCKSTEP_MIN_ACTIVE = 128
# Framing runs of equal-sized records: records checked per batch in the first round (doubling each round up to
# the maximum), and the mean run a round must find for the next round to be worth it (else records vary in
# size and are walked instead).
RUN_WINDOW_FIRST = 64
RUN_WINDOW_MAX = 8192
RUN_MIN_MEAN = 8.0
_OFFSET_AND_SIZE = struct.Struct(">qi")
_HEADER_COLUMNS = np.arange(HEADER_SIZE)


# --- the batch chain -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class BatchTable:
    """Complete entries of a record set: byte position, total size, magic and (for v2) the parsed header."""

    position: np.ndarray  # int64
    size: np.ndarray  # int64, including the 12-byte offset/size prefix
    magic: np.ndarray  # int8
    header: np.ndarray  # HEADER_DTYPE records; meaningful where magic == 2

    def __len__(self) -> int:
        return len(self.position)

    @property
    def end(self) -> int:
        """Byte position just after the last entry (where the next scan starts)."""
        return int(self.position[-1] + self.size[-1]) if len(self) else 0

    @property
    def base_offset(self) -> np.ndarray:
        return self.header["base_offset"].astype(np.int64)

    @property
    def last_offset(self) -> np.ndarray:
        """Last offset of each entry (a legacy entry's offset field is its last offset)."""
        base = self.header["base_offset"].astype(np.int64)
        return np.where(self.magic == 2, base + self.header["last_offset_delta"].astype(np.int64), base)

    @property
    def max_timestamp(self) -> np.ndarray:
        """Largest timestamp of each v2 batch; legacy entries count as "any" (the maximum int64)."""
        return np.where(self.magic == 2, self.header["max_timestamp"].astype(np.int64), np.iinfo(np.int64).max)

    @property
    def is_control(self) -> np.ndarray:
        return (self.magic == 2) & ((self.header["attributes"] & CONTROL_MASK) != 0)

    def take(self, selector: np.ndarray | slice) -> BatchTable:
        return BatchTable(self.position[selector], self.size[selector], self.magic[selector], self.header[selector])


def scan_batches(buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None) -> BatchTable:
    """Every complete entry from `start` up to `end`; a partial entry at the tail ends the scan quietly."""
    end = len(buf) if end is None else min(end, len(buf))
    positions: list[int] = []
    sizes: list[int] = []
    pos = start
    unpack = _OFFSET_AND_SIZE.unpack_from
    while end - pos > MAGIC_OFFSET:
        _offset, size = unpack(buf, pos)
        if size < RECORD_OVERHEAD_V0:
            raise CorruptRecordError(
                f"entry at byte {pos} declares size {size}, smaller than any message format allows"
            )
        total = size + LOG_OVERHEAD
        if total > end - pos:
            break
        positions.append(pos)
        sizes.append(total)
        pos += total
    position = np.array(positions, dtype=np.int64)
    arr = np.frombuffer(buf, dtype=np.uint8)
    if len(position) == 0:
        return BatchTable(position, position.copy(), np.zeros(0, dtype=np.int8), np.zeros(0, dtype=HEADER_DTYPE))
    magic = arr[position + MAGIC_OFFSET].view(np.int8)
    rows = arr[np.minimum(position[:, None] + _HEADER_COLUMNS, len(arr) - 1)]
    header = np.ascontiguousarray(rows).view(HEADER_DTYPE).reshape(-1)
    size_array = np.array(sizes, dtype=np.int64)
    bad = (magic == 2) & (size_array < MIN_BATCH_LENGTH + LOG_OVERHEAD)
    if bad.any():
        where = int(position[np.argmax(bad)])
        raise CorruptRecordError(f"batch at byte {where} is shorter than a v2 batch header")
    unknown = (magic < 0) | (magic > 2)
    if unknown.any():
        where = int(np.argmax(unknown))
        raise CorruptRecordError(f"entry at byte {int(position[where])} has unknown magic {int(magic[where])}")
    return BatchTable(position, size_array, magic, header)


# --- columns -------------------------------------------------------------------------------------------------


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


# --- vectorised varints --------------------------------------------------------------------------------------


def _unsigned_varints(
    arr: np.ndarray, pos: np.ndarray, max_bytes: int, strict: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(value as uint64, encoded size) of the unsigned varint at each position (positions clipped into `arr`).

    Byte k is looked at only for the varints still going after k bytes, so short varints cost little.
    An unterminated varint raises, or with strict=False comes back as size 0 (a guess that did not hold)."""
    last = len(arr) - 1
    b = arr[pos]
    value = (b & 0x7F).astype(np.uint64)
    size = np.ones(len(pos), dtype=np.int64)
    going = np.nonzero(b >= 0x80)[0]
    for k in range(1, max_bytes):
        if len(going) == 0:
            return value, size
        b = arr[np.minimum(pos[going] + k, last)]
        value[going] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        size[going] = k + 1
        going = going[b >= 0x80]
    if len(going):
        if strict:
            raise CorruptRecordError(f"a varint longer than {max_bytes} bytes at byte {int(pos[going[0]])}")
        size[going] = 0
    return value, size


def _two_byte_table() -> np.ndarray:
    """For every 2-byte window: (signed zig-zag value << 4) | size of the varint starting there (size 0: longer)."""
    code = np.arange(1 << 16, dtype=np.int64)
    b0, b1 = code >> 8, code & 0xFF
    one = b0 < 0x80
    two = ~one & (b1 < 0x80)
    unsigned = np.where(one, b0, (b0 & 0x7F) | (b1 << 7))
    signed = (unsigned >> 1) ^ -(unsigned & 1)
    size = np.where(one, 1, np.where(two, 2, 0))
    return np.where(size > 0, (signed << 4) | size, 0).astype(np.int32)


_TWO_BYTES = _two_byte_table()
# Spare bytes after the data: the chained varint reads of a record (up to 16 bytes past a checked position)
# stay inside the array without a bounds check per read.
PADDING = 32


def _varints(
    arr: np.ndarray, pos: np.ndarray, max_bytes: int = 5, strict: bool = True, *, in_bounds: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(signed zig-zag value, size) of the varint (max_bytes 5) or varlong (10) at each position.

    `arr` ends with PADDING spare bytes; `in_bounds` says the caller knows every position is at most PADDING / 2
    past the data. Varints of one or two bytes (values -8192..8191: lengths, deltas and counts of typical records)
    are decoded with one lookup in a 64 Ki-entry table; longer ones byte by byte."""
    if not in_bounds and len(pos) and int(pos.max()) >= len(arr) - 1:  # only corrupt framing points past the data
        pos = np.minimum(pos, len(arr) - 2)
    code = (arr[pos].astype(np.uint16) << 8) | arr[pos + 1]
    packed = _TWO_BYTES[code]
    size = packed & 15
    if size.min() > 0:
        return packed >> 4, size
    value = packed >> 4
    longer = np.nonzero(size == 0)[0]
    wide, wide_size = _unsigned_varints(arr, pos[longer], max_bytes, strict)
    value = value.astype(np.int64)
    size = size.astype(np.int64)
    value[longer] = (wide >> np.uint64(1)).astype(np.int64) ^ -(wide & np.uint64(1)).astype(np.int64)
    size[longer] = wide_size
    return value, size


# --- record framing ------------------------------------------------------------------------------------------


def _frame_records(
    data: bytes | bytearray | memoryview,
    arr: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    positions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Body start and body length of every record (batch b's records fill [starts[b], ends[b]) of `arr`)."""
    total = int(counts.sum())
    body = np.empty(total, dtype=np.int64)
    length = np.empty(total, dtype=np.int64)
    first_slot = np.cumsum(counts) - counts
    batches = np.nonzero(counts > 0)[0]
    cur = starts[batches].astype(np.int64)
    done = np.zeros(len(batches), dtype=np.int64)
    batches, cur, done = _frame_runs(arr, batches, cur, done, ends, counts, first_slot, body, length, positions)
    if len(batches):
        _frame_walk(data, arr, batches, cur, done, ends, counts, first_slot, body, length, positions)
    return body, length


def _frame_runs(
    arr: np.ndarray,
    batches: np.ndarray,
    cur: np.ndarray,
    done: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    first_slot: np.ndarray,
    body: np.ndarray,
    length: np.ndarray,
    positions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frame runs of equal-sized records, for all batches at once; returns the batches left for a walk.

    The size of the record at each batch's cursor is taken as the stride of a run; the next records of the batch
    (RUN_WINDOW_FIRST of them, doubling per round) are checked at cursor + j * stride, and the run is accepted
    up to the first record whose
    length does not match. Each accepted record was read at its true position (all records before it had
    the stride's size), so this is exact, not a heuristic. Fixed-size payloads make a few long runs per batch
    (records grow by a byte where offset and timestamp deltas reach 64 and 8192); variable-size payloads make
    runs of about one record, detected after one round and handed to the walk.
    """
    batch_ends = ends[batches]
    run_window = RUN_WINDOW_FIRST
    while len(batches):
        value, size = _varints(arr, cur)
        stride = size + value
        bad = (value < 0) | (cur + stride > batch_ends)
        if bad.any():
            where = int(positions[batches[np.argmax(bad)]])
            raise CorruptRecordError(f"batch at byte {where}: a record declares a length past the end of the batch")
        remaining = counts[batches] - done
        window = np.minimum(remaining, run_window)
        run_window = min(run_window * 2, RUN_WINDOW_MAX)
        first = np.cumsum(window) - window
        owner = np.repeat(np.arange(len(batches)), window)
        index = np.arange(int(window.sum())) - first[owner]
        candidate = cur[owner] + index * stride[owner]
        cand_value, cand_size = _varints(arr, candidate, strict=False)
        fits = (
            (cand_size > 0)
            & (cand_size + cand_value == stride[owner])
            & (candidate + stride[owner] <= batch_ends[owner])
        )
        run = np.minimum.reduceat(np.where(fits, window[owner], index), first)
        accepted = index < run[owner]
        slots = (first_slot[batches] + done)[owner][accepted] + index[accepted]
        body[slots] = candidate[accepted] + cand_size[accepted]
        length[slots] = cand_value[accepted]
        done = done + run
        cur = cur + run * stride
        finished = done == counts[batches]
        short = finished & (cur != batch_ends)
        if short.any():
            where = int(np.argmax(short))
            raise CorruptRecordError(
                f"batch at byte {int(positions[batches[where]])}: incorrect declared batch size, "
                f"{int(batch_ends[where] - cur[where])} bytes left after its records"
            )
        mean_run = int(run.sum()) / len(run)
        keep = ~finished
        batches, cur, done, batch_ends = batches[keep], cur[keep], done[keep], batch_ends[keep]
        if mean_run < RUN_MIN_MEAN:
            break
    return batches, cur, done


def _frame_walk(
    data: bytes | bytearray | memoryview,
    arr: np.ndarray,
    batches: np.ndarray,
    cur: np.ndarray,
    done: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    first_slot: np.ndarray,
    body: np.ndarray,
    length: np.ndarray,
    positions: np.ndarray,
) -> None:
    """Record by record: in lockstep over many batches (numpy per record index), else a Python loop per batch."""
    remaining = counts[batches] - done
    order = np.argsort(-remaining, kind="stable")  # most records first: the batches still walking form a prefix
    batches, pos, done, remaining = batches[order], cur[order].copy(), done[order], remaining[order]
    batch_ends = ends[batches]
    slot0 = first_slot[batches] + done
    step = 0
    active = len(batches)
    while active >= LOCKSTEP_MIN_ACTIVE:
        p = pos[:active]
        value, size = _varints(arr, p)
        slots = slot0[:active] + step
        body[slots] = p + size
        length[slots] = value
        pos[:active] = p + size + np.maximum(value, 0)
        bad = (value < 0) | (pos[:active] > batch_ends[:active])
        if bad.any():
            where = int(positions[batches[np.argmax(bad)]])
            raise CorruptRecordError(f"batch at byte {where}: a record declares a length past the end of the batch")
        step += 1
        while active and remaining[active - 1] <= step:
            active -= 1
    for rank in range(active):
        batch = int(batches[rank])
        _frame_one(data, int(pos[rank]), int(batch_ends[rank]), int(remaining[rank]) - step,
                   int(slot0[rank]) + step, body, length, int(positions[batch]))  # fmt: skip
        pos[rank] = batch_ends[rank]
    short = pos != batch_ends
    if short.any():
        where = int(np.argmax(short))
        raise CorruptRecordError(
            f"batch at byte {int(positions[batches[where]])}: incorrect declared batch size, "
            f"{int(batch_ends[where] - pos[where])} bytes left after its records"
        )


def _frame_one(
    data: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    count: int,
    slot: int,
    body: np.ndarray,
    length: np.ndarray,
    position: int,
) -> None:
    """Walk `count` records of one batch from `pos` (the plain loop: one varint per record)."""
    bodies: list[int] = []
    lengths: list[int] = []
    add_body = bodies.append
    add_length = lengths.append
    for _ in range(count):
        if pos >= end:
            raise CorruptRecordError(f"batch at byte {position}: records run past the end of the batch")
        b = data[pos]
        if b < 0x80:
            value = b
            pos += 1
        else:
            value, shift = b & 0x7F, 7
            pos += 1
            while True:
                if pos >= end or shift > 28:
                    raise CorruptRecordError(f"batch at byte {position}: a bad record length varint")
                b = data[pos]
                pos += 1
                value |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
        n = (value >> 1) ^ -(value & 1)
        if n < 0 or pos + n > end:
            raise CorruptRecordError(f"batch at byte {position}: a record declares length {n}, past the batch end")
        add_body(pos)
        add_length(n)
        pos += n
    if pos != end:
        raise CorruptRecordError(f"batch at byte {position}: incorrect declared batch size, {end - pos} bytes left")
    body[slot : slot + len(bodies)] = bodies
    length[slot : slot + len(lengths)] = lengths


# --- batches to columns --------------------------------------------------------------------------------------


def _eight_byte_windows(arr: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The 8 bytes at each position as one big-endian uint64 (positions at most PADDING - 8 past the data)."""
    windows = np.lib.stride_tricks.as_strided(arr, shape=(len(arr) - 7, 8), strides=(1, 1), writeable=False)
    return windows[pos].view(">u8").ravel().astype(np.uint64)


def _from_window(window: np.ndarray, offset: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """(value, size) of the 1- or 2-byte varint at byte `offset` (0..6) of each window; size 0: longer."""
    code = (window >> (np.uint64(48) - np.asarray(offset, dtype=np.uint64) * np.uint64(8))) & np.uint64(0xFFFF)
    packed = _TWO_BYTES[code.astype(np.intp)]
    return packed >> 4, packed & 15


def _record_prefix(arr: np.ndarray, body: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """timestampDelta, offsetDelta and keyLength of each record, and where its key starts."""
    window = _eight_byte_windows(arr, body)
    timestamp_delta, size1 = _from_window(window, 1)
    offset_delta, size2 = _from_window(window, 1 + size1)
    key_length, size3 = _from_window(window, 1 + size1 + size2)
    if min(size1.min(), size2.min(), size3.min()) > 0:
        return timestamp_delta, offset_delta, key_length, body + 1 + size1 + size2 + size3
    # Some field is longer than two bytes (a timestamp delta of hours, a key of 8 KiB or more): the general path.
    p = body + 1  # body <= the end of the data: these reads stay within 1 + 10 + 5 bytes past it, in the padding
    timestamp_delta, size = _varints(arr, p, 10, in_bounds=True)
    p = p + size
    offset_delta, size = _varints(arr, p, in_bounds=True)
    p = p + size
    key_length, size = _varints(arr, p, in_bounds=True)
    return timestamp_delta, offset_delta, key_length, p + size


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
    if codecs.any():
        view = memoryview(buf)
        sections: list[bytes | memoryview] = []
        cursor = 0
        starts_list: list[int] = []
        for pos, size, codec in zip(positions.tolist(), table.size.tolist(), codecs.tolist(), strict=True):
            raw = view[pos + HEADER_SIZE : pos + size]
            try:
                section = decompress(Compression.from_id(codec), raw) if codec else raw
            except CorruptRecordError as exc:
                raise CorruptRecordError(f"batch at byte {pos}: {exc}") from exc
            starts_list.append(cursor)
            cursor += len(section)
            sections.append(section)
        sections.append(bytes(PADDING))
        data: bytes | bytearray | memoryview = b"".join(sections)
        starts = np.array(starts_list, dtype=np.int64)
        ends = np.append(starts[1:], cursor).astype(np.int64)
    else:
        # Varint windows may read a few bytes past the last batch: room for them, without a copy if `buf` has it.
        data = buf if len(buf) >= table.end + PADDING else bytes(buf) + bytes(PADDING)
        starts = positions + HEADER_SIZE
        ends = positions + table.size
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
    body, length = _frame_records(data, arr, starts, ends, counts, positions)
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
    timestamp_delta, offset_delta, key_length, p = _record_prefix(arr, body)
    key_start = p
    p = key_start + np.maximum(key_length, 0)
    check(p, "key")
    value_length, size = _varints(arr, p, in_bounds=True)
    value_start = p + size
    p = value_start + np.maximum(value_length, 0)
    check(p, "value")
    header_count, size = _varints(arr, p, in_bounds=True)
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
        p, hks, hkl, hvs, hvl = _decode_headers(arr, p, header_count, record_end, positions, batch_of)
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
    if codecs.any():
        view = memoryview(buf)
        sections: list[bytes | memoryview] = []
        starts_list: list[int] = []
        cursor = 0
        for pos, size, codec in zip(positions.tolist(), table.size.tolist(), codecs.tolist(), strict=True):
            raw = view[pos + HEADER_SIZE : pos + size]
            try:
                section = decompress(Compression.from_id(codec), raw) if codec else raw
            except CorruptRecordError as exc:
                raise CorruptRecordError(f"batch at byte {pos}: {exc}") from exc
            starts_list.append(cursor)
            cursor += len(section)
            sections.append(section)
        sections.append(bytes(PADDING))
        data: bytes | bytearray | memoryview = b"".join(sections)
        starts = np.array(starts_list, dtype=np.int64)
        ends = np.append(starts[1:], cursor).astype(np.int64)
    else:
        data = buf if len(buf) >= table.end + PADDING else bytes(buf) + bytes(PADDING)
        starts = positions + HEADER_SIZE
        ends = positions + table.size
    if (counts * MIN_RECORD_BYTES > ends - starts).any():
        where = int(np.argmax(counts * MIN_RECORD_BYTES > ends - starts))
        raise CorruptRecordError(f"batch at byte {int(positions[where])} declares more records than it has bytes for")
    arr = np.frombuffer(data, dtype=np.uint8)
    body, length = _frame_records(data, arr, starts, ends, counts, positions)
    record_end = body + length
    timestamp_delta, offset_delta, key_length, key_start = _record_prefix(arr, body)
    tail_start = key_start - _varint_size(key_length)
    value_at = key_start + np.maximum(key_length, 0)
    value_length, _ = _varints(arr, value_at, in_bounds=True)
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
            w = _eight_byte_windows(arr, starts[live] + word)
            remaining = lengths[live] - np.uint64(word)
        else:
            w = _eight_byte_windows(arr, starts + word)
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


def _decode_headers(
    arr: np.ndarray,
    p: np.ndarray,
    header_count: np.ndarray,
    record_end: np.ndarray,
    positions: np.ndarray,
    batch_of: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Walk header j of every record that has one, for j = 0, 1, ... (headers per record are few)."""
    total = int(header_count.sum())
    first = np.cumsum(header_count) - header_count
    key_start = np.empty(total, dtype=np.int64)
    key_length = np.empty(total, dtype=np.int64)
    value_start = np.empty(total, dtype=np.int64)
    value_length = np.empty(total, dtype=np.int64)
    p = p.copy()
    for j in range(int(header_count.max())):
        sel = np.nonzero(header_count > j)[0]
        q = p[sel]
        kl, size = _varints(arr, q)
        if (kl < 0).any():
            where = int(positions[batch_of[sel[int(np.argmax(kl < 0))]]])
            raise CorruptRecordError(f"batch at byte {where}: a record header has a null key")
        ks = q + size
        q = ks + kl
        vl, size = _varints(arr, q)
        vs = q + size
        q = vs + np.maximum(vl, 0)
        over = q > record_end[sel]
        if over.any():
            where = int(positions[batch_of[sel[int(np.argmax(over))]]])
            raise CorruptRecordError(f"batch at byte {where}: record headers run past the end of the record")
        slots = first[sel] + j
        key_start[slots] = ks
        key_length[slots] = kl
        value_start[slots] = vs
        value_length[slots] = vl
        p[sel] = q
    return p, key_start, key_length, value_start, value_length


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


# --- checking the records of a produced batch (Kafka's LogValidator) ----------------------------------------

# Up to this many records a batch that does not come in runs (_check_runs) is walked by a Python loop: below it the
# loop costs less than the general numpy path (measured for 100-byte records: the loop about 0.6 µs a record; numpy
# about 45 µs a batch plus 0.1 µs a record).
FEW_RECORDS = 160
FRAME_WALK_MAX = 48
TAIL_BYTES = 24
_PADDING_BYTES = bytes(PADDING)
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
    raw = memoryview(buf)[pos + HEADER_SIZE : pos + header.size_in_bytes]
    codec = header.attributes & COMPRESSION_MASK
    section: bytes | memoryview = raw
    if codec and header.records_count:
        try:
            section = decompress(Compression.from_id(codec), raw)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"batch at byte {pos}: {exc}") from exc
    count = header.records_count
    if count * MIN_RECORD_BYTES > len(section):
        raise CorruptRecordError(f"batch at byte {pos} declares {count} records in {len(section)} bytes")
    check = _check_runs(section, count, header.base_timestamp, pos)
    if check is None:
        if count <= FEW_RECORDS:
            check = _walk_records(section, count, header.base_timestamp, pos)
        else:
            check = _check_records_columnar(section, count, header.base_timestamp, pos)
    if header.attributes & TIMESTAMP_TYPE_MASK:
        return check._replace(max_timestamp=header.max_timestamp)
    return check


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
    """check_batch_records for a batch of many records: the records framed (_frame_batch), then every field of all
    records at once, in place (no copy of the section). Records without headers whose fields are all in order
    pass one combined test; otherwise each condition is tested in field order (naming the first record that fails
    it) and headers are decoded. The vectorised reads look up to TAIL_BYTES past a record's start, so the last
    record and any starting that close to the end of the section are walked instead."""
    arr = np.frombuffer(section, dtype=np.uint8)
    end = len(section)
    body, length = _frame_batch(section, arr, end, count, pos)
    record_end = body + length
    inner = min(int(np.searchsorted(body, end - TAIL_BYTES, side="right")), count - 1)
    tail = _walk_records(
        section[int(record_end[inner - 1]) if inner else 0 :], count - inner, base_timestamp, pos, inner
    )
    if inner == 0:
        return tail
    body, record_end = body[:inner], record_end[:inner]
    timestamp_delta, offset_delta, key_length, key_start = _record_prefix(arr, body)
    key_end = key_start + np.maximum(key_length, 0)
    value_at = np.minimum(key_end, record_end - 1)  # inside the records even where a length lies
    value_length, size = _varints(arr, value_at, in_bounds=True)
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


# --- the common shape: runs of records laid out alike ----------------------------------------------------------

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
    np.where(_TWO_BYTES[::256] & 15 == 1, _TWO_BYTES[::256] >> 4, _NOT_THIS_WIDTH).astype(np.int32),
    np.where(_TWO_BYTES & 15 == 2, _TWO_BYTES >> 4, _NOT_THIS_WIDTH).astype(np.int32),
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
    value_length, size = _varints(arr, key_end, in_bounds=True)
    refuse(value_length < -1, "declares a value length below -1")
    p = key_end + size + np.maximum(value_length, 0)
    refuse(p >= record_end, "has a value running past its end")
    header_count, size = _varints(arr, p, in_bounds=True)
    p = p + size
    refuse(header_count < 0, "declares a negative header count")
    refuse(header_count * 2 > record_end - p, "declares more headers than it has bytes for")
    if header_count.any():
        positions = np.array([pos], dtype=np.int64)
        p = _decode_headers(arr, p, header_count, record_end, positions, np.zeros(count, dtype=np.int64))[0]
    refuse(p != record_end, "has fields that do not add up to its declared length")


def _offset_delta_bytes_before(k: np.ndarray) -> np.ndarray:
    """Bytes the offset-delta varints of records 0..k-1 take when record i has delta i: 1 each up to 63, 2 up to
    8191, then 3 (a 4-byte delta, past 2^20 records, is not predicted: it only ends a run)."""
    return k + np.maximum(k - 64, 0) + np.maximum(k - 8192, 0)


def _frame_batch(
    data: bytes | bytearray | memoryview, arr: np.ndarray, end: int, count: int, pos: int
) -> tuple[np.ndarray, np.ndarray]:
    """Body start and body length of each of the `count` records that must fill data[0:end] (one batch).

    As _frame_runs, for one batch: from the record at the cursor, all later records are predicted at once to have
    its size, plus a byte where their offset delta (their index, as a producer writes it) needs a longer varint;
    the prediction is checked for every record in one go and accepted up to the first that does not match (exact:
    each accepted record was read where the ones before it end). A run shorter than RUN_MIN_MEAN records means
    sizes vary: the rest is walked record by record, as are the last FRAME_WALK_MAX records (a round of numpy
    calls costs as much as walking about that many)."""
    body = np.empty(count, dtype=np.int64)
    length = np.empty(count, dtype=np.int64)
    index = np.arange(count + 1, dtype=np.int64)
    width_sum = _offset_delta_bytes_before(index)
    widths = np.diff(width_sum)
    cur = done = 0
    while count - done > FRAME_WALK_MAX:
        try:
            value, after = decode_varint(data, cur)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"batch at byte {pos}: record {done} has a bad length: {exc}") from exc
        stride = after - cur + value
        if value < 0 or cur + stride > end:
            raise CorruptRecordError(f"batch at byte {pos}: record {done} declares length {value}, past the batch end")
        base = stride - int(widths[done])
        candidate = cur + index[: count - done] * base + (width_sum[done:count] - width_sum[done])
        predicted = base + widths[done:]
        cand_value, cand_size = _varints(arr, candidate, strict=False)
        fits = (cand_size > 0) & (cand_size + cand_value == predicted) & (candidate + predicted <= end)
        run = count - done if fits.all() else int(np.argmin(fits))
        body[done : done + run] = candidate[:run] + cand_size[:run]
        length[done : done + run] = cand_value[:run]
        cur += run * base + int(width_sum[done + run] - width_sum[done])
        done += run
        if run < RUN_MIN_MEAN:
            break
    if done < count:  # sizes vary, or only a few records are left
        _frame_one(data, cur, end, count - done, done, body, length, pos)
    elif cur != end:
        raise CorruptRecordError(
            f"batch at byte {pos}: incorrect declared batch size, {end - cur} bytes left after its {count} records"
        )
    return body, length


# --- the records of one produced batch, as columns -----------------------------------------------------------


# decode_batch walks up to DECODE_WALK_RECORDS records (about 1 µs a record) rather than decoding each field of all
# records at once with numpy (about 25 µs a batch, framing included); up to FRAME_WALK_RECORDS it frames records by
# walking their lengths (0.25 µs a record) rather than by _frame_batch's predictions (40 µs and more a batch unless
# its records are all of one size). Measured on batches of 1 KiB records with keys of 4 to 6 bytes.
DECODE_WALK_RECORDS = 32
FRAME_WALK_RECORDS = 256


def decode_batch(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> RecordColumns:
    """decode_v2 for the one v2 data batch at `pos` (a batch a producer sent, `header` read from it), with a small
    fixed cost: up to DECODE_WALK_RECORDS records are walked one by one (_walk_batch); more are framed by a walk
    over their length varints (the sequential chain), or beyond FRAME_WALK_RECORDS by _frame_batch (runs of
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
    raw = memoryview(buf)[pos + HEADER_SIZE : pos + header.size_in_bytes]
    codec = header.attributes & COMPRESSION_MASK
    section: bytes | memoryview = raw
    if codec:
        try:
            section = decompress(Compression.from_id(codec), raw)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"batch at byte {pos}: {exc}") from exc
    if count * MIN_RECORD_BYTES > len(section):
        raise CorruptRecordError(f"batch at byte {pos} declares {count} records in {len(section)} bytes")
    data = b"".join((section, _PADDING_BYTES))  # room for the vectorised reads past the last record
    if count <= DECODE_WALK_RECORDS:
        return _walk_batch(data, len(section), count, pos, header)
    arr = np.frombuffer(data, dtype=np.uint8)
    if count <= FRAME_WALK_RECORDS:
        body = np.empty(count, dtype=np.int64)
        length = np.empty(count, dtype=np.int64)
        _frame_one(data, 0, len(section), count, 0, body, length, pos)
    else:
        body, length = _frame_batch(data, arr, len(section), count, pos)
    record_end = body + length
    windows = np.ndarray((len(data) - 1,), dtype=">u2", buffer=data, strides=(1,))  # bytes [i, i+2) at i

    def varints(p: np.ndarray, max_bytes: int = 5) -> tuple[np.ndarray, np.ndarray]:
        packed = _TWO_BYTES[windows[p]]
        size = packed & 15
        if np.count_nonzero(size) == count:  # all of one or two bytes (count_nonzero: the cheapest reduction)
            return packed >> 4, size
        return _varints(arr, p, max_bytes, in_bounds=True)

    timestamp_delta, size = varints(body + 1, 10)  # after the unused attributes byte
    offset_delta, size2 = varints(body + 1 + size)
    key_start = body + 1 + size + size2
    key_length, size = varints(key_start)
    key_start = key_start + size
    value_start = key_start + np.maximum(key_length, 0)
    value_length, size = varints(value_start)
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
        header_count, size = _varints(arr, p, in_bounds=True)
        header_count = header_count.astype(np.int64)
        p = p + size
        for bad, what in (
            (header_count < 0, "declares a negative header count"),
            (header_count * 2 > record_end - p, "declares more headers than it has bytes for"),
        ):
            if bad.any():
                raise CorruptRecordError(f"batch at byte {pos}: record {int(np.argmax(bad))} {what}")
        if header_count.any():
            p, hks, hkl, hvs, hvl = _decode_headers(
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
