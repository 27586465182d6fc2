"""The group coordinator, classic protocol (Kafka's GroupCoordinator and GroupMetadata).

A group moves Empty -> PreparingRebalance -> CompletingRebalance -> Stable and back:
- JoinGroup puts the group into PreparingRebalance; the join phase ends when every known member has
  rejoined, or after the rebalance timeout (members that did not rejoin are dropped), or for a new
  group after `group.initial.rebalance.delay.ms`. Then the generation goes up, a protocol every
  member supports is chosen, and the leader gets the member list to compute an assignment.
- SyncGroup from the leader hands each member its assignment; the group is Stable.
- Heartbeats keep members alive; one silent for longer than its session timeout is removed and the
  others rebalance. LeaveGroup removes at once.
- Since JoinGroup v4 a new member first gets MEMBER_ID_REQUIRED with an id to rejoin with.
- Static members (KIP-345, `group.instance.id`): a known instance joining without a member id takes its member over
  under a new member id, and the old id is fenced (FENCED_INSTANCE_ID on every group API). In a Stable group that
  costs no rebalance. A static member that misses a rebalance stays until its session ends. LeaveGroup v3+ removes
  a batch of members, by member id or by instance id alone, with an error per member.
- FindCoordinator for a transactional id (key type TRANSACTION) is the transaction coordinator's answer
  (transaction_coordinator.py). TxnOffsetCommit is served here: a transactional producer's offsets are written to
  `__consumer_offsets` as a transactional batch and stay pending (offset_store.py) until the transaction's marker
  reaches the partition - visible at commit, dropped at abort. The write must belong to the producer's ongoing
  transaction, which must hold the group's partition (AddOffsetsToTxn first): else INVALID_TXN_STATE (Kafka 3.9's
  verification), INVALID_PRODUCER_EPOCH for a fenced producer; in a cluster, a transactional id coordinated by
  another broker is not verified (as produce.py). OffsetFetch with require_stable (v7+) answers
  UNSTABLE_OFFSET_COMMIT for a partition whose offset a transaction still holds.
Committed offsets and each generation are written to `__consumer_offsets` (offset_store.py) and
reloaded on start, members included, so a restarted broker keeps its groups.

A group id belongs to one protocol at a time: the groups of the consumer group protocol (KIP-848) are
consumer_groups.py's, which this coordinator loads and drops with the classic ones and asks about them for the APIs
both protocols share: OffsetCommit and OffsetFetch (the member epoch as the generation), ListGroups (group type
`consumer`), DescribeGroups (Kafka 3.9 answers a consumer group as Dead, no error), DeleteGroups, OffsetDelete.
A classic JoinGroup for a consumer group with members answers INCONSISTENT_GROUP_PROTOCOL; for an empty one, the
consumer group's records are deleted and the group becomes classic; Heartbeat, SyncGroup and LeaveGroup find no
such classic member (UNKNOWN_MEMBER_ID).

In a cluster (`placement`, cluster_groups.py) a group's coordinator is the leader of its `__consumer_offsets`
partition: FindCoordinator names that broker, and every group request to another broker is answered
NOT_COORDINATOR (COORDINATOR_LOAD_IN_PROGRESS while this broker replays the partition it just came to lead). The
groups of a partition are loaded when this broker becomes its leader and dropped when it stops being one.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.broker.offset_store import OFFSETS_TOPIC
from tidelog.codec import group_records as records
from tidelog.errors import ErrorCode, UnknownTopicOrPartitionError
from tidelog.protocol.messages import ApiKey, Request, millis
from tidelog.storage.api import StorageEngine

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.cluster_groups import ClusterGroups
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.consumer_groups import ConsumerGroupCoordinator
    from tidelog.broker.offset_store import OffsetStore, StoreKey
    from tidelog.broker.transaction_coordinator import TransactionCoordinator

log = logging.getLogger("tidelog.broker")

NONE = ErrorCode.NONE
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
COORDINATOR_NOT_AVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE
NOT_COORDINATOR = ErrorCode.NOT_COORDINATOR  # this broker stops being the coordinator (shutdown), as Kafka answers
COORDINATOR_LOAD_IN_PROGRESS = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
ILLEGAL_GENERATION = ErrorCode.ILLEGAL_GENERATION
INCONSISTENT_GROUP_PROTOCOL = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
INVALID_GROUP_ID = ErrorCode.INVALID_GROUP_ID
UNKNOWN_MEMBER_ID = ErrorCode.UNKNOWN_MEMBER_ID
INVALID_SESSION_TIMEOUT = ErrorCode.INVALID_SESSION_TIMEOUT
REBALANCE_IN_PROGRESS = ErrorCode.REBALANCE_IN_PROGRESS
OFFSET_METADATA_TOO_LARGE = ErrorCode.OFFSET_METADATA_TOO_LARGE
NON_EMPTY_GROUP = ErrorCode.NON_EMPTY_GROUP
GROUP_ID_NOT_FOUND = ErrorCode.GROUP_ID_NOT_FOUND
MEMBER_ID_REQUIRED = ErrorCode.MEMBER_ID_REQUIRED
FENCED_INSTANCE_ID = ErrorCode.FENCED_INSTANCE_ID
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
UNSTABLE_OFFSET_COMMIT = ErrorCode.UNSTABLE_OFFSET_COMMIT
INVALID_REQUEST = ErrorCode.INVALID_REQUEST
GROUP_SUBSCRIBED_TO_TOPIC = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
UNKNOWN_SERVER_ERROR = ErrorCode.UNKNOWN_SERVER_ERROR
GROUP_AUTHORIZATION_FAILED = ErrorCode.GROUP_AUTHORIZATION_FAILED
TOPIC_AUTHORIZATION_FAILED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
OFFSET_METADATA_MAX_BYTES = 4096
NO_NODE: dict[str, Any] = {"node_id": -1, "host": "", "port": -1}  # FindCoordinator's answer without a coordinator
EXPIRY_CHECK_SECONDS = 0.25


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat: float = field(default_factory=time.monotonic)
    join_future: asyncio.Future[dict[str, Any]] | None = None
    sync_future: asyncio.Future[dict[str, Any]] | None = None

    def metadata_for(self, protocol: str | None) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")

    def fail_waiters(self, error_code: int) -> None:
        if self.join_future is not None and not self.join_future.done():
            self.join_future.set_result(GroupCoordinator._join_error(error_code, self.member_id))
        if self.sync_future is not None and not self.sync_future.done():
            self.sync_future.set_result(GroupCoordinator._sync_response(error_code))
        self.join_future = self.sync_future = None


@dataclass(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending_member_ids: dict[str, float] = field(default_factory=dict)  # MEMBER_ID_REQUIRED ids -> when given
    empty_since_ms: int | None = None  # when the group last lost its last member (offsets retention counts from it)
    join_timer: asyncio.TimerHandle | None = None
    initial_delay_pending: bool = False

    def all_members_joined(self) -> bool:
        return all(m.join_future is not None for m in self.members.values())

    def static_member(self, instance_id: str | None) -> Member | None:
        """The member holding `group.instance.id` `instance_id` (KIP-345), if any."""
        if instance_id is None:
            return None
        return next((m for m in self.members.values() if m.group_instance_id == instance_id), None)

    def rename_member(self, member: Member, new_id: str) -> None:
        """The member goes on under `new_id` (a static member's restart); the leadership follows it."""
        old_id = member.member_id
        del self.members[old_id]
        member.member_id = new_id
        self.members[new_id] = member
        if self.leader == old_id:
            self.leader = new_id

    def supported_protocols(self) -> set[str]:
        common: set[str] | None = None
        for member in self.members.values():
            names = {name for name, _ in member.protocols}
            common = names if common is None else common & names
        return common or set()


class GroupCoordinator:
    def __init__(
        self,
        config: BrokerConfig,
        engine: StorageEngine,
        authorizer: Authorizer,
        store: OffsetStore,
        is_stopping: Callable[[], bool],
        consumer_groups: ConsumerGroupCoordinator,
        partition_exists: Callable[[str, int], bool] | None = None,
        placement: ClusterGroups | None = None,
    ) -> None:
        self.config = config
        self.consumer_groups = consumer_groups
        consumer_groups.classic_in_use = self.has_members
        self.engine = engine
        self._cluster_has_partition = partition_exists  # a cluster's: a partition may be held by other brokers
        self.placement = placement  # a cluster's: which broker coordinates which group
        self.authorizer = authorizer
        self.store = store
        self.is_stopping = is_stopping
        self.groups: dict[str, Group] = {}
        self._expiry_task: asyncio.Task[None] | None = None
        self._offsets_task: asyncio.Task[None] | None = None
        self.transactions: TransactionCoordinator | None = None  # set by the broker once both exist

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.FIND_COORDINATOR: ApiHandler(0, 5, self.handle_find_coordinator),
            ApiKey.JOIN_GROUP: ApiHandler(0, 9, self.handle_join_group),
            ApiKey.SYNC_GROUP: ApiHandler(0, 5, self.handle_sync_group),
            ApiKey.HEARTBEAT: ApiHandler(0, 4, self.handle_heartbeat),
            ApiKey.LEAVE_GROUP: ApiHandler(0, 5, self.handle_leave_group),
            ApiKey.OFFSET_COMMIT: ApiHandler(0, 9, self.handle_offset_commit),
            ApiKey.OFFSET_FETCH: ApiHandler(0, 9, self.handle_offset_fetch),
            ApiKey.DESCRIBE_GROUPS: ApiHandler(0, 5, self.handle_describe_groups),
            ApiKey.LIST_GROUPS: ApiHandler(0, 5, self.handle_list_groups),
            ApiKey.DELETE_GROUPS: ApiHandler(0, 2, self.handle_delete_groups),
            ApiKey.OFFSET_DELETE: ApiHandler(0, 0, self.handle_offset_delete),
            ApiKey.TXN_OFFSET_COMMIT: ApiHandler(0, 4, self.handle_txn_offset_commit),
        }

    # --- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Rebuild groups from the store (members come back alive, as after a Kafka coordinator failover)."""
        self._restore(list(self.store.groups))
        self.consumer_groups.restore(list(self.store.groups))
        self.consumer_groups.start()
        self._expiry_task = asyncio.create_task(self._expire_members())
        self._offsets_task = asyncio.create_task(self._expire_offsets_periodically())

    def load_partition(self, partition: int) -> None:
        """This broker became the coordinator of the groups of `__consumer_offsets` partition `partition`."""
        started = time.monotonic()
        count = self.store.load_partition(partition)
        loaded = [g for g in self.store.groups if self.store.partition_of(g) == partition]
        self._restore(loaded)
        self.consumer_groups.restore(loaded)
        log.info(
            "coordinating the groups of %s-%d: %d group(s) from %d record(s) in %.2f s",
            OFFSETS_TOPIC,
            partition,
            len(loaded),
            count,
            time.monotonic() - started,
        )

    def unload_partition(self, partition: int) -> None:
        """This broker no longer coordinates the groups of `partition`: forget them, answer their waiting members
        NOT_COORDINATOR (they find the new coordinator)."""
        gone = self.store.unload_partition(partition)
        gone |= {g for g in self.groups if self.store.partition_of(g) == partition}
        gone |= {g for g in self.consumer_groups.groups if self.store.partition_of(g) == partition}
        self.consumer_groups.unload(gone)
        for group_id in gone:
            group = self.groups.pop(group_id, None)
            if group is None:
                continue
            if group.join_timer is not None:
                group.join_timer.cancel()
            for member in group.members.values():
                member.fail_waiters(NOT_COORDINATOR)
        if gone:
            log.info("no longer coordinating the %d group(s) of %s-%d", len(gone), OFFSETS_TOPIC, partition)

    def _not_here(self, group_id: str) -> ErrorCode:
        """NONE if this broker coordinates the group, else the error to answer (in a cluster)."""
        return NONE if self.placement is None else self.placement.error_for(group_id)

    def _restore(self, group_ids: list[str]) -> None:
        for group_id in group_ids:
            stored = self.store.groups[group_id]
            if stored.consumer_records:  # a group of the consumer protocol: consumer_groups.py's
                continue
            group = self._group(group_id)
            metadata = stored.metadata
            if metadata is None:
                continue
            group.generation = metadata.generation
            group.protocol_type = metadata.protocol_type or None
            group.protocol = metadata.protocol
            group.leader = metadata.leader
            for m in metadata.members:
                group.members[m.member_id] = Member(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.session_timeout_ms,
                    m.rebalance_timeout_ms,
                    metadata.protocol_type,
                    [(metadata.protocol or "", m.subscription)],
                    m.assignment,
                )
            group.state = GroupState.STABLE if group.members else GroupState.EMPTY
            if not group.members:
                group.empty_since_ms = metadata.current_state_timestamp

    async def stop(self) -> None:
        """Shutdown: stop the timers and answer every member waiting in a JoinGroup or SyncGroup (new waits are
        refused from now on), so no request of a client is held until its rebalance timeout."""
        for task in (self._expiry_task, self._offsets_task):
            if task is not None:
                task.cancel()
        await self.consumer_groups.stop()
        for group in self.groups.values():
            if group.join_timer is not None:
                group.join_timer.cancel()
            for member in group.members.values():
                member.fail_waiters(NOT_COORDINATOR)

    def has_members(self, group_id: str) -> bool:
        """Whether a classic group with members holds `group_id`."""
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def _group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        return group

    def _may(self, connection: Connection, operation: Operation, group_id: str, *, log_denied: bool = True) -> bool:
        return self.authorizer.authorize(connection, operation, ResourceType.GROUP, group_id, log_denied=log_denied)

    def _may_topic(self, connection: Connection, operation: Operation, topic: str) -> bool:
        return self.authorizer.authorize(connection, operation, ResourceType.TOPIC, topic)

    # --- FindCoordinator --------------------------------------------------------------------------------------

    async def handle_find_coordinator(self, request: Request, connection: Connection) -> Response:
        body = request.body
        key_type = getattr(body, "key_type", 0)
        keys = list(body.coordinator_keys) if request.api_version >= 4 else [body.key]
        answers = [self._find_one(key, key_type, connection) for key in keys]
        if request.api_version >= 4:
            return {"throttle_time": 0, "coordinators": [{"key": k, **a} for k, a in zip(keys, answers, strict=True)]}
        return {"throttle_time": 0, **answers[0]}

    def _find_one(self, key: str, key_type: int, connection: Connection) -> dict[str, Any]:
        if key_type == 1:
            if self.transactions is None:
                return {**NO_NODE, "error_code": COORDINATOR_NOT_AVAILABLE, "error_message": None}
            return {"error_message": None, **self.transactions.coordinator_for(key, connection)}
        if key_type != 0:  # Kafka 3.9's InvalidRequestException
            return {**NO_NODE, "error_code": INVALID_REQUEST, "error_message": f"unknown key type {key_type}"}
        if not self._may(connection, Operation.DESCRIBE, key):
            return {**NO_NODE, "error_code": GROUP_AUTHORIZATION_FAILED, "error_message": None}
        if self.placement is not None:
            found = self.placement.coordinator_for(key, connection)
            return {**found, "error_message": None if found["error_code"] == NONE else "no coordinator yet"}
        node = {"node_id": self.config.node_id, "host": connection.advertised_host, "port": connection.advertised_port}
        return {**node, "error_code": NONE, "error_message": None}

    # --- JoinGroup --------------------------------------------------------------------------------------------

    async def handle_join_group(self, request: Request, connection: Connection) -> Response:
        body = request.body
        session_ms = millis(body.session_timeout)
        rebalance_ms = millis(getattr(body, "rebalance_timeout", None)) or session_ms
        instance_id = getattr(body, "group_instance_id", None)
        if not body.group_id:
            return self._join_error(INVALID_GROUP_ID, body.member_id)
        if not self._may(connection, Operation.READ, body.group_id):
            return self._join_error(GROUP_AUTHORIZATION_FAILED, body.member_id)
        if elsewhere := self._not_here(body.group_id):
            return self._join_error(elsewhere, body.member_id)
        if not self.config.group_min_session_timeout_ms <= session_ms <= self.config.group_max_session_timeout_ms:
            return self._join_error(INVALID_SESSION_TIMEOUT, body.member_id)
        if self.consumer_groups.owns(body.group_id):
            if self.consumer_groups.has_members(body.group_id):
                return self._join_error(INCONSISTENT_GROUP_PROTOCOL, body.member_id)
            await self.store.write(body.group_id, self.consumer_groups.removal_entries(body.group_id))
            self.consumer_groups.forget(body.group_id)
            log.info("group %s: the empty consumer-protocol group becomes a classic group", body.group_id)
        group = self._group(body.group_id)
        protocols = [(p.name, bytes(p.metadata)) for p in body.protocols]
        if (
            group.state is not GroupState.EMPTY
            and group.members
            and (
                body.protocol_type != group.protocol_type
                or not {name for name, _ in protocols} & group.supported_protocols()
            )
        ):
            return self._join_error(INCONSISTENT_GROUP_PROTOCOL, body.member_id)

        member_id = body.member_id
        if not member_id:
            member_id = f"{instance_id or request.client_id or 'member'}-{uuid.uuid4()}"  # Kafka's generateMemberId
            known = group.static_member(instance_id)
            if known is not None:
                return await self._replace_static_member(
                    group, known, member_id, protocols, session_ms, rebalance_ms, request.api_version >= 9
                )
            if instance_id is None and request.api_version >= 4:
                group.pending_member_ids[member_id] = time.monotonic()
                return self._join_error(MEMBER_ID_REQUIRED, member_id)
        elif member_id not in group.pending_member_ids and (
            error := self._member_error(group, member_id, instance_id, "join-group")
        ):
            return self._join_error(error, member_id)
        group.pending_member_ids.pop(member_id, None)

        member = group.members.get(member_id)
        host = connection.peer.rsplit(":", 1)[0]
        if member is None:
            member = Member(
                member_id,
                instance_id,
                request.client_id or "",
                f"/{host}",
                session_ms,
                rebalance_ms,
                body.protocol_type,
                protocols,
            )
            group.members[member_id] = member
            changed = True
        else:
            changed = member.protocols != protocols
            member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms = (
                protocols,
                session_ms,
                rebalance_ms,
            )
        member.last_heartbeat = time.monotonic()
        if group.protocol_type is None or len(group.members) == 1:
            group.protocol_type = body.protocol_type

        unchanged_follower = not changed and member_id != group.leader
        if (group.state is GroupState.COMPLETING_REBALANCE and not changed) or (
            group.state is GroupState.STABLE and unchanged_follower
        ):
            return self._join_response(group, member)  # nothing to rebalance: the current generation stands
        return await self._join_rebalance(group, member, f"member {member_id} joined")

    async def _join_rebalance(self, group: Group, member: Member, reason: str) -> dict[str, Any]:
        """The member waits in the join phase of a rebalance (started now unless one is under way)."""
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result(self._join_error(UNKNOWN_MEMBER_ID, member.member_id))  # superseded
        if self.is_stopping():  # nobody would complete the rebalance
            return self._join_error(NOT_COORDINATOR, member.member_id)
        future = member.join_future = asyncio.get_running_loop().create_future()
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, reason)
        self._maybe_complete_join(group)
        return await future

    async def _replace_static_member(
        self,
        group: Group,
        member: Member,
        new_id: str,
        protocols: list[tuple[str, bytes]],
        session_ms: int,
        rebalance_ms: int,
        may_skip_assignment: bool,
    ) -> dict[str, Any]:
        """KIP-345: a known `group.instance.id` joins without a member id (the instance restarted, or a second
        process uses the same id). It takes the member over under a new member id; the old id is fenced (its
        waiting JoinGroup/SyncGroup and every later request answer FENCED_INSTANCE_ID). In a Stable group whose
        protocol stays, there is no rebalance: the member keeps its assignment and the current generation; a
        returning leader is told so (JoinGroup v9 `skip_assignment`), before v9 it is named a follower (the old
        leader id is returned) so that it does not compute an assignment nobody would receive."""
        old_id, old_leader = member.member_id, group.leader
        old_settings = (member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms)
        member.fail_waiters(FENCED_INSTANCE_ID)
        group.rename_member(member, new_id)
        member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms = protocols, session_ms, rebalance_ms
        member.last_heartbeat = time.monotonic()
        log.info(
            "group %s: static member %s joins as %s (state %s); member %s is fenced",
            group.group_id,
            member.group_instance_id,
            new_id,
            group.state.value,
            old_id,
        )
        if group.state is not GroupState.STABLE or self._select_protocol(group) != group.protocol:
            reason = f"static member {member.group_instance_id} rejoined as {new_id}"
            return await self._join_rebalance(group, member, reason)
        try:
            await self._persist_group(group)
        except Exception as exc:  # the new member id is not durable: back to the old one, the client retries
            log.warning("group %s: persisting static member %s failed: %s", group.group_id, new_id, exc)
            if group.members.get(new_id) is member:
                group.rename_member(member, old_id)
                member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms = old_settings
            return self._join_error(getattr(exc, "kafka_error_code", UNKNOWN_SERVER_ERROR), "")
        if not may_skip_assignment:
            return self._join_response(group, member, leader=old_leader)
        return {**self._join_response(group, member), "skip_assignment": group.leader == new_id}

    def _member_error(self, group: Group, member_id: str, instance_id: str | None, operation: str) -> ErrorCode:
        """Kafka's validateCurrentMember: a request naming a `group.instance.id` must come from the member id that
        holds it (FENCED_INSTANCE_ID when another does, UNKNOWN_MEMBER_ID when none does); one without must name a
        member of the group."""
        if instance_id is None:
            return NONE if member_id in group.members else UNKNOWN_MEMBER_ID
        holder = group.static_member(instance_id)
        if holder is None:
            return UNKNOWN_MEMBER_ID
        if holder.member_id != member_id:
            log.info(
                "group %s: %s by member %s of static instance %s is fenced (the instance is member %s now)",
                group.group_id,
                operation,
                member_id,
                instance_id,
                holder.member_id,
            )
            return FENCED_INSTANCE_ID
        return NONE

    @staticmethod
    def _join_error(error_code: int, member_id: str) -> dict[str, Any]:
        return {
            "throttle_time": 0,
            "error_code": error_code,
            "generation_id": -1,
            "protocol_type": None,
            "protocol_name": None,
            "leader": "",
            "member_id": member_id,
            "members": [],
        }

    def _join_response(self, group: Group, member: Member, leader: str | None = None) -> dict[str, Any]:
        """The current generation; the member list goes to the leader (`leader`: the leader id to name, if not the
        group's)."""
        leader = group.leader if leader is None else leader
        members = []
        if member.member_id == leader:
            members = [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "metadata": m.metadata_for(group.protocol),
                }
                for m in group.members.values()
            ]
        return {
            "throttle_time": 0,
            "error_code": NONE,
            "generation_id": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol,
            "leader": leader or "",
            "skip_assignment": False,
            "member_id": member.member_id,
            "members": members,
        }

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        log.info("group %s rebalancing (generation %d): %s", group.group_id, group.generation, reason)
        if group.state is GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
                if member.sync_future is not None and not member.sync_future.done():
                    member.sync_future.set_result(self._sync_response(REBALANCE_IN_PROGRESS))
                member.sync_future = None
        loop = asyncio.get_running_loop()
        if group.join_timer is not None:
            group.join_timer.cancel()
        if group.state is GroupState.EMPTY and self.config.group_initial_rebalance_delay_ms > 0:
            group.initial_delay_pending = True
            delay = self.config.group_initial_rebalance_delay_ms / 1000
        else:
            delay = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
        group.state = GroupState.PREPARING_REBALANCE
        group.join_timer = loop.call_later(delay, self._join_deadline, group)

    def _join_deadline(self, group: Group) -> None:
        group.join_timer = None
        group.initial_delay_pending = False
        if group.state is GroupState.PREPARING_REBALANCE:
            self._complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and not group.initial_delay_pending
            and group.all_members_joined()
        ):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        absent = [m for m in group.members.values() if m.join_future is None]
        for member in absent:
            if member.group_instance_id is None:  # a static member stays until its session ends (KIP-345)
                log.info("group %s: member %s did not rejoin in time; removing it", group.group_id, member.member_id)
                group.members.pop(member.member_id).fail_waiters(UNKNOWN_MEMBER_ID)
        joined = [m.member_id for m in group.members.values() if m.join_future is not None]
        if group.members and not joined:  # only absent static members: wait for them or for their sessions' end
            log.info("group %s: no member rejoined; the rebalance waits for the static members", group.group_id)
            delay = max(m.rebalance_timeout_ms for m in group.members.values()) / 1000
            group.join_timer = asyncio.get_running_loop().call_later(delay, self._join_deadline, group)
            return
        group.generation += 1
        if not group.members:
            self._become_empty(group)
            return
        group.protocol = self._select_protocol(group)
        if group.leader not in joined:
            group.leader = joined[0]
        group.state = GroupState.COMPLETING_REBALANCE
        now = time.monotonic()
        for member in group.members.values():
            member.last_heartbeat = now
            future, member.join_future = member.join_future, None
            if future is not None and not future.done():
                future.set_result(self._join_response(group, member))
        log.info(
            "group %s: generation %d with %d member(s), leader %s, protocol %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.leader,
            group.protocol,
        )

    @staticmethod
    def _select_protocol(group: Group) -> str | None:
        candidates = group.supported_protocols()
        votes: Counter[str] = Counter()
        for member in group.members.values():
            choice = next((name for name, _ in member.protocols if name in candidates), None)
            if choice is not None:
                votes[choice] += 1
        return votes.most_common(1)[0][0] if votes else None

    # --- SyncGroup --------------------------------------------------------------------------------------------

    async def handle_sync_group(self, request: Request, connection: Connection) -> Response:
        body = request.body
        if not self._may(connection, Operation.READ, body.group_id):
            return self._sync_response(GROUP_AUTHORIZATION_FAILED)
        if elsewhere := self._not_here(body.group_id):
            return self._sync_response(elsewhere)
        group = self.groups.get(body.group_id)
        instance_id = getattr(body, "group_instance_id", None)
        if group is None:
            return self._sync_response(UNKNOWN_MEMBER_ID)
        if error := self._member_error(group, body.member_id, instance_id, "sync-group"):
            return self._sync_response(error)
        member = group.members[body.member_id]
        if body.generation_id != group.generation:
            return self._sync_response(ILLEGAL_GENERATION)
        protocol_type = getattr(body, "protocol_type", None)
        protocol_name = getattr(body, "protocol_name", None)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol
        ):
            return self._sync_response(INCONSISTENT_GROUP_PROTOCOL)
        if group.state is GroupState.PREPARING_REBALANCE:
            return self._sync_response(REBALANCE_IN_PROGRESS)
        member.last_heartbeat = time.monotonic()
        if group.state is GroupState.STABLE:
            return self._sync_response(NONE, group, member.assignment)
        if self.is_stopping():  # the group's waiters were answered already; this one would wait for nothing
            return self._sync_response(NOT_COORDINATOR)
        member.sync_future = asyncio.get_running_loop().create_future()
        future = member.sync_future
        if member.member_id == group.leader:
            assignments = {a.member_id: bytes(a.assignment) for a in body.assignments}
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            await self._persist_group(group)
            if group.state is GroupState.COMPLETING_REBALANCE and body.generation_id == group.generation:
                group.state = GroupState.STABLE
                for m in group.members.values():
                    waiter, m.sync_future = m.sync_future, None
                    if waiter is not None and not waiter.done():
                        waiter.set_result(self._sync_response(NONE, group, m.assignment))
        return await future

    @staticmethod
    def _sync_response(error_code: int, group: Group | None = None, assignment: bytes = b"") -> dict[str, Any]:
        return {
            "throttle_time": 0,
            "error_code": error_code,
            "protocol_type": group.protocol_type if group else None,
            "protocol_name": group.protocol if group else None,
            "assignment": assignment,
        }

    # --- Heartbeat and LeaveGroup -----------------------------------------------------------------------------

    async def handle_heartbeat(self, request: Request, connection: Connection) -> Response:
        body = request.body
        group = self.groups.get(body.group_id)
        instance_id = getattr(body, "group_instance_id", None)
        if not self._may(connection, Operation.READ, body.group_id):
            error = GROUP_AUTHORIZATION_FAILED
        elif elsewhere := self._not_here(body.group_id):
            error = elsewhere
        elif group is None or (error := self._member_error(group, body.member_id, instance_id, "heartbeat")):
            error = UNKNOWN_MEMBER_ID if group is None else error
        elif body.generation_id != group.generation:
            error = ILLEGAL_GENERATION
        else:
            group.members[body.member_id].last_heartbeat = time.monotonic()
            error = REBALANCE_IN_PROGRESS if group.state is GroupState.PREPARING_REBALANCE else NONE
        return {"throttle_time": 0, "error_code": error}

    async def handle_leave_group(self, request: Request, connection: Connection) -> Response:
        body = request.body
        if not self._may(connection, Operation.READ, body.group_id):
            return {"throttle_time": 0, "error_code": GROUP_AUTHORIZATION_FAILED, "members": []}
        if elsewhere := self._not_here(body.group_id):
            return {"throttle_time": 0, "error_code": elsewhere, "members": []}
        group = self.groups.get(body.group_id)
        if request.api_version < 3:
            leaving = [(body.member_id, None)]
        else:
            leaving = [(m.member_id, m.group_instance_id) for m in body.members]
        results = []
        for member_id, instance_id in leaving:
            error = self._leave(group, member_id, instance_id)
            results.append({"member_id": member_id, "group_instance_id": instance_id, "error_code": error})
        top_error = NONE
        if request.api_version < 3 and results and results[0]["error_code"] != NONE:
            top_error = results[0]["error_code"]
        return {"throttle_time": 0, "error_code": top_error, "members": results}

    def _leave(self, group: Group | None, member_id: str, instance_id: str | None) -> ErrorCode:
        """One member of a LeaveGroup: by member id (a static one's must hold its instance id, else
        FENCED_INSTANCE_ID), or, with no member id, by `group.instance.id` alone (KIP-345's removal by an admin)."""
        if group is None:
            return UNKNOWN_MEMBER_ID
        if not member_id:
            static = group.static_member(instance_id)
            if static is None:
                return UNKNOWN_MEMBER_ID
            self._remove_member(group, static.member_id, f"(static instance {instance_id}) was removed by LeaveGroup")
            return NONE
        if member_id in group.pending_member_ids:
            del group.pending_member_ids[member_id]
            return NONE
        if error := self._member_error(group, member_id, instance_id, "leave-group"):
            return error
        self._remove_member(group, member_id, "left the group")
        return NONE

    def _remove_member(self, group: Group, member_id: str, reason: str) -> None:
        member = group.members.pop(member_id)
        member.fail_waiters(UNKNOWN_MEMBER_ID)
        log.info("group %s: member %s %s", group.group_id, member_id, reason)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            if group.members:
                self._prepare_rebalance(group, f"member {member_id} {reason}")
            else:
                group.generation += 1
                self._become_empty(group)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)

    def _become_empty(self, group: Group) -> None:
        group.state = GroupState.EMPTY
        group.protocol = group.leader = None
        group.empty_since_ms = int(time.time() * 1000)
        self._persist_group_later(group)

    async def _expire_members(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_CHECK_SECONDS)
            now = time.monotonic()
            for group in list(self.groups.values()):
                for member_id, given in list(group.pending_member_ids.items()):
                    if now - given > self.config.group_max_session_timeout_ms / 1000:
                        del group.pending_member_ids[member_id]  # handed out but never used to rejoin
                for member in list(group.members.values()):
                    waiting = member.join_future is not None or member.sync_future is not None
                    if not waiting and now - member.last_heartbeat > member.session_timeout_ms / 1000:
                        self._remove_member(group, member.member_id, "timed out (no heartbeat within the session)")

    async def _expire_offsets_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire_offsets(int(time.time() * 1000))
            except Exception:
                log.exception("expiring old offsets failed")

    async def forget_topic(self, topic: str) -> None:
        """A deleted topic takes its committed offsets with it (Kafka's onPartitionsDeleted)."""
        for group_id, stored in list(self.store.groups.items()):
            doomed = [(t, p) for t, p in stored.offsets if t == topic]
            if doomed:
                await self.store.write(group_id, [(records.OffsetKey(group_id, t, p), None) for t, p in doomed])

    async def expire_offsets(self, now_ms: int) -> int:
        """Kafka's rule (KIP-211): a group with members keeps its offsets; an empty group's offsets expire
        `offsets.retention.minutes` after the later of their commit and the moment the group became empty.
        A group left with no offsets and no members is removed (its metadata gets a tombstone)."""
        expired = 0
        retention = self.config.offsets_retention_ms
        for group_id, stored in list(self.store.groups.items()):
            group = self.groups.get(group_id)
            if (group is not None and group.members) or self.consumer_groups.has_members(group_id):
                continue
            empty_since = group.empty_since_ms if group is not None and group.empty_since_ms is not None else 0
            old = [
                key
                for key, value in stored.offsets.items()
                if now_ms - max(value.commit_timestamp, empty_since) > retention
            ]
            entries: list[tuple[StoreKey, bytes | None]] = [(records.OffsetKey(group_id, t, p), None) for t, p in old]
            group_gone = len(old) == len(stored.offsets)
            if group_gone and stored.metadata is not None:
                entries.append((records.GroupKey(group_id), None))
            if group_gone:
                entries += self.consumer_groups.removal_entries(group_id)
            if entries:
                await self.store.write(group_id, entries)
            if old:
                expired += len(old)
                log.info("group %s: %d committed offset(s) expired (offsets.retention.minutes)", group_id, len(old))
            if group_gone:
                self.groups.pop(group_id, None)
                self.consumer_groups.forget(group_id)
        return expired

    # --- persistence ------------------------------------------------------------------------------------------

    def _group_value(self, group: Group) -> records.GroupValue:
        return records.GroupValue(
            group.protocol_type or "",
            group.generation,
            group.protocol,
            group.leader,
            group.empty_since_ms
            if group.state is GroupState.EMPTY and group.empty_since_ms
            else int(time.time() * 1000),
            tuple(
                records.MemberValue(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata_for(group.protocol),
                    m.assignment,
                )
                for m in group.members.values()
            ),
        )

    async def _persist_group(self, group: Group) -> None:
        await self.store.write(
            group.group_id, [(records.GroupKey(group.group_id), records.encode_group_value(self._group_value(group)))]
        )

    def _persist_group_later(self, group: Group) -> None:
        task = asyncio.ensure_future(self._persist_group(group))
        task.add_done_callback(_log_persist_failure)

    # --- offsets ----------------------------------------------------------------------------------------------

    async def handle_offset_commit(self, request: Request, connection: Connection) -> Response:
        body = request.body
        generation = body.generation_id_or_member_epoch
        group = self.groups.get(body.group_id)
        instance_id = getattr(body, "group_instance_id", None)
        member_id = getattr(body, "member_id", "")  # v0 has none: a commit outside the group's generations
        error = NONE
        if not body.group_id:
            error = INVALID_GROUP_ID
        elif not self._may(connection, Operation.READ, body.group_id):
            error = GROUP_AUTHORIZATION_FAILED
        elif elsewhere := self._not_here(body.group_id):
            error = elsewhere
        elif self.consumer_groups.owns(body.group_id):
            error = self.consumer_groups.offset_commit_error(
                body.group_id, member_id, instance_id, generation, request.api_version
            )
        elif generation < 0 and (group is None or not group.members):
            pass  # a group that only stores offsets (the admin client, manual assignment)
        elif generation < 0 and not member_id and instance_id is None:
            error = UNKNOWN_MEMBER_ID  # a group with members: only they commit
        elif group is None or (error := self._member_error(group, member_id, instance_id, "offset-commit")):
            error = UNKNOWN_MEMBER_ID if group is None else error
        elif generation != group.generation:
            error = ILLEGAL_GENERATION
        elif group.state is GroupState.COMPLETING_REBALANCE:
            error = REBALANCE_IN_PROGRESS
        now_ms = int(time.time() * 1000)
        entries: list[tuple[records.OffsetKey | records.GroupKey, bytes | None]] = []
        topics = []
        for topic in body.topics:
            partitions = []
            topic_denied = error == NONE and not self._may_topic(connection, Operation.READ, topic.name)
            for partition in topic.partitions:
                code = TOPIC_AUTHORIZATION_FAILED if topic_denied else error
                metadata = partition.committed_metadata or ""
                if code == NONE and not self._partition_exists(topic.name, partition.partition_index):
                    code = UNKNOWN_TOPIC_OR_PARTITION
                elif code == NONE and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                    code = OFFSET_METADATA_TOO_LARGE
                if code == NONE:
                    committed_at = getattr(partition, "commit_timestamp", -1)  # v1 only: -1 means now, as in Kafka
                    value = records.OffsetValue(
                        partition.committed_offset,
                        getattr(partition, "committed_leader_epoch", -1),
                        metadata,
                        committed_at if committed_at >= 0 else now_ms,
                    )
                    entries.append(
                        (
                            records.OffsetKey(body.group_id, topic.name, partition.partition_index),
                            records.encode_offset_value(value),
                        )
                    )
                partitions.append({"partition_index": partition.partition_index, "error_code": code})
            topics.append({"name": topic.name, "partitions": partitions})
        if entries:
            try:
                await self.store.write(body.group_id, entries)
                if not self.consumer_groups.owns(body.group_id):
                    self._group(body.group_id)
                if group is not None and group.members and body.member_id in group.members:
                    group.members[body.member_id].last_heartbeat = time.monotonic()
            except Exception as exc:
                log.error("committing offsets of group %s failed: %s", body.group_id, exc)
                code = getattr(exc, "kafka_error_code", UNKNOWN_SERVER_ERROR)
                for topic_result in topics:
                    for partition_result in topic_result["partitions"]:
                        if partition_result["error_code"] == NONE:
                            partition_result["error_code"] = code
        return {"throttle_time": 0, "topics": topics}

    def _outside_transaction(self, body: Any) -> ErrorCode:
        """Why a TxnOffsetCommit does not belong to its producer's ongoing transaction, or NONE (also when the
        transactional id is coordinated by another broker of the cluster, which is not asked)."""
        if self.transactions is None:
            return NONE
        refused = self.transactions.verify_partition(
            body.transactional_id,
            body.producer_id,
            body.producer_epoch,
            (OFFSETS_TOPIC, self.store.partition_of(body.group_id)),
        )
        if refused in (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS) and self.placement is not None:
            return NONE
        return ErrorCode.INVALID_TXN_STATE if refused == NOT_COORDINATOR else refused

    async def handle_txn_offset_commit(self, request: Request, connection: Connection) -> Response:
        body = request.body
        instance_id = getattr(body, "group_instance_id", None)
        member_id = getattr(body, "member_id", "")
        generation = getattr(body, "generation_id", -1)
        group = self.groups.get(body.group_id)
        error = NONE
        if not self.authorizer.authorize(
            connection, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
        ):
            error = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not self._may(connection, Operation.READ, body.group_id):
            error = GROUP_AUTHORIZATION_FAILED
        elif elsewhere := self._not_here(body.group_id):
            error = elsewhere
        elif refused := self._outside_transaction(body):
            error = refused
        elif self.consumer_groups.owns(body.group_id) and generation >= 0:
            error = self.consumer_groups.offset_commit_error(
                body.group_id, member_id, instance_id, generation, request.api_version
            )
        elif generation >= 0 or member_id:  # v3+: the member's generation is checked as OffsetCommit checks it
            if group is None or (error := self._member_error(group, member_id, instance_id, "txn-offset-commit")):
                error = UNKNOWN_MEMBER_ID if group is None else error
            elif generation != group.generation:
                error = ILLEGAL_GENERATION
        now_ms = int(time.time() * 1000)
        entries: list[tuple[StoreKey, bytes | None]] = []
        topics = []
        for topic in body.topics:
            partitions = []
            topic_denied = error == NONE and not self._may_topic(connection, Operation.READ, topic.name)
            for partition in topic.partitions:
                code = TOPIC_AUTHORIZATION_FAILED if topic_denied else error
                metadata = partition.committed_metadata or ""
                if code == NONE and not self._partition_exists(topic.name, partition.partition_index):
                    code = UNKNOWN_TOPIC_OR_PARTITION
                elif code == NONE and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                    code = OFFSET_METADATA_TOO_LARGE
                if code == NONE:
                    value = records.OffsetValue(
                        partition.committed_offset, getattr(partition, "committed_leader_epoch", -1), metadata, now_ms
                    )
                    key = records.OffsetKey(body.group_id, topic.name, partition.partition_index)
                    entries.append((key, records.encode_offset_value(value)))
                partitions.append({"partition_index": partition.partition_index, "error_code": code})
            topics.append({"name": topic.name, "partitions": partitions})
        if entries:
            try:
                await self.store.write(body.group_id, entries, producer=(body.producer_id, body.producer_epoch))
            except Exception as exc:
                log.error("transactional offsets of group %s failed: %s", body.group_id, exc)
                code = getattr(exc, "kafka_error_code", UNKNOWN_SERVER_ERROR)
                for topic_result in topics:
                    for partition_result in topic_result["partitions"]:
                        if partition_result["error_code"] == NONE:
                            partition_result["error_code"] = code
        return {"throttle_time": 0, "topics": topics}

    def complete_transaction(self, producer_id: int, partition: int, committed: bool) -> None:
        """A transaction's marker reached `__consumer_offsets` partition `partition` (txn_markers.py): the
        producer's pending offsets there become committed, or are dropped."""
        for group_id in self.store.complete_transaction(producer_id, partition, committed):
            if committed and not self.consumer_groups.owns(group_id):
                self._group(group_id)

    def _partition_exists(self, topic: str, partition: int) -> bool:
        if self._cluster_has_partition is not None:
            return self._cluster_has_partition(topic, partition)
        try:
            self.engine.partition(topic, partition)
        except UnknownTopicOrPartitionError:
            return False
        return True

    async def handle_offset_fetch(self, request: Request, connection: Connection) -> Response:
        body = request.body
        if request.api_version >= 8:
            groups = []
            for g in body.groups:
                if not self._may(connection, Operation.DESCRIBE, g.group_id):
                    groups.append({"group_id": g.group_id, "topics": [], "error_code": GROUP_AUTHORIZATION_FAILED})
                elif elsewhere := self._not_here(g.group_id):
                    groups.append({"group_id": g.group_id, "topics": [], "error_code": elsewhere})
                elif self.consumer_groups.owns(g.group_id) and (
                    refused := self.consumer_groups.offset_fetch_error(
                        g.group_id, getattr(g, "member_id", None), getattr(g, "member_epoch", -1)
                    )
                ):
                    groups.append({"group_id": g.group_id, "topics": [], "error_code": refused})
                else:
                    topics = self._fetch_offsets(connection, g.group_id, g.topics, body.require_stable)
                    groups.append({"group_id": g.group_id, "topics": topics, "error_code": 0})
            return {"throttle_time": 0, "groups": groups}
        if not self._may(connection, Operation.DESCRIBE, body.group_id):
            return {"throttle_time": 0, "topics": [], "error_code": GROUP_AUTHORIZATION_FAILED}
        if elsewhere := self._not_here(body.group_id):
            return {"throttle_time": 0, "topics": [], "error_code": elsewhere}
        topics = self._fetch_offsets(connection, body.group_id, body.topics, getattr(body, "require_stable", False))
        return {"throttle_time": 0, "topics": topics, "error_code": 0}

    def _fetch_offsets(
        self, connection: Connection, group_id: str, requested: Any, require_stable: bool = False
    ) -> list[dict[str, Any]]:
        """Committed offsets; topics the client may not DESCRIBE answer TOPIC_AUTHORIZATION_FAILED when named,
        and are left out when the request asks for all of the group's offsets (Kafka's rule). With
        `require_stable`, a partition whose offset an open transaction holds answers UNSTABLE_OFFSET_COMMIT."""
        authorizer = self.authorizer
        stored = self.store.groups.get(group_id)
        offsets = stored.offsets if stored is not None else {}
        unstable: set[tuple[str, int]] = set()
        if require_stable:
            for held in self.store.pending_offsets(group_id).values():
                unstable.update(held)
        denied: set[str] = set()
        if requested is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(offsets):
                if authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.TOPIC, topic, log_denied=False):
                    wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in requested}
            denied = {name for name in wanted if not self._may_topic(connection, Operation.DESCRIBE, name)}
        topics = []
        for topic, partitions in wanted.items():
            answers = []
            for partition in partitions:
                if topic in denied:
                    answers.append(
                        {
                            "partition_index": partition,
                            "committed_offset": -1,
                            "committed_leader_epoch": -1,
                            "metadata": "",
                            "error_code": TOPIC_AUTHORIZATION_FAILED,
                        }
                    )
                    continue
                value = offsets.get((topic, partition))
                answers.append(
                    {
                        "partition_index": partition,
                        "committed_offset": value.offset if value else -1,
                        "committed_leader_epoch": value.leader_epoch if value else -1,
                        "metadata": value.metadata if value else "",
                        "error_code": UNSTABLE_OFFSET_COMMIT if (topic, partition) in unstable else NONE,
                    }
                )
            topics.append({"name": topic, "partitions": answers})
        return topics

    async def handle_offset_delete(self, request: Request, connection: Connection) -> Response:
        body = request.body
        if not self._may(connection, Operation.DELETE, body.group_id):
            return {"error_code": GROUP_AUTHORIZATION_FAILED, "throttle_time": 0, "topics": []}
        if elsewhere := self._not_here(body.group_id):
            return {"error_code": elsewhere, "throttle_time": 0, "topics": []}
        stored = self.store.groups.get(body.group_id)
        group = self.groups.get(body.group_id)
        if stored is None and group is None and not self.consumer_groups.owns(body.group_id):
            return {"error_code": GROUP_ID_NOT_FOUND, "throttle_time": 0, "topics": []}
        subscribed = self._subscribed_topics(group) | self.consumer_groups.subscribed_topics(body.group_id)
        entries: list[tuple[records.OffsetKey | records.GroupKey, bytes | None]] = []
        topics = []
        for topic in body.topics:
            partitions = []
            topic_denied = not self._may_topic(connection, Operation.READ, topic.name)
            for partition in topic.partitions:
                code = GROUP_SUBSCRIBED_TO_TOPIC if topic.name in subscribed else NONE
                code = TOPIC_AUTHORIZATION_FAILED if topic_denied else code
                if code == NONE:
                    entries.append((records.OffsetKey(body.group_id, topic.name, partition.partition_index), None))
                partitions.append({"partition_index": partition.partition_index, "error_code": code})
            topics.append({"name": topic.name, "partitions": partitions})
        await self.store.write(body.group_id, entries)
        return {"error_code": NONE, "throttle_time": 0, "topics": topics}

    def _subscribed_topics(self, group: Group | None) -> set[str]:
        """Topics an active consumer group subscribes to (from the consumer protocol's subscription)."""
        if group is None or not group.members or group.protocol_type != "consumer":
            return set()
        topics: set[str] = set()
        for member in group.members.values():
            topics |= _subscription_topics(member.metadata_for(group.protocol))
        return topics

    # --- describe, list, delete -------------------------------------------------------------------------------

    async def handle_describe_groups(self, request: Request, connection: Connection) -> Response:
        described = []
        include_operations = getattr(request.body, "include_authorized_operations", False)
        for group_id in request.body.groups:
            group = self.groups.get(group_id)
            if not self._may(connection, Operation.DESCRIBE, group_id):
                described.append(
                    {
                        "error_code": GROUP_AUTHORIZATION_FAILED,
                        "group_id": group_id,
                        "group_state": "",
                        "protocol_type": "",
                        "protocol_data": "",
                        "members": [],
                        "authorized_operations": -(1 << 31),
                    }
                )
                continue
            operations = -(1 << 31)
            if include_operations:
                operations = self.authorizer.authorized_operations(connection, ResourceType.GROUP, group_id)
            if elsewhere := self._not_here(group_id):
                described.append(
                    {
                        "error_code": elsewhere,
                        "group_id": group_id,
                        "group_state": "",
                        "protocol_type": "",
                        "protocol_data": "",
                        "members": [],
                        "authorized_operations": operations,
                    }
                )
                continue
            if group is None or self.consumer_groups.owns(group_id):  # Kafka 3.9: a consumer group is not classic
                described.append(
                    {
                        "error_code": NONE,
                        "group_id": group_id,
                        "group_state": GroupState.DEAD.value,
                        "protocol_type": "",
                        "protocol_data": "",
                        "members": [],
                        "authorized_operations": operations,
                    }
                )
                continue
            stable = group.state is GroupState.STABLE
            members = [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata_for(group.protocol) if stable else b"",
                    "member_assignment": m.assignment if stable else b"",
                }
                for m in group.members.values()
            ]
            described.append(
                {
                    "error_code": NONE,
                    "group_id": group_id,
                    "group_state": group.state.value,
                    "protocol_type": group.protocol_type or "",
                    "protocol_data": (group.protocol or "") if stable else "",
                    "members": members,
                    "authorized_operations": operations,
                }
            )
        return {"throttle_time": 0, "groups": described}

    async def handle_list_groups(self, request: Request, connection: Connection) -> Response:
        wanted = {s.lower() for s in getattr(request.body, "states_filter", ()) or ()}
        types = {t.lower() for t in getattr(request.body, "types_filter", ()) or ()}
        consumer = self.consumer_groups.listing()
        names = (set(self.groups) | set(self.store.groups)) - set(consumer)
        if types and "classic" not in types:
            names = set()
        if types and "consumer" not in types:
            consumer = {}
        everyone = names | set(consumer)
        if not self.authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.CLUSTER, log_denied=False):
            everyone = {n for n in everyone if self._may(connection, Operation.DESCRIBE, n, log_denied=False)}
        listed = []
        for group_id in sorted(everyone):
            if group_id in consumer:
                state, protocol_type, group_type = consumer[group_id], "consumer", "consumer"
            else:
                group = self.groups.get(group_id) or Group(group_id)
                state, protocol_type, group_type = group.state.value, group.protocol_type or "", "classic"
            if wanted and state.lower() not in wanted:
                continue
            listed.append(
                {"group_id": group_id, "protocol_type": protocol_type, "group_state": state, "group_type": group_type}
            )
        return {"throttle_time": 0, "error_code": NONE, "groups": listed}

    async def handle_delete_groups(self, request: Request, connection: Connection) -> Response:
        results = []
        for group_id in request.body.groups_names:
            group = self.groups.get(group_id)
            stored = self.store.groups.get(group_id)
            if not self._may(connection, Operation.DELETE, group_id):
                results.append({"group_id": group_id, "error_code": GROUP_AUTHORIZATION_FAILED})
                continue
            if elsewhere := self._not_here(group_id):
                results.append({"group_id": group_id, "error_code": elsewhere})
                continue
            if group is None and stored is None:
                results.append({"group_id": group_id, "error_code": GROUP_ID_NOT_FOUND})
                continue
            if (group is not None and group.members) or self.consumer_groups.has_members(group_id):
                results.append({"group_id": group_id, "error_code": NON_EMPTY_GROUP})
                continue
            entries: list[tuple[StoreKey, bytes | None]] = [
                (records.OffsetKey(group_id, topic, partition), None)
                for topic, partition in (stored.offsets if stored else {})
            ]
            entries.append((records.GroupKey(group_id), None))
            entries += self.consumer_groups.removal_entries(group_id)
            await self.store.write(group_id, entries)
            self.groups.pop(group_id, None)
            self.consumer_groups.forget(group_id)
            results.append({"group_id": group_id, "error_code": NONE})
        return {"throttle_time": 0, "results": results}


def _subscription_topics(metadata: bytes) -> set[str]:
    """Topic names of a consumer-protocol Subscription: version i16 | topics [string] | ..."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        pos, topics = 6, set()
        for _ in range(max(count, 0)):
            (length,) = struct.unpack_from(">h", metadata, pos)
            topics.add(metadata[pos + 2 : pos + 2 + length].decode("utf-8", "replace"))
            pos += 2 + length
        return topics
    except struct.error:
        return set()


def _log_persist_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("persisting group failed: %s", task.exception())
