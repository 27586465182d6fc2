"""Soak: 200+ concurrent client connections producing and consuming against one real `tidelog serve`.

Most connections are cheap asyncio clients (wire_client.py: one socket each, requests built with tidelog.protocol):
producers append acks=all batches to every partition, tail consumers long-poll each partition from offset 0. Real
librdkafka producers and a librdkafka consumer group run alongside. For a bounded time (30 s in `make test`,
10 minutes in `make soak-long`) the broker's resident memory (VmRSS of /proc/<pid>/status) and its open file
descriptors (/proc/<pid>/fd) are sampled twice a second. The run passes when:
- no client saw an error (produce, fetch, delivery report, consumer error, a dropped connection);
- every tail consumer read exactly the records the producers were acknowledged for, offset by offset, and the
  consumer group consumed every acknowledged record (duplicates from rebalances are counted, not failed);
- at least 200 client connections were open at the same time (the broker's sockets beyond those open at rest);
- memory stayed flat: the mean VmRSS of the last third of the samples is within 10% and within 8 MiB of the first
  third's (the broker is 50-70 MiB; it moves well under 1% in a run);
- descriptors stayed bounded during the run and returned to the baseline once the clients left;
- the broker logged no error.
The figures are printed (run pytest with -s to see them) and recorded in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from wire_client import WireClient

from tidelog.codec.record_batch import Record

TOPIC = "soak"
PARTITIONS = 8
SHORT_SECONDS = float(os.environ.get("TIDELOG_SOAK_SECONDS", "30"))
LONG_SECONDS = 600.0
MEMORY_GROWTH_MAX_PCT = 10.0  # both bounds hold: growth <= 10% of the first third's VmRSS and <= 8 MiB
MEMORY_GROWTH_MAX_MIB = 8.0


@dataclass
class SoakConfig:
    seconds: float
    raw_producers: int = 110
    raw_consumers: int = 80
    rdkafka_producers: int = 10
    rdkafka_consumers: int = 10
    batch_records: int = 5
    raw_produce_interval_s: float = 1.0  # per raw producer: one acks=all batch a second
    rdkafka_rate_per_s: int = 50  # per librdkafka producer


@dataclass
class Sample:
    t: float
    rss_kib: int
    rss_anon_kib: int
    fds: int
    sockets: int


@dataclass
class SoakResult:
    errors: list[str] = field(default_factory=list)
    acknowledged: dict[int, dict[int, bytes]] = field(default_factory=lambda: defaultdict(dict))  # partition -> off
    tail_reads: list[tuple[int, dict[int, bytes]]] = field(default_factory=list)  # (partition, offset -> value)
    group_values: Counter[bytes] = field(default_factory=Counter)
    samples: list[Sample] = field(default_factory=list)
    baseline_fds: int = 0
    baseline_sockets: int = 0  # at rest: the listener and the event loop's self-pipe
    final_fds: int = 0
    load_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, message: str) -> None:
        with self.lock:
            if len(self.errors) < 50:
                self.errors.append(message)

    def acknowledge(self, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            self.acknowledged[partition][offset] = value


# --- measuring the broker ---------------------------------------------------------------------------------------


def sample(pid: int, t0: float) -> Sample:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    fds = sockets = 0
    for entry in os.scandir(f"/proc/{pid}/fd"):
        fds += 1
        with contextlib.suppress(FileNotFoundError):  # closed while we looked
            sockets += os.readlink(entry.path).startswith("socket:")
    kib = lambda key: int(status[key].split()[0])  # noqa: E731
    return Sample(time.monotonic() - t0, kib("VmRSS"), kib("RssAnon"), fds, sockets)


def sampler(pid: int, t0: float, result: SoakResult, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        try:
            result.samples.append(sample(pid, t0))
        except (FileNotFoundError, ProcessLookupError):
            result.error("the broker process is gone")
            return


# --- the clients ------------------------------------------------------------------------------------------------


async def raw_producer(port: int, index: int, deadline: float, config: SoakConfig, result: SoakResult) -> None:
    client = await WireClient.connect("127.0.0.1", port, f"soak-raw-producer-{index}")
    partition = index % PARTITIONS
    sequence = 0
    await asyncio.sleep(random.uniform(0, config.raw_produce_interval_s))  # spread the producers out
    try:
        while time.monotonic() < deadline:
            values = [b"raw-%d-%d" % (index, sequence + i) for i in range(config.batch_records)]
            sequence += len(values)
            base = await client.produce(TOPIC, partition, [Record(v, None, int(time.time() * 1000)) for v in values])
            for i, value in enumerate(values):
                result.acknowledge(partition, base + i, value)
            await asyncio.sleep(config.raw_produce_interval_s)
    except Exception as exc:
        result.error(f"raw producer {index}: {exc!r}")
    finally:
        await client.close()


async def raw_tail_consumer(
    port: int, index: int, producing: asyncio.Event, ends: dict[int, int], result: SoakResult
) -> None:
    """Follows one partition from offset 0; once producing is over, reads up to the final end offset."""
    client = await WireClient.connect("127.0.0.1", port, f"soak-raw-consumer-{index}")
    partition = index % PARTITIONS
    seen: dict[int, bytes] = {}
    offset = 0
    try:
        while producing.is_set() or offset < ends.get(partition, 0):
            for record in await client.fetch(TOPIC, partition, offset, max_wait_ms=500):
                if record.offset != offset:
                    raise AssertionError(f"partition {partition}: offset {record.offset} where {offset} was next")
                seen[offset] = record.value or b""
                offset += 1
        result.tail_reads.append((partition, seen))
    except Exception as exc:
        result.error(f"tail consumer {index} (partition {partition}, at offset {offset}): {exc!r}")
    finally:
        await client.close()


def rdkafka_producer(bootstrap: str, index: int, deadline: float, config: SoakConfig, result: SoakResult) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "client.id": f"soak-rdkafka-{index}"}
    )

    def report(err: KafkaError | None, msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            result.error(f"librdkafka producer {index}: {err}")
        else:
            result.acknowledge(msg.partition(), msg.offset(), msg.value())

    sequence = 0
    interval = 1 / config.rdkafka_rate_per_s
    while time.monotonic() < deadline:
        producer.produce(TOPIC, value=b"rdkafka-%d-%d" % (index, sequence), key=b"%d" % sequence, on_delivery=report)
        sequence += 1
        producer.poll(interval)
    if producer.flush(60) != 0:
        result.error(f"librdkafka producer {index}: messages left undelivered")


def rdkafka_consumer(bootstrap: str, index: int, done: threading.Event, result: SoakResult) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "soak-group",
            "auto.offset.reset": "earliest",
            "client.id": f"soak-rdkafka-consumer-{index}",
            "session.timeout.ms": 30_000,
        }
    )
    consumer.subscribe([TOPIC])
    try:
        while not done.is_set():
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is not None:
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        result.error(f"librdkafka consumer {index}: {msg.error()}")
                    continue
                with result.lock:
                    result.group_values[msg.value()] += 1
    finally:
        consumer.close()


# --- the run ----------------------------------------------------------------------------------------------------


async def drive(broker, config: SoakConfig, result: SoakResult) -> None:  # type: ignore[no-untyped-def]
    port = broker.port
    t0 = time.monotonic()
    stop_sampling = threading.Event()
    sampling = threading.Thread(target=sampler, args=(broker.pid, t0, result, stop_sampling), daemon=True)
    group_done = threading.Event()
    consumers = [
        threading.Thread(target=rdkafka_consumer, args=(broker.bootstrap, i, group_done, result), daemon=True)
        for i in range(config.rdkafka_consumers)
    ]
    for thread in consumers:
        thread.start()
    producing = asyncio.Event()
    producing.set()
    ends: dict[int, int] = {}
    tails = [
        asyncio.create_task(raw_tail_consumer(port, i, producing, ends, result)) for i in range(config.raw_consumers)
    ]
    deadline = time.monotonic() + config.seconds
    sampling.start()
    load_started = time.monotonic()
    rdkafka = [
        asyncio.create_task(asyncio.to_thread(rdkafka_producer, broker.bootstrap, i, deadline, config, result))
        for i in range(config.rdkafka_producers)
    ]
    raw = [asyncio.create_task(raw_producer(port, i, deadline, config, result)) for i in range(config.raw_producers)]
    await asyncio.gather(*raw, *rdkafka)
    result.load_seconds = time.monotonic() - load_started
    stop_sampling.set()
    sampling.join()
    with result.lock:
        for partition, offsets in result.acknowledged.items():
            ends[partition] = max(offsets) + 1
    producing.clear()
    await asyncio.wait_for(asyncio.gather(*tails), timeout=120)
    expected = Counter(v for offsets in result.acknowledged.values() for v in offsets.values())
    drain_deadline = time.monotonic() + 120
    while time.monotonic() < drain_deadline:
        with result.lock:
            if all(result.group_values[v] for v in expected):
                break
        await asyncio.sleep(0.5)
    group_done.set()
    await asyncio.to_thread(lambda: [t.join(60) for t in consumers])


def run_soak(broker, config: SoakConfig) -> SoakResult:  # type: ignore[no-untyped-def]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)], request_timeout=15).values():
        future.result(timeout=30)
    del admin
    time.sleep(1)  # let the admin client's connections close before the baseline is taken
    result = SoakResult()
    at_rest = sample(broker.pid, 0)
    result.baseline_fds, result.baseline_sockets = at_rest.fds, at_rest.sockets
    asyncio.run(drive(broker, config, result))
    settle = time.monotonic() + 20  # clients are gone: the broker should give their descriptors back
    while True:
        result.final_fds = sample(broker.pid, 0).fds
        if result.final_fds <= result.baseline_fds + 2 or time.monotonic() > settle:
            break
        time.sleep(0.5)
    return result


def report(result: SoakResult, config: SoakConfig) -> dict[str, float]:
    samples = result.samples
    third = max(1, len(samples) // 3)
    first = statistics.mean(s.rss_kib for s in samples[:third])
    last = statistics.mean(s.rss_kib for s in samples[-third:])
    anon_first = statistics.mean(s.rss_anon_kib for s in samples[:third])
    anon_last = statistics.mean(s.rss_anon_kib for s in samples[-third:])
    records = sum(len(v) for v in result.acknowledged.values())
    figures = {
        "seconds": result.load_seconds,
        "peak_client_sockets": max(s.sockets for s in samples) - result.baseline_sockets,
        "records": records,
        "records_per_s": records / result.load_seconds,
        "rss_first_mib": first / 1024,
        "rss_last_mib": last / 1024,
        "rss_growth_pct": 100 * (last - first) / first,
        "rss_anon_growth_pct": 100 * (anon_last - anon_first) / anon_first,
        "fds_baseline": result.baseline_fds,
        "fds_peak": max(s.fds for s in samples),
        "fds_after": result.final_fds,
        "group_duplicates": sum(n - 1 for n in result.group_values.values() if n > 1),
    }
    print(
        f"\nsoak {figures['seconds']:.0f} s: {config.raw_producers}+{config.raw_consumers} raw clients, "
        f"{config.rdkafka_producers}+{config.rdkafka_consumers} librdkafka clients, "
        f"peak {figures['peak_client_sockets']:.0f} client connections ({result.baseline_sockets} sockets at rest)\n"
        f"  {records:,} records acknowledged and consumed ({figures['records_per_s']:,.0f}/s), "
        f"{len(result.errors)} errors, {figures['group_duplicates']:.0f} group re-deliveries\n"
        f"  VmRSS first third {first / 1024:.1f} MiB, last third {last / 1024:.1f} MiB: "
        f"{figures['rss_growth_pct']:+.1f}% (RssAnon {figures['rss_anon_growth_pct']:+.1f}%)\n"
        f"  open fds: {result.baseline_fds} before, peak {figures['fds_peak']:.0f}, {result.final_fds} after"
    )
    return figures


def check(broker, result: SoakResult, config: SoakConfig) -> None:  # type: ignore[no-untyped-def]
    figures = report(result, config)
    assert broker.running, f"the broker died\n{broker.stderr_tail()}"
    assert result.errors == [], "\n".join(result.errors)
    assert len(result.tail_reads) == config.raw_consumers
    for partition, seen in result.tail_reads:
        expected = result.acknowledged[partition]
        assert seen == expected, f"partition {partition}: a tail consumer's records differ from what was acknowledged"
    missing = [v for offsets in result.acknowledged.values() for v in offsets.values() if not result.group_values[v]]
    assert not missing, f"the consumer group never received {len(missing)} records, e.g. {missing[:5]}"
    assert figures["peak_client_sockets"] >= 200, figures
    growth_mib = figures["rss_last_mib"] - figures["rss_first_mib"]
    assert figures["rss_growth_pct"] <= MEMORY_GROWTH_MAX_PCT, f"broker memory grew: {figures}"
    assert growth_mib <= MEMORY_GROWTH_MAX_MIB, f"broker memory grew by {growth_mib:.1f} MiB: {figures}"
    rdkafka_clients = config.rdkafka_producers + config.rdkafka_consumers
    connections = config.raw_producers + config.raw_consumers + 4 * rdkafka_clients  # librdkafka: a few each
    assert figures["fds_peak"] <= result.baseline_fds + connections + 16, figures
    assert result.final_fds <= result.baseline_fds + 2, f"descriptors left open after the clients went: {figures}"
    logged = broker.stderr_text()
    assert " ERROR " not in logged and "Traceback" not in logged, broker.stderr_tail()


def test_soak_short(start_broker) -> None:  # type: ignore[no-untyped-def]
    config = SoakConfig(seconds=SHORT_SECONDS)
    broker = start_broker()
    result = run_soak(broker, config)
    check(broker, result, config)


@pytest.mark.slow
@pytest.mark.timeout(LONG_SECONDS + 600)
def test_soak_long(start_broker) -> None:  # type: ignore[no-untyped-def]
    config = SoakConfig(seconds=LONG_SECONDS)
    broker = start_broker()
    result = run_soak(broker, config)
    check(broker, result, config)
