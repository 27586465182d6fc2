"""Offset ranges and their arithmetic, as Spark's Kafka source does it. Pure: no files, no network.

- The JSON form of per-partition offsets, `{"topic": {"0": 23, "1": 42}}`, is what `startingOffsets` takes and
  what a streaming query stores in `<checkpoint>/offsets/N` (partitions sorted numerically, as Kafka's JsonUtils).
- `split_ranges` is KafkaOffsetRangeCalculator.getRanges (minPartitions / maxRecordsPerPartition), with one
  addition: every boundary inside a partition is moved to the nearest offset where a batch starts (known from the
  offset index), so every task starts at a batch and no batch is decoded by two tasks.
- `rate_limit` is KafkaMicroBatchStream.rateLimit: `maxOffsetsPerTrigger` prorated over the partitions by how
  far behind each is, never starving a small one.
- `PushedFilters` turns the predicates Spark pushes on `topic`, `partition`, `offset` and `timestamp` into
  ranges the planner can apply with index lookups and the reader can apply exactly.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

TopicPartition = tuple[str, int]
INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # inclusive
    end: int  # exclusive

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Kafka's offset JSON as a dict (topics sorted, partitions sorted numerically)."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def offsets_from_json(data: Mapping[str, Any]) -> dict[TopicPartition, int]:
    result: dict[TopicPartition, int] = {}
    for topic, partitions in data.items():
        for partition, offset in partitions.items():
            result[(topic, int(partition))] = int(offset)
    return result


# --- splitting -------------------------------------------------------------------------------------------------


def _divide(parts: int, r: OffsetRange) -> list[OffsetRange]:
    """getDividedPartition: `parts` near-equal ranges, the last taking the round-off."""
    remaining = r.size
    start = r.start
    pieces = []
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        end = min(start + this, r.end)
        pieces.append(OffsetRange(r.topic, r.partition, start, end))
        start = end
    return pieces


def _part_count(size: int, total: int, min_parts: int) -> int:
    return max(round(size / total * min_parts), 1) if total else 1


def split_ranges(
    ranges: Sequence[OffsetRange],
    min_partitions: int | None,
    max_records_per_partition: int | None,
    batch_starts: Callable[[OffsetRange], Sequence[int] | None] | None = None,
) -> list[OffsetRange]:
    """Spark's getRanges, then each interior boundary moved to a batch start (see `_snap`)."""
    ranges = [r for r in ranges if r.size > 0]
    if (min_partitions is None or len(ranges) >= min_partitions) and max_records_per_partition is None:
        return ranges
    divided = ranges
    if max_records_per_partition is not None:
        divided = [
            piece
            for r in ranges
            for piece in _divide(math.ceil(r.size / max_records_per_partition), r)
            if piece.size > 0
        ]
    if min_partitions is not None and min_partitions > len(divided):
        total = sum(r.size for r in divided)
        unsplit = [r for r in divided if _part_count(r.size, total, min_partitions) == 1]
        split_total = total - sum(r.size for r in unsplit)
        split_min = max(min_partitions - len(unsplit), 1)
        result = []
        for r in divided:
            parts = (
                1 if _part_count(r.size, total, min_partitions) == 1 else _part_count(r.size, split_total, split_min)
            )
            result += [piece for piece in _divide(parts, r) if piece.size > 0]
        divided = result
    if batch_starts is None:
        return divided
    return _snap(divided, batch_starts, max_records_per_partition)


