"""The group coordinator of the consumer group protocol (KIP-848): ConsumerGroupHeartbeat and ConsumerGroupDescribe,
as Kafka 3.9's GroupMetadataManager serves them.

The server assigns. Each group has:
- a group epoch, bumped whenever the members or what they subscribe to (names, and those topics' partition counts)
  change;
- a target assignment (every member's partitions) computed by a server-side assignor (`uniform`, sticky and
  balanced; or `range`, per topic a range of partitions per member in member id order) when the group epoch passes
  the assignment epoch; a member asks for one by name (`server_assignor`), else the first of
  `group.consumer.assignors` is used;
- per member its current assignment, reconciled towards the target one heartbeat at a time (Kafka's
  CurrentAssignmentBuilder): partitions the target takes away are first pending revocation - the member keeps its
  epoch until it heartbeats without them (UNREVOKED_PARTITIONS) - and a partition is given to its new owner only
  once no other member holds it, assigned or pending revocation (until then UNRELEASED_PARTITIONS). A member
  reconciled to the target has the assignment epoch as its member epoch; the member epoch is the generation its
  OffsetCommit must carry (STALE_MEMBER_EPOCH below it, FENCED_MEMBER_EPOCH above).

Heartbeats: epoch 0 joins (member id chosen by the client, or by the coordinator if empty), -1 leaves, -2 leaves as
a static member that will come back: it keeps its partitions and epoch until its session ends, and a new member of
the same `instance_id` joining with epoch 0 takes them over (while the old one is still in the group with another
epoch: UNRELEASED_INSTANCE_ID). An epoch above the member's is fenced (FENCED_MEMBER_EPOCH), as is one below unless
it is the previous epoch with a subset of the assigned partitions (the answer with the new epoch was lost). A member
silent for `group.consumer.session.timeout.ms` is removed, as is one that does not revoke within its rebalance
timeout. A group holds one protocol: a ConsumerGroupHeartbeat for a classic group with members answers
GROUP_ID_NOT_FOUND; groups.py answers a classic JoinGroup for a consumer group with members
INCONSISTENT_GROUP_PROTOCOL (Kafka 3.9 would take the classic member into the group; not done here). An empty group
of either protocol is taken over by the other.

Everything is written to `__consumer_offsets` (offset_store.py) as Kafka's records (codec/consumer_group_records.py:
group epoch, subscription metadata, members, target assignment and its epoch, current assignments) before the
heartbeat is answered; a coordinator that loads the partition (a restart, or a new leader in a cluster) rebuilds
the groups from them, members keep their epochs and get a new session. If the write fails the member gets the
write's error (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR) and the state in memory stays ahead of the log until the
next write.

Versions: Kafka 3.9 serves v0 of both APIs; tidelog also serves v1 (Kafka 4.0's), which librdkafka 2.16 requires
for `group.protocol=consumer`: in ConsumerGroupHeartbeat v1 the client chooses its member id (KIP-1082; v0 lets the
coordinator choose one) and may subscribe with a regular expression (SubscribedTopicRegex, matched in full against
the names of every topic but the internal ones - Python's `re` here, RE2/J in Kafka - again at each heartbeat, so a
new matching topic joins the subscription; an invalid one is INVALID_REGULAR_EXPRESSION); ConsumerGroupDescribe v1
adds each member's type (always the consumer protocol here). In a cluster the coordinator is the leader of the
group's `__consumer_offsets` partition (cluster_groups.py), as for classic groups.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.codec import consumer_group_records as records
from tidelog.codec.consumer_group_records import ConsumerGroupKey, TopicMetadata
from tidelog.errors import ErrorCode
from tidelog.protocol.messages import ApiKey, Request, millis, uuid_to_kafka

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.cluster_groups import ClusterGroups
    from tidelog.broker.config import ConsumerGroupConfig
    from tidelog.broker.offset_store import OffsetStore

log = logging.getLogger("tidelog.broker")

JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH = 0, -1, -2
STABLE, UNREVOKED_PARTITIONS, UNRELEASED_PARTITIONS = 0, 1, 2  # Kafka's MemberState values
EXPIRY_CHECK_SECONDS = 0.25

# topic id (Kafka's base64 text) -> partitions
Partitions = dict[str, frozenset[int]]
# the topics a coordinator can see: name -> (topic id, partition count)
TopicLookup = Callable[[], Mapping[str, tuple[str, int]]]


class Refused(Exception):
    """A request answered with an error code and message (Kafka's ApiException)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code, self.message = code, message


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed: tuple[str, ...] = ()
    regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = 0
    state: int = STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    session_deadline: float = 0.0  # time.monotonic()
    revocation_deadline: float | None = None

    def metadata_value(self) -> bytes:
        return records.encode_member_metadata(
            records.MemberMetadata(
                self.instance_id,
                self.rack_id,
                self.client_id,
                self.client_host,
                self.subscribed,
                self.regex,
                self.rebalance_timeout_ms,
                self.server_assignor,
            )
        )

    def assignment_value(self) -> bytes:
        return records.encode_current_assignment(
            records.CurrentAssignment(
                self.epoch, self.previous_epoch, self.state, self.assigned, self.pending_revocation
            )
        )

    def update_epoch(self, epoch: int) -> None:
        self.previous_epoch, self.epoch = self.epoch, epoch


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Partitions] = field(default_factory=dict)  # member id -> its target assignment
    topics: dict[str, TopicMetadata] = field(default_factory=dict)  # the subscribed topics that exist, by name

    @property
    def state(self) -> str:
        """Kafka's ConsumerGroupState, as ListGroups and ConsumerGroupDescribe name it."""
        if not self.members:
            return "Empty"
        if self.epoch != self.assignment_epoch:
            return "Assigning"
        if any(m.epoch != self.assignment_epoch or m.state != STABLE for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def subscribed_names(self, known: Collection[str] = ()) -> set[str]:
        """The topics the members subscribe to: by name, and those of `known` their expressions match."""
        return {name for m in self.members.values() for name in subscription(m, known)}

    def owners(self) -> dict[tuple[str, int], str]:
        """Who holds each partition now: assigned to, or pending revocation by, a member."""
        held: dict[tuple[str, int], str] = {}
        for member in self.members.values():
            for owned in (member.assigned, member.pending_revocation):
                for topic_id, partitions in owned.items():
                    for p in partitions:
                        held[(topic_id, p)] = member.member_id
        return held

    def records(self) -> dict[ConsumerGroupKey, bytes]:
        """The group as its `__consumer_offsets` records (key -> value)."""
        gid = self.group_id
        out = {
            ConsumerGroupKey(records.GROUP_METADATA, gid): records.encode_group_epoch(self.epoch),
            ConsumerGroupKey(records.PARTITION_METADATA, gid): records.encode_partition_metadata(self.topics),
            ConsumerGroupKey(records.TARGET_ASSIGNMENT_METADATA, gid): records.encode_assignment_epoch(
                self.assignment_epoch
            ),
        }
        for member_id, member in self.members.items():
            out[ConsumerGroupKey(records.MEMBER_METADATA, gid, member_id)] = member.metadata_value()
            out[ConsumerGroupKey(records.CURRENT_MEMBER_ASSIGNMENT, gid, member_id)] = member.assignment_value()
        for member_id, partitions in self.target.items():
            out[ConsumerGroupKey(records.TARGET_ASSIGNMENT_MEMBER, gid, member_id)] = records.encode_target_assignment(
                partitions
            )
        return out

    @classmethod
    def from_records(cls, group_id: str, stored: Mapping[ConsumerGroupKey, bytes], session_s: float) -> ConsumerGroup:
        group = cls(group_id)
        now = time.monotonic()
        for key, value in stored.items():
            kind = key.record_type
            if kind == records.GROUP_METADATA:
                group.epoch = records.decode_group_epoch(value)
            elif kind == records.PARTITION_METADATA:
                group.topics = records.decode_partition_metadata(value)
            elif kind == records.TARGET_ASSIGNMENT_METADATA:
                group.assignment_epoch = records.decode_assignment_epoch(value)
            elif kind == records.TARGET_ASSIGNMENT_MEMBER:
                group.target[key.member_id or ""] = records.decode_target_assignment(value)
            else:
                member = group.members.get(key.member_id or "")
                if member is None:
                    member = group.members[key.member_id or ""] = ConsumerMember(key.member_id or "")
                    member.session_deadline = now + session_s
                if kind == records.MEMBER_METADATA:
                    meta = records.decode_member_metadata(value)
                    member.instance_id, member.rack_id = meta.instance_id, meta.rack_id
                    member.client_id, member.client_host = meta.client_id, meta.client_host
                    member.subscribed, member.rebalance_timeout_ms = (
                        meta.subscribed_topic_names,
                        meta.rebalance_timeout_ms,
                    )
                    member.server_assignor, member.regex = meta.server_assignor, meta.subscribed_topic_regex
                else:
                    current = records.decode_current_assignment(value)
                    member.epoch, member.previous_epoch, member.state = (
                        current.member_epoch,
                        current.previous_member_epoch,
                        current.state,
                    )
                    member.assigned, member.pending_revocation = (
                        dict(current.assigned),
                        dict(current.pending_revocation),
                    )
        return group


class ConsumerGroupCoordinator:
    def __init__(
        self,
        config: ConsumerGroupConfig,
        authorizer: Authorizer,
        store: OffsetStore,
        topics: TopicLookup,
        is_stopping: Callable[[], bool],
        placement: ClusterGroups | None = None,
    ) -> None:
        """`topics`: the topics a member may subscribe to (a cluster's, from its metadata). `placement`: a
        cluster's, which broker coordinates which group."""
        self.config = config
        self.authorizer = authorizer
        self.store = store
        self.topics = topics
        self.is_stopping = is_stopping
        self.placement = placement
        self.groups: dict[str, ConsumerGroup] = {}
        # whether a classic group with members holds a group id (set by the classic coordinator, groups.py)
        self.classic_in_use: Callable[[str], bool] = lambda group_id: False
        self._expiry_task: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.CONSUMER_GROUP_HEARTBEAT: ApiHandler(0, 1, self.handle_heartbeat),
            ApiKey.CONSUMER_GROUP_DESCRIBE: ApiHandler(0, 1, self.handle_describe),
        }

    # --- lifecycle (driven by the classic coordinator, which owns the loading of __consumer_offsets) -----------

    def start(self) -> None:
        self._expiry_task = asyncio.create_task(self._expire_members())

    async def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()

    def restore(self, group_ids: Iterable[str]) -> None:
        """Rebuild the consumer groups among `group_ids` from what the store replayed."""
        session_s = self.config.group_consumer_session_timeout_ms / 1000
        for group_id in group_ids:
            stored = self.store.groups.get(group_id)
            if stored is None or not stored.consumer_records:
                continue
            group = self.groups[group_id] = ConsumerGroup.from_records(group_id, stored.consumer_records, session_s)
            log.info(
                "consumer group %s loaded: epoch %d, assignment epoch %d, %d member(s)",
                group_id,
                group.epoch,
                group.assignment_epoch,
                len(group.members),
            )

    def unload(self, group_ids: Iterable[str]) -> None:
        for group_id in group_ids:
            self.groups.pop(group_id, None)

    # --- what the classic coordinator asks ---------------------------------------------------------------------

    def owns(self, group_id: str) -> bool:
        return group_id in self.groups

    def has_members(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def subscribed_topics(self, group_id: str) -> set[str]:
        group = self.groups.get(group_id)
        return group.subscribed_names() if group is not None else set()

    def listing(self) -> dict[str, str]:
        """Every consumer group and its state."""
        return {group_id: group.state for group_id, group in self.groups.items()}

    def removal_entries(self, group_id: str) -> list[tuple[ConsumerGroupKey, None]]:
        """Tombstones for every record of the group (DeleteGroups, or a classic group taking the id over)."""
        stored = self.store.groups.get(group_id)
        return [(key, None) for key in (stored.consumer_records if stored is not None else {})]

    def forget(self, group_id: str) -> None:
        self.groups.pop(group_id, None)

    def offset_commit_error(
        self, group_id: str, member_id: str, instance_id: str | None, member_epoch: int, api_version: int
    ) -> ErrorCode:
        """Kafka's ConsumerGroup.validateOffsetCommit: an empty group takes commits with a negative epoch (the admin
        client, manual assignment); otherwise the member must exist, commit with OffsetCommit v9+, and carry its
        current member epoch."""
        group = self.groups[group_id]
        if member_epoch < 0 and not group.members:
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if api_version < 9:
            return ErrorCode.UNSUPPORTED_VERSION
        return self._epoch_error(member, member_epoch)

    def offset_fetch_error(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """Kafka's validateOffsetFetch: without a member (epoch < 0, no member id) anyone may read."""
        if member_epoch < 0 and member_id is None:
            return ErrorCode.NONE
        member = self.groups[group_id].members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return self._epoch_error(member, member_epoch)

    @staticmethod
    def _epoch_error(member: ConsumerMember, received: int) -> ErrorCode:
        """The member epoch check of the offset APIs: above the member's is fenced, below it is stale."""
        if received > member.epoch:
            return ErrorCode.FENCED_MEMBER_EPOCH
        if received < member.epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    # --- ConsumerGroupHeartbeat --------------------------------------------------------------------------------

    async def handle_heartbeat(self, request: Request, connection: Connection) -> Response:
        try:
            return await self._heartbeat(request, connection)
        except Refused as refusal:
            return {
                "throttle_time": 0,
                "error_code": refusal.code,
                "error_message": refusal.message,
                "member_id": None,
                "member_epoch": 0,
                "heartbeat_interval": 0,
                "assignment": None,
            }

    def _check_request(self, body: Any, version: int) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid (INVALID_REQUEST, UNSUPPORTED_ASSIGNOR,
        INVALID_REGULAR_EXPRESSION)."""
        invalid = ErrorCode.INVALID_REQUEST
        if not body.group_id:
            raise Refused(invalid, "GroupId can't be empty.")
        if version >= 1 and not body.member_id:
            raise Refused(invalid, "MemberId can't be empty.")
        regex = getattr(body, "subscribed_topic_regex", None)
        if regex:
            try:
                re.compile(regex)
            except re.error as exc:
                raise Refused(
                    ErrorCode.INVALID_REGULAR_EXPRESSION, f"SubscribedTopicRegex `{regex}` is not valid: {exc}"
                ) from None
        if body.instance_id == "":
            raise Refused(invalid, "InstanceId can't be empty.")
        if body.rack_id == "":
            raise Refused(invalid, "RackId can't be empty.")
        epoch = body.member_epoch
        if epoch > 0 or epoch == LEAVE_EPOCH:
            if not body.member_id:
                raise Refused(invalid, "MemberId can't be empty.")
        elif epoch == JOIN_EPOCH:
            if millis(body.rebalance_timeout) == -1:
                raise Refused(invalid, "RebalanceTimeoutMs must be provided in first request.")
            if body.topic_partitions is None or len(body.topic_partitions):
                raise Refused(invalid, "TopicPartitions must be empty when (re-)joining.")
            if not body.subscribed_topic_names and not regex:
                raise Refused(invalid, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        elif epoch == STATIC_LEAVE_EPOCH:
            if not body.member_id:
                raise Refused(invalid, "MemberId can't be empty.")
            if body.instance_id is None:
                raise Refused(invalid, "InstanceId can't be null.")
        else:
            raise Refused(invalid, "MemberEpoch is invalid.")
        assignors = self.config.group_consumer_assignors
        if body.server_assignor is not None and body.server_assignor not in assignors:
            raise Refused(
                ErrorCode.UNSUPPORTED_ASSIGNOR,
                f"ServerAssignor {body.server_assignor} is not supported. Supported assignors: {', '.join(assignors)}.",
            )

    async def _heartbeat(self, request: Request, connection: Connection) -> dict[str, Any]:
        body = request.body
        self._check_request(body, request.api_version)
        group_id, epoch = body.group_id, body.member_epoch
        if not self.authorizer.authorize(connection, Operation.READ, ResourceType.GROUP, group_id):
            raise Refused(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        if self.placement is not None and (elsewhere := self.placement.error_for(group_id)):
            raise Refused(elsewhere)
        if self.is_stopping():
            raise Refused(ErrorCode.NOT_COORDINATOR)
        if epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return await self._leave(body)
        group = self.groups.get(group_id)
        if group is None:
            if epoch != JOIN_EPOCH:
                raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
            if self.classic_in_use(group_id):
                raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
            group = ConsumerGroup(group_id)
        owned = _partitions(body.topic_partitions)
        member, replaced = self._member(group, body, owned)
        before = group.records()
        created = member.member_id not in group.members
        if replaced is not None:  # the static member's new incarnation takes its partitions and its target over
            del group.members[replaced.member_id]
            group.target[member.member_id] = group.target.pop(replaced.member_id, {})
        if created:
            group.members[member.member_id] = member
        self.groups[group_id] = group

        subscription_changed = self._update_member(member, body, request.client_id or "", connection)
        topics = self._subscription_metadata(group)
        if subscription_changed or topics != group.topics:
            group.topics = topics
            group.epoch += 1
            log.info("consumer group %s: epoch %d (member %s)", group_id, group.epoch, member.member_id)
        if group.epoch > group.assignment_epoch:
            self._assign(group)
        previous_assigned = dict(member.assigned)
        self._reconcile(group, member, owned)
        member.session_deadline = time.monotonic() + self.config.group_consumer_session_timeout_ms / 1000
        await self._persist(group, before)
        answer: dict[str, Any] = {
            "throttle_time": 0,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "member_id": member.member_id,
            "member_epoch": member.epoch,
            "heartbeat_interval": self.config.group_consumer_heartbeat_interval_ms,
            "assignment": None,
        }
        if owned is not None or epoch == JOIN_EPOCH or member.assigned != previous_assigned:
            answer["assignment"] = {"topic_partitions": _topic_partitions(member.assigned)}
        return answer

    def _member(
        self, group: ConsumerGroup, body: Any, owned: Partitions | None
    ) -> tuple[ConsumerMember, ConsumerMember | None]:
        """The member the heartbeat is from (new if joining), and the static member it replaces, if any. Raises
        Refused for a full group, an unknown or fenced member, an unreleased instance id."""
        epoch, member_id, instance_id = body.member_epoch, body.member_id, body.instance_id
        if len(group.members) >= self.config.group_consumer_max_size and member_id not in group.members:
            raise Refused(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of {self.config.group_consumer_max_size} "
                "members.",
            )
        member_id = member_id or str(uuid.uuid4())
        if instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                if epoch != JOIN_EPOCH:
                    raise Refused(
                        ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group.group_id}."
                    )
                log.info("consumer group %s: member %s joins", group.group_id, member_id)
                return ConsumerMember(member_id), None
            self._check_epoch(member, epoch, owned)
            return member, None
        static = group.static_member(instance_id)
        if epoch == JOIN_EPOCH:
            if static is None:
                log.info("consumer group %s: static member %s (%s) joins", group.group_id, member_id, instance_id)
                return group.members.get(member_id) or ConsumerMember(member_id), None
            if static.member_id == member_id:
                self._check_epoch(static, epoch, owned)
                return static, None
            if static.epoch != STATIC_LEAVE_EPOCH:
                raise Refused(
                    ErrorCode.UNRELEASED_INSTANCE_ID,
                    f"Static member {member_id} with instance id {instance_id} cannot join the group because the "
                    f"instance id is owned by {static.member_id} member.",
                )
            log.info("consumer group %s: static member %s rejoins as %s", group.group_id, instance_id, member_id)
            return ConsumerMember(member_id, instance_id=instance_id, assigned=dict(static.assigned)), static
        if static is None:
            raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        if static.member_id != member_id:
            raise Refused(
                ErrorCode.FENCED_INSTANCE_ID,
                f"Static member {member_id} with instance id {instance_id} was fenced by member {static.member_id}.",
            )
        self._check_epoch(static, epoch, owned)
        return static, None

    @staticmethod
    def _check_epoch(member: ConsumerMember, received: int, owned: Partitions | None) -> None:
        """Kafka's throwIfMemberEpochIsInvalid."""
        if received > member.epoch:
            raise Refused(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The consumer group member has a greater member epoch ({received}) than the one known by the group "
                f"coordinator ({member.epoch}). The member must abandon all its partitions and rejoin.",
            )
        if received < member.epoch and (received != member.previous_epoch or not _is_subset(owned, member.assigned)):
            raise Refused(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The consumer group member has a smaller member epoch ({received}) than the one known by the group "
                f"coordinator ({member.epoch}). The member must abandon all its partitions and rejoin.",
            )

    @staticmethod
    def _update_member(member: ConsumerMember, body: Any, client_id: str, connection: Connection) -> bool:
        """Apply what the heartbeat sets (null fields keep their value); whether the subscription changed."""
        if body.instance_id is not None:
            member.instance_id = body.instance_id
        if body.rack_id is not None:
            member.rack_id = body.rack_id
        rebalance_ms = millis(body.rebalance_timeout)
        if rebalance_ms != -1:
            member.rebalance_timeout_ms = rebalance_ms
        if body.server_assignor is not None:
            member.server_assignor = body.server_assignor
        member.client_id = client_id
        member.client_host = "/" + connection.peer.rsplit(":", 1)[0]
        changed = False
        regex = getattr(body, "subscribed_topic_regex", None)
        if regex is not None:
            changed = (regex or None) != member.regex
            member.regex = regex or None  # an empty expression drops it
        if body.subscribed_topic_names is not None:
            names = tuple(sorted(set(body.subscribed_topic_names)))
            changed = changed or names != member.subscribed
            member.subscribed = names
        return changed

    def _subscription_metadata(self, group: ConsumerGroup) -> dict[str, TopicMetadata]:
        known = self.topics()
        return {
            name: TopicMetadata(known[name][0], name, known[name][1])
            for name in sorted(group.subscribed_names(known))
            if name in known
        }

    def _assign(self, group: ConsumerGroup) -> None:
        """A new target assignment for the group epoch."""
        name = self._assignor(group)
        subscriptions = {m.member_id: subscription(m, group.topics) for m in group.members.values()}
        assign = range_assign if name == "range" else uniform_assign
        group.target = assign(subscriptions, group.topics, group.target)
        group.assignment_epoch = group.epoch
        log.info(
            "consumer group %s: target assignment of epoch %d by the %s assignor: %s",
            group.group_id,
            group.epoch,
            name,
            {m: {group_topic_name(group, t): sorted(ps) for t, ps in a.items()} for m, a in group.target.items()},
        )

    def _assignor(self, group: ConsumerGroup) -> str:
        """The assignor most members ask for, else the first configured (Kafka's computePreferredServerAssignor)."""
        asked = Counter(m.server_assignor for m in group.members.values() if m.server_assignor is not None)
        return asked.most_common(1)[0][0] if asked else self.config.group_consumer_assignors[0]

    def _reconcile(self, group: ConsumerGroup, member: ConsumerMember, owned: Partitions | None) -> None:
        """Move the member's current assignment towards its target (Kafka's CurrentAssignmentBuilder)."""
        if member.epoch == group.assignment_epoch and member.state == STABLE:
            return
        if member.state == UNREVOKED_PARTITIONS and _owns_any(owned, member.pending_revocation):
            return  # it still holds partitions it must give up
        target = group.target.get(member.member_id, {})
        held = group.owners()
        assigned: Partitions = {}
        revoking: Partitions = {}
        adding: Partitions = {}
        unreleased = False
        for topic_id in set(target) | set(member.assigned):
            wanted = target.get(topic_id, frozenset())
            current = member.assigned.get(topic_id, frozenset())
            keep = current & wanted
            if keep:
                assigned[topic_id] = keep
            if current - keep:
                revoking[topic_id] = current - keep
            free = {p for p in wanted - keep if held.get((topic_id, p), member.member_id) == member.member_id}
            unreleased = unreleased or len(free) < len(wanted - keep)
            if free:
                adding[topic_id] = frozenset(free)
        before = (member.epoch, member.state, member.assigned, member.pending_revocation)
        if revoking:
            member.state, member.assigned, member.pending_revocation = UNREVOKED_PARTITIONS, assigned, revoking
            # the epoch stays until the member has revoked
        else:
            for topic_id, partitions in adding.items():
                assigned[topic_id] = assigned.get(topic_id, frozenset()) | partitions
            member.update_epoch(group.assignment_epoch)
            member.state = UNRELEASED_PARTITIONS if unreleased else STABLE
            member.assigned, member.pending_revocation = assigned, {}
        if (member.epoch, member.state, member.assigned, member.pending_revocation) != before:
            log.info(
                "consumer group %s: member %s at epoch %d, state %s, assigned %s, revoking %s",
                group.group_id,
                member.member_id,
                member.epoch,
                ("stable", "unrevoked partitions", "unreleased partitions")[member.state],
                _readable(group, member.assigned),
                _readable(group, member.pending_revocation),
            )
        if member.state == UNREVOKED_PARTITIONS:
            if before[1] != UNREVOKED_PARTITIONS or member.revocation_deadline is None:
                member.revocation_deadline = time.monotonic() + max(member.rebalance_timeout_ms, 0) / 1000
        else:
            member.revocation_deadline = None

    async def _leave(self, body: Any) -> dict[str, Any]:
        """Epoch -1 (leave) or -2 (a static member leaving for a while): Kafka's consumerGroupLeave."""
        group = self.groups.get(body.group_id)
        if group is None:
            raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {body.group_id} not found.")
        if body.instance_id is None:
            member = group.members.get(body.member_id)
            if member is None:
                raise Refused(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"Member {body.member_id} is not a member of group {group.group_id}."
                )
        else:
            static = group.static_member(body.instance_id)
            if static is None:
                raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {body.instance_id} is unknown.")
            if static.member_id != body.member_id:
                raise Refused(
                    ErrorCode.FENCED_INSTANCE_ID,
                    f"Static member {body.member_id} with instance id {body.instance_id} was fenced by member "
                    f"{static.member_id}.",
                )
            member = static
        before = group.records()
        if body.member_epoch == STATIC_LEAVE_EPOCH:
            # it keeps its partitions (nobody else gets them) until it comes back or its session ends
            member.epoch, member.pending_revocation, member.revocation_deadline = STATIC_LEAVE_EPOCH, {}, None
            log.info("consumer group %s: static member %s left for now", group.group_id, member.member_id)
        else:
            self._remove(group, member, "left the group")
        await self._persist(group, before)
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "member_id": body.member_id,
            "member_epoch": body.member_epoch,
            "heartbeat_interval": 0,
            "assignment": None,
        }

    def _remove(self, group: ConsumerGroup, member: ConsumerMember, reason: str) -> None:
        """The member goes and frees its partitions; the group epoch moves (a new target at the next heartbeat)."""
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        group.topics = self._subscription_metadata(group)
        group.epoch += 1
        log.info("consumer group %s: member %s %s; epoch %d", group.group_id, member.member_id, reason, group.epoch)

    async def _persist(self, group: ConsumerGroup, before: Mapping[ConsumerGroupKey, bytes]) -> None:
        """Write what changed since `before`. A failed write is the request's error (its code: Kafka's)."""
        after = group.records()
        entries: list[tuple[ConsumerGroupKey, bytes | None]] = [
            (key, value) for key, value in after.items() if before.get(key) != value
        ]
        entries += [(key, None) for key in before if key not in after]
        try:
            await self.store.write(group.group_id, entries)
        except Exception as exc:
            log.warning("consumer group %s: writing its records failed: %s", group.group_id, exc)
            raise Refused(
                ErrorCode(getattr(exc, "kafka_error_code", ErrorCode.UNKNOWN_SERVER_ERROR)), str(exc)
            ) from exc

    async def _expire_members(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_CHECK_SECONDS)
            now = time.monotonic()
            for group in list(self.groups.values()):
                expired = [m for m in group.members.values() if now > m.session_deadline]
                slow = [
                    m
                    for m in group.members.values()
                    if m.revocation_deadline is not None and now > m.revocation_deadline and m not in expired
                ]
                if not expired and not slow:
                    continue
                before = group.records()
                for member in expired:
                    self._remove(group, member, "timed out (no heartbeat within the session)")
                for member in slow:
                    self._remove(group, member, "did not revoke its partitions within its rebalance timeout")
                self._persist_later(group, before)

    def _persist_later(self, group: ConsumerGroup, before: Mapping[ConsumerGroupKey, bytes]) -> None:
        task = asyncio.ensure_future(self._persist(group, before))
        self._writes.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("persisting a consumer group failed: %s", task.exception())

    # --- ConsumerGroupDescribe ---------------------------------------------------------------------------------

    async def handle_describe(self, request: Request, connection: Connection) -> Response:
        body = request.body
        described = []
        for group_id in body.group_ids:
            answer: dict[str, Any] = {
                "error_code": ErrorCode.NONE,
                "error_message": None,
                "group_id": group_id,
                "group_state": "",
                "group_epoch": -1,
                "assignment_epoch": -1,
                "assignor_name": "",
                "members": [],
                "authorized_operations": -(1 << 31),
            }
            group = self.groups.get(group_id)
            if not self.authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.GROUP, group_id):
                answer["error_code"] = ErrorCode.GROUP_AUTHORIZATION_FAILED
            elif self.placement is not None and (elsewhere := self.placement.error_for(group_id)):
                answer["error_code"] = elsewhere
            elif group is None:
                answer["error_code"] = ErrorCode.GROUP_ID_NOT_FOUND
                in_store = group_id in self.store.groups or self.classic_in_use(group_id)
                answer["error_message"] = (
                    f"Group {group_id} is not a consumer group." if in_store else f"Group {group_id} not found."
                )
            else:
                answer.update(
                    group_state=group.state,
                    group_epoch=group.epoch,
                    assignment_epoch=group.assignment_epoch,
                    assignor_name=self._assignor(group),
                    members=[self._describe_member(group, m) for m in group.members.values()],
                )
                if body.include_authorized_operations:
                    answer["authorized_operations"] = self.authorizer.authorized_operations(
                        connection, ResourceType.GROUP, group_id
                    )
            described.append(answer)
        return {"throttle_time": 0, "groups": described}

    @staticmethod
    def _describe_member(group: ConsumerGroup, member: ConsumerMember) -> dict[str, Any]:
        def assignment(partitions: Partitions) -> dict[str, Any]:
            return {
                "topic_partitions": [
                    {"topic_id": t, "topic_name": group_topic_name(group, t), "partitions": sorted(ps)}
                    for t, ps in sorted(partitions.items())
                ]
            }

        return {
            "member_id": member.member_id,
            "instance_id": member.instance_id,
            "rack_id": member.rack_id,
            "member_epoch": member.epoch,
            "client_id": member.client_id,
            "client_host": member.client_host,
            "subscribed_topic_names": list(member.subscribed),
            "subscribed_topic_regex": member.regex,
            "member_type": 1,  # v1: a member of the consumer protocol
            "assignment": assignment(member.assigned),
            "target_assignment": assignment(group.target.get(member.member_id, {})),
        }


