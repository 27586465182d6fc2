"""Offline tools for a RocketMQ-engine store directory (`--store DIR`, the directory holding `commitlog/`):

    tidelog dump-commitlog     --store DIR [--print-body]
    tidelog dump-consumequeue  --store DIR --topic T --queue Q
    tidelog query-message      --store DIR --topic T --key K [--begin MS] [--end MS] [--max N]
    tidelog query-message      --store DIR --msg-id ID

They only read: files are opened read-only and mapped read-only, nothing is locked, so they work on the store of a
running broker (they see what its page cache holds). Formats come from codec/rocketmq_message.py (messages),
storage/rocketmq/consume_queue.py (20-byte units) and storage/common/index_file.py (the key index).

dump-commitlog prints one line per message with MessageExt's field names (and the BLANK markers that end files);
query-message prints each match as mqadmin's queryMsgByKey/queryMsgById do (`OffsetID:`, `Topic:`, ... `Body:`).
The index only stores 4-byte key hashes and times in whole seconds, so query-message asks it for a window widened
by a second and reads every candidate, keeping the messages whose topic and key (or UNIQ_KEY) really match and whose
store time is in [begin, end] to the millisecond.
"""

from __future__ import annotations

import mmap
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tidelog.codec.rocketmq_message import (
    MAGIC_V1,
    Blank,
    InvalidMessage,
    Message,
    decode_message,
    decode_message_id,
    message_id,
)
from tidelog.errors import KafkaStorageError, ToolError
from tidelog.storage.common.index_file import HASH_SLOT_SIZE, HEADER_SIZE, INDEX_SIZE, MAX_MSGS_NUM_BATCH, IndexService
from tidelog.storage.rocketmq.commitlog import COMMITLOG_DIR
from tidelog.storage.rocketmq.consume_queue import CONSUME_QUEUE_DIR, CQ_STORE_UNIT_SIZE, UNIT
from tidelog.storage.rocketmq.index_builder import INDEX_DIR, message_index_keys

FILE_NAME = re.compile(r"^\d{20}$")
LONG_MAX = (1 << 63) - 1
INDEX_TIME_UNIT_MS = 1000  # an IndexFile entry keeps its time in whole seconds


class _ReadOnlyFile:
    def __init__(self, path: Path, stack: ExitStack) -> None:
        self.path = path
        self.start = int(path.name)
        fd = os.open(path, os.O_RDONLY)
        stack.callback(os.close, fd)
        self.size = os.fstat(fd).st_size
        self.data: mmap.mmap | bytes = mmap.mmap(fd, self.size, access=mmap.ACCESS_READ) if self.size else b""
        if isinstance(self.data, mmap.mmap):
            stack.callback(self.data.close)


class CommitLogReader:
    """The CommitLog files of a store, mapped read-only."""

    def __init__(self, store: Path, stack: ExitStack) -> None:
        directory = store / COMMITLOG_DIR
        if not directory.is_dir():
            raise ToolError(f"{store} is not a RocketMQ-engine store: it has no {COMMITLOG_DIR}/ directory")
        names = sorted(p.name for p in directory.iterdir() if FILE_NAME.match(p.name))
        self.files = [_ReadOnlyFile(directory / name, stack) for name in names]

    def file_for(self, offset: int) -> _ReadOnlyFile | None:
        for candidate in self.files:
            if candidate.start <= offset < candidate.start + candidate.size:
                return candidate
        return None

    def message_at(self, offset: int) -> Message | None:
        """The message stored at `offset`, or None when none starts there (its CRC is checked)."""
        found = self.file_for(offset)
        if found is None:
            return None
        try:
            item = decode_message(found.data, offset - found.start, check_crc=True)
        except InvalidMessage:
            return None
        if isinstance(item, Blank) or item.physical_offset != offset:
            return None
        return item

    def scan(self) -> Iterator[tuple[_ReadOnlyFile, int, Message | Blank | InvalidMessage]]:
        """Every message of every file in order, the BLANK marker ending a file, and the first undecodable bytes of
        a file (as an InvalidMessage, unless they are the zeros after the written data)."""
        for store_file in self.files:
            position = 0
            while position < store_file.size:
                try:
                    item = decode_message(store_file.data, position, check_crc=True)
                except InvalidMessage as exc:
                    if bytes(store_file.data[position : position + 8]) != bytes(8):
                        yield store_file, position, exc
                    break
                yield store_file, position, item
                if isinstance(item, Blank):
                    break
                position += item.total_size


# --- formatting ---------------------------------------------------------------------------------------------


