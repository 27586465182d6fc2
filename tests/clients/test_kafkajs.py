"""KafkaJS 2.2.4 (Node) against a real `tidelog serve`: admin, producer, consumer groups and bad input.

One broker and one long-lived `node tests/clients/js/driver.js` for the module (tests/clients/client_driver.py
speaks to it); KafkaJS and its codec packages come from tests/clients/js/package-lock.json (`make client-deps`
runs `npm ci` there). Every test is one cell of the client matrix in docs/compatibility.md (its `matrix` mark).
Producer tests read back through one group member subscribed to all their topics, so the module joins a group
a handful of times only.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from client_driver import ClientDriver, ClientError
from stored import stored_batches, stored_codecs

from broker_process import BrokerProcess
from tidelog.partitioner import partition_for_key

CLIENT = "KafkaJS 2.2.4"
JS = Path(__file__).resolve().parent / "js"
CODECS = ["gzip", "snappy", "lz4", "zstd"]
PRODUCE_TOPICS = ["js-keys", "js-headers", "js-idempotent", *(f"js-codec-{codec}" for codec in CODECS)]
TOPIC_RESOURCE = 2  # KafkaJS's ConfigResourceTypes.TOPIC


@pytest.fixture(scope="module")
def js(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientDriver]:
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "kafkajs").is_dir():
        pytest.fail("Node or KafkaJS is missing: `make client-deps` installs them (tests/clients/js/node_modules)")
    driver = ClientDriver([node, str(JS / "driver.js"), broker.bootstrap], tmp_path_factory.mktemp("kafkajs") / "err")
    try:
        yield driver
    finally:
        driver.close()


def admin(js: ClientDriver, method: str, *args: Any) -> Any:
    return js.call("admin", method=method, args=list(args))


def create_topic(js: ClientDriver, topic: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    entries = [{"name": k, "value": v} for k, v in (configs or {}).items()]
    spec = {"topic": topic, "numPartitions": partitions, "configEntries": entries}
    assert admin(js, "createTopics", {"topics": [spec]}) is True


def offsets(js: ClientDriver, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (low, high) watermarks."""
    return {p["partition"]: (int(p["low"]), int(p["high"])) for p in admin(js, "fetchTopicOffsets", topic)}


def delete_records(js: ClientDriver, topic: str, partition: int, offset: int) -> None:
    # KafkaJS looks the leader up in the admin client's cached metadata only: load the topic's first
    admin(js, "fetchTopicMetadata", {"topics": [topic]})
    admin(js, "deleteTopicRecords", {"topic": topic, "partitions": [{"partition": partition, "offset": str(offset)}]})


def topic_configs(js: ClientDriver, topic: str, names: list[str]) -> dict[str, str]:
    resources = [{"type": TOPIC_RESOURCE, "name": topic, "configNames": names}]
    (resource,) = admin(js, "describeConfigs", {"resources": resources, "includeSynonyms": False})["resources"]
    assert resource["errorCode"] == 0, resource
    return {entry["configName"]: entry["configValue"] for entry in resource["configEntries"]}


def messages(tag: str, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"key": f"{tag}-k{i % 7}", "value": f"{tag}|{i}|" + "compressible " * 20, **extra} for i in range(n)]


