"""Static group membership (KIP-345), the group listing filters and the transaction coordinator answer, against a
real `tidelog serve`.

- kafka-python: a restarted static instance gets its partitions back without a rebalance; a second one fences it;
- confluent-kafka: a second consumer with the same `group.instance.id` takes the partitions over and the first one
  is fenced (a fatal FENCED_INSTANCE_ID); a static member restarted within its session gets its partitions back
  without a rebalance (the other member's callbacks never fire); `init_transactions()` fails at once;
  `list_consumer_groups` with a state and a type filter;
- raw requests (protocol/client.py's BrokerConnection, kio's schemas, any version): a returning static member gets a
  new member id in the same generation (a leader: JoinGroup v9 `skip_assignment`, before v9 the old leader id), its
  old member id is fenced on every group API; a static member that misses a rebalance stays in the group until its
  session ends, and a silent member is removed after its session timeout, not before and within a tick after;
  LeaveGroup v3+ by instance id with per-member errors; ListGroups v4/v5 filters; FindCoordinator key type 1.

The module's broker accepts sessions from 1 s (`group.min.session.timeout.ms`) and lets a new group's first
rebalance wait 300 ms (`group.initial.rebalance.delay.ms`) so that raw members joining together form one generation.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType, KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.protocol.client import BrokerConnection

TIMEOUT_S = 30.0
INITIAL_DELAY_MS = 300
EXPIRY_TICK_S = 0.25  # how often the coordinator looks for expired sessions (broker/groups.py)

NONE, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED = 0, 25, 27, 79
FENCED_INSTANCE_ID = 82
OFFSET_COMMIT, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS = 15, 16


@pytest.fixture(scope="module")
def sbroker(start_module_broker):
    return start_module_broker(group_initial_rebalance_delay_ms=INITIAL_DELAY_MS, group_min_session_timeout_ms=1000)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    client.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=TIMEOUT_S)


def wait_for(predicate: Any, what: str, timeout: float = 20.0) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


# --- raw requests -----------------------------------------------------------------------------------------------------


def subscription(topic: str) -> bytes:
    """ConsumerProtocolSubscription v0 of one topic."""
    name = topic.encode()
    return struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", -1)


def assignment(topic: str, partitions: Sequence[int]) -> bytes:
    """ConsumerProtocolAssignment v0."""
    name = topic.encode()
    owned = struct.pack(">h", len(name)) + name + struct.pack(">i", len(partitions))
    owned += b"".join(struct.pack(">i", p) for p in partitions)
    return struct.pack(">hi", 0, 1) + owned + struct.pack(">i", -1)


@dataclass
class RawMember:
    conn: BrokerConnection
    instance: str | None
    member_id: str = ""
    generation: int = -1


class Raw:
    """Group requests over BrokerConnection; each member has a connection of its own (a JoinGroup waits)."""

    def __init__(self, broker: Any, group: str, topic: str) -> None:
        self.port, self.group, self.topic = broker.port, group, topic
        self.opened: list[BrokerConnection] = []
        self.leader_id = ""  # the leader of the generation `form` made

    def connection(self) -> BrokerConnection:
        self.opened.append(BrokerConnection("127.0.0.1", self.port, "raw-static"))
        return self.opened[-1]

    async def close(self) -> None:
        for conn in self.opened:
            await conn.close()

    async def join(
        self,
        member: RawMember,
        *,
        version: int = 5,
        session_ms: int = 10_000,
        rebalance_ms: int = 1000,
        member_id: str | None = None,
    ) -> Any:
        body = {
            "group_id": self.group,
            "session_timeout": session_ms,
            "rebalance_timeout": rebalance_ms,
            "member_id": member.member_id if member_id is None else member_id,
            "group_instance_id": member.instance,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": subscription(self.topic)}],
            "reason": None,
        }
        answer = await member.conn.request(JOIN_GROUP, version, body, TIMEOUT_S)
        if answer.error_code == MEMBER_ID_REQUIRED and not body["member_id"]:  # a dynamic member, v4+
            answer = await member.conn.request(JOIN_GROUP, version, {**body, "member_id": answer.member_id}, TIMEOUT_S)
        if answer.error_code == NONE:
            member.member_id, member.generation = answer.member_id, answer.generation_id
        return answer

    async def sync(self, member: RawMember, assignments: dict[str, bytes] | None = None, **kw: Any) -> Any:
        body = {
            "group_id": self.group,
            "generation_id": kw.get("generation", member.generation),
            "member_id": kw.get("member_id", member.member_id),
            "group_instance_id": member.instance,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()],
        }
        return await member.conn.request(SYNC_GROUP, 5, body, TIMEOUT_S)

    async def heartbeat(self, member: RawMember, member_id: str | None = None, version: int = 4) -> int:
        body = {
            "group_id": self.group,
            "generation_id": member.generation,
            "member_id": member.member_id if member_id is None else member_id,
            "group_instance_id": member.instance,
        }
        return int((await member.conn.request(HEARTBEAT, version, body, TIMEOUT_S)).error_code)

    async def commit(self, member: RawMember, member_id: str) -> int:
        body = {
            "group_id": self.group,
            "generation_id_or_member_epoch": member.generation,
            "member_id": member_id,
            "group_instance_id": member.instance,
            "topics": [{"name": self.topic, "partitions": [{"partition_index": 0, "committed_offset": 1}]}],
        }
        answer = await member.conn.request(OFFSET_COMMIT, 8, body, TIMEOUT_S)
        return int(answer.topics[0].partitions[0].error_code)

    async def leave(self, conn: BrokerConnection, members: list[tuple[str, str | None]], version: int = 5) -> Any:
        body = {
            "group_id": self.group,
            "members": [{"member_id": m, "group_instance_id": i, "reason": "test"} for m, i in members],
        }
        return await conn.request(LEAVE_GROUP, version, body, TIMEOUT_S)

    async def describe(self, conn: BrokerConnection) -> Any:
        body = {"groups": [self.group], "include_authorized_operations": False}
        return (await conn.request(DESCRIBE_GROUPS, 5, body, TIMEOUT_S)).groups[0]

    async def form(self, instances: Sequence[str | None], **join: Any) -> list[RawMember]:
        """Members joining an empty group together (one generation: the initial rebalance delay), then synced with
        the leader's assignment: member i gets partition i."""
        members = [RawMember(self.connection(), instance) for instance in instances]
        answers = await asyncio.gather(*(self.join(m, **join) for m in members))
        assert [a.error_code for a in answers] == [NONE] * len(members)
        assert len({m.generation for m in members}) == 1, "the members did not form one generation"
        leader = next(m for m, a in zip(members, answers, strict=True) if a.leader == a.member_id)
        self.leader_id = leader.member_id
        plan = {m.member_id: assignment(self.topic, [i]) for i, m in enumerate(members)}
        synced = await asyncio.gather(*(self.sync(m, plan if m is leader else None) for m in members))
        assert [s.error_code for s in synced] == [NONE] * len(members)
        assert [bytes(s.assignment) for s in synced] == [plan[m.member_id] for m in members]
        return members


