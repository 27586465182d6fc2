"""Vectorised primitives over the records sections of v2 batches, shared by the decoders and the check built on
them: batch_columns (Spark), record_layout (the log cleaner), record_check (the produce path) and rocketmq_columns.

A records section is what follows a batch's 61-byte header (decompressed): `recordsCount` records, each a length
varint and a body of that many bytes (attributes, timestampDelta, offsetDelta, key, value, headers). These
functions take a numpy uint8 view `arr` of a buffer holding sections and ending with PADDING spare bytes, and
int64 arrays of positions into it, and return int64 (or int32) arrays; nothing here builds a Python object per
record except the plain loops (frame_one, and the tail of a lockstep walk), which callers take only where a loop
costs less than numpy's fixed cost per call.

- `varints(arr, pos)`: the zig-zag varint (or varlong) at each position as (value, size); varints of one or two
  bytes with one lookup in TWO_BYTES (every 2-byte window's value and size), longer ones byte by byte.
- `frame_records(data, arr, starts, ends, counts, positions)`: body start and length of every record of many
  batches at once. Runs of equal-sized records are checked together; what is left is walked in lockstep over the
  batches, or by a loop per batch when few remain. `frame_batch` does the same for one batch (its size predictions
  take offset deltas to be the record indexes, as producers write them); `frame_one` is the plain loop.
- `record_prefix(arr, body)`: timestampDelta, offsetDelta and keyLength of each record, and where its key starts.
- `decode_headers(...)`: (start, length) of the key and value of every header of the records that have some.
- `batch_section(buf, pos, header)`: the records section of one batch, decompressed if it is compressed.

Guarantees: framing is exact (a record accepted with a run was read where the record before it ends, and has the
run's size); framing or fields that do not add up raise CorruptRecordError naming the batch's byte position (from
`positions` / `pos`, as the caller numbers batches). Reads past the last record stay within the PADDING spare
bytes.
"""

from __future__ import annotations

import numpy as np

from tidelog.codec.compression import Compression, decompress
from tidelog.codec.record_batch import COMPRESSION_MASK, HEADER_SIZE, BatchHeader
from tidelog.codec.varint import decode_varint
from tidelog.errors import CorruptRecordError

MIN_RECORD_BYTES = 7
# Below this many batches still walking at one record index, a Python loop beats one round of numpy calls.
LOCKSTEP_MIN_ACTIVE = 128
# Framing runs of equal-sized records: records checked per batch in the first round (doubling each round up to
# the maximum), and the mean run a round must find for the next round to be worth it (else records vary in
# size and are walked instead).
RUN_WINDOW_FIRST = 64
RUN_WINDOW_MAX = 8192
RUN_MIN_MEAN = 8.0


# --- vectorised varints --------------------------------------------------------------------------------------


