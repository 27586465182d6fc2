"""`tidelog reassign`: move partition replicas between brokers, as kafka-reassign-partitions.sh does.

It speaks the Kafka protocol to any broker of `--bootstrap-server` (the first that answers) with the brokers' own
client (protocol/client.py): librdkafka's AdminClient has no partition-reassignment calls. The brokers do the rest
(AlterPartitionReassignments, broker/reassignment.py; docs/cluster.md, "Moving replicas").

    --generate --topics-to-move-json-file F --broker-list 1,2,3
        F is {"version":1,"topics":[{"topic":"t"},...]}; prints the current assignment of those topics and a
        proposed one over the listed brokers (the same replication factor and partition count, placed as a new
        topic's replicas are placed: broker/replica_assignment.py, rack-aware when every listed broker has a rack).
        Nothing changes.
    --execute --reassignment-json-file F
        F is {"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3]},...]} ("log_dirs" may be
        given, all "any"); prints the current assignment of those partitions (keep it to roll back) and starts the
        reassignments.
    --verify --reassignment-json-file F
        for each partition of F: completed, still in progress, or no reassignment with another replica set.
    --cancel --reassignment-json-file F
        cancels the ongoing reassignments of F's partitions (their replicas go back to what they were).

The JSON printed is Kafka's (compact, with "log_dirs" of "any"). A broker's per-partition errors are printed and make
the exit code 1; every failure is a ToolError: one line on stderr, exit code 1 (2 for bad usage).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidelog.broker.replica_assignment import BrokerPlacement, assign_replicas
from tidelog.errors import ErrorCode, TidelogError, ToolError
from tidelog.protocol.messages import ApiKey
from tidelog.tools.wire_admin import WireAdmin, error_text

USAGE = 2
REASSIGNMENT_VERSION = 0
ALTER_TIMEOUT_MS = 30_000
CLIENT_ID = "tidelog-reassign"
ACTIONS = ("generate", "execute", "verify", "cancel")

TopicPartition = tuple[str, int]
Assignment = dict[TopicPartition, tuple[int, ...]]


@dataclass(frozen=True)
class ReassignOptions:
    bootstrap_server: str
    action: str  # one of ACTIONS
    reassignment_json_file: str | None = None
    topics_to_move_json_file: str | None = None
    broker_list: str | None = None
    timeout_ms: int = ALTER_TIMEOUT_MS

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ToolError(f"unknown action {self.action!r}: one of --{', --'.join(ACTIONS)}", USAGE)
        if self.action == "generate":
            if not self.topics_to_move_json_file or not self.broker_list:
                raise ToolError("--generate needs --topics-to-move-json-file and --broker-list", USAGE)
            if self.reassignment_json_file:
                raise ToolError("option --reassignment-json-file can't be used with --generate", USAGE)
        else:
            if not self.reassignment_json_file:
                raise ToolError(f"--{self.action} needs --reassignment-json-file", USAGE)
            if self.topics_to_move_json_file or self.broker_list:
                raise ToolError(
                    f"options --topics-to-move-json-file and --broker-list can't be used with --{self.action}", USAGE
                )


# --- the JSON files (pure) ---------------------------------------------------------------------------------------


def _load_json(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ToolError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ToolError(f"{what} {path} is not JSON: {exc}") from None


def parse_reassignment(document: Any) -> Assignment:
    """Kafka's reassignment JSON: partition -> target replicas, in the file's order. Raises ToolError."""
    if (
        not isinstance(document, dict)
        or document.get("version") != 1
        or not isinstance(document.get("partitions"), list)
    ):
        raise ToolError('the reassignment JSON must be {"version":1,"partitions":[...]}')
    result: Assignment = {}
    for entry in document["partitions"]:
        if not isinstance(entry, dict):
            raise ToolError(f"not a partition entry: {entry!r}")
        topic, partition, replicas = entry.get("topic"), entry.get("partition"), entry.get("replicas")
        if not isinstance(topic, str) or not isinstance(partition, int) or isinstance(partition, bool):
            raise ToolError(f"a partition entry needs a topic (string) and a partition (integer): {entry!r}")
        if not isinstance(replicas, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in replicas):
            raise ToolError(f"{topic}-{partition}: replicas must be a list of broker ids: {replicas!r}")
        log_dirs = entry.get("log_dirs")
        if log_dirs is not None and (not isinstance(log_dirs, list) or any(d != "any" for d in log_dirs)):
            raise ToolError(f'{topic}-{partition}: log_dirs other than "any" are not supported: {log_dirs!r}')
        if (topic, partition) in result:
            raise ToolError(f"Duplicate partition in the reassignment JSON: {topic}-{partition}")
        result[(topic, partition)] = tuple(replicas)
    if not result:
        raise ToolError("the reassignment JSON names no partition")
    return result


def parse_topics_to_move(document: Any) -> list[str]:
    if not isinstance(document, dict) or not isinstance(document.get("topics"), list):
        raise ToolError('the topics-to-move JSON must be {"version":1,"topics":[{"topic":"t"},...]}')
    topics = [entry.get("topic") if isinstance(entry, dict) else None for entry in document["topics"]]
    if not topics or not all(isinstance(t, str) and t for t in topics):
        raise ToolError(f"the topics-to-move JSON names no topics, or a topic that is not a string: {topics!r}")
    return list(dict.fromkeys(str(t) for t in topics))


def parse_broker_list(text: str) -> list[int]:
    try:
        brokers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ToolError(f"--broker-list must be broker ids separated by commas: {text!r}", USAGE) from None
    if not brokers or len(set(brokers)) != len(brokers):
        raise ToolError(f"--broker-list must name distinct brokers: {text!r}", USAGE)
    return brokers


def render_assignment(assignment: Mapping[TopicPartition, Sequence[int]]) -> str:
    """Kafka's reassignment JSON, compact, partitions in (topic, partition) order."""
    partitions = [
        {"topic": topic, "partition": partition, "replicas": list(replicas), "log_dirs": ["any"] * len(replicas)}
        for (topic, partition), replicas in sorted(assignment.items())
    ]
    return json.dumps({"version": 1, "partitions": partitions}, separators=(",", ":"))


