"""The seam between the storage engines and everything above them (broker, Spark source, CLI, library).

An engine stores record batches exactly as a Kafka producer sends them and hands them back as file
slices, so a server can send them with sendfile and a reader can decode them in place:

    append(topic, partition, batch_bytes) -> AppendResult     offsets assigned by rewriting baseOffset
    read(topic, partition, offset, max_bytes) -> FileSlices    whole batches; only the last may be cut short
    offset_for_timestamp(topic, partition, ts) -> TimestampAndOffset | None
    log_start_offset / log_end_offset / high_watermark, delete_records, flush, close

Transactions (KIP-98): a client's transactional batches open or extend their producer's transaction; the
coordinator's end-transaction markers close it (`append_marker`, a COMMIT or ABORT control batch). Reads in
read_committed stop at `last_stable_offset` (below the first offset of the earliest open transaction) and get the
aborted transactions of the range they read (`aborted_transactions`), which the client skips.

`produce` and `consume` are the library face built on those calls, the same for every engine.

Replication (a broker of a cluster; EngineConfig.replicated): a follower appends the leader's batches unchanged
(`append_replica`), cuts its log back to where it diverged from the leader (`truncate_to`,
`truncate_fully_and_start_at`) and answers OffsetForLeaderEpoch (`end_offset_for_epoch`); the broker moves the high
watermark (`set_high_watermark`), and reads stop at it unless a follower fetches (`up_to_log_end`). Outside a
cluster the high watermark is the log end after every append, as on a single Kafka broker.

Two kinds of call, and where a server may make them:
- data calls (partition(), append, read, offsets, delete_records, topics(), append_replica, set_high_watermark,
  end_offset_for_epoch): bounded work on one partition, no engine-wide lock held for long - safe on an event loop;
  a follower's truncations fsync before they return: they belong on its fetcher's thread;
- topic calls (create_topic, delete_topic, create_partitions, hold_partitions, alter_topic_configs,
  set_log_defaults) and close: many
  files, the engine lock held throughout - a server runs them on a thread of their own (broker/admin.py). Deletion
  renames the directories at once and removes the files after log.segment.delete.delay.ms
  (storage/common/deletion.py). `hold_partitions` is how a cluster broker gains or drops replicas of a topic's
  existing partitions (a partition reassignment); the RocketMQ engine refuses it (its topics in a cluster have one
  replica per partition, which cannot move without its data).

Master/slave (the RocketMQ engine with tidelog.rocketmq.haEnable): the whole store - one CommitLog for every topic -
is copied to slaves rather than each partition to followers. `StorageEngine.master_slave()` returns the store's
`MasterSlaveStore` face (None for an engine or store without it): the role, what a SYNC_MASTER waits for, the role
switches and the connections' status, which a broker of a cluster drives from ZooKeeper (broker/rocketmq_groups.py).
The role switches and `wait_replicated` block: not for an event loop.

Engines: storage/kafka (Kafka's log directory layout) and storage/rocketmq (RocketMQ's CommitLog and
ConsumeQueues). They share storage/common and never import each other; nothing above storage imports them
except `open_engine` in storage/__init__.py.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol

from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import Record, build_batch
from tidelog.codec.record_set import decode_batch, iter_batches
from tidelog.config import LogConfig
from tidelog.errors import InvalidTopicError, OffsetOutOfRangeError

EARLIEST_TIMESTAMP = -2  # ListOffsets special targets, as Kafka defines them
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3

CONSUME_CHUNK_BYTES = 1 << 20
LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249


def validate_topic_name(name: str) -> None:
    """Kafka's Topic.validate: 1-249 characters of [a-zA-Z0-9._-], not '.' or '..'."""
    if not name or name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(f"topic name is {len(name)} characters long; the maximum is {MAX_TOPIC_NAME_LENGTH}")
    if not LEGAL_TOPIC.match(name):
        raise InvalidTopicError(f"topic name {name!r} may only contain ASCII letters, digits, '.', '_' and '-'")


# The answer types are NamedTuples: immutable, and cheap to build on the hot paths.


