"""The consumer group protocol (KIP-848: ConsumerGroupHeartbeat, ConsumerGroupDescribe) against a real `tidelog serve`.

- librdkafka consumers with `group.protocol=consumer`: two members share a topic by the uniform assignor and by the
  range assignor (`group.remote.assignor`); a third joins and a second leaves while records flow: with commits no
  record is lost or consumed twice, and the members that stay are only revoked the partitions that move; a regular
  expression subscription picks up a topic created later; a consumer process killed without leaving is removed when
  its session ends, not before, and its partitions go to the member left;
- raw requests (tests/kafka_wire.py, kio's schemas): the member epochs of the reconciliation (a partition reaches its
  new owner only after the old one revoked it), FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, GROUP_ID_NOT_FOUND,
  UNRELEASED_INSTANCE_ID, FENCED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED, INVALID_REQUEST, UNSUPPORTED_ASSIGNOR,
  INVALID_REGULAR_EXPRESSION; a static member leaving with epoch -2 and its successor taking its partitions over;
  OffsetCommit with the member epoch (STALE_MEMBER_EPOCH, FENCED_MEMBER_EPOCH, UNSUPPORTED_VERSION below v9);
  ListGroups' type filter, DescribeGroups and a classic JoinGroup on a consumer group;
- a coordinator restart: the group comes back from `__consumer_offsets` (epochs, assignments), members go on at
  their epochs, a librdkafka consumer goes on without a duplicate.

The module's broker has short consumer-protocol sessions (`group.consumer.session.timeout.ms` 3 s, heartbeats every
300 ms) and a group size limit of 4.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_wire import request

TIMEOUT_S = 30.0
SESSION_MS = 3000
HEARTBEAT_MS = 300
MAX_SIZE = 4
SETTINGS = {
    "group.consumer.session.timeout.ms": SESSION_MS,
    "group.consumer.min.session.timeout.ms": 1000,
    "group.consumer.heartbeat.interval.ms": HEARTBEAT_MS,
    "group.consumer.min.heartbeat.interval.ms": 100,
    "group.consumer.max.size": MAX_SIZE,
}

NONE, UNKNOWN_MEMBER_ID, INCONSISTENT_GROUP_PROTOCOL, INVALID_REQUEST = 0, 25, 23, 42
UNSUPPORTED_VERSION, GROUP_ID_NOT_FOUND, GROUP_MAX_SIZE_REACHED, FENCED_INSTANCE_ID = 35, 69, 81, 82
FENCED_MEMBER_EPOCH, UNRELEASED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR, STALE_MEMBER_EPOCH = 110, 111, 112, 113
INVALID_REGULAR_EXPRESSION = 128
OFFSET_COMMIT, JOIN_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 8, 11, 15, 16
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69


@pytest.fixture(scope="module")
def kbroker(start_module_broker: Any) -> Any:
    return start_module_broker(SETTINGS)


def create_topics(bootstrap: str, **topics: int) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    futures = client.create_topics([NewTopic(name, n, 1) for name, n in topics.items()])
    for future in futures.values():
        future.result(timeout=TIMEOUT_S)


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def topic_text(topic_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


# --- raw members --------------------------------------------------------------------------------------------------


@dataclass
class Raw:
    """A member speaking ConsumerGroupHeartbeat itself; it gives up what it is told to at once."""

    bootstrap: str
    group: str
    topics: list[str] | None = None
    instance: str | None = None
    assignor: str | None = None
    regex: str | None = None
    member_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    epoch: int = 0
    owned: dict[uuid.UUID, set[int]] = field(default_factory=dict)

    def beat(self, *, epoch: int | None = None, owned: Any = "mine", version: int = 1, **fields: Any) -> Any:
        epoch = self.epoch if epoch is None else epoch
        body = {
            "group_id": self.group,
            "member_id": self.member_id,
            "member_epoch": epoch,
            "instance_id": self.instance,
            "rack_id": None,
            "rebalance_timeout": 5000 if epoch == 0 else -1,
            "subscribed_topic_names": self.topics if epoch == 0 else None,
            "subscribed_topic_regex": self.regex if epoch == 0 and version >= 1 else None,
            "server_assignor": self.assignor if epoch == 0 else None,
            "topic_partitions": [] if epoch == 0 else self._owned() if owned == "mine" else owned,
            **fields,
        }
        if version == 0:
            del body["subscribed_topic_regex"]
        answer = request(self.bootstrap, CONSUMER_GROUP_HEARTBEAT, version, body)
        if answer.error_code == NONE and epoch >= 0:
            self.epoch = answer.member_epoch
            if answer.assignment is not None:
                self.owned = {tp.topic_id: set(tp.partitions) for tp in answer.assignment.topic_partitions}
        return answer

    def _owned(self) -> list[dict[str, Any]]:
        return [{"topic_id": t, "partitions": sorted(ps)} for t, ps in self.owned.items()]

    def partitions(self) -> set[int]:
        return {p for ps in self.owned.values() for p in ps}


def describe(bootstrap: str, group: str, version: int = 1) -> Any:
    body = {"group_ids": [group], "include_authorized_operations": False}
    return request(bootstrap, CONSUMER_GROUP_DESCRIBE, version, body).groups[0]


def settle(members: list[Raw], group_size: int | None = None, rounds: int = 20) -> None:
    """Heartbeat every member until all are at the group's assignment epoch and stable."""
    for _ in range(rounds):
        for member in members:
            assert member.beat().error_code == NONE
        described = describe(members[0].bootstrap, members[0].group)
        if described.group_state == "Stable" and (group_size is None or len(described.members) == group_size):
            return
    raise AssertionError(f"the group did not settle: {describe(members[0].bootstrap, members[0].group)}")


