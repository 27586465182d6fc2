"""Spark read throughput of `format("tidelog")` against Spark reading the same rows from Parquet, in one run.

    .venv/bin/python bench/spark_read.py                 # 10M records with 100-byte values (about 1.4 GB of log)
    .venv/bin/python bench/spark_read.py --records 2000000 --repeat 5
    .venv/bin/python bench/spark_read.py latency         # streaming end-to-end latency of the demo's query

`read`: writes --records records (random 8-byte keys, random --value-bytes values, 1000 per batch, uncompressed)
into --partitions partitions of a fresh log directory with the embedded API; Spark copies them once with
`spark.read.format("tidelog").load(dir).write.parquet(...)` (so both sides hold exactly the same rows: key, value,
topic, partition, offset, timestamp, timestampType; Parquet with Spark's default snappy); then, alternating,
times `df.write.format("noop")` over each (every column of every row materialised), best and median of --repeat.
A third source bounds what any Python data source can do here: it yields the same number of rows as ready-made
Arrow batches (decoded once per Python worker and cached, so no reading or decoding is timed). Also times the
decoder alone (segment bytes -> Arrow record batches in this process, no Spark). local[2], the JVM with its
default JIT. Target: tidelog >= 50 % of the Parquet rate.

`latency`: runs the demo's pipeline (examples/page_visits_pipeline.py) against a local `tidelog serve` at
--rate events/s for --seconds, and reports per micro-batch trigger time and, per window, how long after the
window's end its count was written (5 s of it is the watermark the query waits by design).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from crc32c import crc32c

import tidelog
from benchutil import add_dir_argument, console, fmt_bytes, new_table, print_machine, scratch_dir
from tidelog.codec.batch_chain import Window, batch_table, scan_chain
from tidelog.codec.batch_columns import decode_v2
from tidelog.codec.batch_table import BatchTable
from tidelog.codec.record_batch import CRC_OFFSET, Record, build_batch

T0 = 1_700_000_000_000
PER_BATCH = 1000
TOPIC = "bench"


# --- data -----------------------------------------------------------------------------------------------------


def table_of(data: bytes) -> BatchTable:
    """The batches of `data` as the Spark source's table (batch_chain's walk, then batch_table)."""
    chain = scan_chain(data)
    return batch_table(Window(data, 0, chain.positions, chain.sizes))


class BatchFactory:
    """Encodes a template batch once; each new batch is the template with fresh random keys, values and times."""

    def __init__(self, key_bytes: int, value_bytes: int, per_batch: int = PER_BATCH) -> None:
        records = [
            Record(value=bytes(value_bytes), key=bytes(key_bytes), timestamp_ms=T0 + i) for i in range(per_batch)
        ]
        self.template = build_batch(records)
        cols = decode_v2(self.template, table_of(self.template))
        self.key_index = (cols.key_start[:, None] + np.arange(key_bytes)).ravel()
        self.value_index = (cols.value_start[:, None] + np.arange(value_bytes)).ravel()
        self.rng = np.random.default_rng(7)
        self.per_batch = per_batch

    def make(self, first_timestamp: int) -> bytes:
        buf = np.frombuffer(bytearray(self.template), dtype=np.uint8)
        buf[self.key_index] = self.rng.integers(0, 256, len(self.key_index), dtype=np.uint8)
        buf[self.value_index] = self.rng.integers(0, 256, len(self.value_index), dtype=np.uint8)
        raw = buf.data.cast("B")
        raw[27:35] = first_timestamp.to_bytes(8, "big")  # baseTimestamp; deltas 0..n-1 are in the template
        raw[35:43] = (first_timestamp + self.per_batch - 1).to_bytes(8, "big")  # maxTimestamp
        raw[CRC_OFFSET : CRC_OFFSET + 4] = crc32c(raw[21:]).to_bytes(4, "big")
        return bytes(raw)


def write_log(root: Path, records: int, partitions: int, key_bytes: int, value_bytes: int) -> int:
    factory = BatchFactory(key_bytes, value_bytes)
    batches = records // PER_BATCH
    started = time.perf_counter()
    with tidelog.open(root, config={"log.segment.bytes": 256 << 20}, background=False) as log:
        log.create_topic(TOPIC, partitions=partitions)
        for b in range(batches):
            log.append(TOPIC, b % partitions, factory.make(T0 + b * PER_BATCH))
    size = sum(f.stat().st_size for f in root.rglob("*.log"))
    elapsed = time.perf_counter() - started
    console.print(f"wrote {batches * PER_BATCH:,} records ({fmt_bytes(size)} of segments) in {elapsed:.1f} s")
    return size


def decode_only(root: Path) -> float:
    """Records/s of segment bytes -> Arrow batches in this process (one core, no Spark)."""
    from tidelog.spark.arrow import to_record_batch

    segment = sorted((root / f"{TOPIC}-0").glob("*.log"))[0]
    data = segment.read_bytes()[: 64 << 20]
    table = table_of(data)
    to_record_batch(decode_v2(data, table.take(slice(0, 8))), TOPIC, 0, False)  # warm-up (Arrow kernels)
    started = time.perf_counter()
    rows = 0
    for start in range(0, len(table), 128):
        part = table.take(slice(start, start + 128))
        rows += to_record_batch(decode_v2(data, part, with_headers=False), TOPIC, 0, False).num_rows
    return rows / (time.perf_counter() - started)


# --- the read benchmark -----------------------------------------------------------------------------------------


def ceiling_source() -> type:
    """A Python data source yielding cached, ready-made Arrow batches: the transfer cost alone (defined here and
    pickled by value, so Spark's workers need not import this script)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class CeilingReader(DataSourceReader):
        def __init__(self, root: str, tasks: int, per_task: int) -> None:
            self.root, self.tasks, self.per_task = root, tasks, per_task

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(self.tasks)]

        def read(self, partition: InputPartition) -> Any:
            import tidelog as cache_home
            from tidelog.spark.options import parse_read_options
            from tidelog.spark.source import TidelogPartition, read_partition

            cache = cache_home.__dict__.setdefault("_bench_ceiling_cache", {})
            key = (self.root, self.per_task)
            if key not in cache:  # once per Python worker; the timed runs only replay it
                options = parse_read_options({"path": self.root, "subscribe": TOPIC}, streaming=False)
                cache[key] = list(read_partition(options, TidelogPartition(TOPIC, 0, 0, self.per_task)))
            yield from cache[key]

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "tidelog_bench_ceiling"

        def schema(self) -> str:
            from tidelog.spark.source import KAFKA_SCHEMA

            return KAFKA_SCHEMA

        def reader(self, schema: Any) -> DataSourceReader:
            return CeilingReader(self.options["root"], int(self.options["tasks"]), int(self.options["per_task"]))

    return CeilingSource


