"""Sarama 1.22 (Go, Debian's golang-github-shopify-sarama-dev) against a real `tidelog serve`.

tests/clients/go/driver.go is compiled once per run into a temp dir (GOPATH mode: GOPATH=/usr/share/gocode,
GO111MODULE=off) and run twice for the module, both long-lived: at `config.Version = V2_2_0_0` (admin, producer,
consumer groups, bad input) and at Sarama's default Version (V0_8_2_0: Produce v0 with magic 0 messages, Fetch
v0, ListOffsets v0, OffsetCommit v1 and OffsetFetch v1 through its OffsetManager). Every test is one cell of the
client matrix in docs/compatibility.md (its `matrix` mark).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from client_driver import ClientDriver
from stored import stored_batches, stored_codecs

from broker_process import BrokerProcess

CLIENT = "Sarama 1.22 (Version V2_2_0_0)"
DEFAULTS = "Sarama 1.22 (default Version)"
GO = Path(__file__).resolve().parent / "go"
GOPATH = Path("/usr/share/gocode")
SARAMA = GOPATH / "src/github.com/Shopify/sarama"
CODECS = ["gzip", "snappy", "lz4", "zstd"]

# Kafka error codes Sarama hands back
OFFSET_OUT_OF_RANGE = 1
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
UNKNOWN_TOPIC_OR_PARTITION = 3


@pytest.fixture(scope="module")
def driver_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    if go is None or not SARAMA.is_dir():
        pytest.fail(
            "Go or Sarama is missing: `make client-deps` installs golang-go and golang-github-shopify-sarama-dev"
        )
    binary = tmp_path_factory.mktemp("sarama") / "driver"
    env = {**os.environ, "GOPATH": str(GOPATH), "GO111MODULE": "off", "CGO_CFLAGS": "-Wno-deprecated-declarations"}
    build = subprocess.run(
        [go, "build", "-o", str(binary), "driver.go"], cwd=GO, env=env, capture_output=True, text=True, timeout=300
    )
    assert build.returncode == 0, f"go build failed:\n{build.stdout}{build.stderr}"
    return binary


def start_driver(binary: Path, broker: BrokerProcess, version: str | None, log: Path) -> ClientDriver:
    args = [str(binary), "-bootstrap", broker.bootstrap] + (["-version", version] if version else [])
    return ClientDriver(args, log)


@pytest.fixture(scope="module")
def sarama(
    driver_binary: Path, broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClientDriver]:
    driver = start_driver(driver_binary, broker, "2.2.0", tmp_path_factory.mktemp("sarama-v2") / "err")
    try:
        yield driver
    finally:
        driver.close()


@pytest.fixture(scope="module")
def sarama_default(
    driver_binary: Path, broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClientDriver]:
    driver = start_driver(driver_binary, broker, None, tmp_path_factory.mktemp("sarama-default") / "err")
    try:
        yield driver
    finally:
        driver.close()


def create_topic(sarama: ClientDriver, topic: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    assert sarama.call("createTopic", topic=topic, count=partitions, configs=configs or {}) is True


def topic_configs(sarama: ClientDriver, topic: str, names: list[str]) -> dict[str, str]:
    entries = sarama.call("describeConfig", resourceType="topic", name=topic, configNames=names)
    return {e["Name"]: e["Value"] for e in entries}


def messages(tag: str, n: int, keyed: bool = True) -> list[dict[str, Any]]:
    return [
        {"key": f"{tag}-k{i % 7}" if keyed else None, "value": f"{tag}|{i}|" + "compressible " * 20} for i in range(n)
    ]


def sarama_partition(key: str, partitions: int) -> int:
    """Sarama's default hash partitioner: FNV-1a 32 of the key as an int32, Go's `%` (the sign of the dividend),
    then the absolute value: |h| % partitions."""
    h = 0x811C9DC5
    for byte in key.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    signed = h - (1 << 32) if h & 0x80000000 else h
    return abs(signed) % partitions


def read_all(sarama: ClientDriver, topic: str, partitions: int, expected: int) -> list[dict[str, Any]]:
    """Every partition read from its oldest to its newest offset (as ListOffsets tells them)."""
    got: list[dict[str, Any]] = []
    for partition in range(partitions):
        ends = sarama.call("offsets", topic=topic, partition=partition)
        count = ends["newest"] - ends["oldest"]
        got += sarama.call("consume", topic=topic, partition=partition, offset=-2, count=count, timeoutMs=10_000)
    assert len(got) == expected, f"{len(got)} of {expected} messages in {topic}"
    return got


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


# --- admin ---------------------------------------------------------------------------------------------------


@pytest.mark.matrix("admin: create topics with configs")
def test_create_topic_with_configs(sarama: ClientDriver) -> None:
    configs = {"cleanup.policy": "compact", "retention.ms": "3600000", "max.message.bytes": "65536"}
    create_topic(sarama, "go-created", partitions=3, configs=configs)
    assert topic_configs(sarama, "go-created", list(configs)) == configs
    assert sarama.call("listTopics")["go-created"]["NumPartitions"] == 3
    assert sarama.error_of("createTopic", topic="go-created", count=1).error["code"] == TOPIC_ALREADY_EXISTS


@pytest.mark.matrix("admin: describe topics and configs")
def test_describe_topics_and_configs(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-described", partitions=2, configs={"retention.ms": "7200000"})
    (topic,) = sarama.call("describeTopics", topics=["go-described"])
    assert topic["error"] == 0 and [p["id"] for p in sorted(topic["partitions"], key=lambda p: p["id"])] == [0, 1]
    entries = {e["Name"]: e for e in sarama.call("describeConfig", resourceType="topic", name="go-described")}
    assert entries["retention.ms"]["Value"] == "7200000" and not entries["retention.ms"]["Default"]
    assert entries["cleanup.policy"]["Value"] == "delete" and entries["cleanup.policy"]["Default"]
    (unknown,) = sarama.call("describeTopics", topics=["go-nowhere"])
    assert unknown["error"] == UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.matrix("admin: alter configs")
def test_alter_config(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-altered", configs={"retention.ms": "3600000", "cleanup.policy": "compact"})
    names = ["retention.ms", "cleanup.policy", "compression.type"]
    alter = {"resourceType": "topic", "name": "go-altered"}
    assert sarama.call("alterConfig", configs={"retention.ms": "1000"}, validateOnly=True, **alter) is True
    assert topic_configs(sarama, "go-altered", names)["retention.ms"] == "3600000"  # validate_only changed nothing
    # AlterConfigs sets the whole set: cleanup.policy, left out, is back to its default
    assert sarama.call("alterConfig", configs={"retention.ms": "7200000", "compression.type": "gzip"}, **alter)
    assert topic_configs(sarama, "go-altered", names) == {
        "retention.ms": "7200000",
        "cleanup.policy": "delete",
        "compression.type": "gzip",
    }
    error = sarama.error_of("alterConfig", configs={"retention.ms": "soon"}, **alter)
    assert "retention.ms" in error.error["message"], error.error  # Sarama 1.22 passes on the broker's message only
    assert topic_configs(sarama, "go-altered", names)["retention.ms"] == "7200000"


@pytest.mark.matrix("admin: create partitions")
def test_create_partitions(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-grown", partitions=2)
    assert sarama.call("createPartitions", topic="go-grown", count=5) is True
    (topic,) = sarama.call("describeTopics", topics=["go-grown"])
    assert sorted(p["id"] for p in topic["partitions"]) == [0, 1, 2, 3, 4]
    assert sarama.error_of("createPartitions", topic="go-grown", count=3).error["code"] == INVALID_PARTITIONS


@pytest.mark.matrix("admin: delete records")
def test_delete_records(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-trimmed")
    sarama.call("produce", topic="go-trimmed", messages=messages("trim", 10), compression="none")
    assert sarama.call("deleteRecords", topic="go-trimmed", offsets={"0": 4}) is True
    assert sarama.call("offsets", topic="go-trimmed", partition=0) == {"oldest": 4, "newest": 10}
    got = sarama.call("consume", topic="go-trimmed", partition=0, offset=-2, count=6, timeoutMs=5000)
    assert [m["offset"] for m in got] == [4, 5, 6, 7, 8, 9]


@pytest.mark.matrix("admin: list and describe groups")
def test_list_and_describe_groups(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-listed", partitions=3)
    sarama.call("groupStart", name="lister", group="go-listed-group", topics=["go-listed"])
    try:
        wait_for(lambda: sarama.call("groupState", name="lister")["sessions"] >= 1, what="a session")
        assert sarama.call("listGroups")["go-listed-group"] == "consumer"
        (group,) = sarama.call("describeGroups", groups=["go-listed-group"])
        assert group["error"] == 0 and group["state"] == "Stable" and group["protocolType"] == "consumer"
        assert group["protocol"] == "range"
        (member,) = group["members"].values()
        assert member["clientId"] == "tidelog-sarama-tests" and member["assignment"] == {"go-listed": [0, 1, 2]}
    finally:
        sarama.call("groupStop", name="lister")
    (group,) = sarama.call("describeGroups", groups=["go-listed-group"])
    assert group["state"] == "Empty" and group["members"] == {}


@pytest.mark.matrix("admin: delete topics")
def test_delete_topic(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-deleted")
    assert sarama.call("deleteTopic", topic="go-deleted") is True
    assert "go-deleted" not in sarama.call("listTopics")
    assert sarama.error_of("deleteTopic", topic="go-deleted").error["code"] == UNKNOWN_TOPIC_OR_PARTITION


# --- producer ------------------------------------------------------------------------------------------------


def assert_exactly(got: list[dict[str, Any]], sent: list[dict[str, Any]], partitions: int) -> None:
    """Every message sent arrived once, keyed ones in Sarama's hash partition, offsets dense from 0."""
    assert sorted(m["value"] for m in got) == sorted(m["value"] for m in sent)
    for message in got:
        if message["key"] is not None:
            assert message["partition"] == sarama_partition(message["key"], partitions), message["key"]
    for partition in range(partitions):
        offsets = [m["offset"] for m in got if m["partition"] == partition]
        assert offsets == list(range(len(offsets)))


