"""The RocketMQ engine's reads (codec/rocketmq_batches.py, called by MessageQueue.read) against the record-by-record
rebuild they replaced, kept here as the reference: every message decoded (rocketmq_message.decode_message), turned
into its record (message_to_record) and each producer batch encoded by records_batch. Both must give the same
bytes for every start offset and byte budget, over batches of every kind the engine stores: keys as text, as
base64 and null; values null, empty, short and long; headers as user properties, in KAFKA_HEADERS64, with
duplicate names; idempotent and transactional batches and their markers; single records and long batches. A
damaged message is a storage error naming its unit. Every test runs twice: with the compiled rebuild
(_rocketmq_rebuild.c, built by `pip install -e .` with a C compiler, which `make` installs) and with numpy alone;
and the compiled rebuild is compared with the numpy one run for run, damaged runs included."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tidelog
from broker_process import ROCKETMQ_IGNORE_DISK_USAGE
from tidelog import Record
from tidelog.codec import rocketmq_batches
from tidelog.codec import rocketmq_message as rm
from tidelog.codec.record_batch import BatchHeader, build_batch
from tidelog.codec.record_set import iter_batches, iter_records
from tidelog.codec.rocketmq_batches import PADDING, TXN_ATTRIBUTES, rebuild_batches, records_batch
from tidelog.errors import KafkaStorageError
from tidelog.storage.rocketmq import message_queue
from tidelog.storage.rocketmq.engine import RocketMQEngine
from tidelog.storage.rocketmq.message_queue import MessageQueue

TS = 1_700_000_000_000
BORN_TIMESTAMP_POSITION = 40  # in a message (rocketmq_message's layout)


Store = tuple[RocketMQEngine, MessageQueue]


@pytest.fixture(params=["compiled", "numpy"], autouse=True)
def rebuild_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with the compiled rebuild (which hands what it declines to numpy) and with numpy alone."""
    if request.param == "numpy":
        monkeypatch.setattr(rocketmq_batches, "compiled_rebuild", None)
    elif rocketmq_batches.compiled_rebuild is None:
        pytest.fail("tidelog.codec._rocketmq_rebuild is not built: `pip install -e .` needs a C compiler")
    return str(request.param)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A RocketMQ engine (no background threads) with topic `t` of one queue."""
    settings = {"tidelog.rocketmq.mapedFileSizeCommitLog": 1 << 20, **ROCKETMQ_IGNORE_DISK_USAGE}
    engine = tidelog.open(tmp_path / "store", engine="rocketmq", config=settings, background=False)
    assert isinstance(engine, RocketMQEngine)
    try:
        engine.create_topic("t", partitions=1)
        queue = engine.partition("t", 0)
        assert isinstance(queue, MessageQueue)
        yield engine, queue
    finally:
        engine.close()


def random_record(rng: random.Random, i: int, plain: bool) -> Record:
    """A record numpy rebuilds (`plain`: a text key or none, headers as user properties or none), or one that also
    may have a key or headers only base64 carries."""
    keys = [None, b"key-%d" % i, "ключ".encode()] + ([] if plain else [b"", b"\x00\xffbinary", b"with space"])
    headers_choices: list[list[tuple[str, bytes | None]]] = [
        [],
        [("trace", b"abc"), ("span", b"42")],  # user properties
        [("h" * 30, b"x" * 100)],  # a long name and value
    ]
    if not plain:
        headers_choices += [
            [("n", None)],  # a null value: KAFKA_HEADERS64
            [("same", b"1"), ("same", b"2")],  # duplicate names: KAFKA_HEADERS64
            [("KEYS", b"reserved name")],  # a reserved name: KAFKA_HEADERS64
        ]
    lengths = [15, 16, 17, 31, 47, 48, 64, 65, 200, 1024, 1500, 4100]  # either side of _copy's row widths
    value = rng.choice([None, b"", b"v%d" % i, rng.randbytes(rng.choice(lengths))])
    return Record(
        value, key=rng.choice(keys), headers=rng.choice(headers_choices), timestamp_ms=TS + rng.randrange(-5000, 5000)
    )


def fill(queue: MessageQueue, rng: random.Random, batches: int, plain_share: float = 0.75) -> None:
    """Batches of every kind, some transactional (committed or aborted by a marker), some idempotent; `plain_share`
    of them with keys and headers that need no base64."""
    sequence = 0
    for b in range(batches):
        count = rng.choice([1, 1, 2, 3, 10, 60])
        plain = rng.random() < plain_share
        records = [random_record(rng, b * 100 + i, plain) for i in range(count)]
        kind = rng.choice(["plain", "idempotent", "transactional"])
        if kind == "plain":
            queue.append(build_batch(records))
        else:
            queue.append(
                build_batch(
                    records,
                    producer_id=7,
                    producer_epoch=0,
                    base_sequence=sequence,
                    is_transactional=kind == "transactional",
                )
            )
            sequence += count
            if kind == "transactional":
                queue.append_marker(7, 0, coordinator_epoch=1, commit=rng.random() < 0.5)


def reference_read(
    engine: RocketMQEngine, queue: MessageQueue, offset: int, max_bytes: int, min_one_message: bool
) -> bytes:
    """What MessageQueue.read answered before it was vectorised: message by message, batch by batch."""
    high_watermark = queue.high_watermark
    batches: list[bytes] = []
    remaining = max_bytes
    group: list[rm.Message] = []
    for _offset, at, size in queue.units(offset, high_watermark):
        message = engine.read_message(at, size)
        group.append(message)
        if rm.ends_batch(message.properties):
            batch = records_batch([rm.message_to_record(m) for m in group], message)
            group = []
            if batches and len(batch) > remaining:
                break
            if not batches and len(batch) > remaining and not min_one_message:
                break
            batches.append(batch)
            remaining -= len(batch)
            if remaining <= 0:
                break
    else:
        if group and not group[-1].flag & TXN_ATTRIBUTES:
            batch = build_batch([rm.message_to_record(m) for m in group], base_offset=group[0].queue_offset)
            if not batches or len(batch) <= remaining:
                batches.append(batch)
    return b"".join(batches)


def test_reads_equal_the_record_by_record_rebuild(store: Store) -> None:
    rng = random.Random(20261127)
    engine, queue = store
    fill(queue, rng, 120)
    engine.catch_up()
    end = queue.high_watermark
    starts = [0, 1, end - 1, *rng.sample(range(end), 40)]
    for start in starts:
        for max_bytes in (0, 1, 300, 5000, 60_000, 1 << 20):
            for min_one in (True, False):
                got = queue.read(start, max_bytes, min_one_message=min_one).read_bytes()
                want = reference_read(engine, queue, start, max_bytes, min_one)
                assert got == want, (start, max_bytes, min_one)
    # a whole read of the queue gives every offset once, in order
    offsets = []
    position = 0
    while position < end:
        data = queue.read(position, 1 << 16).read_bytes()
        offsets += [r.offset for r in iter_records(data, include_control=True)]
        position = offsets[-1] + 1
    assert offsets == list(range(end))


def test_a_batch_whose_end_is_not_dispatched_yet(store: Store) -> None:
    """A run that stops inside a batch: handed out as far as it goes when nothing follows (at_end), otherwise left
    for the next round with how many messages complete it."""
    engine, queue = store
    queue.append(build_batch([Record(b"a%d" % i, timestamp_ms=TS) for i in range(5)]))
    queue.append(build_batch([Record(b"b%d" % i, timestamp_ms=TS + i) for i in range(4)]))
    engine.catch_up()
    units = queue.consume_queue.unit_array(0, 7)  # the first batch and 2 of the second's 4 messages
    data, positions, covered = engine.read_runs(units["offset"].astype(np.int64), units["size"])
    assert covered == 7
    sizes = units["size"]
    later = rebuild_batches(data, positions, sizes, 0, 1 << 20, at_end=False)
    assert (later.next_offset, later.missing, later.full) == (5, 4, False)
    assert [b.last_offset for b in iter_batches(b"".join(later.batches))] == [4]
    now = rebuild_batches(data, positions, sizes, 0, 1 << 20, at_end=True)
    assert [b.last_offset for b in iter_batches(b"".join(now.batches))] == [4, 6]
    assert [r.value for r in iter_records(b"".join(now.batches))][5:] == [b"b0", b"b1"]


@pytest.mark.parametrize("damage", ["queue offset", "batch count"])
def test_a_damaged_message_is_a_storage_error_naming_its_unit(store: Store, damage: str) -> None:
    engine, queue = store
    queue.append(build_batch([Record(b"v%d" % i, timestamp_ms=TS) for i in range(3)]))
    engine.catch_up()
    _offset, at, size = queue.units(1, 2)[0]
    mapped_file = engine.commitlog.queue.find(at)
    assert mapped_file is not None and mapped_file.map is not None
    start = at - mapped_file.file_from_offset
    if damage == "queue offset":
        where = start + rm.QUEUE_OFFSET_POSITION
        mapped_file.map[where : where + 8] = (99).to_bytes(8, "big")
        expected = r"offset 1 .*QUEUEOFFSET is not the unit's"
    else:  # the batch's second message claims to be its first: two batches of 1 and 2 where 3 was written
        where = start + bytes(mapped_file.map[start : start + size]).index(b"KAFKA_BATCH\x011/3")
        mapped_file.map[where : where + 15] = b"KAFKA_BATCH\x010/3"
        expected = r"offset 0 .*holds 1 messages, not 3"
    with pytest.raises(KafkaStorageError, match=expected):
        queue.read(0, 1 << 20)


def test_a_batch_longer_than_a_round_of_units_is_read_whole(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read takes at most MAX_READ_UNITS units a round for its budget, but always all of a batch it started."""
    monkeypatch.setattr(message_queue, "MAX_READ_UNITS", 8)
    engine, queue = store
    queue.append(build_batch([Record(b"v%d" % i, timestamp_ms=TS) for i in range(30)]))
    queue.append(build_batch([Record(b"w", timestamp_ms=TS)]))
    engine.catch_up()
    for max_bytes in (1, 1 << 20):
        data = queue.read(0, max_bytes).read_bytes()
        assert data == reference_read(engine, queue, 0, max_bytes, True)
        assert [b.last_offset for b in iter_batches(data)] == ([29] if max_bytes == 1 else [29, 30])


