"""`tidelog perf produce|consume`: kafka-producer-perf-test.sh and kafka-consumer-perf-test.sh, on confluent-kafka.

produce: --num-records records of --record-size bytes (one payload of random capital letters, as Kafka's tool
makes it) to --topic, at most --throughput records/s (-1: no limit; Kafka's ThroughputThrottler: sleep when ahead).
A record's latency runs from `produce()` to its delivery report. Every --reporting-interval ms it prints Kafka's
window line, and at the end Kafka's summary:

    N records sent, R records/sec (M MB/sec), A ms avg latency, X ms max latency, P ms 50th, ... 99.9th.

Percentiles come from every record's latency, sorted (index int(count x p), as Kafka's tool picks them from its
sample). A failed delivery is counted and makes the exit code 1.

consume: reads --messages records of --topic in group --group from the earliest offset (--from-latest: the
latest), stopping early after --timeout ms without a record (with Kafka's warning), and prints Kafka's header and
row: start/end time, MB and records consumed and per second, the rebalance time (subscribe to first assignment) and
the fetch time (the rest) with the rates over it. MB is 1024 x 1024 bytes of keys and values.

Both show a live progress bar (rich) on stderr when it is a terminal; the figures go to stdout.
"""

from __future__ import annotations

import random
import string
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from tidelog.errors import ToolError
from tidelog.tools.console import ClientErrors, cluster_metadata, new_client, reports_kafka_errors

USAGE = 2
MB = 1024 * 1024
PERCENTILES = (0.5, 0.95, 0.99, 0.999)
CONNECT_TIMEOUT_MS = 10_000


# --- produce -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProducePerfOptions:
    topic: str
    num_records: int
    record_size: int
    throughput: float  # records/s; <= 0 is no limit
    producer_props: dict[str, str] = field(default_factory=dict)
    bootstrap_server: str | None = None
    reporting_interval_ms: int = 5000

    def __post_init__(self) -> None:
        if self.num_records < 1:
            raise ToolError("--num-records must be positive", USAGE)
        if self.record_size < 0:
            raise ToolError("--record-size may not be negative", USAGE)
        if self.reporting_interval_ms < 1:
            raise ToolError("--reporting-interval must be positive", USAGE)
        if not self.bootstrap_server and "bootstrap.servers" not in self.producer_props:
            raise ToolError("give --bootstrap-server or --producer-props bootstrap.servers=...", USAGE)


