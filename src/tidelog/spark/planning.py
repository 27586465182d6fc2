"""Driver-side planning for the `tidelog` source: which partitions, from which offset to which.

A `Backend` answers the questions Spark's Kafka source asks its admin client: the topics and partitions there are,
the earliest and latest offsets, the first offset at or after a timestamp, and (for log files) where batches start.
`FileBackend` answers from the segment and index files, `KafkaBackend` (kafka_client.py) through the Kafka
protocol. The functions below turn options and pushed filters into offset ranges with Spark's Kafka rules and
error messages that name the option at fault. Nothing here runs in a task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from tidelog.errors import DataLossError, OptionError, UnknownTopicOrPartitionError
from tidelog.spark.committed import StableOffsets
from tidelog.spark.logfiles import LogFiles, data_loss_message
from tidelog.spark.offsets import OffsetRange, PushedFilters, TopicPartition, split_ranges
from tidelog.spark.options import EARLIEST, LATEST, OffsetSpec, ReadOptions, Subscription


class Backend(Protocol):
    def topic_partitions(self) -> dict[str, list[int]]: ...

    def earliest(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]: ...

    def latest(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]: ...

    def offset_for_timestamp(self, tp: TopicPartition, timestamp_ms: int) -> int | None: ...

    def batch_starts(self, r: OffsetRange) -> Sequence[int] | None:
        """Offsets in (r.start, r.end) where a batch is known to start; None when the backend cannot tell."""
        ...

    def close(self) -> None: ...


class FileBackend:
    """Planning answers read from log directories (no broker, no lock). With `read_committed` the latest offset
    is the last stable offset (committed.py), which a streaming query's backend tracks from trigger to trigger."""

    def __init__(self, paths: Sequence[str], read_committed: bool = False) -> None:
        self.files = LogFiles(paths)
        self.stable = StableOffsets() if read_committed else None

    def topic_partitions(self) -> dict[str, list[int]]:
        return self.files.topics()

    def earliest(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.files.partition(*tp).log_start_offset() for tp in partitions}

    def latest(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        if self.stable is not None:
            return {tp: self.stable.last_stable_offset(self.files.partition(*tp)) for tp in partitions}
        return {tp: self.files.partition(*tp).readable_end_offset() for tp in partitions}

    def offset_for_timestamp(self, tp: TopicPartition, timestamp_ms: int) -> int | None:
        return self.files.partition(*tp).offset_for_timestamp(timestamp_ms)

    def batch_starts(self, r: OffsetRange) -> Sequence[int]:
        return self.files.partition(r.topic, r.partition).split_points(r.start, r.end)

    def close(self) -> None:
        pass


def open_backend(options: ReadOptions) -> Backend:
    if options.paths:
        return FileBackend(options.paths, options.read_committed)
    from tidelog.spark.kafka_client import KafkaBackend

    return KafkaBackend(options)


def subscribed(options: ReadOptions, backend: Backend, *, must_exist: bool = True) -> list[TopicPartition]:
    """The partitions `subscribe` / `subscribePattern` / `assign` name that exist now.

    A subscribed or assigned topic that does not exist is an error (naming the option) when `must_exist`;
    a pattern that matches nothing is not. Internal topics (`__...`) match a pattern only when named in it."""
    topics = backend.topic_partitions()
    if options.subscription is Subscription.SUBSCRIBE:
        missing = [t for t in options.topics if t not in topics]
        if missing and must_exist:
            raise UnknownTopicOrPartitionError(
                f"option 'subscribe': topic {', '.join(repr(t) for t in missing)} does not exist in "
                f"{options.location} (topics there: {', '.join(sorted(topics)) or 'none'})"
            )
        return sorted((t, p) for t in options.topics if t in topics for p in topics[t])
    if options.subscription is Subscription.PATTERN:
        return sorted(
            (t, p)
            for t, partitions in topics.items()
            if options.topic_matches(t) and (not t.startswith("__") or "__" in (options.pattern or ""))
            for p in partitions
        )
    missing_assigned = [f"{t}-{p}" for t, p in options.assigned if p not in topics.get(t, [])]
    if missing_assigned and must_exist:
        raise UnknownTopicOrPartitionError(
            f"option 'assign': partition {', '.join(missing_assigned)} does not exist in {options.location}"
        )
    return [(t, p) for t, p in options.assigned if p in topics.get(t, [])]


def _specified(spec: OffsetSpec, partitions: Sequence[TopicPartition], name: str) -> None:
    """Per-partition JSON must name every partition read (as Spark asserts), so none is silently skipped."""
    missing = [f"{t}-{p}" for t, p in partitions if (t, p) not in spec.offsets]
    if missing:
        raise OptionError(
            f"option '{name}' must specify every partition read; missing {', '.join(missing)} "
            "(use -2 for earliest and -1 for latest in offset JSON)"
        )


def resolve_start(
    options: ReadOptions,
    backend: Backend,
    partitions: Sequence[TopicPartition],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    spec = options.starting
    if spec.kind == "earliest":
        return {tp: earliest[tp] for tp in partitions}
    if spec.kind == "latest":
        return {tp: latest[tp] for tp in partitions}
    if spec.kind == "offsets":
        _specified(spec, partitions, "startingOffsets")
        resolved = {}
        for tp in partitions:
            value = spec.offsets[tp]
            resolved[tp] = earliest[tp] if value == EARLIEST else latest[tp] if value == LATEST else value
        return resolved
    name = "startingTimestamp" if spec.kind == "timestamp" else "startingOffsetsByTimestamp"
    if spec.kind == "timestamps":
        _specified(spec, partitions, name)
    resolved = {}
    for tp in partitions:
        timestamp = spec.timestamp if spec.kind == "timestamp" else spec.offsets[tp]
        assert timestamp is not None
        found = backend.offset_for_timestamp(tp, timestamp)
        if found is None:
            if options.timestamp_strategy == "latest":
                found = latest[tp]
            else:
                raise OptionError(
                    f"option '{name}': no record in {tp[0]}-{tp[1]} has a timestamp >= {timestamp}; set "
                    "'startingOffsetsByTimestampStrategy' to 'latest' to start at the end of such partitions"
                )
        resolved[tp] = found
    return resolved


def resolve_end(
    options: ReadOptions,
    backend: Backend,
    partitions: Sequence[TopicPartition],
    latest: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    spec = options.ending
    if spec.kind == "latest":
        return {tp: latest[tp] for tp in partitions}
    if spec.kind == "offsets":
        _specified(spec, partitions, "endingOffsets")
        return {tp: latest[tp] if spec.offsets[tp] == LATEST else spec.offsets[tp] for tp in partitions}
    name = "endingTimestamp" if spec.kind == "timestamp" else "endingOffsetsByTimestamp"
    if spec.kind == "timestamps":
        _specified(spec, partitions, name)
    resolved = {}
    for tp in partitions:
        timestamp = spec.timestamp if spec.kind == "timestamp" else spec.offsets[tp]
        assert timestamp is not None
        found = backend.offset_for_timestamp(tp, timestamp)
        resolved[tp] = latest[tp] if found is None else found  # no match: latest, as Spark
    return resolved


def check_data_loss(
    options: ReadOptions, tp: TopicPartition, start: int, earliest: int, what: str = "starting offset"
) -> int:
    """The offset to start at when `start` lies below the log start: an error, or the log start (failOnDataLoss)."""
    if start >= earliest:
        return start
    if options.fail_on_data_loss:
        raise DataLossError(
            data_loss_message(
                f"{tp[0]}-{tp[1]}: the {what} {start} is below the log start offset {earliest} "
                f"(offsets {start} to {earliest - 1} are gone)"
            )
        )
    return earliest


def check_within_log(
    options: ReadOptions,
    offsets: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    which: str,
) -> None:
    """Offsets given as numbers in `startingOffsets`/`endingOffsets` must not lie past the end of the log.

    Checked at planning, as Spark's Kafka source does, so the option at fault is named before any task runs
    (a task would otherwise wait for records that are not there, or report them lost)."""
    spec = options.starting if which == "starting" else options.ending
    if spec.kind != "offsets":
        return  # earliest, latest and timestamps resolve to offsets inside the log
    beyond = [(tp, offsets[tp], latest[tp]) for tp in sorted(offsets) if offsets[tp] > latest[tp]]
    if beyond:
        detail = ", ".join(f"{t}-{p} at {offset} (the log ends at {end})" for (t, p), offset, end in beyond)
        raise OptionError(
            f"option '{which}Offsets': {detail}: past the end of the partition; an offset may be at most the "
            "partition's latest offset (-1 means latest)"
        )


def _option_name(spec: OffsetSpec, which: str) -> str:
    return {"timestamp": f"{which}Timestamp", "timestamps": f"{which}OffsetsByTimestamp"}.get(
        spec.kind, f"{which}Offsets"
    )


def plan_batch(options: ReadOptions, filters: PushedFilters, backend: Backend) -> list[OffsetRange]:
    """Offset ranges of a batch query, narrowed by pushed filters and split by minPartitions."""
    partitions = [tp for tp in subscribed(options, backend) if filters.allows(*tp)]
    if not partitions:
        return []
    earliest = backend.earliest(partitions)
    latest = backend.latest(partitions)
    start = resolve_start(options, backend, partitions, earliest, latest)
    end = resolve_end(options, backend, partitions, latest)
    check_within_log(options, start, latest, "starting")
    check_within_log(options, end, latest, "ending")
    ranges = []
    for tp in partitions:
        if end[tp] < start[tp]:
            raise OptionError(
                f"{tp[0]}-{tp[1]}: the ending offset {end[tp]} ({_option_name(options.ending, 'ending')}) is before "
                f"the starting offset {start[tp]} ({_option_name(options.starting, 'starting')}); a batch query needs "
                "starting <= ending"
            )
        s = check_data_loss(options, tp, start[tp], earliest[tp])
        if end[tp] <= s:  # everything asked for is gone, and failOnDataLoss=false says to go on
            continue
        r = filters.clip(OffsetRange(tp[0], tp[1], s, end[tp]))
        if r.size and filters.timestamps.low is not None:  # the time index gives a lower bound on offsets
            first = backend.offset_for_timestamp(tp, filters.timestamps.low)
            r = OffsetRange(r.topic, r.partition, max(r.start, first if first is not None else r.end), r.end)
        if r.size > 0:
            ranges.append(r)
    return split_ranges(ranges, options.min_partitions, options.max_records_per_partition, backend.batch_starts)
