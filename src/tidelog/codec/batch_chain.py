"""The walk along the chain of stored batches in a `.log` file (or any record set), and where and why it stops.

Entry prefix, 17 bytes big-endian, the same in every message format:
offset int64 | size int32 | 4 bytes (v2: partitionLeaderEpoch; legacy: crc) | magic int8.
`size` counts the bytes after it, so the entry takes size + 12 bytes and the next one starts there: nothing else
is needed to walk. Magic 2 is a RecordBatch (61-byte header, record_batch.py), 0 and 1 legacy entries (legacy.py).

`scan_chain` walks a buffer, `ChainReader` a file a window at a time (whole entries, or only their headers so
large bodies are skipped unread). Both say where the chain stops and why (`ChainEnd`), checking in the order of
Kafka's FileLogInputStream:

- END: the bytes end right after an entry;
- TORN_TAIL: fewer than the 17 prefix bytes are left;
- BAD_SIZE: a size no message format allows (below 14, or a v2 batch shorter than its header);
- BEYOND_END: an entry declares more bytes than are left - a batch being written at a live segment's tail, or
  one a crash cut short;
- BAD_MAGIC: a magic byte other than 0, 1 and 2, in an entry that is all there (its header, walking headers).

END, TORN_TAIL and BEYOND_END end a chain quietly (a reader stops there; recovery cuts the tail off), the others
are damage. `check_stored` adds what recovery checks of each entry: CRC, attributes, offsets that increase and fit
the segment (BAD_CRC, BAD_ATTRIBUTES, BAD_OFFSETS).

Every walk along stored batches is this one: a segment's reads and recovery (storage/kafka/segment.py), completing
an interrupted swap at load (log_loader.py, over headers), the log cleaner's reads (cleaner.py, with `batch_table`),
the Spark reader and dump-log.

Files are read with pread into fresh buffers, never mapped: a mapped file that another process truncates is a
SIGBUS. A reader walks up to the size it is given, so what a writer appends meanwhile is not looked at.
"""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from crc32c import crc32c

from tidelog.codec import legacy
from tidelog.codec.batch_table import HEADER_DTYPE, BatchTable
from tidelog.codec.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    HEADER_SIZE,
    KNOWN_ATTRIBUTE_BITS,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
)
from tidelog.codec.record_set import is_valid, read_batch_info
from tidelog.errors import TidelogError

PREFIX_SIZE = MAGIC_OFFSET + 1  # 17
_SIZE_AND_MAGIC = struct.Struct(">8xi4xb")  # an entry's size and magic fields
_V2_PREFIX = struct.Struct(">qiibIhiqq")  # baseOffset .. maxTimestamp: what recovery needs of a v2 header
_INT32 = struct.Struct(">i")
_RECORDS_COUNT_OFFSET = 57
_HEADER_COLUMNS = np.arange(HEADER_SIZE)


class Stop(enum.Enum):
    END = "end"
    MORE = "more"  # only from scan_chain given a limit past its bytes: the window ends inside the chain
    TORN_TAIL = "torn tail"
    BEYOND_END = "size beyond the end"
    BAD_SIZE = "bad size"
    BAD_MAGIC = "bad magic"
    BAD_CRC = "bad CRC"
    BAD_ATTRIBUTES = "bad attributes"
    BAD_OFFSETS = "bad offsets"

    @property
    def is_damage(self) -> bool:
        return self not in (Stop.END, Stop.MORE, Stop.TORN_TAIL, Stop.BEYOND_END)


class ChainEnd(NamedTuple):
    """Where a chain stops: `position` is the first byte after the last entry walked."""

    position: int
    stop: Stop
    detail: str = ""
    size: int = 0  # MORE: the bytes needed from `position` to go on

    def __str__(self) -> str:
        return f"at byte {self.position}: {self.detail}" if self.detail else f"at byte {self.position}"


class Chain(NamedTuple):
    positions: list[int]  # where each entry starts
    sizes: list[int]  # each entry's bytes, the 12-byte prefix included
    end: ChainEnd


