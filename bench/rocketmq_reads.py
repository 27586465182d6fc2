"""Consuming from the RocketMQ engine against the Kafka engine, embedded and through the broker, in one run.

    .venv/bin/python bench/rocketmq_reads.py                      # 1,000,000 records of 100 B and 200,000 of 1 KiB
    .venv/bin/python bench/rocketmq_reads.py --quick              # a smoke test (about 1 minute)
    .venv/bin/python bench/rocketmq_reads.py --write-report       # also write its section of docs/benchmarks.md

The Kafka engine answers a read with file slices that the broker sends with sendfile; the RocketMQ engine stores each
record as a CommitLog message and rebuilds Kafka batches from the messages on every read
(codec/rocketmq_batches.py). Both engines get the same batches: --batch-records records each, a text key and a
random value of --value-bytes (100 and 1,024 by default), CreateTime.

  embedded  each engine opened in this process (tidelog.open), the records appended to a 1-partition topic, then
            consumed from the first offset to the last with the embedded API's `consume` (StorageEngine.consume:
            every record handed to the caller as a Record, as a consumer of the library gets them: "embedded
            consume"), and read with Partition.read(offset, 1 MiB) and read_bytes() (the bytes alone: a pread of
            the Kafka engine's slices, the rebuilt batches of the RocketMQ engine: "embedded read"). Also the
            RocketMQ rebuild alone over the same messages (rebuild_batches on runs of 10,000, the messages already
            in memory) three ways: compiled (codec/_rocketmq_rebuild.c, what a read uses when the package was
            built with a C compiler), column-wise with numpy (without one), and record by record (`per_record`,
            the way every read went before either), to show what each bought.
  broker    `tidelog serve` with each engine (a fresh process and log dir each), the records produced by
            confluent-kafka (librdkafka, acks=1) to a 1-partition topic, then a confluent-kafka consumer assigns
            the partition from the beginning and reads to its end. Records/s of the consumer and the broker's CPU
            seconds per million records (utime + stime from /proc/<pid>/stat). The RocketMQ engine once more with
            its read-ahead off (tidelog.rocketmq.readAheadQueues=0), to show what it buys.

Each measurement runs --repetitions times (3), the engines interleaved inside each repetition; the medians are
reported. Target (issue 17): consume from the RocketMQ engine at least 70 % of the Kafka engine's, both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import tidelog
from benchutil import (
    BENCHMARKS_MD,
    REPO,
    MiB,
    add_dir_argument,
    console,
    machine_line,
    median,
    new_table,
    percent,
    print_machine,
    scratch_dir,
    source_revision,
    write_doc_section,
)
from tidelog import Record
from tidelog.codec import rocketmq_batches
from tidelog.codec.record_batch import build_batch
from tidelog.codec.rocketmq_batches import rebuild_batches
from tidelog.storage.api import StorageEngine
from tidelog.storage.rocketmq.engine import RocketMQEngine

SECTION_HEADING = "## Consuming from the RocketMQ engine"
ENGINES = ("kafka", "rocketmq")
ROCKETMQ_SETTINGS = {  # the benchmark's scratch disk may be fuller than RocketMQ's defaults allow
    "tidelog.rocketmq.diskMaxUsedSpaceRatio": "95",
    "tidelog.rocketmq.diskSpaceCleanForciblyRatio": "95",
    "tidelog.rocketmq.diskSpaceWarningLevelRatio": "99",
}
READ_BYTES = MiB
SPREAD_TOPIC = "spread"
NO_READ_AHEAD = ", without read-ahead"  # the same consumer, the engine's read-ahead turned off
KCAT_CONSUMERS = 4
KCAT_SUFFIX = f", {KCAT_CONSUMERS} kcat on {KCAT_CONSUMERS} partitions"
TARGET = 0.7  # issue 17: consume from the RocketMQ engine at least 70 % of the Kafka engine's
REBUILD_RUN = 10_000  # messages per rebuild_batches call of the codec-only rows
CLK_TCK = os.sysconf("SC_CLK_TCK")


def engine_settings(engine: str) -> dict[str, str]:
    return {"tidelog.storage.engine": engine, **(ROCKETMQ_SETTINGS if engine == "rocketmq" else {})}


def make_batches(records: int, per_batch: int, value_bytes: int) -> list[bytes]:
    now = int(time.time() * 1000)
    batches = []
    for first in range(0, records, per_batch):
        count = min(per_batch, records - first)
        batch = [Record(os.urandom(value_bytes), key=b"key-%d" % (first + i), timestamp_ms=now) for i in range(count)]
        batches.append(build_batch(batch))
    return batches


# --- embedded --------------------------------------------------------------------------------------------------


def fill_engine(directory: Path, engine_name: str, batches: list[bytes], records: int) -> StorageEngine:
    config = ROCKETMQ_SETTINGS if engine_name == "rocketmq" else {}
    engine = tidelog.open(directory, engine=engine_name, config=config)
    engine.create_topic("t", partitions=1)
    for batch in batches:
        engine.append("t", 0, batch)
    engine.flush()
    partition = engine.partition("t", 0)
    deadline = time.monotonic() + 120
    while partition.high_watermark < records:  # the RocketMQ dispatcher makes appends readable
        if time.monotonic() > deadline:
            raise RuntimeError(f"{engine_name}: only {partition.high_watermark} of {records} records readable")
        time.sleep(0.01)
    return engine


def read_all(engine: StorageEngine, records: int) -> float:
    """Seconds to read the partition from its first offset to its last, bytes in hand."""
    partition = engine.partition("t", 0)
    offset = 0
    start = time.perf_counter()
    while offset < records:
        data = partition.read(offset, READ_BYTES).read_bytes()
        offset = last_offset(data) + 1
    return time.perf_counter() - start


def consume_all(engine: StorageEngine, records: int) -> float:
    """Seconds for the embedded API's consume to hand every record of the partition to the caller."""
    start = time.perf_counter()
    seen = sum(1 for _ in engine.consume("t", 0))
    took = time.perf_counter() - start
    if seen != records:
        raise RuntimeError(f"consume gave {seen} of {records} records")
    return took