# --- the server-side assignors -------------------------------------------------------------------------------------


def uniform_assign(
    subscriptions: Mapping[str, Collection[str]],
    topics: Mapping[str, TopicMetadata],
    previous: Mapping[str, Partitions],
) -> dict[str, Partitions]:
    """Every partition of the subscribed topics to one of the members subscribed to its topic, as evenly as the
    subscriptions allow (counts differ by at most one among members who could take each other's partitions), moving
    as few partitions from their previous target owner as that needs (Kafka's UniformAssignor's aims)."""
    by_id = {t.topic_id: t for t in topics.values()}
    eligible = {t.topic_id: sorted(m for m, subs in subscriptions.items() if t.name in subs) for t in topics.values()}
    owner: dict[tuple[str, int], str] = {}
    load = dict.fromkeys(subscriptions, 0)
    for member_id in sorted(previous):
        if member_id not in subscriptions:
            continue
        for topic_id, partitions in previous[member_id].items():
            topic = by_id.get(topic_id)
            if topic is None or member_id not in eligible[topic_id]:
                continue
            for p in sorted(partitions):
                if p < topic.partitions and (topic_id, p) not in owner:
                    owner[(topic_id, p)] = member_id
                    load[member_id] += 1
    every = [(t.topic_id, p) for t in sorted(topics.values(), key=lambda t: t.name) for p in range(t.partitions)]
    for tp in every:
        if tp not in owner and eligible[tp[0]]:
            chosen = min(eligible[tp[0]], key=lambda m: (load[m], m))
            owner[tp] = chosen
            load[chosen] += 1
    moved = True
    while moved:  # hand partitions from the most loaded to the least loaded member that may take them
        moved = False
        for tp in sorted(owner, key=lambda tp: (-load[owner[tp]], tp)):
            current = owner[tp]
            lightest = min(eligible[tp[0]], key=lambda m: (load[m], m))
            if load[current] > load[lightest] + 1:
                owner[tp] = lightest
                load[current] -= 1
                load[lightest] += 1
                moved = True
    return _by_member(subscriptions, owner)


