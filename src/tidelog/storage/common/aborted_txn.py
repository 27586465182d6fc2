"""An aborted transaction as Kafka's `.txnindex` files store it (Kafka's AbortedTxn): 34 bytes, big-endian.

    version i16 = 0 | producerId i64 | firstOffset i64 | lastOffset i64 | lastStableOffset i64

`firstOffset` is the transaction's first offset, `lastOffset` its ABORT marker's offset, `lastStableOffset` the
partition's last stable offset once the marker was written (the first offset of the earliest transaction still open
then, else lastOffset + 1). Files of entries are written in marker order, so lastOffset increases strictly.

Both engines keep them in this layout: the Kafka engine per segment (storage/kafka/txn_index.py), the RocketMQ engine
per queue (storage/rocketmq/aborted_txns.py); the Spark path reader and `tidelog dump-log` read them.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from tidelog.errors import CorruptIndexError

VERSION = 0
ENTRY = struct.Struct(">hqqqq")


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return ENTRY.pack(VERSION, *self)


def parse_entries(data: bytes, path: Path) -> list[AbortedTxn]:
    """The whole entries of a file's bytes (a torn last one is left out); an unknown version is a CorruptIndexError
    naming `path`."""
    entries: list[AbortedTxn] = []
    for version, *fields in ENTRY.iter_unpack(data[: len(data) - len(data) % ENTRY.size]):
        if version != VERSION:
            raise CorruptIndexError(f"{path}: entry {len(entries)} has unknown version {version}")
        entries.append(AbortedTxn(*fields))
    return entries
