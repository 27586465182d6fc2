"""What the RocketMQ engine indexes in its IndexFile (storage/common/index_file.py): the dispatcher's third step.

Every message of a dispatched batch is indexed under `topic#UNIQ_KEY` and `topic#key` for each space-separated
entry of its KEYS property; a Kafka key that is not plain text (the KAFKA_KEY64 property) under its `base64:` form
(codec.rocketmq_message.index_key). Rolled-back transactional messages are not indexed. The index lives in
`<store>/index/`, keyed by CommitLog offset.
"""

from __future__ import annotations

import numpy as np

from tidelog.codec.rocketmq_message import (
    KEY_SEPARATOR,
    PROPERTY_KEY64,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_ROLLBACK,
    java_hash_and_units,
    property_value,
)
from tidelog.storage.common.index_file import IndexService
from tidelog.storage.rocketmq.dispatcher import DispatchBatch

INDEX_DIR = "index"


def message_index_keys(properties: bytes | bytearray | memoryview) -> list[str]:
    """The keys a message is indexed under (without the topic): UNIQ_KEY, then each space-separated KEYS entry; a
    Kafka key that is not plain text (KAFKA_KEY64) under the `base64:` form of codec.rocketmq_message.index_key."""
    keys: list[str] = []
    uniq_key = property_value(properties, PROPERTY_UNIQ_KEY)
    if uniq_key:
        keys.append(uniq_key)
    text = property_value(properties, PROPERTY_KEYS)
    if text:
        keys.extend(key for key in text.split(KEY_SEPARATOR) if key)
    key64 = property_value(properties, PROPERTY_KEY64)
    if key64:
        keys.append("base64:" + ("" if key64 == "-" else key64))
    return keys


def build_index(index: IndexService, batch: DispatchBatch) -> int:
    """Index a dispatched batch, all its keys hashed at once; returns the number of entries written."""
    if not len(batch):
        return 0
    key_hashes, key_units, key_counts = _key_columns(batch)
    topics = {run.topic for run in batch.runs}
    if len(topics) == 1:
        prefixes: np.ndarray | int = index.hasher.prefix(topics.pop())
    else:
        prefixes = np.repeat(
            np.array([index.hasher.prefix(run.topic) for run in batch.runs], dtype=np.uint64),
            [int(key_counts[run.start : run.stop].sum()) for run in batch.runs],
        )
    rolled_back = None
    if np.count_nonzero(batch.sys_flags):
        rolled_back = batch.sys_flags & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_ROLLBACK
    return index.put_messages(
        prefixes, key_hashes, key_units, key_counts, batch.offsets, batch.store_timestamps, rolled_back
    )


def _key_columns(batch: DispatchBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hashes, UTF-16 lengths, count per message) of the batch's index keys: as the appender computed them, or
    from the properties of messages read back from the CommitLog."""
    if batch.keys is not None:
        return batch.keys.hashed()
    keys = [message_index_keys(properties) for properties in batch.properties or ()]
    pairs = [java_hash_and_units(key) for message_keys in keys for key in message_keys]
    columns = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    counts = np.array([len(message_keys) for message_keys in keys], dtype=np.int64)
    return columns[:, 0].astype(np.uint64), columns[:, 1].copy(), counts