def commit(raw: Raw, topic: str, epoch: int, version: int = 9) -> int:
    body = {
        "group_id": raw.group,
        "generation_id_or_member_epoch": epoch,
        "member_id": raw.member_id,
        "group_instance_id": None,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1}]}],
    }
    return int(request(raw.bootstrap, OFFSET_COMMIT, version, body).topics[0].partitions[0].error_code)


# --- librdkafka consumers -----------------------------------------------------------------------------------------


@dataclass
class Tracked:
    """A librdkafka consumer of the consumer protocol on its own polling thread, committing each record it reads."""

    name: str
    consumer: Consumer
    seen: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset)
    events: list[tuple[str, set[int]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    closed: bool = False

    def assignment(self) -> set[int]:
        held: set[int] = set()
        for kind, partitions in self.events:
            held = held | partitions if kind == "assign" else held - partitions
        return held

    def run(self) -> None:
        while not self.stop.is_set():
            message: Message | None = self.consumer.poll(0.1)
            if message is None:
                continue
            if message.error():
                self.errors.append(str(message.error()))
                continue
            self.seen.append((message.partition(), message.offset()))
            try:
                self.consumer.commit(message=message, asynchronous=False)
            except Exception as exc:
                self.errors.append(f"commit: {exc}")

    def halt(self) -> None:
        """Stop polling (the consumer's other calls block while another thread polls)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(TIMEOUT_S)

    def committed(self, topic: str, partitions: int) -> int:
        """The sum of the committed offsets of `topic` (after `halt`)."""
        answer = self.consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return sum(tp.offset for tp in answer)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.halt()
            self.consumer.close()


def start_consumer(bootstrap: str, group: str, name: str, topics: list[str], **extra: Any) -> Tracked:
    settings = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "client.id": name,
        **extra,
    }
    tracked = Tracked(name, Consumer(settings))
    tracked.consumer.subscribe(
        topics,
        on_assign=lambda c, ps: tracked.events.append(("assign", {p.partition for p in ps})),
        on_revoke=lambda c, ps: tracked.events.append(("revoke", {p.partition for p in ps})),
    )
    tracked.thread = threading.Thread(target=tracked.run, name=name, daemon=True)
    tracked.thread.start()
    return tracked


def assert_only_stale_commits(errors: list[str]) -> None:
    """A commit sent with the epoch its member has just left behind (its heartbeat answer brought the next one) is
    refused with STALE_MEMBER_EPOCH, as Kafka refuses it; a later commit covers its offsets. Nothing else fails."""
    assert all(e.startswith("commit:") and "STALE_MEMBER_EPOCH" in e for e in errors), errors


@pytest.fixture
def consumers() -> Iterator[list[Tracked]]:
    started: list[Tracked] = []
    yield started
    for tracked in started:
        tracked.close()


def produce(bootstrap: str, topic: str, count: int, partitions: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(start, start + count):
        producer.produce(topic, str(i).encode(), partition=i % partitions)
    assert producer.flush(TIMEOUT_S) == 0


# --- assignors, with librdkafka ------------------------------------------------------------------------------------


def test_uniform_assignor_spreads_partitions_between_two_consumers(kbroker: Any, consumers: list[Tracked]) -> None:
    create_topics(kbroker.bootstrap, uni=6)
    consumers += [start_consumer(kbroker.bootstrap, "uni-g", f"uni-{i}", ["uni"]) for i in range(2)]
    wait_for(lambda: all(len(c.assignment()) == 3 for c in consumers), "3 partitions each")
    assert consumers[0].assignment() | consumers[1].assignment() == set(range(6))
    described = describe(kbroker.bootstrap, "uni-g")
    assert described.error_code == NONE and described.group_state == "Stable"
    assert described.assignor_name == "uniform"
    assert described.assignment_epoch == described.group_epoch
    for member in described.members:
        assert member.member_epoch == described.group_epoch
        assert member.subscribed_topic_names == ("uni",)
        assert member.member_type == 1
        partitions = [tp.partitions for tp in member.assignment.topic_partitions]
        assert [len(p) for p in partitions] == [3] and member.assignment == member.target_assignment
        assert member.assignment.topic_partitions[0].topic_name == "uni"


def test_range_assignor_gives_each_member_the_same_range_of_every_topic(kbroker: Any, consumers: list[Tracked]) -> None:
    create_topics(kbroker.bootstrap, rng_a=3, rng_b=3)
    consumers += [
        start_consumer(kbroker.bootstrap, "rng-g", f"rng-{i}", ["rng_a", "rng_b"], **{"group.remote.assignor": "range"})
        for i in range(2)
    ]
    described: Any = None

    def two_stable_members() -> bool:
        nonlocal described
        described = describe(kbroker.bootstrap, "rng-g")
        return described.group_state == "Stable" and len(described.members) == 2

    wait_for(two_stable_members, "two members with their ranges")
    assert described.assignor_name == "range"
    by_member = {
        m.member_id: {tp.topic_name: list(tp.partitions) for tp in m.assignment.topic_partitions}
        for m in described.members
    }
    first, second = sorted(by_member)  # the range assignor orders members by member id
    assert by_member[first] == {"rng_a": [0, 1], "rng_b": [0, 1]}
    assert by_member[second] == {"rng_a": [2], "rng_b": [2]}


# --- members come and go while records flow --------------------------------------------------------------------------


def test_join_and_leave_while_records_flow_lose_nothing_and_revoke_only_what_moves(
    kbroker: Any, consumers: list[Tracked]
) -> None:
    partitions, total = 6, 900
    create_topics(kbroker.bootstrap, flow=partitions)

    def feed() -> None:
        for start in range(0, total, 30):
            produce(kbroker.bootstrap, "flow", 30, partitions, start)
            time.sleep(0.05)

    feeding = threading.Thread(target=feed, daemon=True)
    c1, c2 = (start_consumer(kbroker.bootstrap, "flow-g", f"flow-{i}", ["flow"]) for i in (1, 2))
    consumers += [c1, c2]
    feeding.start()
    wait_for(lambda: len(c1.assignment()) == 3 and len(c2.assignment()) == 3 and c1.seen and c2.seen, "c1, c2")
    before_join = {c.name: c.assignment() for c in (c1, c2)}
    events_before = {c.name: len(c.events) for c in (c1, c2)}
    c3 = start_consumer(kbroker.bootstrap, "flow-g", "flow-3", ["flow"])
    consumers.append(c3)
    wait_for(lambda: len(c3.assignment()) == 2 and len(c1.assignment()) == 2 and len(c2.assignment()) == 2, "c3")
    for c in (c1, c2):  # each gave up one partition and kept the other two, without being revoked everything
        revoked = [ps for kind, ps in c.events[events_before[c.name] :] if kind == "revoke"]
        assert revoked and all(ps < before_join[c.name] for ps in revoked), (c.name, c.events)
        assert c.assignment() < before_join[c.name]
    before_leave = {c.name: c.assignment() for c in (c1, c3)}
    c2.close()
    wait_for(lambda: len(c1.assignment()) == 3 and len(c3.assignment()) == 3, "c2's partitions to move")
    for c in (c1, c3):  # nothing was taken from them: they only gained c2's partitions
        assert c.assignment() > before_leave[c.name]
    feeding.join(TIMEOUT_S)
    wait_for(lambda: len(c1.seen) + len(c2.seen) + len(c3.seen) >= total, "every record", timeout=30)
    time.sleep(0.5)  # anything read twice would show up now
    seen = c1.seen + c2.seen + c3.seen
    assert len(seen) == len(set(seen)) == total, "a record was read twice"
    assert_only_stale_commits(c1.errors + c2.errors + c3.errors)
    c1.halt()
    assert c1.committed("flow", partitions) == total


def test_regular_expression_subscription_takes_in_a_topic_created_later(kbroker: Any, consumers: list[Tracked]) -> None:
    create_topics(kbroker.bootstrap, rx_one=2)
    produce(kbroker.bootstrap, "rx_one", 4, 2)
    consumer = start_consumer(kbroker.bootstrap, "rx-g", "rx", ["^rx_.*"])
    consumers.append(consumer)
    wait_for(lambda: len(consumer.seen) == 4, "the records of rx_one")
    create_topics(kbroker.bootstrap, rx_two=2)
    produce(kbroker.bootstrap, "rx_two", 4, 2)
    wait_for(lambda: len(consumer.seen) == 8, "the records of rx_two, created after the subscription")
    member = describe(kbroker.bootstrap, "rx-g").members[0]
    assert member.subscribed_topic_regex == "(^rx_.*)"  # librdkafka joins its expressions into one
    assert {tp.topic_name for tp in member.assignment.topic_partitions} == {"rx_one", "rx_two"}


KILLED_CONSUMER = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "group.protocol": "consumer",
              "client.id": "doomed"})
c.subscribe([sys.argv[3]])
while not c.assignment():
    c.poll(0.1)
print("assigned", flush=True)
while True:
    c.poll(0.1)
"""


def test_a_killed_consumer_is_removed_when_its_session_ends(kbroker: Any, consumers: list[Tracked]) -> None:
    create_topics(kbroker.bootstrap, doom=4)
    survivor = start_consumer(kbroker.bootstrap, "doom-g", "survivor", ["doom"])
    consumers.append(survivor)
    wait_for(lambda: len(survivor.assignment()) == 4, "the survivor's partitions")
    doomed = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONSUMER, kbroker.bootstrap, "doom-g", "doom"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert doomed.stdout is not None and doomed.stdout.readline().strip() == "assigned"
        wait_for(lambda: len(survivor.assignment()) == 2, "the partitions to be shared")
    finally:
        doomed.kill()
        doomed.wait()
    killed_at = time.monotonic()
    time.sleep(SESSION_MS / 1000 * 0.6)
    assert len(describe(kbroker.bootstrap, "doom-g").members) == 2, "removed before its session ended"
    wait_for(lambda: len(describe(kbroker.bootstrap, "doom-g").members) == 1, "the session to end")
    elapsed = time.monotonic() - killed_at
    assert SESSION_MS / 1000 - 0.5 <= elapsed <= SESSION_MS / 1000 + 3, elapsed
    wait_for(lambda: len(survivor.assignment()) == 4, "the survivor to get every partition back")


# --- raw requests: reconciliation and errors -------------------------------------------------------------------------


def test_a_partition_moves_only_after_its_owner_revoked_it(kbroker: Any) -> None:
    create_topics(kbroker.bootstrap, rec=4)
    a = Raw(kbroker.bootstrap, "rec-g", ["rec"])
    assert a.beat().error_code == NONE
    assert a.epoch == 1 and a.partitions() == {0, 1, 2, 3}
    b = Raw(kbroker.bootstrap, "rec-g", ["rec"])
    joined = b.beat()
    assert (joined.error_code, joined.member_epoch) == (NONE, 2)
    assert b.partitions() == set(), "b got partitions a still owns"
    # a is told to give two up; until it heartbeats without them it stays at epoch 1
    told = a.beat(owned=[{"topic_id": t, "partitions": [0, 1, 2, 3]} for t in a.owned])
    assert told.member_epoch == 1 and len(a.partitions()) == 2
    assert describe(kbroker.bootstrap, "rec-g").group_state == "Reconciling"
    assert b.beat().error_code == NONE and b.partitions() == set()
    revoked = a.beat()  # now without them
    assert revoked.member_epoch == 2
    assert b.beat().member_epoch == 2 and b.partitions() == {0, 1, 2, 3} - a.partitions()
    described = describe(kbroker.bootstrap, "rec-g")
    assert described.group_state == "Stable" and described.group_epoch == 2
    assert {m.member_epoch for m in described.members} == {2}
    # the epoch check: above the member's is fenced; its previous epoch with a subset of its partitions is not
    assert a.beat(epoch=3).error_code == FENCED_MEMBER_EPOCH
    assert a.beat(epoch=1).error_code == NONE
    assert a.beat(epoch=1, owned=[{"topic_id": t, "partitions": [0, 1, 2, 3]} for t in a.owned]).error_code == (
        FENCED_MEMBER_EPOCH
    )
    # offsets are committed with the member epoch as the generation
    assert commit(a, "rec", 2) == NONE
    assert commit(a, "rec", 1) == STALE_MEMBER_EPOCH
    assert commit(a, "rec", 3) == FENCED_MEMBER_EPOCH
    assert commit(a, "rec", 2, version=8) == UNSUPPORTED_VERSION
    # leaving: -1; the other member gets everything at the next epoch
    left = a.beat(epoch=-1)
    assert (left.error_code, left.member_epoch) == (NONE, -1)
    assert b.beat().member_epoch == 3 and b.partitions() == {0, 1, 2, 3}
    assert a.beat(epoch=3).error_code == UNKNOWN_MEMBER_ID


def test_static_members(kbroker: Any) -> None:
    create_topics(kbroker.bootstrap, stat=2)
    first = Raw(kbroker.bootstrap, "stat-g", ["stat"], instance="box-1")
    other = Raw(kbroker.bootstrap, "stat-g", ["stat"], instance="box-2")
    assert first.beat().error_code == NONE
    assert other.beat().error_code == NONE
    settle([first, other], 2)
    kept = first.partitions()
    assert len(kept) == 1
    # a second process with the same instance id while the first is in the group
    twin = Raw(kbroker.bootstrap, "stat-g", ["stat"], instance="box-1")
    assert twin.beat().error_code == UNRELEASED_INSTANCE_ID
    assert twin.beat(epoch=first.epoch).error_code == FENCED_INSTANCE_ID  # its member id does not hold box-1
    # the first leaves for a while (-2): it keeps its partitions and nobody else gets them
    left = first.beat(epoch=-2)
    assert (left.error_code, left.member_epoch) == (NONE, -2)
    assert other.beat().error_code == NONE and other.partitions() == {0, 1} - kept
    # its successor takes box-1 over, with its partitions, at once
    back = twin.beat()
    assert back.error_code == NONE and twin.partitions() == kept
    settle([twin, other], 2)
    members = {m.instance_id: m.member_id for m in describe(kbroker.bootstrap, "stat-g").members}
    assert members == {"box-1": twin.member_id, "box-2": other.member_id}
    assert first.beat(epoch=first.epoch).error_code == FENCED_INSTANCE_ID


def test_refused_requests(kbroker: Any) -> None:
    create_topics(kbroker.bootstrap, bad=1)
    member = Raw(kbroker.bootstrap, "bad-g", ["bad"])
    assert member.beat(epoch=5).error_code == GROUP_ID_NOT_FOUND  # no such group, and not joining
    assert member.beat().error_code == NONE
    stranger = Raw(kbroker.bootstrap, "bad-g", ["bad"])
    assert stranger.beat(epoch=1).error_code == UNKNOWN_MEMBER_ID
    answer = Raw(kbroker.bootstrap, "bad-g", ["bad"], member_id="").beat()
    assert answer.error_code == INVALID_REQUEST and "MemberId" in answer.error_message  # v1: the client's own id
    v0 = Raw(kbroker.bootstrap, "bad-g", ["bad"], member_id="").beat(version=0)  # v0: the coordinator makes one
    assert v0.error_code == NONE and v0.member_id
    assert Raw(kbroker.bootstrap, "bad-g", None).beat().error_code == INVALID_REQUEST  # no subscription
    assert Raw(kbroker.bootstrap, "bad-g", ["bad"]).beat(epoch=-3).error_code == INVALID_REQUEST
    unknown_assignor = Raw(kbroker.bootstrap, "bad-g", ["bad"], assignor="sticky").beat()
    assert unknown_assignor.error_code == UNSUPPORTED_ASSIGNOR and "uniform, range" in unknown_assignor.error_message
    assert Raw(kbroker.bootstrap, "bad-g", None, regex="(unclosed").beat().error_code == INVALID_REGULAR_EXPRESSION
    # the group holds at most group.consumer.max.size members
    full = [Raw(kbroker.bootstrap, "bad-g", ["bad"]) for _ in range(MAX_SIZE - 2)]
    assert [m.beat().error_code for m in full] == [NONE] * len(full)
    answer = Raw(kbroker.bootstrap, "bad-g", ["bad"]).beat()
    assert answer.error_code == GROUP_MAX_SIZE_REACHED and str(MAX_SIZE) in answer.error_message
    assert member.beat().error_code == NONE  # members already in go on
    # ConsumerGroupDescribe of what is not a consumer group
    assert describe(kbroker.bootstrap, "no-such-group").error_code == GROUP_ID_NOT_FOUND


def test_one_protocol_per_group_and_the_classic_apis(kbroker: Any) -> None:
    create_topics(kbroker.bootstrap, both=1)
    member = Raw(kbroker.bootstrap, "both-g", ["both"])
    assert member.beat().error_code == NONE
    join = {
        "group_id": "both-g",
        "session_timeout": 10_000,
        "rebalance_timeout": 1000,
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
        "reason": None,
    }
    assert request(kbroker.bootstrap, JOIN_GROUP, 5, join).error_code == INCONSISTENT_GROUP_PROTOCOL
    listed = request(kbroker.bootstrap, LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["consumer"]}).groups
    mine = [g for g in listed if g.group_id == "both-g"]
    assert [(g.group_type, g.protocol_type, g.group_state) for g in mine] == [("consumer", "consumer", "Stable")]
    classic_only = request(kbroker.bootstrap, LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["classic"]})
    assert "both-g" not in {g.group_id for g in classic_only.groups}
    described = request(
        kbroker.bootstrap, DESCRIBE_GROUPS, 5, {"groups": ["both-g"], "include_authorized_operations": False}
    )
    assert (described.groups[0].error_code, described.groups[0].group_state) == (NONE, "Dead")  # as Kafka 3.9
    # after the last member leaves, the group may become a classic one
    assert member.beat(epoch=-1).error_code == NONE
    classic = request(kbroker.bootstrap, JOIN_GROUP, 5, join)
    assert classic.error_code in (NONE, 79)  # MEMBER_ID_REQUIRED: a classic member's first step
    assert Raw(kbroker.bootstrap, "both-g", ["both"]).beat(epoch=1).error_code != NONE