def range_assign(
    subscriptions: Mapping[str, Collection[str]],
    topics: Mapping[str, TopicMetadata],
    previous: Mapping[str, Partitions],
) -> dict[str, Partitions]:
    """Per topic, its members in member id order each get a range of consecutive partitions; the first
    `partitions % members` get one more (the range assignor's layout; `previous` is not consulted)."""
    del previous  # the layout follows from the subscriptions alone
    owner: dict[tuple[str, int], str] = {}
    for topic in topics.values():
        members = sorted(m for m, subs in subscriptions.items() if topic.name in subs)
        if not members:
            continue
        quota, extra = divmod(topic.partitions, len(members))
        start = 0
        for index, member_id in enumerate(members):
            count = quota + (1 if index < extra else 0)
            for p in range(start, start + count):
                owner[(topic.topic_id, p)] = member_id
            start += count
    return _by_member(subscriptions, owner)


def _by_member(
    subscriptions: Mapping[str, Collection[str]], owner: Mapping[tuple[str, int], str]
) -> dict[str, Partitions]:
    collected: dict[str, dict[str, set[int]]] = {m: {} for m in subscriptions}
    for (topic_id, p), member_id in owner.items():
        collected[member_id].setdefault(topic_id, set()).add(p)
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in collected.items()}


