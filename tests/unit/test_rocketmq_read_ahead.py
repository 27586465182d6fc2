"""The RocketMQ engine's read-ahead (storage/rocketmq/read_ahead.py): a queue read with it gives what a read without
it gives, whatever happens between two reads, and sequential reads do take the read-ahead.

Every scenario runs on two engines holding the same batches, one with `tidelog.rocketmq.readAheadQueues` at its
default and one with it at 0; each read's bytes (or error) must match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.errors import OffsetOutOfRangeError
from tidelog.storage.api import StorageEngine
from tidelog.storage.rocketmq.engine import RocketMQEngine
from tidelog.storage.rocketmq.read_ahead import ReadAhead, ReadKey, ReadResult

BATCHES, PER_BATCH = 60, 25  # 1,500 records in batches of 25
TS = 1_700_000_000_000
Pair = tuple[RocketMQEngine, RocketMQEngine]


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Pair]:
    """Two engines holding the same batches: with read-ahead (64 queues), without (0)."""
    opened = []
    for name, queues in (("ahead", 64), ("plain", 0)):
        engine = tidelog.open(
            tmp_path / name,
            engine="rocketmq",
            config={
                "tidelog.rocketmq.readAheadQueues": queues,
                "tidelog.rocketmq.mapedFileSizeCommitLog": 65536,  # reads cross CommitLog files
                "tidelog.rocketmq.mapedFileSizeConsumeQueue": 6000,
                "tidelog.rocketmq.messageIndexEnable": False,  # no key index files: not what is tested
            },
            background=False,
        )
        assert isinstance(engine, RocketMQEngine)
        engine.create_topic("t", 1)
        for b in range(BATCHES):
            records = [
                Record(f"v{b}-{i}".encode() * (1 + i % 7), key=b"k", timestamp_ms=TS + i) for i in range(PER_BATCH)
            ]
            engine.partition("t", 0).append(build_batch(records))
        opened.append(engine)
    try:
        yield opened[0], opened[1]
    finally:
        for engine in opened:
            engine.close()


def outcome(engine: StorageEngine, call: Callable[[Any], Any]) -> object:
    try:
        result = call(engine.partition("t", 0))
    except OffsetOutOfRangeError as exc:
        return type(exc)
    return result.read_bytes() if hasattr(result, "read_bytes") else result


def read_through(engine: StorageEngine, budget: int, start: int = 0) -> list[bytes]:
    """Read the queue from `start` to its end the way a consumer does: each read from where the last one ended."""
    queue = engine.partition("t", 0)
    answers, offset = [], start
    while offset < queue.high_watermark:
        data = queue.read(offset, budget).read_bytes()
        answers.append(data)
        offset = last_offset(data) + 1
    return answers


def last_offset(data: bytes) -> int:
    position, last = 0, -1
    while position < len(data):
        base = int.from_bytes(data[position : position + 8], "big", signed=True)
        length = int.from_bytes(data[position + 8 : position + 12], "big")
        delta = int.from_bytes(data[position + 23 : position + 27], "big")
        last, position = base + delta, position + 12 + length
    return last


@pytest.mark.parametrize("budget", [1, 700, 4096, 20_000])
def test_sequential_reads_take_the_read_ahead_and_match(engines: Pair, budget: int) -> None:
    ahead, plain = engines
    assert read_through(ahead, budget) == read_through(plain, budget)
    reads = len(read_through(plain, budget))
    assert ahead.read_ahead.taken >= reads - 2  # every read after the first but the last may be taken
    assert plain.read_ahead.taken == 0


def test_reads_after_delete_records_match(engines: Pair) -> None:
    ahead, plain = engines
    for engine in (ahead, plain):
        engine.partition("t", 0).read(0, 2000)  # offers the next read
    first = last_offset(plain.partition("t", 0).read(0, 2000).read_bytes()) + 1
    for engine in (ahead, plain):
        engine.partition("t", 0).delete_records(first + 10)
    taken = ahead.read_ahead.taken
    same = [outcome(engine, lambda q: q.read(first, 2000)) for engine in (ahead, plain)]  # below the new log start now
    assert same[0] == same[1] == OffsetOutOfRangeError
    assert outcome(ahead, lambda q: q.read(first + 10, 2000)) == outcome(plain, lambda q: q.read(first + 10, 2000))
    assert ahead.read_ahead.taken == taken


def test_a_read_ahead_up_to_a_higher_limit_is_not_taken_by_a_lower_one(
    engines: Pair,
) -> None:
    """A read_committed fetch (max_offset: the last stable offset) must not get records past its limit."""
    ahead, plain = engines
    first = last_offset(plain.partition("t", 0).read(0, 3000).read_bytes()) + 1
    ahead.partition("t", 0).read(0, 3000)  # offers the read at `first`, up to the high watermark
    taken = ahead.read_ahead.taken
    for limit in (first + 3, first + PER_BATCH + 1):
        results = [
            outcome(engine, lambda q, limit=limit: q.read(first, 3000, max_offset=limit)) for engine in (ahead, plain)
        ]
        assert results[0] == results[1]
        assert last_offset(results[0]) < limit  # type: ignore[arg-type]
    assert ahead.read_ahead.taken == taken


def test_a_read_of_other_parameters_reads_for_itself(engines: Pair) -> None:
    ahead, plain = engines
    first = last_offset(plain.partition("t", 0).read(0, 3000).read_bytes()) + 1
    ahead.partition("t", 0).read(0, 3000)
    taken = ahead.read_ahead.taken
    for call in (
        lambda q: q.read(first, 5000),  # another budget
        lambda q: q.read(first + 1, 3000),  # another offset
    ):
        assert outcome(ahead, call) == outcome(plain, call)
    assert ahead.read_ahead.taken == taken


@pytest.mark.parametrize(("budget", "taken"), [(3000, 1), (20, 0)])
def test_min_one_message_matters_only_when_the_first_batch_does_not_fit(engines: Pair, budget: int, taken: int) -> None:
    """A fetch sets min_one_message for its first partition only; the read-ahead (made with it) serves a read
    without it when the first batch fits the budget, as both then give the same."""
    ahead, plain = engines
    first = last_offset(plain.partition("t", 0).read(0, budget).read_bytes()) + 1
    ahead.partition("t", 0).read(0, budget)
    before = ahead.read_ahead.taken
    call = lambda q: q.read(first, budget, min_one_message=False)  # noqa: E731
    assert outcome(ahead, call) == outcome(plain, call)
    assert ahead.read_ahead.taken - before == taken


def test_a_slave_taking_over_drops_the_read_ahead(engines: Pair) -> None:
    ahead, plain = engines
    queue = ahead.partition("t", 0)
    first = last_offset(queue.read(0, 3000).read_bytes()) + 1
    generation = queue.read_generation
    queue.take_over()  # what a truncation of the CommitLog also does
    assert queue.read_generation == generation + 1
    assert outcome(ahead, lambda q: q.read(first, 3000)) == outcome(plain, lambda q: q.read(first, 3000))
    assert ahead.read_ahead.taken == 0


def result(value: int) -> Callable[[], ReadResult]:
    return lambda: ReadResult((), value, 10, True, True, True)


def test_the_service_keeps_one_read_per_queue_and_at_most_max_queues() -> None:
    service = ReadAhead(max_queues=2)
    try:
        for queue in ("a", "b", "c"):
            service.offer(queue, ReadKey(0, 10, 0), result(1))
        assert service.take("a", ReadKey(0, 10, 0), 10, True) is None  # dropped: the least recently offered
        taken = service.take("c", ReadKey(0, 10, 0), 10, True)
        assert taken is not None and taken.next_offset == 1
        assert service.take("c", ReadKey(0, 10, 0), 10, True) is None  # taken once
        service.offer("b", ReadKey(5, 10, 0), result(2))  # replaces b's
        assert service.take("b", ReadKey(0, 10, 0), 10, True) is None
    finally:
        service.close()
    service.offer("a", ReadKey(0, 10, 0), result(1))  # closed: nothing is kept
    assert service.take("a", ReadKey(0, 10, 0), 10, True) is None


def test_a_failed_read_ahead_leaves_the_read_to_the_reader() -> None:
    service = ReadAhead(max_queues=4)

    def failing() -> ReadResult:
        raise OffsetOutOfRangeError("deleted by retention")

    try:
        service.offer("a", ReadKey(0, 10, 0), failing)
        assert service.take("a", ReadKey(0, 10, 0), 10, True) is None
        assert service.taken == 0
    finally:
        service.close()


def test_off_keeps_nothing() -> None:
    service = ReadAhead(max_queues=0)
    service.offer("a", ReadKey(0, 10, 0), result(1))
    assert service.take("a", ReadKey(0, 10, 0), 10, True) is None
    service.close()
