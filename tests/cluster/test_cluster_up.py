"""`tidelog cluster up` as a user runs it: one command starts ZooKeeper and three brokers, a Kafka client creates a
topic with three replicas and produces and consumes through it, the leadership table and `tidelog topics --describe`
show each partition's leader, replicas and ISR, and SIGTERM stops every process it started, exiting 0."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from zookeeper_process import zookeeper_missing

START_S = 120.0  # ZooKeeper's JVM and three brokers on two busy cores
SRC = Path(__file__).resolve().parents[2] / "src"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    return env


class Output:
    """The lines `cluster up` prints, read on a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [self._queue.put(line) for line in stdout], daemon=True).start()

    def drain(self) -> str:
        while True:
            try:
                self.lines.append(self._queue.get_nowait())
            except queue.Empty:
                return "".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.drain())
            if found:
                return found
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout_s} s; output:\n{self.drain()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cluster_up_serves_a_replicated_topic_and_stops_everything(tmp_path: Path) -> None:
    missing = zookeeper_missing()
    if missing:
        pytest.skip(missing)
    command = ["cluster", "up", "--brokers", "3", "--dir", str(tmp_path / "c"), "--interval", "0.5"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidelog.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**_env(), "COLUMNS": "200"},
    )
    try:
        output = Output(proc)
        bootstrap = output.wait_for(r"Bootstrap servers: (\S+)", START_S).group(1)
        assert len(bootstrap.split(",")) == 3
        zookeeper_pid = int(output.wait_for(r"ZooKeeper on \S+ \(pid (\d+)", 1).group(1))
        output.wait_for(r"controller", 10)
        broker_pids = [int(pid) for pid in re.findall(r"127\.0\.0\.1:\d+\s*│\s*(\d+)", output.drain())]
        assert len(broker_pids) == 3, output.drain()
        assert all(_alive(pid) for pid in [zookeeper_pid, *broker_pids])

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=3)])["orders"].result(60)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        producer.produce("orders", key=b"k", value=b"one command", partition=1)
        assert producer.flush(60) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cluster-up", "enable.auto.commit": False})
        consumer.assign([TopicPartition("orders", 1, 0)])
        message = None
        deadline = time.monotonic() + 60
        while message is None and time.monotonic() < deadline:
            polled = consumer.poll(1.0)
            if polled is not None and polled.error() is None:
                message = polled
        consumer.close()
        assert message is not None and message.value() == b"one command"

        table = output.wait_for(r"│ orders\s*│ 2\s*│ (\d)\s*│ ([\d,]+)\s*│ ([\d,]+)", 30)
        assert sorted(table.group(2).split(",")) == ["1", "2", "3"]

        describe = ["topics", "--bootstrap-server", bootstrap.split(",")[0], "--describe", "--topic", "orders"]
        described = subprocess.run(
            [sys.executable, "-m", "tidelog.cli", *describe],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=60,
            check=True,
        ).stdout
        rows = re.findall(r"Partition: (\d)\tLeader: (\d)\tReplicas: ([\d,]+)\tIsr: ([\d,]+)", described)
        assert len(rows) == 3, described
        assert {leader for _, leader, _, _ in rows} <= {"1", "2", "3"}
        for _, leader, replicas, isr in rows:
            assert sorted(replicas.split(",")) == ["1", "2", "3"] and leader == replicas.split(",")[0]
            assert sorted(isr.split(",")) == ["1", "2", "3"]
        assert "ReplicationFactor: 3" in described

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, output.drain()
        assert "Stopped." in output.drain()
        left = [pid for pid in [zookeeper_pid, *broker_pids] if _alive(pid)]
        assert left == [], f"still running: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
