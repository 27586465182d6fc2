"""kill -9 of `tidelog serve` at random moments while real clients keep working, on either storage engine.

Two librdkafka (confluent-kafka) producers produce with acks=all and enable.idempotence=true to a 3-partition topic
on a broker with a durable flush policy, so an acknowledgement means the batch was fsynced: the Kafka engine runs
with `log.flush.interval.messages=1` (the broker's group-commit Flusher answers acks=all only once `flush()` has
passed the batch's offset), the RocketMQ engine with `tidelog.rocketmq.flushDiskType=SYNC_FLUSH` (an append returns
only once a group commit has forced the CommitLog past it). A confluent-kafka group member consumes and commits
synchronously. Each trial lets them run for a random time (and until the group has committed since the previous
kill, at most COMMIT_WAIT_S), SIGKILLs the broker, restarts it on the same port (the clients reconnect and retry by
themselves) and lets them run a little longer.

Checked after every restart: the group's committed offsets are at least the last commit acknowledged before the
kill, and no larger than the log end. Checked at the end, after a clean stop, by reading the log directory
in-process and walking the raw batches with an independent CRC-32C check: every acknowledged record is at the
offset its acknowledgement named, exactly once (idempotence survives the crashes: retried batches are recognised
from the producer state the broker rebuilt from its log); no record is in the log twice; each producer's records
are in order in each partition; no delivery failed. Finally a new member of the group resumes exactly at the
committed offsets.

`make test` runs TRIALS[engine] kills per engine; the `slow` variant (`make crash-long`) runs LONG_TRIALS per engine.
Figures are printed.
"""

from __future__ import annotations

import random
import struct
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from crc32c import crc32c

import tidelog
from broker_process import ENGINES, BrokerStartError
from tidelog.codec import rocketmq_message as rm

TRIALS = {"kafka": 10, "rocketmq": 6}  # per engine; the short variant of the RocketMQ engine adds ~15 s
LONG_TRIALS = 100
TOPIC = "kill9"
PARTITIONS = 3
GROUP = "kill9-group"
TIMEOUT_S = 60.0
COMMIT_WAIT_S = 15.0  # a kill waits at most this long for the group to commit (its session.timeout.ms is 10 s)
BROKER_CONFIG = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 4}
# Files roll during the trials: Kafka's segments (and producer snapshots are written), RocketMQ's CommitLog files.
# RocketMQ moves its checkpoint's logics timestamp, where abnormal recovery starts, only after a full ConsumeQueue
# flush (every 60 s by default): a broker killed every few seconds would rescan the whole CommitLog at each start.
# Every second, kills land around checkpoint moves and recovery starts where the checkpoint says.
ENGINE_CONFIG: dict[str, dict[str, int]] = {
    "kafka": {"log.segment.bytes": 256 * 1024},
    "rocketmq": {
        "tidelog.rocketmq.mapedFileSizeCommitLog": 1 << 20,
        "tidelog.rocketmq.flushConsumeQueueThoroughInterval": 1000,
    },
}
# quick reconnects after each restart; librdkafka's own log lines about the refused connections are left out
CLIENT_BACKOFF = {"reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 250, "retry.backoff.ms": 20, "log_level": 2}


# --- clients ------------------------------------------------------------------------------------------------------


class ProducerThread(threading.Thread):
    """Produces `<name>:<seq>` values with random keys, at most MAX_IN_FLIGHT unacknowledged at a time."""

    MAX_IN_FLIGHT = 300

    def __init__(self, name: str, bootstrap: str, seed: int) -> None:
        super().__init__(name=name, daemon=True)
        self.rng = random.Random(seed)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": name,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 300_000,  # never give up on a record across the restarts
                "partitioner": "murmur2_random",
                **CLIENT_BACKOFF,
            }
        )
        self.lock = threading.Lock()
        self.acked: dict[int, list[tuple[int, int]]] = defaultdict(list)  # partition -> [(offset, seq)] acked
        self.failures: list[str] = []
        self.sent = 0
        self.halt = threading.Event()
        self.crash: BaseException | None = None

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failures.append(f"{msg.value()!r}: {err}")
            return
        seq = int(msg.value().split(b":")[1])
        with self.lock:
            self.acked[msg.partition()].append((msg.offset(), seq))

    def acked_count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.acked.values())

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                if len(self.producer) >= self.MAX_IN_FLIGHT:
                    self.producer.poll(0.01)
                    continue
                for _ in range(self.rng.randrange(1, 30)):
                    key = b"k%d" % self.rng.randrange(1000)
                    value = f"{self.name}:{self.sent}".encode()
                    self.producer.produce(TOPIC, key=key, value=value, on_delivery=self._on_delivery)
                    self.sent += 1
                self.producer.poll(0.002)
        except BaseException as exc:
            self.crash = exc

    def finish(self) -> None:
        """Stop producing and wait until every record is acknowledged (or has failed)."""
        self.halt.set()
        self.join(TIMEOUT_S)
        remaining = self.producer.flush(TIMEOUT_S)
        assert remaining == 0, f"{self.name}: {remaining} records still unacknowledged after {TIMEOUT_S:.0f} s"