# PROPERTIES pieces of messages that RocketMQ producers (not tidelog) may write: reserved and user names, names
# near reserved ones, long and non-ASCII names, entries Java drops, duplicates; a message joins a few of them.
FOREIGN_PIECES = [
    "UNIQ_KEY\x017F0000016CFC2E91E6C48A958CE80000\x02",
    "KEYS\x01order-1\x02", "KEYS\x01a\x01b\x02", "KEYS\x01\x02", "TAGS\x01tag-a\x02", "KAFKA_NULL_VALUE\x011\x02",
    "h\x01v\x02", "trace-id\x01abc\x02", "a-name-longer-than-sixteen\x01x\x02", "KAFKA_NULL_VALUEX\x01y\x02",
    "KAFKA_NULL_VALU\x01y\x02", "UNIQ_KEY_\x01z\x02", "KEY\x01w\x02", "ключ\x01значение\x02", "h\x01again\x02",
    "no separator\x02", "\x01no name\x02", "\x02", "x\x01\x02", "CONSUME_START_TIME\x011700000000000\x02",
    "CONSUME_START_TIMX\x01u\x02",
]  # fmt: skip


def test_messages_of_any_properties_rebuild_as_record_by_record() -> None:
    """Messages whose PROPERTIES tidelog did not write (other layouts, entries Java drops, duplicates, a missing
    last separator) give the bytes the record-by-record decoder gives, whichever way each is rebuilt."""
    rng = random.Random(7)
    messages = []
    for offset in range(400):
        properties = "".join(rng.choice(FOREIGN_PIECES) for _ in range(rng.randrange(0, 7)))
        if properties and rng.random() < 0.2:
            properties = properties[:-1]  # the last entry without its \x02
        body = rng.randbytes(rng.choice([0, 5, 16, 100]))
        messages.append(
            rm.encode_message(
                topic="t", queue_id=0, body=body, properties=properties, queue_offset=offset, born_timestamp=TS + offset
            )
        )
    sizes = np.array([len(m) for m in messages])
    positions = np.cumsum(sizes) - sizes
    data = b"".join(messages) + bytes(PADDING)
    for start in (0, 1, 37):
        got = rebuild_batches(data, positions[start:], sizes[start:], start, 1 << 30)
        want = rebuild_batches(data, positions[start:], sizes[start:], start, 1 << 30, per_record=True)
        assert b"".join(got.batches) == b"".join(want.batches)
        assert len(list(iter_records(b"".join(got.batches)))) == 400 - start


