"""Consumer groups against a real `tidelog serve`, with real clients and raw requests.

- confluent-kafka groups under rebalancing (members join and leave one by one while a producer keeps producing,
  eager `range` and incremental `cooperative-sticky`): every record processed, none twice, partitions spread evenly;
  with `cooperative-sticky` the on_revoke callbacks take away only the partitions that move, the others keep theirs;
- a member killed with SIGKILL is dropped after its session timeout and its partitions move to the survivor;
- kafka-python and aiokafka groups, and a group mixing kafka-python and confluent-kafka members;
- the admin APIs (list, describe, list/alter/delete offsets, delete groups, remove members) and topic deletion;
- committed offsets across a clean restart and across SIGKILL, and a live group across a broker SIGKILL;
- the coordinator's answers to raw requests (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, INVALID_SESSION_TIMEOUT,
  REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED, INCONSISTENT_GROUP_PROTOCOL, the rebalance timeout, ...);
- offsets retention (`@pytest.mark.slow`: at least a minute each).

Every test asserts Kafka's behaviour.

Every broker here has `group.initial.rebalance.delay.ms=0`; tests sharing the module broker use their own topic and
group names.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 30.0
SESSION_MS = 6000  # group.min.session.timeout.ms's default: the shortest session the broker accepts
HEARTBEAT_MS = 500
REBALANCE_S = 20.0  # the longest a rebalance may take before a test gives up waiting for it

NONE, UNKNOWN_TOPIC_OR_PARTITION, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 0, 3, 22, 25
NOT_COORDINATOR = 16
INVALID_SESSION_TIMEOUT, REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED = 26, 27, 79
JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH = 11, 14, 12, 13, 8, 9


@pytest.fixture(scope="module")
def gbroker(start_module_broker):
    """The module's broker: a new group's first rebalance completes at once."""
    return start_module_broker(group_initial_rebalance_delay_ms=0)


# --- small helpers -------------------------------------------------------------------------------------------


def wait_for(
    predicate: Callable[[], Any], what: str | Callable[[], str], timeout: float = REBALANCE_S, step: float = 0.05
) -> float:
    """Poll until `predicate()` is truthy; returns the seconds it took. `what` may be a callable (for the state at
    the timeout)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}")
        time.sleep(step)
    return time.monotonic() - started


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    futures = client.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    futures[name].result(timeout=TIMEOUT_S)


def produce(bootstrap: str, topic: str, partitions: int, count: int, prefix: str = "") -> dict[tuple[int, int], bytes]:
    """`count` records round-robin over the partitions (explicitly); returns {(partition, offset): value}."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": "all"})
    placed: dict[tuple[int, int], bytes] = {}
    failures: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            placed[(msg.partition(), msg.offset())] = msg.value()

    for i in range(count):
        producer.produce(topic, value=f"{prefix}{i}".encode(), partition=i % partitions, on_delivery=on_delivery)
    assert producer.flush(TIMEOUT_S) == 0, "records still undelivered after the flush timeout"
    assert not failures, f"delivery failed: {failures[:3]}"
    return placed


def group_consumer(bootstrap: str, group: str, **conf: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            **conf,
        }
    )


def fetch_committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """OffsetFetch through confluent-kafka (no join): {partition: committed offset}, -1 where there is none."""
    consumer = group_consumer(bootstrap, group)
    try:
        answer = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    assert all(tp.error is None for tp in answer), answer
    return {tp.partition: (-1 if tp.offset == OFFSET_INVALID else tp.offset) for tp in answer}


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = group_consumer(bootstrap, f"watermarks-{topic}")
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def consume_assigned(bootstrap: str, group: str, topic: str, partitions: int, expect: int) -> list[tuple[int, int]]:
    """assign() with no offsets starts each partition at the group's committed offset (auto.offset.reset if none).

    Reads until `expect` records came and then 1 s more (to catch extra ones); returns (partition, offset) pairs.
    """
    consumer = group_consumer(bootstrap, group)
    got: list[tuple[int, int]] = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + TIMEOUT_S
        quiet_until = None
        while time.monotonic() < deadline and (quiet_until is None or time.monotonic() < quiet_until):
            msg = consumer.poll(0.1)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append((msg.partition(), msg.offset()))
            if len(got) >= expect and quiet_until is None:
                quiet_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return got


def first_offsets(got: Iterable[tuple[int, int]]) -> dict[int, int]:
    first: dict[int, int] = {}
    for partition, offset in got:
        first[partition] = min(offset, first.get(partition, offset))
    return first


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def listed_groups(client: AdminClient) -> dict[str, Any]:
    result = client.list_consumer_groups(request_timeout=10).result(timeout=TIMEOUT_S)
    assert not result.errors, result.errors
    return {g.group_id: g for g in result.valid}


def describe_group(client: AdminClient, group: str) -> Any:
    return client.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=TIMEOUT_S)


def admin_offsets(client: AdminClient, group: str, topic: str, partitions: int) -> dict[int, int]:
    """ListConsumerGroupOffsets for the given partitions: {partition: offset}, -1 where none is committed."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    result = client.list_consumer_group_offsets([request], request_timeout=10)[group].result(timeout=TIMEOUT_S)
    assert all(tp.error is None for tp in result.topic_partitions), result.topic_partitions
    return {tp.partition: (-1 if tp.offset == OFFSET_INVALID else tp.offset) for tp in result.topic_partitions}


def error_code(exc: BaseException) -> int:
    assert isinstance(exc, KafkaException), exc
    return exc.args[0].code()


# --- group members in threads --------------------------------------------------------------------------------


class KeepProducing(threading.Thread):
    """Produces small records round-robin over the partitions until stopped; remembers where each one landed."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, per_second: int = 250) -> None:
        super().__init__(name=f"producer-{topic}", daemon=True)
        self.bootstrap, self.topic, self.partitions, self.per_second = bootstrap, topic, partitions, per_second
        self.delivered: dict[tuple[int, int], bytes] = {}
        self.failures: list[str] = []
        self.produced = 0
        self.halt = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "acks": "all"})

            def on_delivery(err: KafkaError | None, msg: Any) -> None:
                if err is not None:
                    self.failures.append(str(err))
                else:
                    self.delivered[(msg.partition(), msg.offset())] = msg.value()

            burst = 10
            while not self.halt.is_set():
                for _ in range(burst):
                    value = f"{self.topic}-{self.produced}".encode()
                    producer.produce(
                        self.topic, value=value, partition=self.produced % self.partitions, on_delivery=on_delivery
                    )
                    self.produced += 1
                producer.poll(0)
                self.halt.wait(burst / self.per_second)
            remaining = producer.flush(TIMEOUT_S)
            if remaining:
                self.failures.append(f"{remaining} records undelivered after the flush")
        except BaseException as exc:  # reported by finish()
            self.crash = exc

    def finish(self) -> dict[tuple[int, int], bytes]:
        self.halt.set()
        self.join(TIMEOUT_S + 5)
        assert not self.is_alive(), "the producer thread did not stop"
        assert self.crash is None, f"the producer thread crashed: {self.crash!r}"
        assert not self.failures, f"deliveries failed: {self.failures[:3]}"
        assert len(self.delivered) == self.produced
        return dict(self.delivered)


class CkMember(threading.Thread):
    """A confluent-kafka group member that commits every record synchronously right after processing it.

    `processed` lists (topic, partition, offset) in processing order; `committed` maps each partition to the last
    offset a commit of this member was acknowledged for; `assignment` is the member's assignment after its last poll.
    A commit the coordinator turns down while the group rebalances (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION: with
    cooperative-sticky a member keeps consuming during a rebalance, and Kafka refuses its commits between the end of
    the join and the end of the sync) is retried after every poll and when its partition is revoked, as a careful
    Java application does in onPartitionsRevoked; one still pending when its partition goes is in `lost_commits`.
    """

    RETRIABLE = (KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION)

    def __init__(self, name: str, bootstrap: str, group: str, topics: Sequence[str], **conf: Any) -> None:
        super().__init__(name=name, daemon=True)
        self.bootstrap, self.group, self.topics, self.conf = bootstrap, group, list(topics), conf
        self.assignment: frozenset[tuple[str, int]] = frozenset()
        self.processed: list[tuple[str, int, int]] = []
        self.committed: dict[tuple[str, int], int] = {}
        self.pending: dict[tuple[str, int], int] = {}
        self.retried_commits: list[tuple[str, int, int, str]] = []
        self.lost_commits: list[tuple[str, int, int]] = []
        self.failed_commits: list[tuple[str, int, int, str]] = []  # errors other than the retriable ones
        self.errors: list[str] = []
        self.assigns = 0  # on_assign callbacks: one per rebalance that hands this member partitions
        self.revocations: list[frozenset[tuple[str, int]]] = []  # what each on_revoke/on_lost took away
        self.halt = threading.Event()
        self.crash: BaseException | None = None

    def partitions(self, topic: str | None = None) -> frozenset[int]:
        return frozenset(p for t, p in self.assignment if topic is None or t == topic)

    def _commit_pending(self, consumer: Consumer, only: Iterable[tuple[str, int]] | None = None) -> None:
        keys = [k for k in self.pending if only is None or k in only]
        if not keys:
            return
        offsets = [TopicPartition(t, p, self.pending[(t, p)]) for t, p in keys]
        try:
            answer = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() not in self.RETRIABLE:
                self.failed_commits += [(tp.topic, tp.partition, tp.offset, str(error)) for tp in offsets]
                for key in keys:
                    del self.pending[key]
            else:
                self.retried_commits += [(tp.topic, tp.partition, tp.offset, str(error)) for tp in offsets]
            return
        for tp in answer or ():
            key = (tp.topic, tp.partition)
            if tp.error is None:
                self.committed[key] = tp.offset
                if self.pending.get(key) == tp.offset:
                    del self.pending[key]
            elif tp.error.code() in self.RETRIABLE:
                self.retried_commits.append((tp.topic, tp.partition, tp.offset, str(tp.error)))
            else:
                self.failed_commits.append((tp.topic, tp.partition, tp.offset, str(tp.error)))
                self.pending.pop(key, None)

    def run(self) -> None:
        try:
            consumer = group_consumer(self.bootstrap, self.group, **{"client.id": self.name, **self.conf})

            def on_revoke(consumer: Consumer, revoked: list[TopicPartition]) -> None:
                gone = {(tp.topic, tp.partition) for tp in revoked}
                self.revocations.append(frozenset(gone))
                self._commit_pending(consumer, gone)
                for key in gone & set(self.pending):
                    self.lost_commits.append((*key, self.pending.pop(key)))

            def on_assign(consumer: Consumer, assigned: list[TopicPartition]) -> None:
                self.assigns += 1

            consumer.subscribe(self.topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
            try:
                while not self.halt.is_set():
                    msg = consumer.poll(0.1)
                    self.assignment = frozenset((tp.topic, tp.partition) for tp in consumer.assignment())
                    if msg is None:
                        self._commit_pending(consumer)
                        continue
                    if msg.error() is not None:
                        self.errors.append(str(msg.error()))
                        continue
                    self.processed.append((msg.topic(), msg.partition(), msg.offset()))
                    self.pending[(msg.topic(), msg.partition())] = msg.offset() + 1
                    self._commit_pending(consumer)
                self._commit_pending(consumer)
                self.lost_commits += [(*key, offset) for key, offset in self.pending.items()]
            finally:
                consumer.close()  # LeaveGroup
                self.assignment = frozenset()
        except BaseException as exc:
            self.crash = exc

    def leave(self) -> None:
        if self.ident is None:  # never started (a test failed before it): nothing to leave
            return
        self.halt.set()
        self.join(TIMEOUT_S)
        assert not self.is_alive(), f"{self.name} did not close"
        assert self.crash is None, f"{self.name} crashed: {self.crash!r}"


def spread_is(members: Sequence[CkMember], topic: str, partitions: int, sizes: Sequence[int]) -> bool:
    """The members' current assignments are disjoint, cover the topic, and have these sizes."""
    owned = [m.partitions(topic) for m in members]
    union = frozenset().union(*owned)
    return (
        sorted(len(o) for o in owned) == sorted(sizes)
        and sum(len(o) for o in owned) == partitions
        and union == frozenset(range(partitions))
    )