def scan_chain(
    buf: bytes | bytearray | memoryview,
    start: int = 0,
    end: int | None = None,
    *,
    limit: int | None = None,
    whole: bool = True,
) -> Chain:
    """The entries of `buf` from `start` until the chain stops.

    `buf[start:end]` holds the bytes. `limit` (default: `end`) is where the chain must end, in `buf`'s positions:
    past `end` when `buf` is a window of a longer file; an entry the window holds only part of then stops the walk
    with MORE. With `whole=False` an entry counts once its first min(size, 61) bytes are there (a walk over
    headers that need not read the bodies)."""
    end = len(buf) if end is None else end
    limit = end if limit is None else limit
    positions: list[int] = []
    sizes: list[int] = []
    add_position, add_size = positions.append, sizes.append
    unpack = _SIZE_AND_MAGIC.unpack_from
    pos = start
    while True:
        left = end - pos
        if left < PREFIX_SIZE:
            if pos == limit:
                stop = ChainEnd(pos, Stop.END)
            elif limit - pos < PREFIX_SIZE:
                detail = f"{limit - pos} bytes are left, fewer than the {PREFIX_SIZE} an entry starts with"
                stop = ChainEnd(pos, Stop.TORN_TAIL, detail)
            else:
                stop = ChainEnd(pos, Stop.MORE, size=HEADER_SIZE)
            break
        length, magic = unpack(buf, pos)
        if length < legacy.RECORD_OVERHEAD_V0:
            stop = ChainEnd(pos, Stop.BAD_SIZE, f"entry declares size {length}, smaller than any message format allows")
            break
        size = length + LOG_OVERHEAD
        if size > left:  # not all in `buf`: beyond the end, or (a window) read on, unless its header is enough
            if size > limit - pos:
                stop = ChainEnd(pos, Stop.BEYOND_END, f"entry declares {size} bytes, {limit - pos} are left")
                break
            if whole or left < HEADER_SIZE:
                stop = ChainEnd(pos, Stop.MORE, size=size if whole else HEADER_SIZE)
                break
        if magic != MAGIC_V2:
            if magic < 0 or magic > 1:
                stop = ChainEnd(pos, Stop.BAD_MAGIC, f"entry has unknown magic {magic}")
                break
        elif length < MIN_BATCH_LENGTH:
            detail = f"batch declares batchLength {length}, below the v2 minimum {MIN_BATCH_LENGTH}"
            stop = ChainEnd(pos, Stop.BAD_SIZE, detail)
            break
        add_position(pos)
        add_size(size)
        pos += size
    return Chain(positions, sizes, stop)


class Window(NamedTuple):
    """Entries of a file read in one piece."""

    data: bytes | memoryview  # the bytes read, then the reader's `padding` spare bytes
    position: int  # the file byte of data[0]
    positions: list[int]  # where each entry starts in `data`
    sizes: list[int]


class ChainReader:
    """The chain of a file from `position` (an entry's start) up to `end` (say its size when the walk begins; none
    when `position` is past it).

    Iterating reads `window` bytes at a time (from a smaller `first_window` up, each read twice the one before),
    more when one entry needs it, and yields the entries of each read; then `stopped` says where and why the chain
    ends. A file that shrinks meanwhile ends the chain where its bytes do. Each read is a fresh buffer; given
    `padding`, a numpy array's memory with that many spare bytes after the data (the columnar decoder's varint
    windows read them)."""

    def __init__(
        self,
        fd: int,
        position: int,
        end: int,
        *,
        window: int,
        first_window: int | None = None,
        whole: bool = True,
        padding: int = 0,
    ) -> None:
        self.fd = fd
        self.position = position  # the next byte to walk
        self.end = max(end, position)
        self.window = window
        self.first_window = window if first_window is None else first_window
        self.whole = whole
        self.padding = padding
        self.stopped: ChainEnd | None = None

    def __iter__(self) -> Iterator[Window]:
        want = self.first_window
        while True:
            start = self.position
            length = min(want, self.end - start)
            data, got = self._read(start, length)
            limit = self.end - start if got == length else got
            positions, sizes, stop = scan_chain(data, 0, got, limit=limit, whole=self.whole)
            self.position = start + stop.position
            if positions:
                yield Window(data, start, positions, sizes)
            if stop.stop is not Stop.MORE:
                self.stopped = stop._replace(position=self.position)
                return
            want = max(min(2 * want, self.window), stop.size)

    def _read(self, position: int, length: int) -> tuple[bytes | memoryview, int]:
        """`length` bytes at `position` (fewer at the end of the file). With padding, into an uninitialised numpy
        buffer: a bytearray would be zero-filled first."""
        if not self.padding:
            data = os.pread(self.fd, length, position)
            return data, len(data)
        view = np.empty(length + self.padding, dtype=np.uint8).data
        done = 0
        while done < length:
            n = os.preadv(self.fd, [view[done:length]], position + done)
            if n <= 0:
                break
            done += n
        return view, done