@pytest.mark.matrix("producer: keys")
def test_produce_keys(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-keys", partitions=3)
    sent = messages("keys", 60)
    results = sarama.call("produce", topic="go-keys", messages=sent, compression="none")
    assert [r["partition"] for r in results] == [sarama_partition(m["key"], 3) for m in sent]
    got = read_all(sarama, "go-keys", 3, 60)
    assert_exactly(got, sent, 3)
    for message in got:  # per-key order is the production order
        same_key = [m["value"] for m in got if m["key"] == message["key"]]
        assert same_key == [m["value"] for m in sent if m["key"] == message["key"]]


@pytest.mark.matrix("producer: headers")
def test_produce_headers(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-headers")
    sent = [{**m, "headers": [["seq", str(i)], ["tag", "a"], ["tag", "b"]]} for i, m in enumerate(messages("hdr", 20))]
    sarama.call("produce", topic="go-headers", messages=sent, compression="none")
    got = read_all(sarama, "go-headers", 1, 20)
    assert_exactly(got, sent, 1)
    for message in got:
        assert message["headers"] == {"seq": [message["value"].split("|")[1]], "tag": ["a", "b"]}


@pytest.mark.matrix("producer: {codec}")
@pytest.mark.parametrize("codec", CODECS)
def test_produce_codec(sarama: ClientDriver, broker: BrokerProcess, codec: str) -> None:
    topic = f"go-codec-{codec}"
    create_topic(sarama, topic, partitions=3)
    sent = messages(codec, 50)
    sarama.call("produce", topic=topic, messages=sent, compression=codec)
    assert_exactly(read_all(sarama, topic, 3, 50), sent, 3)
    assert stored_codecs(broker.log_dir, topic) == {codec}  # kept as the client compressed it


@pytest.mark.matrix("producer: idempotence")
def test_produce_idempotent(sarama: ClientDriver, broker: BrokerProcess) -> None:
    create_topic(sarama, "go-idempotent", partitions=3)
    sent = messages("idem", 40)
    sarama.call("produce", topic="go-idempotent", messages=sent[:20], compression="none", idempotent=True)
    sarama.call("produce", topic="go-idempotent", messages=sent[20:], compression="lz4", idempotent=True)
    assert_exactly(read_all(sarama, "go-idempotent", 3, 40), sent, 3)
    batches = stored_batches(broker.log_dir, "go-idempotent")
    assert len({b.producer_id for b in batches}) == 2 and all(b.producer_id >= 0 for b in batches)  # one per producer
    assert all(b.base_sequence >= 0 for b in batches)


# --- consumers -----------------------------------------------------------------------------------------------


@pytest.mark.matrix("consumer: read a partition from an offset")
def test_consume_from_offset(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-offsets")
    sarama.call("produce", topic="go-offsets", messages=messages("off", 10, keyed=False), compression="none")
    got = sarama.call("consume", topic="go-offsets", partition=0, offset=6, count=4, timeoutMs=5000)
    assert [(m["offset"], m["value"].split("|")[1]) for m in got] == [(6, "6"), (7, "7"), (8, "8"), (9, "9")]
    newest = sarama.call("consume", topic="go-offsets", partition=0, offset=-1, count=1, timeoutMs=300)
    assert newest == []  # from the end: nothing yet


@pytest.mark.matrix("group: two members join, rebalance, leave")
def test_group_rebalance(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-shared", partitions=4)
    group = {"group": "go-shared-group", "topics": ["go-shared"]}

    def claims(name: str) -> list[int]:
        return sorted((sarama.call("groupState", name=name)["claims"] or {}).get("go-shared", []))

    sarama.call("groupStart", name="one", **group)
    wait_for(lambda: claims("one") == [0, 1, 2, 3], what="first assignment")
    sarama.call("groupStart", name="two", **group)
    try:
        wait_for(lambda: len(claims("one")) == 2 and len(claims("two")) == 2, what="the split between two members")
        owned = {"one": set(claims("one")), "two": set(claims("two"))}
        assert owned["one"] | owned["two"] == {0, 1, 2, 3}
        sent = sarama.call("produce", topic="go-shared", messages=messages("split", 80), compression="none")
        for name, mine in owned.items():
            count = sum(r["partition"] in mine for r in sent)
            got = sarama.call("groupTake", name=name, count=count, timeoutMs=10_000)
            assert len(got) == count and {m["partition"] for m in got} == mine, name
    finally:
        sarama.call("groupStop", name="two")
    wait_for(lambda: claims("one") == [0, 1, 2, 3], what="the survivor taking all")
    sarama.call("produce", topic="go-shared", messages=messages("after", 20), compression="none")
    got = sarama.call("groupTake", name="one", count=20, timeoutMs=10000)
    sarama.call("groupStop", name="one")
    assert sorted(m["value"] for m in got) == sorted(m["value"] for m in messages("after", 20))


@pytest.mark.matrix("consumer: commit, restart, resume from the committed offset")
def test_commit_restart_resume(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-resumed")
    group = {"group": "go-resumed-group", "topics": ["go-resumed"]}
    sarama.call("produce", topic="go-resumed", messages=messages("first", 10, keyed=False), compression="none")
    sarama.call("groupStart", name="before", **group)
    assert len(sarama.call("groupTake", name="before", count=10, timeoutMs=10000)) == 10
    sarama.call("groupStop", name="before")  # Close commits what was marked, then leaves
    assert sarama.call("groupOffsets", group="go-resumed-group", topic="go-resumed", partitions=[0]) == {"0": 10}
    sarama.call("produce", topic="go-resumed", messages=messages("then", 5, keyed=False), compression="none")
    sarama.call("groupStart", name="after", **group)
    got = sarama.call("groupTake", name="after", count=5, timeoutMs=10000)
    sarama.call("groupStop", name="after")
    assert [m["offset"] for m in got] == [10, 11, 12, 13, 14]
    assert all(m["value"].startswith("then|") for m in got)


# --- bad input -----------------------------------------------------------------------------------------------


@pytest.mark.matrix("bad input: invalid topic names")
def test_invalid_topic_names(sarama: ClientDriver) -> None:
    for name in ["bad name!", "..", "x" * 250]:
        assert sarama.error_of("createTopic", topic=name, count=1).error["code"] == INVALID_TOPIC_EXCEPTION, name
    error = sarama.error_of("produce", topic="bad/name", messages=messages("bad", 1), compression="none")
    assert error.error["code"] == INVALID_TOPIC_EXCEPTION, error.error
    assert "bad name!" not in sarama.call("listTopics")  # and the admin connection still serves


@pytest.mark.matrix("bad input: oversize message")
def test_oversize_message(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-small", configs={"max.message.bytes": "2048"})
    big = [{"key": None, "value": "x" * 10_000}]
    assert (
        sarama.error_of("produce", topic="go-small", messages=big, compression="none").error["code"]
        == MESSAGE_TOO_LARGE
    )
    assert sarama.call("offsets", topic="go-small", partition=0) == {"oldest": 0, "newest": 0}  # nothing stored
    assert sarama.call("produce", topic="go-small", messages=messages("fits", 1), compression="none")[0]["offset"] == 0


@pytest.mark.matrix("bad input: out-of-range offset")
def test_out_of_range_offset(sarama: ClientDriver) -> None:
    create_topic(sarama, "go-range")
    sarama.call("produce", topic="go-range", messages=messages("r", 5, keyed=False), compression="none")
    error = sarama.error_of("consume", topic="go-range", partition=0, offset=1000, count=1, timeoutMs=1000)
    assert error.error["code"] == OFFSET_OUT_OF_RANGE, error.error
    got = sarama.call("consume", topic="go-range", partition=0, offset=4, count=1, timeoutMs=5000)
    assert [m["offset"] for m in got] == [4]  # the same consumer code reads a valid offset


# --- Sarama's defaults (config.Version V0_8_2_0) ---------------------------------------------------------------


@pytest.mark.matrix("producer: keys", client=DEFAULTS)
def test_defaults_produce_keys(sarama: ClientDriver, sarama_default: ClientDriver) -> None:
    create_topic(sarama, "go-old-keys", partitions=3)
    sent = messages("old", 30)
    results = sarama_default.call("produce", topic="go-old-keys", messages=sent, compression="none")
    assert [r["partition"] for r in results] == [sarama_partition(m["key"], 3) for m in sent]
    assert_exactly(read_all(sarama_default, "go-old-keys", 3, 30), sent, 3)
    assert_exactly(read_all(sarama, "go-old-keys", 3, 30), sent, 3)  # and a v2 reader sees the same


@pytest.mark.matrix("producer: {codec}", client=DEFAULTS)
@pytest.mark.parametrize("codec", ["gzip", "snappy"])
def test_defaults_produce_codec(sarama: ClientDriver, sarama_default: ClientDriver, codec: str) -> None:
    topic = f"go-old-codec-{codec}"
    create_topic(sarama, topic)
    sent = messages(codec, 30, keyed=False)
    sarama_default.call("produce", topic=topic, messages=sent, compression=codec)
    assert_exactly(read_all(sarama_default, topic, 1, 30), sent, 1)


@pytest.mark.matrix("consumer: read a partition from an offset", client=DEFAULTS)
def test_defaults_consume_from_offset(sarama: ClientDriver, sarama_default: ClientDriver) -> None:
    create_topic(sarama, "go-old-offsets")
    sarama.call("produce", topic="go-old-offsets", messages=messages("off", 10, keyed=False), compression="gzip")
    got = sarama_default.call("consume", topic="go-old-offsets", partition=0, offset=6, count=4, timeoutMs=5000)
    assert [(m["offset"], m["value"].split("|")[1]) for m in got] == [(6, "6"), (7, "7"), (8, "8"), (9, "9")]
    assert sarama_default.call("offsets", topic="go-old-offsets", partition=0) == {"oldest": 0, "newest": 10}


@pytest.mark.matrix("consumer: commit, restart, resume from the committed offset", client=DEFAULTS)
def test_defaults_commit_restart_resume(sarama: ClientDriver, sarama_default: ClientDriver) -> None:
    create_topic(sarama, "go-old-resumed")
    where = {"group": "go-old-group", "topic": "go-old-resumed", "partition": 0}
    sarama_default.call("produce", topic="go-old-resumed", messages=messages("m", 10, keyed=False), compression="none")
    assert sarama_default.call("commit", offset=6, **where) is True  # OffsetCommit v1, on Close
    assert sarama_default.call("committed", **where) == 6  # a new OffsetManager: OffsetFetch v1
    got = sarama_default.call("consume", topic="go-old-resumed", partition=0, offset=6, count=4, timeoutMs=5000)
    assert [m["offset"] for m in got] == [6, 7, 8, 9]
    assert sarama.call("groupOffsets", group="go-old-group", topic="go-old-resumed", partitions=[0]) == {"0": 6}


@pytest.mark.matrix("bad input: out-of-range offset", client=DEFAULTS)
def test_defaults_out_of_range_offset(sarama: ClientDriver, sarama_default: ClientDriver) -> None:
    create_topic(sarama, "go-old-range")
    sarama_default.call("produce", topic="go-old-range", messages=messages("r", 3, keyed=False), compression="none")
    error = sarama_default.error_of("consume", topic="go-old-range", partition=0, offset=99, count=1, timeoutMs=1000)
    assert error.error["code"] == OFFSET_OUT_OF_RANGE, error.error