def run(raw: Raw, scenario: Any) -> None:
    async def main() -> None:
        try:
            await scenario
        finally:
            await raw.close()

    asyncio.run(main())


# --- a returning static member and its fenced predecessor -------------------------------------------------------------


@pytest.mark.parametrize("version", [5, 9])
def test_a_returning_static_member_gets_a_new_id_in_the_same_generation(sbroker, version: int) -> None:
    group = topic = f"static-return-v{version}"
    create_topic(sbroker.bootstrap, topic, 2)
    raw = Raw(sbroker, group, topic)

    async def scenario() -> None:
        a, b = await raw.form(["a", "b"])
        generation, leader_id = a.generation, raw.leader_id
        for returning in sorted((a, b), key=lambda m: m.member_id != leader_id):  # the leader returns first
            old_id, other = returning.member_id, b if returning is a else a
            was_leader = old_id == leader_id
            again = RawMember(raw.connection(), returning.instance)
            answer = await raw.join(again, version=version)
            assert answer.error_code == NONE
            assert answer.generation_id == generation, "a static member's return started a new generation"
            assert answer.member_id != old_id and answer.member_id.startswith(f"{returning.instance}-")
            if version >= 9 and was_leader:  # the leader is told it leads, and that the assignment stands
                assert answer.leader == answer.member_id and answer.skip_assignment
                assert {(m.member_id, m.group_instance_id) for m in answer.members} == {
                    (answer.member_id, returning.instance),
                    (other.member_id, other.instance),
                }
            else:  # before v9 a returning leader is named a follower: the old leader id
                assert answer.leader == (old_id if was_leader else leader_id)
                assert not getattr(answer, "skip_assignment", False) and answer.members == ()
            synced = await raw.sync(again)
            assert synced.error_code == NONE
            assert bytes(synced.assignment) == assignment(topic, [0 if returning is a else 1])
            assert await raw.heartbeat(other) == NONE, "the other member was sent into a rebalance"
            assert await raw.heartbeat(again) == NONE

            # the old member id is fenced on every group API (without an instance id it is merely unknown)
            assert await raw.heartbeat(returning) == FENCED_INSTANCE_ID
            assert await raw.heartbeat(returning, version=2) == UNKNOWN_MEMBER_ID
            assert (await raw.sync(returning)).error_code == FENCED_INSTANCE_ID
            assert await raw.commit(returning, old_id) == FENCED_INSTANCE_ID
            assert (await raw.join(returning, member_id=old_id)).error_code == FENCED_INSTANCE_ID
            left = await raw.leave(returning.conn, [(old_id, returning.instance)])
            assert [m.error_code for m in left.members] == [FENCED_INSTANCE_ID]
            assert await raw.commit(again, again.member_id) == NONE
            if was_leader:
                leader_id = again.member_id  # the leadership went with the instance
            returning.member_id, returning.conn = again.member_id, again.conn

        described = await raw.describe(a.conn)
        assert described.group_state == "Stable"
        assert {(m.member_id, m.group_instance_id) for m in described.members} == {
            (a.member_id, "a"),
            (b.member_id, "b"),
        }
        assert await raw.heartbeat(a) == NONE and await raw.heartbeat(b) == NONE

    run(raw, scenario())


