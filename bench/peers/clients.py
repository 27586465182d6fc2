"""The client side of the broker benchmark: what a worker process runs (`bench/broker_vs_peers.py --worker JSON`).

Contract: `run_worker(spec_json)` runs the flow `WORKERS[spec["kind"]]` against the server of the spec (its
`port`/`bootstrap`, and `server_pid` for the server's CPU) and prints `RESULT <json>` as its last line. A
throughput flow returns what `harness.Meter.stop()` returns ("records", "rate", CPU figures; "stored" when it
can ask the server how many records it holds); a latency consumer prints READY once it is subscribed, then
returns `harness.LatencyRecorder.summary()`; a latency producer returns what `harness.paced()` returns. Every flow
raises when it moved fewer records than asked. The settings below are the ones docs/benchmarks.md quotes.

Python clients: confluent-kafka (tidelog), redis-py (Redis Streams), nats-py (NATS JetStream). Compiled clients
(each run as a child process under a Meter): kcat, redis-benchmark, bench/natsbench (Go, nats.go).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from typing import Any

from peers.harness import (
    VALUE,
    LatencyRecorder,
    Meter,
    client_cpu_seconds,
    paced,
    ready,
    run_compiled,
    stamped,
)

KAFKA_PRODUCER = {  # throughput producer
    "linger.ms": 5,
    "batch.size": 1_048_576,
    "queue.buffering.max.messages": 2_000_000,
    "compression.type": "none",
    "enable.idempotence": False,
    "log_level": 3,
}
KAFKA_LATENCY_PRODUCER = {"linger.ms": 1, "compression.type": "none", "enable.idempotence": False, "log_level": 3}
KAFKA_CONSUMER = {
    "enable.auto.commit": False,
    "enable.partition.eof": False,
    "fetch.queue.backoff.ms": 10,  # default 1000: a 1 s pause whenever the prefetch queue (100k records) is full
    "log_level": 3,
}
NATS_PENDING_SIZE = 8 * 1024 * 1024
NATS_MAX_PENDING_ACKS = 4000
REDIS_PIPELINE = 1000
REDIS_XREAD_COUNT = 10_000
NATS_FETCH = 10_000
KAFKA_CONSUME_BATCH = 10_000
# compiled clients
REDIS_COMPILED_STREAM = "bench-compiled"
REDIS_BENCH_PIPELINE = 64  # redis-benchmark -P: commands in flight per connection
REDIS_BENCH_CONNECTIONS = 50
REDIS_XRANGE_COUNT = 1000  # entries per XRANGE reply
REDIS_XRANGE_PIPELINE = 16
REDIS_XRANGE_CONNECTIONS = 10


# --- tidelog: confluent-kafka -----------------------------------------------------------------------------------


def kafka_producer_conf(spec: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    conf = {**base, "bootstrap.servers": spec["bootstrap"], "acks": spec["acks"], "error_cb": kafka_error}
    if "max_in_flight" in spec:
        conf["max.in.flight.requests.per.connection"] = spec["max_in_flight"]
    return conf


def kafka_error(error: Any) -> None:
    print(f"librdkafka error: {error}", file=sys.stderr, flush=True)


def create_kafka_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30).values():
        future.result(timeout=60)


def kafka_high_watermark(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**KAFKA_CONSUMER, "bootstrap.servers": bootstrap, "group.id": "bench-check"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return high
    finally:
        consumer.close()


def worker_kafka_produce(spec: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import Producer

    count, topic = spec["records"], spec["topic"]
    create_kafka_topic(spec["bootstrap"], topic)
    producer = Producer(kafka_producer_conf(spec, KAFKA_PRODUCER))
    producer.list_topics(topic, timeout=30)  # metadata and connection before the clock starts
    produce, poll = producer.produce, producer.poll
    meter = Meter(spec["server_pid"])
    meter.start()
    for i in range(count):
        while True:
            try:
                produce(topic, VALUE)
                break
            except BufferError:  # queue full: serve delivery reports and retry
                poll(0.01)
        if i % 1000 == 0:
            poll(0)
    left = producer.flush(300)
    result = meter.stop(count, undelivered=left)
    result["stored"] = kafka_high_watermark(spec["bootstrap"], topic)
    return result


def worker_kafka_consume(spec: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    count, topic = spec["records"], spec["topic"]
    consumer = Consumer({**KAFKA_CONSUMER, "bootstrap.servers": spec["bootstrap"], "group.id": f"bench-{topic}"})
    try:
        consumer.list_topics(topic, timeout=30)
        consume = consumer.consume
        received = errors = 0
        last_offset = -1
        meter = Meter(spec["server_pid"])
        meter.start()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while received < count:
            messages = consume(KAFKA_CONSUME_BATCH, 5.0)
            if not messages:
                raise RuntimeError(f"consumer stalled at {received} of {count} records (5 s without a record)")
            for message in messages:
                if message.error() is not None:
                    errors += 1
                    continue
                received += 1
            last_offset = messages[-1].offset()
        return meter.stop(received, errors=errors, last_offset=last_offset)
    finally:
        consumer.close()


def worker_kafka_latency_produce(spec: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import Producer

    topic = spec["topic"]
    producer = Producer(kafka_producer_conf(spec, KAFKA_LATENCY_PRODUCER))
    producer.list_topics(topic, timeout=30)
    produce, poll = producer.produce, producer.poll

    def send(first: int, last: int) -> None:
        for seq in range(first, last):
            produce(topic, stamped(seq))
        poll(0)

    cpu = client_cpu_seconds()
    result = paced(spec["total"], spec["rate"], send)
    result["undelivered"] = producer.flush(60)
    result["client_cpu_s"] = client_cpu_seconds() - cpu
    return result


def worker_kafka_latency_consume(spec: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topic = spec["topic"]
    create_kafka_topic(spec["bootstrap"], topic)
    consumer = Consumer({**KAFKA_CONSUMER, "bootstrap.servers": spec["bootstrap"], "group.id": f"bench-{topic}"})
    recorder = LatencyRecorder(spec["total"], spec["warmup"])
    try:
        consumer.list_topics(topic, timeout=30)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        consumer.poll(0.5)  # the first fetch is in flight before the producer starts
        ready()
        cpu = client_cpu_seconds()
        deadline = time.monotonic() + spec["timeout"]
        poll = consumer.poll
        while not recorder.done and time.monotonic() < deadline:
            message = poll(0.2)
            if message is None:
                continue
            now = time.monotonic_ns()
            if message.error() is None:
                recorder.add(message.value(), now)
        return {**recorder.summary(), "client_cpu_s": client_cpu_seconds() - cpu}
    finally:
        consumer.close()


# --- Redis Streams: redis-py ------------------------------------------------------------------------------------


def redis_client(spec: dict[str, Any]) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=spec["port"])


def redis_rewrite_aof(client: Any) -> None:
    """Start from a freshly rewritten AOF every run, so automatic rewrites line up."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            break
        time.sleep(0.05)
    client.bgrewriteaof()
    time.sleep(0.05)
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        time.sleep(0.05)


