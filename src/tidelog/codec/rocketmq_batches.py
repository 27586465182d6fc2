"""CommitLog messages back into Kafka v2 batches, column-wise: the read side of the RocketMQ engine
(storage/rocketmq/message_queue.py), the inverse of rocketmq_message.encode_records.

`rebuild_batches(data, positions, sizes, first_offset, max_bytes, ...)` takes a run of one queue's messages -
`data` holds them (a range of one CommitLog file), `positions` and `sizes` are their ConsumeQueue units made
relative to `data`, and the first has queue offset `first_offset`, the next the one after, and so on - and returns
the Kafka batches they stand for, as `Rebuilt`:

- one batch per producer batch: a message whose KAFKA_BATCH is `i/n` with i = n - 1, or that has no KAFKA_BATCH,
  ends one (a batch's first message says `0/n`, so only first and last messages are parsed). Its records are the
  messages' (offset = QUEUEOFFSET, timestamp = BORNTIMESTAMP, key from KEYS, value = BODY unless
  KAFKA_NULL_VALUE, headers = the user properties in their order: rocketmq_message.message_to_record), encoded as
  `build_batch(records, base_offset=...)` encodes them - uncompressed, CreateTime, offset deltas 0, 1, ...,
  partition leader epoch -1 - byte for byte. A batch whose last message carries Kafka's transactional or control
  bit in its FLAG gets the producer of its KAFKA_PRODUCER property (its base sequence moved by the records left
  out when the read starts inside the batch) and those bits; other batches have no producer.
- whole batches only, as many as fit in `max_bytes`; the first even when it is larger if `min_one_message`;
- messages after the last complete batch (its end not dispatched yet) come back as one more batch when
  `at_end` (nothing follows them in the queue yet) and they are not transactional, as message_queue always did;
  otherwise `Rebuilt.next_offset` says where the batches end and `Rebuilt.missing` how many messages from there
  make up the open batch (from its KAFKA_BATCH), so that the caller reads them all and asks again - unless the
  values read of it already exceed what is left of `max_bytes` (`Rebuilt.full`).
- `data` may hold other bytes between the messages (other queues' messages); only the messages are read, and
  PADDING zero bytes after the last one spare a copy of `data`.

How: where the package was installed with a C compiler, one compiled pass does all of it (_rocketmq_rebuild.c,
`compiled_rebuild`: the parse and the encoding without the GIL, then a `crc32c` call per batch); it declines a run
with anything it does not decode (a damaged message, a base64 key or headers, duplicate names, long PROPERTIES),
which then takes the numpy path below and gets the same bytes or the same CorruptMessageError. Its `full` is that
of the whole run (the numpy path cuts the run at the budget first, _within_budget, and may not see that batches
were left out; a caller whose budget is spent stops either way).

The numpy path: every message header, every property and every record field is found and encoded with numpy
operations over all messages at once; keys and short values are gathered by index, values of ROW_COPY_BYTES or more
copied as rows of fixed widths (_copy); Python runs once per batch for its CRC and, in a transactional batch, its
producer. A batch with a message numpy does not decode - a key or headers stored in base64 (KAFKA_KEY64,
KAFKA_HEADERS64), two properties of one name, PROPERTIES over PROPERTIES_WIDTH bytes - is rebuilt record by record
from rocketmq_message's decoder (`records_batch`), with the same result; the KAFKA_BATCH of PROPERTIES over
PROPERTIES_WIDTH bytes is found in Python (_value_span), as it may lie past the scanned row. A run of at most
SMALL_RUN messages (a tail read, a fetch of many partitions) is rebuilt message by message instead (_rebuild_small:
about 9 µs for one message against 140 µs of numpy's fixed cost, 64 against 150 for 16), with the same results. A
message whose TOTALSIZE disagrees with its unit or the sum of its fields, whose QUEUEOFFSET is not the expected one,
or a batch whose messages do not add up to its KAFKA_BATCH count, raises CorruptMessageError naming the message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from crc32c import crc32c

from tidelog.codec import rocketmq_message as rm
from tidelog.codec.record_batch import (
    CONTROL_MASK,
    HEADER_SIZE,
    NO_SEQUENCE,
    TRANSACTIONAL_MASK,
    Record,
    build_batch,
)

TXN_ATTRIBUTES = TRANSACTIONAL_MASK | CONTROL_MASK  # the Kafka batch attributes a message's FLAG carries
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
TIMESTAMP_DELTA_TOO_LARGE = "its BORNTIMESTAMP is further from its batch's first than a timestamp delta can say"
SEQUENCE_MODULUS = 1 << 31  # a producer's sequence wraps from Integer.MAX_VALUE to 0
ROW_COPY_BYTES = 16  # a value, key or header at least this long is copied as rows (_copy), shorter ones by index
PROPERTIES_WIDTH = 512  # PROPERTIES longer than this send their message the per-record way
PADDING = PROPERTIES_WIDTH  # zero bytes after the last message in `data` save rebuild_batches a copy of it
BATCH_DIGITS = 24  # the longest KAFKA_BATCH value ("<index>/<count>") read
BATCH_NUMBER_DIGITS = 18  # the most digits of either number in it (an int64 holds them)
RECORD_VARINTS = ("length", "timestamp delta", "offset delta", "key length", "value length", "header count")
FEW_BATCHES = 16  # up to this many KAFKA_BATCH values are parsed in Python (_few_batch_positions)
SMALL_RUN = 16  # a run of at most this many messages is rebuilt message by message (_rebuild_small)
MIN_MESSAGE_SIZE = rm.FIXED_SIZE + 3  # header, topic length (v1), properties length
_QUEUE_OFFSET = struct.Struct(">q")
CRC_AT = 17  # where a v2 batch header's CRC sits
ATTRIBUTES_AT = 21  # the CRC covers the batch from its attributes on

# a v2 batch header, as numpy writes it for many batches at once (record_batch.HEADER)
BATCH_HEADER = np.dtype(
    [
        ("base_offset", ">i8"), ("length", ">i4"), ("partition_leader_epoch", ">i4"), ("magic", "i1"),
        ("crc", ">u4"), ("attributes", ">i2"), ("last_offset_delta", ">i4"), ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"), ("producer_id", ">i8"), ("producer_epoch", ">i2"), ("base_sequence", ">i4"),
        ("records_count", ">i4"),
    ]
)  # fmt: skip
assert BATCH_HEADER.itemsize == HEADER_SIZE

_NAMES = sorted(name.encode() for name in rm.RESERVED_PROPERTIES)
_CODE_KEYS = _NAMES.index(rm.PROPERTY_KEYS.encode())
_CODE_KEY64 = _NAMES.index(rm.PROPERTY_KEY64.encode())
_CODE_HEADERS64 = _NAMES.index(rm.PROPERTY_HEADERS64.encode())
_CODE_NULL_VALUE = _NAMES.index(rm.PROPERTY_NULL_VALUE.encode())
_CODE_BATCH = _NAMES.index(rm.PROPERTY_BATCH.encode())
_CODE_PRODUCER = _NAMES.index(rm.PROPERTY_PRODUCER.encode())
_USER = -1  # the code of a name that is not reserved: a Kafka header
_READ = (_CODE_KEYS, _CODE_NULL_VALUE, _CODE_BATCH, _CODE_PRODUCER)  # the reserved properties a rebuild reads
_BATCH_COLUMN = _READ.index(_CODE_BATCH)
_BATCH_NAME = rm.PROPERTY_BATCH.encode()
_READ_COLUMN = np.full(len(_NAMES) + 1, -1)  # by code (_USER: the last): its column in _READ, or -1
_READ_COLUMN[list(_READ)] = np.arange(len(_READ))
_GOLDEN, _MIX = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)  # odd multipliers of _slot
TABLE_BITS = 10  # the reserved-name table has 2**TABLE_BITS slots
_POWERS_OF_TEN = 10 ** np.arange(BATCH_NUMBER_DIGITS + 1, dtype=np.int64)
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)

# _rocketmq_rebuild.rebuild(data, positions, sizes, first_offset, max_bytes, min_one_message, at_end): None (the
# run is the numpy path's), or (the batches back to back or None, next offset, missing, full)
CompiledRebuild = Callable[
    [np.ndarray, np.ndarray, np.ndarray, int, int, bool, bool], tuple[bytes | None, int, int, bool] | None
]
compiled_rebuild: CompiledRebuild | None
try:
    from tidelog.codec import _rocketmq_rebuild
except ImportError:  # installed without a C compiler: the numpy rebuild alone
    compiled_rebuild = None
else:
    # each reserved name's role in the compiled pass (enum ROLE_* there): 0 not read, 1-4 the _READ properties
    # in their order, 5 one it leaves to numpy (base64 key or headers)
    _ROLES = {rm.PROPERTY_KEY64.encode(): 5, rm.PROPERTY_HEADERS64.encode(): 5}
    _ROLES.update({_NAMES[code]: role for role, code in enumerate(_READ, start=1)})
    _rocketmq_rebuild.configure(tuple(_NAMES), tuple(_ROLES.get(name, 0) for name in _NAMES), crc32c, PROPERTIES_WIDTH)
    compiled_rebuild = _rocketmq_rebuild.rebuild


class CorruptMessageError(ValueError):
    """A message that is not what its ConsumeQueue unit says (`index`: which of the run)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


