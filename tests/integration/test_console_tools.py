"""`tidelog topics|produce|consume` as subprocesses against a real `tidelog serve`.

Most tests share the module's broker (distinct topic names) and read with `--partition`, which needs no group.
Tests that join consumer groups start a broker of their own with `group.initial.rebalance.delay.ms=0`, so a
join takes milliseconds instead of the default 3 s.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest

from tidelog.partitioner import partition_for_key


class BrokerProcess(Protocol):  # what these tests use of conftest's BrokerProcess
    @property
    def bootstrap(self) -> str: ...


StartBroker = Callable[..., BrokerProcess]

TIDELOG = str(Path(sys.executable).parent / "tidelog")
TIMEOUT_S = 30


def tidelog(*args: str, stdin: str | bytes = b"", timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    completed = subprocess.run([TIDELOG, *args], input=data, capture_output=True, timeout=timeout, check=False)
    return subprocess.CompletedProcess(
        completed.args, completed.returncode, completed.stdout.decode(), completed.stderr.decode()
    )


def ok(*args: str, stdin: str | bytes = b"") -> str:
    """Run a command that must succeed; its stdout."""
    result = tidelog(*args, stdin=stdin)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stderr}"
    return result.stdout


def topics(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return tidelog("topics", "--bootstrap-server", broker.bootstrap, *args)


def create(broker: BrokerProcess, topic: str, partitions: int = 1, *configs: str) -> None:
    args = ["topics", "--bootstrap-server", broker.bootstrap, "--create", "--topic", topic]
    args += ["--partitions", str(partitions), *[f"--config={c}" for c in configs]]
    assert ok(*args) == f"Created topic {topic}.\n"


def produce(broker: BrokerProcess, topic: str, lines: str, *args: str) -> subprocess.CompletedProcess[str]:
    return tidelog("produce", "--bootstrap-server", broker.bootstrap, "--topic", topic, *args, stdin=lines)


def consume(broker: BrokerProcess, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Consume with a safety timeout: a test that expects N records also passes --max-messages N."""
    return tidelog("consume", "--bootstrap-server", broker.bootstrap, "--topic", topic, "--timeout-ms", "10000", *args)