def worker_redis_xadd(spec: dict[str, Any]) -> dict[str, Any]:
    client = redis_client(spec)
    count = spec["records"]
    client.delete("bench")
    redis_rewrite_aof(client)
    pipe = client.pipeline(transaction=False)
    xadd = pipe.xadd
    fields = {"v": VALUE}
    meter = Meter(spec["server_pid"])
    meter.start()
    for i in range(1, count + 1):
        xadd("bench", fields)
        if i % REDIS_PIPELINE == 0:
            pipe.execute()
    pipe.execute()
    result = meter.stop(count)
    result["stored"] = client.xlen("bench")
    return result


def worker_redis_xread(spec: dict[str, Any]) -> dict[str, Any]:
    client = redis_client(spec)
    last = b"0-0"
    received = 0
    xread = client.xread
    meter = Meter(spec["server_pid"])
    meter.start()
    while True:
        response = xread({"bench": last}, count=REDIS_XREAD_COUNT)
        if not response:
            break
        rows = response[0][1]
        received += len(rows)
        last = rows[-1][0]
    result = meter.stop(received)
    client.delete("bench")
    return result


def worker_redis_latency_produce(spec: dict[str, Any]) -> dict[str, Any]:
    client = redis_client(spec)
    xadd = client.xadd

    def send(first: int, last: int) -> None:
        if last - first == 1:
            xadd("latency", {"v": stamped(first)})
            return
        pipe = client.pipeline(transaction=False)  # several due after a late wake-up: one round trip for them
        for seq in range(first, last):
            pipe.xadd("latency", {"v": stamped(seq)})
        pipe.execute()

    cpu = client_cpu_seconds()
    result = paced(spec["total"], spec["rate"], send)
    result["client_cpu_s"] = client_cpu_seconds() - cpu
    return result


