"""Spark streaming write throughput of the `tidelog` sink: exactly-once against at-least-once, in one run.

    .venv/bin/python bench/spark_sink.py                  # 1M records of 100 bytes, micro-batches of 100k, 3 rounds
    .venv/bin/python bench/spark_sink.py --quick          # a smoke test: 40k records, micro-batches of 10k, 1 round

A local `tidelog serve` holds an input topic of --records records (random 8-byte keys, --value-bytes random values,
--partitions partitions), written once with confluent-kafka. Each round runs, for each sink mode in turn, the same
streaming query: `readStream.format("tidelog")` from the input (maxOffsetsPerTrigger=--per-batch, so the same
micro-batches every time), key and value written with `writeStream.format("tidelog")` to a fresh output topic
through the broker, `Trigger.AvailableNow`, a fresh checkpoint. The at-least-once sink (idempotent producers) is
the reference; the exactly-once sink (`tidelog.sink.exactlyOnce=true`: per task and micro-batch a transactional
producer, its fencing InitProducerId, a DescribeTransactions, the batch marker's TxnOffsetCommit and the driver's
EndTxn) is reported as a ratio of it: rows per second from the query's start to its end, best and median of the
rounds, and the time per micro-batch. An untimed round of both modes (one micro-batch each) warms up first. The
output is checked: every record there, nothing left open (the last stable offset is the log end). local[2], the
JVM with its default JIT.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchutil import add_dir_argument, console, new_table, print_machine, ratio, scratch_dir

MODES = ("at-least-once", "exactly-once")
INPUT = "sink-bench-in"


def fill_input(bootstrap: str, records: int, value_bytes: int, partitions: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(INPUT, num_partitions=partitions, replication_factor=1)]).values():
        future.result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20, "acks": 1})
    for i in range(records):
        while True:
            try:
                producer.produce(INPUT, key=os.urandom(8), value=os.urandom(value_bytes), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120):
        raise SystemExit("the input topic was not written within 120 s")


def run_query(
    spark: Any, bootstrap: str, mode: str, output: str, checkpoint: Path, per_batch: int
) -> tuple[float, int]:
    """The query once; (seconds from start to end, micro-batches run)."""
    stream = (
        spark.readStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", INPUT)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
        .load()
        .select("key", "value")
    )
    writer = (
        stream.writeStream.format("tidelog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", output)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if mode == "exactly-once":
        writer = writer.option("tidelog.sink.exactlyOnce", "true")
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    took = time.perf_counter() - started
    if query.exception() is not None:
        raise SystemExit(f"{mode}: the query failed: {query.exception()}")
    batches = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
    return took, batches


def check_output(bootstrap: str, output: str, records: int) -> None:
    """Every record in `output` (across its partitions) and no transaction left open."""
    from confluent_kafka import Consumer, TopicPartition

    metadata_consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sink-bench-check"})
    partitions = list(metadata_consumer.list_topics(output, timeout=30).topics[output].partitions)
    metadata_consumer.close()
    committed = 0
    for isolation in ("read_uncommitted", "read_committed"):
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "sink-bench-check", "isolation.level": isolation}
        )
        ends = [
            consumer.get_watermark_offsets(TopicPartition(output, p), timeout=30, cached=False)[1] for p in partitions
        ]
        consumer.close()
        if isolation == "read_committed" and sum(ends) != committed:
            raise SystemExit(f"{output}: a transaction is still open (last stable offsets {ends})")
        committed = sum(ends)
    if committed < records:  # the log end counts the transaction markers too
        raise SystemExit(f"{output}: {committed} offsets for {records} records")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: few records, one round")
    parser.add_argument("--records", type=int, help="records in the input topic (default 1M; --quick 40k)")
    parser.add_argument("--per-batch", type=int, help="records per micro-batch (default 100k; --quick 10k)")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4, help="of the input and output topics")
    parser.add_argument("--repeat", type=int, help="rounds of both modes (default 3; --quick 1)")
    add_dir_argument(parser)
    args = parser.parse_args()
    args.records = args.records or (40_000 if args.quick else 1_000_000)
    args.per_batch = args.per_batch or (10_000 if args.quick else 100_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    return args


def main() -> int:
    args = parse_args()
    import tidelog.spark
    from tidelog.spark.local_broker import LocalBroker

    needed = 4 * args.records * (args.value_bytes + 80) * (1 + 2 * args.repeat)
    with scratch_dir(args.dir, needed, "spark-sink-") as scratch:
        print_machine(scratch)
        with LocalBroker(scratch / "logs", {"num.partitions": str(args.partitions)}) as broker:
            console.print(f"writing {args.records:,} records of {args.value_bytes} bytes to {INPUT} ...")
            fill_input(broker.bootstrap, args.records, args.value_bytes, args.partitions)
            spark = tidelog.spark.local_session("spark-sink-bench")
            timings: dict[str, list[float]] = {mode: [] for mode in MODES}
            batches: dict[str, int] = {}
            try:
                for mode in MODES:  # untimed: the JVM's JIT, Spark's Python workers and the broker's first use
                    run_query(
                        spark,
                        broker.bootstrap,
                        mode,
                        f"sink-bench-warmup-{mode}",
                        scratch / f"warmup-{mode}",
                        args.records,
                    )
                for round_ in range(args.repeat):
                    for mode in MODES:
                        output = f"sink-bench-{mode}-{round_}"
                        checkpoint = scratch / f"checkpoint-{mode}-{round_}"
                        took, batches[mode] = run_query(
                            spark, broker.bootstrap, mode, output, checkpoint, args.per_batch
                        )
                        check_output(broker.bootstrap, output, args.records)
                        shutil.rmtree(checkpoint, ignore_errors=True)
                        timings[mode].append(took)
                        console.print(f"round {round_ + 1} {mode}: {took:.1f} s ({batches[mode]} micro-batches)")
            finally:
                spark.stop()
    table = new_table(
        f"Spark streaming writes through the broker: {args.records:,} records of {args.value_bytes} B, "
        f"micro-batches of {args.per_batch:,}, {args.repeat} round(s)",
        "sink",
        "records/s (best)",
        "records/s (median)",
        "s per micro-batch (median)",
        "vs at-least-once (median)",
    )
    reference = args.records / statistics.median(timings["at-least-once"])
    for mode in MODES:
        best = args.records / min(timings[mode])
        typical = args.records / statistics.median(timings[mode])
        per_batch = statistics.median(timings[mode]) / max(1, batches[mode])
        table.add_row(mode, f"{best:,.0f}", f"{typical:,.0f}", f"{per_batch:.2f}", ratio(typical, reference))
    console.print(table)
    if args.quick:
        console.print("[yellow]--quick: a smoke test on little data, not figures to quote")
    return 0


if __name__ == "__main__":
    sys.exit(main())
