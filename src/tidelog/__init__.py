"""tidelog: a durable, partitioned message log that stores messages byte for byte as Apache Kafka does.

import tidelog
with tidelog.open("data", config={"log.segment.bytes": 1 << 20}) as log:
    log.create_topic("page_visits", partitions=5)
    log.produce("page_visits", 0, [tidelog.Record(value=b"v", key=b"k")])
    for record in log.consume("page_visits", 0): ...
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import Record
from tidelog.config import EngineConfig
from tidelog.errors import TidelogError
from tidelog.storage.api import AppendResult, FileSlices, StorageEngine, TimestampAndOffset

__version__ = "0.1.0"
__all__ = [
    "AppendResult",
    "Compression",
    "FileSlices",
    "Record",
    "StorageEngine",
    "TidelogError",
    "TimestampAndOffset",
    "open",
]


def open(
    log_dir: str | os.PathLike[str],
    engine: str = "kafka",
    config: Mapping[str, Any] | None = None,
    *,
    background: bool = True,
) -> StorageEngine:
    """Open (creating if needed) a log directory. `config` takes Kafka's broker key names.

    `background=False` runs no scheduler thread: rolled segments are flushed synchronously and
    retention, checkpoints and timed flushes run only when called.
    """
    from tidelog.storage import open_engine

    settings = {"tidelog.storage.engine": engine, **(config or {})}
    return open_engine(EngineConfig.from_mapping(settings, log_dir=log_dir), background=background)