def test_a_waiting_join_of_a_replaced_static_member_is_fenced(sbroker) -> None:
    group = topic = "static-waiting-fenced"
    create_topic(sbroker.bootstrap, topic, 2)
    raw = Raw(sbroker, group, topic)

    async def scenario() -> None:
        a, b = await raw.form(["a", "b"])
        c = RawMember(raw.connection(), "c")
        joining_c = asyncio.create_task(raw.join(c))  # a new member: the group prepares a rebalance
        await asyncio.sleep(0.2)
        assert await raw.heartbeat(a) == REBALANCE_IN_PROGRESS
        waiting_a = asyncio.create_task(raw.join(a))  # a rejoins and waits for b
        await asyncio.sleep(0.2)
        assert not waiting_a.done()
        a2 = RawMember(raw.connection(), "a")
        joining_a2 = asyncio.create_task(raw.join(a2))  # a second process with a's instance id
        fenced = await asyncio.wait_for(waiting_a, 5)
        assert fenced.error_code == FENCED_INSTANCE_ID
        answers = [await raw.join(b), *await asyncio.gather(joining_c, joining_a2)]  # all in: the generation ends
        assert [x.error_code for x in answers] == [NONE, NONE, NONE]
        assert len({m.generation for m in (b, c, a2)}) == 1 and b.generation > a.generation
        (leader_view,) = [x for x in answers if x.members]
        assert {(m.member_id, m.group_instance_id) for m in leader_view.members} == {
            (a2.member_id, "a"),
            (b.member_id, "b"),
            (c.member_id, "c"),
        }

    run(raw, scenario())


# --- sessions ---------------------------------------------------------------------------------------------------------