def _snap(
    pieces: list[OffsetRange], batch_starts: Callable[[OffsetRange], Sequence[int] | None], max_records: int | None
) -> list[OffsetRange]:
    """Move each boundary between consecutive pieces of one partition to the nearest known batch start between
    its neighbours (the boundary before it, already moved, and the one after it), so no batch is decoded by two
    tasks. A boundary with no batch start between its neighbours is dropped (its two pieces become one), unless
    that would break `maxRecordsPerPartition`: then it stays where the even split put it. When the backend cannot
    tell where batches start (None: a broker), the even split stays."""
    by_partition: dict[TopicPartition, list[OffsetRange]] = {}
    for piece in pieces:
        by_partition.setdefault(piece.topic_partition, []).append(piece)
    snapped: list[OffsetRange] = []
    for group in by_partition.values():
        group.sort(key=lambda r: r.start)
        whole = OffsetRange(group[0].topic, group[0].partition, group[0].start, group[-1].end)
        known = batch_starts(whole) if len(group) > 1 else None
        if known is None:
            snapped += group
            continue
        points = sorted(known)
        bounds = [whole.start]
        for left, right in itertools.pairwise(group):
            target, after = left.end, right.end
            lo, hi = bounds[-1] + 1, after - 1  # strictly between the neighbours
            if max_records is not None:  # neither this piece nor the next (still unmoved) may grow past the cap
                lo, hi = max(lo, after - max_records), min(hi, bounds[-1] + max_records)
            candidates = points[bisect.bisect_left(points, lo) : bisect.bisect_right(points, hi)]
            if candidates:
                i = bisect.bisect_left(candidates, target)
                below, above = candidates[max(0, i - 1)], candidates[min(i, len(candidates) - 1)]
                bounds.append(below if target - below <= above - target else above)
            elif max_records is not None:
                bounds.append(target)
        bounds.append(whole.end)
        snapped += [OffsetRange(whole.topic, whole.partition, lo, hi) for lo, hi in itertools.pairwise(bounds)]
    return snapped


# --- streaming admission control ---------------------------------------------------------------------------


