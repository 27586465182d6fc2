"""The batch chain of a record set as numpy arrays: where each complete entry lies and its parsed v2 header.

- `BatchTable` holds, for each entry, its byte position, total size (the 12-byte offset/size prefix included),
  magic and header (meaningful where magic is 2), with the offsets, timestamps and control flags derived from them.
  batch_chain.py's walk finds the entries (scan_chain over a buffer, ChainReader over a file) and its
  `batch_table(window)` gathers every 61-byte header into a structured array (HEADER_DTYPE) in one go.
- `table_sections(buf, table, codecs)` gives the records sections of a table's v2 batches as one buffer with the
  spare bytes record_framing's reads need, decompressing compressed batches once each.

Readers of stored batches (the Spark reader's batch_columns.decode_v2, the cleaner's record_layout) start here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tidelog.codec.compression import Compression, decompress
from tidelog.codec.record_batch import CONTROL_MASK, HEADER_SIZE, TRANSACTIONAL_MASK
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

    @property
    def is_transactional(self) -> np.ndarray:
        return (self.magic == 2) & ((self.header["attributes"] & TRANSACTIONAL_MASK) != 0)

    def take(self, selector: np.ndarray | slice) -> BatchTable:
        return BatchTable(self.position[selector], self.size[selector], self.magic[selector], self.header[selector])


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