def assert_one_line_error(result: subprocess.CompletedProcess[str], command: str, message: str, code: int = 1) -> None:
    assert result.returncode == code, result
    assert result.stderr.startswith(f"tidelog {command}: error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


# --- topics ------------------------------------------------------------------------------------------------------


def test_create_list_describe_delete(broker: BrokerProcess) -> None:
    create(broker, "console-orders", 3, "retention.ms=3600000", "cleanup.policy=delete")
    create(broker, "console-other")
    assert {"console-orders", "console-other"} <= set(topics(broker, "--list").stdout.splitlines())

    described = topics(broker, "--describe", "--topic", "console-orders")
    assert described.returncode == 0, described.stderr
    head, *partition_lines = described.stdout.splitlines()
    assert re.fullmatch(
        r"Topic: console-orders\tTopicId: [A-Za-z0-9_-]{22}\tPartitionCount: 3\tReplicationFactor: 1"
        r"\tConfigs: (\S+)",
        head,
    ), head
    assert set(head.rsplit("Configs: ", 1)[1].split(",")) == {"retention.ms=3600000", "cleanup.policy=delete"}
    assert partition_lines == [
        f"\tTopic: console-orders\tPartition: {p}\tLeader: 1\tReplicas: 1\tIsr: 1" for p in range(3)
    ]
    every = topics(broker, "--describe").stdout
    assert "Topic: console-other\t" in every
    assert "\tTopic: console-orders\tPartition: 2\t" in every

    again = topics(broker, "--create", "--topic", "console-orders")
    assert_one_line_error(again, "topics", "already exists")
    assert topics(broker, "--create", "--topic", "console-orders", "--if-not-exists").stdout == ""

    assert ok("topics", "--bootstrap-server", broker.bootstrap, "--delete", "--topic", "console-other") == ""
    assert "console-other" not in topics(broker, "--list").stdout.splitlines()
    assert_one_line_error(
        topics(broker, "--describe", "--topic", "console-other"),
        "topics",
        "Topic 'console-other' does not exist as expected",
    )
    assert_one_line_error(
        topics(broker, "--delete", "--topic", "console-other"), "topics", "Topic 'console-other' does not exist"
    )
    assert topics(broker, "--delete", "--topic", "console-other", "--if-exists").returncode == 0


def test_create_errors_from_the_broker_are_one_line(broker: BrokerProcess) -> None:
    assert_one_line_error(
        topics(broker, "--create", "--topic", "console-bad", "--replication-factor", "3"), "topics", "replication"
    )
    assert_one_line_error(topics(broker, "--create", "--topic", "bad name!"), "topics", "bad name!")
    assert_one_line_error(topics(broker, "--create", "--topic", "t", "--config", "x"), "topics", "KEY=VALUE", 2)


# --- produce and consume -------------------------------------------------------------------------------------------


def test_keyed_lines_with_headers_round_trip_with_every_print_property(broker: BrokerProcess) -> None:
    create(broker, "console-keyed", 3)
    rows = [(f"key-{i}", f"value {i}", [("trace", f"t{i}"), ("n", str(i))]) for i in range(12)]
    lines = "".join(f"{','.join(f'{h}:{v}' for h, v in headers)}\t{key}:{value}\n" for key, value, headers in rows)
    before_ms = int(time.time() * 1000)
    result = produce(
        broker,
        "console-keyed",
        lines,
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=:",
        "--property",
        "parse.headers=true",
    )
    assert result.returncode == 0, result.stderr
    after_ms = int(time.time() * 1000)

    expected: dict[int, list[tuple[str, str, str]]] = {0: [], 1: [], 2: []}
    for key, value, headers in rows:  # the Java client's partition for each key, in produce order
        expected[partition_for_key(key.encode(), 3)].append((key, value, ",".join(f"{h}:{v}" for h, v in headers)))
    printed = ["print.timestamp", "print.partition", "print.offset", "print.headers", "print.key"]
    for partition, records in expected.items():
        out = consume(
            broker,
            "console-keyed",
            "--partition",
            str(partition),
            "--offset",
            "earliest",
            "--max-messages",
            str(len(records)),
            *[arg for name in printed for arg in ("--property", f"{name}=true")],
        )
        assert out.returncode == 0, out.stderr
        assert out.stderr == f"Processed a total of {len(records)} messages\n"
        lines_out = out.stdout.splitlines()
        assert len(lines_out) == len(records)
        for offset, (line, (key, value, headers)) in enumerate(zip(lines_out, records, strict=True)):
            match = re.fullmatch(r"CreateTime:(\d+)\tPartition:(\d+)\tOffset:(\d+)\t(.*)\t(.*)\t(.*)", line)
            assert match, line
            assert before_ms - 1000 <= int(match[1]) <= after_ms + 1000
            assert (int(match[2]), int(match[3]), match[4], match[5], match[6]) == (
                partition,
                offset,
                headers,
                key,
                value,
            )


def test_value_only_by_default_and_custom_separators(broker: BrokerProcess) -> None:
    create(broker, "console-plain")
    assert produce(broker, "console-plain", "first\nk2|second\n\n", "--partition", "0").returncode == 0
    out = consume(broker, "console-plain", "--partition", "0", "--offset", "earliest", "--max-messages", "3")
    assert out.stdout == "first\nk2|second\n\n"
    assert out.stderr == "Processed a total of 3 messages\n"
    out = consume(
        broker,
        "console-plain",
        "--partition=0",
        "--offset=1",
        "--max-messages=1",
        "--property=print.key=true",
        "--property=key.separator= -> ",
        "--property=print.headers=true",
    )
    assert out.stdout == "NO_HEADERS -> null -> k2|second\n"


def test_max_messages_and_offsets(broker: BrokerProcess) -> None:
    create(broker, "console-many")
    assert produce(broker, "console-many", "".join(f"{i}\n" for i in range(20))).returncode == 0
    started = time.monotonic()
    out = consume(broker, "console-many", "--partition", "0", "--from-beginning", "--max-messages", "4")
    assert time.monotonic() - started < 8  # stopped by the count, not by --timeout-ms
    assert (out.returncode, out.stdout, out.stderr) == (0, "0\n1\n2\n3\n", "Processed a total of 4 messages\n")
    out = consume(
        broker,
        "console-many",
        "--partition",
        "0",
        "--offset",
        "17",
        "--max-messages",
        "3",
        "--property=print.offset=true",
    )
    assert out.stdout == "Offset:17\t17\nOffset:18\t18\nOffset:19\t19\n"
    out = tidelog(
        "consume", "--bootstrap-server", broker.bootstrap, "--topic", "console-many", "--partition", "0",
        "--timeout-ms", "300",
    )  # fmt: skip
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "Processed a total of 0 messages\n")


def test_compression_types_and_acks(broker: BrokerProcess) -> None:
    create(broker, "console-codecs")
    settings = [("none", "0"), ("gzip", "1"), ("snappy", "all"), ("lz4", "1"), ("zstd", "all")]
    for codec, acks in settings:
        lines = "".join(f"{codec}-{i}\n" for i in range(50))
        result = produce(broker, "console-codecs", lines, "--compression-type", codec, "--acks", acks)
        assert result.returncode == 0, result.stderr
    out = consume(broker, "console-codecs", "--partition", "0", "--offset", "earliest", "--max-messages", "250")
    assert out.stdout.splitlines() == [f"{codec}-{i}" for codec, _ in settings for i in range(50)]


def test_a_rejected_record_is_reported_and_fails_the_run(broker: BrokerProcess) -> None:
    create(broker, "console-small", 1, "max.message.bytes=1000")
    result = produce(broker, "console-small", "x" * 5000 + "\n")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "Error when sending message to topic console-small with key: null, value: 5000 bytes with error: "
    )
    assert "too large" in result.stderr.lower()


