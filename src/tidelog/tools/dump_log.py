"""`tidelog dump-log`: print segment files in the line format of Kafka's kafka-dump-log.sh (DumpLogSegments).

    Dumping /data/t-0/00000000000000000000.log
    Log starting offset: 0
    baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1
      partitionLeaderEpoch: 0 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty
      position: 0 CreateTime: 1700000000000 size: 70 magic: 2 compresscodec: none crc: 3919285720 isvalid: true
    | offset: 0 CreateTime: 1700000000000 keySize: 1 valueSize: 1 sequence: -1 headerKeys: [] key: k payload: v

(the batch line is one line). `.index` files print `offset: O position: P`, `.timeindex` files
`timestamp: T offset: O`, `.txnindex` files their aborted transactions; mismatches between an index
and its log go to stderr at the end, as Kafka does. Bytes after the last whole batch are reported as
`Found N invalid bytes at the end of <name>`. Files are only read, never modified or mapped: `.log` files are
walked with codec/batch_chain.py's ChainReader, indexes opened read-only with the storage engine's OffsetIndex and
TimeIndex (as Kafka's tool opens its own index classes), so a live broker's segments can be dumped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tidelog.codec import legacy
from tidelog.codec.batch_chain import ChainReader
from tidelog.codec.compression import Compression
from tidelog.codec.control_record import ControlRecordType, parse_control_record
from tidelog.codec.record_batch import (
    NO_SEQUENCE,
    BatchHeader,
    Record,
    TimestampType,
    decode_records,
)
from tidelog.codec.record_set import BatchInfo, decode_batch, is_valid, read_batch_info
from tidelog.errors import CorruptIndexError, TidelogError
from tidelog.storage.common.aborted_txn import ENTRY as TXN_ENTRY
from tidelog.storage.kafka.offset_index import OffsetIndex
from tidelog.storage.kafka.time_index import TimeIndex

INT_MAX = (1 << 31) - 1
READ_BYTES = 8 << 20  # a window of the log read at once (a larger batch is read whole)
LOOKUP_BYTES = 64 << 10  # the same to find the batch an index entry names


@dataclass
class DumpOptions:
    print_data_log: bool = False
    deep_iteration: bool = False
    verify_index_only: bool = False
    index_sanity_check: bool = False
    skip_record_metadata: bool = False
    max_bytes: int = INT_MAX
    max_message_size: int = 5 * 1024 * 1024

    @property
    def is_deep_iteration(self) -> bool:
        return self.deep_iteration or self.print_data_log


@dataclass
class _Problems:
    """Findings Kafka collects while dumping and prints to stderr once every file is done."""

    index_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_out_of_order: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_not_found: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    non_consecutive: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def print(self, err: TextIO) -> None:
        for name, pairs in self.index_mismatches.items():
            print(f"Mismatches in :{name}", file=err)
            for index_offset, log_offset in reversed(pairs):
                print(f"  Index offset: {index_offset}, log offset: {log_offset}", file=err)
        for name, pairs in self.time_mismatches.items():
            print(f"Found timestamp mismatch in :{name}", file=err)
            for index_ts, log_ts in pairs:
                print(f"  Index timestamp: {index_ts}, log timestamp: {log_ts}", file=err)
        for name, pairs in self.time_out_of_order.items():
            print(f"Found out of order timestamp in :{name}", file=err)
            for index_ts, previous in pairs:
                print(f"  Index timestamp: {index_ts}, Previously indexed timestamp: {previous}", file=err)
        for pairs in self.time_not_found.values():
            print("The following indexed offsets are not found in the log.", file=err)
            for indexed, found in pairs:
                print(f"Indexed offset: {indexed}, found log offset: {found}", file=err)
        for name, pairs in self.non_consecutive.items():
            print(f"Non-consecutive offsets in {name}", file=err)
            for first, second in reversed(pairs):
                print(f"  {first} is followed by {second}", file=err)


def dump_files(files: list[str], options: DumpOptions, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Dump each file to `out` (default stdout), problems to `err`; returns 0, or 1 if a file could not be read."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    problems = _Problems()
    status = 0
    for name in files:
        path = Path(name)
        print(f"Dumping {name}", file=out)
        suffix = path.suffix
        if suffix in (".log", ".index", ".timeindex", ".txnindex") and not path.name.split(".")[0].isdigit():
            print(f"Cannot dump {name}: a segment file's name must start with its base offset", file=err)
            status = 1
            continue
        try:
            if suffix == ".log":
                _dump_log(path, options, problems, out, err)
            elif suffix == ".index":
                _dump_index(path, options, problems, out)
            elif suffix == ".timeindex":
                _dump_time_index(path, options, problems, out)
            elif suffix == ".txnindex":
                _dump_txn_index(path, out, err)
            else:
                print(f"Ignoring unknown file {name}", file=err)
        except OSError as exc:
            print(f"Cannot read {name}: {exc.strerror}", file=err)
            status = 1
    problems.print(err)
    return status


def _batches(chain: ChainReader) -> Iterator[tuple[bytes | memoryview, BatchInfo]]:
    """(window, batch) for each whole batch of the chain; raises TidelogError for a batch that does not decode."""
    for window in chain:
        for pos in window.positions:
            info = read_batch_info(window.data, pos)
            assert info is not None  # the chain holds it whole
            yield window.data, info


def _base_offset(path: Path) -> int:
    return int(path.name.split(".")[0])


def _bool(value: bool) -> str:
    return "true" if value else "false"


# --- .log -------------------------------------------------------------------------------------------------------


def _dump_log(path: Path, options: DumpOptions, problems: _Problems, out: TextIO, err: TextIO) -> None:
    print(f"Log starting offset: {_base_offset(path)}", file=out)
    with open(path, "rb") as handle:
        end = min(os.fstat(handle.fileno()).st_size, options.max_bytes)
        chain = ChainReader(handle.fileno(), 0, end, window=READ_BYTES)
        valid_bytes = 0
        last_offset = -1
        try:
            for data, info in _batches(chain):
                print(_batch_line(data, info, valid_bytes), file=out)
                if options.is_deep_iteration:
                    for line, offset in _record_lines(data, info, options):
                        if last_offset != -1 and offset != last_offset + 1:
                            problems.non_consecutive.setdefault(str(path.resolve()), []).append((last_offset, offset))
                        last_offset = offset
                        print(line, file=out)
                valid_bytes += info.size
        except TidelogError as exc:
            print(f"Stopped at byte {valid_bytes} of {path.name}: {exc}", file=err)
        else:
            assert chain.stopped is not None
            if chain.stopped.stop.is_damage:
                print(f"Stopped at byte {valid_bytes} of {path.name}: {chain.stopped.detail}", file=err)
    trailing = end - valid_bytes
    if trailing > 0 and options.max_bytes == INT_MAX:
        print(f"Found {trailing} invalid bytes at the end of {path.name}", file=out)


def _batch_line(data: bytes | memoryview, info: BatchInfo, position: int) -> str:
    valid = is_valid(data, info)
    tail = (
        f" position: {position} {info.timestamp_type.kafka_name}: {info.max_timestamp} size: {info.size}"
        f" magic: {info.magic} compresscodec: {info.compression.kafka_name} crc: {info.crc} isvalid: {_bool(valid)}"
    )
    header = info.header
    if isinstance(header, BatchHeader):
        horizon = header.delete_horizon_ms
        horizon_text = "OptionalLong.empty" if horizon is None else f"OptionalLong[{horizon}]"
        return (
            f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.records_count}"
            f" baseSequence: {header.base_sequence} lastSequence: {header.last_sequence}"
            f" producerId: {header.producer_id} producerEpoch: {header.producer_epoch}"
            f" partitionLeaderEpoch: {header.partition_leader_epoch} isTransactional: {_bool(header.is_transactional)}"
            f" isControl: {_bool(header.is_control)} deleteHorizonMs: {horizon_text}" + tail
        )
    return f"offset: {info.last_offset}" + tail


def _record_lines(data: bytes | memoryview, info: BatchInfo, options: DumpOptions) -> Iterator[tuple[str, int]]:
    timestamp_name = info.timestamp_type.kafka_name
    header = info.header
    if isinstance(header, BatchHeader):
        for record in decode_records(data, info.position, header):
            prefix = "| "
            parts = []
            if not options.skip_record_metadata:
                sequence = NO_SEQUENCE
                if header.base_sequence >= 0:
                    sequence = (header.base_sequence + record.offset - header.base_offset) & 0x7FFFFFFF
                keys = ",".join(k for k, _ in record.headers)
                parts.append(
                    f"{prefix}offset: {record.offset} {timestamp_name}: {record.timestamp_ms}"
                    f" keySize: {_size(record.key)} valueSize: {_size(record.value)}"
                    f" sequence: {sequence} headerKeys: [{keys}]"
                )
                if header.is_control:
                    parts.append(_control_text(record))
                prefix = " "
            if options.print_data_log and not header.is_control:
                parts.append(_data_text(record, prefix))
            yield "".join(parts), record.offset
        return
    assert isinstance(header, legacy.LegacyMessage)
    wrapper_time = header.timestamp if info.timestamp_type is TimestampType.LOG_APPEND_TIME else None
    inner_data: bytes | memoryview  # the set the messages' positions index into: the log, or the decompressed wrapper
    if header.compression is Compression.NONE:
        inner, inner_data = [header], data
    else:
        inner_data = legacy.decompress_wrapper(header)
        inner = legacy.inner_messages(header, inner_data)
    for message in inner:
        timestamp = wrapper_time if wrapper_time is not None else message.timestamp
        record = Record(message.value, message.key, timestamp, (), message.offset)
        prefix = "| "
        parts = []
        if not options.skip_record_metadata:
            parts.append(
                f"{prefix}offset: {message.offset} {timestamp_name}: {timestamp}"
                f" keySize: {_size(message.key)} valueSize: {_size(message.value)}"
                f" isValid: {_bool(legacy.legacy_crc(inner_data, message) == message.crc)} crc: {message.crc}}}"
            )
            prefix = " "
        if options.print_data_log:
            parts.append(_data_text(record, prefix))
        yield "".join(parts), message.offset


def _size(value: bytes | None) -> int:
    return -1 if value is None else len(value)


def _data_text(record: Record, prefix: str) -> str:
    text = ""
    if record.key is not None:
        text += f"{prefix}key: {record.key.decode('utf-8', 'replace')}"
    if record.value is not None:
        text += f" payload: {record.value.decode('utf-8', 'replace')}"
    return text


def _control_text(record: Record) -> str:
    try:
        control_type, epoch = parse_control_record(record)
    except TidelogError as exc:
        return f" controlType: unreadable ({exc})"
    if control_type in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        assert isinstance(control_type, ControlRecordType)
        return f" endTxnMarker: {control_type.name} coordinatorEpoch: {epoch}"
    if isinstance(control_type, ControlRecordType):
        return f" controlType: {control_type.name}({control_type.value})"
    return f" controlType: UNKNOWN({control_type})"


# --- .index and .timeindex ---------------------------------------------------------------------------------------


def _first_batch_with(
    log_path: Path, position: int, offset: int, limit: int = INT_MAX
) -> tuple[bytes | memoryview, BatchInfo] | None:
    """The first batch from `position` (within `limit` bytes of it) whose last offset >= `offset`, or None."""
    try:
        with open(log_path, "rb") as handle:
            end = min(os.fstat(handle.fileno()).st_size, position + limit)
            for data, info in _batches(ChainReader(handle.fileno(), position, end, window=LOOKUP_BYTES)):
                if info.last_offset >= offset:
                    return data, info
    except TidelogError:
        return None
    return None


def _print_sanity(index: OffsetIndex | TimeIndex, out: TextIO) -> None:
    """Kafka's sanity check of the index, reported as its message instead of an exception."""
    try:
        index.kafka_sanity_check()
    except CorruptIndexError as exc:
        print(exc, file=out)
    else:
        print(f"{index.path} passed sanity check.", file=out)