class ProduceStats:
    """Kafka's ProducerPerformance.Stats: totals, a reporting window, and every latency for the percentiles."""

    def __init__(self, interval_ms: int, now: float) -> None:
        self.start = now
        self.interval_s = interval_ms / 1000
        self.count = 0
        self.bytes = 0
        self.latency_total_ms = 0.0
        self.latency_max_ms = 0.0
        self.latencies: list[float] = []
        self._window_start = now
        self._window: list[float] = []
        self._window_bytes = 0

    def record(self, latency_ms: float, size: int, now: float) -> str | None:
        """Count one delivered record; the window line when a reporting interval has passed."""
        self.count += 1
        self.bytes += size
        self.latency_total_ms += latency_ms
        self.latency_max_ms = max(self.latency_max_ms, latency_ms)
        self.latencies.append(latency_ms)
        self._window.append(latency_ms)
        self._window_bytes += size
        if now - self._window_start < self.interval_s:
            return None
        line = self._line(len(self._window), self._window_bytes, now - self._window_start, self._window)
        self._window_start, self._window, self._window_bytes = now, [], 0
        return line

    @staticmethod
    def _line(count: int, size: int, elapsed_s: float, latencies: list[float]) -> str:
        rate = count / elapsed_s if elapsed_s > 0 else 0.0
        mb = size / MB / elapsed_s if elapsed_s > 0 else 0.0
        avg = sum(latencies) / len(latencies) if latencies else 0.0
        return (
            f"{count} records sent, {rate:.1f} records/sec ({mb:.2f} MB/sec), {avg:.1f} ms avg latency, "
            f"{max(latencies, default=0.0):.1f} ms max latency."
        )

    def summary(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        ordered = sorted(self.latencies)
        p50, p95, p99, p999 = (int(ordered[int(len(ordered) * p)]) if ordered else 0 for p in PERCENTILES)
        avg = self.latency_total_ms / self.count if self.count else 0.0
        return (
            f"{self.count} records sent, {self.count / elapsed:f} records/sec "
            f"({self.bytes / MB / elapsed:.2f} MB/sec), "
            f"{avg:.2f} ms avg latency, {self.latency_max_ms:.2f} ms max latency, {p50} ms 50th, {p95} ms 95th, "
            f"{p99} ms 99th, {p999} ms 99.9th."
        )


class Throttler:
    """Kafka's ThroughputThrottler: after each send, sleep while the rate since the start is above the target."""

    def __init__(self, target_per_s: float, start: float) -> None:
        self.target = target_per_s
        self.start = start

    def wait(self, sent: int, now: float, sleep: Callable[[float], None] = time.sleep) -> None:
        if self.target <= 0:
            return
        ahead = sent / self.target - (now - self.start)
        if ahead > 0:
            sleep(ahead)


@contextmanager
def _progress(total: int, what: str) -> Iterator[tuple[Progress, TaskID]]:
    console = Console(stderr=True)
    progress = Progress(
        TextColumn(f"[bold]{what}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    with progress:
        yield progress, progress.add_task(what, total=total, rate="")


@reports_kafka_errors
def produce_perf(options: ProducePerfOptions) -> int:
    errors = ClientErrors()
    config: dict[str, Any] = {"client.id": "tidelog-producer-perf", "error_cb": errors, "log_level": 0}
    if options.bootstrap_server:
        config["bootstrap.servers"] = options.bootstrap_server
    config.update(options.producer_props)
    producer = new_client(Producer, config)
    cluster_metadata(producer, str(config["bootstrap.servers"]), CONNECT_TIMEOUT_MS, errors, options.topic)
    payload = "".join(random.choices(string.ascii_uppercase, k=options.record_size)).encode()
    start = time.monotonic()
    stats = ProduceStats(options.reporting_interval_ms, start)
    throttler = Throttler(options.throughput, start)
    failures: list[str] = []

    def delivered(sent_at: float) -> Callable[[KafkaError | None, Message], None]:
        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                failures.append(error.str())
                return
            now = time.monotonic()
            line = stats.record((now - sent_at) * 1000, len(message.value() or b""), now)
            if line:
                print(line, flush=True)

        return report

    with _progress(options.num_records, "producing") as (progress, task):
        for sent in range(options.num_records):
            while True:
                try:
                    producer.produce(options.topic, payload, on_delivery=delivered(time.monotonic()))
                    break
                except BufferError:  # the local queue is full: serve delivery reports until there is room
                    producer.poll(0.05)
            producer.poll(0)
            throttler.wait(sent + 1, time.monotonic())
            if sent % 1000 == 0:
                progress.update(task, completed=stats.count, rate=_rate(stats.count, start))
        while len(producer) > 0:
            producer.flush(0.1)
            progress.update(task, completed=stats.count, rate=_rate(stats.count, start))
    print(stats.summary(time.monotonic()))
    if failures:
        raise ToolError(f"{len(failures)} of {options.num_records} records failed: {failures[-1]}")
    return 0


def _rate(count: int, start: float) -> str:
    elapsed = time.monotonic() - start
    return f"{count / elapsed:,.0f} records/s" if elapsed > 0 else ""


# --- consume -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumePerfOptions:
    bootstrap_server: str
    topic: str
    messages: int
    group: str | None = None
    timeout_ms: int = 10_000
    from_latest: bool = False
    hide_header: bool = False
    consumer_props: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.messages < 1:
            raise ToolError("--messages must be positive", USAGE)
        if self.timeout_ms < 1:
            raise ToolError("--timeout must be positive", USAGE)


CONSUME_HEADER = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, "
    "fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
)


def kafka_time(epoch_s: float) -> str:
    """Kafka's `yyyy-MM-dd HH:mm:ss:SSS` (local time)."""
    moment = datetime.fromtimestamp(epoch_s)
    return moment.strftime("%Y-%m-%d %H:%M:%S:") + f"{moment.microsecond // 1000:03d}"


def consume_row(start_s: float, end_s: float, size: int, count: int, rebalance_ms: int) -> str:
    elapsed = max(end_s - start_s, 1e-9)
    fetch_ms = int((end_s - start_s) * 1000) - rebalance_ms
    fetch_s = fetch_ms / 1000
    mb = size / MB
    fetch_mb = mb / fetch_s if fetch_s > 0 else 0.0
    fetch_rate = count / fetch_s if fetch_s > 0 else 0.0
    return (
        f"{kafka_time(start_s)}, {kafka_time(end_s)}, {mb:.4f}, {mb / elapsed:.4f}, {count}, {count / elapsed:.4f}, "
        f"{rebalance_ms}, {fetch_ms}, {fetch_mb:.4f}, {fetch_rate:.4f}"
    )


@reports_kafka_errors
def consume_perf(options: ConsumePerfOptions) -> int:
    errors = ClientErrors()
    assigned_at: list[float] = []
    config: dict[str, Any] = {
        "bootstrap.servers": options.bootstrap_server,
        "group.id": options.group or f"perf-consumer-{uuid.uuid4().int % 100000}",
        "client.id": "tidelog-consumer-perf",
        "auto.offset.reset": "latest" if options.from_latest else "earliest",
        "enable.auto.commit": True,
        "error_cb": errors,
        "log_level": 0,
        **options.consumer_props,
    }
    consumer = new_client(Consumer, config)
    try:
        cluster_metadata(consumer, options.bootstrap_server, CONNECT_TIMEOUT_MS, errors, options.topic)
        wall_start, start = time.time(), time.monotonic()
        consumer.subscribe(
            [options.topic], on_assign=lambda _consumer, _partitions: assigned_at.append(time.monotonic())
        )
        count, size, last_record = 0, 0, start
        with _progress(options.messages, "consuming") as (progress, task):
            while count < options.messages:
                batch = consumer.consume(min(500, options.messages - count), timeout=0.2)
                now = time.monotonic()
                for message in batch:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise ToolError(f"consuming failed: {error.str()}")
                    count += 1
                    size += len(message.value() or b"") + len(message.key() or b"")
                if batch:
                    last_record = now
                    progress.update(task, completed=count, rate=_rate(count, start))
                elif now - last_record > options.timeout_ms / 1000:
                    print(
                        "WARNING: Exiting before consuming the expected number of messages: timeout "
                        f"({options.timeout_ms} ms) exceeded. You can use the --timeout option to increase the timeout."
                    )
                    break
        end = time.monotonic()
    finally:
        consumer.close()
    rebalance_ms = int((assigned_at[0] - start) * 1000) if assigned_at else 0
    if not options.hide_header:
        print(CONSUME_HEADER)
    print(consume_row(wall_start, wall_start + (end - start), size, count, rebalance_ms))
    return 0


def parse_props(items: list[str], option: str) -> dict[str, str]:
    """`--producer-props a=1 b=2` (Kafka's form: several KEY=VALUE after one option)."""
    props: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ToolError(f"{option} {item!r}: expected KEY=VALUE", USAGE)
        props[key] = value
    return props