def _unsigned_varints(
    arr: np.ndarray, pos: np.ndarray, max_bytes: int, strict: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(value as uint64, encoded size) of the unsigned varint at each position (positions clipped into `arr`).

    Byte k is looked at only for the varints still going after k bytes, so short varints cost little.
    An unterminated varint raises, or with strict=False comes back as size 0 (a guess that did not hold)."""
    last = len(arr) - 1
    b = arr[pos]
    value = (b & 0x7F).astype(np.uint64)
    size = np.ones(len(pos), dtype=np.int64)
    going = np.nonzero(b >= 0x80)[0]
    for k in range(1, max_bytes):
        if len(going) == 0:
            return value, size
        b = arr[np.minimum(pos[going] + k, last)]
        value[going] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        size[going] = k + 1
        going = going[b >= 0x80]
    if len(going):
        if strict:
            raise CorruptRecordError(f"a varint longer than {max_bytes} bytes at byte {int(pos[going[0]])}")
        size[going] = 0
    return value, size


def _two_byte_table() -> np.ndarray:
    """For every 2-byte window: (signed zig-zag value << 4) | size of the varint starting there (size 0: longer)."""
    code = np.arange(1 << 16, dtype=np.int64)
    b0, b1 = code >> 8, code & 0xFF
    one = b0 < 0x80
    two = ~one & (b1 < 0x80)
    unsigned = np.where(one, b0, (b0 & 0x7F) | (b1 << 7))
    signed = (unsigned >> 1) ^ -(unsigned & 1)
    size = np.where(one, 1, np.where(two, 2, 0))
    return np.where(size > 0, (signed << 4) | size, 0).astype(np.int32)


TWO_BYTES = _two_byte_table()
# Spare bytes after the data: the chained varint reads of a record (up to 16 bytes past a checked position)
# stay inside the array without a bounds check per read.
PADDING = 32


def varints(
    arr: np.ndarray, pos: np.ndarray, max_bytes: int = 5, strict: bool = True, *, in_bounds: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(signed zig-zag value, size) of the varint (max_bytes 5) or varlong (10) at each position.

    `arr` ends with PADDING spare bytes; `in_bounds` says the caller knows every position is at most PADDING / 2
    past the data. Varints of one or two bytes (values -8192..8191: lengths, deltas and counts of typical records)
    are decoded with one lookup in a 64 Ki-entry table; longer ones byte by byte."""
    if not in_bounds and len(pos) and int(pos.max()) >= len(arr) - 1:  # only corrupt framing points past the data
        pos = np.minimum(pos, len(arr) - 2)
    code = (arr[pos].astype(np.uint16) << 8) | arr[pos + 1]
    packed = TWO_BYTES[code]
    size = packed & 15
    if size.min() > 0:
        return packed >> 4, size
    value = packed >> 4
    longer = np.nonzero(size == 0)[0]
    wide, wide_size = _unsigned_varints(arr, pos[longer], max_bytes, strict)
    value = value.astype(np.int64)
    size = size.astype(np.int64)
    value[longer] = (wide >> np.uint64(1)).astype(np.int64) ^ -(wide & np.uint64(1)).astype(np.int64)
    size[longer] = wide_size
    return value, size


# --- record framing ------------------------------------------------------------------------------------------


def frame_records(
    data: bytes | bytearray | memoryview,
    arr: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    positions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Body start and body length of every record (batch b's records fill [starts[b], ends[b]) of `arr`)."""
    total = int(counts.sum())
    body = np.empty(total, dtype=np.int64)
    length = np.empty(total, dtype=np.int64)
    first_slot = np.cumsum(counts) - counts
    batches = np.nonzero(counts > 0)[0]
    cur = starts[batches].astype(np.int64)
    done = np.zeros(len(batches), dtype=np.int64)
    batches, cur, done = _frame_runs(arr, batches, cur, done, ends, counts, first_slot, body, length, positions)
    if len(batches):
        _frame_walk(data, arr, batches, cur, done, ends, counts, first_slot, body, length, positions)
    return body, length


def _frame_runs(
    arr: np.ndarray,
    batches: np.ndarray,
    cur: np.ndarray,
    done: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    first_slot: np.ndarray,
    body: np.ndarray,
    length: np.ndarray,
    positions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frame runs of equal-sized records, for all batches at once; returns the batches left for a walk.

    The size of the record at each batch's cursor is taken as the stride of a run; the next records of the batch
    (RUN_WINDOW_FIRST of them, doubling per round) are checked at cursor + j * stride, and the run is accepted
    up to the first record whose
    length does not match. Each accepted record was read at its true position (all records before it had
    the stride's size), so this is exact, not a heuristic. Fixed-size payloads make a few long runs per batch
    (records grow by a byte where offset and timestamp deltas reach 64 and 8192); variable-size payloads make
    runs of about one record, detected after one round and handed to the walk.
    """
    batch_ends = ends[batches]
    run_window = RUN_WINDOW_FIRST
    while len(batches):
        value, size = varints(arr, cur)
        stride = size + value
        bad = (value < 0) | (cur + stride > batch_ends)
        if bad.any():
            where = int(positions[batches[np.argmax(bad)]])
            raise CorruptRecordError(f"batch at byte {where}: a record declares a length past the end of the batch")
        remaining = counts[batches] - done
        window = np.minimum(remaining, run_window)
        run_window = min(run_window * 2, RUN_WINDOW_MAX)
        first = np.cumsum(window) - window
        owner = np.repeat(np.arange(len(batches)), window)
        index = np.arange(int(window.sum())) - first[owner]
        candidate = cur[owner] + index * stride[owner]
        cand_value, cand_size = varints(arr, candidate, strict=False)
        fits = (
            (cand_size > 0)
            & (cand_size + cand_value == stride[owner])
            & (candidate + stride[owner] <= batch_ends[owner])
        )
        run = np.minimum.reduceat(np.where(fits, window[owner], index), first)
        accepted = index < run[owner]
        slots = (first_slot[batches] + done)[owner][accepted] + index[accepted]
        body[slots] = candidate[accepted] + cand_size[accepted]
        length[slots] = cand_value[accepted]
        done = done + run
        cur = cur + run * stride
        finished = done == counts[batches]
        short = finished & (cur != batch_ends)
        if short.any():
            where = int(np.argmax(short))
            raise CorruptRecordError(
                f"batch at byte {int(positions[batches[where]])}: incorrect declared batch size, "
                f"{int(batch_ends[where] - cur[where])} bytes left after its records"
            )
        mean_run = int(run.sum()) / len(run)
        keep = ~finished
        batches, cur, done, batch_ends = batches[keep], cur[keep], done[keep], batch_ends[keep]
        if mean_run < RUN_MIN_MEAN:
            break
    return batches, cur, done


def _frame_walk(
    data: bytes | bytearray | memoryview,
    arr: np.ndarray,
    batches: np.ndarray,
    cur: np.ndarray,
    done: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    first_slot: np.ndarray,
    body: np.ndarray,
    length: np.ndarray,
    positions: np.ndarray,
) -> None:
    """Record by record: in lockstep over many batches (numpy per record index), else a Python loop per batch."""
    remaining = counts[batches] - done
    order = np.argsort(-remaining, kind="stable")  # most records first: the batches still walking form a prefix
    batches, pos, done, remaining = batches[order], cur[order].copy(), done[order], remaining[order]
    batch_ends = ends[batches]
    slot0 = first_slot[batches] + done
    step = 0
    active = len(batches)
    while active >= LOCKSTEP_MIN_ACTIVE:
        p = pos[:active]
        value, size = varints(arr, p)
        slots = slot0[:active] + step
        body[slots] = p + size
        length[slots] = value
        pos[:active] = p + size + np.maximum(value, 0)
        bad = (value < 0) | (pos[:active] > batch_ends[:active])
        if bad.any():
            where = int(positions[batches[np.argmax(bad)]])
            raise CorruptRecordError(f"batch at byte {where}: a record declares a length past the end of the batch")
        step += 1
        while active and remaining[active - 1] <= step:
            active -= 1
    for rank in range(active):
        batch = int(batches[rank])
        frame_one(data, int(pos[rank]), int(batch_ends[rank]), int(remaining[rank]) - step,
                   int(slot0[rank]) + step, body, length, int(positions[batch]))  # fmt: skip
        pos[rank] = batch_ends[rank]
    short = pos != batch_ends
    if short.any():
        where = int(np.argmax(short))
        raise CorruptRecordError(
            f"batch at byte {int(positions[batches[where]])}: incorrect declared batch size, "
            f"{int(batch_ends[where] - pos[where])} bytes left after its records"
        )


def frame_one(
    data: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    count: int,
    slot: int,
    body: np.ndarray,
    length: np.ndarray,
    position: int,
) -> None:
    """Walk `count` records of one batch from `pos` (the plain loop: one varint per record)."""
    bodies: list[int] = []
    lengths: list[int] = []
    add_body = bodies.append
    add_length = lengths.append
    for _ in range(count):
        if pos >= end:
            raise CorruptRecordError(f"batch at byte {position}: records run past the end of the batch")
        b = data[pos]
        if b < 0x80:
            value = b
            pos += 1
        else:
            value, shift = b & 0x7F, 7
            pos += 1
            while True:
                if pos >= end or shift > 28:
                    raise CorruptRecordError(f"batch at byte {position}: a bad record length varint")
                b = data[pos]
                pos += 1
                value |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
        n = (value >> 1) ^ -(value & 1)
        if n < 0 or pos + n > end:
            raise CorruptRecordError(f"batch at byte {position}: a record declares length {n}, past the batch end")
        add_body(pos)
        add_length(n)
        pos += n
    if pos != end:
        raise CorruptRecordError(f"batch at byte {position}: incorrect declared batch size, {end - pos} bytes left")
    body[slot : slot + len(bodies)] = bodies
    length[slot : slot + len(lengths)] = lengths


# frame_batch walks the last FRAME_WALK_MAX records of a batch: a round of numpy calls costs as much as walking
# about that many.
FRAME_WALK_MAX = 48


def _offset_delta_bytes_before(k: np.ndarray) -> np.ndarray:
    """Bytes the offset-delta varints of records 0..k-1 take when record i has delta i: 1 each up to 63, 2 up to
    8191, then 3 (a 4-byte delta, past 2^20 records, is not predicted: it only ends a run)."""
    return k + np.maximum(k - 64, 0) + np.maximum(k - 8192, 0)


def frame_batch(
    data: bytes | bytearray | memoryview, arr: np.ndarray, end: int, count: int, pos: int
) -> tuple[np.ndarray, np.ndarray]:
    """Body start and body length of each of the `count` records that must fill data[0:end] (one batch).

    As _frame_runs, for one batch: from the record at the cursor, all later records are predicted at once to have
    its size, plus a byte where their offset delta (their index, as a producer writes it) needs a longer varint;
    the prediction is checked for every record in one go and accepted up to the first that does not match (exact:
    each accepted record was read where the ones before it end). A run shorter than RUN_MIN_MEAN records means
    sizes vary: the rest is walked record by record, as are the last FRAME_WALK_MAX records (a round of numpy
    calls costs as much as walking about that many)."""
    body = np.empty(count, dtype=np.int64)
    length = np.empty(count, dtype=np.int64)
    index = np.arange(count + 1, dtype=np.int64)
    width_sum = _offset_delta_bytes_before(index)
    widths = np.diff(width_sum)
    cur = done = 0
    while count - done > FRAME_WALK_MAX:
        try:
            value, after = decode_varint(data, cur)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"batch at byte {pos}: record {done} has a bad length: {exc}") from exc
        stride = after - cur + value
        if value < 0 or cur + stride > end:
            raise CorruptRecordError(f"batch at byte {pos}: record {done} declares length {value}, past the batch end")
        base = stride - int(widths[done])
        candidate = cur + index[: count - done] * base + (width_sum[done:count] - width_sum[done])
        predicted = base + widths[done:]
        cand_value, cand_size = varints(arr, candidate, strict=False)
        fits = (cand_size > 0) & (cand_size + cand_value == predicted) & (candidate + predicted <= end)
        run = count - done if fits.all() else int(np.argmin(fits))
        body[done : done + run] = candidate[:run] + cand_size[:run]
        length[done : done + run] = cand_value[:run]
        cur += run * base + int(width_sum[done + run] - width_sum[done])
        done += run
        if run < RUN_MIN_MEAN:
            break
    if done < count:  # sizes vary, or only a few records are left
        frame_one(data, cur, end, count - done, done, body, length, pos)
    elif cur != end:
        raise CorruptRecordError(
            f"batch at byte {pos}: incorrect declared batch size, {end - cur} bytes left after its {count} records"
        )
    return body, length


# --- fields --------------------------------------------------------------------------------------------------


def eight_byte_windows(arr: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The 8 bytes at each position as one big-endian uint64 (positions at most PADDING - 8 past the data)."""
    windows = np.lib.stride_tricks.as_strided(arr, shape=(len(arr) - 7, 8), strides=(1, 1), writeable=False)
    return windows[pos].view(">u8").ravel().astype(np.uint64)


def _from_window(window: np.ndarray, offset: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """(value, size) of the 1- or 2-byte varint at byte `offset` (0..6) of each window; size 0: longer."""
    code = (window >> (np.uint64(48) - np.asarray(offset, dtype=np.uint64) * np.uint64(8))) & np.uint64(0xFFFF)
    packed = TWO_BYTES[code.astype(np.intp)]
    return packed >> 4, packed & 15


def record_prefix(arr: np.ndarray, body: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """timestampDelta, offsetDelta and keyLength of each record, and where its key starts."""
    window = eight_byte_windows(arr, body)
    timestamp_delta, size1 = _from_window(window, 1)
    offset_delta, size2 = _from_window(window, 1 + size1)
    key_length, size3 = _from_window(window, 1 + size1 + size2)
    if min(size1.min(), size2.min(), size3.min()) > 0:
        return timestamp_delta, offset_delta, key_length, body + 1 + size1 + size2 + size3
    # Some field is longer than two bytes (a timestamp delta of hours, a key of 8 KiB or more): the general path.
    p = body + 1  # body <= the end of the data: these reads stay within 1 + 10 + 5 bytes past it, in the padding
    timestamp_delta, size = varints(arr, p, 10, in_bounds=True)
    p = p + size
    offset_delta, size = varints(arr, p, in_bounds=True)
    p = p + size
    key_length, size = varints(arr, p, in_bounds=True)
    return timestamp_delta, offset_delta, key_length, p + size


def decode_headers(
    arr: np.ndarray,
    p: np.ndarray,
    header_count: np.ndarray,
    record_end: np.ndarray,
    positions: np.ndarray,
    batch_of: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Walk header j of every record that has one, for j = 0, 1, ... (headers per record are few)."""
    total = int(header_count.sum())
    first = np.cumsum(header_count) - header_count
    key_start = np.empty(total, dtype=np.int64)
    key_length = np.empty(total, dtype=np.int64)
    value_start = np.empty(total, dtype=np.int64)
    value_length = np.empty(total, dtype=np.int64)
    p = p.copy()
    for j in range(int(header_count.max())):
        sel = np.nonzero(header_count > j)[0]
        q = p[sel]
        kl, size = varints(arr, q)
        if (kl < 0).any():
            where = int(positions[batch_of[sel[int(np.argmax(kl < 0))]]])
            raise CorruptRecordError(f"batch at byte {where}: a record header has a null key")
        ks = q + size
        q = ks + kl
        vl, size = varints(arr, q)
        vs = q + size
        q = vs + np.maximum(vl, 0)
        over = q > record_end[sel]
        if over.any():
            where = int(positions[batch_of[sel[int(np.argmax(over))]]])
            raise CorruptRecordError(f"batch at byte {where}: record headers run past the end of the record")
        slots = first[sel] + j
        key_start[slots] = ks
        key_length[slots] = kl
        value_start[slots] = vs
        value_length[slots] = vl
        p[sel] = q
    return p, key_start, key_length, value_start, value_length


def batch_section(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bytes | memoryview:
    """The records section of the v2 batch at `pos` (`header` read from it): a view into `buf`, or for a compressed
    batch that declares records, the section decompressed. Raises CorruptRecordError naming the batch position
    when it does not decompress or is too short for `recordsCount` records of MIN_RECORD_BYTES."""
    raw = memoryview(buf)[pos + HEADER_SIZE : pos + header.size_in_bytes]
    codec = header.attributes & COMPRESSION_MASK
    section: bytes | memoryview = raw
    if codec and header.records_count:
        try:
            section = decompress(Compression.from_id(codec), raw)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"batch at byte {pos}: {exc}") from exc
    count = header.records_count
    if count * MIN_RECORD_BYTES > len(section):
        raise CorruptRecordError(f"batch at byte {pos} declares {count} records in {len(section)} bytes")
    return section
