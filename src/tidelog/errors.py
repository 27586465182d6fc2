"""Every failure tidelog reports, one exception type each, and the one table of Kafka error codes they map to.

The broker turns an exception into a response error code through `kafka_error_code`; the library and the
CLI show its message, which always names what was wrong (the field, the file, the config key). Handlers that
answer with a code directly (the group coordinator's member checks) take it from `ErrorCode` too.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """The Kafka protocol error codes tidelog answers with (clients/.../protocol/Errors.java)."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    TOPIC_DELETION_DISABLED = 73
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    UNKNOWN_TOPIC_ID = 100
    TRANSACTIONAL_ID_NOT_FOUND = 105
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    INVALID_REGULAR_EXPRESSION = 128


class TidelogError(Exception):
    """Base of all tidelog errors. `kafka_error_code` is the code a Kafka client receives."""

    kafka_error_code: int = ErrorCode.UNKNOWN_SERVER_ERROR


# --- bytes that do not decode -------------------------------------------------------------------------------


class CorruptRecordError(TidelogError):
    """Bytes that are not a valid record batch: bad CRC, truncated, impossible lengths."""

    kafka_error_code = ErrorCode.CORRUPT_MESSAGE


class CrcMismatchError(CorruptRecordError):
    """The stored CRC does not match the bytes it covers."""


class TruncatedBatchError(CorruptRecordError):
    """The buffer ends before the batch (or a field inside it) does."""


class UnsupportedMagicError(CorruptRecordError):
    """A message format version (magic byte) this code does not know."""


class UnsupportedCompressionError(CorruptRecordError):
    """An unknown compression codec id, or a codec not allowed for this message format.

    A kind of corrupt record (a reader of stored bytes treats it as damage) with its own Kafka code."""

    kafka_error_code = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


class InvalidRecordError(TidelogError):
    """A well-formed batch that breaks a rule of the log (offsets, counts, timestamps, control layout)."""

    kafka_error_code = ErrorCode.INVALID_RECORD


class InvalidTimestampError(TidelogError):
    kafka_error_code = ErrorCode.INVALID_TIMESTAMP


class RecordTooLargeError(TidelogError):
    """A batch larger than the topic's `max.message.bytes`."""

    kafka_error_code = ErrorCode.MESSAGE_TOO_LARGE


# --- the log and its files ----------------------------------------------------------------------------------


class OffsetOutOfRangeError(TidelogError):
    kafka_error_code = ErrorCode.OFFSET_OUT_OF_RANGE


class UnknownTopicOrPartitionError(TidelogError):
    kafka_error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class TopicExistsError(TidelogError):
    kafka_error_code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidTopicError(TidelogError):
    kafka_error_code = ErrorCode.INVALID_TOPIC_EXCEPTION


class InvalidPartitionsError(TidelogError):
    kafka_error_code = ErrorCode.INVALID_PARTITIONS


class CorruptIndexError(TidelogError):
    """An offset or time index that fails its sanity check; recovery rebuilds it from the log."""

    kafka_error_code = ErrorCode.KAFKA_STORAGE_ERROR


class CorruptCheckpointError(TidelogError):
    """A checkpoint file that does not parse; the log falls back to a safe default and says so."""

    kafka_error_code = ErrorCode.KAFKA_STORAGE_ERROR


class KafkaStorageError(TidelogError):
    """An I/O failure on a log directory (disk full, permission, vanished file)."""

    kafka_error_code = ErrorCode.KAFKA_STORAGE_ERROR


class KeyIndexDisabledError(TidelogError):
    """A key lookup on an engine that keeps no key index (the Kafka engine without tidelog.index.keys=true)."""

    kafka_error_code = ErrorCode.INVALID_REQUEST


