"""What the broker stored, read from its log dir: the RecordBatch v2 headers of a topic's segments (walked with
tidelog's own chain walker), to show what a producer chose (its codec, its producer id) reached the disk."""

from __future__ import annotations

from pathlib import Path

from tidelog.codec.batch_chain import scan_chain
from tidelog.codec.record_batch import BatchHeader, read_header


def stored_batches(log_dir: Path, topic: str) -> list[BatchHeader]:
    headers = []
    for segment in sorted(log_dir.glob(f"{topic}-*/*.log")):
        data = segment.read_bytes()
        headers += [read_header(data, position) for position in scan_chain(data).positions]
    return headers


def stored_codecs(log_dir: Path, topic: str) -> set[str]:
    """Kafka's names (`gzip`, `zstd`, ...) of the codecs of the topic's batches."""
    return {header.compression.kafka_name for header in stored_batches(log_dir, topic)}