def wait_for(check: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


def assignment_size(state: dict[str, Any]) -> int:
    return sum(len(partitions) for partitions in state["assignment"].values())


# --- admin ---------------------------------------------------------------------------------------------------


@pytest.mark.matrix("admin: create topics with configs")
def test_create_topics_with_configs(js: ClientDriver) -> None:
    configs = {
        "cleanup.policy": "compact",
        "retention.ms": "3600000",
        "max.message.bytes": "65536",
        "compression.type": "lz4",
    }
    create_topic(js, "js-created", partitions=3, configs=configs)
    assert topic_configs(js, "js-created", list(configs)) == configs
    assert "js-created" in admin(js, "listTopics")
    # KafkaJS answers false for a topic that exists (it reads TOPIC_ALREADY_EXISTS so)
    assert admin(js, "createTopics", {"topics": [{"topic": "js-created"}]}) is False


@pytest.mark.matrix("admin: describe topics and configs")
def test_describe_topics_and_configs(js: ClientDriver, broker: BrokerProcess) -> None:
    create_topic(js, "js-described", partitions=2, configs={"retention.ms": "7200000"})
    (topic,) = admin(js, "fetchTopicMetadata", {"topics": ["js-described"]})["topics"]
    assert sorted(p["partitionId"] for p in topic["partitions"]) == [0, 1]
    assert all(p["partitionErrorCode"] == 0 and p["leader"] >= 0 for p in topic["partitions"])
    resources = [{"type": TOPIC_RESOURCE, "name": "js-described"}]
    (resource,) = admin(js, "describeConfigs", {"resources": resources, "includeSynonyms": False})["resources"]
    entries = {e["configName"]: e for e in resource["configEntries"]}
    assert entries["retention.ms"]["configValue"] == "7200000" and not entries["retention.ms"]["isDefault"]
    assert entries["cleanup.policy"]["configValue"] == "delete" and entries["cleanup.policy"]["isDefault"]
    cluster = admin(js, "describeCluster")
    assert [(b["host"], b["port"]) for b in cluster["brokers"]] == [("127.0.0.1", broker.port)]


def alter_configs(js: ClientDriver, topic: str, configs: dict[str, str], validate_only: bool = False) -> Any:
    entries = [{"name": k, "value": v} for k, v in configs.items()]
    resources = [{"type": TOPIC_RESOURCE, "name": topic, "configEntries": entries}]
    return admin(js, "alterConfigs", {"resources": resources, "validateOnly": validate_only})


@pytest.mark.matrix("admin: alter configs")
def test_alter_configs(js: ClientDriver) -> None:
    create_topic(js, "js-altered", configs={"retention.ms": "3600000", "cleanup.policy": "compact"})
    names = ["retention.ms", "cleanup.policy", "compression.type"]
    answer = alter_configs(js, "js-altered", {"retention.ms": "1000"}, validate_only=True)
    assert answer["resources"] == [
        {"errorCode": 0, "errorMessage": None, "resourceType": TOPIC_RESOURCE, "resourceName": "js-altered"}
    ]
    assert topic_configs(js, "js-altered", names)["retention.ms"] == "3600000"  # validate_only changed nothing
    # AlterConfigs sets the whole set: cleanup.policy, left out, is back to its default
    alter_configs(js, "js-altered", {"retention.ms": "7200000", "compression.type": "gzip"})
    assert topic_configs(js, "js-altered", names) == {
        "retention.ms": "7200000",
        "cleanup.policy": "delete",
        "compression.type": "gzip",
    }
    error = js.error_of(
        "admin",
        method="alterConfigs",
        args=[
            {
                "resources": [
                    {
                        "type": TOPIC_RESOURCE,
                        "name": "js-altered",
                        "configEntries": [{"name": "retention.ms", "value": "soon"}],
                    }
                ]
            }
        ],
    )
    assert "INVALID_CONFIG" in error.text or "Configuration is invalid" in error.text, error.error
    assert topic_configs(js, "js-altered", names)["retention.ms"] == "7200000"


@pytest.mark.matrix("admin: create partitions")
def test_create_partitions(js: ClientDriver) -> None:
    create_topic(js, "js-grown", partitions=2)
    admin(js, "createPartitions", {"topicPartitions": [{"topic": "js-grown", "count": 5}]})
    assert sorted(offsets(js, "js-grown")) == [0, 1, 2, 3, 4]
    sent = js.call("produce", topic="js-grown", messages=[{"value": "to the new one", "partition": 4}])
    assert [(r["partition"], r["baseOffset"]) for r in sent] == [(4, "0")]
    error = js.error_of(
        "admin", method="createPartitions", args=[{"topicPartitions": [{"topic": "js-grown", "count": 3}]}]
    )
    assert "INVALID_PARTITIONS" in error.text


@pytest.mark.matrix("admin: delete records")
def test_delete_records(js: ClientDriver) -> None:
    create_topic(js, "js-trimmed")
    js.call("produce", topic="js-trimmed", messages=messages("trim", 10))
    delete_records(js, "js-trimmed", 0, 4)
    assert offsets(js, "js-trimmed") == {0: (4, 10)}


@pytest.mark.matrix("admin: list and describe groups")
def test_list_and_describe_groups(js: ClientDriver) -> None:
    create_topic(js, "js-listed", partitions=3)
    js.call("consumerStart", name="lister", groupId="js-listed-group", topics=["js-listed"])
    try:
        wait_for(lambda: assignment_size(js.call("consumerState", name="lister")) == 3, what="assignment")
        groups = {g["groupId"]: g["protocolType"] for g in admin(js, "listGroups")["groups"]}
        assert groups.get("js-listed-group") == "consumer"
        (group,) = admin(js, "describeGroups", ["js-listed-group"])["groups"]
        assert group["state"] == "Stable" and group["protocolType"] == "consumer"
        (member,) = group["members"]
        assert member["clientId"] == "tidelog-kafkajs-tests"
    finally:
        js.call("consumerStop", name="lister")
    (group,) = admin(js, "describeGroups", ["js-listed-group"])["groups"]
    assert group["state"] == "Empty" and group["members"] == []


@pytest.mark.matrix("admin: delete topics")
def test_delete_topics(js: ClientDriver) -> None:
    create_topic(js, "js-deleted")
    admin(js, "deleteTopics", {"topics": ["js-deleted"]})
    assert "js-deleted" not in admin(js, "listTopics")
    error = js.error_of("admin", method="deleteTopics", args=[{"topics": ["js-deleted"]}])
    assert "UNKNOWN_TOPIC_OR_PARTITION" in error.text


# --- producer ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reader(js: ClientDriver) -> Iterator[str]:
    """One group member subscribed to every producer test's topic (created here, 3 partitions each)."""
    for topic in PRODUCE_TOPICS:
        create_topic(js, topic, partitions=3)
    js.call("consumerStart", name="reader", groupId="js-reader", topics=PRODUCE_TOPICS)
    try:
        yield "reader"
    finally:
        js.call("consumerStop", name="reader")


def read_back(js: ClientDriver, reader: str, topic: str, count: int) -> list[dict[str, Any]]:
    got = js.call("consumerTake", name=reader, topic=topic, count=count)
    assert got["crashed"] is None, got["crashed"]
    assert len(got["messages"]) == count, f"{len(got['messages'])} of {count} messages of {topic}"
    return sorted(got["messages"], key=lambda m: (m["partition"], m["offset"]))


def assert_exactly(got: list[dict[str, Any]], sent: list[dict[str, Any]]) -> None:
    """Every message sent arrived once, in its key's murmur2 partition, offsets dense from 0 per partition."""
    assert sorted(m["value"] for m in got) == sorted(m["value"] for m in sent)
    for message in got:
        assert message["partition"] == partition_for_key(message["key"].encode(), 3), message["key"]
    for partition in {m["partition"] for m in got}:
        assert [m["offset"] for m in got if m["partition"] == partition] == list(
            range(sum(m["partition"] == partition for m in got))
        )


@pytest.mark.matrix("producer: keys")
def test_produce_keys(js: ClientDriver, reader: str) -> None:
    sent = messages("keys", 60)
    js.call("produce", topic="js-keys", messages=sent)
    got = read_back(js, reader, "js-keys", 60)
    assert_exactly(got, sent)
    for message in got:  # per-key order is the production order
        same_key = [m["value"] for m in got if m["key"] == message["key"]]
        assert same_key == [m["value"] for m in sent if m["key"] == message["key"]]


@pytest.mark.matrix("producer: headers")
def test_produce_headers(js: ClientDriver, reader: str) -> None:
    sent = [{**m, "headers": {"seq": str(i), "tag": ["a", "b"]}} for i, m in enumerate(messages("hdr", 20))]
    js.call("produce", topic="js-headers", messages=sent)
    got = read_back(js, reader, "js-headers", 20)
    assert_exactly(got, sent)
    for message in got:
        seq = message["value"].split("|")[1]
        assert message["headers"] == {"seq": [seq], "tag": ["a", "b"]}


@pytest.mark.matrix("producer: {codec}")
@pytest.mark.parametrize("codec", CODECS)
def test_produce_codec(js: ClientDriver, reader: str, broker: BrokerProcess, codec: str) -> None:
    topic = f"js-codec-{codec}"
    sent = messages(codec, 50)
    js.call("produce", topic=topic, messages=sent, compression=codec)
    assert_exactly(read_back(js, reader, topic, 50), sent)
    assert stored_codecs(broker.log_dir, topic) == {codec}  # kept as the client compressed it


@pytest.mark.matrix("producer: idempotence")
def test_produce_idempotent(js: ClientDriver, reader: str, broker: BrokerProcess) -> None:
    sent = messages("idem", 40)
    first = js.call("produce", topic="js-idempotent", messages=sent[:20], idempotent=True)
    second = js.call("produce", topic="js-idempotent", messages=sent[20:], idempotent=True)
    assert all(r["errorCode"] == 0 for r in first + second)
    assert_exactly(read_back(js, reader, "js-idempotent", 40), sent)
    batches = stored_batches(broker.log_dir, "js-idempotent")
    assert len({b.producer_id for b in batches}) == 2 and all(b.producer_id >= 0 for b in batches)  # one per producer
    assert all(b.base_sequence >= 0 for b in batches)


@pytest.mark.matrix("producer: transactions (commit and abort)")
def test_transactional_producer_commits(js: ClientDriver) -> None:
    """KafkaJS's transactional producer: its records and the COMMIT marker are in the log."""
    create_topic(js, "js-transactional")
    js.call("transaction", transactionalId="js-tx", topic="js-transactional", messages=[{"value": "v"}])
    assert offsets(js, "js-transactional") == {0: (0, 2)}  # the record and the COMMIT marker


@pytest.mark.matrix("producer: transactions (commit and abort)")
def test_transactions_commit_and_abort_seen_by_read_committed(js: ClientDriver) -> None:
    """KafkaJS commits, aborts, commits; its own consumer (read_committed, KafkaJS's default) gets the committed
    records only, one with readUncommitted gets all of them."""
    create_topic(js, "js-txn-abort")
    for values, commit in ((["c1", "c2"], True), (["a1", "a2"], False), (["c3"], True)):
        messages = [{"key": "k", "value": value} for value in values]
        js.call("transaction", transactionalId="js-tx-abort", topic="js-txn-abort", messages=messages, commit=commit)
    assert offsets(js, "js-txn-abort") == {0: (0, 8)}  # five records and three markers
    expected = {"committed": ["c1", "c2", "c3"], "uncommitted": ["c1", "c2", "a1", "a2", "c3"]}
    for name, wanted in expected.items():
        js.call("consumerStart", name=name, groupId=f"js-txn-{name}", topics=["js-txn-abort"],
                readUncommitted=name == "uncommitted")  # fmt: skip
        try:
            got = js.call("consumerTake", name=name, topic="js-txn-abort", count=len(wanted), timeoutMs=10000)
            assert [m["value"] for m in got["messages"]] == wanted
            assert js.call("consumerTake", name=name, topic="js-txn-abort", count=1, timeoutMs=500)["messages"] == []
        finally:
            js.call("consumerStop", name=name)


# --- consumer groups -----------------------------------------------------------------------------------------


@pytest.mark.matrix("consumer: read a partition from an offset")
def test_seek(js: ClientDriver) -> None:
    create_topic(js, "js-seek")
    js.call("produce", topic="js-seek", messages=[{"value": f"s{i}"} for i in range(10)])
    # a member starting at the end (fromBeginning false) sent back to offset 6: without the seek it reads nothing
    js.call("consumerStart", name="seeker", groupId="js-seek-group", topics=["js-seek"], fromBeginning=False)
    js.call("consumerSeek", name="seeker", topic="js-seek", partition=0, offset=6)
    got = js.call("consumerTake", name="seeker", topic="js-seek", count=4)["messages"]
    js.call("consumerStop", name="seeker")
    assert [(m["offset"], m["value"]) for m in got] == [(6, "s6"), (7, "s7"), (8, "s8"), (9, "s9")]


@pytest.mark.matrix("group: two members join, rebalance, leave")
def test_group_rebalance(js: ClientDriver) -> None:
    create_topic(js, "js-shared", partitions=4)
    group = {"groupId": "js-shared-group", "topics": ["js-shared"]}
    js.call("consumerStart", name="one", **group)
    wait_for(lambda: assignment_size(js.call("consumerState", name="one")) == 4, what="first assignment")
    js.call("consumerStart", name="two", **group)
    try:

        def split() -> list[set[int]] | None:
            states = [js.call("consumerState", name=name) for name in ("one", "two")]
            sizes = [assignment_size(state) for state in states]
            return [set(state["assignment"]["js-shared"]) for state in states] if sizes == [2, 2] else None

        owned = wait_for(split, what="the split between two members")
        assert owned[0] | owned[1] == {0, 1, 2, 3} and not owned[0] & owned[1]
        sent = [{"value": f"v{i}", "partition": i % 4} for i in range(40)]
        js.call("produce", topic="js-shared", messages=sent)
        for name, mine in zip(("one", "two"), owned, strict=True):
            got = js.call("consumerTake", name=name, topic="js-shared", count=20)["messages"]
            assert len(got) == 20 and {m["partition"] for m in got} == mine
    finally:
        js.call("consumerStop", name="two")
    wait_for(lambda: assignment_size(js.call("consumerState", name="one")) == 4, what="the survivor taking all")
    js.call("produce", topic="js-shared", messages=[{"value": f"w{p}", "partition": p} for p in range(4)])
    got = js.call("consumerTake", name="one", topic="js-shared", count=4)["messages"]
    assert sorted(m["value"] for m in got) == ["w0", "w1", "w2", "w3"]
    js.call("consumerStop", name="one")


@pytest.mark.matrix("consumer: commit, restart, resume from the committed offset")
def test_commit_restart_resume(js: ClientDriver) -> None:
    create_topic(js, "js-resumed")
    group = {"groupId": "js-resumed-group", "topics": ["js-resumed"]}
    js.call("produce", topic="js-resumed", messages=[{"value": f"first{i}"} for i in range(10)])
    js.call("consumerStart", name="before", **group)
    assert len(js.call("consumerTake", name="before", topic="js-resumed", count=10)["messages"]) == 10
    js.call("consumerStop", name="before")
    (committed,) = admin(js, "fetchOffsets", {"groupId": "js-resumed-group", "topics": ["js-resumed"]})
    assert committed["partitions"] == [{"partition": 0, "offset": "10", "metadata": None}]
    js.call("produce", topic="js-resumed", messages=[{"value": f"then{i}"} for i in range(5)])
    js.call("consumerStart", name="after", **group)
    got = js.call("consumerTake", name="after", topic="js-resumed", count=5)["messages"]  # the first five it gets
    js.call("consumerStop", name="after")
    assert [(m["offset"], m["value"]) for m in got] == [(10 + i, f"then{i}") for i in range(5)]


# --- bad input -----------------------------------------------------------------------------------------------


@pytest.mark.matrix("bad input: invalid topic names")
def test_invalid_topic_names(js: ClientDriver) -> None:
    for name in ["bad name!", "..", "x" * 250]:
        error = js.error_of("admin", method="createTopics", args=[{"topics": [{"topic": name}]}])
        assert "INVALID_TOPIC_EXCEPTION" in error.text, (name, error.error)
    error = js.error_of("produce", topic="bad/name", messages=[{"value": "v"}])
    assert "INVALID_TOPIC_EXCEPTION" in error.text or "Invalid topic" in error.text, error.error
    assert "bad name!" not in admin(js, "listTopics")  # and the connection still serves


@pytest.mark.matrix("bad input: oversize message")
def test_oversize_message(js: ClientDriver) -> None:
    create_topic(js, "js-small", configs={"max.message.bytes": "2048"})
    error = js.error_of("produce", topic="js-small", messages=[{"value": "x" * 10_000}])
    assert "MESSAGE_TOO_LARGE" in error.text, error.error
    assert offsets(js, "js-small") == {0: (0, 0)}  # nothing stored
    sent = js.call("produce", topic="js-small", messages=[{"value": "fits"}])
    assert sent[0]["baseOffset"] == "0"


@pytest.mark.matrix("bad input: out-of-range offset")
def test_out_of_range_offset(js: ClientDriver) -> None:
    create_topic(js, "js-range")
    js.call("produce", topic="js-range", messages=[{"value": f"r{i}"} for i in range(5)])
    with pytest.raises(ClientError) as raised:
        delete_records(js, "js-range", 0, 99)
    error = raised.value
    assert "OFFSET_OUT_OF_RANGE" in error.text, error.error
    # a group whose committed offset is past the end: its member's fetch gets OFFSET_OUT_OF_RANGE and KafkaJS
    # resets to the earliest offset (fromBeginning); a broker answering anything else leaves it waiting at 1000
    admin(
        js,
        "setOffsets",
        {"groupId": "js-range-group", "topic": "js-range", "partitions": [{"partition": 0, "offset": "1000"}]},
    )
    (committed,) = admin(js, "fetchOffsets", {"groupId": "js-range-group", "topics": ["js-range"]})
    assert committed["partitions"][0]["offset"] == "1000"
    js.call("consumerStart", name="lost", groupId="js-range-group", topics=["js-range"])
    got = js.call("consumerTake", name="lost", topic="js-range", count=5)["messages"]
    js.call("consumerStop", name="lost")
    assert [m["offset"] for m in got] == [0, 1, 2, 3, 4]