def assignments_text(members: Sequence[CkMember]) -> str:
    return ", ".join(f"{m.name}={sorted(m.partitions())}" for m in members)


# --- 1. confluent-kafka members joining and leaving under load ------------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param(
            "range", marks=pytest.mark.matrix("group: two members join, rebalance, leave", client="confluent")
        ),
        pytest.param(
            "cooperative-sticky", marks=pytest.mark.matrix("group: cooperative rebalancing", client="confluent")
        ),
    ],
)
def test_members_join_and_leave_under_load_no_loss_no_duplicates(gbroker, strategy: str) -> None:
    topic, group, partitions = f"churn-{strategy}", f"churn-{strategy}", 6
    create_topic(gbroker.bootstrap, topic, partitions)
    conf = {} if strategy == "range" else {"partition.assignment.strategy": strategy}  # range: librdkafka's default
    producer = KeepProducing(gbroker.bootstrap, topic, partitions)
    producer.start()
    members = [CkMember(f"{strategy}-m{i}", gbroker.bootstrap, group, [topic], **conf) for i in range(3)]
    timings: list[str] = []
    try:

        def await_spread(active: Sequence[CkMember], sizes: Sequence[int], step: str) -> None:
            took = wait_for(
                lambda: spread_is(active, topic, partitions, sizes),
                lambda: f"{step}: assignment {sizes} (have {assignments_text(active)})",
            )
            timings.append(f"{step} {took:.1f}s")
            # and it holds: no member lost or double-owned a partition right after the rebalance
            time.sleep(0.3)
            assert spread_is(active, topic, partitions, sizes), f"{step}: {assignments_text(active)}"

        members[0].start()
        await_spread(members[:1], [6], "m0 joins")
        wait_for(lambda: members[0].processed, "m0 to process something")
        members[1].start()
        await_spread(members[:2], [3, 3], "m1 joins")
        members[2].start()
        await_spread(members, [2, 2, 2], "m2 joins")
        for m in members:
            wait_for(lambda m=m: len(m.processed) > 10, f"{m.name} to process records")
        revoked = [frozenset[tuple[str, int]]().union(*m.revocations) for m in members]
        if strategy == "cooperative-sticky":  # incremental: only the partitions that moved were revoked, once each
            assert [sum(len(r) for r in m.revocations) for m in members] == [4, 1, 0], [m.revocations for m in members]
            assert not any(r & m.assignment for r, m in zip(revoked, members, strict=True)), "a kept one was revoked"
        else:  # eager: every rebalance revokes everything a member owns (6, then 3; and 3)
            assert [sum(len(r) for r in m.revocations) for m in members] == [9, 3, 0], [m.revocations for m in members]
        revocations_before_leaves = [len(m.revocations) for m in members]

        description = describe_group(admin(gbroker.bootstrap), group)
        assert description.state == ConsumerGroupState.STABLE
        assert description.partition_assignor == strategy
        assert sorted(m.client_id for m in description.members) == sorted(m.name for m in members)
        described = {m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in description.members}
        assert described == {m.name: set(m.partitions(topic)) for m in members}

        members[2].leave()
        await_spread(members[:2], [3, 3], "m2 leaves")
        if strategy == "cooperative-sticky":  # the survivors only gained partitions: nothing was revoked from them
            assert [len(m.revocations) for m in members[:2]] == revocations_before_leaves[:2]
        time.sleep(0.5)  # let both survivors work a little on their new partitions
        members[1].leave()
        await_spread(members[:1], [6], "m1 leaves")
        if strategy == "cooperative-sticky":
            assert len(members[0].revocations) == revocations_before_leaves[0], members[0].revocations
        delivered = producer.finish()
        last = {p: max(o for q, o in delivered if q == p) for p in range(partitions)}
        wait_for(
            lambda: all(members[0].committed.get((topic, p), -1) == last[p] + 1 for p in range(partitions)),
            "m0 to process and commit everything produced",
            timeout=TIMEOUT_S,
        )
        members[0].leave()
    finally:
        producer.halt.set()
        for m in members:
            m.halt.set()
        for m in members:
            if m.is_alive():
                m.join(TIMEOUT_S)
    retried = sum(len(m.retried_commits) for m in members)
    print(f"{strategy}: {len(delivered)} records, {retried} commits retried; " + ", ".join(timings))

    for m in members:
        assert not m.errors, f"{m.name} got consumer errors: {m.errors[:3]}"
        assert not m.failed_commits, f"{m.name}: synchronous commits failed: {m.failed_commits[:3]}"
        assert not m.lost_commits, f"{m.name}: commits never acknowledged: {m.lost_commits[:3]}"
        if strategy == "range":  # eager: a member commits before it rejoins, while Kafka still accepts its commits
            assert not m.retried_commits, f"{m.name}: commits turned down: {m.retried_commits[:3]}"
        by_partition: dict[int, list[int]] = {}
        for _, p, o in m.processed:
            by_partition.setdefault(p, []).append(o)
        for p, offsets in by_partition.items():
            assert offsets == sorted(offsets), f"{m.name} processed partition {p} out of order"
    processed = Counter((p, o) for m in members for _, p, o in m.processed)
    missing = set(delivered) - set(processed)
    assert not missing, f"{len(missing)} records were never processed, e.g. {sorted(missing)[:5]}"
    assert set(processed) <= set(delivered), "processed records that were never produced"
    duplicates = sorted(position for position, count in processed.items() if count > 1)
    assert not duplicates, f"{len(duplicates)} records processed twice despite synchronous commits: {duplicates[:5]}"
    for m in members[1:]:
        assert len({p for _, p, _ in m.processed}) >= 2, f"{m.name} processed too few partitions"
    expected = {p: last[p] + 1 for p in range(partitions)}
    assert fetch_committed(gbroker.bootstrap, group, topic, partitions) == expected
    assert high_watermarks(gbroker.bootstrap, topic, partitions) == expected