class UnexpectedAppendOffsetError(TidelogError):
    """A replica's append (Partition.append_replica) whose batches do not continue the log: the first does not start
    at the log end, or one does not follow the one before it (Kafka's UnexpectedAppendOffsetException and
    OffsetsOutOfOrderException, which Kafka does not send to clients either: UNKNOWN_SERVER_ERROR)."""

    kafka_error_code = ErrorCode.UNKNOWN_SERVER_ERROR


class LogClosedError(TidelogError):
    kafka_error_code = ErrorCode.KAFKA_STORAGE_ERROR


class FlushDiskTimeoutError(KafkaStorageError):
    """RocketMQ's FLUSH_DISK_TIMEOUT: no group commit covered a SYNC_FLUSH producer's offset within syncFlushTimeout."""

    kafka_error_code = ErrorCode.REQUEST_TIMED_OUT


class FlushSlaveTimeoutError(TidelogError):
    """RocketMQ's FLUSH_SLAVE_TIMEOUT: a SYNC_MASTER put is stored, but no slave reported it within syncFlushTimeout;
    the producer retries (an idempotent one without duplicates)."""

    kafka_error_code = ErrorCode.REQUEST_TIMED_OUT


class SlaveNotAvailableError(TidelogError):
    """RocketMQ's SLAVE_NOT_AVAILABLE: a SYNC_MASTER put is stored, but no slave is connected or the nearest one is
    more than haSlaveFallbehindMax behind, so it is not waited for; the producer retries."""

    kafka_error_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class HAProtocolError(TidelogError):
    """Bytes on a RocketMQ HA connection that are not a valid frame, or a frame that does not fit the receiver's
    CommitLog: the connection is closed, nothing is written."""


# --- configuration -------------------------------------------------------------------------------------------


class ConfigError(TidelogError):
    """An unknown config key or a value of the wrong type or range; the message names the key."""

    kafka_error_code = ErrorCode.INVALID_CONFIG


# --- idempotent producers --------------------------------------------------------------------------------------


class OutOfOrderSequenceError(TidelogError):
    kafka_error_code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(TidelogError):
    kafka_error_code = ErrorCode.INVALID_PRODUCER_EPOCH


class InvalidTxnStateError(TidelogError):
    kafka_error_code = ErrorCode.INVALID_TXN_STATE


class TransactionCoordinatorFencedError(TidelogError):
    """A transaction marker from a coordinator epoch older than the producer's last marker's (a zombie
    coordinator)."""

    kafka_error_code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


# --- the wire and the cluster ----------------------------------------------------------------------------------


class FrameError(TidelogError):
    """A frame no Kafka client would send; the connection is closed."""


class MalformedRequestError(TidelogError):
    """A request whose bytes do not decode; the connection that sent it is closed."""

    kafka_error_code = ErrorCode.INVALID_REQUEST