def _dump_index(path: Path, options: DumpOptions, problems: _Problems, out: TextIO) -> None:
    base = _base_offset(path)
    log_path = path.with_suffix(".log")
    with OffsetIndex(path, base, writable=False) as index:
        if index.entries == 0:
            print(f"{path} is empty.", file=out)
            return
        if options.index_sanity_check:
            _print_sanity(index, out)
            return
        for slot in range(index.entries):
            offset, position = index.entry_at(slot)
            if offset == base and slot > 0:  # preallocated zeros after a crash: stop, as Kafka does
                return
            batch = _first_batch_with(log_path, position, -1, options.max_message_size)
            found = batch[1].last_offset if batch is not None else -1
            if found != offset:
                problems.index_mismatches.setdefault(str(path.resolve()), []).append((offset, found))
            if not options.verify_index_only:
                print(f"offset: {offset} position: {position}", file=out)


def _dump_time_index(path: Path, options: DumpOptions, problems: _Problems, out: TextIO) -> None:
    base = _base_offset(path)
    log_path = path.with_suffix(".log")
    with (
        TimeIndex(path, base, writable=False) as index,
        OffsetIndex(path.with_suffix(".index"), base, writable=False) as offset_index,
    ):
        if options.index_sanity_check:
            _print_sanity(index, out)
            return
        key = str(path.resolve())
        previous = -1
        for slot in range(index.entries):
            timestamp, offset = index.entry_at(slot)
            if offset == base and slot > 0:
                return
            batch = _first_batch_with(log_path, offset_index.lookup(offset).position, offset)
            if batch is None:
                problems.time_not_found.setdefault(key, []).append((offset, -1))
            elif batch[1].last_offset != offset:
                problems.time_not_found.setdefault(key, []).append((offset, batch[1].last_offset))
            else:
                data, info = batch
                max_timestamp = max((r.timestamp_ms or -1 for r in decode_batch(data, info)), default=-1)
                if max_timestamp != timestamp:
                    problems.time_mismatches.setdefault(key, []).append((timestamp, max_timestamp))
                if previous >= timestamp:
                    problems.time_out_of_order.setdefault(key, []).append((timestamp, previous))
            if not options.verify_index_only:
                print(f"timestamp: {timestamp} offset: {offset}", file=out)
            previous = timestamp


def _dump_txn_index(path: Path, out: TextIO, err: TextIO) -> None:
    raw = path.read_bytes()
    if len(raw) % TXN_ENTRY.size:
        print(f"{path}: length {len(raw)} is not a multiple of {TXN_ENTRY.size}; ignoring the tail", file=err)
    whole = raw[: len(raw) - len(raw) % TXN_ENTRY.size]
    for version, producer_id, first, last, last_stable in TXN_ENTRY.iter_unpack(whole):
        print(
            f"version: {version >> 8} producerId: {producer_id} firstOffset: {first} "
            f"lastOffset: {last} lastStableOffset: {last_stable}",
            file=out,
        )
