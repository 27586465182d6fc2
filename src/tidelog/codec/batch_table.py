"""The batch chain of a record set, as numpy arrays: where each complete entry lies and its parsed v2 header.

- `scan_batches(buf, start, end)` walks the entries from `start` (a Python step per *batch*: each entry's size
  says where the next starts) and gathers every 61-byte v2 header into a structured array (HEADER_DTYPE) in one
  go. It takes bytes of a log segment (or a record set); it returns a BatchTable of the complete entries, stopping
  quietly at a partial entry at the tail like Kafka's FileLogInputStream, and raises CorruptRecordError for an
  entry size no message format allows, a v2 batch shorter than its header or an unknown magic. CRCs are not
  checked.
- `BatchTable` holds, for each entry, its byte position, total size (the 12-byte offset/size prefix included),
  magic and header (meaningful where magic is 2), with the offsets, timestamps and control flags derived from them.
- `table_sections(buf, table, codecs)` gives the records sections of a table's v2 batches as one buffer with the
  spare bytes record_framing's reads need, decompressing compressed batches once each.

Readers of stored batches (the Spark reader's batch_columns.decode_v2, the cleaner's record_layout) start here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from tidelog.codec.compression import Compression, decompress
from tidelog.codec.legacy import RECORD_OVERHEAD_V0
from tidelog.codec.record_batch import (
    CONTROL_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MIN_BATCH_LENGTH,
)
from tidelog.codec.record_framing import PADDING
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

_OFFSET_AND_SIZE = struct.Struct(">qi")
_HEADER_COLUMNS = np.arange(HEADER_SIZE)


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


def table_sections(
    buf: bytes | bytearray | memoryview, table: BatchTable, codecs: np.ndarray
) -> tuple[bytes | bytearray | memoryview, np.ndarray, np.ndarray]:
    """(data, starts, ends): the records sections of the v2 batches in `table` (which lie in `buf`; `codecs` is each
    one's compression id), batch b's records filling data[starts[b]:ends[b]], and `data` ending with at least
    PADDING spare bytes (record_framing's reads past a record). When any batch is compressed, the sections are
    joined into a new buffer (compressed ones decompressed, once each); otherwise `data` is `buf` itself (copied
    only when it lacks the spare bytes) and the positions are the batches' own. A section that does not
    decompress raises CorruptRecordError naming its batch's byte position."""
    positions = table.position
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
    return data, starts, ends
