"""Exactly once through kill -9: a consume-transform-produce loop (tests/crash/eos_loop.py, confluent-kafka, in a
process of its own) reads topic A and writes every record to the same partition of topic B inside a transaction
that also carries the consumed offsets (send_offsets_to_transaction), while a feeder produces bursts to A
(idempotent, acks=all). At a random moment after each burst the test sends SIGKILL, in turn, to the loop or to the
broker. The broker restarts on the same port and the clients reconnect; a new loop process fences the old
transactional producer (its open transaction is aborted) and resumes from the committed offsets. A loop that fails
on its own (its transaction broken by a broker kill) is replaced too.

Afterwards, once the loop has committed the end of A: topic B read with read_committed holds every record of A
exactly once, in A's order, partition by partition. With `EOS_MODE=offsets-outside` the loop commits its offsets
outside the transaction (after it), and the same check finds the duplicates a kill between the two commits makes.

`make test` runs TRIALS kills; the `slow` variant (`make crash-long`, `make crash-transactions-long`) LONG_TRIALS.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker_process import BrokerProcess, BrokerStartError

TRIALS = 4
LONG_TRIALS = 60
PARTITIONS = 3
SOURCE, SINK, GROUP, TRANSACTIONAL_ID = "eos-a", "eos-b", "eos-loop", "eos-loop-txn"
TIMEOUT_S = 60.0
CATCH_UP_S = 240.0  # for the loop to commit everything after the last kill
BURST = 400  # records per partition before each kill
BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": 0,
    "offsets.topic.num.partitions": 3,
    "transaction.state.log.num.partitions": 3,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
    "log.segment.bytes": 256 * 1024,
}
CLIENT = {"reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 250, "retry.backoff.ms": 20, "log_level": 2}
LOOP = Path(__file__).with_name("eos_loop.py")


class Feeder:
    """Produces bursts of `<partition>-<seq>` records to every partition of A (idempotent, acks=all), so the loop
    is busy when a kill comes."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 300_000,
                **CLIENT,
            }
        )
        self.failures: list[str] = []
        self.sent = 0

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failures.append(f"{msg.value()!r}: {err}")

    def burst(self, records: int) -> None:
        for _ in range(records):
            for partition in range(PARTITIONS):
                self.producer.produce(SOURCE, value=f"{partition}-{self.sent}".encode(), partition=partition,
                                      key=b"k%d" % (self.sent % 7), on_delivery=self._on_delivery)  # fmt: skip
            self.sent += 1
        self.producer.poll(0)

    def finish(self) -> None:
        assert self.producer.flush(TIMEOUT_S) == 0, "the feeder's records were not all acknowledged"
        assert not self.failures, f"deliveries to A failed: {self.failures[:5]}"