def _names(partitions: Sequence[TopicPartition]) -> str:
    return ",".join(f"{topic}-{partition}" for topic, partition in sorted(partitions))


# --- the broker --------------------------------------------------------------------------------------------------


class _Cluster(WireAdmin):
    """One connection to the first broker of the bootstrap list that answers (tools/wire_admin.py)."""

    def __init__(self, bootstrap_server: str) -> None:
        super().__init__(bootstrap_server, CLIENT_ID)

    async def placement(self, topics: Sequence[str]) -> tuple[Assignment, dict[int, str | None]]:
        """The replicas of every partition of `topics` (ToolError for a topic the cluster does not have), and the
        brokers with their racks."""
        answer = await self.metadata(list(topics))
        assignment: Assignment = {}
        for topic in answer.topics:
            if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise ToolError(f"Topic '{topic.name}' does not exist")
            for partition in topic.partitions:
                assignment[(topic.name, int(partition.partition_index))] = tuple(
                    int(r) for r in partition.replica_nodes
                )
        return assignment, {int(b.node_id): b.rack for b in answer.brokers}

    async def alter(
        self, targets: Mapping[TopicPartition, Sequence[int] | None], timeout_ms: int
    ) -> dict[TopicPartition, str]:
        """Start (or with None cancel) each reassignment; the partitions the broker refused, with its reasons."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), replicas in targets.items():
            topics.setdefault(topic, []).append(
                {"partition_index": partition, "replicas": None if replicas is None else list(replicas)}
            )
        body = {"timeout": timeout_ms, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
        answer = await self.request(ApiKey.ALTER_PARTITION_REASSIGNMENTS, REASSIGNMENT_VERSION, body)
        if answer.error_code != ErrorCode.NONE:
            raise ToolError(
                f"the brokers refused the request: {error_text(int(answer.error_code), answer.error_message)}"
            )
        return {
            (topic.name, int(result.partition_index)): error_text(int(result.error_code), result.error_message)
            for topic in answer.responses
            for result in topic.partitions
            if result.error_code != ErrorCode.NONE
        }

    async def ongoing(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, tuple[tuple[int, ...], ...]]:
        """The partitions of `partitions` being reassigned: (replicas, adding, removing)."""
        topics: dict[str, list[int]] = {}
        for topic, partition in partitions:
            topics.setdefault(topic, []).append(partition)
        body = {
            "timeout": ALTER_TIMEOUT_MS,
            "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()],
        }
        answer = await self.request(ApiKey.LIST_PARTITION_REASSIGNMENTS, REASSIGNMENT_VERSION, body)
        if answer.error_code != ErrorCode.NONE:
            raise ToolError(
                f"the brokers refused the request: {error_text(int(answer.error_code), answer.error_message)}"
            )
        return {
            (topic.name, int(p.partition_index)): (
                tuple(int(r) for r in p.replicas),
                tuple(int(r) for r in p.adding_replicas),
                tuple(int(r) for r in p.removing_replicas),
            )
            for topic in answer.topics
            for p in topic.partitions
        }


# --- the actions -------------------------------------------------------------------------------------------------


def reassign(options: ReassignOptions) -> int:
    try:
        return asyncio.run(_run(options))
    except TidelogError as exc:
        if isinstance(exc, ToolError):
            raise
        raise ToolError(str(exc)) from None


async def _run(options: ReassignOptions) -> int:
    cluster = _Cluster(options.bootstrap_server)
    try:
        if options.action == "generate":
            return await _generate(cluster, options)
        assert options.reassignment_json_file is not None
        targets = parse_reassignment(_load_json(options.reassignment_json_file, "--reassignment-json-file"))
        if options.action == "execute":
            return await _execute(cluster, targets, options.timeout_ms)
        if options.action == "verify":
            return await _verify(cluster, targets)
        return await _cancel(cluster, targets, options.timeout_ms)
    finally:
        await cluster.close()


async def _current(cluster: _Cluster, partitions: Sequence[TopicPartition]) -> Assignment:
    assignment, _brokers = await cluster.placement(sorted({topic for topic, _ in partitions}))
    for topic, partition in partitions:
        if (topic, partition) not in assignment:
            raise ToolError(f"Partition {topic}-{partition} does not exist")
    return {tp: assignment[tp] for tp in partitions}


async def _generate(cluster: _Cluster, options: ReassignOptions) -> int:
    assert options.topics_to_move_json_file is not None and options.broker_list is not None
    topics = parse_topics_to_move(_load_json(options.topics_to_move_json_file, "--topics-to-move-json-file"))
    broker_ids = parse_broker_list(options.broker_list)
    current, racks = await cluster.placement(topics)
    unknown = [b for b in broker_ids if b not in racks]
    if unknown:
        raise ToolError(f"--broker-list names brokers the cluster does not have: {unknown}")
    brokers = [BrokerPlacement(b, racks[b]) for b in broker_ids]
    proposed: Assignment = {}
    rng = random.Random()
    for topic in topics:
        partitions = sorted(p for t, p in current if t == topic)
        factor = len(current[(topic, partitions[0])])
        placed = assign_replicas(brokers, len(partitions), factor, rng=rng)
        proposed.update({(topic, p): replicas for p, replicas in placed.items()})
    print(f"Current partition replica assignment\n{render_assignment(current)}\n")
    print(f"Proposed partition reassignment configuration\n{render_assignment(proposed)}")
    return 0


async def _execute(cluster: _Cluster, targets: Assignment, timeout_ms: int) -> int:
    current = await _current(cluster, list(targets))
    print(f"Current partition replica assignment\n\n{render_assignment(current)}\n")
    print("Save this to use as the --reassignment-json-file option during rollback")
    failed = await cluster.alter(dict(targets), timeout_ms)
    started = [tp for tp in targets if tp not in failed]
    if started:
        print(f"Successfully started partition reassignments for {_names(started)}")
    if failed:
        print("Error reassigning partition(s):")
        for (topic, partition), reason in sorted(failed.items()):
            print(f"{topic}-{partition}: {reason}")
        return 1
    return 0


async def _verify(cluster: _Cluster, targets: Assignment) -> int:
    ongoing = await cluster.ongoing(list(targets))
    current = await _current(cluster, list(targets))
    print("Status of partition reassignment:")
    for (topic, partition), target in targets.items():
        key = (topic, partition)
        if key in ongoing:
            print(f"Reassignment of partition {topic}-{partition} is still in progress.")
        elif current[key] == target:
            print(f"Reassignment of partition {topic}-{partition} is completed.")
        else:
            print(
                f"There is no active reassignment of partition {topic}-{partition}, but replica set is "
                f"{','.join(map(str, current[key]))} rather than {','.join(map(str, target))}."
            )
    return 0


async def _cancel(cluster: _Cluster, targets: Assignment, timeout_ms: int) -> int:
    failed = await cluster.alter(dict.fromkeys(targets), timeout_ms)
    cancelled = [tp for tp in targets if tp not in failed]
    if cancelled:
        print(f"Successfully cancelled partition reassignments for: {_names(cancelled)}")
    if failed:
        print("Error cancelling partition reassignment(s):")
        for (topic, partition), reason in sorted(failed.items()):
            print(f"{topic}-{partition}: {reason}")
        return 1
    return 0