# --- helpers -----------------------------------------------------------------------------------------------------


def subscription(member: ConsumerMember, known: Collection[str]) -> set[str]:
    """The member's topics: its names, and those of `known` its expression matches in full (internal ones aside)."""
    names = set(member.subscribed)
    if member.regex:
        pattern = re.compile(member.regex)
        names |= {t for t in known if not t.startswith("__") and pattern.fullmatch(t)}
    return names


def _partitions(topic_partitions: Any) -> Partitions | None:
    """The request's TopicPartitions (null: unchanged since the last heartbeat)."""
    if topic_partitions is None:
        return None
    out: dict[str, frozenset[int]] = {}
    for tp in topic_partitions:
        topic_id = uuid_to_kafka(tp.topic_id)
        out[topic_id] = out.get(topic_id, frozenset()) | frozenset(int(p) for p in tp.partitions)
    return out


def _topic_partitions(partitions: Partitions) -> list[dict[str, Any]]:
    return [{"topic_id": t, "partitions": sorted(ps)} for t, ps in sorted(partitions.items()) if ps]


def _is_subset(owned: Partitions | None, assigned: Partitions) -> bool:
    if owned is None:  # as Kafka's isSubset: an unreported assignment is not known to be a subset
        return False
    return all(ps <= assigned.get(t, frozenset()) for t, ps in owned.items())


def _owns_any(owned: Partitions | None, revoking: Partitions) -> bool:
    """Whether the member still reports any partition it must revoke (not reporting counts as still owning)."""
    if owned is None:
        return True
    return any(ps & revoking.get(t, frozenset()) for t, ps in owned.items())


def group_topic_name(group: ConsumerGroup, topic_id: str) -> str:
    return next((t.name for t in group.topics.values() if t.topic_id == topic_id), "")


def _readable(group: ConsumerGroup, partitions: Partitions) -> dict[str, list[int]]:
    return {group_topic_name(group, t) or t: sorted(ps) for t, ps in sorted(partitions.items())}