class FileSlice(NamedTuple):
    """`length` bytes at `position` of a segment file; `file` stays open for as long as the slice may be sent.
    `head`: the slice's bytes when the engine read them already (a small slice read with its first batch's header),
    which `read` and `read_range` then return without a system call."""

    file: BinaryIO
    path: Path
    position: int
    length: int
    head: bytes | None = None

    def read(self) -> bytes:
        if self.head is not None:
            return self.head
        return os.pread(self.file.fileno(), self.length, self.position)

    def read_range(self, start: int, length: int) -> bytes:
        """`length` bytes from byte `start` of the slice (a caller that sends it in pieces)."""
        if self.head is not None:
            return self.head[start : start + length]
        return os.pread(self.file.fileno(), length, self.position + start)


class MemorySlice(NamedTuple):
    """Record bytes an engine built in memory (the RocketMQ engine re-encodes its messages as Kafka batches on read).

    `data` is the buffer itself - bytes, or a view of an array the engine built for this read and never touches
    again - so that handing it out copies nothing: the sender writes `data` as it is; `length` and `read()` are
    FileSlice's, so whatever sums or reads slices takes it unchanged."""

    data: bytes | memoryview

    @property
    def length(self) -> int:
        return len(self.data)

    def read(self) -> bytes:
        return bytes(self.data)


class FileSlices(NamedTuple):
    """The answer to a read: slices in offset order, possibly from several segments (or built in memory)."""

    slices: tuple[FileSlice | MemorySlice, ...] = ()
    log_start_offset: int = 0
    high_watermark: int = 0

    @property
    def size_in_bytes(self) -> int:
        return sum(s.length for s in self.slices)

    def read_bytes(self) -> bytes:
        slices = self.slices
        if len(slices) == 1:  # the common answer: no join
            return slices[0].read()
        return b"".join([s.read() for s in slices])


class AppendResult(NamedTuple):
    base_offset: int
    last_offset: int
    record_count: int
    log_append_time_ms: int  # -1 under CreateTime, as in a ProduceResponse
    log_start_offset: int
    size_in_bytes: int


class ProducerSummary(NamedTuple):
    """A producer a partition's producer state holds (DescribeProducers): the coordinator epoch of its last
    transaction marker and the first offset of its open transaction (-1: none)."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int = -1
    current_txn_start_offset: int = -1


class AbortedTransaction(NamedTuple):
    """An aborted transaction a read_committed Fetch reports: the client drops the producer's records from
    `first_offset` on, up to the producer's ABORT marker."""

    producer_id: int
    first_offset: int


class TimestampAndOffset(NamedTuple):
    timestamp: int
    offset: int
    leader_epoch: int | None = None