def test_a_silent_member_is_removed_when_its_session_ends_not_before(sbroker) -> None:
    group = topic = "static-session-expiry"
    create_topic(sbroker.bootstrap, topic, 3)
    raw = Raw(sbroker, group, topic)
    session_s = 2.0

    async def scenario() -> None:
        static, dynamic, stays = await raw.form(["silent", None, "stays"], session_ms=int(session_s * 1000))
        # `silent` and the dynamic member heartbeat once more, then fall silent; `stays` keeps heartbeating
        sent = time.monotonic()
        assert await raw.heartbeat(static) == NONE and await raw.heartbeat(dynamic) == NONE
        answered = time.monotonic()
        gone: dict[str, float] = {}
        while len(gone) < 2:
            assert time.monotonic() - sent < session_s + 5, "the silent members were never removed"
            assert await raw.heartbeat(stays) in (NONE, REBALANCE_IN_PROGRESS)
            present = {m.member_id for m in (await raw.describe(stays.conn)).members}
            for member in (static, dynamic):
                if member.member_id not in present and member.member_id not in gone:
                    gone[member.member_id] = time.monotonic()
            await asyncio.sleep(0.05)
        for member in (static, dynamic):
            assert gone[member.member_id] - sent >= session_s, f"{member.instance} removed before its session ended"
            late = gone[member.member_id] - answered - session_s
            assert late <= EXPIRY_TICK_S + 0.25, f"{member.instance} removed {late:.2f} s after its session ended"
        assert await raw.heartbeat(stays) == REBALANCE_IN_PROGRESS

    run(raw, scenario())


def test_a_static_member_missing_a_rebalance_stays_until_its_session_ends(sbroker) -> None:
    """Kafka drops a dynamic member that does not rejoin within the rebalance timeout; a static one keeps its place
    in the new generation (the leader assigns to it) until its session timeout removes it."""
    group = topic = "static-misses-rebalance"
    create_topic(sbroker.bootstrap, topic, 3)
    raw = Raw(sbroker, group, topic)
    session_s = 2.5

    async def scenario() -> None:
        absent, present = await raw.form(["absent", "present"], session_ms=int(session_s * 1000), rebalance_ms=500)
        newcomer = RawMember(raw.connection(), "newcomer")
        started = time.monotonic()
        joining = asyncio.create_task(raw.join(newcomer, session_ms=10_000, rebalance_ms=500))
        await asyncio.sleep(0.1)
        assert await raw.heartbeat(present) == REBALANCE_IN_PROGRESS
        answers = [await raw.join(present, session_ms=10_000, rebalance_ms=500), await joining]
        completed = time.monotonic()
        assert [x.error_code for x in answers] == [NONE, NONE]
        assert 0.4 <= completed - started < session_s - 1, "the rebalance did not end at the rebalance timeout"
        leader_view = next(x for x in answers if x.members)
        assert {m.group_instance_id for m in leader_view.members} == {"absent", "present", "newcomer"}
        plan = {m.member_id: assignment(topic, [i]) for i, m in enumerate(leader_view.members)}
        leader = newcomer if leader_view.member_id == newcomer.member_id else present
        follower = present if leader is newcomer else newcomer
        synced = await asyncio.gather(raw.sync(leader, plan), raw.sync(follower))
        assert [s.error_code for s in synced] == [NONE, NONE]
        described = await raw.describe(present.conn)
        assert described.group_state == "Stable"
        assert absent.member_id in {m.member_id for m in described.members}
        # its session (restarted when the generation completed, as Kafka does) ends: then it goes
        while absent.member_id in {m.member_id for m in (await raw.describe(present.conn)).members}:
            assert await raw.heartbeat(present) in (NONE, REBALANCE_IN_PROGRESS)
            assert time.monotonic() - completed < session_s + 3, "the absent static member was never removed"
            await asyncio.sleep(0.05)
        assert time.monotonic() - completed >= session_s - 0.05

    run(raw, scenario())