# --- a coordinator restart --------------------------------------------------------------------------------------------


def test_a_restarted_coordinator_reloads_the_group(start_broker: Any) -> None:
    broker = start_broker(SETTINGS)
    create_topics(broker.bootstrap, again=4)
    produce(broker.bootstrap, "again", 40, 4)
    tracked = start_consumer(broker.bootstrap, "again-g", "again-c", ["again"])
    raw = Raw(broker.bootstrap, "again-g", ["again"])
    try:
        wait_for(lambda: len(tracked.assignment()) == 4 and len(tracked.seen) == 40, "the first records")
        assert raw.beat().error_code == NONE
        wait_for(lambda: raw.beat().error_code == NONE and len(raw.partitions()) == 2, "raw's two partitions")
        wait_for(lambda: describe(broker.bootstrap, "again-g").group_state == "Stable", "a stable group")
        before = describe(broker.bootstrap, "again-g")
        raw_seen = len(tracked.seen)
        broker.restart()
        raw.bootstrap = broker.bootstrap
        after = describe(broker.bootstrap, "again-g")
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
        assert {(m.member_id, m.member_epoch, m.assignment) for m in after.members} == {
            (m.member_id, m.member_epoch, m.assignment) for m in before.members
        }
        kept = raw.partitions()
        answer = raw.beat()  # goes on at its epoch
        assert (answer.error_code, answer.member_epoch) == (NONE, before.group_epoch)
        assert raw.partitions() == kept
        assert raw.beat(epoch=raw.epoch + 1).error_code == FENCED_MEMBER_EPOCH
        assert raw.beat(epoch=-1).error_code == NONE  # its partitions (committed up to 10 each) go to the other
        produce(broker.bootstrap, "again", 40, 4, start=40)
        wait_for(lambda: len(tracked.seen) >= raw_seen + 40, "records after the restart", timeout=30)
        time.sleep(0.5)
        assert len(tracked.seen) == len(set(tracked.seen)) == raw_seen + 40, "read again after the restart"
        assert_only_stale_commits(tracked.errors)
        tracked.halt()
        assert tracked.committed("again", 4) == 80
    finally:
        tracked.close()