def _time(ms: int) -> str:
    """UtilAll.timeMillisToHumanString2: local time, `yyyy-MM-dd HH:mm:ss,SSS`."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f",{ms % 1000:03d}"


def _body_text(body: bytes) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + body.hex()
    return text if text.isprintable() else repr(text)[1:-1]


def _properties_text(message: Message) -> str:
    return "{" + ", ".join(f"{name}={value}" for name, value in message.properties.items()) + "}"


def message_line(message: Message, *, print_body: bool) -> str:
    """One line of dump-commitlog (MessageExt's field names)."""
    line = (
        f"commitLogOffset: {message.physical_offset} storeSize: {message.total_size} "
        f"magic: {'v1' if message.magic == MAGIC_V1 else 'v2'} bodyCRC: {message.body_crc} "
        f"topic: {message.topic} queueId: {message.queue_id} queueOffset: {message.queue_offset} "
        f"flag: {message.flag} sysFlag: {message.sys_flag} bornTimestamp: {message.born_timestamp} "
        f"bornHost: {message.born_host} storeTimestamp: {message.store_timestamp} storeHost: {message.store_host} "
        f"reconsumeTimes: {message.reconsume_times} preparedTransactionOffset: {message.prepared_transaction_offset} "
        f"msgId: {message.msg_id()} properties: {_properties_text(message)}"
    )
    if print_body:
        line += f" body: {_body_text(message.body)}"
    return line


def print_message(message: Message, out: TextIO) -> None:
    """mqadmin's printMsg layout (one field per line), body included."""
    properties = message.properties
    rows = [
        ("OffsetID", message.msg_id()),
        ("Topic", message.topic),
        ("Tags", f"[{properties.get('TAGS', '')}]" if "TAGS" in properties else "[null]"),
        ("Keys", f"[{' '.join(message.keys)}]" if message.keys else "[null]"),
        ("Unique Key", message.uniq_key or "null"),
        ("Queue ID", message.queue_id),
        ("Queue Offset", message.queue_offset),
        ("CommitLog Offset", message.physical_offset),
        ("Reconsume Times", message.reconsume_times),
        ("Born Timestamp", _time(message.born_timestamp)),
        ("Store Timestamp", _time(message.store_timestamp)),
        ("Born Host", message.born_host),
        ("Store Host", message.store_host),
        ("System Flag", message.sys_flag),
        ("Properties", _properties_text(message)),
        ("Body", _body_text(message.body)),
    ]
    for name, value in rows:
        print(f"{name + ':':<21}{value}", file=out)
    print(file=out)


# --- the tools ----------------------------------------------------------------------------------------------


def dump_commitlog(store: Path, *, print_body: bool = False, out: TextIO | None = None) -> int:
    """Print every message of the CommitLog; returns 1 when a file holds bytes that are not messages."""
    out = out or sys.stdout
    problems = 0
    with ExitStack() as stack:
        reader = CommitLogReader(store, stack)
        current: _ReadOnlyFile | None = None
        count = 0
        for store_file, position, item in reader.scan():
            if store_file is not current:
                current = store_file
                print(f"Dumping {store_file.path}", file=out)
            if isinstance(item, InvalidMessage):
                problems += 1
                print(f"Found invalid bytes at {store_file.start + position}: {item.reason}", file=out)
            elif isinstance(item, Blank):
                print(f"BLANK at {store_file.start + position}: the last {item.remaining} bytes of the file", file=out)
            else:
                count += 1
                print(message_line(item, print_body=print_body), file=out)
        print(f"{count} message(s) in {len(reader.files)} file(s)", file=out)
    return 1 if problems else 0


def dump_consumequeue(store: Path, topic: str, queue_id: int, *, out: TextIO | None = None) -> int:
    """Print every unit of one ConsumeQueue, each checked against the message it points at; returns 1 when a unit
    points at no message of its topic, queue and offset."""
    out = out or sys.stdout
    directory = store / CONSUME_QUEUE_DIR / topic / str(queue_id)
    if not directory.is_dir():
        raise ToolError(f"no ConsumeQueue {directory} (topic {topic!r}, queue {queue_id})")
    problems = 0
    with ExitStack() as stack:
        commitlog = CommitLogReader(store, stack)
        for name in sorted(p.name for p in directory.iterdir() if FILE_NAME.match(p.name)):
            queue_file = _ReadOnlyFile(directory / name, stack)
            print(f"Dumping {queue_file.path}", file=out)
            data = queue_file.data
            for position in range(0, queue_file.size - CQ_STORE_UNIT_SIZE + 1, CQ_STORE_UNIT_SIZE):
                offset, size, tags_code = UNIT.unpack_from(data, position)
                if offset == 0 and size == 0 and tags_code == 0:
                    break  # the end of the written units
                queue_offset = (queue_file.start + position) // CQ_STORE_UNIT_SIZE
                line = f"queueOffset: {queue_offset} commitLogOffset: {offset} size: {size} tagsCode: {tags_code}"
                if size == 0x7FFFFFFF and offset == 0:
                    print(f"{line} (blank unit)", file=out)
                    continue
                message = commitlog.message_at(offset)
                if message is None:
                    verdict = "no message there"
                elif (message.topic, message.queue_id, message.queue_offset, message.total_size) != (
                    topic,
                    queue_id,
                    queue_offset,
                    size,
                ):
                    verdict = (
                        f"the message there is {message.topic}/{message.queue_id}@{message.queue_offset} "
                        f"of {message.total_size} bytes"
                    )
                else:
                    verdict = ""
                problems += bool(verdict)
                print(f"{line} {'valid: true' if not verdict else 'valid: false (' + verdict + ')'}", file=out)
    return 1 if problems else 0


@dataclass(frozen=True)
class IndexSizes:
    hash_slot_num: int
    index_num: int


def infer_index_sizes(store: Path, hash_slot_num: int | None, index_num: int | None) -> IndexSizes:
    """The slot and entry counts of the store's index files: as given, or from the file size when one is missing
    (the other being derived, or RocketMQ's ratio of 4 entries per slot when both are)."""
    directory = store / INDEX_DIR
    sizes = {p.stat().st_size for p in directory.iterdir() if p.is_file()} if directory.is_dir() else set()
    if not sizes:
        return IndexSizes(hash_slot_num or 5_000_000, index_num or 20_000_000)
    file_size = max(sizes)
    room = file_size - HEADER_SIZE
    if hash_slot_num is None and index_num is None:
        if room % (HASH_SLOT_SIZE + 4 * INDEX_SIZE) == 0:
            slots = room // (HASH_SLOT_SIZE + 4 * INDEX_SIZE)
            return IndexSizes(slots, 4 * slots)
    elif hash_slot_num is None and index_num is not None:
        rest = room - index_num * INDEX_SIZE
        if rest > 0 and rest % HASH_SLOT_SIZE == 0:
            return IndexSizes(rest // HASH_SLOT_SIZE, index_num)
    elif index_num is None and hash_slot_num is not None:
        rest = room - hash_slot_num * HASH_SLOT_SIZE
        if rest > 0 and rest % INDEX_SIZE == 0:
            return IndexSizes(hash_slot_num, rest // INDEX_SIZE)
    else:
        assert hash_slot_num is not None and index_num is not None
        return IndexSizes(hash_slot_num, index_num)
    raise ToolError(
        f"index files of {file_size} bytes: pass --max-hash-slot-num and --max-index-num "
        "(tidelog.rocketmq.maxHashSlotNum / maxIndexNum of the store)",
        exit_code=2,
    )


def _key_matches(message: Message, topic: str, key: str) -> bool:
    return message.topic == topic and key in message_index_keys(message.properties_bytes)


def query_by_key(
    store: Path,
    topic: str,
    key: str,
    *,
    begin: int = 0,
    end: int = LONG_MAX,
    max_num: int = MAX_MSGS_NUM_BATCH,
    hash_slot_num: int | None = None,
    index_num: int | None = None,
    out: TextIO | None = None,
) -> int:
    """Print the messages of `topic` with `key` (a KEYS entry or the UNIQ_KEY) stored in [begin, end] ms, newest
    first; returns 1 when none matches."""
    out = out or sys.stdout
    sizes = infer_index_sizes(store, hash_slot_num, index_num)
    index = IndexService(store / INDEX_DIR, sizes.hash_slot_num, sizes.index_num, read_only=True)
    # An entry's time is its file's begin + whole seconds, up to 999 ms before the message's store time: the index
    # is asked for [begin - 999, end] and every candidate checked against [begin, end] exactly. Candidates outside
    # the window may take the places of matches, so a full answer that kept too few is asked again, for more.
    index_begin = max(0, begin - INDEX_TIME_UNIT_MS + 1)
    with ExitStack() as stack:
        try:
            index.load(clean_shutdown=True, index_checkpoint_timestamp=0)
        except KafkaStorageError as exc:
            raise ToolError(str(exc)) from None
        stack.callback(index.close)
        commitlog = CommitLogReader(store, stack)
        limit, distinct_before = max_num, -1
        while True:
            candidates = index.query_offsets(topic, key, limit, index_begin, end, max_msgs_num_batch=limit).phy_offsets
            distinct = dict.fromkeys(candidates)  # a message re-indexed after a restart appears twice
            matches = []
            for offset in distinct:
                message = commitlog.message_at(offset)
                if message is None or not _key_matches(message, topic, key):
                    continue  # a hash duplicate, or an entry left by a truncated CommitLog
                if begin <= message.store_timestamp <= end:
                    matches.append(message)
            if len(matches) >= max_num or len(candidates) < limit or len(distinct) == distinct_before:
                break  # enough, all there are, or a damaged chain going round
            limit, distinct_before = 2 * limit, len(distinct)
        for message in matches[:max_num]:
            print_message(message, out)
    found = min(len(matches), max_num)
    print(f"{found} message(s) with key {key!r} in topic {topic!r}", file=out)
    return 0 if found else 1


def query_by_id(store: Path, msg_id: str, *, out: TextIO | None = None) -> int:
    """Print the message an offsetMsgId (store host + CommitLog offset) names; returns 1 when there is none."""
    out = out or sys.stdout
    try:
        host, offset = decode_message_id(msg_id)
    except ValueError as exc:
        raise ToolError(str(exc), exit_code=2) from None
    with ExitStack() as stack:
        message = CommitLogReader(store, stack).message_at(offset)
        if message is None:
            print(f"no message at CommitLog offset {offset} (message id {msg_id})", file=out)
            return 1
        if message.store_host != host:
            print(
                f"the message at CommitLog offset {offset} was stored by {message.store_host}, not {host} "
                f"(its id is {message_id(message.store_host, offset)})",
                file=out,
            )
            return 1
        print_message(message, out)
    return 0
