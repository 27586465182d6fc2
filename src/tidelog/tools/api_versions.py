"""docs/compatibility.md: every API key the broker serves, its versions beside Apache Kafka 3.9's.

tidelog's versions come from the broker's own handler table: each area's `handlers()` (the same calls
broker/broker.py makes to build the table; they only name bound methods, so no broker is built here) plus
ApiVersions, which the server answers itself. ControlledShutdown, ElectLeaders and the partition reassignments are
served by a broker of a cluster only. Kafka 3.9's ranges are the "validVersions" of its
clients/src/main/resources/common/message/*Request.json at the 3.9 tag (versions marked unstable left out),
written in `KAFKA_3_9` below.

    python -m tidelog.tools.api_versions [--output docs/compatibility.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tidelog.broker.authorizer import AclApis
from tidelog.broker.cluster_describe import DescribeClusterApis
from tidelog.broker.config_admin import ConfigApis
from tidelog.broker.consumer_groups import ConsumerGroupCoordinator
from tidelog.broker.fetch import FetchApis
from tidelog.broker.groups import GroupCoordinator
from tidelog.broker.leadership import LeadershipApis
from tidelog.broker.log_dirs import LogDirApis
from tidelog.broker.produce import ProduceApis
from tidelog.broker.producer_admin import ProducerApis
from tidelog.broker.quota_admin import QuotaApis
from tidelog.broker.reassignment import ReassignmentApis
from tidelog.broker.sasl import SaslApis
from tidelog.broker.scram_admin import ScramCredentialApis
from tidelog.broker.server import API_VERSIONS_MAX_VERSION
from tidelog.broker.topics import TopicApis
from tidelog.broker.transaction_coordinator import TransactionCoordinator
from tidelog.broker.txn_markers import TxnMarkerApis
from tidelog.protocol.messages import ApiKey

AREAS: tuple[type, ...] = (
    FetchApis,
    ProduceApis,
    TopicApis,
    ConfigApis,
    QuotaApis,
    ScramCredentialApis,
    LogDirApis,
    ProducerApis,
    DescribeClusterApis,
    GroupCoordinator,
    ConsumerGroupCoordinator,
    SaslApis,
    AclApis,
    LeadershipApis,
    ReassignmentApis,
    TransactionCoordinator,
    TxnMarkerApis,
)
HEADING = "## API versions"

CLUSTER_ONLY = frozenset(
    {
        ApiKey.CONTROLLED_SHUTDOWN,
        ApiKey.ELECT_LEADERS,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        ApiKey.LIST_PARTITION_REASSIGNMENTS,
    }
)

KAFKA_3_9: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (0, 11),
    ApiKey.FETCH: (0, 17),
    ApiKey.LIST_OFFSETS: (0, 9),
    ApiKey.METADATA: (0, 12),
    ApiKey.CONTROLLED_SHUTDOWN: (0, 3),
    ApiKey.OFFSET_COMMIT: (0, 9),
    ApiKey.OFFSET_FETCH: (0, 9),
    ApiKey.FIND_COORDINATOR: (0, 5),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (0, 7),
    ApiKey.DELETE_TOPICS: (0, 6),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 4),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 4),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 4),
    ApiKey.WRITE_TXN_MARKERS: (0, 1),
    ApiKey.TXN_OFFSET_COMMIT: (0, 4),
    ApiKey.DESCRIBE_ACLS: (0, 3),
    ApiKey.CREATE_ACLS: (0, 3),
    ApiKey.DELETE_ACLS: (0, 3),
    ApiKey.DESCRIBE_CONFIGS: (0, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.DESCRIBE_LOG_DIRS: (0, 4),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.ELECT_LEADERS: (0, 2),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 0),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 0),
}

# Why a row stops short of Kafka 3.9 (kept beside the table so the page says it where it matters).
SHORT_BECAUSE: dict[int, str] = {
    ApiKey.CONTROLLED_SHUTDOWN: "v0 has a request header without a client id; brokers of 2.2 and later send v1+",
    ApiKey.SASL_HANDSHAKE: "v0 is followed by raw SASL tokens outside Kafka requests; not offered",
    ApiKey.WRITE_TXN_MARKERS: "inter-broker only; v0 (not flexible) is not offered: Kafka 3.x brokers send v1",
}


# The versions served beyond Kafka 3.9, and why: each one a later Kafka's, which a client in use needs.
BEYOND_BECAUSE: dict[int, str] = {
    ApiKey.CONSUMER_GROUP_HEARTBEAT: "v1 is Kafka 4.0's (the client's own member id, KIP-1082; regular expression "
    "subscriptions), the version librdkafka 2.16 requires for `group.protocol=consumer`",
    ApiKey.CONSUMER_GROUP_DESCRIBE: "v1 is Kafka 4.0's (each member's type), served beside the heartbeat's v1",
}


def served() -> dict[int, tuple[int, int]]:
    """Each API key a broker serves (a broker of a cluster: every area) and its (min, max) version."""
    table = {int(ApiKey.API_VERSIONS): (0, API_VERSIONS_MAX_VERSION)}
    for area in AREAS:
        handlers = area.handlers(object.__new__(area))  # type: ignore[attr-defined]
        table.update({int(key): (h.min_version, h.max_version) for key, h in handlers.items()})
    return dict(sorted(table.items()))


def render() -> str:
    lines = [
        HEADING,
        "",
        "Generated by `python -m tidelog.tools.api_versions --output docs/compatibility.md` (`make docs-compat`) from",
        "the broker's handler table (src/tidelog/tools/api_versions.py), which rewrites only this section;",
        "tests/unit/test_compatibility_doc.py checks it is current.",
        "",
        "Every API key tidelog serves, the versions it accepts (what ApiVersions advertises) and Apache Kafka 3.9's.",
        "A request of another version is answered as Kafka answers it: ApiVersions with its v0 response,",
        "UNSUPPORTED_VERSION and this table; any other request closes its connection, and the broker logs the client",
        "(client id, address, API, version) once per client id, API and version.",
        "",
        "The versions Kafka 4 dropped (KIP-896) are served from src/tidelog/protocol/legacy_schemas.py. Produce v0-v2",
        "carry magic 0/1 message sets, up-converted to one v2 batch on append; Fetch v0-v3 get the stored batches",
        "down-converted to magic 0 (v0-v1) or magic 1 (v2-v3) message sets, unless the topic sets",
        "`message.downconversion.enable=false` (then UNSUPPORTED_VERSION per partition, as Kafka answers).",
        "OffsetFetch v0 and OffsetCommit v0 (ZooKeeper-stored offsets in Kafka) use the same offset store as the",
        "later versions. ListOffsets v0 answers one offset in its list (Kafka lists segment base offsets older than",
        "the timestamp; for the latest and earliest targets old clients send, both answer the same).",
        "",
        "Fetch v13-v17 name topics by topic id (KIP-516; an id naming no topic is answered UNKNOWN_TOPIC_ID), carry",
        "a follower's id in `replica_state` (v15) and, refused for want of leadership, the current leader and its",
        "endpoint (v16, KIP-951). Incremental fetch sessions (v7+, KIP-227) are kept as Kafka keeps them",
        "(`max.incremental.fetch.session.cache.slots`; followers use them); a request with session epoch -1, what",
        "librdkafka sends, gets a full answer without one. ListOffsets v9's LATEST_TIERED_TIMESTAMP (-5) answers",
        "offset -1, as Kafka does without tiered storage.",
        "",
        "| key | API | tidelog | Kafka 3.9 | note |",
        "|---:|---|---|---|---|",
    ]
    for key, (low, high) in served().items():
        kafka = KAFKA_3_9.get(key)
        notes = []
        if key in CLUSTER_ONLY:
            notes.append("a broker of a cluster only")
        if kafka != (low, high) and key in SHORT_BECAUSE:
            notes.append(SHORT_BECAUSE[key])
        if kafka is not None and high > kafka[1] and key in BEYOND_BECAUSE:
            notes.append(BEYOND_BECAUSE[key])
        lines.append(
            f"| {key} | {ApiKey(key).name.title().replace('_', '')} | {_range(low, high)} | "
            f"{_range(*kafka) if kafka else '-'} | {'; '.join(notes)} |"
        )
    return "\n".join(lines) + "\n"


def splice(doc: str, section: str) -> str:
    """`doc` with its "## API versions" section (up to the next "## " heading) replaced by `section`; inserted
    after the page's title when it has none."""
    lines = doc.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == HEADING), None)
    if start is None:
        title = 1 if lines and lines[0].startswith("# ") else 0
        head = "".join(lines[:title]) or "# Compatibility\n"
        rest = "".join(lines[title:]).lstrip("\n")
        return head + "\n" + section + ("\n" + rest if rest else "")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + tail if tail else "")


def section_of(doc: str) -> str:
    """The "## API versions" section of `doc` as `render` writes it ("" when it has none)."""
    lines = doc.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == HEADING), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "".join(lines[start:end]).rstrip("\n") + "\n"


def _range(low: int, high: int) -> str:
    return f"{low}" if low == high else f"{low}-{high}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tidelog.tools.api_versions",
        description="The API versions section of docs/compatibility.md: what tidelog serves beside Kafka 3.9.",
    )
    parser.add_argument(
        "--output", "-o", metavar="FILE", help="replace the section in this page (default: print the section)"
    )
    args = parser.parse_args(argv)
    section = render()
    if args.output:
        path = Path(args.output)
        existing = path.read_text(encoding="utf-8") if path.exists() else ""
        path.write_text(splice(existing, section), encoding="utf-8")
    else:
        sys.stdout.write(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