class Loop:
    """The loop process; `ensure_running` starts a new one when the last one ended (killed or failed)."""

    def __init__(self, broker: BrokerProcess, log_path: Path, mode: str) -> None:
        self.broker, self.log_path, self.mode = broker, log_path, mode
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.failures = 0  # ended on their own (an error), not killed by the test

    def ensure_running(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None and self.proc.returncode != -9:
            self.failures += 1
        args = [sys.executable, str(LOOP), self.broker.bootstrap, SOURCE, SINK, str(PARTITIONS), GROUP,
                TRANSACTIONAL_ID, self.mode]  # fmt: skip
        with self.log_path.open("ab") as log:
            log.write(f"===== loop start #{self.starts}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=os.environ.copy())
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT_S)

    def close(self) -> None:
        self.kill()


def restart_on_the_same_port(broker: BrokerProcess) -> None:
    """The clients know only the old port: a slow start is tried again on it rather than on a new one."""
    ports = dict(broker.ports)
    for attempt in range(3):
        try:
            broker.start(ports)
            return
        except BrokerStartError:
            if attempt == 2:
                raise


def committed_offsets(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "isolation.level": "read_committed",
                         **CLIENT})  # fmt: skip
    try:
        answer = consumer.committed([TopicPartition(SOURCE, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S)
        return {tp.partition: tp.offset for tp in answer}
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, isolation: str) -> dict[int, list[bytes]]:
    """Every record of every partition up to its end (the last stable offset for read_committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"eos-reader-{topic}-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **CLIENT,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    at_end: set[int] = set()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(message.partition())
                        continue
                    raise KafkaException(message.error())
                at_end.discard(message.partition())
                values[message.partition()].append(message.value())
    finally:
        consumer.close()
    assert len(at_end) == PARTITIONS, f"{topic} was not read to its end"
    return values


def run_trials(start_broker: Any, tmp_path: Path, trials: int, seed: int, mode: str) -> None:
    rng = random.Random(seed)
    broker = start_broker(BROKER_CONFIG)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **CLIENT})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (SOURCE, SINK)]).values():
        future.result(TIMEOUT_S)
    feeder = Feeder(broker.bootstrap)
    loop = Loop(broker, tmp_path / "eos-loop.log", mode)
    kills = {"broker": 0, "loop": 0}
    started = time.monotonic()
    loop.ensure_running()
    try:
        for trial in range(trials):
            feeder.burst(BURST)
            time.sleep(rng.uniform(0.05, 1.0))
            loop.ensure_running()
            target = ("loop", "broker")[trial % 2]
            kills[target] += 1
            if target == "broker":
                broker.kill()
                restart_on_the_same_port(broker)
            else:
                loop.kill()
            loop.ensure_running()
        feeder.finish()
        source = read_topic(broker.bootstrap, SOURCE, "read_uncommitted")
        ends = {p: len(values) for p, values in source.items()}
        # the loop takes the partitions one after another (librdkafka queues a fetch's records by partition) at 100
        # records a transaction: on a loaded machine catching up with every burst takes longer than one request
        deadline = time.monotonic() + CATCH_UP_S
        while (committed := committed_offsets(broker.bootstrap)) != ends and time.monotonic() < deadline:
            loop.ensure_running()
            time.sleep(0.2)
        assert committed == ends, f"the loop stopped at {committed} of {ends}"
        loop.kill()  # idle: everything it read is committed, no transaction is open
        sink = read_topic(broker.bootstrap, SINK, "read_committed")
    except AssertionError as exc:
        loop_output = loop.log_path.read_text(errors="replace").splitlines()[-60:]
        raise AssertionError(
            f"{exc}\n--- loop output ({loop.log_path}), last lines ---\n"
            + "\n".join(loop_output)
            + f"\n--- broker stderr, last lines ---\n{broker.stderr_tail(60)}"
        ) from exc
    finally:
        loop.close()
    for partition in range(PARTITIONS):
        expected = [b"out:" + value for value in source[partition]]
        got = sink[partition]
        duplicates = len(got) - len(set(got))
        missing = len(set(expected) - set(got))
        assert got == expected, (
            f"partition {partition} of B: {len(got)} records for {len(expected)} of A, {duplicates} duplicates, "
            f"{missing} missing (seed {seed}, kills {kills}; loop output: {loop.log_path})"
        )
    print(
        f"\nexactly once through kill -9: {kills['broker']} broker and {kills['loop']} loop kills in "
        f"{time.monotonic() - started:.0f} s; {sum(ends.values())} records of A each once in B, in order; "
        f"{loop.starts} loop processes ({loop.failures} ended by an error and were replaced)"
    )


def test_consume_transform_produce_is_exactly_once_through_kills(start_broker: Any, tmp_path: Path) -> None:
    run_trials(start_broker, tmp_path, TRIALS, seed=15, mode=os.environ.get("EOS_MODE", "exact"))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_consume_transform_produce_is_exactly_once_through_kills_long(start_broker: Any, tmp_path: Path) -> None:
    run_trials(start_broker, tmp_path, LONG_TRIALS, seed=150, mode=os.environ.get("EOS_MODE", "exact"))