def test_kafka_batch_values_parse_alike_in_python_and_numpy() -> None:
    """A few KAFKA_BATCH values are parsed in Python, many with numpy: the same verdict and numbers for valid values
    and for damaged ones (other characters, no or two slashes, empty or over-long numbers, index >= count)."""
    rng = random.Random(3)
    values = [b"%d/%d" % (i, c) for c in (1, 2, 10, 999_999) for i in (0, c - 1, c)]
    values += [
        b"",
        b"/",
        b"1/",
        b"/1",
        b"1//2",
        b"1/2/3",
        b"a/2",
        b"1/2x",
        b" 1/2",
        b"1" * 19 + b"/2",
        b"1/" + b"9" * 19,
    ]
    values += [bytes(rng.choice(b"0123456789/x") for _ in range(rng.randrange(0, 27))) for _ in range(300)]
    text = np.frombuffer(b"".join(values) + bytes(PADDING), dtype=np.uint8)
    length = np.array([len(v) for v in values])
    at = np.cumsum(length) - length
    few = rocketmq_batches._few_batch_positions(text, at, length)
    many = rocketmq_batches._batch_positions(text, at, length)
    assert few[2].tolist() == many[2].tolist()
    assert few[2].sum() > 10  # valid values among them
    for parsed_few, parsed_many in zip(few[:2], many[:2], strict=True):
        assert parsed_few[few[2]].tolist() == parsed_many[many[2]].tolist()