def worker_redis_latency_consume(spec: dict[str, Any]) -> dict[str, Any]:
    client = redis_client(spec)
    client.delete("latency")
    recorder = LatencyRecorder(spec["total"], spec["warmup"])
    last = b"0-0"
    ready()
    cpu = client_cpu_seconds()
    deadline = time.monotonic() + spec["timeout"]
    while not recorder.done and time.monotonic() < deadline:
        response = client.xread({"latency": last}, count=1000, block=200)
        now = time.monotonic_ns()
        if not response:
            continue
        rows = response[0][1]
        for _, fields in rows:
            recorder.add(fields[b"v"], now)
        last = rows[-1][0]
    result = {**recorder.summary(), "client_cpu_s": client_cpu_seconds() - cpu}
    client.delete("latency")
    return result


# --- NATS JetStream: nats-py -------------------------------------------------------------------------------------


async def nats_connect(spec: dict[str, Any]) -> Any:
    import nats

    return await nats.connect(f"nats://127.0.0.1:{spec['port']}", pending_size=NATS_PENDING_SIZE)


async def nats_fresh_stream(js: Any, name: str, subject: str) -> None:
    from nats.js.api import StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    with contextlib.suppress(NotFoundError):
        await js.delete_stream(name)
    await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE))


async def nats_publish(spec: dict[str, Any]) -> dict[str, Any]:
    nc = await nats_connect(spec)
    try:
        js = nc.jetstream(publish_async_max_pending=NATS_MAX_PENDING_ACKS)
        await nats_fresh_stream(js, "BENCH", "bench")
        count = spec["records"]
        publish = js.publish_async
        meter = Meter(spec["server_pid"])
        meter.start()
        for _ in range(count):
            await publish("bench", VALUE)
        await js.publish_async_completed()
        result = meter.stop(count)
        result["stored"] = (await js.stream_info("BENCH")).state.messages
        return result
    finally:
        await nc.close()


async def nats_fetch(spec: dict[str, Any]) -> dict[str, Any]:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await nats_connect(spec)
    try:
        js = nc.jetstream()
        count = spec["records"]
        received = 0
        meter = Meter(spec["server_pid"])
        meter.start()
        psub = await js.pull_subscribe(
            "bench",
            durable=spec["durable"],
            stream="BENCH",
            config=ConsumerConfig(ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.ALL, max_ack_pending=-1),
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
        )
        while received < count:
            messages = await psub.fetch(NATS_FETCH, timeout=5)
            received += len(messages)
            await messages[-1].ack()
        return meter.stop(received)
    finally:
        await nc.close()