def batch_table(window: Window) -> BatchTable:
    """The window's entries as the columnar decoder's table: every 61-byte header gathered into one numpy array (a
    legacy entry's row holds whatever its first bytes are)."""
    position = np.array(window.positions, dtype=np.int64)
    data = np.frombuffer(window.data, dtype=np.uint8)
    magic = data[position + MAGIC_OFFSET].view(np.int8)
    rows = data[np.minimum(position[:, None] + _HEADER_COLUMNS, len(data) - 1)]
    header = np.ascontiguousarray(rows).view(HEADER_DTYPE).reshape(-1)
    return BatchTable(position, np.array(window.sizes, dtype=np.int64), magic, header)


class StoredBatch(NamedTuple):
    position: int  # file byte
    size: int
    base_offset: int  # -1 for a compressed legacy wrapper
    last_offset: int
    max_timestamp: int
    partition_leader_epoch: int


def check_stored(
    window: Window, previous_last_offset: int, segment_base: int
) -> tuple[list[StoredBatch], ChainEnd | None]:
    """Recovery's checks of the window's entries, in order: the CRC, known attributes, and offsets that increase
    (from above `previous_last_offset`) and fit the segment (base <= offset <= base + 2^31-1). Returns the entries
    up to the first that fails, and why it fails (None when all pass). A tight loop over v2 headers; legacy entries
    take the general decoder."""
    view = window.data
    start = window.position
    batches: list[StoredBatch] = []
    append = batches.append
    last_offset = previous_last_offset
    max_offset = segment_base + 0x7FFFFFFF
    unpack_v2 = _V2_PREFIX.unpack_from
    for position, size in zip(window.positions, window.sizes, strict=True):
        if view[position + MAGIC_OFFSET] == MAGIC_V2:
            base, _length, epoch, _magic, crc, attributes, delta, _base_ts, max_ts = unpack_v2(view, position)
            if crc32c(view[position + ATTRIBUTES_OFFSET : position + size]) != crc:
                return batches, ChainEnd(start + position, Stop.BAD_CRC, "batch fails its CRC check")
            if attributes & ~KNOWN_ATTRIBUTE_BITS or attributes & COMPRESSION_MASK > 4:
                return batches, ChainEnd(start + position, Stop.BAD_ATTRIBUTES, "batch has invalid attributes")
            if delta < 0 or _INT32.unpack_from(view, position + _RECORDS_COUNT_OFFSET)[0] < 0:
                return batches, ChainEnd(start + position, Stop.BAD_OFFSETS, "batch has an impossible offset range")
            last = base + delta
        else:
            entry = view[position : position + size]
            try:
                info = read_batch_info(entry, 0)
            except TidelogError as exc:
                return batches, ChainEnd(start + position, Stop.BAD_SIZE, f"legacy entry does not decode: {exc}")
            assert info is not None  # the entry is all there
            if not is_valid(entry, info):
                return batches, ChainEnd(start + position, Stop.BAD_CRC, "legacy entry fails its CRC check")
            base, last, max_ts, epoch = info.base_offset, info.last_offset, info.max_timestamp, -1
        if last <= last_offset or 0 <= base <= last_offset:
            detail = f"batch has offset {last}, not above {last_offset}"
            return batches, ChainEnd(start + position, Stop.BAD_OFFSETS, detail)
        if last > max_offset or 0 <= base < segment_base:
            return batches, ChainEnd(start + position, Stop.BAD_OFFSETS, f"batch has offset {last} off the segment")
        append(StoredBatch(start + position, size, base, last, max_ts, epoch))
        last_offset = last
    return batches, None
