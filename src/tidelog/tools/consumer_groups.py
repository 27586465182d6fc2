"""`tidelog consumer-groups`: list, describe, reset and delete consumer groups, as kafka-consumer-groups.sh does.

It works against any Kafka-protocol broker: confluent-kafka's AdminClient (ListGroups, DescribeGroups, OffsetFetch,
ListOffsets, OffsetCommit, DeleteGroups), and for `--delete-offsets`, which the AdminClient lacks, OffsetDelete sent
to the group's coordinator with the brokers' own client (tools/wire_admin.py).

    --list [--state [S,...]]
        group ids, one a line; with --state a GROUP / STATE table (only the groups in the listed states, when given).
    --describe (--group G ... | --all-groups) [--members | --state]
        per partition: GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID, the
        assigned partitions first (members with the most partitions first), then the partitions with a committed
        offset that no member holds (consumer, host and client "-"); lag is log end - committed offset ("-" without
        a committed offset). --members: one line per member with its partition count. --state: coordinator,
        assignment strategy, state and member count.
    --reset-offsets (--group G ... | --all-groups) (--topic T[:P,...] ... | --all-topics) SCENARIO [--execute]
        SCENARIO is one of --to-earliest, --to-latest, --to-offset N, --to-datetime ISO, --shift-by N. Prints the
        plan (GROUP TOPIC PARTITION NEW-OFFSET); --dry-run is the default, --execute commits it. Offsets asked for
        outside [log start, log end] are moved to the nearer end (with a warning). A group with members (any state
        but Empty and Dead) is refused, dry run or not, as Kafka refuses it.
    --delete (--group G ... | --all-groups)
    --delete-offsets --group G --topic T[:P,...] ...
        the group's committed offsets of those partitions (Kafka refuses partitions of a topic the group's members
        are subscribed to: GROUP_SUBSCRIBED_TO_TOPIC); a TOPIC PARTITION STATUS table.

The tables are Kafka's (`printf` widths and all); per-group problems go to stderr as Kafka prints them, and make the
exit code 1. Every other failure is a ToolError: one line on stderr, exit code 1 (2 for bad usage).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription, OffsetSpec

from tidelog.errors import ErrorCode, ToolError
from tidelog.protocol.messages import ApiKey
from tidelog.tools.console import (
    ClientErrors,
    base_config,
    check_timeout,
    cluster_metadata,
    error_message,
    new_client,
    reports_kafka_errors,
)
from tidelog.tools.wire_admin import WireAdmin, error_text

USAGE = 2
CLIENT_ID = "tidelog-consumer-groups"
MISSING = "-"
OFFSET_DELETE_VERSION = 0
ACTIONS = ("list", "describe", "reset-offsets", "delete", "delete-offsets")
SCENARIOS = ("to-earliest", "to-latest", "to-offset", "to-datetime", "shift-by")

# Kafka's names of the classic group states (GroupState.toString), by confluent-kafka's enum
STATE_NAMES = {
    ConsumerGroupState.UNKNOWN: "Unknown",
    ConsumerGroupState.PREPARING_REBALANCING: "PreparingRebalance",
    ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
    ConsumerGroupState.STABLE: "Stable",
    ConsumerGroupState.DEAD: "Dead",
    ConsumerGroupState.EMPTY: "Empty",
}
INACTIVE = ("Empty", "Dead")

# Kafka's Errors.message() of the answers OffsetDelete gives
_OFFSET_DELETE_MESSAGES = {
    ErrorCode.GROUP_ID_NOT_FOUND: "The group id does not exist.",
    ErrorCode.NON_EMPTY_GROUP: "The group is not empty.",
    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC: "The consumer group is actively subscribed to the topic.",
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "This server does not host this topic-partition.",
}

Partition = tuple[str, int]


@dataclass(frozen=True)
class ConsumerGroupsOptions:
    bootstrap_server: str
    action: str  # one of ACTIONS
    groups: tuple[str, ...] = ()
    all_groups: bool = False
    topics: tuple[str, ...] = ()  # T or T:P,P
    all_topics: bool = False
    state: str | None = None  # --state: None absent, "" without a value, else a list of states
    members: bool = False
    scenario: str | None = None  # one of SCENARIOS
    scenario_value: str | None = None  # N, ISO date-time or shift
    execute: bool = False
    timeout_ms: int = 5000
    client_config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ToolError(f"unknown action {self.action!r}: one of --{', --'.join(ACTIONS)}", USAGE)
        check_timeout(self.timeout_ms)
        needs_groups = self.action in ("describe", "reset-offsets", "delete", "delete-offsets")
        if needs_groups and not self.groups and not self.all_groups:
            raise ToolError(f"--{self.action} needs --group G or --all-groups", USAGE)
        if not needs_groups and (self.groups or self.all_groups):
            raise ToolError(f"options --group and --all-groups can't be used with --{self.action}", USAGE)
        if self.groups and self.all_groups:
            raise ToolError("option --group can't be used with --all-groups", USAGE)
        if self.action == "delete-offsets" and (len(self.groups) != 1 or not self.topics):
            raise ToolError("--delete-offsets needs one --group and at least one --topic", USAGE)
        if self.action == "reset-offsets":
            if bool(self.topics) == self.all_topics:
                raise ToolError("--reset-offsets needs one of the scopes --all-topics or --topic", USAGE)
            if self.scenario not in SCENARIOS:
                raise ToolError(f"--reset-offsets needs one of --{', --'.join(SCENARIOS)}", USAGE)
        elif self.topics and self.action != "delete-offsets":
            raise ToolError(f"option --topic can't be used with --{self.action}", USAGE)
        elif self.all_topics or self.scenario or self.execute:
            raise ToolError(f"the reset options can't be used with --{self.action}", USAGE)
        if self.members and (self.action != "describe" or self.state is not None):
            raise ToolError("--members goes with --describe, without --state", USAGE)
        if self.state and self.action != "list":
            raise ToolError("a list of states goes with --list (--describe --state takes none)", USAGE)
        if self.state is not None and self.action not in ("list", "describe"):
            raise ToolError(f"option --state can't be used with --{self.action}", USAGE)


# --- pure parts: arguments and Kafka's tables --------------------------------------------------------------------


def parse_states(text: str) -> set[ConsumerGroupState]:
    """`Stable,empty` -> the states (Kafka's names, any case)."""
    by_name = {name.lower(): state for state, name in STATE_NAMES.items() if state != ConsumerGroupState.UNKNOWN}
    states: set[ConsumerGroupState] = set()
    for part in text.split(","):
        state = by_name.get(part.strip().lower())
        if state is None:
            valid = ", ".join(sorted(STATE_NAMES[s] for s in by_name.values()))
            raise ToolError(f"Invalid state list '{text}'. Valid states are: {valid}", USAGE)
        states.add(state)
    return states


def parse_topic_arg(arg: str) -> tuple[str, list[int] | None]:
    """`t` -> (t, None: every partition); `t:0,2` -> (t, [0, 2])."""
    if ":" not in arg:
        return arg, None
    parts = arg.split(":")
    if len(parts) != 2 or not parts[0]:
        raise ToolError(f"Invalid topic arg '{arg}', expected topic name and partitions", USAGE)
    topic, partitions = parts
    try:
        return topic, [int(p) for p in partitions.split(",")]
    except ValueError:
        raise ToolError(f"Invalid partitions '{partitions}' specified in topic arg '{arg}'", USAGE) from None


def parse_datetime_ms(text: str) -> int:
    """Kafka's `YYYY-MM-DDTHH:mm:SS.sss` with an optional zone (`Z`, `+hh:mm`); without one, local time."""
    try:
        if "T" not in text:
            raise ValueError("no T between date and time")
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ToolError(
            f"--to-datetime {text!r}: expected YYYY-MM-DDTHH:mm:SS.sss with an optional zone ({exc})", USAGE
        ) from None
    return int(moment.timestamp() * 1000)


def _width(values: Iterable[str], least: int = 15) -> int:
    return max([least, *(len(v) for v in values)])


def _row(widths: Sequence[int], values: Sequence[str]) -> str:
    """Kafka's `%-Ns %-Ms ... %s`: each column left-aligned to its width, the last one as it is."""
    cells = [value.ljust(width) for width, value in zip(widths, values[:-1], strict=True)]
    return " ".join([*cells, values[-1]])


@dataclass(frozen=True)
class PartitionRow:
    group: str
    topic: str
    partition: int
    offset: int | None  # committed
    log_end: int | None
    consumer_id: str = MISSING
    host: str = MISSING
    client_id: str = MISSING

    @property
    def lag(self) -> int | None:
        return None if self.offset is None or self.log_end is None else self.log_end - self.offset


def _text(value: int | None) -> str:
    return MISSING if value is None else str(value)


def offsets_table(rows: Sequence[PartitionRow]) -> str:
    """kafka-consumer-groups.sh --describe: a blank line, the header, a line per partition."""
    widths = [
        _width(r.group for r in rows),
        _width(r.topic for r in rows),
        10,
        15,
        15,
        15,
        _width(r.consumer_id for r in rows),
        _width(r.host for r in rows),
    ]
    lines = [_row(widths, _OFFSETS_HEADER)]
    for r in rows:
        values = [r.group, r.topic, str(r.partition), _text(r.offset), _text(r.log_end), _text(r.lag)]
        lines.append(_row(widths, [*values, r.consumer_id, r.host, r.client_id]))
    return "\n" + "\n".join(lines) + "\n"


_OFFSETS_HEADER = (
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
)


@dataclass(frozen=True)
class MemberRow:
    group: str
    consumer_id: str
    group_instance_id: str  # "" for a dynamic member
    host: str
    client_id: str
    partitions: int


def members_table(rows: Sequence[MemberRow]) -> str:
    """--describe --members: the GROUP-INSTANCE-ID column only when a member is static; each line ends with a
    space, as Kafka's format does."""
    static = any(r.group_instance_id for r in rows)
    widths = [_width(r.group for r in rows), _width(r.consumer_id for r in rows)]
    if static:
        widths.append(_width((r.group_instance_id for r in rows), 17))
    widths += [_width(r.host for r in rows), _width(r.client_id for r in rows), 15]
    header = ["GROUP", "CONSUMER-ID", *(["GROUP-INSTANCE-ID"] if static else []), "HOST", "CLIENT-ID", "#PARTITIONS"]
    lines = [_row(widths, [*header, ""])]
    for r in rows:
        instance = [r.group_instance_id] if static else []
        lines.append(_row(widths, [r.group, r.consumer_id, *instance, r.host, r.client_id, str(r.partitions), ""]))
    return "\n" + "\n".join(lines) + "\n"


def state_table(group: str, coordinator: str, strategy: str, state: str, members: int) -> str:
    """--describe --state."""
    widths = [_width([group]), _width([coordinator], 25), 20, 20]
    header = _row(widths, ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"])
    row = _row(widths, [group, coordinator, strategy or MISSING, state, str(members)])
    return f"\n{header}\n{row}\n"


def list_table(groups: Sequence[tuple[str, str]]) -> str:
    """--list --state: GROUP STATE."""
    widths = [_width(g for g, _ in groups)]
    return "".join(_row(widths, [group, state]) + "\n" for group, state in [("GROUP", "STATE"), *groups])


def reset_plan_table(plan: dict[str, dict[Partition, int]]) -> str:
    """--reset-offsets: GROUP TOPIC PARTITION NEW-OFFSET, partitions in order."""
    if not plan:
        return "\n"
    widths = [_width(plan), _width(t for offsets in plan.values() for t, _ in offsets), 10]
    lines = [_row(widths, ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"])]
    for group, offsets in plan.items():
        for (topic, partition), offset in sorted(offsets.items()):
            lines.append(_row(widths, [group, topic, str(partition), str(offset)]))
    return "\n" + "\n".join(lines) + "\n"


def delete_offsets_table(results: dict[Partition, str | None]) -> str:
    """--delete-offsets: TOPIC PARTITION STATUS ("Successful" or "Error: ..."); partition -1 prints "-"."""
    widths = [_width(t for t, _ in results), 10]
    lines = [_row(widths, ["TOPIC", "PARTITION", "STATUS"])]
    for (topic, partition), error in sorted(results.items()):
        status = "Successful" if error is None else f"Error: {error}"
        lines.append(_row(widths, [topic, str(partition) if partition >= 0 else MISSING, status]))
    return "\n" + "\n".join(lines) + "\n"


def clamp(offset: int, start: int, end: int, partition: Partition) -> int:
    """An offset asked for outside [log start, log end] goes to the nearer end, with Kafka's warning."""
    name = f"{partition[0]}-{partition[1]}"
    if offset > end:
        _warn(
            f"New offset ({offset}) is higher than latest offset for topic partition {name}. "
            f"Value will be set to {end}."
        )
        return end
    if offset < start:
        _warn(
            f"New offset ({offset}) is lower than earliest offset for topic partition {name}. "
            f"Value will be set to {start}."
        )
        return start
    return offset


def _warn(message: str) -> None:
    print(f"WARN {message}", file=sys.stderr)


def _problem(message: str) -> None:
    print(f"tidelog consumer-groups: error: {message}", file=sys.stderr)


# --- the brokers -------------------------------------------------------------------------------------------------


class _Groups:
    """The AdminClient calls the actions make, each a ToolError when the cluster does not answer."""

    def __init__(self, options: ConsumerGroupsOptions) -> None:
        self.options = options
        self.errors = ClientErrors()
        config = {**base_config(options.bootstrap_server, self.errors, CLIENT_ID), **options.client_config}
        self.admin = new_client(AdminClient, config)
        self.timeout_s = options.timeout_ms / 1000
        self.metadata = cluster_metadata(self.admin, options.bootstrap_server, options.timeout_ms, self.errors)

    def _result(self, future: Future[Any]) -> Any:
        return future.result(timeout=self.timeout_s + 5)

    def group_ids(self) -> list[str]:
        listed = self._result(self.admin.list_consumer_groups(request_timeout=self.timeout_s))
        return sorted(g.group_id for g in listed.valid)

    def listings(self, states: set[ConsumerGroupState]) -> list[tuple[str, str]]:
        kwargs: dict[str, Any] = {"request_timeout": self.timeout_s}
        if states:
            kwargs["states"] = states
        listed = self._result(self.admin.list_consumer_groups(**kwargs))
        return sorted((g.group_id, STATE_NAMES.get(g.state, "Unknown")) for g in listed.valid)

    def describe(self, groups: Sequence[str]) -> dict[str, ConsumerGroupDescription]:
        futures = self.admin.describe_consumer_groups(list(groups), request_timeout=self.timeout_s)
        return {group: self._result(future) for group, future in futures.items()}

    def committed(self, group: str) -> dict[Partition, int]:
        futures = self.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=self.timeout_s
        )
        answer = self._result(futures[group])
        return {(tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions or [] if tp.offset >= 0}

    def log_offsets(self, partitions: Iterable[Partition], spec: OffsetSpec) -> dict[Partition, int]:
        """ListOffsets for each partition: the offset, or -1 where the broker has none (no record at or after a
        timestamp)."""
        wanted = {TopicPartition(t, p): spec for t, p in partitions}
        if not wanted:
            return {}
        futures = self.admin.list_offsets(wanted, request_timeout=self.timeout_s)
        return {(tp.topic, tp.partition): int(self._result(future).offset) for tp, future in futures.items()}

    def partitions_of(self, topic: str) -> list[int]:
        described = self.metadata.topics.get(topic)
        if described is None or described.error is not None:
            raise ToolError(f"Topic '{topic}' does not exist")
        return sorted(described.partitions)

    def alter(self, group: str, offsets: dict[Partition, int]) -> None:
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        answer = self._result(self.admin.alter_consumer_group_offsets([request], request_timeout=self.timeout_s)[group])
        failed = [f"{tp.topic}-{tp.partition}: {tp.error.str()}" for tp in answer.topic_partitions if tp.error]
        if failed:
            raise ToolError(f"committing the offsets of group '{group}' failed: {'; '.join(failed)}")


def _state(description: ConsumerGroupDescription) -> str:
    return STATE_NAMES.get(cast(ConsumerGroupState, description.state), "Unknown")


# --- the actions -------------------------------------------------------------------------------------------------


@reports_kafka_errors
def consumer_groups(options: ConsumerGroupsOptions) -> int:
    if options.action == "delete-offsets":
        return asyncio.run(_delete_offsets(options))
    groups = _Groups(options)
    if options.action == "list":
        return _list(groups, options)
    names = list(options.groups) or groups.group_ids()
    if not names:  # --all-groups of a cluster without groups
        return 0
    if options.action == "describe":
        return _describe(groups, names, options)
    if options.action == "reset-offsets":
        return _reset(groups, names, options)
    return _delete(groups, names)


def _list(groups: _Groups, options: ConsumerGroupsOptions) -> int:
    if options.state is None:
        for group in groups.group_ids():
            print(group)
    else:
        states = parse_states(options.state) if options.state else set()
        print(list_table(groups.listings(states)), end="")
    return 0


def _describe(groups: _Groups, names: list[str], options: ConsumerGroupsOptions) -> int:
    status = 0
    for group, description in sorted(groups.describe(names).items()):
        state = _state(description)
        if options.state is not None:
            coordinator = description.coordinator
            where = f"{coordinator.host}:{coordinator.port}  ({coordinator.id})"
            if state == "Dead":
                _problem(f"Consumer group '{group}' does not exist.")
                status = 1
                continue
            count = len(description.members)
            print(state_table(group, where, description.partition_assignor, state, count), end="")
            continue
        if options.members:
            members = [
                MemberRow(
                    group,
                    m.member_id,
                    m.group_instance_id or "",
                    m.host,
                    m.client_id,
                    len(m.assignment.topic_partitions),
                )
                for m in description.members
            ]
            table = members_table(members) if _printable(group, state, len(members)) else None
        else:
            rows = _partition_rows(groups, group, description)
            table = offsets_table(rows) if _printable(group, state, len(rows)) else None
        if table is not None:
            print(table, end="")
        elif state == "Dead":
            status = 1
    return status


def _printable(group: str, state: str, rows: int) -> bool:
    """Kafka's shouldPrintMemberState: what a group without rows, or a changing group, gets said about it."""
    if state == "Dead":
        _problem(f"Consumer group '{group}' does not exist.")
        return False
    if state == "Empty":
        print(f"\nConsumer group '{group}' has no active members.", file=sys.stderr)
    elif state in ("PreparingRebalance", "CompletingRebalance"):
        print(f"\nWarning: Consumer group '{group}' is rebalancing.", file=sys.stderr)
    return rows > 0


def _partition_rows(groups: _Groups, group: str, description: ConsumerGroupDescription) -> list[PartitionRow]:
    committed = groups.committed(group)
    owners: list[tuple[Any, list[Partition]]] = []
    for member in sorted(description.members, key=lambda m: -len(m.assignment.topic_partitions)):
        held = sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions)
        if held:
            owners.append((member, held))
    assigned = {p for _, held in owners for p in held}
    unassigned = sorted(set(committed) - assigned)
    ends = groups.log_offsets([*assigned, *unassigned], OffsetSpec.latest())
    rows = [
        PartitionRow(group, t, p, committed.get((t, p)), ends.get((t, p)), m.member_id, m.host, m.client_id)
        for m, held in owners
        for t, p in held
    ]
    rows += [PartitionRow(group, t, p, committed[(t, p)], ends.get((t, p))) for t, p in unassigned]
    return rows


def _reset(groups: _Groups, names: list[str], options: ConsumerGroupsOptions) -> int:
    status = 0
    plan: dict[str, dict[Partition, int]] = {}
    for group, description in sorted(groups.describe(names).items()):
        state = _state(description)
        if state not in INACTIVE:
            _problem(
                f"Assignments can only be reset if the group '{group}' is inactive, but the current state is {state}."
            )
            status = 1
            continue
        plan[group] = _plan(groups, group, options)
    if options.execute:
        for group, offsets in plan.items():
            if offsets:
                groups.alter(group, offsets)
    print(reset_plan_table(plan), end="")
    return status


def _scope(groups: _Groups, group: str, options: ConsumerGroupsOptions) -> list[Partition]:
    if options.all_topics:
        return sorted(groups.committed(group))
    partitions: list[Partition] = []
    for arg in options.topics:
        topic, numbers = parse_topic_arg(arg)
        existing = groups.partitions_of(topic)
        missing = [p for p in numbers or [] if p not in existing]
        if missing:
            raise ToolError(f'The partitions "{",".join(f"{topic}-{p}" for p in missing)}" do not exist')
        partitions += [(topic, p) for p in (numbers if numbers is not None else existing)]
    return list(dict.fromkeys(partitions))


def _plan(groups: _Groups, group: str, options: ConsumerGroupsOptions) -> dict[Partition, int]:
    partitions = _scope(groups, group, options)
    value = options.scenario_value or ""
    if options.scenario == "to-earliest":
        return groups.log_offsets(partitions, OffsetSpec.earliest())
    if options.scenario == "to-latest":
        return groups.log_offsets(partitions, OffsetSpec.latest())
    if options.scenario == "to-datetime":
        found = groups.log_offsets(partitions, OffsetSpec.for_timestamp(parse_datetime_ms(value)))
        empty = [p for p, offset in found.items() if offset < 0]
        for topic, partition in empty:
            print(f"\nWarn: Partition {partition} from topic {topic} is empty. Falling back to latest known offset.")
        return {**found, **groups.log_offsets(empty, OffsetSpec.latest())}
    number = _integer(value, f"--{options.scenario}")
    if options.scenario == "to-offset":
        wanted = dict.fromkeys(partitions, number)
    else:
        committed = groups.committed(group)
        for topic, partition in partitions:
            if (topic, partition) not in committed:
                raise ToolError(
                    f"Cannot shift offset for partition {topic}-{partition} since there is no current committed offset"
                )
        wanted = {p: committed[p] + number for p in partitions}
    starts = groups.log_offsets(partitions, OffsetSpec.earliest())
    ends = groups.log_offsets(partitions, OffsetSpec.latest())
    return {p: clamp(offset, starts[p], ends[p], p) for p, offset in wanted.items()}


def _integer(text: str, option: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ToolError(f"{option} needs an integer: {text!r}", USAGE) from None


def _delete(groups: _Groups, names: list[str]) -> int:
    futures = groups.admin.delete_consumer_groups(names, request_timeout=groups.timeout_s)
    deleted, failed = [], {}
    for group, future in futures.items():
        try:
            future.result(timeout=groups.timeout_s + 5)
            deleted.append(group)
        except KafkaException as exc:
            failed[group] = error_message(exc)
    quoted = ", ".join(f"'{g}'" for g in sorted(deleted))
    if not failed:
        print(f"Deletion of requested consumer groups ({quoted}) was successful.")
        return 0
    _problem("Deletion of some consumer groups failed:")
    for group, reason in sorted(failed.items()):
        print(f"* Group '{group}' could not be deleted due to: {reason}")
    if deleted:
        print(f"\nThese consumer groups were deleted successfully: {quoted}")
    return 1


async def _delete_offsets(options: ConsumerGroupsOptions) -> int:
    (group,) = options.groups
    admin = WireAdmin(options.bootstrap_server, CLIENT_ID)
    try:
        results: dict[Partition, str | None] = {}
        wanted: dict[str, list[int]] = {}
        named = [parse_topic_arg(arg) for arg in options.topics]
        metadata = await admin.metadata(sorted({t for t, ps in named if ps is None}))
        existing = {t.name: sorted(int(p.partition_index) for p in t.partitions) for t in metadata.topics}
        for topic, numbers in named:
            if numbers is None and not existing.get(topic):
                results[(topic, -1)] = _OFFSET_DELETE_MESSAGES[ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
                continue
            wanted.setdefault(topic, []).extend(numbers if numbers is not None else existing[topic])
        body = {
            "group_id": group,
            "topics": [
                {"name": t, "partitions": [{"partition_index": p} for p in dict.fromkeys(ps)]}
                for t, ps in wanted.items()
            ],
        }
        answer = await admin.request_coordinator(group, ApiKey.OFFSET_DELETE, OFFSET_DELETE_VERSION, body)
    finally:
        await admin.close()
    top = int(answer.error_code)
    answered = {
        (topic.name, int(partition.partition_index)): _offset_delete_error(top or int(partition.error_code))
        for topic in answer.topics
        for partition in topic.partitions
    }
    if top != ErrorCode.NONE:
        answered.update({(t, p): _offset_delete_error(top) for t, ps in wanted.items() for p in ps})
    results.update(answered)
    if top != ErrorCode.NONE:
        _problem(_offset_delete_error(top) or "")
    elif any(error is not None for error in answered.values()):
        _problem("Encountered some partition-level error, see the follow-up details.")
    else:
        print(f"Request succeeded for deleting offsets from group {group}.")
    print(delete_offsets_table(results), end="")
    return 0 if all(error is None for error in results.values()) else 1


def _offset_delete_error(code: int) -> str | None:
    if code == ErrorCode.NONE:
        return None
    return _OFFSET_DELETE_MESSAGES.get(ErrorCode(code)) if code in _OFFSET_DELETE_MESSAGES else error_text(code)