class UnsupportedVersionError(TidelogError):
    kafka_error_code = ErrorCode.UNSUPPORTED_VERSION

    def __init__(self, message: str, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class InvalidReplicationFactorError(TidelogError):
    kafka_error_code = ErrorCode.INVALID_REPLICATION_FACTOR


class ReplicationUnsupportedError(TidelogError):
    """A replication call (follower append, truncation) on an engine that keeps one replica per partition: the
    RocketMQ engine. A replication factor above 1 needs the Kafka engine."""

    kafka_error_code = ErrorCode.INVALID_REPLICATION_FACTOR


class TopicDeletionDisabledError(TidelogError):
    kafka_error_code = ErrorCode.TOPIC_DELETION_DISABLED


class InvalidRequestError(TidelogError):
    """A request whose fields contradict each other (CreateTopics with both a replica assignment and a count)."""

    kafka_error_code = ErrorCode.INVALID_REQUEST


class InvalidReplicaAssignmentError(TidelogError):
    """A CreateTopics, CreatePartitions or AlterPartitionReassignments assignment that names unknown brokers,
    repeats one, is empty or uneven (or a reassignment the engine cannot carry out)."""

    kafka_error_code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


class NoReassignmentInProgressError(TidelogError):
    """An AlterPartitionReassignments cancel (replicas null) of a partition that is not being reassigned."""

    kafka_error_code = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


class NotControllerError(TidelogError):
    """A request only the controller answers (ControlledShutdown, ElectLeaders forwarded) sent to another broker."""

    kafka_error_code = ErrorCode.NOT_CONTROLLER


class StaleBrokerEpochError(TidelogError):
    """A ControlledShutdown naming an earlier registration of the broker than the live one."""

    kafka_error_code = ErrorCode.STALE_BROKER_EPOCH


class NotLeaderOrFollowerError(TidelogError):
    """A produce, fetch or offset lookup sent to a broker that does not lead the partition (in a cluster)."""

    kafka_error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class LeaderNotAvailableError(TidelogError):
    """The partition has no leader now (its replicas are offline, or the controller has not chosen one yet)."""

    kafka_error_code = ErrorCode.LEADER_NOT_AVAILABLE


class FencedLeaderEpochError(TidelogError):
    """The client's leader epoch is older than the partition's: its metadata is stale."""

    kafka_error_code = ErrorCode.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(TidelogError):
    """The client's leader epoch is newer than this broker knows: this broker has not caught up yet."""

    kafka_error_code = ErrorCode.UNKNOWN_LEADER_EPOCH


class RequestTimedOutError(TidelogError):
    """A cluster change was written, or an acks=all produce appended, but it did not complete within the request's
    timeout."""

    kafka_error_code = ErrorCode.REQUEST_TIMED_OUT


class NotEnoughReplicasError(TidelogError):
    """An acks=all produce to a partition with fewer in-sync replicas than min.insync.replicas: nothing appended."""

    kafka_error_code = ErrorCode.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppendError(TidelogError):
    """An acks=all produce was appended, but the in-sync replicas shrank below min.insync.replicas before it was
    replicated to them all: the producer retries (an idempotent one without duplicates)."""

    kafka_error_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class CoordinatorNotAvailableError(TidelogError):
    """The group's coordinator cannot take the request now (its write did not reach the in-sync replicas)."""

    kafka_error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class NotCoordinatorError(TidelogError):
    """This broker no longer coordinates the group (its `__consumer_offsets` partition is led elsewhere now)."""

    kafka_error_code = ErrorCode.NOT_COORDINATOR


# --- security: authentication and authorization ----------------------------------------------------------------


class SaslAuthenticationError(TidelogError):
    """Wrong password, unknown user or a malformed SASL exchange; the connection is closed after the answer."""

    kafka_error_code = ErrorCode.SASL_AUTHENTICATION_FAILED


class InvalidAclError(TidelogError):
    """An ACL binding or filter that is not well formed (unknown operation, a non-definite binding, ...)."""

    kafka_error_code = ErrorCode.INVALID_REQUEST


class SecurityStoreError(TidelogError):
    """`tidelog-users.json` or `tidelog-acls.json` cannot be read or written; the message names the file."""


# --- Spark source and sink ---------------------------------------------------------------------------------------


class DataLossError(TidelogError):
    """Offsets a query planned to read are gone (retention, deletion, truncation) and failOnDataLoss is true."""


class LogFilesError(TidelogError):
    """A log directory or file that cannot be read; the message names it."""


class KafkaClientError(TidelogError):
    """The broker could not be reached or refused a request; the message names the servers."""


class OptionError(ConfigError, ValueError):
    """A missing, conflicting or malformed option of the Spark source or sink; the message names the option."""


class BrokerStartError(TidelogError):
    """`tidelog serve`, started for a pipeline or a test, did not come up; the message says why."""


class WorkerPythonError(TidelogError):
    """The Python that Spark starts for its workers cannot run tidelog's data source (another interpreter without
    tidelog, or another Python version); the message names both interpreters and what to set."""


# --- command-line tools ------------------------------------------------------------------------------------------


class ToolError(TidelogError):
    """A failure the tool reports as one line on stderr; `exit_code` is 2 for bad usage, else 1."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