# --- 2. a member that dies without leaving --------------------------------------------------------------------

VICTIM = r"""
import sys
from confluent_kafka import Consumer

bootstrap, group, topic, session_ms, heartbeat_ms = sys.argv[1:6]
consumer = Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "client.id": "victim", "enable.auto.commit": False,
    "auto.offset.reset": "earliest", "session.timeout.ms": int(session_ms), "heartbeat.interval.ms": int(heartbeat_ms),
})
consumer.subscribe([topic])
last = None
while True:
    msg = consumer.poll(0.1)
    now = sorted(tp.partition for tp in consumer.assignment())
    if now != last:
        print("assigned", *now, flush=True)
        last = now
    if msg is None or msg.error() is not None:
        continue
    consumer.commit(message=msg, asynchronous=False)
    print("committed", msg.partition(), msg.offset() + 1, flush=True)
"""


class Victim:
    """A confluent-kafka member in a process of its own, reporting its assignment and commits on stdout."""

    def __init__(self, bootstrap: str, group: str, topic: str, stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        with stderr_path.open("w") as stderr:  # a file, not a pipe nobody reads: the victim must never block on it
            self.proc = subprocess.Popen(
                [sys.executable, "-c", VICTIM, bootstrap, group, topic, str(SESSION_MS), str(HEARTBEAT_MS)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.assignment: frozenset[int] = frozenset()
        self.committed: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if words[:1] == ["assigned"]:
                self.assignment = frozenset(int(w) for w in words[1:])
            elif words[:1] == ["committed"] and len(words) == 3:
                self.committed[int(words[1])] = int(words[2])

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no LeaveGroup, no last commit
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)

    def close(self) -> str:
        if self.proc.poll() is None:
            self.kill()
        return self.stderr_path.read_text(errors="replace")


def test_killed_member_is_removed_after_its_session_timeout(gbroker, tmp_path: Path) -> None:
    topic, group, partitions = "victim", "victim", 6
    create_topic(gbroker.bootstrap, topic, partitions)
    produce(gbroker.bootstrap, topic, partitions, 120, prefix="before-")
    survivor = CkMember("survivor", gbroker.bootstrap, group, [topic])
    survivor.start()
    victim = None
    try:
        wait_for(lambda: survivor.partitions(topic) == frozenset(range(partitions)), "the survivor's assignment")
        victim = Victim(gbroker.bootstrap, group, topic, tmp_path / "victim.stderr")
        wait_for(
            lambda: len(victim.assignment) == 3 and len(survivor.partitions(topic)) == 3,
            "a 3 + 3 split with the victim process",
        )
        assert victim.assignment | survivor.partitions(topic) == frozenset(range(partitions))
        moved = sorted(victim.assignment)
        # the victim processes and commits some records of its own; then everything is committed
        during = produce(gbroker.bootstrap, topic, partitions, 60, prefix="during-")
        caught_up = {p: 30 for p in range(partitions)}
        wait_for(
            lambda: (
                all(victim.committed.get(p) == caught_up[p] for p in moved)
                and all(survivor.committed.get((topic, p)) == caught_up[p] for p in range(partitions) if p not in moved)
            ),
            "both members to commit everything produced so far",
        )
        assert not [(p, o) for _, p, o in survivor.processed if p in moved and (p, o) in during]

        seen_before_kill = len(survivor.processed)
        victim.kill()
        took = wait_for(
            lambda: survivor.partitions(topic) == frozenset(range(partitions)),
            "the survivor to get the dead member's partitions",
            timeout=SESSION_MS / 1000 + 10,
        )
        print(f"partitions {moved} moved {took:.2f} s after the SIGKILL (session.timeout.ms={SESSION_MS})")
        # the coordinator waits for the session timeout (the last heartbeat came at most one interval before the
        # kill), and then the rebalance takes about a heartbeat interval
        assert took >= (SESSION_MS - HEARTBEAT_MS) / 1000 - 0.25, f"removed after {took:.2f} s: before its session"
        assert took <= SESSION_MS / 1000 + 3.0, f"removed only after {took:.2f} s"

        after = produce(gbroker.bootstrap, topic, partitions, 60, prefix="after-")
        wait_for(
            lambda: all(survivor.committed.get((topic, p)) == caught_up[p] + 10 for p in range(partitions)),
            "the survivor to process the new records",
        )
        description = describe_group(admin(gbroker.bootstrap), group)
        assert [m.client_id for m in description.members] == ["survivor"]
        assert description.state == ConsumerGroupState.STABLE
    finally:
        try:
            survivor.leave()
        finally:
            stderr = victim.close() if victim is not None else ""
    # the survivor resumed the moved partitions exactly at the dead member's last commit
    on_moved = [(p, o) for _, p, o in survivor.processed[seen_before_kill:] if p in moved]
    assert sorted(on_moved) == sorted((p, o) for p, o in after if p in moved), stderr[-2000:]
    assert not survivor.failed_commits and not survivor.lost_commits


# --- 3. kafka-python and aiokafka groups; a group mixing clients ----------------------------------------------


@pytest.mark.matrix("consumer: commit, restart, resume from the committed offset", client="kafka-python")
def test_kafka_python_group_consume_commit_resume(gbroker) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition
    from kafka.structs import OffsetAndMetadata

    topic, group, partitions = "kp-group", "kp-group", 3
    create_topic(gbroker.bootstrap, topic, partitions)
    placed = produce(gbroker.bootstrap, topic, partitions, 60)  # 20 per partition
    halfway = {0: 7, 1: 10, 2: 13}

    def consumer() -> Any:
        return KafkaConsumer(
            topic,
            bootstrap_servers=gbroker.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
        )

    def consume(c: Any, expect: int) -> list[tuple[int, int]]:
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < expect and time.monotonic() < deadline:
            for messages in c.poll(timeout_ms=200).values():
                got += [(m.partition, m.offset) for m in messages]
        extra_until = time.monotonic() + 0.5
        while time.monotonic() < extra_until:
            for messages in c.poll(timeout_ms=100).values():
                got += [(m.partition, m.offset) for m in messages]
        return got

    first = consumer()
    try:
        got = consume(first, len(placed))
        assert sorted(got) == sorted(placed), "the first member did not read every record exactly once"
        assert {tp.partition for tp in first.assignment()} == set(range(partitions))
        first.commit({KpTopicPartition(topic, p): OffsetAndMetadata(o, f"half-{p}", -1) for p, o in halfway.items()})
        for p, o in halfway.items():
            assert first.committed(KpTopicPartition(topic, p)) == o
            assert first.committed(KpTopicPartition(topic, p), metadata=True).metadata == f"half-{p}"
    finally:
        first.close()  # LeaveGroup; no autocommit
    assert fetch_committed(gbroker.bootstrap, group, topic, partitions) == halfway

    second = consumer()
    try:
        got = consume(second, sum(20 - o for o in halfway.values()))
        assert sorted(got) == sorted((p, o) for p, o in placed if o >= halfway[p]), "did not resume at the commit"
        second.commit()  # everything consumed
        for p in range(partitions):
            assert second.committed(KpTopicPartition(topic, p)) == 20
    finally:
        second.close()
    assert fetch_committed(gbroker.bootstrap, group, topic, partitions) == dict.fromkeys(range(partitions), 20)


@pytest.mark.matrix("consumer: commit, restart, resume from the committed offset", client="aiokafka")
def test_aiokafka_group_consume_commit_resume(gbroker) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    topic, group, partitions = "aio-group", "aio-group", 3
    create_topic(gbroker.bootstrap, topic, partitions)
    placed = produce(gbroker.bootstrap, topic, partitions, 60)
    halfway = {0: 4, 1: 11, 2: 19}

    async def consume(c: Any, expect: int) -> list[tuple[int, int]]:
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < expect and time.monotonic() < deadline:
            for messages in (await c.getmany(timeout_ms=200)).values():
                got += [(m.partition, m.offset) for m in messages]
        for messages in (await c.getmany(timeout_ms=500)).values():
            got += [(m.partition, m.offset) for m in messages]
        return got

    async def run() -> None:
        def consumer() -> Any:
            return AIOKafkaConsumer(
                topic,
                bootstrap_servers=gbroker.bootstrap,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
            )

        first = consumer()
        await first.start()
        try:
            got = await consume(first, len(placed))
            assert sorted(got) == sorted(placed)
            await first.commit({AioTopicPartition(topic, p): (o, f"aio-{p}") for p, o in halfway.items()})
            for p, o in halfway.items():
                assert await first.committed(AioTopicPartition(topic, p)) == o
        finally:
            await first.stop()
        second = consumer()
        await second.start()
        try:
            got = await consume(second, sum(20 - o for o in halfway.values()))
            assert sorted(got) == sorted((p, o) for p, o in placed if o >= halfway[p]), "did not resume at the commit"
            await second.commit()
            for p in range(partitions):
                assert await second.committed(AioTopicPartition(topic, p)) == 20
        finally:
            await second.stop()

    asyncio.run(run())
    assert fetch_committed(gbroker.bootstrap, group, topic, partitions) == dict.fromkeys(range(partitions), 20)


class KpMember(threading.Thread):
    """A kafka-python group member (range, its default) committing synchronously after every poll."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(name="kafka-python", daemon=True)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.assignment: frozenset[int] = frozenset()
        self.processed: list[tuple[int, int]] = []
        self.protocols: list[str] = []
        self.halt = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        from kafka import KafkaConsumer
        from kafka.structs import OffsetAndMetadata

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group,
                client_id="kafka-python",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
            )
            self.protocols = [a.name for a in consumer.config["partition_assignment_strategy"]]
            # The topic's metadata before the first JoinGroup: subscribed at once, kafka-python may join before its
            # first metadata answer, assign nothing ("No partition metadata") and rejoin when the answer comes;
            # in one CI run of 2026-11-28 it then went silent after that second join (no SyncGroup, no heartbeat).
            consumer.partitions_for_topic(self.topic)
            consumer.subscribe([self.topic])
            try:
                while not self.halt.is_set():
                    batches = consumer.poll(timeout_ms=100)
                    self.assignment = frozenset(tp.partition for tp in consumer.assignment())
                    last: dict[Any, int] = {}
                    for tp, messages in batches.items():
                        self.processed += [(m.partition, m.offset) for m in messages]
                        last[tp] = messages[-1].offset + 1
                    if last:
                        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in last.items()})
            finally:
                consumer.close()
                self.assignment = frozenset()
        except BaseException as exc:
            self.crash = exc

    def leave(self) -> None:
        self.halt.set()
        self.join(TIMEOUT_S)
        assert not self.is_alive() and self.crash is None, f"kafka-python member: {self.crash!r}"


@pytest.mark.matrix("group: two members join, rebalance, leave", client="kafka-python")
@pytest.mark.matrix("group: two members join, rebalance, leave", client="confluent")
def test_mixed_kafka_python_and_confluent_members_in_one_range_group(gbroker) -> None:
    topic, group, partitions = "mixed-group", "mixed-group", 4
    create_topic(gbroker.bootstrap, topic, partitions)
    kp = KpMember(gbroker.bootstrap, group, topic)
    ck = CkMember("confluent", gbroker.bootstrap, group, [topic], **{"partition.assignment.strategy": "range"})
    kp.start()
    try:
        wait_for(
            lambda: kp.assignment == frozenset(range(partitions)),
            lambda: (
                f"the kafka-python member's assignment ({sorted(kp.assignment)}, running {kp.is_alive()}, "
                f"crash {kp.crash!r})"
            ),
        )
        assert kp.protocols[0] == "range"
        ck.start()
        wait_for(
            lambda: len(kp.assignment) == 2 and len(ck.partitions(topic)) == 2,
            lambda: f"a 2 + 2 split (kafka-python {sorted(kp.assignment)}, confluent {sorted(ck.partitions())})",
        )
        assert kp.assignment | ck.partitions(topic) == frozenset(range(partitions))
        description = describe_group(admin(gbroker.bootstrap), group)
        assert description.partition_assignor == "range"
        assert sorted(m.client_id for m in description.members) == ["confluent", "kafka-python"]

        placed = produce(gbroker.bootstrap, topic, partitions, 80)
        wait_for(lambda: len(kp.processed) + len(ck.processed) >= len(placed), "both members to process everything")
        assert {p for p, _ in kp.processed} == set(kp.assignment)
        assert {p for _, p, _ in ck.processed} == set(ck.partitions(topic))
        processed = [*kp.processed, *((p, o) for _, p, o in ck.processed)]
        assert sorted(processed) == sorted(placed), "a record was lost or processed twice"
        wait_for(
            lambda: fetch_committed(gbroker.bootstrap, group, topic, partitions) == dict.fromkeys(range(4), 20),
            "both members' commits",
            step=0.2,
        )

        kp.leave()
        wait_for(lambda: ck.partitions(topic) == frozenset(range(partitions)), "confluent to take all partitions")
        more = produce(gbroker.bootstrap, topic, partitions, 40, prefix="more-")
        wait_for(lambda: len(ck.processed) >= 20 + 40, "confluent to process the new records")
        time.sleep(0.3)
        assert sorted((p, o) for _, p, o in ck.processed[-40:]) == sorted(more), "resumed at the wrong offsets"
    finally:
        ck.leave()
        if kp.is_alive():
            kp.leave()
    assert not ck.failed_commits and not ck.lost_commits
    assert fetch_committed(gbroker.bootstrap, group, topic, partitions) == dict.fromkeys(range(4), 30)


# --- 4. admin ------------------------------------------------------------------------------------------------


@pytest.fixture
def kp_admin(gbroker) -> Iterable[Any]:
    """kafka-python's admin client: it has OffsetDelete and LeaveGroup v3+ (confluent-kafka's has neither)."""
    from kafka.admin import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=gbroker.bootstrap)
    yield client
    client.close()


@pytest.mark.matrix("admin: list and describe groups", client="confluent")
def test_admin_list_describe_offsets_alter_delete(gbroker, kp_admin) -> None:
    from kafka import TopicPartition as KpTopicPartition

    topic, group, partitions = "admin-groups", "admin-groups", 4
    create_topic(gbroker.bootstrap, topic, partitions)
    produce(gbroker.bootstrap, topic, partitions, 40)  # 10 per partition
    client = admin(gbroker.bootstrap)
    members = [CkMember(f"admin-m{i}", gbroker.bootstrap, group, [topic]) for i in range(2)]
    for m in members:
        m.start()
    try:
        wait_for(lambda: spread_is(members, topic, partitions, [2, 2]), "a 2 + 2 split")
        wait_for(
            lambda: sorted(o for m in members for o in m.committed.values()) == [10] * partitions,
            "both members to commit everything",
        )
        assert admin_offsets(client, group, topic, partitions) == dict.fromkeys(range(partitions), 10)

        listed = listed_groups(client)
        assert group in listed
        assert listed[group].state == ConsumerGroupState.STABLE
        assert not listed[group].is_simple_consumer_group
        for states, present in (({ConsumerGroupState.STABLE}, True), ({ConsumerGroupState.EMPTY}, False)):
            result = client.list_consumer_groups(states=states, request_timeout=10).result(timeout=TIMEOUT_S)
            assert (group in {g.group_id for g in result.valid}) is present, states
        description = describe_group(client, group)
        assert description.group_id == group
        assert description.state == ConsumerGroupState.STABLE
        assert description.partition_assignor == "range"
        assert not description.is_simple_consumer_group
        assert description.coordinator.port == gbroker.port
        by_client = {m.client_id: m for m in description.members}
        assert sorted(by_client) == ["admin-m0", "admin-m1"]
        for m in members:
            described = by_client[m.name]
            assert described.member_id.startswith(m.name)
            assert described.host
            assert {(tp.topic, tp.partition) for tp in described.assignment.topic_partitions} == set(m.assignment)

        # a group with active members can be neither deleted nor have its offsets altered or deleted; in the same
        # DeleteGroups a group that only has offsets goes
        idle = f"{group}-idle"
        request = ConsumerGroupTopicPartitions(idle, [TopicPartition(topic, 3, 1)])
        client.alter_consumer_group_offsets([request], request_timeout=10)[idle].result(timeout=TIMEOUT_S)
        assert listed_groups(client)[idle].state == ConsumerGroupState.EMPTY
        deleting = client.delete_consumer_groups([group, idle], request_timeout=10)
        with pytest.raises(KafkaException) as raised:
            deleting[group].result(timeout=TIMEOUT_S)
        assert error_code(raised.value) == KafkaError.NON_EMPTY_GROUP
        deleting[idle].result(timeout=TIMEOUT_S)
        assert idle not in listed_groups(client) and group in listed_groups(client)
        assert admin_offsets(client, idle, topic, partitions) == dict.fromkeys(range(partitions), -1)
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 3)])
        answer = client.alter_consumer_group_offsets([request], request_timeout=10)[group].result(timeout=TIMEOUT_S)
        assert [tp.error.code() for tp in answer.topic_partitions] == [KafkaError.UNKNOWN_MEMBER_ID]
        answer = kp_admin.delete_group_offsets(group, [KpTopicPartition(topic, 1)])
        assert [e.__name__ for e in answer.values()] == ["GroupSubscribedToTopicError"]
        assert admin_offsets(client, group, topic, partitions) == dict.fromkeys(range(4), 10)
    finally:
        for m in members:
            m.leave()

    wait_for(lambda: describe_group(client, group).state == ConsumerGroupState.EMPTY, "the group to be Empty")
    description = describe_group(client, group)
    assert description.members == []
    assert listed_groups(client)[group].state == ConsumerGroupState.EMPTY

    # an empty group: alter and delete offsets
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 3), TopicPartition(topic, 2, 8)])
    altered = client.alter_consumer_group_offsets([request], request_timeout=10)[group].result(timeout=TIMEOUT_S)
    assert {(tp.partition, tp.offset) for tp in altered.topic_partitions} == {(0, 3), (2, 8)}
    answer = kp_admin.delete_group_offsets(group, [KpTopicPartition(topic, 1)])
    assert {tp.partition: e.__name__ for tp, e in answer.items()} == {1: "NoError"}
    assert admin_offsets(client, group, topic, partitions) == {0: 3, 1: -1, 2: 8, 3: 10}
    listed_offsets = kp_admin.list_group_offsets(group)[group]  # OffsetFetch for all of the group's partitions
    assert {tp: meta.offset for tp, meta in listed_offsets.items()} == {
        KpTopicPartition(topic, 0): 3,
        KpTopicPartition(topic, 2): 8,
        KpTopicPartition(topic, 3): 10,
    }
    # the group's consumers start where the offsets now say (partition 1 from auto.offset.reset: earliest)
    got = consume_assigned(gbroker.bootstrap, group, topic, partitions, expect=7 + 10 + 2)
    assert sorted(got) == [*((0, o) for o in range(3, 10)), *((1, o) for o in range(10)), (2, 8), (2, 9)]

    client.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=TIMEOUT_S)
    assert group not in listed_groups(client)
    assert admin_offsets(client, group, topic, partitions) == dict.fromkeys(range(4), -1)
    assert describe_group(client, group).state == ConsumerGroupState.DEAD
    with pytest.raises(KafkaException) as raised:
        client.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=TIMEOUT_S)
    assert error_code(raised.value) == KafkaError.GROUP_ID_NOT_FOUND


def test_admin_removes_a_member_which_then_rejoins(gbroker, kp_admin) -> None:
    from kafka.admin import MemberToRemove

    topic, group = "admin-remove", "admin-remove"
    create_topic(gbroker.bootstrap, topic, 2)
    produce(gbroker.bootstrap, topic, 2, 10)
    client = admin(gbroker.bootstrap)
    member = CkMember("removed", gbroker.bootstrap, group, [topic])
    member.start()
    try:
        wait_for(lambda: sorted(member.committed.values()) == [5, 5], "the commits")
        removed = describe_group(client, group).members[0].member_id
        answer = kp_admin.remove_group_members(group, [MemberToRemove(member_id=removed)])  # LeaveGroup v3+
        assert {k: e.__name__ for k, e in answer.items()} == {removed: "NoError"}
        answer = kp_admin.remove_group_members(group, [MemberToRemove(member_id="nobody")])
        assert {k: e.__name__ for k, e in answer.items()} == {"nobody": "UnknownMemberIdError"}

        def rejoined() -> bool:
            description = describe_group(client, group)
            ids = [m.member_id for m in description.members]
            return description.state == ConsumerGroupState.STABLE and len(ids) == 1 and ids != [removed]

        wait_for(rejoined, "the member to rejoin with a new member id", step=0.2)
        more = produce(gbroker.bootstrap, topic, 2, 10, prefix="more-")
        wait_for(lambda: len(member.processed) == 20, "the member to carry on")
    finally:
        member.leave()
    assert sorted((p, o) for _, p, o in member.processed[10:]) == sorted(more)
    assert not member.failed_commits and not member.lost_commits


def test_deleting_a_topic_deletes_the_groups_offsets_for_it(gbroker) -> None:
    doomed, kept, group = "doomed-topic", "kept-topic", "topic-deleter"
    create_topic(gbroker.bootstrap, doomed, 2)
    create_topic(gbroker.bootstrap, kept, 1)
    produce(gbroker.bootstrap, doomed, 2, 40)  # 20 per partition
    produce(gbroker.bootstrap, kept, 1, 5)
    member = CkMember("deleter", gbroker.bootstrap, group, [doomed, kept])
    member.start()
    try:
        wait_for(
            lambda: member.committed == {(doomed, 0): 20, (doomed, 1): 20, (kept, 0): 5},
            "commits of everything on both topics",
        )
    finally:
        member.leave()
    client = admin(gbroker.bootstrap)
    assert admin_offsets(client, group, doomed, 2) == {0: 20, 1: 20}

    client.delete_topics([doomed], operation_timeout=10)[doomed].result(timeout=TIMEOUT_S)
    assert admin_offsets(client, group, doomed, 2) == {0: -1, 1: -1}
    assert admin_offsets(client, group, kept, 1) == {0: 5}
    create_topic(gbroker.bootstrap, doomed, 2)
    placed = produce(gbroker.bootstrap, doomed, 2, 60, prefix="again-")  # 30 per partition: more than before

    member = CkMember("deleter-again", gbroker.bootstrap, group, [doomed, kept])
    member.start()
    try:
        wait_for(lambda: len(member.processed) >= 60, "the group to consume the recreated topic")
        time.sleep(0.5)
    finally:
        member.leave()
    # from auto.offset.reset (earliest), not from the old offsets (20); nothing again from the kept topic
    assert sorted((p, o) for t, p, o in member.processed) == sorted(placed)
    assert all(t == doomed for t, _, _ in member.processed)
    assert admin_offsets(client, group, doomed, 2) == {0: 30, 1: 30}


# --- 5. committed offsets across restarts ---------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["kafka", "rocketmq"])
@pytest.mark.parametrize("how", ["clean-stop", "sigkill", "sigkill-flush-every-message"])
def test_committed_offsets_survive_a_restart(start_broker, how: str, engine: str) -> None:
    broker = start_broker(
        {"group.initial.rebalance.delay.ms": 0}, engine=engine, sync_flush=how == "sigkill-flush-every-message"
    )
    topic, group, partitions = "restart-offsets", "restart-offsets", 3
    create_topic(broker.bootstrap, topic, partitions)
    placed = produce(broker.bootstrap, topic, partitions, 90)  # 30 per partition
    targets = {0: 5, 1: 17, 2: 29}

    consumer = group_consumer(broker.bootstrap, group)
    consumer.subscribe([topic])
    try:
        got = 0
        deadline = time.monotonic() + TIMEOUT_S
        while got < len(placed) and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                got += 1
                if msg.offset() % 10 == 0:  # a history of commits: the last one must win after the restart
                    consumer.commit(message=msg, asynchronous=False)
        assert got == len(placed)
        final = [TopicPartition(topic, p, o, metadata=f"meta-{p}") for p, o in targets.items()]
        consumer.commit(offsets=final, asynchronous=False)
    finally:
        consumer.close()
    assert fetch_committed(broker.bootstrap, group, topic, partitions) == targets

    if how == "clean-stop":
        broker.stop()
    else:
        broker.kill()
    broker.restart()

    assert fetch_committed(broker.bootstrap, group, topic, partitions) == targets
    checker = group_consumer(broker.bootstrap, group)
    try:
        answer = checker.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT_S)
    finally:
        checker.close()
    assert {tp.partition: tp.metadata for tp in answer} == {p: f"meta-{p}" for p in range(partitions)}
    client = admin(broker.bootstrap)
    assert listed_groups(client)[group].state == ConsumerGroupState.EMPTY

    member = CkMember("after-restart", broker.bootstrap, group, [topic])
    member.start()
    try:
        expected = sorted((p, o) for p, o in placed if o >= targets[p])
        wait_for(lambda: len(member.processed) >= len(expected), "the new member to consume the rest")
        time.sleep(0.5)
    finally:
        member.leave()
    assert sorted((p, o) for _, p, o in member.processed) == expected, "did not resume right after the commits"
    assert fetch_committed(broker.bootstrap, group, topic, partitions) == dict.fromkeys(range(partitions), 30)


def test_a_group_with_live_members_survives_a_broker_kill(start_broker) -> None:
    """The coordinator reloads the group, members included: they carry on where they were, without a rebalance."""
    broker = start_broker(group_initial_rebalance_delay_ms=0)
    topic, group, partitions = "live-restart", "live-restart", 2
    create_topic(broker.bootstrap, topic, partitions)
    first = produce(broker.bootstrap, topic, partitions, 20)
    # librdkafka itself leaves and rejoins when it has not reached its coordinator for a whole session: a session
    # longer than any restart on a loaded machine keeps this test about the coordinator's reload
    session = {"session.timeout.ms": 30_000}
    members = [CkMember(f"live-m{i}", broker.bootstrap, group, [topic], **session) for i in range(2)]
    for m in members:
        m.start()
    try:
        wait_for(lambda: spread_is(members, topic, partitions, [1, 1]), "a 1 + 1 split")
        wait_for(lambda: sum(len(m.processed) for m in members) == 20, "the members to process everything")
        wait_for(lambda: fetch_committed(broker.bootstrap, group, topic, 2) == {0: 10, 1: 10}, "the commits", step=0.2)
        before = [(m.assignment, m.assigns) for m in members]
        broker.kill()
        broker.restart()
        assert listed_groups(admin(broker.bootstrap))[group].state == ConsumerGroupState.STABLE
        second = produce(broker.bootstrap, topic, partitions, 20, prefix="after-")
        wait_for(
            lambda: sum(len(m.processed) for m in members) == 40,
            "the members to carry on after the restart",
            timeout=TIMEOUT_S,
        )
        wait_for(lambda: fetch_committed(broker.bootstrap, group, topic, 2) == {0: 20, 1: 20}, "commits", step=0.2)
        time.sleep(0.5)
        assert [(m.assignment, m.assigns) for m in members] == before, "the members were rebalanced"
        description = describe_group(admin(broker.bootstrap), group)
        assert sorted(m.client_id for m in description.members) == ["live-m0", "live-m1"]
    finally:
        for m in members:
            m.leave()
    processed = sorted((p, o) for m in members for _, p, o in m.processed)
    assert processed == sorted([*first, *second]), "records lost or processed twice across the restart"
    for m in members:
        assert not m.failed_commits and not m.lost_commits and not m.retried_commits, m.name


# --- 6. the coordinator's errors, on raw requests -------------------------------------------------------------


def _str(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _bytes(value: bytes | None) -> bytes:
    return struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value


def _array(items: Sequence[bytes]) -> bytes:
    return struct.pack(">i", len(items)) + b"".join(items)


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def _take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def int64(self) -> int:
        return self._take(">q")

    def string(self) -> str | None:
        length = self.int16()
        if length < 0:
            return None
        self.pos += length
        return self.data[self.pos - length : self.pos].decode()

    def bytes_(self) -> bytes | None:
        length = self.int32()
        if length < 0:
            return None
        self.pos += length
        return self.data[self.pos - length : self.pos]

    def done(self) -> None:
        assert self.pos == len(self.data), f"{len(self.data) - self.pos} bytes left over in the response"


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0."""
    return struct.pack(">h", 0) + _array([_str(t) for t in topics]) + _bytes(None)


def assignment(topic: str, partitions: Sequence[int]) -> bytes:
    """ConsumerProtocolAssignment v0."""
    owned = _str(topic) + _array([struct.pack(">i", p) for p in partitions])
    return struct.pack(">h", 0) + _array([owned]) + _bytes(None)


class Wire:
    """One connection speaking the group APIs' non-flexible versions, encoded by hand (request header v1)."""

    def __init__(self, broker: Any, client_id: str = "raw-groups") -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=TIMEOUT_S)
        self.client_id = client_id
        self.correlation = 0
        self.sent: list[int] = []

    def close(self) -> None:
        self.sock.close()

    def send(self, api_key: int, version: int, body: bytes) -> int:
        self.correlation += 1
        payload = struct.pack(">hhi", api_key, version, self.correlation) + _str(self.client_id) + body
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        self.sent.append(self.correlation)
        return self.correlation

    def receive(self) -> Reader:
        """The answer to the oldest outstanding request (Kafka answers a connection's requests in order)."""
        size = struct.unpack(">i", self._exactly(4))[0]
        reader = Reader(self._exactly(size))
        assert reader.int32() == self.sent.pop(0), "answers out of order"
        return reader

    def _exactly(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return bytes(data)

    # --- requests (each returns the parsed answer) ---

    def join_send(
        self,
        group: str,
        member_id: str = "",
        session_ms: int = SESSION_MS,
        *,
        version: int = 1,
        rebalance_ms: int = 10_000,
        topic: str = "raw-topic",
        protocol_type: str = "consumer",
        protocols: Sequence[str] = ("range",),
    ) -> None:
        assert 1 <= version <= 4
        offered = [_str(name) + _bytes(subscription(topic)) for name in protocols]
        body = (
            _str(group)
            + struct.pack(">ii", session_ms, rebalance_ms)
            + _str(member_id)
            + _str(protocol_type)
            + _array(offered)
        )
        self.send(JOIN_GROUP, version, body)

    def join_receive(self, version: int = 1) -> dict[str, Any]:
        r = self.receive()
        if version >= 2:
            r.int32()  # throttle_time_ms
        answer = {
            "error": r.int16(),
            "generation": r.int32(),
            "protocol": r.string(),
            "leader": r.string(),
            "member_id": r.string(),
        }
        answer["members"] = {r.string(): r.bytes_() for _ in range(r.int32())}
        r.done()
        return answer

    def join(self, group: str, member_id: str = "", session_ms: int = SESSION_MS, **kw: Any) -> dict[str, Any]:
        self.join_send(group, member_id, session_ms, **kw)
        return self.join_receive(kw.get("version", 1))

    def sync_send(self, group: str, generation: int, member_id: str, assignments: dict[str, bytes]) -> None:
        items = [_str(m) + _bytes(a) for m, a in assignments.items()]
        self.send(SYNC_GROUP, 0, _str(group) + struct.pack(">i", generation) + _str(member_id) + _array(items))

    def sync_receive(self) -> tuple[int, bytes | None]:
        r = self.receive()
        answer = (r.int16(), r.bytes_())
        r.done()
        return answer

    def sync(self, group: str, generation: int, member_id: str, assignments: dict[str, bytes]) -> tuple[int, Any]:
        self.sync_send(group, generation, member_id, assignments)
        return self.sync_receive()

    def heartbeat(self, group: str, generation: int, member_id: str) -> int:
        self.send(HEARTBEAT, 0, _str(group) + struct.pack(">i", generation) + _str(member_id))
        r = self.receive()
        error = r.int16()
        r.done()
        return error

    def leave(self, group: str, member_id: str) -> int:
        self.send(LEAVE_GROUP, 0, _str(group) + _str(member_id))
        r = self.receive()
        error = r.int16()
        r.done()
        return error

    def commit(
        self, group: str, generation: int, member_id: str, topic: str, offsets: dict[int, int], metadata: str = ""
    ) -> dict[int, int]:
        """OffsetCommit v2; returns {partition: error code}."""
        partitions = [struct.pack(">iq", p, o) + _str(metadata) for p, o in offsets.items()]
        body = _str(group) + struct.pack(">i", generation) + _str(member_id) + struct.pack(">q", -1)
        self.send(OFFSET_COMMIT, 2, body + _array([_str(topic) + _array(partitions)]))
        r = self.receive()
        errors: dict[int, int] = {}
        for _ in range(r.int32()):
            assert r.string() == topic
            for _ in range(r.int32()):
                partition = r.int32()
                errors[partition] = r.int16()
        r.done()
        return errors

    def fetch(self, group: str, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        """OffsetFetch v1; returns {partition: (offset, error code)}."""
        wanted = _str(topic) + _array([struct.pack(">i", p) for p in partitions])
        self.send(OFFSET_FETCH, 1, _str(group) + _array([wanted]))
        r = self.receive()
        answers: dict[int, tuple[int, int]] = {}
        for _ in range(r.int32()):
            assert r.string() == topic
            for _ in range(r.int32()):
                partition, offset = r.int32(), r.int64()
                r.string()  # metadata
                answers[partition] = (offset, r.int16())
        r.done()
        return answers


@pytest.fixture
def wires(gbroker) -> Iterable[Callable[[], Wire]]:
    opened: list[Wire] = []

    def wire() -> Wire:
        opened.append(Wire(gbroker))
        return opened[-1]

    yield wire
    for w in opened:
        w.close()


def test_unknown_member_and_illegal_generation(gbroker, wires) -> None:
    group, topic = "raw-errors", "raw-errors"
    create_topic(gbroker.bootstrap, topic, 2)
    a, b = wires(), wires()

    # nobody is in the group yet: every member id is unknown
    assert a.heartbeat(group, 0, "bogus") == UNKNOWN_MEMBER_ID
    assert a.join(group, "bogus", topic=topic)["error"] == UNKNOWN_MEMBER_ID
    assert a.sync(group, 0, "bogus", {})[0] == UNKNOWN_MEMBER_ID

    joined = a.join(group, topic=topic)  # JoinGroup v1: no MEMBER_ID_REQUIRED round
    assert joined["error"] == NONE and joined["member_id"] and joined["leader"] == joined["member_id"]
    assert joined["protocol"] == "range" and list(joined["members"]) == [joined["member_id"]]
    me, gen1 = joined["member_id"], joined["generation"]
    mine = assignment(topic, [0, 1])
    assert a.sync(group, gen1, me, {me: mine}) == (NONE, mine)
    assert a.heartbeat(group, gen1, me) == NONE
    assert a.commit(group, gen1, me, topic, {0: 3, 1: 4}) == {0: NONE, 1: NONE}

    # a member id the group does not know, with the right generation
    assert a.heartbeat(group, gen1, "bogus") == UNKNOWN_MEMBER_ID
    assert a.commit(group, gen1, "bogus", topic, {0: 99}) == {0: UNKNOWN_MEMBER_ID}
    assert a.sync(group, gen1, "bogus", {})[0] == UNKNOWN_MEMBER_ID
    assert a.leave(group, "bogus") == UNKNOWN_MEMBER_ID
    # the right member with a generation that is not the group's
    for stale in (gen1 - 1, gen1 + 1):
        assert a.heartbeat(group, stale, me) == ILLEGAL_GENERATION
        assert a.commit(group, stale, me, topic, {0: 99}) == {0: ILLEGAL_GENERATION}
        assert a.sync(group, stale, me, {me: mine})[0] == ILLEGAL_GENERATION
    # a "simple" commit (generation -1, no member) while the group has members
    assert a.commit(group, -1, "", topic, {0: 99}) == {0: UNKNOWN_MEMBER_ID}
    assert a.fetch(group, topic, [0, 1]) == {0: (3, NONE), 1: (4, NONE)}

    # a second member joins: the group prepares a rebalance and waits for the first to rejoin
    b.join_send(group, topic=topic)
    wait_for(lambda: a.heartbeat(group, gen1, me) == REBALANCE_IN_PROGRESS, "the first member to hear of the join")
    # while the group prepares the rebalance, the old generation may still commit (as Kafka allows)
    assert a.commit(group, gen1, me, topic, {0: 5}) == {0: NONE}
    rejoined = a.join(group, me, topic=topic)
    other = b.join_receive()
    gen2 = rejoined["generation"]
    assert rejoined["error"] == other["error"] == NONE
    assert gen2 == other["generation"] == gen1 + 1
    assert rejoined["leader"] == other["leader"] == me, "the leader stays the leader"
    assert set(rejoined["members"]) == {me, other["member_id"]} and other["members"] == {}

    # the old generation is over; the new one cannot commit until its assignments are out
    assert a.heartbeat(group, gen1, me) == ILLEGAL_GENERATION
    assert a.commit(group, gen1, me, topic, {0: 99}) == {0: ILLEGAL_GENERATION}
    assert a.sync(group, gen1, me, {})[0] == ILLEGAL_GENERATION
    assert b.commit(group, gen2, other["member_id"], topic, {1: 99}) == {1: REBALANCE_IN_PROGRESS}

    b.sync_send(group, gen2, other["member_id"], {})  # a follower waits for the leader's assignments
    theirs, mine = assignment(topic, [1]), assignment(topic, [0])
    assert a.sync(group, gen2, me, {me: mine, other["member_id"]: theirs}) == (NONE, mine)
    assert b.sync_receive() == (NONE, theirs)
    assert a.heartbeat(group, gen2, me) == NONE
    assert b.heartbeat(group, gen2, other["member_id"]) == NONE
    assert b.commit(group, gen2, other["member_id"], topic, {1: 6}) == {1: NONE}
    assert a.fetch(group, topic, [0, 1]) == {0: (5, NONE), 1: (6, NONE)}

    # a member that left is unknown; the other one has to rejoin
    assert b.leave(group, other["member_id"]) == NONE
    assert b.leave(group, other["member_id"]) == UNKNOWN_MEMBER_ID
    assert b.heartbeat(group, gen2, other["member_id"]) == UNKNOWN_MEMBER_ID
    assert b.commit(group, gen2, other["member_id"], topic, {1: 99}) == {1: UNKNOWN_MEMBER_ID}
    assert a.heartbeat(group, gen2, me) == REBALANCE_IN_PROGRESS
    assert a.leave(group, me) == NONE
    # empty again: "simple" commits are fine now
    assert a.commit(group, -1, "", topic, {0: 7}) == {0: NONE}
    assert a.fetch(group, topic, [0, 1]) == {0: (7, NONE), 1: (6, NONE)}


def test_member_id_required_then_join(gbroker, wires) -> None:
    group = "raw-member-id"
    a = wires()
    first = a.join(group, version=4)
    assert first["error"] == MEMBER_ID_REQUIRED
    assert first["member_id"].startswith("raw-groups-") and first["generation"] == -1
    joined = a.join(group, first["member_id"], version=4)
    assert joined["error"] == NONE and joined["member_id"] == first["member_id"]
    assert a.join(group, "made-up-id", version=4)["error"] == UNKNOWN_MEMBER_ID
    assert a.leave(group, first["member_id"]) == NONE


@pytest.mark.parametrize("session_ms", [0, 1000, SESSION_MS - 1, 1_800_001])
def test_session_timeout_outside_the_brokers_bounds(gbroker, wires, session_ms: int) -> None:
    """group.min.session.timeout.ms (6000) <= session.timeout.ms <= group.max.session.timeout.ms (1800000)."""
    group = f"raw-session-{session_ms}"
    a = wires()
    answer = a.join(group, session_ms=session_ms)
    assert answer["error"] == INVALID_SESSION_TIMEOUT
    assert answer["generation"] == -1
    assert a.join(group, session_ms=SESSION_MS)["error"] == NONE  # the bounds themselves are fine


def test_confluent_consumer_with_a_too_short_session_gets_an_error(gbroker) -> None:
    topic, group = "short-session", "short-session"
    create_topic(gbroker.bootstrap, topic, 1)
    consumer = group_consumer(gbroker.bootstrap, group, **{"session.timeout.ms": 3000, "heartbeat.interval.ms": 500})
    errors: list[KafkaError] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is not None:
                errors.append(msg.error())
        assert consumer.assignment() == []
    finally:
        consumer.close()
    assert [e.code() for e in errors] == [KafkaError.INVALID_SESSION_TIMEOUT]


def test_session_timeout_bounds_follow_the_config(start_broker) -> None:
    broker = start_broker(group_min_session_timeout_ms=10_000, group_max_session_timeout_ms=20_000)
    a = Wire(broker)
    try:
        for session_ms, expected in (
            (SESSION_MS, INVALID_SESSION_TIMEOUT),
            (9_999, INVALID_SESSION_TIMEOUT),
            (20_001, INVALID_SESSION_TIMEOUT),
            (10_000, NONE),
            (20_000, NONE),
        ):
            answer = a.join(f"bounds-{session_ms}", session_ms=session_ms)
            assert answer["error"] == expected, session_ms
    finally:
        a.close()


def test_inconsistent_protocols_and_too_large_metadata(gbroker, wires) -> None:
    INCONSISTENT_GROUP_PROTOCOL, OFFSET_METADATA_TOO_LARGE = 23, 12
    group, topic = "raw-protocols", "raw-protocols"
    create_topic(gbroker.bootstrap, topic, 1)
    a, b = wires(), wires()
    joined = a.join(group, topic=topic, protocols=("range", "roundrobin"))
    me, generation = joined["member_id"], joined["generation"]
    assert joined["error"] == NONE and joined["protocol"] == "range"
    assert a.sync(group, generation, me, {me: b""})[0] == NONE
    # nothing in common with the members' protocols, or another kind of group: refused
    assert b.join(group, topic=topic, protocols=("cooperative-sticky",))["error"] == INCONSISTENT_GROUP_PROTOCOL
    assert b.join(group, topic=topic, protocol_type="connect")["error"] == INCONSISTENT_GROUP_PROTOCOL
    assert a.heartbeat(group, generation, me) == NONE, "a refused join must not disturb the group"
    # offset metadata is limited to offset.metadata.max.bytes (4096)
    assert a.commit(group, generation, me, topic, {0: 1}, metadata="m" * 4097) == {0: OFFSET_METADATA_TOO_LARGE}
    assert a.commit(group, generation, me, topic, {0: 2}, metadata="m" * 4096) == {0: NONE}
    assert a.fetch(group, topic, [0]) == {0: (2, NONE)}
    assert a.leave(group, me) == NONE


def test_member_that_does_not_rejoin_within_the_rebalance_timeout_is_dropped(gbroker, wires) -> None:
    group, topic = "raw-rebalance-timeout", "raw-rebalance-timeout"
    a, b = wires(), wires()
    joined = a.join(group, topic=topic, rebalance_ms=1500)
    me, generation = joined["member_id"], joined["generation"]
    assert a.sync(group, generation, me, {me: b""})[0] == NONE
    b.join_send(group, topic=topic, rebalance_ms=1500)
    started = time.monotonic()
    # the first member keeps its session alive with heartbeats but never rejoins
    while (error := a.heartbeat(group, generation, me)) == NONE or error == REBALANCE_IN_PROGRESS:
        assert time.monotonic() - started < 10, "the join phase never ended"
        time.sleep(0.1)
    assert error == UNKNOWN_MEMBER_ID
    other = b.join_receive()
    took = time.monotonic() - started
    assert 1.2 <= took <= 3.5, f"the join phase ended after {took:.1f} s, the rebalance timeout is 1.5 s"
    assert other["error"] == NONE and other["generation"] == generation + 1
    assert list(other["members"]) == [other["member_id"]] and other["leader"] == other["member_id"]
    assert b.leave(group, other["member_id"]) == NONE


def test_sigterm_answers_a_join_waiting_for_a_rebalance(start_broker) -> None:
    """A member parked in a JoinGroup when SIGTERM arrives (the rebalance waits up to 60 s for the other member to
    rejoin): its join is answered at once with NOT_COORDINATOR, as Kafka's coordinator answers when it unloads
    its groups (the client looks for the coordinator again), and the broker exits within seconds, not after
    tidelog.shutdown.timeout.ms (30 s)."""
    broker = start_broker(group_initial_rebalance_delay_ms=0)
    group, topic = "shutdown-join", "shutdown-join"
    create_topic(broker.bootstrap, topic, 1)
    a, b = Wire(broker), Wire(broker)
    try:
        joined = a.join(group, topic=topic, rebalance_ms=60_000)
        me, generation = joined["member_id"], joined["generation"]
        assert a.sync(group, generation, me, {me: b""})[0] == NONE
        b.join_send(group, topic=topic, rebalance_ms=60_000)
        wait_for(lambda: a.heartbeat(group, generation, me) == REBALANCE_IN_PROGRESS, "the rebalance to start")
        assert broker.proc is not None
        started = time.monotonic()
        broker.proc.send_signal(signal.SIGTERM)
        answer = b.join_receive()
        answered = time.monotonic() - started
        code = broker.proc.wait(timeout=TIMEOUT_S)
        exited = time.monotonic() - started
    finally:
        a.close()
        b.close()
    assert answer["error"] == NOT_COORDINATOR
    assert code == 0
    assert answered < 3 and exited < 5, f"join answered after {answered:.1f} s, broker exited after {exited:.1f} s"
    assert broker.shut_down_cleanly_on_disk()


def test_commit_to_a_partition_that_does_not_exist(gbroker, wires) -> None:
    """Kafka answers UNKNOWN_TOPIC_OR_PARTITION for a commit to a topic or partition it does not have."""
    group, topic = "raw-commit-nowhere", "raw-commit-nowhere"
    create_topic(gbroker.bootstrap, topic, 1)
    a = wires()
    assert a.commit(group, -1, "", topic, {0: 1}) == {0: NONE}
    assert a.commit(group, -1, "", topic, {5: 1}) == {5: UNKNOWN_TOPIC_OR_PARTITION}
    assert a.commit(group, -1, "", "no-such-topic", {0: 1}) == {0: UNKNOWN_TOPIC_OR_PARTITION}
    assert a.fetch(group, topic, [0, 5]) == {0: (1, NONE), 5: (-1, NONE)}


# --- 7. offsets retention (slow: offsets.retention.minutes is at least a minute) ------------------------------

RETENTION_OVERRIDES = {
    "group.initial.rebalance.delay.ms": 0,
    "offsets.retention.minutes": 1,
    "offsets.retention.check.interval.ms": 500,
}


@pytest.mark.slow
def test_offsets_of_empty_groups_expire_after_the_retention(start_broker) -> None:
    broker = start_broker(RETENTION_OVERRIDES)
    topic, partitions = "retention", 2
    create_topic(broker.bootstrap, topic, partitions)
    produce(broker.bootstrap, topic, partitions, 10)
    client = admin(broker.bootstrap)
    everything = dict.fromkeys(range(partitions), 5)

    # "emptied": a consumer group whose only member commits and leaves
    member = CkMember("emptied", broker.bootstrap, "emptied", [topic])
    member.start()
    wait_for(lambda: sorted(member.committed.values()) == [5, 5], "the commits")
    member.leave()
    emptied_at = time.monotonic()
    # "simple": offsets committed outside any group membership (generation -1)
    request = ConsumerGroupTopicPartitions("simple", [TopicPartition(topic, p, 5) for p in range(partitions)])
    client.alter_consumer_group_offsets([request], request_timeout=10)["simple"].result(timeout=TIMEOUT_S)
    simple_at = time.monotonic()
    # "active": a member stays in the group the whole time; its offsets must not expire
    active = CkMember("active", broker.bootstrap, "active", [topic])
    active.start()
    try:
        wait_for(lambda: sorted(active.committed.values()) == [5, 5], "the active member's commits")
        gone: dict[str, float] = {}
        while len(gone) < 2 and time.monotonic() - emptied_at < 60 + 15:
            for group, since in (("emptied", emptied_at), ("simple", simple_at)):
                if group not in gone and admin_offsets(client, group, topic, partitions) != everything:
                    assert admin_offsets(client, group, topic, partitions) == dict.fromkeys(range(partitions), -1)
                    gone[group] = time.monotonic() - since
            time.sleep(0.5)
        print(f"offsets expired after: {gone}")
        assert set(gone) == {"emptied", "simple"}, f"offsets still there after 75 s: only {gone} expired"
        for group, after in gone.items():
            assert 60 - 1.5 <= after <= 60 + 5, f"{group}: offsets expired {after:.1f} s after the last commit"
        assert admin_offsets(client, "active", topic, partitions) == everything, "an active group lost its offsets"
        assert describe_group(client, "active").state == ConsumerGroupState.STABLE
    finally:
        active.leave()
    # the emptied group's members start over from auto.offset.reset
    got = consume_assigned(broker.bootstrap, "emptied", topic, partitions, expect=10)
    assert first_offsets(got) == dict.fromkeys(range(partitions), 0)


@pytest.mark.slow
def test_offsets_retention_counts_from_when_the_group_became_empty(start_broker) -> None:
    broker = start_broker(RETENTION_OVERRIDES)
    topic, group, partitions = "retention-kip-211", "kip-211", 2
    create_topic(broker.bootstrap, topic, partitions)
    produce(broker.bootstrap, topic, partitions, 10)
    client = admin(broker.bootstrap)
    member = CkMember("long-lived", broker.bootstrap, group, [topic])
    member.start()
    try:
        wait_for(lambda: sorted(member.committed.values()) == [5, 5], "the commits")
        committed_at = time.monotonic()
        # a quiet topic: the member has nothing new to commit, and stays in the group past the retention
        while time.monotonic() - committed_at < 60 + 5:
            assert admin_offsets(client, group, topic, partitions) == {0: 5, 1: 5}, "an active group lost offsets"
            time.sleep(1)
    finally:
        member.leave()
    time.sleep(3)  # several retention checks
    assert admin_offsets(client, group, topic, partitions) == {0: 5, 1: 5}, (
        "the offsets expired right after the group became Empty"
    )


@pytest.mark.slow
def test_an_empty_group_whose_offsets_all_expired_is_removed(start_broker) -> None:
    broker = start_broker(RETENTION_OVERRIDES)
    topic, group, partitions = "retention-dead", "retention-dead", 2
    create_topic(broker.bootstrap, topic, partitions)
    produce(broker.bootstrap, topic, partitions, 10)
    member = CkMember("short-lived", broker.bootstrap, group, [topic])
    member.start()
    wait_for(lambda: sorted(member.committed.values()) == [5, 5], "the commits")
    member.leave()
    client = admin(broker.bootstrap)
    assert listed_groups(client)[group].state == ConsumerGroupState.EMPTY
    wait_for(
        lambda: admin_offsets(client, group, topic, partitions) == {0: -1, 1: -1},
        "the offsets to expire",
        timeout=60 + 15,
        step=0.5,
    )
    time.sleep(1.5)  # a few more retention checks
    assert group not in listed_groups(client), "a group without members or offsets is still listed"
    assert describe_group(client, group).state == ConsumerGroupState.DEAD


def test_offset_commit_v0_has_no_member_id(gbroker) -> None:
    """OffsetCommit v0 carries neither a generation nor a member id (a commit outside the group's generations):
    a group with members refuses it with UNKNOWN_MEMBER_ID, a group without members stores it, and the connection
    stays up. (The protocol fuzzer found v0 failing the handler: it read the member id v0 does not have.)"""
    import kafka_wire

    create_topic(gbroker.bootstrap, "v0-commits", 1)
    consumer = Consumer(
        {"bootstrap.servers": gbroker.bootstrap, "group.id": "v0-members", "session.timeout.ms": SESSION_MS,
         "heartbeat.interval.ms": HEARTBEAT_MS, "enable.auto.commit": False}
    )  # fmt: skip
    try:
        consumer.subscribe(["v0-commits"])
        wait_for(lambda: consumer.poll(0.1) is None and consumer.assignment(), "the consumer's assignment")

        def commit_v0(group: str) -> int:
            body = {
                "group_id": group,
                "topics": [{"name": "v0-commits", "partitions": [{"partition_index": 0, "committed_offset": 3}]}],
            }
            response = kafka_wire.request(gbroker.bootstrap, OFFSET_COMMIT, 0, body)
            return int(response.topics[0].partitions[0].error_code)

        assert commit_v0("v0-members") == UNKNOWN_MEMBER_ID
        assert commit_v0("v0-no-members") == NONE
        stored = Consumer({"bootstrap.servers": gbroker.bootstrap, "group.id": "v0-no-members"})
        try:
            assert stored.committed([TopicPartition("v0-commits", 0)], timeout=TIMEOUT_S)[0].offset == 3
        finally:
            stored.close()
    finally:
        consumer.close()
    assert "unexpected error" not in gbroker.stderr_text()