def test_kafka_error_names_match() -> None:
    """The codes this module asserts are Kafka's (librdkafka names them)."""
    assert KafkaError.FENCED_MEMBER_EPOCH == FENCED_MEMBER_EPOCH
    assert KafkaError.UNRELEASED_INSTANCE_ID == UNRELEASED_INSTANCE_ID
    assert KafkaError.STALE_MEMBER_EPOCH == STALE_MEMBER_EPOCH
    assert KafkaError.GROUP_MAX_SIZE_REACHED == GROUP_MAX_SIZE_REACHED


def test_a_member_that_does_not_revoke_is_removed_after_its_rebalance_timeout(kbroker: Any) -> None:
    create_topics(kbroker.bootstrap, slow=2)
    stubborn = Raw(kbroker.bootstrap, "slow-g", ["slow"])
    assert stubborn.beat(rebalance_timeout=1000).error_code == NONE and stubborn.partitions() == {0, 1}
    everything = [{"topic_id": t, "partitions": [0, 1]} for t in stubborn.owned]
    newcomer = Raw(kbroker.bootstrap, "slow-g", ["slow"])
    assert newcomer.beat().error_code == NONE
    assert stubborn.beat(owned=everything).error_code == NONE  # told to give one partition up; it does not
    started = time.monotonic()
    while time.monotonic() - started < 0.6:  # it keeps heartbeating (its session is fine) but still owns both
        assert stubborn.beat(owned=everything).error_code == NONE
        assert newcomer.beat().error_code == NONE and newcomer.partitions() == set()
        time.sleep(0.1)
    wait_for(lambda: stubborn.beat(owned=everything).error_code == UNKNOWN_MEMBER_ID, "the rebalance timeout")
    assert time.monotonic() - started >= 0.9
    wait_for(lambda: newcomer.beat().error_code == NONE and newcomer.partitions() == {0, 1}, "both partitions")