class KeyLocation(NamedTuple):
    """Where a record with a given key is: its partition (queue), offset and record timestamp."""

    partition: int
    offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic as the store holds it. `partitions` is the topic's partition count; `local_partitions` the ones
    this store holds a replica of (a broker in a cluster holds those assigned to it), None: all of them."""

    name: str
    topic_id: str
    partitions: int
    configs: Mapping[str, Any] = field(default_factory=dict)
    local_partitions: tuple[int, ...] | None = None

    @property
    def held(self) -> Sequence[int]:
        """The partitions this store holds, in order."""
        return range(self.partitions) if self.local_partitions is None else self.local_partitions


class Partition(ABC):
    """One partition (Kafka) or queue (RocketMQ) as the broker drives it. Offsets below `flushed_offset` are
    on disk; the broker calls `flush` from a worker thread (group commit) when `flush_due` says so."""

    leader_epoch: int  # stamped into the batches it appends as leader (partitionLeaderEpoch); the cluster sets it
    log_start_offset: int  # first readable offset
    log_end_offset: int  # next offset to assign
    high_watermark: int  # readable up to here (== log end on a single node; in a cluster the broker moves it)

    @property
    @abstractmethod
    def name(self) -> str:
        """`<topic>-<partition>`, for messages."""

    @property
    @abstractmethod
    def flushed_offset(self) -> int: ...

    @property
    @abstractmethod
    def last_stable_offset(self) -> int:
        """What read_committed readers may read up to: min(first offset of the earliest open transaction - or of a
        completed one whose marker is not below the high watermark yet -, high watermark)."""

    @property
    @abstractmethod
    def size_in_bytes(self) -> int: ...

    @abstractmethod
    def append(self, data: bytes | bytearray | memoryview, *, from_client: bool = True) -> AppendResult:
        """Append a producer's batch (`from_client`) or the broker's own batches. A transactional batch opens or
        continues its producer's transaction; a client's control batch is refused (InvalidRecordError), an older
        producer epoch too (InvalidProducerEpochError), and a non-transactional batch of a producer with an open
        transaction (InvalidTxnStateError)."""

    @abstractmethod
    def append_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool
    ) -> AppendResult:
        """Write an end-transaction marker (a COMMIT or ABORT control batch, as the coordinator's WriteTxnMarkers
        asks a leader to): the producer's open transaction is complete, an aborted one is recorded for
        read_committed readers, and the last stable offset moves on. A marker for a producer without an open
        transaction is written all the same. Refused when `producer_epoch` is older than the producer's
        (InvalidProducerEpochError) or `coordinator_epoch` older than its last marker's
        (TransactionCoordinatorFencedError)."""

    @abstractmethod
    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTransaction]:
        """The aborted transactions a read_committed Fetch of [start_offset, end_offset) reports: those whose ABORT
        marker is at or after `start_offset` and whose first offset is below `end_offset`, by marker offset."""

    @abstractmethod
    def append_replica(self, data: bytes | bytearray | memoryview) -> AppendResult:
        """Append a leader's batches as they are (Kafka's appendAsFollower): offsets, leader epochs and every byte
        kept, so the follower's log is the leader's. The first batch must start at the log end (else
        UnexpectedAppendOffsetError, the log unchanged). The high watermark does not move on a replicated log."""

    @abstractmethod
    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        min_one_message: bool = True,
        up_to_log_end: bool = False,
        max_offset: int | None = None,
    ) -> FileSlices:
        """Whole batches from the one holding `offset` (the last may be cut short by `max_bytes`), below the high
        watermark, or up to the log end with `up_to_log_end` (a follower's fetch); with `max_offset` (a
        read_committed fetch passes the last stable offset) they also stop before the batch holding it. An offset
        between that end and the log end reads nothing; outside [log start, log end] it raises
        OffsetOutOfRangeError."""

    @abstractmethod
    def set_high_watermark(self, offset: int) -> None:
        """Move the high watermark up to min(offset, log end) (a replicated log; the broker decides it). A lower
        value is ignored: it goes down only when a truncation cuts the log below it. Harmless outside a cluster,
        where the high watermark is the log end."""

    @abstractmethod
    def truncate_to(self, offset: int) -> None:
        """Remove every batch from the one holding `offset` on (Kafka's Log.truncateTo, a follower cutting back to
        where it diverged from its leader); the high watermark and the leader epochs follow the new end. Nothing
        happens when `offset` >= the log end."""

    @abstractmethod
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Remove everything and start empty at `offset`: log start = log end = high watermark = `offset` (Kafka's
        truncateFullyAndStartAt, when the leader's log starts beyond this replica's end)."""

    @abstractmethod
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetForLeaderEpoch answers: where `epoch` ended in this log ((-1, -1) when
        unknown)."""

    @property
    @abstractmethod
    def latest_epoch(self) -> int:
        """The newest leader epoch in the log (-1 when none)."""

    @abstractmethod
    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampAndOffset | None: ...

    @abstractmethod
    def active_producers(self) -> list[ProducerSummary]:
        """The producers the partition's idempotence state holds (not expired yet); a data call."""

    @abstractmethod
    def delete_records(self, before_offset: int) -> int: ...

    @abstractmethod
    def flush(self, up_to_offset: int | None = None) -> None: ...

    @abstractmethod
    def flush_due(self) -> bool: ...


class SlaveReport(Protocol):
    """A master's view of one connected slave."""

    @property
    def address(self) -> str: ...
    @property
    def reported_offset(self) -> int: ...  # -1 before its first report
    @property
    def lag_bytes(self) -> int: ...  # the master's CommitLog end minus that
    @property
    def since_last_report_ms(self) -> int: ...


class MasterReport(Protocol):
    """A slave's view of its connection to its master."""

    @property
    def master_address(self) -> str: ...
    @property
    def connected(self) -> bool: ...
    @property
    def max_offset(self) -> int: ...  # its CommitLog end
    @property
    def reported_offset(self) -> int: ...
    @property
    def local_address(self) -> str | None: ...  # the connection's own end, as the master names the slave


