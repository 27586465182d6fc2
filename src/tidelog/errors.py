"""Every failure tidelog reports, one exception type each, with the Kafka error code it maps to.

The broker turns an exception into a response error code through `kafka_error_code`; the library and the
CLI show its message, which always names what was wrong (the field, the file, the config key).
"""

from __future__ import annotations


class TidelogError(Exception):
    """Base of all tidelog errors. `kafka_error_code` is the code a Kafka client receives."""

    kafka_error_code: int = -1  # UNKNOWN_SERVER_ERROR


# --- bytes that do not decode -------------------------------------------------------------------------------


class CorruptRecordError(TidelogError):
    """Bytes that are not a valid record batch: bad CRC, truncated, impossible lengths."""

    kafka_error_code = 2  # CORRUPT_MESSAGE


class CrcMismatchError(CorruptRecordError):
    """The stored CRC does not match the bytes it covers."""


class TruncatedBatchError(CorruptRecordError):
    """The buffer ends before the batch (or a field inside it) does."""


class UnsupportedMagicError(CorruptRecordError):
    """A message format version (magic byte) this code does not know."""


class UnsupportedCompressionError(CorruptRecordError):
    """An unknown compression codec id, or a codec not allowed for this message format.

    A kind of corrupt record (a reader of stored bytes treats it as damage) with its own Kafka code."""

    kafka_error_code = 76  # UNSUPPORTED_COMPRESSION_TYPE


class InvalidRecordError(TidelogError):
    """A well-formed batch that breaks a rule of the log (offsets, counts, timestamps, control layout)."""

    kafka_error_code = 87  # INVALID_RECORD


class InvalidTimestampError(TidelogError):
    kafka_error_code = 32  # INVALID_TIMESTAMP


class RecordTooLargeError(TidelogError):
    """A batch larger than the topic's `max.message.bytes`."""

    kafka_error_code = 10  # MESSAGE_TOO_LARGE


# --- the log and its files ----------------------------------------------------------------------------------


class OffsetOutOfRangeError(TidelogError):
    kafka_error_code = 1  # OFFSET_OUT_OF_RANGE


class UnknownTopicOrPartitionError(TidelogError):
    kafka_error_code = 3  # UNKNOWN_TOPIC_OR_PARTITION


class TopicExistsError(TidelogError):
    kafka_error_code = 36  # TOPIC_ALREADY_EXISTS


class InvalidTopicError(TidelogError):
    kafka_error_code = 17  # INVALID_TOPIC_EXCEPTION


class InvalidPartitionsError(TidelogError):
    kafka_error_code = 37  # INVALID_PARTITIONS


class CorruptIndexError(TidelogError):
    """An offset or time index that fails its sanity check; recovery rebuilds it from the log."""

    kafka_error_code = 56  # KAFKA_STORAGE_ERROR


class CorruptCheckpointError(TidelogError):
    """A checkpoint file that does not parse; the log falls back to a safe default and says so."""

    kafka_error_code = 56


class KafkaStorageError(TidelogError):
    """An I/O failure on a log directory (disk full, permission, vanished file)."""

    kafka_error_code = 56  # KAFKA_STORAGE_ERROR


class LogClosedError(TidelogError):
    kafka_error_code = 56


# --- configuration -------------------------------------------------------------------------------------------


class ConfigError(TidelogError):
    """An unknown config key or a value of the wrong type or range; the message names the key."""

    kafka_error_code = 40  # INVALID_CONFIG