def test_delete_groups_and_offset_fetch_of_a_consumer_group(kbroker: Any) -> None:
    create_topics(kbroker.bootstrap, gone=1)
    member = Raw(kbroker.bootstrap, "gone-g", ["gone"])
    assert member.beat().error_code == NONE
    assert commit(member, "gone", member.epoch) == NONE

    def fetch(member_id: str | None, epoch: int) -> Any:
        group = {"group_id": "gone-g", "member_id": member_id, "member_epoch": epoch, "topics": None}
        return request(kbroker.bootstrap, 9, 9, {"groups": [group], "require_stable": False}).groups[0]

    fetched = fetch(member.member_id, member.epoch)
    assert fetched.error_code == NONE and fetched.topics[0].partitions[0].committed_offset == 1
    assert fetch(member.member_id, member.epoch - 1).error_code == STALE_MEMBER_EPOCH
    assert fetch("someone-else", member.epoch).error_code == UNKNOWN_MEMBER_ID
    assert fetch(None, -1).error_code == NONE  # an admin's read
    assert request(kbroker.bootstrap, 42, 2, {"groups_names": ["gone-g"]}).results[0].error_code == 68  # NON_EMPTY
    assert member.beat(epoch=-1).error_code == NONE
    assert request(kbroker.bootstrap, 42, 2, {"groups_names": ["gone-g"]}).results[0].error_code == NONE
    assert describe(kbroker.bootstrap, "gone-g").error_code == GROUP_ID_NOT_FOUND
    assert fetch(None, -1).topics == ()