class MasterSlaveStatus(Protocol):
    @property
    def role(self) -> str: ...
    @property
    def listen_port(self) -> int | None: ...  # a master's HA port
    @property
    def slaves(self) -> Sequence[SlaveReport]: ...
    @property
    def master(self) -> MasterReport | None: ...


class MasterSlaveStore(Protocol):
    """A store that copies its whole log to slaves (see the module docstring)."""

    role: str  # ASYNC_MASTER, SYNC_MASTER or SLAVE

    @property
    def ha_port(self) -> int | None: ...  # the port a master listens on for slaves

    @property
    def commitlog_end(self) -> int: ...  # where the next byte of the store's log goes

    def slave_available(self) -> bool:
        """SYNC_MASTER: whether a slave is connected and near enough to be waited for."""
        ...

    def wait_queue_replicated(self, topic: str, partition: int, end_offset: int) -> None:
        """SYNC_MASTER: block until a slave holds the partition's records below `end_offset`
        (SlaveNotAvailableError, FlushSlaveTimeoutError); other roles return at once."""
        ...

    def become_master(self, role: str) -> None: ...

    def become_slave(self, master_address: str, truncate_to: int | None = None) -> None:
        """Follow `master_address`, first cutting the log at `truncate_to` when it goes past it."""
        ...

    def ha_status(self) -> MasterSlaveStatus: ...

    def topic_creation_offsets(self) -> dict[str, tuple[str, int]]:
        """Each topic's id and the log offset it was created at here."""
        ...

    def dispatch_topic_from(self, name: str, since: int) -> int:
        """A slave's topic created after its messages arrived: make them readable from log offset `since` on."""
        ...