class GroupMember(threading.Thread):
    """Subscribes, consumes and commits synchronously every few records; remembers what was acknowledged."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="kill9-member", daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "client.id": "kill9-member",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
                **CLIENT_BACKOFF,
            }
        )
        self.lock = threading.Lock()
        self.committed: dict[int, int] = {}  # partition -> last offset a commit was acknowledged for
        self.consumed = 0
        self.failed_commits = 0
        self.halt = threading.Event()
        self.crash: BaseException | None = None
        self._position: dict[int, int] = {}

    def _commit(self) -> None:
        offsets = [TopicPartition(TOPIC, p, o) for p, o in self._position.items() if self.committed.get(p) != o]
        if not offsets:
            return
        try:
            answer = self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException:
            self.failed_commits += 1  # the broker is down or the group is rejoining: the next commit covers it
            return
        with self.lock:
            for tp in answer or ():
                if tp.error is None:
                    self.committed[tp.partition] = tp.offset

    def run(self) -> None:
        try:
            self.consumer.subscribe([TOPIC])
            since_commit = 0
            while not self.halt.is_set():
                msg = self.consumer.poll(0.1)
                if msg is None or msg.error() is not None:
                    self._commit()
                    continue
                self.consumed += 1
                self._position[msg.partition()] = msg.offset() + 1
                since_commit += 1
                if since_commit >= 50:
                    self._commit()
                    since_commit = 0
            self._commit()
        except BaseException as exc:
            self.crash = exc
        finally:
            self.consumer.close()

    def snapshot(self) -> dict[int, int]:
        with self.lock:
            return dict(self.committed)


def fetch_committed(bootstrap: str) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False, **CLIENT_BACKOFF}
    )
    try:
        answer = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S)
        return {tp.partition: tp.offset for tp in answer}
    finally:
        consumer.close()


def high_watermarks(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kill9-watermarks", **CLIENT_BACKOFF})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=TIMEOUT_S)[1] for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def restart_on_the_same_port(broker: Any) -> None:
    """The clients know only the old port, so the broker must come back on it. BrokerProcess.restart() moves to a
    new port when a start is slow (over 15 s on a loaded machine) and the clients would be stranded: here a slow
    start is tried again on the same port."""
    ports = dict(broker.ports)
    for attempt in range(3):
        try:
            broker.start(ports)
            return
        except BrokerStartError:
            if attempt == 2:
                raise


# --- reading the log back ---------------------------------------------------------------------------------------


_BATCH_PRODUCER = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence at byte 43 of a v2 batch


def read_partition(data_dir: Any, engine_name: str, partition: int) -> tuple[list[tuple[int, bytes]], list[str]]:
    """(offset, value) of every record, after an independent CRC-32C check of every stored batch, and for each
    record where it came from (to explain a duplicate): its batch's producer id/epoch/sequences on the Kafka engine;
    on the RocketMQ engine, whose reads rebuild batches, its message's KAFKA_BATCH position, the KAFKA_PRODUCER of
    its batch's last message, CommitLog offset and store time."""
    with tidelog.open(data_dir, engine_name, ENGINE_CONFIG[engine_name], background=False) as engine:
        end = engine.log_end_offset(TOPIC, partition)
        raw = engine.read(TOPIC, partition, 0, 1 << 30).read_bytes() if end else b""
        origin: list[str] = []
        position = 0
        while position < len(raw):
            base, length, _epoch, magic, crc = struct.unpack_from(">qiibI", raw, position)
            assert magic == 2
            assert crc32c(raw[position + 21 : position + length + 12]) == crc, f"batch at {position} fails its CRC"
            (last_delta,) = struct.unpack_from(">i", raw, position + 23)
            producer_id, producer_epoch, base_sequence = _BATCH_PRODUCER.unpack_from(raw, position + 43)
            described = f"batch {producer_id}/{producer_epoch}/{base_sequence}..{base_sequence + last_delta} @{base}"
            origin += [described] * (base + last_delta + 1 - len(origin))
            position += length + 12
        assert position == len(raw), "the log ends with part of a batch"
        records = [(r.offset, r.value) for r in engine.consume(TOPIC, partition)]
        if engine_name == "rocketmq":
            origin = rocketmq_origins(engine, partition, end)
    assert [o for o, _ in records] == list(range(end)), "offsets are not dense"
    return records, origin