class Rebuilt(NamedTuple):
    """What rebuild_batches made: `batches` in offset order (each one or more whole Kafka batches, as bytes or a
    view of a buffer of their own), the queue
    offset after the last record they hold (`next_offset`), how many messages from there the open batch takes
    (`missing`; 0: the run ended on a batch end, or its open batch was handed out, or not reached), and whether
    `max_bytes` left batches out (`full`)."""

    batches: list[bytes | memoryview]
    next_offset: int
    missing: int
    full: bool


def producer_value(text: str, index: int) -> rm.ProducerInfo:
    """The KAFKA_PRODUCER value `text` of message `index` of a run, each number within its batch header field."""
    try:
        info = rm.parse_producer_info(text)
    except ValueError:
        info = None
    if info is None or not (
        INT64_MIN <= info.producer_id <= INT64_MAX
        and -(1 << 15) <= info.epoch < 1 << 15
        and -(1 << 31) <= info.base_sequence < 1 << 31
    ):
        raise CorruptMessageError(
            index, f"its KAFKA_PRODUCER property {text!r} is not <producer id>/<epoch>/<base sequence>/<count>"
        )
    return info


def records_batch(records: Sequence[Record], last: rm.Message, index: int = 0) -> bytes:
    """The batch of `records` (a producer batch, or its part from some record on) whose last message is `last`
    (message `index` of its run, for the errors a damaged KAFKA_PRODUCER or BORNTIMESTAMP raises), record by
    record: a transactional or control batch (its bits in `last`'s FLAG) gets its producer from KAFKA_PRODUCER;
    other batches are rebuilt without a producer."""
    born = [record.timestamp_ms or 0 for record in records]  # a message's record always has one (BORNTIMESTAMP)
    if min(born) - born[0] < INT64_MIN or max(born) - born[0] > INT64_MAX:
        wrong = next(k for k, t in enumerate(born) if not INT64_MIN <= t - born[0] <= INT64_MAX)
        raise CorruptMessageError(index - len(records) + 1 + wrong, TIMESTAMP_DELTA_TOO_LARGE)
    attributes = last.flag & TXN_ATTRIBUTES
    text = rm.property_value(last.properties_bytes, rm.PROPERTY_PRODUCER) if attributes else None
    info = producer_value(text, index) if text else None  # Java drops an empty value
    if info is None:
        return build_batch(records, base_offset=records[0].offset)
    sequence = info.base_sequence
    if sequence != NO_SEQUENCE:  # a read from inside the batch: the sequence of its first record read
        sequence = (sequence + records[0].offset - (last.queue_offset - info.count + 1)) % SEQUENCE_MODULUS
    return build_batch(
        records,
        base_offset=records[0].offset,
        producer_id=info.producer_id,
        producer_epoch=info.epoch,
        base_sequence=sequence,
        is_transactional=bool(attributes & TRANSACTIONAL_MASK),
        is_control=bool(attributes & CONTROL_MASK),
    )


# --- small numpy helpers -------------------------------------------------------------------------------------


def _windows(data: np.ndarray, width: int) -> np.ndarray:
    """Every `width` bytes of `data` from each position on, as one item each (a view: items overlap). Items of a
    void type of that width, so that numpy copies a row as one block rather than byte by byte."""
    return np.ndarray(shape=(len(data) - width + 1,), dtype=np.dtype((np.void, width)), buffer=data, strides=(1,))