async def nats_latency_produce(spec: dict[str, Any]) -> dict[str, Any]:
    nc = await nats_connect(spec)
    try:
        js = nc.jetstream(publish_async_max_pending=NATS_MAX_PENDING_ACKS)
        publish = js.publish_async
        total, interval = spec["total"], 1e9 / spec["rate"]
        cpu = client_cpu_seconds()
        start = time.monotonic_ns()
        i = wakeups = 0
        worst_lag = 0.0
        while i < total:  # the same pacing as paced(), with asyncio sleeps (the loop wakes with 1 ms granularity)
            now = time.monotonic_ns()
            due = min(total, int((now - start) / interval) + 1)
            if due > i:
                worst_lag = max(worst_lag, now - (start + i * interval))
                wakeups += 1
            while i < due:
                await publish("latency", stamped(i))
                i += 1
            if i < total:
                wait = start + i * interval - time.monotonic_ns()
                if wait > 0:
                    await asyncio.sleep(wait / 1e9)
        seconds = (time.monotonic_ns() - start) / 1e9
        await js.publish_async_completed()
        return {
            "sent": total,
            "send_rate": total / seconds,
            "worst_lag_ms": worst_lag / 1e6,
            "per_wakeup": total / wakeups,
            "client_cpu_s": client_cpu_seconds() - cpu,
        }
    finally:
        await nc.close()


async def nats_latency_consume(spec: dict[str, Any]) -> dict[str, Any]:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await nats_connect(spec)
    try:
        js = nc.jetstream()
        await nats_fresh_stream(js, "LATENCY", "latency")
        recorder = LatencyRecorder(spec["total"], spec["warmup"])
        finished = asyncio.get_running_loop().create_future()

        async def on_message(msg: Any) -> None:
            recorder.add(msg.data, time.monotonic_ns())
            if recorder.done and not finished.done():
                finished.set_result(None)

        await js.subscribe(
            "latency",
            stream="LATENCY",
            cb=on_message,
            manual_ack=True,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
        )
        await nc.flush()
        ready()
        cpu = client_cpu_seconds()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished, spec["timeout"])
        return {**recorder.summary(), "client_cpu_s": client_cpu_seconds() - cpu}
    finally:
        await nc.close()


# --- compiled clients: kcat, redis-benchmark, natsbench (each a child process under a Meter) ------------------


def kcat_argv(spec: dict[str, Any], mode: str) -> list[str]:
    return ["kcat", mode, "-b", spec["bootstrap"], "-t", spec["topic"], "-p", "0", "-X", "log_level=3"]


def worker_kcat_produce(spec: dict[str, Any]) -> dict[str, Any]:
    """kcat -P sends every line of the records file as a record and exits once every delivery was reported."""
    create_kafka_topic(spec["bootstrap"], spec["topic"])
    argv = [*kcat_argv(spec, "-P"), "-X", f"acks={spec['acks']}"]
    for key in ("linger.ms", "batch.size", "queue.buffering.max.messages", "compression.type"):
        argv += ["-X", f"{key}={KAFKA_PRODUCER[key]}"]
    with open(spec["lines_file"], "rb") as lines:
        result, stderr = run_compiled(spec, argv, stdin=lines)
    if "ERROR" in stderr:
        raise RuntimeError(f"kcat reported delivery errors: {stderr[-2000:]}")
    result["stored"] = kafka_high_watermark(spec["bootstrap"], spec["topic"])
    return result


def worker_kcat_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """kcat -C from the beginning, values to /dev/null, exiting at the last record (-c N) as the Python consumer
    does (waiting for the end of the partition with -e alone adds librdkafka's fetch.wait.max.ms); -e makes a
    short partition an error instead of a hang."""
    argv = [*kcat_argv(spec, "-C"), "-o", "beginning", "-c", str(spec["records"]), "-e"]
    result, stderr = run_compiled(spec, argv)
    end = re.search(r"Reached end of topic \S+ \[0\] at offset (\d+)", stderr)
    if end is not None and int(end[1]) < spec["records"]:
        raise RuntimeError(f"kcat reached the end of {spec['topic']} at offset {end[1]}: {stderr[-2000:]}")
    return result