def last_offset(data: bytes) -> int:
    """The last offset of the last whole batch in `data` (base offset + last offset delta)."""
    position, last = 0, -1
    while position + 61 <= len(data):
        length = int.from_bytes(data[position + 8 : position + 12], "big")
        last = int.from_bytes(data[position : position + 8], "big") + int.from_bytes(
            data[position + 23 : position + 27], "big"
        )
        position += 12 + length
    return last


def rebuild_only(engine: RocketMQEngine, records: int, way: str) -> float:
    """Seconds for the codec alone to rebuild every message (runs of REBUILD_RUN, bytes already read), `way`:
    "compiled" (as a read does when the package was built with a C compiler), "numpy" (without it) or "record"
    (record by record)."""
    queue = engine.partition("t", 0)
    runs = []
    for first in range(0, records, REBUILD_RUN):
        units = queue.consume_queue.unit_array(first, min(REBUILD_RUN, records - first))  # type: ignore[attr-defined]
        data, positions, covered = engine.read_runs(units["offset"].astype(np.int64), units["size"])
        runs.append((data, positions, units["size"][:covered], first))
    compiled = rocketmq_batches.compiled_rebuild
    if way == "compiled" and compiled is None:
        raise RuntimeError("tidelog.codec._rocketmq_rebuild is not built (pip install -e . with a C compiler)")
    if way != "compiled":
        rocketmq_batches.compiled_rebuild = None
    try:
        start = time.perf_counter()
        for data, positions, sizes, first in runs:
            rebuild_batches(data, positions, sizes, first, 1 << 40, per_record=way == "record")
        return time.perf_counter() - start
    finally:
        rocketmq_batches.compiled_rebuild = compiled