def filled_run(
    store: Store, rng: random.Random, batches: int, plain_share: float = 0.75
) -> tuple[bytearray, np.ndarray, np.ndarray, list[rm.Message]]:
    """The queue filled (`fill`), and all of it as one run: its CommitLog bytes (PADDING after them), the messages'
    positions in them and sizes, and the messages decoded."""
    engine, queue = store
    fill(queue, rng, batches, plain_share)
    engine.catch_up()
    end = queue.high_watermark
    units = queue.consume_queue.unit_array(0, end)
    data, positions, covered = engine.read_runs(units["offset"].astype(np.int64), units["size"])
    assert covered == end
    sizes = units["size"].astype(np.int64)
    messages = [engine.read_message(int(at), int(size)) for at, size in zip(units["offset"], sizes, strict=True)]
    return bytearray(bytes(data) + bytes(PADDING)), positions, sizes, messages


@contextlib.contextmanager
def damaged(buffer: bytearray, at: int, size: int, damage: str) -> Iterator[bool]:
    """The message at `at` of `buffer` with one field damaged in place (bytes of the same length), put back after;
    False where it has no such field (a message without KAFKA_BATCH or KAFKA_PRODUCER)."""
    saved = bytes(buffer[at : at + size])
    message = bytearray(saved)
    if damage == "total size":
        message[0:4] = (len(message) + 4).to_bytes(4, "big")
    elif damage == "magic":
        message[4:8] = b"\x00\x00\x00\x01"
    elif damage == "queue offset":
        message[rm.QUEUE_OFFSET_POSITION : rm.QUEUE_OFFSET_POSITION + 8] = (10**9).to_bytes(8, "big")
    elif damage == "born timestamp":  # no timestamp delta from (or to) the batch's others can say it
        message[BORN_TIMESTAMP_POSITION : BORN_TIMESTAMP_POSITION + 8] = (-(1 << 63)).to_bytes(8, "big", signed=True)
    elif damage == "properties length":
        decoded = rm.decode_message(saved, 0, check_crc=False)
        assert isinstance(decoded, rm.Message)
        message[-len(decoded.properties_bytes) - 2] ^= 0x40
    else:
        name = b"KAFKA_PRODUCER\x01" if damage == "producer" else b"KAFKA_BATCH\x01"
        where = message.find(name)
        if where < 0:
            yield False
            return
        # "0/..." becomes "x/...", anything else "0/...": a bad number, or a batch start where none was
        message[where + len(name)] = ord("0") if damage == "batch start" else ord("x")
    buffer[at : at + size] = message
    try:
        yield True
    finally:
        buffer[at : at + size] = saved


def _outcome(rebuild: object) -> tuple[object, ...]:
    """What a rebuild returned (its bytes and where it ends) or raised (which message, why)."""
    try:
        assert callable(rebuild)
        got = rebuild()
    except rocketmq_batches.CorruptMessageError as exc:
        return ("raised", exc.index, exc.reason)
    return (b"".join(got.batches), got.next_offset, got.missing, got.full)