def time_noop(df: Any) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def bench_read(args: argparse.Namespace) -> None:
    import tidelog.spark

    needed = int(args.records * (args.value_bytes + 60) * 2.2)
    with scratch_dir(args.dir, needed, "tidelog-spark-read-") as scratch:
        print_machine(scratch)
        root = scratch / "log"
        write_log(root, args.records, args.partitions, 8, args.value_bytes)
        decode_rate = decode_only(root)
        spark = tidelog.spark.local_session("bench-spark-read", extra={"spark.driver.memory": "2g"})
        try:
            source = spark.read.format("tidelog").option("subscribe", TOPIC)
            if args.min_partitions:
                source = source.option("minPartitions", str(args.min_partitions))
            tidelog_df = source.load(str(root))
            started = time.perf_counter()
            tidelog_df.write.parquet(str(scratch / "parquet"))
            parquet_size = sum(f.stat().st_size for f in (scratch / "parquet").rglob("*.parquet"))
            console.print(
                f"Spark copied them to Parquet ({fmt_bytes(parquet_size)}) in {time.perf_counter() - started:.1f} s"
            )
            parquet_df = spark.read.parquet(str(scratch / "parquet"))
            assert parquet_df.count() == args.records
            console.print(
                f"tasks: tidelog {tidelog_df.rdd.getNumPartitions()}, Parquet {parquet_df.rdd.getNumPartitions()}"
            )
            tasks = tidelog_df.rdd.getNumPartitions()
            spark.dataSource.register(ceiling_source())
            ceiling_df = (
                spark.read.format("tidelog_bench_ceiling")
                .option("root", str(root))
                .option("tasks", str(tasks))
                .option("per_task", str(args.records // tasks))
                .load()
            )
            frames = {"tidelog": tidelog_df, "parquet": parquet_df, "python source ceiling": ceiling_df}
            for df in frames.values():
                time_noop(df)  # warm-up: JIT, Python workers, the ceiling's cache
            times: dict[str, list[float]] = {name: [] for name in frames}
            for _ in range(args.repeat):
                for name, df in frames.items():
                    times[name].append(time_noop(df))
        finally:
            spark.stop()
    table = new_table(
        f"spark.read ... .write.format('noop'), {args.records:,} rows, {args.value_bytes}-byte values, "
        f"local[2], best / median of {args.repeat}",
        "source",
        "best s",
        "median s",
        "rows/s (best)",
        "rows/s (median)",
        "vs Parquet (median)",
    )
    parquet_median = statistics.median(times["parquet"])
    for name in times:
        best, mid = min(times[name]), statistics.median(times[name])
        table.add_row(
            name,
            f"{best:.2f}",
            f"{mid:.2f}",
            f"{args.records / best / 1e6:.2f} M",
            f"{args.records / mid / 1e6:.2f} M",
            f"{100 * parquet_median / mid:.0f} %",
        )
    console.print(table)
    console.print(f"decoder alone (one core, no Spark): {decode_rate / 1e6:.2f} M records/s")
    console.print("all times (s): " + "; ".join(f"{name} {[round(t, 2) for t in ts]}" for name, ts in times.items()))


# --- the latency benchmark -----------------------------------------------------------------------------------


def bench_latency(args: argparse.Namespace) -> None:
    import tidelog.spark
    from tidelog.spark import demo
    from tidelog.spark.local_broker import LocalBroker

    pipeline = demo.load_pipeline()
    with scratch_dir(args.dir, 256 << 20, "tidelog-spark-latency-") as scratch:
        print_machine(scratch)
        with LocalBroker(scratch / "broker", {"num.partitions": "5"}) as broker:
            demo.create_topics(broker.bootstrap)
            spark = tidelog.spark.local_session("bench-latency", fast_start=True)
            progress = demo.Progress()
            stop = threading.Event()
            written: list[tuple[float, float]] = []  # (window end, time written), ms

            def on_batch(batch: Any, batch_id: int) -> None:
                now = time.time() * 1000
                written.extend((row["end"].timestamp() * 1000, now) for row in batch.select("window.end").collect())

            source = (
                {"path": str(broker.log_dir)}
                if args.read_from == "files"
                else {"kafka.bootstrap.servers": broker.bootstrap}
            )
            query = pipeline.start_pipeline(
                spark,
                source,
                {"kafka.bootstrap.servers": broker.bootstrap},
                str(scratch / "windows.parquet"),
                str(scratch / "checkpoint"),
                trigger={"processingTime": args.trigger},
                on_batch=on_batch,
            )
            producer = threading.Thread(
                target=demo.produce_visits, args=(broker.bootstrap, args.seconds, args.rate, progress, stop)
            )
            started = time.monotonic()
            producer.start()
            producer.join()
            last_end = (progress.last_event_ms // 10_000 + 1) * 10_000
            while time.monotonic() - started < args.seconds + 60 and not any(e >= last_end for e, _ in written):
                time.sleep(0.5)
            reports = list(query.recentProgress)
            query.stop()
            spark.stop()
    triggers = [r["durationMs"].get("triggerExecution", 0) for r in reports if r["numInputRows"]]
    rows = [r["numInputRows"] for r in reports if r["numInputRows"]]
    steady = triggers[1:] or triggers  # the first batch pays for JVM and Python worker warm-up
    delays = sorted((t - e) / 1000 for e, t in written)
    table = new_table(
        f"demo query, {args.rate} events/s for {args.seconds:.0f} s, trigger {args.trigger}, "
        f"read from {args.read_from}",
        "measure",
        "median",
        "p90",
        "max",
    )
    table.add_row(
        "micro-batch time (ms, after the first)",
        f"{statistics.median(steady):.0f}",
        f"{np.percentile(steady, 90):.0f}",
        f"{max(steady):.0f}",
    )
    table.add_row(
        "rows per micro-batch", f"{statistics.median(rows):.0f}", f"{np.percentile(rows, 90):.0f}", f"{max(rows)}"
    )
    table.add_row(
        "window written after its end (s)",
        f"{statistics.median(delays):.1f}",
        f"{np.percentile(delays, 90):.1f}",
        f"{max(delays):.1f}",
    )
    console.print(table)
    console.print(
        f"first micro-batch (warm-up) {triggers[0] if triggers else 0} ms; {len(written)} window results; "
        "a window can only be written once the watermark (newest event time - 5 s) passes its end"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["read", "latency"], default="read")
    parser.add_argument("--records", type=int, default=10_000_000, help="records to write and read (read)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size (read)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (read)")
    parser.add_argument("--min-partitions", type=int, default=8, help="the source's minPartitions (read; 0: unset)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each source (read)")
    parser.add_argument("--rate", type=int, default=1000, help="events per second (latency)")
    parser.add_argument("--seconds", type=float, default=40, help="how long to produce (latency)")
    parser.add_argument("--trigger", default="1 second", help="processing-time trigger (latency)")
    parser.add_argument("--read-from", choices=["broker", "files"], default="broker", help="source path (latency)")
    add_dir_argument(parser)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.what == "latency":
        bench_latency(args)
    else:
        bench_read(args)


if __name__ == "__main__":
    main()
