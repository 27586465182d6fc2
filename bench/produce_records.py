"""Produce through the embedded API: `log.produce(topic, 0, records)` with small records, several batch sizes.

For each record size (value bytes; no key, no headers) and each number of records per produce call, four
measurements are interleaved in rounds, each running for a fixed time:

  tidelog produce       log.produce(topic, 0, records): build_batch + engine.append (page cache, no fsync)
  split                 the same two calls made by hand, each timed: the encode and storage shares of a produce
                        (measured in one loop, so both see the same memory-allocator state as produce does)
  tidelog build_batch   tidelog.codec.record_batch.build_batch(records) alone, in a loop
  kafka-python builder  kafka.record.default_records.DefaultRecordBatchBuilder building the same batch, in a loop
                        (a peer's pure-Python v2 encoder; the bytes are checked equal, up to partitionLeaderEpoch)

Records are created once up front (the caller's cost, not the library's); each call stamps "now" once per batch,
as build_batch does. Figures are medians over the rounds. MB/s counts the batch bytes written to the log.

--append-cost measures the storage side alone, with little noise: per shape, one pre-built batch appended
APPEND_COST_CALLS times in a row, the fastest of APPEND_COST_REPEATS such runs, as µs per append. Run it with
PYTHONPATH=<another checkout>/src to compare versions of the engine on the same machine.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatchBuilder

import tidelog
from benchutil import (
    GiB,
    add_dir_argument,
    console,
    median,
    new_table,
    print_machine,
    ratio,
    scratch_dir,
)
from tidelog.codec.record_batch import Record, build_batch

ROUNDS = 5
APPEND_COST_CALLS = 200
APPEND_COST_REPEATS = 7
LEADER_EPOCH = slice(12, 16)  # outside the CRC; kafka-python writes 0, tidelog -1 (NO_PARTITION_LEADER_EPOCH)


def kafka_python_build(values: list[bytes], timestamp_ms: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    append = builder.append
    for offset, value in enumerate(values):
        append(offset, timestamp_ms, None, value, [])
    return bytes(builder.build())


def check_same_bytes(values: list[bytes]) -> None:
    ours = bytearray(build_batch([Record(value=v, timestamp_ms=1_700_000_000_000) for v in values]))
    theirs = bytearray(kafka_python_build(values, 1_700_000_000_000))
    ours[LEADER_EPOCH] = theirs[LEADER_EPOCH] = b"\0\0\0\0"
    if ours != theirs:
        raise SystemExit("tidelog's build_batch and kafka-python's builder disagree: the comparison would be unfair")


def run_for(seconds: float, call: Callable[[], object]) -> tuple[int, float]:
    """Call `call` repeatedly for about `seconds`; returns (calls, elapsed seconds)."""
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        call()
        calls += 1
        now = time.perf_counter()
    return calls, now - start


def append_cost(work: Path, record_sizes: list[int], batch_sizes: list[int]) -> None:
    """µs per engine.append of one pre-built batch (no key, no headers, one timestamp), fastest of the repeats."""
    table = new_table(
        f"engine.append of one pre-built batch, fastest of {APPEND_COST_REPEATS} x {APPEND_COST_CALLS} calls",
        "value B",
        "recs/call",
        "batch bytes",
        "µs/append",
    )
    log = tidelog.open(work / "log")
    rng = random.Random(42)
    try:
        for value_size in record_sizes:
            for per_call in batch_sizes:
                batch = build_batch([Record(value=rng.randbytes(value_size)) for _ in range(per_call)])
                topic = f"append-{value_size}-{per_call}"
                log.create_topic(topic, partitions=1)
                append = log.append
                best = float("inf")
                for _ in range(APPEND_COST_REPEATS):
                    start = time.perf_counter()
                    for _ in range(APPEND_COST_CALLS):
                        append(topic, 0, batch)
                    best = min(best, (time.perf_counter() - start) / APPEND_COST_CALLS)
                log.delete_topic(topic)
                table.add_row(str(value_size), str(per_call), f"{len(batch):,d}", f"{best * 1e6:.1f}")
    finally:
        log.close()
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--record-bytes", default="100,1024", help="comma-separated value sizes in bytes (default: 100,1024)"
    )
    parser.add_argument(
        "--batch-records", default="1,100,1000", help="comma-separated records per produce call (default: 1,100,1000)"
    )
    parser.add_argument(
        "--seconds", type=float, default=0.6, help=f"seconds per measurement per round, {ROUNDS} rounds (default: 0.6)"
    )
    parser.add_argument("--append-cost", action="store_true", help="measure engine.append alone (see above)")
    add_dir_argument(parser)
    args = parser.parse_args()
    record_sizes = [int(x) for x in args.record_bytes.split(",")]
    batch_sizes = [int(x) for x in args.batch_records.split(",")]
    if args.append_cost:
        with scratch_dir(args.dir, 2 * GiB, "tidelog-bench-append-cost-") as work:
            print_machine(work)
            append_cost(Path(work), record_sizes, batch_sizes)
        return

    console.print(
        f"[bold]produce records[/]: value sizes {record_sizes} B, {batch_sizes} records per call, "
        f"{ROUNDS} rounds x {args.seconds:g} s per measurement"
    )
    rng = random.Random(42)
    table = new_table(
        "produce through the embedded API (median of rounds)",
        "value B",
        "recs/call",
        "produce rec/s",
        "produce MB/s",
        "µs/call",
        "encode µs",
        "append µs",
        "encode %",
        "build_batch rec/s",
        "kafka-python rec/s",
        "build_batch / kafka-python",
        "produce / kafka-python",
    )
    # Generous: the log keeps everything one topic receives until the topic is deleted after its case.
    with scratch_dir(args.dir, 2 * GiB, "tidelog-bench-produce-") as work:
        print_machine(work)
        log = tidelog.open(Path(work) / "log")
        try:
            for value_size in record_sizes:
                pool = [rng.randbytes(value_size) for _ in range(1000)]
                for per_call in batch_sizes:
                    values = [pool[i % len(pool)] for i in range(per_call)]
                    check_same_bytes(values)
                    records = [Record(value=v) for v in values]
                    batch_size = len(build_batch(records))
                    topic = f"produce-{value_size}-{per_call}"
                    log.create_topic(topic, partitions=1)

                    def do_produce(topic: str = topic, records: list[Record] = records, produce=log.produce) -> object:
                        return produce(topic, 0, records)

                    split_ns = [0, 0]

                    def do_split(
                        topic: str = topic, records: list[Record] = records, append=log.append, split_ns=split_ns
                    ) -> object:
                        clock = time.perf_counter_ns
                        start = clock()
                        batch = build_batch(records)
                        built = clock()
                        result = append(topic, 0, batch)
                        split_ns[0] += built - start
                        split_ns[1] += clock() - built
                        return result

                    def do_build(records: list[Record] = records) -> object:
                        return build_batch(records)

                    def do_kafka_python(values: list[bytes] = values) -> object:
                        return kafka_python_build(values, int(time.time() * 1000))

                    rates: dict[str, list[float]] = {"produce": [], "build": [], "kafka": []}
                    encode_us: list[float] = []
                    append_us: list[float] = []
                    for _ in range(ROUNDS):
                        for key, call in (("produce", do_produce), ("build", do_build), ("kafka", do_kafka_python)):
                            calls, elapsed = run_for(args.seconds, call)
                            rates[key].append(calls / elapsed)  # calls per second
                        split_ns[:] = [0, 0]
                        calls, _ = run_for(args.seconds, do_split)
                        encode_us.append(split_ns[0] / calls / 1e3)
                        append_us.append(split_ns[1] / calls / 1e3)
                    log.delete_topic(topic)

                    produce_cps, build_cps, kafka_cps = (median(rates[k]) for k in ("produce", "build", "kafka"))
                    produce_us = 1e6 / produce_cps
                    split_encode, split_append = median(encode_us), median(append_us)
                    table.add_row(
                        str(value_size),
                        str(per_call),
                        f"{produce_cps * per_call:,.0f}",
                        f"{produce_cps * batch_size / 1e6:.1f}",
                        f"{produce_us:.1f}",
                        f"{split_encode:.1f}",
                        f"{split_append:.1f}",
                        f"{split_encode / (split_encode + split_append):.0%}",
                        f"{build_cps * per_call:,.0f}",
                        f"{kafka_cps * per_call:,.0f}",
                        ratio(build_cps, kafka_cps),
                        ratio(produce_cps, kafka_cps),
                    )
                    console.print(
                        f"  {value_size} B x {per_call}: produce {produce_cps * per_call:,.0f} rec/s, "
                        f"build_batch {build_cps * per_call:,.0f} rec/s, kafka-python {kafka_cps * per_call:,.0f} rec/s"
                    )
        finally:
            log.close()
    console.print(table)
    console.print(
        "encode µs / append µs: build_batch and engine.append timed separately in a produce-like loop; "
        "encode % is encode's share of their sum. append = validation, CRC check, pwritev, index. "
        "Ratios > 1x mean tidelog is faster."
    )


if __name__ == "__main__":
    main()