# --- LeaveGroup by instance id ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 5])
def test_batch_leave_by_instance_id(sbroker, version: int) -> None:
    group = topic = f"static-batch-leave-v{version}"
    create_topic(sbroker.bootstrap, topic, 3)
    raw = Raw(sbroker, group, topic)

    async def scenario() -> None:
        a, _, c = await raw.form(["a", "b", "c"])
        admin = raw.connection()
        answer = await raw.leave(
            admin, [("", "a"), ("", "b"), ("", "nobody"), ("not-c", "c"), (a.member_id, None)], version
        )
        assert answer.error_code == NONE
        assert [(m.member_id, m.group_instance_id, m.error_code) for m in answer.members] == [
            ("", "a", NONE),
            ("", "b", NONE),
            ("", "nobody", UNKNOWN_MEMBER_ID),
            ("not-c", "c", FENCED_INSTANCE_ID),
            (a.member_id, None, UNKNOWN_MEMBER_ID),  # gone already
        ]
        described = await raw.describe(admin)
        assert [(m.member_id, m.group_instance_id) for m in described.members] == [(c.member_id, "c")]
        assert await raw.heartbeat(c) == REBALANCE_IN_PROGRESS
        assert await raw.heartbeat(a) == UNKNOWN_MEMBER_ID  # its instance id holds no member any more
        assert (await raw.leave(admin, [("", "c")], version)).members[0].error_code == NONE
        assert (await raw.describe(admin)).group_state == "Empty"

    run(raw, scenario())


# --- ListGroups filters and DescribeGroups ----------------------------------------------------------------------------


def test_list_groups_state_and_type_filters(sbroker) -> None:
    group = topic = "static-listed"
    create_topic(sbroker.bootstrap, topic, 1)
    raw = Raw(sbroker, group, topic)

    async def scenario() -> None:
        (member,) = await raw.form(["listed"])
        conn = raw.connection()

        async def listed(version: int, states: list[str], types: list[str] | None = None) -> dict[str, Any]:
            body = {"states_filter": states, "types_filter": types or []}
            answer = await conn.request(LIST_GROUPS, version, body, TIMEOUT_S)
            assert answer.error_code == NONE
            return {g.group_id: g for g in answer.groups}

        assert listed_state(await listed(4, ["Stable"]), group) == "Stable"
        assert listed_state(await listed(4, ["stable", "empty"]), group) == "Stable"  # states compare caselessly
        assert group not in await listed(4, ["Empty", "PreparingRebalance"])
        v5 = await listed(5, [], ["classic"])
        assert v5[group].group_type == "classic"
        assert group in await listed(5, ["Stable"], ["Classic", "consumer"])
        assert await listed(5, [], ["consumer"]) == {}  # no KIP-848 group is served
        assert (await raw.leave(conn, [("", "listed")])).members[0].error_code == NONE
        assert listed_state(await listed(4, ["Empty"]), group) == "Empty"
        assert member.member_id

    run(raw, scenario())

    client = AdminClient({"bootstrap.servers": sbroker.bootstrap})
    found = client.list_consumer_groups(
        states={ConsumerGroupState.EMPTY}, types={ConsumerGroupType.CLASSIC}, request_timeout=10
    ).result(timeout=TIMEOUT_S)
    assert group in {g.group_id for g in found.valid}
    stable = client.list_consumer_groups(states={ConsumerGroupState.STABLE}, request_timeout=10).result(TIMEOUT_S)
    assert group not in {g.group_id for g in stable.valid}
    consumer_type = client.list_consumer_groups(types={ConsumerGroupType.CONSUMER}, request_timeout=10)
    assert group not in {g.group_id for g in consumer_type.result(timeout=TIMEOUT_S).valid}


def listed_state(groups: dict[str, Any], group: str) -> str:
    assert group in groups, f"{group} not listed: {sorted(groups)}"
    return str(groups[group].group_state)


# --- FindCoordinator for a transactional id ---------------------------------------------------------------------------


def test_find_coordinator_for_a_transactional_id_names_this_broker(sbroker) -> None:
    """Key type TRANSACTION is the transaction coordinator's answer (tests/integration/test_transactions.py drives
    it with real transactional producers): a single broker coordinates every transactional id."""
    raw = Raw(sbroker, "unused", "unused")

    async def scenario() -> None:
        conn = raw.connection()
        old = await conn.request(FIND_COORDINATOR, 3, {"key": "tx-1", "key_type": 1}, TIMEOUT_S)
        assert (old.error_code, old.port) == (NONE, sbroker.port)
        batch = await conn.request(
            FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": ["tx-1", "tx-2"]}, TIMEOUT_S
        )
        assert [(c.key, c.error_code, c.port) for c in batch.coordinators] == [
            ("tx-1", NONE, sbroker.port),
            ("tx-2", NONE, sbroker.port),
        ]
        groups = await conn.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["g"]}, TIMEOUT_S)
        assert (groups.coordinators[0].error_code, groups.coordinators[0].port) == (NONE, sbroker.port)

    run(raw, scenario())