# --- through the broker ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def broker(directory: Path, engine: str, extra: dict[str, str] | None = None) -> Iterator[tuple[int, int]]:
    """`tidelog serve` with the engine (and `extra` settings): (port, pid); SIGKILL at the end (its data is
    scratch)."""
    directory.mkdir(parents=True)
    argv = [sys.executable, "-m", "tidelog.cli", "serve"]
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0",
        "log.dirs": str(directory / "logs"),
        **engine_settings(engine),
        **(extra or {}),
    }
    for key, value in settings.items():
        argv += ["--override", f"{key}={value}"]
    with (directory / "broker.err").open("wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        found = re.search(r"ready on port\(s\) (\d+)", line)
        if not found:
            raise RuntimeError(f"the {engine} broker did not start: {line!r} {(directory / 'broker.err').read_text()}")
        yield int(found[1]), proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def produce(port: int, records: int, value_bytes: int, topic: str = "t") -> None:
    """The records to `topic` (SPREAD_TOPIC: created with KCAT_CONSUMERS partitions, filled in turn)."""
    bootstrap = f"127.0.0.1:{port}"
    partitions = 1
    if topic == SPREAD_TOPIC:
        partitions = KCAT_CONSUMERS
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer: it is the handle
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5})
    value = os.urandom(value_bytes)
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, key=b"key-%d" % i, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("records left unacknowledged after 120 s")


def consume(port: int, records: int, pid: int) -> tuple[float, float]:
    """(seconds, broker CPU seconds) for a consumer to read the partition from its start to `records`."""
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,  # default 1000: a 1 s pause whenever the prefetch queue is full
        }
    )
    consumer.list_topics("t", timeout=30)  # connected before the clock starts
    consumer.assign([TopicPartition("t", 0, 0)])
    seen = 0
    cpu = cpu_seconds(pid)
    start = time.perf_counter()
    deadline = start + 600
    while seen < records:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"only {seen} of {records} records consumed in 600 s")
        for message in consumer.consume(10_000, 1.0):
            if message.error() is None:
                seen += 1
    seconds = time.perf_counter() - start
    cpu = cpu_seconds(pid) - cpu
    consumer.close()
    return seconds, cpu