def rate_limit(
    limit: int, start: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """At most about `limit` offsets past `start`, prorated over the partitions by how far behind each is."""
    sizes = {tp: end - start[tp] for tp, end in until.items() if tp in start and end - start[tp] > 0}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    result = {}
    for tp, end in until.items():
        size = sizes.get(tp)
        if size is None:
            result[tp] = end
            continue
        prorate = limit * (size / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)  # don't starve small partitions
        result[tp] = min(end, start[tp] + step if step <= INT64_MAX - start[tp] else INT64_MAX)
    return result


# --- pushed-down filters -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bound:
    """A closed interval [low, high] of integers; None means unbounded."""

    low: int | None = None
    high: int | None = None

    def narrow(self, low: int | None = None, high: int | None = None) -> Bound:
        new_low = self.low if low is None else (low if self.low is None else max(self.low, low))
        new_high = self.high if high is None else (high if self.high is None else min(self.high, high))
        return Bound(new_low, new_high)

    @property
    def empty(self) -> bool:
        return self.low is not None and self.high is not None and self.low > self.high

    def contains(self, value: int) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


@dataclass(frozen=True, slots=True)
class PushedFilters:
    """What pushed predicates allow: sets of topics/partitions (None = any), offset and timestamp (ms) intervals."""

    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    partition_bound: Bound = field(default_factory=Bound)
    offsets: Bound = field(default_factory=Bound)
    timestamps: Bound = field(default_factory=Bound)  # milliseconds, closed
    impossible: bool = False  # a predicate no row satisfies (e.g. offset = NULL)

    def allows(self, topic: str, partition: int) -> bool:
        if self.impossible:
            return False
        return (
            (self.topics is None or topic in self.topics)
            and (self.partitions is None or partition in self.partitions)
            and self.partition_bound.contains(partition)
        )

    @property
    def selects_rows(self) -> bool:
        """Whether the reader must filter rows (not only plan narrower ranges)."""
        return self.timestamps != Bound() or self.offsets != Bound()

    def clip(self, r: OffsetRange) -> OffsetRange:
        start = r.start if self.offsets.low is None else max(r.start, self.offsets.low)
        end = r.end if self.offsets.high is None else min(r.end, self.offsets.high + 1)
        return replace(r, start=start, end=max(start, end))


def _to_millis(value: Any) -> tuple[int, bool] | None:
    """(milliseconds, exact) of a timestamp literal; exact is False when microseconds were rounded down."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        micros = (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
        return micros // 1000, micros % 1000 == 0
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def push_filter(state: PushedFilters, kind: str, column: str, value: Any) -> PushedFilters | None:
    """`state` narrowed by one predicate `column <kind> value`, or None when it cannot be handled exactly.

    kinds: "eq", "in" (value: list), "gt", "ge", "lt", "le", "notnull".
    """
    if kind == "notnull":
        return state if column in ("topic", "partition", "offset", "timestamp") else None
    if column == "topic":
        if kind == "eq" and isinstance(value, str):
            allowed = frozenset([value])
        elif kind == "in" and all(isinstance(v, str) or v is None for v in value):
            allowed = frozenset(v for v in value if v is not None)
        else:
            return None
        topics = allowed if state.topics is None else state.topics & allowed
        return replace(state, topics=topics, impossible=state.impossible or not topics)
    if column == "partition":
        numbers = _int_set(kind, value)
        if numbers is not None:
            partitions = numbers if state.partitions is None else state.partitions & numbers
            return replace(state, partitions=partitions, impossible=state.impossible or not partitions)
        bound = _int_bound(kind, value)
        if bound is None:
            return None
        partition_bound = state.partition_bound.narrow(bound.low, bound.high)
        return replace(state, partition_bound=partition_bound, impossible=state.impossible or partition_bound.empty)
    if column == "offset":
        numbers = _int_set(kind, value)
        if numbers is not None:
            if kind == "eq" or len(numbers) <= 1:
                if not numbers:
                    return replace(state, impossible=True)
                (only,) = numbers
                offsets = state.offsets.narrow(only, only)
                return replace(state, offsets=offsets, impossible=state.impossible or offsets.empty)
            return None  # IN on offsets: only the hull could be pushed; leave it to Spark
        bound = _int_bound(kind, value)
        if bound is None:
            return None
        offsets = state.offsets.narrow(bound.low, bound.high)
        return replace(state, offsets=offsets, impossible=state.impossible or offsets.empty)
    if column == "timestamp":
        if kind == "eq":
            converted = _to_millis(value)
            if converted is None or not converted[1]:
                return None
            ms = converted[0]
            timestamps = state.timestamps.narrow(ms, ms)
            return replace(state, timestamps=timestamps, impossible=state.impossible or timestamps.empty)
        if kind not in ("gt", "ge", "lt", "le"):
            return None
        converted = _to_millis(value)
        if converted is None:
            return None
        ms, exact = converted
        # Record timestamps are whole milliseconds: ts > 10.5ms means ts >= 11ms; ts < 10.5ms means ts <= 10ms.
        if kind == "gt":
            timestamps = state.timestamps.narrow(low=ms + 1)
        elif kind == "ge":
            timestamps = state.timestamps.narrow(low=ms if exact else ms + 1)
        elif kind == "lt":
            timestamps = state.timestamps.narrow(high=ms - 1 if exact else ms)
        else:
            timestamps = state.timestamps.narrow(high=ms)
        return replace(state, timestamps=timestamps, impossible=state.impossible or timestamps.empty)
    return None


def _int_set(kind: str, value: Any) -> frozenset[int] | None:
    if kind == "eq":
        number = _as_int(value)
        return None if number is None else frozenset([number])
    if kind == "in" and isinstance(value, list | tuple):
        numbers = [_as_int(v) for v in value if v is not None]
        if any(n is None for n in numbers):
            return None
        return frozenset(n for n in numbers if n is not None)
    return None


def _int_bound(kind: str, value: Any) -> Bound | None:
    number = _as_int(value)
    if number is None:
        return None
    return {
        "gt": Bound(low=number + 1),
        "ge": Bound(low=number),
        "lt": Bound(high=number - 1),
        "le": Bound(high=number),
    }.get(kind)


def ranges_for(
    partitions: Iterable[TopicPartition],
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
) -> list[OffsetRange]:
    return [OffsetRange(t, p, start[(t, p)], end[(t, p)]) for t, p in sorted(partitions)]