# --- confluent-kafka static members -----------------------------------------------------------------------------------


class StaticConsumer(threading.Thread):
    """A confluent-kafka consumer with a `group.instance.id`, polling until stopped; records its callbacks and the
    fatal error that ends it."""

    def __init__(self, bootstrap: str, group: str, topic: str, instance: str, session_ms: int = 6000) -> None:
        super().__init__(daemon=True)
        self.conf = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.instance.id": instance,
            "client.id": instance,
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": 200,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        self.topic = topic
        self.assigned: list[frozenset[int]] = []
        self.revoked: list[frozenset[int]] = []
        self.assignment: frozenset[int] = frozenset()
        self.fatal: KafkaError | None = None
        self.halt = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            consumer = Consumer(self.conf)

            def on_assign(c: Consumer, partitions: list[Any]) -> None:
                self.assigned.append(frozenset(tp.partition for tp in partitions))

            def on_revoke(c: Consumer, partitions: list[Any]) -> None:
                self.revoked.append(frozenset(tp.partition for tp in partitions))

            consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
            try:
                while not self.halt.is_set():
                    msg = consumer.poll(0.1)
                    self.assignment = frozenset(tp.partition for tp in consumer.assignment())
                    if msg is not None and msg.error() is not None and msg.error().code() == KafkaError._FATAL:
                        self.fatal = msg.error()  # librdkafka's fatal error event (the handle is unusable now)
                        return
            finally:
                consumer.close()  # a static member does not leave the group on close
        except BaseException as exc:
            self.crash = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(TIMEOUT_S)
        assert not self.is_alive() and self.crash is None, self.crash


def describe(bootstrap: str, group: str) -> Any:
    client = AdminClient({"bootstrap.servers": bootstrap})
    return client.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=TIMEOUT_S)


@pytest.mark.matrix("group: static membership", client="confluent")
def test_confluent_second_instance_fences_the_first(sbroker) -> None:
    group = topic = "static-ck-fence"
    create_topic(sbroker.bootstrap, topic, 4)
    first = StaticConsumer(sbroker.bootstrap, group, topic, "instance-1")
    first.start()
    second = StaticConsumer(sbroker.bootstrap, group, topic, "instance-1")
    try:
        wait_for(lambda: first.assignment == frozenset(range(4)), "the first instance's assignment")
        old_member = describe(sbroker.bootstrap, group).members[0]
        assert old_member.group_instance_id == "instance-1"
        second.start()
        wait_for(lambda: not first.is_alive(), "the first instance to be fenced")
        assert first.fatal is not None, first.crash
        assert "fenced" in first.fatal.str().lower(), first.fatal
        wait_for(lambda: second.assignment == frozenset(range(4)), "the second instance to hold the partitions")
        members = describe(sbroker.bootstrap, group).members
        assert [(m.group_instance_id, m.member_id != old_member.member_id) for m in members] == [("instance-1", True)]
        assert second.fatal is None and second.revoked == []
    finally:
        first.halt.set()
        second.stop()


@pytest.mark.matrix("group: static membership", client="confluent")
def test_confluent_static_member_restart_within_the_session_keeps_the_assignment(sbroker) -> None:
    group = topic = "static-ck-restart"
    create_topic(sbroker.bootstrap, topic, 4)
    a = StaticConsumer(sbroker.bootstrap, group, topic, "restart-a")
    b = StaticConsumer(sbroker.bootstrap, group, topic, "restart-b")
    a.start()
    b.start()
    restarted = StaticConsumer(sbroker.bootstrap, group, topic, "restart-a")
    try:
        wait_for(
            lambda: len(a.assignment) == len(b.assignment) == 2 and not a.assignment & b.assignment,
            "a 2 + 2 split",
        )
        time.sleep(0.5)  # settled
        kept, b_callbacks = a.assignment, (len(b.assigned), len(b.revoked))
        before = {m.group_instance_id: m.member_id for m in describe(sbroker.bootstrap, group).members}
        a.stop()  # closes without LeaveGroup
        restarted.start()
        wait_for(lambda: restarted.assignment == kept, "the restarted instance to get its partitions back")
        time.sleep(1.0)  # a rebalance would show in b's callbacks by now
        assert (len(b.assigned), len(b.revoked)) == b_callbacks, "the other member was rebalanced"
        assert b.assignment | restarted.assignment == frozenset(range(4))
        after = {m.group_instance_id: m.member_id for m in describe(sbroker.bootstrap, group).members}
        assert after["restart-b"] == before["restart-b"] and after["restart-a"] != before["restart-a"]
        assert restarted.fatal is None and b.fatal is None
    finally:
        restarted.stop()
        b.stop()