def consume_with_kcat(port: int, records: int, pid: int) -> tuple[float, float]:
    """(seconds, broker CPU seconds) for KCAT_CONSUMERS kcat processes, one per partition of SPREAD_TOPIC, to read
    it from the beginning to its end (kcat -e): several clients, so that the broker rather than one client sets
    the pace."""
    cpu = cpu_seconds(pid)
    start = time.perf_counter()
    readers = [
        subprocess.Popen(
            ["kcat", "-C", "-b", f"127.0.0.1:{port}", "-t", SPREAD_TOPIC, "-p", str(p), "-o", "beginning", "-e",
             "-q", "-f", "%o\\n", "-X", "fetch.wait.max.ms=50"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for p in range(KCAT_CONSUMERS)
    ]  # fmt: skip
    seen = 0
    for reader in readers:
        out, _ = reader.communicate(timeout=600)
        seen += out.count(b"\n")
    seconds = time.perf_counter() - start
    cpu = cpu_seconds(pid) - cpu
    if seen != records:
        raise RuntimeError(f"the kcat consumers read {seen} of {records} records")
    return seconds, cpu


# --- the run ----------------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, scratch: Path) -> tuple[list[list[str]], list[str], list[str]]:
    rows: list[list[str]] = []
    verdicts: list[str] = []
    summaries: list[str] = []
    for value_bytes, records in zip(args.value_bytes, args.records, strict=True):
        batches = make_batches(records, args.batch_records, value_bytes)
        seconds: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}

        def add(name: str, value: float, store: dict[str, list[float]] = seconds) -> None:
            store.setdefault(name, []).append(value)

        for rep in range(args.repetitions):
            for engine_name in ENGINES:
                with console.status(f"{value_bytes} B, repetition {rep + 1}: {engine_name} embedded …"):
                    directory = scratch / f"e-{value_bytes}-{rep}-{engine_name}"
                    engine = fill_engine(directory, engine_name, batches, records)
                    try:
                        add(f"embedded consume {engine_name}", consume_all(engine, records))
                        add(f"embedded read {engine_name}", read_all(engine, records))
                        if isinstance(engine, RocketMQEngine):
                            add("rebuild compiled", rebuild_only(engine, records, "compiled"))
                            add("rebuild column-wise (numpy)", rebuild_only(engine, records, "numpy"))
                            add("rebuild record by record", rebuild_only(engine, records, "record"))
                    finally:
                        engine.close()
            for engine_name in ENGINES:
                status = console.status(f"{value_bytes} B, repetition {rep + 1}: {engine_name} broker …")
                directory = scratch / f"b-{value_bytes}-{rep}-{engine_name}"
                with status, broker(directory, engine_name) as (port, pid):
                    produce(port, records, value_bytes)
                    took, used = consume(port, records, pid)
                    add(f"broker {engine_name}", took)
                    add(f"broker {engine_name}", used, cpu)
                    name = f"broker {engine_name}{KCAT_SUFFIX}"
                    produce(port, records, value_bytes, topic=SPREAD_TOPIC)
                    took, used = consume_with_kcat(port, records, pid)
                    add(name, took)
                    add(name, used, cpu)
            status = console.status(f"{value_bytes} B, repetition {rep + 1}: rocketmq broker without read-ahead …")
            directory = scratch / f"b-{value_bytes}-{rep}-rocketmq-plain"
            with status, broker(directory, "rocketmq", {"tidelog.rocketmq.readAheadQueues": "0"}) as (port, pid):
                produce(port, records, value_bytes)
                took, used = consume(port, records, pid)
                add(f"broker rocketmq{NO_READ_AHEAD}", took)
                add(f"broker rocketmq{NO_READ_AHEAD}", used, cpu)
        rate = {name: records / median(values) for name, values in seconds.items()}
        for name in seconds:
            if name.startswith("embedded consume"):
                reference = rate["embedded consume kafka"]
            elif name.startswith(("embedded read", "rebuild")):
                reference = rate["embedded read kafka"]
            else:
                reference = rate[name.replace("rocketmq", "kafka").removesuffix(NO_READ_AHEAD)]
            broker_cpu = f"{median(cpu[name]) / records * 1e6:.1f}" if name in cpu else ""
            rows.append(
                [
                    f"{value_bytes} B",
                    name,
                    f"{rate[name]:,.0f}",
                    f"{rate[name] * value_bytes / 1e6:,.1f}",
                    percent(rate[name], reference),
                    broker_cpu,
                ]
            )
        for way, suffix in (("embedded consume", ""), ("broker", ""), ("broker", KCAT_SUFFIX), ("embedded read", "")):
            share = rate[f"{way} rocketmq{suffix}"] / rate[f"{way} kafka{suffix}"]
            verdict = "met" if share >= TARGET else "**missed**"
            target = f">= {TARGET:.0%} of the Kafka engine"
            if way == "embedded read":  # bytes only: a rebuild against a pread (see "Reading the table")
                target = "none (a rebuild of every record against a copy of stored bytes)"
                verdict = "-"
            verdicts.append(f"| {value_bytes} B, {way}{suffix} | {target} | {share:.0%} | {verdict} |")
        summaries.append(
            f"{value_bytes} B: embedded consume "
            f"{percent(rate['embedded consume rocketmq'], rate['embedded consume kafka'])} (read "
            f"{percent(rate['embedded read rocketmq'], rate['embedded read kafka'])}), "
            f"broker {percent(rate['broker rocketmq'], rate['broker kafka'])} of the Kafka engine; the compiled "
            f"rebuild {rate['rebuild compiled'] / rate['rebuild column-wise (numpy)']:.1f}x the numpy one, "
            f"{rate['rebuild compiled'] / rate['rebuild record by record']:.1f}x the record-by-record one"
        )
    return rows, verdicts, summaries


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 and 20,000 records, 1 repetition")
    parser.add_argument("--value-bytes", default="100,1024", help="value sizes, comma-separated (default 100,1024)")
    parser.add_argument("--records", help="records per value size, comma-separated (default 1000000,200000)")
    parser.add_argument("--batch-records", type=int, default=1000, help="records per batch (default 1000)")
    parser.add_argument("--repetitions", type=int, help="repetitions (default 3; quick 1)")
    parser.add_argument("--write-report", action="store_true", help=f"write its section of {BENCHMARKS_MD.name}")
    add_dir_argument(parser)
    args = parser.parse_args(argv)
    args.value_bytes = [int(v) for v in args.value_bytes.split(",")]
    default_records = "100000,20000" if args.quick else "1000000,200000"
    args.records = [int(v) for v in (args.records or default_records).split(",")]
    if len(args.records) != len(args.value_bytes):
        parser.error("--records needs one count per --value-bytes")
    args.repetitions = args.repetitions or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python bench/rocketmq_reads.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    started, load = time.strftime("%Y-%m-%d %H:%M %Z"), ", ".join(f"{x:.1f}" for x in os.getloadavg())
    revision = source_revision()
    needed = sum(r * (v + 200) for r, v in zip(args.records, args.value_bytes, strict=True)) * 4 * args.repetitions
    with scratch_dir(args.dir, needed, "tidelog-rocketmq-reads-") as scratch:
        print_machine(scratch)
        rows, verdicts, summaries = measure(args, scratch)
    columns = ("values", "reader", "records/s", "MB/s", "vs the Kafka engine", "broker CPU µs/record")
    table = new_table("Consume, medians of the repetitions", *columns)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for line in summaries:
        console.print(f"[bold]summary[/] {line}")
    if args.write_report:
        markdown_rows = "\n".join("| " + " | ".join(row) + " |" for row in rows)
        section = f"""{SECTION_HEADING}

```
make bench-rocketmq-reads     # = .venv/bin/python bench/rocketmq_reads.py --write-report
```

How each row is measured is in the docstring of `bench/rocketmq_reads.py`. Command: `{command}`, run {started};
tidelog {revision}. Machine: {machine_line()}. Load average {load} at the start.

| test | target | measured | met |
|---|---|---|---|
{chr(10).join(verdicts)}

| {" | ".join(columns)} |
|{"---|" * len(columns)}
{markdown_rows}

Reading the table: the Kafka engine's reads cost the broker almost nothing per record (file slices sent with
sendfile), so its consume rows measure the clients; the RocketMQ engine's broker spends the CPU of the rebuild on
every record (the last column), so its rows measure the broker. Through the broker the rebuild of a consumer's
next range runs while the last one travels and is parsed (the engine's read-ahead, storage/rocketmq/read_ahead.py),
so a consumer waits for the rebuild only where it costs more than the client's own work per record; embedded, the
reader asks for the next range at once and waits for all of it. A ratio against a client-bound reference says as
much about the client as about the engine (4 kcat processes printing every offset are slower than one
confluent-kafka consumer at 100 B); the broker CPU per record compares the engines directly. "rebuild
record by record" is the way every RocketMQ read worked before codec/rocketmq_batches.py, "rebuild column-wise
(numpy)" the way they work where the package was installed without a C compiler. "embedded consume" is the
library's consumer (records handed out one by one, as a client's poll loop gets them), the embedded counterpart of
the broker rows; "embedded read" compares the rebuild of every record with the Kafka engine's one `pread` of
bytes already laid out as Kafka batches (1 MiB in tens of microseconds, a memory copy): no store that keeps
RocketMQ's CommitLog byte for byte (values between message headers and properties) can return Kafka batches
without touching every record, so that ratio is a measure of the rebuild against a copy, with no target.
"""
        action = write_doc_section(BENCHMARKS_MD, SECTION_HEADING, section)
        console.print(f"{action} the section “{SECTION_HEADING[3:]}” in {BENCHMARKS_MD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