def test_short_runs_rebuild_message_by_message_as_column_wise(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of at most SMALL_RUN messages is rebuilt in Python (_rebuild_small): for every start, length, budget
    and end, the same batches, next offset and missing count as the column-wise rebuild, full whenever it is (and
    also where it cut the run at the budget before parsing), and the same error for a damaged header or
    KAFKA_BATCH. (Both numpy paths: the compiled one is compared with them below.)"""
    monkeypatch.setattr(rocketmq_batches, "compiled_rebuild", None)
    rng = random.Random(20261128)
    buffer, positions, sizes, _ = filled_run(store, rng, 60)
    end = len(positions)

    def both(start: int, count: int, max_bytes: int, min_one: bool, at_end: bool) -> None:
        def rebuild() -> rocketmq_batches.Rebuilt:
            return rebuild_batches(
                buffer, positions[start : start + count], sizes[start : start + count], start, max_bytes,
                min_one_message=min_one, at_end=at_end,
            )  # fmt: skip

        small = _outcome(rebuild)
        with monkeypatch.context() as patched:
            patched.setattr(rocketmq_batches, "SMALL_RUN", 0)
            column_wise = _outcome(rebuild)
        if small[0] != "raised" and column_wise[0] != "raised" and small[3] and not column_wise[3]:
            # the column-wise rebuild cut the run at the budget before parsing it, so it did not see the batches
            # that do not fit; the caller finds its budget spent and stops either way
            column_wise = (*column_wise[:3], True)
        assert small == column_wise, (start, count, max_bytes, min_one, at_end)

    runs = 0
    for start in [0, 1, *rng.sample(range(end - 1), 60)]:
        for count in (1, 2, 3, rng.randrange(1, rocketmq_batches.SMALL_RUN + 1)):
            count = min(count, end - start)
            for max_bytes in (0, 1, 200, 3000, 1 << 20):
                for min_one in (True, False):
                    for at_end in (True, False):
                        both(start, count, max_bytes, min_one, at_end)
                        runs += 1
    assert runs > 1000

    # damaged: a header field, a KAFKA_BATCH value (bytes of the same length), in a message of a short run; a
    # BORNTIMESTAMP no timestamp delta can say
    for damage in ("total size", "magic", "queue offset", "born timestamp", "batch value", "batch start"):
        for _ in range(15):
            start = rng.randrange(end - 4)
            count = rng.randrange(2, min(rocketmq_batches.SMALL_RUN, end - start) + 1)
            victim = start + rng.randrange(count)
            with damaged(buffer, int(positions[victim]), int(sizes[victim]), damage) as done:
                if done:
                    both(start, count, 1 << 20, True, rng.random() < 0.5)


def test_batches_of_messages_with_long_properties_stay_whole(store: Store) -> None:
    """PROPERTIES longer than the rows the column-wise parse scans (a long key, many headers) put KAFKA_BATCH
    past them: such messages still form their producer's batch, a transactional one keeps its producer, and every
    read equals the record-by-record reference."""
    engine, queue = store
    long_key = b"k" * (rocketmq_batches.PROPERTIES_WIDTH + 100)
    many_headers = [(f"header-{h}", b"v" * 20) for h in range(30)]
    queue.append(build_batch([Record(b"a%d" % i, key=long_key, timestamp_ms=TS) for i in range(20)]))
    queue.append(build_batch([Record(b"b%d" % i, headers=many_headers, timestamp_ms=TS) for i in range(20)]))
    records = [Record(b"c%d" % i, key=long_key + b"%d" % i, timestamp_ms=TS) for i in range(20)]
    queue.append(build_batch(records, producer_id=9, producer_epoch=0, base_sequence=0, is_transactional=True))
    queue.append_marker(9, 0, coordinator_epoch=1, commit=True)
    engine.catch_up()
    whole = queue.read(0, 1 << 20).read_bytes()
    assert [(b.base_offset, b.last_offset) for b in iter_batches(whole)][:3] == [(0, 19), (20, 39), (40, 59)]
    transactional = list(iter_batches(whole))[2]
    assert isinstance(transactional.header, BatchHeader)
    assert (transactional.header.producer_id, transactional.header.is_transactional) == (9, True)
    for start in (0, 5, 19, 20, 45, 59):
        for max_bytes in (1, 20_000, 1 << 20):
            got = queue.read(start, max_bytes).read_bytes()
            assert got == reference_read(engine, queue, start, max_bytes, True), (start, max_bytes)


@pytest.mark.parametrize("rebuild_path", ["compiled"], indirect=True)
def test_the_compiled_rebuild_equals_the_numpy_rebuild(
    store: Store, rebuild_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled rebuild, called directly, against rebuild_batches on the numpy path, over runs of every start,
    length, budget and end: the same bytes, next offset and missing count, full whenever numpy says full (and also
    where numpy cut the run at the budget before parsing it, as the module says). Where numpy raises (a damaged
    header, KAFKA_BATCH or KAFKA_PRODUCER, PROPERTIES whose length disagrees) the compiled rebuild declines (None),
    so the caller's error is numpy's; it declines the runs with base64 keys or headers too, and no others here."""
    compiled = rocketmq_batches.compiled_rebuild
    assert compiled is not None
    monkeypatch.setattr(rocketmq_batches, "compiled_rebuild", None)
    rng = random.Random(20261129)
    buffer, positions, sizes, messages = filled_run(store, rng, 150, plain_share=0.97)
    end = len(positions)
    base64 = {i for i, m in enumerate(messages) if {rm.PROPERTY_KEY64, rm.PROPERTY_HEADERS64} & set(m.properties)}
    counts = {"equal": 0, "declined": 0}

    def both(start: int, count: int, max_bytes: int, min_one: bool, at_end: bool, damaged: bool = False) -> None:
        run = slice(start, start + count)
        view = np.frombuffer(buffer, dtype=np.uint8)
        got = compiled(view, positions[run], sizes[run], start, max_bytes, min_one, at_end)
        want = _outcome(
            lambda: rebuild_batches(
                buffer, positions[run], sizes[run], start, max_bytes, min_one_message=min_one, at_end=at_end
            )
        )
        if not damaged:  # declined exactly where a message of the run has a base64 key or headers
            assert (got is None) == bool(base64 & set(range(start, start + count))), (start, count)
        if got is None:
            counts["declined"] += 1
            return
        assert want[0] != "raised", (start, count, want)
        outcome = (got[0] or b"", *got[1:])
        if outcome[3] and not want[3]:  # numpy cut the run at the budget first and did not see what was left out
            want = (*want[:3], True)
        assert outcome == want, (start, count, max_bytes, min_one, at_end)
        counts["equal"] += 1

    for start in [0, 1, *rng.sample(range(end - 1), 50)]:
        for count in (1, 2, 17, 200, end - start):
            count = min(count, end - start)
            for max_bytes in (-5, 0, 1, 200, 3000, 70_000, 1 << 40):
                for min_one in (True, False):
                    for at_end in (True, False):
                        both(start, count, max_bytes, min_one, at_end)
    assert counts["equal"] > 2000 and counts["declined"] > 0, counts

    # damaged: a header field, a KAFKA_BATCH or KAFKA_PRODUCER value, the PROPERTIES length
    for damage in (
        "total size",
        "magic",
        "queue offset",
        "born timestamp",
        "batch value",
        "batch start",
        "producer",
        "properties length",
    ):
        for _ in range(20):
            start = rng.randrange(end - 4)
            count = rng.randrange(2, min(40, end - start) + 1)
            victim = start + rng.randrange(count)
            with damaged(buffer, int(positions[victim]), int(sizes[victim]), damage) as done:
                if done:
                    both(start, count, 1 << 20, True, rng.random() < 0.5, damaged=True)


@pytest.mark.parametrize("rebuild_path", ["compiled"], indirect=True)
def test_the_compiled_rebuild_reads_foreign_properties_as_numpy(rebuild_path: str) -> None:
    """Messages whose PROPERTIES tidelog did not write (FOREIGN_PIECES), a few a run so that some runs have no
    duplicate names: the compiled rebuild gives the bytes the record-by-record decoder gives, or declines."""
    compiled = rocketmq_batches.compiled_rebuild
    assert compiled is not None
    rng = random.Random(11)
    rebuilt = 0
    for _ in range(300):
        messages = []
        for offset in range(rng.randrange(1, 5)):
            properties = "".join(rng.choice(FOREIGN_PIECES) for _ in range(rng.randrange(0, 4)))
            if properties and rng.random() < 0.2:
                properties = properties[:-1]  # the last entry without its \x02
            messages.append(
                rm.encode_message(
                    topic="t", queue_id=0, body=rng.randbytes(rng.choice([0, 5, 100])), properties=properties,
                    queue_offset=offset, born_timestamp=TS + offset,
                )
            )  # fmt: skip
        sizes = np.array([len(m) for m in messages], dtype=np.int64)
        positions = np.cumsum(sizes) - sizes
        data = np.frombuffer(b"".join(messages), dtype=np.uint8)
        got = compiled(data, positions, sizes, 0, 1 << 30, True, True)
        if got is None:
            continue
        want = rebuild_batches(data, positions, sizes, 0, 1 << 30, per_record=True)
        assert (got[0] or b"") == b"".join(want.batches)
        rebuilt += 1
    assert rebuilt > 100