class StorageEngine(ABC):
    """One storage model behind the common calls; subclasses implement the abstract ones."""

    cluster_id: str
    log_dirs: list[Path]

    @property
    @abstractmethod
    def compacts_topics(self) -> bool:
        """Does a log cleaner compact the topics with cleanup.policy=compact (else their owner must)?"""

    def master_slave(self) -> MasterSlaveStore | None:
        """The store's master/slave face, if it copies its whole log to slaves (see the module docstring)."""
        return None

    # --- topics ---
    @abstractmethod
    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        configs: Mapping[str, Any] | None = None,
        *,
        topic_id: str | None = None,
        local_partitions: Collection[int] | None = None,
    ) -> TopicDescription:
        """Create `name` with `partitions` partitions (default num.partitions). `topic_id`: the id the topic has
        elsewhere (a cluster's), else a new one; `local_partitions`: the partitions to hold here (a broker holds the
        replicas assigned to it), else all of them."""

    @abstractmethod
    def delete_topic(self, name: str) -> None:
        """Delete the topic and every partition held of it."""

    @abstractmethod
    def create_partitions(self, name: str, total: int, *, local_partitions: Collection[int] | None = None) -> None:
        """Grow the topic to `total` partitions, holding `local_partitions` of the new ones (None: all of them)."""

    @abstractmethod
    def hold_partitions(self, name: str, local_partitions: Collection[int]) -> None:
        """Hold exactly `local_partitions` of the topic's partitions: an empty replica of each one not held yet (a
        follower fills it), and the replicas of the others deleted as delete_topic deletes them. Raises
        InvalidPartitionsError for partitions the topic does not have, UnknownTopicOrPartitionError for an unknown
        topic, InvalidReplicaAssignmentError where the engine cannot move replicas."""

    @abstractmethod
    def alter_topic_configs(self, name: str, configs: Mapping[str, Any]) -> None:
        """Replace a topic's config overrides (as IncrementalAlterConfigs leaves them); raises ConfigError naming a
        bad key, UnknownTopicOrPartitionError for an unknown topic."""

    @abstractmethod
    def set_log_defaults(self, defaults: LogConfig) -> None:
        """New broker defaults for every topic key a topic does not override (a dynamic broker config changed):
        every partition's settings are recomputed and apply from its next append, roll or retention check. Raises
        ConfigError, changing nothing, when a topic's overrides do not fit the new defaults
        (min.compaction.lag.ms above max.compaction.lag.ms)."""

    @abstractmethod
    def topics(self) -> dict[str, TopicDescription]:
        """Every topic by name, as of the last completed topic change; does not wait for one in progress, so it is
        safe on an event loop."""

    # --- data ---
    @abstractmethod
    def partition(self, topic: str, partition: int) -> Partition:
        """The partition's handle; raises UnknownTopicOrPartitionError."""

    @abstractmethod
    def partitions(self) -> Mapping[tuple[str, int], Partition]:
        """Every partition of every topic."""

    def log_dir_of(self, topic: str, partition: int) -> Path:
        """The log dir that holds the partition (an engine with one store directory: that one)."""
        return self.log_dirs[0]

    # The data calls address one partition; they are bounded (no call scans a whole log) and safe to make on an
    # event loop. Topic calls (create, delete, create_partitions, alter_topic_configs) touch many files and take the
    # engine lock: a server runs them off its loop.

    def append(self, topic: str, partition: int, batch_bytes: bytes | bytearray | memoryview) -> AppendResult:
        """The embedded append: returns once the batch is on disk if the partition's flush policy says so."""
        handle = self.partition(topic, partition)
        result = handle.append(batch_bytes)
        if handle.flush_due():
            handle.flush(result.last_offset + 1)
        return result

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> FileSlices:
        return self.partition(topic, partition).read(offset, max_bytes)

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> TimestampAndOffset | None:
        return self.partition(topic, partition).offset_for_timestamp(timestamp_ms)

    def log_start_offset(self, topic: str, partition: int) -> int:
        return self.partition(topic, partition).log_start_offset

    def log_end_offset(self, topic: str, partition: int) -> int:
        return self.partition(topic, partition).log_end_offset

    def high_watermark(self, topic: str, partition: int) -> int:
        return self.partition(topic, partition).high_watermark

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        return self.partition(topic, partition).delete_records(before_offset)

    @abstractmethod
    def flush(self, topic: str | None = None, partition: int | None = None) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def lookup_key(self, topic: str, key: bytes, *, max_results: int = 64) -> list[KeyLocation]:
        """Where the records of `topic` with `key` are, newest first, at most `max_results` (an engine's key index:
        RocketMQ's IndexFile, the Kafka engine's optional per-partition one). Raises KeyIndexDisabledError when
        the engine keeps none, UnknownTopicOrPartitionError for an unknown topic."""

    # --- the library face ---
    def produce(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        compression: Compression | str = Compression.NONE,
    ) -> int:
        """Append `records` as one batch; returns the offset of the first one."""
        if isinstance(compression, str):
            compression = Compression.from_name(compression)
        return self.append(topic, partition, build_batch(records, compression=compression)).base_offset

    def consume(
        self,
        topic: str,
        partition: int,
        offset: int | None = None,
        *,
        max_records: int | None = None,
        up_to_log_end: bool = False,
    ) -> Iterator[Record]:
        """Records from `offset` (default: the log start offset) up to the high watermark at the time each chunk is
        read (`up_to_log_end`: up to the log end, as a new leader replays its internal topics); control records
        skipped. An offset below the log start or beyond the log end raises OffsetOutOfRangeError here, as `read`
        does (the log end itself is fine: nothing has been written there yet)."""
        log_start = self.log_start_offset(topic, partition)
        if offset is None:
            offset = log_start
        elif not log_start <= offset <= self.log_end_offset(topic, partition):
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside {topic}-{partition}'s range "
                f"[{log_start}, {self.log_end_offset(topic, partition)}]"
            )
        return self._records_from(self.partition(topic, partition), offset, max_records, up_to_log_end)

    def _records_from(
        self, handle: Partition, offset: int, max_records: int | None, up_to_log_end: bool
    ) -> Iterator[Record]:
        delivered = 0
        while offset < (handle.log_end_offset if up_to_log_end else handle.high_watermark):
            data = handle.read(offset, CONSUME_CHUNK_BYTES, up_to_log_end=up_to_log_end).read_bytes()
            progressed = False
            for info in iter_batches(data):
                progressed = True
                if info.last_offset >= offset and not info.is_control:
                    for record in decode_batch(data, info):
                        if record.offset < offset:
                            continue
                        yield record
                        delivered += 1
                        if max_records is not None and delivered >= max_records:
                            return
                offset = max(offset, info.next_offset)
            if not progressed:
                return

    def __enter__(self) -> StorageEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