def test_a_line_that_does_not_parse_stops_the_producer_after_sending_the_lines_before(broker: BrokerProcess) -> None:
    create(broker, "console-parse")
    result = produce(
        broker, "console-parse", "a:1\nno separator\nc:3\n", "--property=parse.key=true", "--property=key.separator=:"
    )
    assert_one_line_error(result, "produce", "No key separator found on line number 2: 'no separator'")
    out = consume(
        broker, "console-parse", "--partition=0", "--offset=earliest", "--timeout-ms=700", "--property=print.key=true"
    )
    assert out.stdout == "a\t1\n"


# --- groups --------------------------------------------------------------------------------------------------------


@pytest.fixture
def group_broker(start_broker: StartBroker) -> BrokerProcess:
    return start_broker(group_initial_rebalance_delay_ms=0)


def test_a_group_commits_what_it_printed(group_broker: BrokerProcess) -> None:
    broker = group_broker
    create(broker, "console-group")
    assert produce(broker, "console-group", "1\n2\n3\n4\n5\n").returncode == 0

    first = consume(broker, "console-group", "--group", "g1", "--from-beginning", "--max-messages", "3")
    assert (first.stdout, first.stderr) == ("1\n2\n3\n", "Processed a total of 3 messages\n")
    second = consume(broker, "console-group", "--group", "g1", "--from-beginning", "--max-messages", "2")
    assert second.stdout == "4\n5\n"  # --from-beginning applies only where the group has no offset
    nothing = consume(broker, "console-group", "--group", "g1", "--from-beginning", "--timeout-ms", "1000")
    assert (nothing.returncode, nothing.stdout, nothing.stderr) == (0, "", "Processed a total of 0 messages\n")

    # without --group: a random group that never commits, so every run starts over
    for _ in range(2):
        anonymous = consume(broker, "console-group", "--from-beginning", "--max-messages", "5")
        assert anonymous.stdout == "1\n2\n3\n4\n5\n"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_closes_the_consumer_cleanly(
    group_broker: BrokerProcess, tmp_path: Path, signum: signal.Signals, code: int
) -> None:
    broker = group_broker
    create(broker, "console-signal")
    assert produce(broker, "console-signal", "a\nb\n").returncode == 0
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    args = ["consume", "--bootstrap-server", broker.bootstrap, "--topic", "console-signal", "--group", "gs"]
    with out_path.open("wb") as out, err_path.open("wb") as err:
        process = subprocess.Popen([TIDELOG, *args, "--from-beginning"], stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while out_path.read_text().count("\n") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            process.send_signal(signum)
            assert process.wait(timeout=TIMEOUT_S) == code
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert out_path.read_text() == "a\nb\n"
    assert err_path.read_text() == "Processed a total of 2 messages\n"
    # the close committed: the group resumes after "b"
    assert produce(broker, "console-signal", "c\n").returncode == 0
    assert consume(broker, "console-signal", "--group", "gs", "--max-messages", "1").stdout == "c\n"


# --- bad input ---------------------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "command", "message", "code"),
    [
        (["produce", "--topic", "t", "--bogus"], "produce", "unrecognized arguments: --bogus", 2),
        (["consume", "--topic", "t", "--property", "print.key"], "consume", "expected KEY=VALUE", 2),
        (["consume", "--topic", "t", "--property", "print.keys=true"], "consume", "unknown --property", 2),
        (["produce", "--topic", "t", "--producer-property", "acks"], "produce", "expected KEY=VALUE", 2),
        (["produce", "--topic", "t", "--producer-property", "no.such=1"], "produce", "no.such", 2),
    ],
)
def test_usage_errors_are_one_line(
    broker: BrokerProcess, args: list[str], command: str, message: str, code: int
) -> None:
    result = tidelog(args[0], "--bootstrap-server", broker.bootstrap, *args[1:])
    assert_one_line_error(result, command, message, code)


@pytest.mark.parametrize(
    "args",
    [["topics", "--list"], ["produce", "--topic", "t"], ["consume", "--topic", "t"]],
)
def test_an_unreachable_broker_is_one_line_within_the_timeout(args: list[str]) -> None:
    address = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()
    result = tidelog(args[0], "--bootstrap-server", address, "--connect-timeout-ms", "500", *args[1:])
    assert time.monotonic() - started < 10
    assert_one_line_error(result, args[0], f"cannot reach a broker at {address} within 500 ms")
    assert "Connection refused" in result.stderr


def test_unknown_topics_when_the_broker_does_not_create_them(start_broker: StartBroker) -> None:
    broker = start_broker(auto_create_topics_enable="false")
    assert_one_line_error(produce(broker, "console-absent", "x\n"), "produce", "Topic 'console-absent' does not exist")
    assert_one_line_error(consume(broker, "console-absent"), "consume", "Topic 'console-absent' does not exist")
    create(broker, "console-present")
    assert_one_line_error(
        produce(broker, "console-present", "x\n", "--partition", "4"), "produce", "Partition 4 of topic"
    )