def redis_benchmark_argv(spec: dict[str, Any], pipeline: int, connections: int, commands: int) -> list[str]:
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(spec["port"]), "-P", str(pipeline)]
    return [*argv, "-c", str(connections), "-n", str(commands), "-q"]


def counted(result: dict[str, Any], records: int) -> dict[str, Any]:
    """redis-benchmark sends whole pipelines, so it may run a few more commands than -n: count what the server did."""
    return {**result, "records": records, "rate": records / result["seconds"], "at_least": True}


def xrange_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_xrange", {}).get("calls", 0))


def worker_redis_benchmark_xadd(spec: dict[str, Any]) -> dict[str, Any]:
    client = redis_client(spec)
    client.delete(REDIS_COMPILED_STREAM)
    redis_rewrite_aof(client)
    argv = redis_benchmark_argv(spec, REDIS_BENCH_PIPELINE, REDIS_BENCH_CONNECTIONS, spec["records"])
    result, _ = run_compiled(spec, [*argv, "XADD", REDIS_COMPILED_STREAM, "*", "v", VALUE.decode()])
    return counted(result, client.xlen(REDIS_COMPILED_STREAM))


def worker_redis_benchmark_xrange(spec: dict[str, Any]) -> dict[str, Any]:
    client = redis_client(spec)
    if client.xlen(REDIS_COMPILED_STREAM) < REDIS_XRANGE_COUNT:
        raise RuntimeError(f"stream {REDIS_COMPILED_STREAM} holds fewer than {REDIS_XRANGE_COUNT} entries")
    commands = spec["records"] // REDIS_XRANGE_COUNT
    argv = redis_benchmark_argv(spec, REDIS_XRANGE_PIPELINE, REDIS_XRANGE_CONNECTIONS, commands)
    calls = xrange_calls(client)
    result, _ = run_compiled(spec, [*argv, "XRANGE", REDIS_COMPILED_STREAM, "-", "+", "COUNT", str(REDIS_XRANGE_COUNT)])
    result = counted(result, (xrange_calls(client) - calls) * REDIS_XRANGE_COUNT)
    client.delete(REDIS_COMPILED_STREAM)
    return result


def worker_natsbench(spec: dict[str, Any]) -> dict[str, Any]:
    argv = [spec["natsbench"], "-port", str(spec["port"]), "-n", str(spec["records"])]
    argv += ["-durable", spec.get("durable", "c0"), spec["flow"]]
    result, _ = run_compiled({**spec, "keep_stdout": True}, argv)
    reported = json.loads(result.pop("stdout").strip().splitlines()[-1])
    result["records"] = reported["records"]
    if "stored" in reported:
        result["stored"] = reported["stored"]
    return result


WORKERS = {
    "kafka_produce": worker_kafka_produce,
    "kafka_consume": worker_kafka_consume,
    "kafka_latency_produce": worker_kafka_latency_produce,
    "kafka_latency_consume": worker_kafka_latency_consume,
    "redis_xadd": worker_redis_xadd,
    "redis_xread": worker_redis_xread,
    "redis_latency_produce": worker_redis_latency_produce,
    "redis_latency_consume": worker_redis_latency_consume,
    "nats_publish": lambda spec: asyncio.run(nats_publish(spec)),
    "nats_fetch": lambda spec: asyncio.run(nats_fetch(spec)),
    "nats_latency_produce": lambda spec: asyncio.run(nats_latency_produce(spec)),
    "nats_latency_consume": lambda spec: asyncio.run(nats_latency_consume(spec)),
    "kcat_produce": worker_kcat_produce,
    "kcat_consume": worker_kcat_consume,
    "redis_benchmark_xadd": worker_redis_benchmark_xadd,
    "redis_benchmark_xrange": worker_redis_benchmark_xrange,
    "natsbench": worker_natsbench,
}


def run_worker(spec_json: str) -> int:
    spec = json.loads(spec_json)
    result = WORKERS[spec["kind"]](spec)
    print("RESULT " + json.dumps(result), flush=True)
    return 0