# --- kafka-python static members ------------------------------------------------------------------------------------


@pytest.mark.matrix("group: static membership", client="kafka-python")
def test_kafka_python_static_member_restart_and_fencing(sbroker) -> None:
    """kafka-python has static membership: a restarted instance gets its partitions back without the other member
    rebalancing; a second process with the instance id of a live one fences it (its commit raises
    FencedInstanceIdError; kafka-python's heartbeat thread just stops on the fencing)."""
    group = topic = "static-kp"
    create_topic(sbroker.bootstrap, topic, 4)
    a, b = KpMember(sbroker.bootstrap, group, topic, "kp-a"), KpMember(sbroker.bootstrap, group, topic, "kp-b")
    restarted = KpMember(sbroker.bootstrap, group, topic, "kp-a")
    newest = KpMember(sbroker.bootstrap, group, topic, "kp-a")
    a.start()
    b.start()
    try:
        wait_for(lambda: len(a.owned) == len(b.owned) == 2, "a 2 + 2 split")
        time.sleep(0.5)  # settled
        kept, calls = a.owned, b.callbacks
        a.stop()  # a static member sends no LeaveGroup
        restarted.start()
        wait_for(lambda: restarted.owned == kept, "the restarted instance's partitions")
        time.sleep(1.0)  # a rebalance would show in b's callbacks by now
        assert b.callbacks == calls, "the other member was rebalanced"

        newest.start()  # a second process with the same instance id
        wait_for(lambda: newest.owned == kept, "the newest instance to take the partitions")
        restarted.stop()  # commits what it holds on the way out: refused
        assert type(restarted.commit_error).__name__ == "FencedInstanceIdError", restarted.commit_error
        assert b.callbacks == calls
    finally:
        for member in (a, b, restarted, newest):
            member.halt.set()
        for member in (a, b, restarted, newest):
            if member.is_alive():
                member.join(TIMEOUT_S)


class KpMember(threading.Thread):
    """A kafka-python consumer with a `group.instance.id` polling in a thread of its own (a JoinGroup waits in
    poll() for the others); when stopped it commits offset 0 of its partitions, then closes."""

    def __init__(self, bootstrap: str, group: str, topic: str, instance: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.group, self.topic, self.instance = bootstrap, group, topic, instance
        self.owned: frozenset[int] = frozenset()
        self.callbacks = 0  # on_partitions_revoked / on_partitions_assigned calls
        self.commit_error: Exception | None = None
        self.halt = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
        from kafka.structs import OffsetAndMetadata

        member = self

        class Counting(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                member.callbacks += 1

            def on_partitions_assigned(self, assigned: Any) -> None:
                member.callbacks += 1

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group,
                group_instance_id=self.instance,
                client_id=self.instance,
                enable_auto_commit=False,
                session_timeout_ms=6000,
                heartbeat_interval_ms=200,
            )
            consumer.subscribe([self.topic], listener=Counting())
            try:
                while not self.halt.is_set():
                    consumer.poll(timeout_ms=50)
                    self.owned = frozenset(tp.partition for tp in consumer.assignment())
                offsets = {TopicPartition(self.topic, p): OffsetAndMetadata(0, "", -1) for p in self.owned}
                try:
                    consumer.commit(offsets)
                except Exception as exc:
                    self.commit_error = exc
            finally:
                consumer.close()
        except BaseException as exc:
            self.crash = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(TIMEOUT_S)
        assert not self.is_alive() and self.crash is None, self.crash