def rocketmq_origins(engine: Any, partition: int, end: int) -> list[str]:
    queue = engine.partition(TOPIC, partition)
    messages = [engine.read_message(physical, size) for _offset, physical, size in queue.units(0, end)]
    origins: list[str] = []
    batch_start = 0
    for i, message in enumerate(messages):
        index, count = rm.batch_position(message.properties_bytes)
        if index == 0:
            batch_start = i
        last = messages[min(batch_start + count - 1, len(messages) - 1)]
        producer = rm.producer_info(last.properties_bytes)
        origins.append(
            f"message {index}/{count} of producer batch {tuple(producer) if producer else None} at CommitLog "
            f"{message.physical_offset}, stored {message.store_timestamp}"
        )
    return origins


# --- the trials ---------------------------------------------------------------------------------------------------


@dataclass
class Figures:
    kills: int = 0
    recovery_s: list[float] = field(default_factory=list)
    in_flight_at_kill: list[int] = field(default_factory=list)  # produced but not yet acknowledged
    kills_after_a_commit: int = 0  # kills the group had committed new offsets before (since the previous kill)
    catch_up_s: float = 0.0  # after the last restart, until the group has committed the log end


def run_kill9_trials(start_broker: Any, engine: str, trials: int, seed: int) -> None:
    rng = random.Random(seed)
    broker = start_broker({**BROKER_CONFIG, **ENGINE_CONFIG[engine]}, engine=engine, sync_flush=True)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **CLIENT_BACKOFF})
    admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])[TOPIC].result(TIMEOUT_S)
    producers = [ProducerThread(f"p{i}", broker.bootstrap, seed + i) for i in range(2)]
    member = GroupMember(broker.bootstrap)
    figures = Figures()
    started = time.monotonic()
    for thread in (*producers, member):
        thread.start()
    committed_before: dict[int, int] = {}
    try:
        for trial in range(trials):
            time.sleep(rng.uniform(0.2, 1.5))
            # A member whose session lapsed during a slow restart rejoins under a new id, and its group then waits
            # out the old member's session (as Kafka's does); kills every few seconds could keep it rebalancing and
            # the committed-offset checks idle. So the kill waits (a bounded time) for a commit since the last one.
            committed_at_last_kill = committed_before
            deadline = time.monotonic() + COMMIT_WAIT_S
            while (committed_before := member.snapshot()) == committed_at_last_kill and time.monotonic() < deadline:
                time.sleep(0.05)
            figures.kills_after_a_commit += committed_before != committed_at_last_kill
            figures.in_flight_at_kill.append(sum(p.sent - p.acked_count() - len(p.failures) for p in producers))
            broker.kill()
            figures.kills += 1
            t0 = time.monotonic()
            restart_on_the_same_port(broker)
            figures.recovery_s.append(time.monotonic() - t0)
            context = f"{engine} engine, trial {trial} (seed {seed})"
            committed = fetch_committed(broker.bootstrap)
            watermarks = high_watermarks(broker.bootstrap)
            for partition, offset in committed_before.items():
                assert committed[partition] >= offset, f"{context}: committed offset of {partition} went back"
            for partition, offset in committed.items():
                assert offset <= watermarks[partition], f"{context}: committed {offset} beyond the log end"
            time.sleep(rng.uniform(0.1, 0.5))
        for producer in producers:
            producer.finish()
        final = high_watermarks(broker.bootstrap)
        log_ends = {p: o for p, o in final.items() if o}
        # the member catches up and commits the end of every partition: the kills keep its group rebalancing, so
        # the backlog can be large; slow is fine, stuck (no commit for TIMEOUT_S) is not
        catch_up_started = last_progress = time.monotonic()
        progress = member.snapshot()
        while progress != log_ends and time.monotonic() - last_progress < TIMEOUT_S:
            time.sleep(0.1)
            if (now := member.snapshot()) != progress:
                progress, last_progress = now, time.monotonic()
        assert progress == log_ends, f"the member stopped catching up at {progress} of {log_ends}"
        figures.catch_up_s = time.monotonic() - catch_up_started
    except AssertionError as exc:  # with the broker's side of the story (its log dir is gone after the run)
        raise AssertionError(f"{exc}\n--- broker stderr, last lines ---\n{broker.stderr_tail(80)}") from exc
    finally:
        member.halt.set()
        member.join(TIMEOUT_S)
        for producer in producers:
            producer.halt.set()
    elapsed = time.monotonic() - started
    for thread in (*producers, member):
        assert thread.crash is None, f"{thread.name} crashed: {thread.crash!r}"
    for producer in producers:
        assert not producer.failures, f"{producer.name}: deliveries failed: {producer.failures[:5]}"
    committed = fetch_committed(broker.bootstrap)

    # a new member of the group resumes exactly at the committed offsets (all at the log end): append a marker
    # record to each partition and check it is the first thing the new member sees there
    resume = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", **CLIENT_BACKOFF})
    for partition in range(PARTITIONS):
        resume.produce(TOPIC, value=b"resume", partition=partition)
    assert resume.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": GROUP, "auto.offset.reset": "earliest", **CLIENT_BACKOFF}
    )
    first_seen: dict[int, int] = {}
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + TIMEOUT_S
        while len(first_seen) < PARTITIONS and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                first_seen.setdefault(msg.partition(), msg.offset())
    finally:
        consumer.close()
    assert first_seen == {p: max(committed[p], 0) for p in range(PARTITIONS)}, "the group did not resume"

    broker.stop()  # a clean stop after all those crashes
    read_back = {p: read_partition(broker.log_dir, engine, p) for p in range(PARTITIONS)}
    logs = {p: records for p, (records, _batches) in read_back.items()}
    first_offset: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset) where it is first
    twice: list[str] = []
    for partition, records in logs.items():
        for offset, value in records:
            if value == b"resume":
                continue
            if value in first_offset:
                first_partition, first_at = first_offset[value]
                first_batch, batch = read_back[first_partition][1][first_at], read_back[partition][1][offset]
                twice.append(
                    f"{value.decode()} at {(first_partition, first_at)} ({first_batch}) and "
                    f"{(partition, offset)} ({batch})"
                )
            else:
                first_offset[value] = (partition, offset)
    assert not twice, (
        f"{len(twice)} records are in the log twice, e.g. (partition, offset) (origin): "
        f"{twice[:10]}\n(the broker's stderr of all runs: {broker.stderr_path})"
    )
    acked_total = 0
    for producer in producers:
        name = producer.name.encode()
        for partition, acks in producer.acked.items():
            by_offset = dict(logs[partition])
            for offset, seq in acks:
                assert by_offset.get(offset) == b"%s:%d" % (name, seq), f"acknowledged {producer.name}:{seq} missing"
            acked_total += len(acks)
            in_log = [int(v.split(b":")[1]) for _, v in logs[partition] if v.startswith(name + b":")]
            assert in_log == sorted(in_log), f"{producer.name}'s records are out of order in partition {partition}"
    recovery = sorted(figures.recovery_s)
    in_flight = sorted(figures.in_flight_at_kill)
    assert in_flight[-1] > 0, "no kill landed while records were in flight: the trials prove less than they should"
    stored = sum(len(r) for r in logs.values()) - PARTITIONS
    print(
        f"\nkill -9 ({engine} engine): {figures.kills} kills in {elapsed:.0f} s; {acked_total} records acknowledged "
        f"(acks=all, idempotent, fsync per batch), {stored} in the log, all present exactly once; "
        f"records in flight at a kill: median {in_flight[len(in_flight) // 2]}, max {in_flight[-1]}; "
        f"restart to ready: median {recovery[len(recovery) // 2]:.2f} s, max {recovery[-1]:.2f} s; "
        f"{member.consumed} records consumed by the group (caught up {figures.catch_up_s:.1f} s after the producers "
        f"stopped); {figures.kills_after_a_commit} kills came after a new commit, "
        f"{member.failed_commits} commits refused during outages"
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_kill_minus_nine_of_the_broker(start_broker: Any, engine: str) -> None:
    run_kill9_trials(start_broker, engine, TRIALS[engine], seed=9)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("engine", ENGINES)
def test_kill_minus_nine_of_the_broker_long(start_broker: Any, engine: str) -> None:
    run_kill9_trials(start_broker, engine, LONG_TRIALS, seed=99)