def _rows(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes at each position `at` of `data`, as rows (every row must lie inside `data`)."""
    return _windows(data, width)[at].view(np.uint8).reshape(len(at), width)


def _ints(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The big-endian signed integers of `width` bytes at positions `at` of `data`, as int64."""
    return _rows(data, at, width).view(f">i{width}")[:, 0].astype(np.int64)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions start, start + 1, ..., start + length - 1 of every range, one after the other."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)


def _zigzag(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.int64)
    return ((values << 1) ^ (values >> 63)).astype(np.uint64)


def _varint_sizes(zigzagged: np.ndarray) -> np.ndarray:
    return np.searchsorted(_VARINT_LIMITS, zigzagged, side="right").astype(np.int64) + 1


def _put_varints(out: np.ndarray, at: np.ndarray, zigzagged: np.ndarray, sizes: np.ndarray) -> None:
    """Write each value as a varint of its size at its position (one numpy pass per byte of the longest)."""
    if len(at) == 0:
        return
    continues = np.uint64(0x80)
    for k in range(int(sizes.max())):
        if k:  # every varint has a first byte; the later ones only some
            chosen = np.flatnonzero(sizes > k)
            at, zigzagged, sizes = at[chosen], zigzagged[chosen], sizes[chosen]
        part = (zigzagged >> np.uint64(7 * k)) & np.uint64(0x7F)
        part |= (sizes > k + 1) * continues
        out[at + k] = part


def _copy(out: np.ndarray, out_at: np.ndarray, source: np.ndarray, source_at: np.ndarray, lengths: np.ndarray) -> None:
    """out[out_at[i] : out_at[i] + lengths[i]] = source[source_at[i] : ...] for every i, with no Python per range.
    Ranges under ROW_COPY_BYTES are copied together by index (a position per byte); the longer ones as rows of a
    fixed width, one numpy row copy for all ranges whose length has the same highest bit: a range of length n,
    with 2**k <= n < 2**(k+1), is its first 2**k bytes and its last 2**k bytes (two rows that overlap in the
    middle, writing the same bytes twice; one row when n is 2**k), so no row reaches outside its range."""
    long = lengths >= ROW_COPY_BYTES
    short = np.flatnonzero((lengths > 0) & ~long)
    if len(short):
        at, origin, length = out_at[short], source_at[short], lengths[short]
        out[_ranges(at, length)] = source.take(_ranges(origin, length))
    long_ones = np.flatnonzero(long)
    if not len(long_ones):
        return
    out_at, source_at, lengths = out_at[long_ones], source_at[long_ones], lengths[long_ones]
    high_bit = np.frexp(lengths)[1] - 1  # k with 2**k <= n < 2**(k+1)
    classes = np.flatnonzero(np.bincount(high_bit)).tolist()
    for k in classes:
        width = 1 << k
        if len(classes) == 1:
            at, origin, length = out_at, source_at, lengths
        else:
            chosen = np.flatnonzero(high_bit == k)
            at, origin, length = out_at[chosen], source_at[chosen], lengths[chosen]
        tail = np.flatnonzero(length > width)
        if len(tail):
            shift = length[tail] - width
            at, origin = np.concatenate([at, at[tail] + shift]), np.concatenate([origin, origin[tail] + shift])
        _windows(out, width)[at] = _windows(source, width)[origin]


def _batch_positions(text: np.ndarray, at: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, ...]:
    """KAFKA_BATCH values `index/count` at `at` of `text` as (index, count, ok); ok is False for a value that is not
    two decimal numbers of at most BATCH_NUMBER_DIGITS digits with index < count. All values at once: each digit
    times the power of ten its place gives it, summed on either side of the slash."""
    rows = _rows(text, at, BATCH_DIGITS).astype(np.int64)
    column = np.arange(BATCH_DIGITS)
    inside = column < length[:, None]
    slash = inside & (rows == ord("/"))
    slash_at = np.argmax(slash, axis=1)
    digit = rows - ord("0")
    is_digit = (digit >= 0) & (digit <= 9)
    index_digits, count_digits = slash_at, length - slash_at - 1
    ok = (length <= BATCH_DIGITS) & (slash.sum(axis=1) == 1) & ((is_digit | slash) | ~inside).all(axis=1)
    ok &= (index_digits > 0) & (index_digits <= BATCH_NUMBER_DIGITS)
    ok &= (count_digits > 0) & (count_digits <= BATCH_NUMBER_DIGITS)
    place = np.where(column < slash_at[:, None], slash_at[:, None], length[:, None]) - 1 - column
    worth = np.where(inside & is_digit & ok[:, None], _POWERS_OF_TEN[np.clip(place, 0, BATCH_NUMBER_DIGITS)], 0)
    before_slash = column < slash_at[:, None]
    index = (digit * np.where(before_slash, worth, 0)).sum(axis=1)
    count = (digit * np.where(before_slash, 0, worth)).sum(axis=1)
    ok &= index < count
    return index, count, ok


def _batch_value(value: bytes) -> tuple[int, int] | None:
    """One KAFKA_BATCH value as (index, count), None unless it is two decimal numbers of at most
    BATCH_NUMBER_DIGITS digits with index < count (what _batch_positions accepts)."""
    before, slash, after = value.partition(b"/")
    if not (
        len(value) <= BATCH_DIGITS
        and slash
        and 0 < len(before) <= BATCH_NUMBER_DIGITS
        and 0 < len(after) <= BATCH_NUMBER_DIGITS
        and before.isdigit()
        and after.isdigit()
    ):
        return None
    index, count = int(before), int(after)
    return (index, count) if index < count else None


def _few_batch_positions(text: np.ndarray, at: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, ...]:
    """_batch_positions for up to FEW_BATCHES values, in Python: numpy's fixed cost per operation exceeds the
    parse of a few short strings. The same results for every input."""
    index, count = np.zeros(len(at), dtype=np.int64), np.zeros(len(at), dtype=np.int64)
    ok = np.zeros(len(at), dtype=bool)
    view = memoryview(text)  # type: ignore[arg-type]
    for row, (start, size) in enumerate(zip(at.tolist(), length.tolist(), strict=True)):
        parsed = _batch_value(bytes(view[start : start + size]))
        if parsed is not None:
            index[row], count[row] = parsed
            ok[row] = True
    return index, count, ok


def _batch_ends(data: np.ndarray, at: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which messages end their Kafka batch, from their KAFKA_BATCH values (`index/count`; none: a batch of one),
    and how many messages of its batch follow each (only the last message's is filled in). A batch's first message
    says `0/<count>` and the others follow it in order, so only the first message of each batch and the run's last
    message are parsed; a batch whose messages do not add up to its count raises CorruptMessageError."""
    n = len(at)
    has = length > 0
    prefix = _rows(data, np.maximum(at, 0), 2)
    starts = ~has | ((prefix[:, 0] == ord("0")) & (prefix[:, 1] == ord("/")))
    starts[0] = True  # a read may begin inside a batch
    ends = np.ones(n, dtype=bool)
    ends[:-1] = ~has[:-1] | starts[1:]
    batch_left = np.zeros(n, dtype=np.int64)
    first = np.flatnonzero(starts)
    first = first[has[first]]  # the batches that say their count
    checked = np.append(first, n - 1) if has[-1] and (not len(first) or first[-1] != n - 1) else first
    if not len(checked):
        return ends, batch_left
    parse = _few_batch_positions if len(checked) <= FEW_BATCHES else _batch_positions
    index, count, ok = parse(data, at[checked], length[checked])
    if not ok.all():
        bad = int(checked[np.flatnonzero(~ok)[0]])
        raise CorruptMessageError(bad, "its KAFKA_BATCH property is not <index>/<count>")
    if has[-1]:
        ends[-1] = index[-1] == count[-1] - 1
        batch_left[-1] = count[-1] - 1 - index[-1]
    # each counted batch holds count - index messages from its first; the open one up to the last message's index
    at_first = np.searchsorted(checked, first)
    end_positions = np.flatnonzero(ends)
    following = np.searchsorted(end_positions, first)
    closed = following < len(end_positions)
    last = end_positions[np.minimum(following, len(end_positions) - 1)] if len(end_positions) else first
    size = np.where(closed, last, n - 1) + 1 - first
    expected = np.where(closed, count[at_first] - index[at_first], index[-1] - index[at_first] + 1)
    wrong = np.flatnonzero(size != expected)
    if len(wrong):
        bad = int(wrong[0])
        raise CorruptMessageError(
            int(first[bad]),
            f"its batch ({int(index[at_first[bad]])}/{int(count[at_first[bad]])} on) holds {int(size[bad])} "
            f"messages, not {int(expected[bad])}",
        )
    return ends, batch_left


_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _name_words(text: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A name's first 8 bytes and its next 8, as little-endian words with the bytes past its end zeroed; with the
    length they tell names of up to 16 bytes apart exactly."""
    words = _rows(text, start, 16).view("<u8")
    first = words[:, 0] & _LOW_BYTES[np.minimum(length, 8)]
    second = words[:, 1] & _LOW_BYTES[np.clip(length - 8, 0, 8)]
    return first, second


def _slot(first: np.ndarray, length: np.ndarray) -> np.ndarray:
    """A name's place in the reserved-name table, from its first word and length (multiplicative hashing)."""
    with np.errstate(over="ignore"):
        return ((first ^ (length.astype(np.uint64) * _MIX)) * _GOLDEN) >> np.uint64(64 - TABLE_BITS)


def _reserved_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The reserved names by slot: code (index in _NAMES; -1 for an empty slot), first word, second word, length."""
    text = np.frombuffer(b"".join(_NAMES) + bytes(16), dtype=np.uint8)
    lengths = np.array([len(name) for name in _NAMES])
    first, second = _name_words(text, np.cumsum(lengths) - lengths, lengths)
    slots = _slot(first, lengths)
    if len(np.unique(slots)) != len(slots):
        raise AssertionError("two reserved property names share a slot of the table")
    codes = np.full(1 << TABLE_BITS, _USER, dtype=np.int64)
    codes[slots] = np.arange(len(_NAMES))
    firsts, seconds = np.zeros(1 << TABLE_BITS, dtype=np.uint64), np.zeros(1 << TABLE_BITS, dtype=np.uint64)
    firsts[slots], seconds[slots] = first, second
    table_lengths = np.full(1 << TABLE_BITS, -1, dtype=np.int64)
    table_lengths[slots] = lengths
    return codes, firsts, seconds, table_lengths


_TABLE_CODES, _TABLE_FIRST, _TABLE_SECOND, _TABLE_LENGTH = _reserved_table()


def _classify(text: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The code of each name (its index in _NAMES, or _USER), and its (first word, second word, length). A name is
    reserved when its slot's name has the same words and length; one of more than 16 bytes is then compared byte
    for byte."""
    first, second = _name_words(text, start, length)
    slot = _slot(first, length)
    found = (_TABLE_FIRST[slot] == first) & (_TABLE_LENGTH[slot] == length) & (_TABLE_SECOND[slot] == second)
    codes = np.where(found, _TABLE_CODES[slot], _USER)
    for entry in np.flatnonzero(found & (length > 16)).tolist():
        name = text[start[entry] : start[entry] + length[entry]].tobytes()
        if name != _NAMES[codes[entry]]:
            codes[entry] = _USER
    return codes, (first, second, length)


# --- the rebuild ---------------------------------------------------------------------------------------------


def _value_span(properties: bytes, name: bytes) -> tuple[int, int] | None:
    """Where the value of `name` is in `properties` as rocketmq_message.string_to_properties reads them (entries
    split on \x02, each on its first \x01, a non-empty name and value; the last entry of a name wins): (start,
    length), or None. For PROPERTIES longer than the rows _parse scans (PROPERTIES_WIDTH)."""
    span = None
    start = 0
    for item in properties.split(b"\x02"):
        separator = item.find(b"\x01")
        if 0 < separator < len(item) - 1 and item[:separator] == name:
            span = (start + separator + 1, len(item) - separator - 1)
        start += len(item) + 1
    return span


class _Messages(NamedTuple):
    """The columns of a run of messages that the batches need; keys, values and headers as (position in `data`,
    length)."""

    data: np.ndarray  # the CommitLog bytes the messages are in
    queue_offset: np.ndarray
    flag: np.ndarray
    born: np.ndarray
    body_at: np.ndarray
    body_length: np.ndarray
    key_at: np.ndarray  # into data (as every *_at); key_length -1: no key
    key_length: np.ndarray
    null_value: np.ndarray
    ends_batch: np.ndarray
    batch_left: np.ndarray  # messages of its batch after this one (from KAFKA_BATCH; known for the last message)
    producer_at: np.ndarray  # the KAFKA_PRODUCER value (-1: none)
    producer_length: np.ndarray
    header_message: np.ndarray  # per header (user property), in message order: its message
    header_name_at: np.ndarray
    header_name_length: np.ndarray
    header_value_at: np.ndarray
    header_value_length: np.ndarray
    columnar: np.ndarray  # False: its batch is rebuilt record by record


def _parse(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, first_offset: int) -> _Messages:
    n = len(positions)
    ends = positions + sizes
    if (sizes < MIN_MESSAGE_SIZE).any():
        bad = int(np.flatnonzero(sizes < MIN_MESSAGE_SIZE)[0])
        raise CorruptMessageError(bad, f"its unit's size {int(sizes[bad])} is below a message's minimum")
    if (ends > len(data)).any():
        bad = int(np.flatnonzero(ends > len(data))[0])
        raise CorruptMessageError(bad, "its unit points past the written end of the CommitLog")
    head = _rows(data, positions, rm.FIXED_SIZE).view(rm.MESSAGE_HEADER)[:, 0]
    queue_offset = head["queue_offset"].astype(np.int64)
    magic = head["magic"]
    for wrong, reason in (
        (head["total_size"] != sizes, "its TOTALSIZE disagrees with its ConsumeQueue unit"),
        ((magic != rm.MAGIC_V1) & (magic != rm.MAGIC_V2), "it has no message magic code"),
        (queue_offset != first_offset + np.arange(n), "its QUEUEOFFSET is not the unit's"),
    ):
        if wrong.any():
            bad = int(np.flatnonzero(wrong)[0])
            raise CorruptMessageError(bad, f"{reason} (QUEUEOFFSET {int(queue_offset[bad])})")
    sys_flag = head["sys_flag"]
    body_at = positions + rm.FIXED_SIZE
    body_length = head["body_length"].astype(np.int64)
    ipv6 = np.flatnonzero(sys_flag & (rm.SYSFLAG_BORNHOST_V6 | rm.SYSFLAG_STOREHOST_V6))
    if len(ipv6):  # an IPv6 born or store host takes 20 bytes instead of 8: every field after it moves
        flags = sys_flag[ipv6]
        body_at[ipv6] += 12 * ((flags & rm.SYSFLAG_BORNHOST_V6) != 0) + 12 * ((flags & rm.SYSFLAG_STOREHOST_V6) != 0)
        if (body_at[ipv6] + 3 > ends[ipv6]).any():
            bad = int(ipv6[np.flatnonzero(body_at[ipv6] + 3 > ends[ipv6])[0]])
            raise CorruptMessageError(bad, "its header does not fit in its TOTALSIZE")
        body_length[ipv6] = _ints(data, body_at[ipv6] - 4, 4)
    body_end = body_at + body_length
    v2 = magic == rm.MAGIC_V2
    topic_field = np.where(v2, 2, 1)
    fits = (body_length >= 0) & (body_end + topic_field + 2 <= ends)
    if not fits.all():
        bad = int(np.flatnonzero(~fits)[0])
        raise CorruptMessageError(bad, f"its body of {int(body_length[bad])} bytes does not fit")
    topic_length = data[body_end].astype(np.int64)
    if v2.any():
        topic_length[v2] = _ints(data, body_end[v2], 2)
    properties_length_at = body_end + topic_field + topic_length
    fits = (topic_length >= 0) & (properties_length_at + 2 <= ends)
    if not fits.all():
        bad = int(np.flatnonzero(~fits)[0])
        raise CorruptMessageError(bad, f"its topic of {int(topic_length[bad])} bytes does not fit")
    properties_at = properties_length_at + 2
    properties_length = ends - properties_at
    if (_ints(data, properties_length_at, 2) != properties_length).any():
        bad = int(np.flatnonzero(_ints(data, properties_length_at, 2) != properties_length)[0])
        raise CorruptMessageError(bad, "its TOTALSIZE disagrees with the sum of its fields")
    columnar = properties_length <= PROPERTIES_WIDTH
    width = int(min(max(properties_length.max(), 1), PROPERTIES_WIDTH))
    room = max(width, BATCH_DIGITS)  # the rows below read this far past a message's properties
    if len(data) < int(ends.max()) + room:
        data = np.concatenate([data, np.zeros(room, dtype=np.uint8)])

    # entries: PROPERTIES split on \x02 (the end a separator too), each name and value on its first \x01; found in
    # one row of `width` bytes per message (longer PROPERTIES: the per-record path), as positions in `data`. Both
    # separators in one stream, in message and column order: an entry is what ends at a \x02, its split the first
    # \x01 after the separator before it.
    rows = _rows(data, properties_at, width)
    length_of_row = np.minimum(properties_length, width)
    found = np.flatnonzero(rows - np.uint8(1) < 2)  # \x01 and \x02 (0 wraps round to 255)
    sep_message = found // width
    sep_column = found - sep_message * width
    inside = sep_column < length_of_row[sep_message]
    sep_message, sep_column = sep_message[inside], sep_column[inside]
    is_end = rows.reshape(-1)[found[inside]] == 2
    unterminated = np.flatnonzero((length_of_row > 0) & (rows[np.arange(n), np.maximum(length_of_row - 1, 0)] != 2))
    if len(unterminated):  # PROPERTIES without a closing \x02: its last entry ends with the message
        sep_message = np.concatenate([sep_message, unterminated])
        sep_column = np.concatenate([sep_column, length_of_row[unterminated]])
        is_end = np.concatenate([is_end, np.ones(len(unterminated), dtype=bool)])
        order = np.lexsort((sep_column, sep_message))
        sep_message, sep_column, is_end = sep_message[order], sep_column[order], is_end[order]
    ends = np.flatnonzero(is_end)
    entry_message, entry_column = sep_message[ends], sep_column[ends]
    first_of_message = np.ones(len(entry_message), dtype=bool)
    first_of_message[1:] = entry_message[1:] != entry_message[:-1]
    start_column = np.where(first_of_message, 0, np.concatenate([[0], entry_column[:-1] + 1]))
    opens = np.ones(len(is_end), dtype=bool)  # a separator that follows an entry's end (every message's last is)
    opens[1:] = is_end[:-1]
    first_split = np.flatnonzero(opens & ~is_end)
    split = np.full(len(ends), -1, dtype=np.int64)
    split[(np.cumsum(is_end) - is_end)[first_split]] = sep_column[first_split]  # an entry: the \x02s before it
    valid = (split > start_column) & (split < entry_column - 1)
    entry_message, start_column, entry_column, split = (
        a[valid] for a in (entry_message, start_column, entry_column, split)
    )
    entry_start = properties_at[entry_message] + start_column
    name_length = split - start_column
    value_at, value_length = entry_start + name_length + 1, entry_column - split - 1

    code, name_key = _classify(data, entry_start, name_length)
    # two entries of one name: Java's map keeps the last value at the first place; leave such messages to it
    # the reserved properties the batches read (_READ), as a column each: where a message's value is (-1: none)
    column = _READ_COLUMN[code]
    read = np.flatnonzero(column >= 0)
    cell = entry_message[read] * len(_READ) + column[read]
    read_at, read_length = np.full((2, n * len(_READ)), -1, dtype=np.int64)
    read_at[cell], read_length[cell] = value_at[read], value_length[read]
    columnar[entry_message[read[read_at[cell] != value_at[read]]]] = False  # a cell written twice: two entries
    read_at, read_length = read_at.reshape(n, len(_READ)), read_length.reshape(n, len(_READ))
    for long in np.flatnonzero(properties_length > PROPERTIES_WIDTH).tolist():  # the rows saw only their start
        at = int(properties_at[long])
        span = _value_span(data[at : at + int(properties_length[long])].tobytes(), _BATCH_NAME)
        read_at[long, _BATCH_COLUMN], read_length[long, _BATCH_COLUMN] = (at + span[0], span[1]) if span else (-1, -1)
    user_entries = np.flatnonzero(code == _USER)
    if len(user_entries) > 1:
        keys = [entry_message[user_entries], *(part[user_entries] for part in name_key)]
        order = np.lexsort(keys[::-1])
        ordered = [k[order] for k in keys]
        same = np.logical_and.reduce([k[1:] == k[:-1] for k in ordered])
        columnar[ordered[0][1:][same]] = False
    for special in (_CODE_KEY64, _CODE_HEADERS64):
        columnar[entry_message[code == special]] = False

    key_at, _, batch_at, producer_at = read_at.T
    key_length, null_length, batch_length, producer_length = read_length.T
    ends_batch, batch_left = _batch_ends(data, batch_at, batch_length)

    user = code == _USER
    return _Messages(
        data=data,
        queue_offset=queue_offset,
        flag=head["flag"].astype(np.int64),
        born=head["born_timestamp"].astype(np.int64),
        body_at=body_at,
        body_length=body_length,
        key_at=key_at,
        key_length=key_length,
        null_value=null_length >= 0,
        ends_batch=ends_batch,
        batch_left=batch_left,
        producer_at=producer_at,
        producer_length=producer_length,
        header_message=entry_message[user],
        header_name_at=entry_start[user],
        header_name_length=name_length[user],
        header_value_at=value_at[user],
        header_value_length=value_length[user],
        columnar=columnar,
    )


class _Records(NamedTuple):
    """The records of the messages in whole batches (the first `records` messages of the run): the varints each
    record starts with (RECORD_VARINTS: zigzagged, as they are written, and their sizes; a row per field), each
    record's size; and their headers (name and value length: zigzagged and sizes, a row each)."""

    records: int
    zigzag: np.ndarray  # RECORD_VARINTS x records
    varint_size: np.ndarray
    record_size: np.ndarray
    header_message: np.ndarray
    header_name_at: np.ndarray
    header_name_length: np.ndarray
    header_value_at: np.ndarray
    header_value_length: np.ndarray
    header_zigzag: np.ndarray  # 2 x headers: name length, value length
    header_varint_size: np.ndarray


def _records(messages: _Messages, group_start: np.ndarray, group_end: np.ndarray) -> _Records:
    count = int(group_end[-1])
    group_of = np.repeat(np.arange(len(group_end)), group_end - group_start)
    first_of = group_start[group_of]
    key_length = messages.key_length[:count]
    value_length = np.where(messages.null_value[:count], -1, messages.body_length[:count])
    rows = messages.header_message < count
    header_message = messages.header_message[rows]
    name_length = messages.header_name_length[rows]
    value_of_header = messages.header_value_length[rows]
    header_zigzag = _zigzag(np.stack([name_length, value_of_header]))
    header_varint_size = _varint_sizes(header_zigzag)
    header_bytes = header_varint_size.sum(axis=0) + name_length + value_of_header
    headers_size = np.bincount(header_message, weights=header_bytes, minlength=count).astype(np.int64)
    born, base = messages.born[:count], messages.born[first_of]
    timestamp_delta = born - base  # int64, wrapping round where it does not fit (a damaged BORNTIMESTAMP)
    wrapped = np.flatnonzero(((born ^ base) & (born ^ timestamp_delta)) < 0)
    if len(wrapped):
        raise CorruptMessageError(int(wrapped[0]), TIMESTAMP_DELTA_TOO_LARGE)
    zigzag = np.empty((len(RECORD_VARINTS), count), dtype=np.uint64)
    zigzag[1:] = _zigzag(
        np.stack(
            [
                timestamp_delta,
                np.arange(count) - first_of,  # offset delta
                key_length,
                value_length,
                np.bincount(header_message, minlength=count),  # header count
            ]
        )
    )
    varint_size = np.empty((len(RECORD_VARINTS), count), dtype=np.int64)
    varint_size[1:] = _varint_sizes(zigzag[1:])
    body = 1 + varint_size[1:].sum(axis=0) + np.maximum(key_length, 0) + np.maximum(value_length, 0) + headers_size
    zigzag[0] = _zigzag(body)
    varint_size[0] = _varint_sizes(zigzag[0])
    return _Records(
        count,
        zigzag,
        varint_size,
        varint_size[0] + body,
        header_message,
        messages.header_name_at[rows],
        name_length,
        messages.header_value_at[rows],
        value_of_header,
        header_zigzag,
        header_varint_size,
    )


def rebuild_batches(
    data: bytes | bytearray | memoryview | np.ndarray,
    positions: np.ndarray,
    sizes: np.ndarray,
    first_offset: int,
    max_bytes: int,
    *,
    min_one_message: bool = True,
    at_end: bool = True,
    per_record: bool = False,
) -> Rebuilt:
    """The Kafka batches of the messages at `positions` of `data` (see the module docstring); `per_record`: every
    batch the record-by-record way (what a benchmark compares the column-wise rebuild with)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if len(positions) == 0:
        return Rebuilt([], first_offset, 0, False)
    if compiled_rebuild is not None and not per_record:
        done = compiled_rebuild(
            buf, np.ascontiguousarray(positions, dtype=np.int64), np.ascontiguousarray(sizes, dtype=np.int64),
            first_offset, max_bytes, min_one_message, at_end,
        )  # fmt: skip
        if done is not None:
            batches, next_offset, missing, full = done
            return Rebuilt([] if batches is None else [batches], next_offset, missing, full)
    if len(positions) <= SMALL_RUN and not per_record:
        return _rebuild_small(buf, positions.tolist(), sizes.tolist(), first_offset, max_bytes, min_one_message, at_end)
    positions = positions.astype(np.int64)
    sizes = sizes.astype(np.int64)
    keep = _within_budget(buf, positions, sizes, max_bytes, min_one_message)
    if keep < len(positions):
        rebuilt = _rebuild(
            buf, positions[:keep], sizes[:keep], first_offset, max_bytes, min_one_message, False, per_record
        )
        if rebuilt.batches or rebuilt.full or not min_one_message:
            return rebuilt
        # the first batch is longer than its KAFKA_BATCH said (a damaged property): the whole run, as given
    return _rebuild(buf, positions, sizes, first_offset, max_bytes, min_one_message, at_end, per_record)


def _rebuild_small(
    data: np.ndarray,
    positions: list[int],
    sizes: list[int],
    first_offset: int,
    max_bytes: int,
    min_one_message: bool,
    at_end: bool,
) -> Rebuilt:
    """rebuild_batches for a run of at most SMALL_RUN messages, message by message in Python: the same checks in
    the same order (so the same CorruptMessageError for a damaged header or KAFKA_BATCH), the same batches (each
    one records_batch, which the column-wise rebuild equals byte for byte), next offset and missing count. `full`
    is also True where the column-wise rebuild, having cut the run at the budget before parsing it
    (_within_budget), did not see the batches left out; a caller whose budget is spent stops either way. A tail
    read or a fetch of many partitions reads a few messages a partition, where numpy's fixed cost per operation
    (about 140 µs a rebuild) outweighs the 4-5 µs a message this path costs."""
    n = len(positions)
    for index, size in enumerate(sizes):
        if size < MIN_MESSAGE_SIZE:
            raise CorruptMessageError(index, f"its unit's size {size} is below a message's minimum")
    for index, (at, size) in enumerate(zip(positions, sizes, strict=True)):
        if at + size > len(data):
            raise CorruptMessageError(index, "its unit points past the written end of the CommitLog")
    view = memoryview(data)  # type: ignore[arg-type]
    heads = [(*rm.BLANK.unpack_from(view, at), *_QUEUE_OFFSET.unpack_from(view, at + rm.QUEUE_OFFSET_POSITION))
             for at in positions]  # fmt: skip
    for wrong, reason in (
        (lambda i: heads[i][0] != sizes[i], "its TOTALSIZE disagrees with its ConsumeQueue unit"),
        (lambda i: heads[i][1] not in (rm.MAGIC_V1, rm.MAGIC_V2), "it has no message magic code"),
        (lambda i: heads[i][2] != first_offset + i, "its QUEUEOFFSET is not the unit's"),
    ):
        for index in range(n):
            if wrong(index):
                raise CorruptMessageError(index, f"{reason} (QUEUEOFFSET {heads[index][2]})")
    messages: list[rm.Message] = []
    for index, (at, size) in enumerate(zip(positions, sizes, strict=True)):
        try:
            message = rm.decode_message(bytes(view[at : at + size]), 0, check_crc=False)
        except rm.InvalidMessage as exc:
            raise CorruptMessageError(index, str(exc)) from None
        assert isinstance(message, rm.Message)  # the magic was checked above
        messages.append(message)

    # batches, as _batch_ends finds them: a message without KAFKA_BATCH, or followed by one that says 0/<count>
    # (or by nothing, when its own value says it is its batch's last), ends one
    values = [m.properties.get(rm.PROPERTY_BATCH, "").encode("utf-8", "surrogateescape") for m in messages]
    starts = [index == 0 or not value or value[:2] == b"0/" for index, value in enumerate(values)]
    ends = [not values[index] or starts[index + 1] for index in range(n - 1)] + [True]
    firsts = [index for index in range(n) if starts[index] and values[index]]
    checked = {index: _batch_value(values[index]) for index in [*firsts, n - 1] if values[index]}
    for index in sorted(checked):
        if checked[index] is None:
            raise CorruptMessageError(index, "its KAFKA_BATCH property is not <index>/<count>")
    batch_left = 0
    if values[-1]:
        last_index, last_count = checked[n - 1] or (0, 0)
        ends[-1] = last_index == last_count - 1
        batch_left = last_count - 1 - last_index
    for first in firsts:
        first_index, first_count = checked[first] or (0, 0)
        end = next((index for index in range(first, n) if ends[index]), None)
        size, expected = (
            (n - first, (checked[n - 1] or (0, 0))[0] - first_index + 1)
            if end is None
            else (end + 1 - first, first_count - first_index)
        )
        if size != expected:
            raise CorruptMessageError(
                first, f"its batch ({first_index}/{first_count} on) holds {size} messages, not {expected}"
            )

    group_end = [index + 1 for index in range(n) if ends[index]]
    missing = 0
    open_at_least = 0
    if not ends[-1]:
        if at_end and not messages[-1].flag & TXN_ATTRIBUTES:
            group_end.append(n)  # handed out as far as it is dispatched
        else:
            open_from = group_end[-1] if group_end else 0
            missing = n - open_from + batch_left
            open_at_least = HEADER_SIZE + sum(len(m.body) for m in messages[open_from:])
    if not group_end:
        if open_at_least > max_bytes and not min_one_message:
            return Rebuilt([], first_offset, 0, True)
        return Rebuilt([], first_offset, missing, False)
    batches: list[bytes | memoryview] = []
    made = 0
    start = 0
    for end in group_end:
        group = messages[start:end]
        batch = records_batch([rm.message_to_record(m) for m in group], group[-1], end - 1)
        if made + len(batch) > max_bytes and (batches or not min_one_message):
            break
        batches.append(batch)
        made += len(batch)
        start = end
    full = len(batches) < len(group_end)
    if not full and missing and made + open_at_least > max_bytes:
        full = True
    if full:
        missing = 0
    return Rebuilt(batches, first_offset + start, missing, full)


def _within_budget(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, max_bytes: int, min_one: bool) -> int:
    """How many messages of the run a read of `max_bytes` can use: a batch holds each of its values whole, so a
    message whose value and the values before it in the run add up to more than `max_bytes` cannot be in a batch
    that fits, nor can any after it. The run is cut after the first such message (the batch it opens, not whole in
    the run, makes the read full), and with `min_one` not before the end of the first batch (from the first
    message's KAFKA_BATCH). Values are read from the message headers alone (BODY's length, after the hosts that
    SYSFLAG says are IPv6); the full parse checks them."""
    flags = _ints(data, np.minimum(positions + rm.SYSFLAG_POSITION, len(data) - 4), 4)
    body_length_at = positions + rm.FIXED_SIZE - 4
    body_length_at += 12 * ((flags & rm.SYSFLAG_BORNHOST_V6) != 0) + 12 * ((flags & rm.SYSFLAG_STOREHOST_V6) != 0)
    values = np.maximum(_ints(data, np.minimum(body_length_at, len(data) - 4), 4), 0)
    over = np.flatnonzero(np.cumsum(values) > max_bytes)
    if not len(over):
        return len(positions)
    keep = int(over[0]) + 1
    if min_one:
        at, size = int(positions[0]), int(sizes[0])
        try:
            first = rm.decode_message(data[at : at + size].tobytes(), 0, check_crc=False, read_body=False)
            if isinstance(first, rm.Blank):
                return len(positions)
            position = rm.batch_position(first.properties_bytes)
        except (rm.InvalidMessage, ValueError):
            return len(positions)  # the full parse names what is wrong with it
        keep = max(keep, position.count - position.index)
    return min(keep, len(positions))


def _rebuild(
    buf: np.ndarray,
    positions: np.ndarray,
    sizes: np.ndarray,
    first_offset: int,
    max_bytes: int,
    min_one_message: bool,
    at_end: bool,
    per_record: bool,
) -> Rebuilt:
    messages = _parse(buf, positions, sizes, first_offset)

    # batches: messages [group_start, group_end); the run's last batch may be open
    group_end = np.flatnonzero(messages.ends_batch) + 1
    missing = 0
    open_at_least = 0  # bytes the open batch takes at least (its header and the values read of it)
    if not messages.ends_batch[-1]:
        if at_end and not messages.flag[-1] & TXN_ATTRIBUTES:
            group_end = np.append(group_end, len(positions))  # handed out as far as it is dispatched
        else:  # the open batch's messages in the run, and those after it
            open_from = int(group_end[-1]) if len(group_end) else 0
            missing = len(positions) - open_from + int(messages.batch_left[-1])
            open_at_least = HEADER_SIZE + int(messages.body_length[open_from:].sum())
    groups = len(group_end)
    if groups == 0:
        if open_at_least > max_bytes and not min_one_message:  # it cannot fit: no need to read the rest of it
            return Rebuilt([], first_offset, 0, True)
        return Rebuilt([], first_offset, missing, False)
    group_start = np.concatenate([[0], group_end[:-1]]).astype(np.int64)
    records = _records(messages, group_start, group_end)
    group_of = np.repeat(np.arange(groups), group_end - group_start)
    batch_size = HEADER_SIZE + np.bincount(group_of, weights=records.record_size, minlength=groups).astype(np.int64)

    # which batches go out; those rebuilt record by record are built first, so that their sizes count
    columnar = np.minimum.reduceat(messages.columnar[: records.records], group_start) & (not per_record)
    slow: dict[int, bytes] = {}
    for group in np.flatnonzero(~columnar).tolist():
        slow[group] = _records_batch(messages, positions, sizes, int(group_start[group]), int(group_end[group]))
        batch_size[group] = len(slow[group])
    fits = int(np.searchsorted(np.cumsum(batch_size), max_bytes, side="right"))
    if fits == 0 and min_one_message:
        fits = 1
    full = fits < groups or (missing > 0 and int(batch_size.sum()) + open_at_least > max_bytes)
    if full:
        missing = 0  # the open batch is not reached in this read, or cannot fit in it
    batches: list[bytes | memoryview] = []
    run_start = 0
    for group in [*sorted(g for g in slow if g < fits), fits]:
        if group > run_start:
            batches.append(_build(messages, records, group_start[run_start:group], group_end[run_start:group]))
        if group < fits:
            batches.append(slow[group])
        run_start = group + 1
    next_offset = first_offset + (int(group_end[fits - 1]) if fits else 0)
    return Rebuilt(batches, next_offset, missing, full)


def _records_batch(messages: _Messages, positions: np.ndarray, sizes: np.ndarray, start: int, end: int) -> bytes:
    """One batch rebuilt record by record (records_batch), for messages numpy does not decode."""
    decoded = []
    for i in range(start, end):
        at = int(positions[i])
        item = rm.decode_message(messages.data[at : at + int(sizes[i])].tobytes(), 0, check_crc=False)
        if isinstance(item, rm.Blank):
            raise CorruptMessageError(i, "its unit points at a BLANK marker")
        decoded.append(item)
    return records_batch([rm.message_to_record(m) for m in decoded], decoded[-1], end - 1)


def _producer(messages: _Messages, first: int, last: int) -> tuple[int, int, int, int] | None:
    """(attributes, producer id, epoch, base sequence) of a transactional or control batch of messages
    [first, last], from its last message's KAFKA_PRODUCER; None without one (records_batch's rule)."""
    at, length = int(messages.producer_at[last]), int(messages.producer_length[last])
    if length < 0:
        return None
    info = producer_value(messages.data[at : at + length].tobytes().decode("utf-8", "surrogateescape"), last)
    sequence = info.base_sequence
    if sequence != NO_SEQUENCE:  # a read from inside the batch: the sequence of its first record read
        sequence = (sequence + first - (last - info.count + 1)) % SEQUENCE_MODULUS
    return int(messages.flag[last]) & TXN_ATTRIBUTES, info.producer_id, info.epoch, sequence


def _build(messages: _Messages, records: _Records, group_start: np.ndarray, group_end: np.ndarray) -> memoryview:
    """The batches of messages [group_start[i], group_end[i]) (all numpy-decoded), back to back."""
    lo, hi = int(group_start[0]), int(group_end[-1])
    rows = slice(lo, hi)
    starts, ends = group_start - lo, group_end - lo
    group_of = np.repeat(np.arange(len(starts)), ends - starts)
    record_size = records.record_size[rows]
    before = np.cumsum(record_size) - record_size
    sizes = HEADER_SIZE + np.bincount(group_of, weights=record_size, minlength=len(starts)).astype(np.int64)
    batch_at = np.cumsum(sizes) - sizes
    out = np.empty(int(sizes.sum()), dtype=np.uint8)

    header = np.zeros(len(starts), dtype=BATCH_HEADER)
    header["base_offset"] = messages.queue_offset[group_start]
    header["length"] = sizes - 12
    header["partition_leader_epoch"] = -1
    header["magic"] = 2
    header["last_offset_delta"] = ends - starts - 1
    header["base_timestamp"] = messages.born[group_start]
    header["max_timestamp"] = np.maximum.reduceat(messages.born[rows], starts)
    header["producer_id"] = -1
    header["producer_epoch"] = -1
    header["base_sequence"] = -1
    header["records_count"] = ends - starts
    for group in np.flatnonzero(messages.flag[group_end - 1] & TXN_ATTRIBUTES).tolist():
        producer = _producer(messages, int(group_start[group]), int(group_end[group]) - 1)
        if producer is not None:
            (
                header["attributes"][group],
                header["producer_id"][group],
                header["producer_epoch"][group],
                header["base_sequence"][group],
            ) = producer
    out[batch_at[:, None] + np.arange(HEADER_SIZE)] = header.view(np.uint8).reshape(-1, HEADER_SIZE)

    # each record: length, attributes, timestamp delta, offset delta, key length, key, value length, value,
    # header count, headers; the varints (RECORD_VARINTS) written together
    varint_size = records.varint_size[:, rows]
    key_length = np.maximum(messages.key_length[rows], 0)
    value_length = np.where(messages.null_value[rows], 0, messages.body_length[rows])
    varint_at = np.empty_like(varint_size)
    varint_at[0] = batch_at[group_of] + HEADER_SIZE + before - before[starts][group_of]  # the record's length
    varint_at[1] = varint_at[0] + varint_size[0] + 1  # timestamp delta, after the attributes byte
    varint_at[2] = varint_at[1] + varint_size[1]  # offset delta
    varint_at[3] = varint_at[2] + varint_size[2]  # key length
    varint_at[4] = varint_at[3] + varint_size[3] + key_length  # value length, after the key
    varint_at[5] = varint_at[4] + varint_size[4] + value_length  # header count, after the value
    _put_varints(out, varint_at.reshape(-1), records.zigzag[:, rows].reshape(-1), varint_size.reshape(-1))
    out[varint_at[0] + varint_size[0]] = 0  # attributes
    _copy(out, varint_at[3] + varint_size[3], messages.data, messages.key_at[rows], key_length)
    _copy(out, varint_at[4] + varint_size[4], messages.data, messages.body_at[rows], value_length)

    chosen = (records.header_message >= lo) & (records.header_message < hi)
    if chosen.any():
        owner = records.header_message[chosen] - lo
        name_length, value_length = records.header_name_length[chosen], records.header_value_length[chosen]
        name_size, value_size = records.header_varint_size[:, chosen]
        each = name_size + name_length + value_size + value_length
        before_header = np.cumsum(each) - each
        header_at = varint_at[5][owner] + varint_size[5][owner]  # after the header count
        header_at += before_header - before_header[np.searchsorted(owner, owner, side="left")]
        value_at = header_at + name_size + name_length
        _put_varints(
            out, np.concatenate([header_at, value_at]), records.header_zigzag[:, chosen].reshape(-1),
            records.header_varint_size[:, chosen].reshape(-1),
        )  # fmt: skip
        _copy(out, header_at + name_size, messages.data, records.header_name_at[chosen], name_length)
        _copy(out, value_at + value_size, messages.data, records.header_value_at[chosen], value_length)

    view = memoryview(out)  # type: ignore[arg-type]
    for at_batch, size in zip(batch_at.tolist(), sizes.tolist(), strict=True):
        crc = crc32c(view[at_batch + ATTRIBUTES_AT : at_batch + size])
        view[at_batch + CRC_AT : at_batch + CRC_AT + 4] = crc.to_bytes(4, "big")
    return view
