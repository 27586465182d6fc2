"""Page visits per page per 10-second window, on Spark, from a Kafka-compatible log (tidelog or Kafka).

    python examples/page_visits_pipeline.py --bootstrap-servers 127.0.0.1:9092 --out ./out

Events are JSON values `{"user": ..., "page": ..., "ts": ...}` in topic `page_visits`, keyed by user; the record
timestamp is the event time. A Structured Streaming query counts visits per page per 10-second window with a
5-second watermark and writes each finished window once (append mode) to topic `page_visits_per_window` and to
Parquet. Afterwards a batch read of `page_visits` gives the all-time top pages.

This file is what `tidelog demo` (`make demo`) runs; copy it as a starting point. Everything Spark-specific is
in the three functions below: `visit_counts` (the transformation), `start_pipeline` (source, sinks, query) and
`top_pages` (a batch read). Swap `{"kafka.bootstrap.servers": ...}` for `{"path": "/log/dir"}` to read the log's
segment files directly (no broker needed; executors read them in parallel from a shared filesystem).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

EVENTS_TOPIC = "page_visits"
COUNTS_TOPIC = "page_visits_per_window"
WINDOW = "10 seconds"
WATERMARK = "5 seconds"
VISIT_SCHEMA = "user string, page string, ts long"


def with_options(reader: Any, options: Mapping[str, str]) -> Any:
    """`path` becomes load()'s argument; everything else an option (the tidelog source takes both spellings)."""
    for key, value in options.items():
        if key != "path":
            reader = reader.option(key, value)
    return reader


def visit_counts(events: DataFrame) -> DataFrame:
    """Visits per page per window, from records with Kafka's schema whose values are JSON visits.

    Heartbeats (records without a page) only move the watermark; they are counted under a null page, which
    `start_pipeline` drops when it writes. (Filtering them out here would not work: Spark pushes a filter on the
    page below the watermark, and the heartbeat would never reach it.)"""
    visits = events.select(
        F.from_json(F.col("value").cast("string"), VISIT_SCHEMA).alias("visit"),
        F.col("timestamp").alias("event_time"),
    )
    return (
        visits.withWatermark("event_time", WATERMARK)  # windows close 5 s after the newest event passes their end
        .groupBy(F.window("event_time", WINDOW).alias("window"), F.col("visit.page").alias("page"))
        .count()
    )


def start_pipeline(
    spark: SparkSession,
    source: Mapping[str, str],
    sink: Mapping[str, str],
    parquet_dir: str,
    checkpoint_dir: str,
    *,
    trigger: Mapping[str, Any] | None = None,
    on_batch: Callable[[DataFrame, int], None] | None = None,
) -> StreamingQuery:
    """Start the streaming query: `source`/`sink` are tidelog options (a broker or a log directory)."""
    events = with_options(spark.readStream.format("tidelog"), source).option("subscribe", EVENTS_TOPIC)
    events = events.option("startingOffsets", "earliest").load(*([source["path"]] if "path" in source else []))
    counts = visit_counts(events)

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch = batch.where(F.col("page").isNotNull()).persist()
        try:
            results = batch.select(
                F.col("page").alias("key"),
                F.to_json(
                    F.struct(
                        F.col("page"),
                        F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
                        F.col("count"),
                    )
                ).alias("value"),
            )
            writer = with_options(results.write.format("tidelog").mode("append"), sink).option("topic", COUNTS_TOPIC)
            writer.save(*([sink["path"]] if "path" in sink else []))
            batch.select("window.start", "window.end", "page", "count").write.mode("append").parquet(parquet_dir)
            if on_batch is not None:
                on_batch(batch, batch_id)
        finally:
            batch.unpersist()

    writer = counts.writeStream.outputMode("append").foreachBatch(write_batch)
    writer = writer.option("checkpointLocation", checkpoint_dir).queryName("page_visits_per_window")
    return writer.trigger(**(trigger or {"processingTime": "2 seconds"})).start()


def top_pages(spark: SparkSession, source: Mapping[str, str], n: int = 5) -> list[tuple[str, int]]:
    """All-time visits per page from a batch read of the events topic."""
    events = with_options(spark.read.format("tidelog"), source).option("subscribe", EVENTS_TOPIC)
    events = events.load(*([source["path"]] if "path" in source else []))
    visits = events.select(F.from_json(F.col("value").cast("string"), VISIT_SCHEMA).alias("visit"))
    counts = visits.where(F.col("visit.page").isNotNull()).groupBy("visit.page").count()
    return [(row["page"], row["count"]) for row in counts.orderBy(F.desc("count"), "page").limit(n).collect()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="a Kafka-protocol broker (tidelog serve or Kafka)")
    parser.add_argument("--log-dir", help="or: read the log directory's files directly")
    parser.add_argument("--out", default="page-visits-out", help="Parquet output and checkpoint directory")
    parser.add_argument("--seconds", type=float, default=60, help="how long to run the streaming query")
    args = parser.parse_args()
    if not args.bootstrap_servers and not args.log_dir:
        parser.error("give --bootstrap-servers or --log-dir")
    import tidelog.spark

    spark = tidelog.spark.local_session("page-visits")
    source = {"path": args.log_dir} if args.log_dir else {"kafka.bootstrap.servers": args.bootstrap_servers}
    sink = dict(source)
    query = start_pipeline(spark, source, sink, f"{args.out}/windows.parquet", f"{args.out}/checkpoint")
    query.awaitTermination(args.seconds)
    query.stop()
    print(json.dumps(top_pages(spark, source)))
    spark.stop()


if __name__ == "__main__":
    main()
