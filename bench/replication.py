"""Replication in a cluster of three brokers (ZooKeeper mode): what acks=all over three replicas costs, the end-to-end
latency at a steady rate, how long a partition stays unwritable when its leader is killed, and how long a controlled
shutdown takes.

    .venv/bin/python bench/replication.py                       # the four phases, about 17 minutes
    .venv/bin/python bench/replication.py --quick               # everything short: a smoke test (~1.5 minutes)
    .venv/bin/python bench/replication.py --phases failover --kills 5 --session-timeouts 6000
    .venv/bin/python bench/replication.py --write-report        # also write its section of docs/benchmarks.md
    PYTHONPATH=/elsewhere/src .venv/bin/python bench/replication.py   # the brokers of another checkout

Every cluster is real processes on 127.0.0.1: a standalone ZooKeeper from Debian's `zookeeper` package (started by
`Cluster.start_zookeeper` of src/tidelog/tools/cluster_up.py) and three `tidelog serve` brokers (`python -m
tidelog.cli serve --override ...` with this interpreter, so the tidelog PYTHONPATH points to is the one measured),
each with its own port and log dir in a fresh scratch directory; the clients are confluent_kafka (librdkafka) in
this process. Phases (`--phases`, default all):

  throughput  one cluster, topics `rf1` (replication factor 1) and `rf3` (3, min.insync.replicas=2), 3 partitions
              each, one leader per broker (explicit assignments). An idempotent acks=all producer (linger.ms=5)
              produces as fast as it can for --seconds to each topic in turn - rf1, rf3, rf1, rf3, to even out drift
              - after a short warm-up, once per value size (--sizes, 100 B and 1 KiB). Delivered messages/s and MB/s;
              rf3 as a share of rf1 (both rounds summed; target >= 50 %). The brokers' CPU seconds in each window
              (utime + stime from /proc/<pid>/stat) and this process's: three brokers share the machine's cores.
              They also share one disk: first the phase measures the disk's sustained append rate (disk_append_rate,
              16 s), and each window shows how fast the topic's .log files grew, all replicas, as a share of it.
              librdkafka's idempotent producer has one Produce request in flight per partition whenever a batch
              holds five messages or more (it counts the messages in flight against the five-request window), so
              each partition moves one batch per acks=all round trip: leader append, follower fetch and append,
              the follower's next fetch.
  latency     the same cluster: a producer thread paced at --rate messages/s (acks=all, linger.ms=1) puts its
              perf_counter_ns into each 100-byte value; a consumer thread (assigned, from the end) takes the
              receive time. --seconds of steady state after a warm-up; p50/p99/p99.9/max of receive - send (target
              p99 <= 10 ms) and of the acknowledgement, the achieved rate; rf1 is the reference of the same run.
              The producer never catches up more than 100 ms of missed sends: what it cannot send shows as a lower
              achieved rate, not as latency; it sends what is due at most once a millisecond. This process runs
              without cyclic garbage collection (as timeit does), so its own pauses are not counted as latency.
  failover    per session timeout in --session-timeouts (a fresh cluster each, `zookeeper.session.timeout.ms` on
              every broker): a 1-partition rf3 topic (min.insync.replicas=2) and an idempotent acks=all producer
              thread sending one message every 5 ms. --kills times: wait for steady acknowledgements, SIGKILL the
              partition's leader (read from its state znode), time the kill to the new leader in the znode, to the
              new leader's first acknowledgement of an acks=all Produce sent straight to it (again every 5 ms until
              one is acknowledged: the cluster's failover, target session timeout + 1 s), and to the producer's
              first acknowledgement of a message sent after the kill (librdkafka's own timers included); restart
              the broker on its port with its log dir, wait until the ISR holds three again. p50/p99/max.
  shutdown    a fresh cluster with the auto rebalance checking every 2 s at 0 % imbalance; a 6-partition rf3 topic,
              two preferred leaders per broker. --shutdowns times (brokers 1, 2, 3, 1, ... in turn): a producer
              (every 5 ms, acks=all) writes to a partition the broker leads; SIGTERM; the state znodes of its
              partitions polled every 5 ms until another broker leads all of them; the first acknowledgement of a
              message sent after the SIGTERM; the longest gap between two acknowledgements; then restart and wait
              until the ISRs are full and it leads its partitions again. p50/max; target < 1 s.

Every process started here is in its own session, dies with this script (PR_SET_PDEATHSIG) and is stopped at the end,
also after Ctrl-C or an error: the brokers with SIGKILL of their process group (their data is scratch), then
ZooKeeper. A broker's output is in the scratch dir while it runs; the end of it is printed when one fails to start.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import io
import itertools
import json
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_END, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from rich.console import Console

from benchutil import (
    BENCHMARKS_MD,
    REPO,
    GiB,
    add_dir_argument,
    console,
    machine_line,
    new_table,
    percent,
    print_machine,
    scratch_dir,
    source_revision,
    write_doc_section,
)
from tidelog.codec.record_batch import Record, build_batch
from tidelog.protocol.messages import ApiKey, build
from tidelog.tools.cluster_up import Cluster, ClusterUpError, ClusterUpOptions, zookeeper_missing

SECTION_HEADING = "## Replication (issue 13)"
PHASES = ("throughput", "latency", "failover", "shutdown")
READY = re.compile(r"tidelog broker ready on port\(s\) (\d+)")
BROKER_IDS = (1, 2, 3)
START_TIMEOUT_S = 90.0
WAIT_TIMEOUT_S = 120.0
POLL_S = 0.005  # how often the state znodes are read while a leader moves
DIRECT_PRODUCE_VERSION = 7  # the failover's direct Produce (acks=all)
DIRECT_TIMEOUT_S = 2.0
PACED_INTERVAL_S = 0.005  # the failover and shutdown producers: one message every 5 ms
STEADY_ACKS = 20  # acknowledgements in a row before a kill or a SIGTERM
LATENCY_LINGER_MS = 1
THROUGHPUT_LINGER_MS = 5
MIN_PAUSE_S = 0.001  # the paced producer sends what is due at most once a millisecond (linger.ms is 1 anyway)
FETCH_WAIT_MAX_MS = 100  # the latency consumer's wait at the broker when there is nothing new
CLK_TCK = os.sysconf("SC_CLK_TCK")
STAMP = struct.Struct(">q")

# Brokers settings of every cluster: a small __consumer_offsets (the latency consumer has a group id, and librdkafka
# looks its coordinator up even for an assigned consumer).
COMMON_SETTINGS = {"offsets.topic.num.partitions": "3", "offsets.topic.replication.factor": "3"}
SHUTDOWN_SETTINGS = {"leader.imbalance.check.interval.seconds": "2", "leader.imbalance.per.broker.percentage": "0"}


class BenchError(Exception):
    """A step that did not happen in time, or a process that died: the run stops (everything started is stopped)."""


# --- processes -----------------------------------------------------------------------------------------------------


def _child_setup() -> None:
    """In a broker before exec: the open-file limit at its hard limit, SIGKILL when this script dies."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (all its threads), from /proc/<pid>/stat; 0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


@dataclass
class Broker:
    """One `tidelog serve` of a cluster; restartable on the same port with the same log dir."""

    broker_id: int
    port: int
    log_dir: Path
    settings: dict[str, str]
    out: Path
    err: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "tidelog.cli", "serve"]
        overrides = {
            "broker.id": str(self.broker_id),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.log_dir),
            **self.settings,
        }
        for key, value in overrides.items():
            argv += ["--override", f"{key}={value}"]
        offset = self.out.stat().st_size if self.out.exists() else 0  # the ready line of this start, not an earlier
        with self.out.open("ab") as out, self.err.open("ab") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, preexec_fn=_child_setup, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            with self.out.open("rb") as out:
                out.seek(offset)
                if READY.search(out.read().decode(errors="replace")):
                    return
            time.sleep(0.05)
        status = self.proc.poll()
        self.kill()
        raise BenchError(
            f"broker {self.broker_id} did not start (exit status {status}) within {START_TIMEOUT_S:.0f} s; the end "
            f"of its stderr:\n{self.tail()}"
        )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)  # its own session: the process group is its pid

    def kill(self) -> None:
        """SIGKILL to its process group, and wait for it."""
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid) if self.alive and self.proc is not None else 0.0

    def tail(self, lines: int = 20) -> str:
        text = self.err.read_text(errors="replace") if self.err.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(nothing)"


class BenchCluster:
    """ZooKeeper and three brokers in `directory`; a context manager that always stops everything it started."""

    def __init__(self, directory: Path, settings: dict[str, str] | None = None) -> None:
        self.directory = directory
        self.settings = {**COMMON_SETTINGS, **(settings or {})}
        self.zookeeper = Cluster(ClusterUpOptions(brokers=0), directory, Console(quiet=True))
        self.brokers: dict[int, Broker] = {}
        self.zk: KazooClient | None = None

    def __enter__(self) -> BenchCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self.zookeeper.start_zookeeper()
            settings = {"zookeeper.connect": self.zookeeper.zookeeper_connect, **self.settings}
            for broker_id in BROKER_IDS:
                broker = Broker(
                    broker_id,
                    _free_port(),
                    self.directory / f"broker-{broker_id}",
                    settings,
                    self.directory / f"broker-{broker_id}.out",
                    self.directory / f"broker-{broker_id}.err",
                )
                self.brokers[broker_id] = broker
                broker.start()
            self.zk = KazooClient(hosts=self.zookeeper.zookeeper_connect)
            self.zk.start(timeout=START_TIMEOUT_S)
            wait_for(lambda: self.registered() == set(BROKER_IDS), "the three brokers in /brokers/ids", self)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.zk is not None:
            with contextlib.suppress(Exception):
                self.zk.stop()
                self.zk.close()
            self.zk = None
        for broker in self.brokers.values():
            broker.signal(signal.SIGKILL)
        for broker in self.brokers.values():
            broker.kill()
        self.zookeeper.stop()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers.values())

    def check_alive(self) -> None:
        if self.zookeeper.zookeeper is not None and self.zookeeper.zookeeper.proc.poll() is not None:
            raise BenchError(f"ZooKeeper exited:\n{self.zookeeper.zookeeper.tail()}")

    def registered(self) -> set[int]:
        assert self.zk is not None
        try:
            return {int(b) for b in self.zk.get_children("/brokers/ids")}
        except NoNodeError:
            return set()

    def endpoint(self, broker_id: int) -> tuple[str, int]:
        """(host, port) of the broker's PLAINTEXT listener, from its /brokers/ids znode."""
        assert self.zk is not None
        data, _ = self.zk.get(f"/brokers/ids/{broker_id}")
        host, _, port = json.loads(data)["endpoints"][0].removeprefix("PLAINTEXT://").rpartition(":")
        return host, int(port)

    def state(self, topic: str, partition: int) -> dict[str, Any]:
        """The partition's state znode ({} before the controller wrote it)."""
        assert self.zk is not None
        try:
            data, _ = self.zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")
        except NoNodeError:
            return {}
        value = json.loads(data)
        return value if isinstance(value, dict) else {}

    def leads(self, broker_id: int, topic: str, partitions: list[int]) -> bool:
        return all(self.state(topic, p).get("leader") == broker_id for p in partitions)

    def full_isr(self, topic: str, partitions: int) -> bool:
        return all(sorted(self.state(topic, p).get("isr", [])) == list(BROKER_IDS) for p in range(partitions))

    def create_topic(self, topic: str, assignment: list[list[int]], config: dict[str, str] | None = None) -> None:
        """A topic with an explicit replica assignment; returns once every partition has its full ISR."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(topic, len(assignment), replica_assignment=assignment, config=config or {})
        admin.create_topics([new], operation_timeout=60)[topic].result(timeout=90)
        size = len(assignment[0])
        wait_for(
            lambda: all(
                len(self.state(topic, p).get("isr", [])) == size and self.state(topic, p).get("leader", -1) >= 0
                for p in range(len(assignment))
            ),
            f"the leaders and ISRs of {topic}",
            self,
        )

    def broker_cpu(self) -> dict[int, float]:
        return {broker_id: broker.cpu_seconds() for broker_id, broker in self.brokers.items()}


def wait_for(
    condition: Callable[[], bool], what: str, cluster: BenchCluster | None = None, timeout_s: float = WAIT_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if cluster is not None:
            cluster.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"no {what} after {timeout_s:.0f} s")
        time.sleep(0.05)


def spread(partitions: int, replicas: int) -> list[list[int]]:
    """Partition p led by broker p % 3 + 1, its followers the next ones; with 6 partitions the second three take
    the followers in the other order, so each broker follows each other one."""
    assignment = []
    for p in range(partitions):
        step = 1 if p < 3 else 2
        assignment.append([(p + step * r) % 3 + 1 for r in range(replicas)])
    return assignment


# --- results ---------------------------------------------------------------------------------------------------


@dataclass
class Target:
    what: str
    goal: str
    value: str
    met: bool


@dataclass
class PhaseResult:
    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]
    summary: str
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def show(self) -> None:
        table = new_table(self.title, *self.columns)
        for row in self.rows:
            table.add_row(*row)
        console.print(table)
        for note in self.notes:
            console.print(f"note: {note}")
        for target in self.targets:
            mark = "[green]met[/]" if target.met else "[red]not met[/]"
            console.print(f"target {target.what} {target.goal}: {target.value} - {mark}")
        console.print(f"[bold]summary[/] {self.summary}")

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |"]
        lines.append("|---|" + "---:|" * (len(self.columns) - 1))
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines.append("")
        lines += [f"- {note}" for note in self.notes]
        for target in self.targets:
            lines.append(f"- target {target.what} {target.goal}: {target.value}, {'met' if target.met else 'NOT met'}")
        lines.append(f"- {self.summary}")
        return "\n".join(lines)


def pct(values_ns: np.ndarray, q: float) -> float:
    return float(np.percentile(values_ns, q)) / 1e6 if len(values_ns) else float("nan")


def fmt_ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def fmt_s(value_ns: float) -> str:
    return f"{value_ns / 1e9:.2f}"


# --- phase 1: throughput ---------------------------------------------------------------------------------------


@dataclass
class Window:
    messages: int
    seconds: float
    broker_cpu: dict[int, float]
    client_cpu: float
    errors: int
    log_bytes: int  # what the brokers' .log files of the topic grew by in the window, all replicas


DISK_PROBE_FILES = 9  # as many files as the rf3 topic's replicas: three partitions on each of three brokers
DISK_PROBE_CHUNK = 1 << 20  # about the size of one producer batch (librdkafka's batch.size)


def log_bytes(cluster: BenchCluster, topic: str) -> int:
    """The bytes in the `.log` files of `topic`'s replicas, all brokers."""
    return sum(
        path.stat().st_size for broker in cluster.brokers.values() for path in broker.log_dir.glob(f"{topic}-*/*.log")
    )


def disk_append_rate(directory: Path, seconds: float) -> float:
    """The disk's sustained append rate in bytes/s: 1 MiB pwritev calls round-robin over DISK_PROBE_FILES new
    files in `directory`, as fast as they go, for `seconds`; the rate of the second half, once the page cache has
    taken what it takes before the kernel paces writers to the disk (on the AMD VM a 1 MiB append goes from 0.2
    to 2.4 ms once about 1.5 GB are dirty)."""
    chunk = os.urandom(DISK_PROBE_CHUNK)
    paths = [directory / f"disk-probe-{i}.log" for i in range(DISK_PROBE_FILES)]
    fds = [os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644) for path in paths]
    try:
        positions = [0] * len(fds)
        start = time.perf_counter()
        half, written_at_half = start + seconds / 2, 0
        count = 0
        while (now := time.perf_counter()) < start + seconds:
            if written_at_half == 0 and now >= half:
                half, written_at_half = now, count * DISK_PROBE_CHUNK
            index = count % len(fds)
            positions[index] += os.pwritev(fds[index], [chunk], positions[index])
            count += 1
        return (count * DISK_PROBE_CHUNK - written_at_half) / (time.perf_counter() - half)
    finally:
        for fd in fds:
            os.close(fd)
        for path in paths:
            path.unlink()


def produce_flat_out(cluster: BenchCluster, topic: str, size: int, seconds: float, warmup_s: float) -> Window:
    """An idempotent acks=all producer as fast as it can; the messages acknowledged within the measured window."""
    delivered = [0]
    errors: list[str] = []

    def on_delivery(err: Any, _message: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered[0] += 1

    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": THROUGHPUT_LINGER_MS,
            "message.timeout.ms": 120_000,
        }
    )
    value = os.urandom(size)
    produce = producer.produce

    def run_until(deadline: float) -> None:
        sent = 0
        while time.perf_counter() < deadline:
            try:
                produce(topic, value, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.005)
                continue
            sent += 1
            if sent % 256 == 0:
                producer.poll(0)
        producer.poll(0)

    run_until(time.perf_counter() + warmup_s)
    bytes0 = log_bytes(cluster, topic)
    cpu0, client0, n0, t0 = cluster.broker_cpu(), time.process_time(), delivered[0], time.perf_counter()
    run_until(t0 + seconds)
    cpu1, client1, n1, t1 = cluster.broker_cpu(), time.process_time(), delivered[0], time.perf_counter()
    bytes1 = log_bytes(cluster, topic)
    remaining = producer.flush(120)
    if remaining:
        raise BenchError(f"{remaining} messages to {topic} neither acknowledged nor failed after 120 s")
    if errors:
        console.print(f"note: {len(errors)} deliveries to {topic} failed, the first: {errors[0]}")
    return Window(
        n1 - n0, t1 - t0, {b: cpu1[b] - cpu0.get(b, 0.0) for b in cpu1}, client1 - client0, len(errors), bytes1 - bytes0
    )


def phase_throughput(cluster: BenchCluster, args: argparse.Namespace) -> PhaseResult:
    rows = []
    totals: dict[tuple[int, str], list[float]] = {}
    notes = []
    with console.status("throughput: the disk's sustained append rate …"):
        disk_rate = disk_append_rate(cluster.directory, args.disk_seconds)
    for size in args.sizes:
        for round_index in (1, 2):
            for topic in ("rf1", "rf3"):
                with console.status(f"throughput: {size} B to {topic}, round {round_index} …"):
                    window = produce_flat_out(cluster, topic, size, args.seconds, args.warmup)
                rate = window.messages / window.seconds
                mb = rate * size / 1e6
                total = totals.setdefault((size, topic), [0.0, 0.0, 0.0, 0.0])
                total[0] += window.messages
                total[1] += window.seconds
                total[2] += sum(window.broker_cpu.values())
                total[3] += window.log_bytes
                log_rate = window.log_bytes / window.seconds
                cpu = "/".join(f"{window.broker_cpu[b]:.1f}" for b in BROKER_IDS)
                rows.append(
                    [
                        f"{size} B",
                        topic,
                        str(round_index),
                        f"{rate:,.0f}",
                        f"{mb:.2f}",
                        f"{log_rate / 1e6:.0f} ({percent(log_rate, disk_rate)})",
                        f"{sum(window.broker_cpu.values()):.1f} ({cpu})",
                        f"{window.client_cpu:.1f}",
                    ]
                )
                if window.errors:
                    notes.append(f"{window.errors} failed deliveries to {topic} ({size} B, round {round_index})")
    targets = []
    parts = []
    for size in args.sizes:
        rf1, rf3 = totals[(size, "rf1")], totals[(size, "rf3")]
        rate1, rate3 = rf1[0] / rf1[1], rf3[0] / rf3[1]
        share = rate3 / rate1 if rate1 else 0.0
        cpu_per_msg1 = rf1[2] / rf1[0] * 1e6 if rf1[0] else float("nan")
        cpu_per_msg3 = rf3[2] / rf3[0] * 1e6 if rf3[0] else float("nan")
        rows.append(
            [
                f"{size} B",
                "rf3 ÷ rf1",
                "both",
                percent(rate3, rate1),
                percent(rate3, rate1),
                f"{rf3[3] / rf3[1] / 1e6:.0f} vs {rf1[3] / rf1[1] / 1e6:.0f}",
                f"{cpu_per_msg3:.0f} vs {cpu_per_msg1:.0f} µs/msg",
                "",
            ]
        )
        targets.append(Target(f"rf3 throughput, {size} B", ">= 50 % of rf1", percent(rate3, rate1), share >= 0.5))
        parts.append(f"{size} B: rf1 {rate1:,.0f} msg/s, rf3 {rate3:,.0f} msg/s ({percent(rate3, rate1)})")
    columns = (
        "value",
        "topic",
        "round",
        "msgs/s",
        "MB/s",
        "log MB/s (of disk)",
        "brokers CPU s (1/2/3)",
        "client CPU s",
    )
    title = f"Throughput, acks=all, idempotent, linger.ms={THROUGHPUT_LINGER_MS}, {args.seconds:g} s windows"
    notes.append(
        "brokers CPU s: utime + stime of the three broker processes in the window (in the ratio rows: broker CPU "
        "microseconds per delivered message, rf3 vs rf1); the machine has "
        f"{os.cpu_count()} cores for the brokers, ZooKeeper and the client"
    )
    notes.append(
        "client CPU s: this process (the Python produce() loop and librdkafka's threads); close to the window's "
        "seconds, the client rather than the brokers set the pace, and rf3 ÷ rf1 says little about replication"
    )
    notes.append(
        f"log MB/s: what the topic's .log files grew by per second, all replicas (rf3 writes each record three "
        f"times), as a share of the disk's sustained append rate measured at the start of this phase: "
        f"{disk_rate / 1e6:,.0f} MB/s ({DISK_PROBE_FILES} files, {DISK_PROBE_CHUNK >> 20} MiB pwritev, the second "
        f"half of {args.disk_seconds:g} s); near 100 % the disk, not the brokers, set the pace"
    )
    return PhaseResult(title, columns, rows, "throughput: " + "; ".join(parts), targets, notes)


# --- phase 2: latency ------------------------------------------------------------------------------------------


class PacedProducer(threading.Thread):
    """Sends `rate` messages/s (acks=all, idempotent) with perf_counter_ns in the first 8 bytes of each value; keeps
    (send, ack) perf_counter_ns of every acknowledged message. Never catches up more than 100 ms of missed sends."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate: float,
        size: int = 100,
        partition: int | None = None,
        linger_ms: int = LATENCY_LINGER_MS,
    ) -> None:
        super().__init__(name=f"producer-{topic}", daemon=True)
        self.topic = topic
        self.rate = rate
        self.partition = partition
        self.padding = b"\0" * (size - STAMP.size)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": linger_ms,
                "message.timeout.ms": 600_000,
                "log_level": 2,  # not the connection errors of every kill and SIGTERM (level 3)
            }
        )
        self.sent: list[int] = []  # send times
        self.acks: list[tuple[int, int]] = []  # (send, ack)
        self.errors: list[str] = []
        self.skipped = 0  # sends given up because the thread fell behind
        self.failure: BaseException | None = None
        self._stopping = threading.Event()

    def _delivered(self, err: Any, message: Any) -> None:
        now = time.perf_counter_ns()
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acks.append((STAMP.unpack_from(message.value())[0], now))

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.failure = exc

    def _run(self) -> None:
        interval_ns = 1e9 / self.rate
        max_behind = max(1, int(self.rate * 0.1))
        start = time.perf_counter_ns()
        done = 0
        partition = -1 if self.partition is None else self.partition  # -1: the client's partitioner
        while not self._stopping.is_set():
            due = int((time.perf_counter_ns() - start) / interval_ns) + 1
            if due - done > max_behind:
                self.skipped += due - done - max_behind
                done = due - max_behind
            while done < due:
                now = time.perf_counter_ns()
                try:
                    self.producer.produce(
                        self.topic, STAMP.pack(now) + self.padding, partition=partition, on_delivery=self._delivered
                    )
                except BufferError:
                    break
                self.sent.append(now)
                done += 1
            self.producer.poll(0)
            next_due = start + done * interval_ns
            pause = (next_due - time.perf_counter_ns()) / 1e9
            time.sleep(min(max(pause, MIN_PAUSE_S), 0.01))

    def stop(self) -> None:
        self._stopping.set()
        if self.ident is not None:  # started
            self.join(30)
        remaining = self.producer.flush(120)
        if self.failure is not None:
            raise BenchError(f"the producer of {self.topic} failed: {self.failure!r}") from self.failure
        if remaining:
            raise BenchError(f"{remaining} messages to {self.topic} neither acknowledged nor failed after 120 s")

    def has_ack_since(self, start_ns: int, first_index: int) -> bool:
        return self.acked_since(start_ns, first_index) is not None

    def acked_since(self, start_ns: int, first_index: int = 0) -> tuple[int, int] | None:
        """The first acknowledgement (send, ack) of a message sent at or after `start_ns`, if any yet; acks come in
        send order on a partition, and none before `first_index` is looked at."""
        for sent, acked in self.acks[first_index:]:
            if sent >= start_ns:
                return sent, acked
        return None


class Receiver(threading.Thread):
    """An assigned consumer from the end of each partition; keeps (send, receive) perf_counter_ns per message."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name=f"consumer-{topic}", daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-latency-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
        self.received: list[tuple[int, int]] = []
        self.failure: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                # poll() returns at the first message; consume(n, timeout) would wait for n or the timeout
                first = self.consumer.poll(0.05)
                if first is None:
                    continue
                now = time.perf_counter_ns()
                for message in [first, *self.consumer.consume(1000, 0)]:
                    value = message.value()
                    if message.error() is None and value is not None:
                        self.received.append((STAMP.unpack_from(value)[0], now))
        except BaseException as exc:  # reported by the main thread
            self.failure = exc

    def stop(self) -> None:
        self._stopping.set()
        if self.ident is not None:  # started
            self.join(30)
        self.consumer.close()
        if self.failure is not None:
            raise BenchError(f"the consumer failed: {self.failure!r}") from self.failure


@dataclass
class LatencyRun:
    topic: str
    sent: int
    acked: int
    seconds: float
    skipped: int
    end_to_end: np.ndarray
    ack: np.ndarray
    missing: int
    broker_cpu: float
    client_cpu: float


def measure_latency(cluster: BenchCluster, topic: str, args: argparse.Namespace) -> LatencyRun:
    receiver = Receiver(cluster.bootstrap, topic, 3)
    receiver.start()
    try:
        producer = PacedProducer(cluster.bootstrap, topic, args.rate)
        try:
            time.sleep(1.0)  # the consumer finds the end of the partitions
            producer.start()
            time.sleep(args.warmup)
            cpu0, client0, start = sum(cluster.broker_cpu().values()), time.process_time(), time.perf_counter_ns()
            time.sleep(args.seconds)
            end, client1, cpu1 = time.perf_counter_ns(), time.process_time(), sum(cluster.broker_cpu().values())
            skipped_in_window = producer.skipped
        finally:
            producer.stop()
        window_acks = [(s, a) for s, a in producer.acks if start <= s < end]
        wanted = {s for s, _ in window_acks}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if len(wanted.intersection(s for s, _ in receiver.received)) >= len(wanted):
                break
            time.sleep(0.2)
    finally:
        receiver.stop()
    received = {s: r for s, r in receiver.received if start <= s < end}
    sent = sum(1 for s in producer.sent if start <= s < end)
    return LatencyRun(
        topic=topic,
        sent=sent,
        acked=len(window_acks),
        seconds=(end - start) / 1e9,
        skipped=skipped_in_window,
        end_to_end=np.fromiter((r - s for s, r in received.items()), dtype=np.int64),
        ack=np.fromiter((a - s for s, a in window_acks), dtype=np.int64),
        missing=len(wanted - received.keys()),
        broker_cpu=cpu1 - cpu0,
        client_cpu=client1 - client0,
    )


def phase_latency(cluster: BenchCluster, args: argparse.Namespace) -> PhaseResult:
    runs = []
    for topic in ("rf1", "rf3"):
        with console.status(f"latency: {args.rate:,.0f} msg/s to {topic} …"):
            runs.append(measure_latency(cluster, topic, args))
    rows = []
    for run in runs:
        e2e = run.end_to_end
        rows.append(
            [
                run.topic,
                f"{run.sent / run.seconds:,.0f}",
                f"{run.acked / run.seconds:,.0f}",
                fmt_ms(pct(e2e, 50)),
                fmt_ms(pct(e2e, 99)),
                fmt_ms(pct(e2e, 99.9)),
                fmt_ms(float(e2e.max()) / 1e6 if len(e2e) else float("nan")),
                f"{fmt_ms(pct(run.ack, 50))} / {fmt_ms(pct(run.ack, 99))}",
                f"{run.broker_cpu:.1f}",
                f"{run.client_cpu:.1f}",
            ]
        )
    ref, rf3 = runs
    notes = []
    for run in runs:
        if run.missing:
            notes.append(f"{run.topic}: {run.missing} acknowledged messages of the window never reached the consumer")
        if run.sent < 0.95 * args.rate * run.seconds:
            notes.append(
                f"{run.topic}: the producer sent {run.sent / run.seconds:,.0f} msg/s, not {args.rate:,.0f} "
                f"({run.skipped:,} sends skipped when it fell behind): this machine could not hold the rate"
            )
    p99 = pct(rf3.end_to_end, 99)
    p99_ref = pct(ref.end_to_end, 99)
    targets = [Target("rf3 end-to-end p99", "<= 10 ms", f"{fmt_ms(p99)} ms", p99 <= 10.0)]
    columns = (
        "topic",
        "sent msg/s",
        "acked msg/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "ack p50 / p99 ms",
        "brokers CPU s",
        "client CPU s",
    )
    notes.append(
        "brokers CPU s / client CPU s: the three brokers' utime + stime in the window, and this process's (the "
        "paced producer, the consumer and librdkafka's threads); all share the machine's cores, ZooKeeper too"
    )
    title = (
        f"End-to-end latency at {args.rate:,.0f} msg/s (acks=all, linger.ms={LATENCY_LINGER_MS}, 100 B), "
        f"{args.seconds:g} s after {args.warmup:g} s of warm-up"
    )
    summary = (
        f"latency: rf3 p50 {fmt_ms(pct(rf3.end_to_end, 50))} ms, p99 {fmt_ms(p99)} ms "
        f"(rf1 p99 {fmt_ms(p99_ref)} ms, rf3 {p99 / p99_ref:.1f}x) at {rf3.sent / rf3.seconds:,.0f} msg/s sent"
    )
    return PhaseResult(title, columns, rows, summary, targets, notes)


# --- phase 3: failover -----------------------------------------------------------------------------------------


def wait_steady(producer: PacedProducer, cluster: BenchCluster, what: str) -> None:
    """Until STEADY_ACKS more acknowledgements have come in."""
    count = len(producer.acks)
    wait_for(lambda: len(producer.acks) >= count + STEADY_ACKS, f"steady acknowledgements {what}", cluster)
    if producer.failure is not None:
        raise BenchError(f"the producer failed: {producer.failure!r}")


def produce_directly(host: str, port: int, topic: str, partition: int, timeout_s: float) -> int:
    """One Produce (acks=all, one record, not idempotent) over a fresh socket; the partition's error code (-1: the
    connection failed). What any Kafka client sends once its metadata names the leader, without the client's own
    timers around it."""
    request_cls = load_request_schema(ApiKey.PRODUCE, DIRECT_PRODUCE_VERSION)
    buffer = io.BytesIO()
    header = {
        "request_api_key": ApiKey.PRODUCE,
        "request_api_version": DIRECT_PRODUCE_VERSION,
        "correlation_id": 1,
        "client_id": "bench-direct",
    }
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": int(timeout_s * 1000),
        "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": build_batch([Record(b"direct")])}]}
        ],
    }
    entity_writer(request_cls.__header_schema__)(buffer, build(request_cls.__header_schema__, header))
    entity_writer(request_cls)(buffer, build(request_cls, body))
    payload = buffer.getvalue()
    try:
        with socket.create_connection((host, port), timeout=timeout_s + 5) as sock:
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            (size,) = struct.unpack(">i", _read_exactly(sock, 4))
            data = _read_exactly(sock, size)
    except OSError:
        return -1
    response_cls = load_response_schema(ApiKey.PRODUCE, DIRECT_PRODUCE_VERSION)
    _header, offset = entity_reader(response_cls.__header_schema__)(data, 0)
    response, _ = entity_reader(response_cls)(data, offset)
    return int(response.responses[0].partition_responses[0].error_code)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


def first_direct_ack(cluster: BenchCluster, topic: str, leader: int, deadline_s: float) -> int:
    """Produce to `leader` directly every POLL_S until it acknowledges (acks=all); perf_counter_ns of the ack."""
    host, port = cluster.endpoint(leader)
    deadline = time.monotonic() + deadline_s
    while True:
        if produce_directly(host, port, topic, 0, DIRECT_TIMEOUT_S) == 0:
            return time.perf_counter_ns()
        if time.monotonic() > deadline:
            raise BenchError(f"broker {leader} did not acknowledge a produce to {topic}-0 in {deadline_s:g} s")
        time.sleep(POLL_S)


def failover_run(scratch: Path, session_ms: int, kills: int) -> list[tuple[int, int, int]]:
    """(kill → new leader in the znode, → its first acknowledgement of a produce sent to it directly, → the
    librdkafka producer's first acknowledgement of a message sent after the kill) in ns."""
    topic = "failover"
    timings = []
    settings = {"zookeeper.session.timeout.ms": str(session_ms)}
    with BenchCluster(scratch / f"failover-{session_ms}", settings) as cluster:
        cluster.create_topic(topic, [[1, 2, 3]], {"min.insync.replicas": "2"})
        producer = PacedProducer(cluster.bootstrap, topic, 1 / PACED_INTERVAL_S, partition=0, linger_ms=0)
        producer.start()
        try:
            for kill in range(kills):
                wait_steady(producer, cluster, f"before kill {kill + 1}")
                victim = cluster.state(topic, 0)["leader"]
                with console.status(f"failover, session {session_ms} ms: kill {kill + 1}/{kills} (broker {victim}) …"):
                    index = len(producer.acks)
                    killed = time.perf_counter_ns()
                    cluster.brokers[victim].kill()
                    elected = wait_leader_moved(cluster, topic, [0], victim, session_ms / 1000 + 60)
                    direct = first_direct_ack(cluster, topic, cluster.state(topic, 0)["leader"], 60)
                    wait_for(
                        functools.partial(producer.has_ack_since, killed, index),
                        f"an acknowledgement after kill {kill + 1}",
                        cluster,
                    )
                    first = producer.acked_since(killed, index)
                    assert first is not None
                    timings.append((elected - killed, direct - killed, first[1] - killed))
                    cluster.brokers[victim].start()
                    wait_for(lambda: cluster.full_isr(topic, 1), f"the full ISR after kill {kill + 1}", cluster)
                console.print(
                    f"  kill {kill + 1}: broker {victim}, new leader after {fmt_s(elected - killed)} s, its first "
                    f"acknowledgement after {fmt_s(direct - killed)} s, librdkafka's after {fmt_s(first[1] - killed)} s"
                )
        finally:
            producer.stop()
        if producer.errors:
            console.print(f"note: {len(producer.errors)} deliveries failed, the first: {producer.errors[0]}")
    return timings


def wait_leader_moved(cluster: BenchCluster, topic: str, partitions: list[int], old: int, timeout_s: float) -> int:
    """Poll the state znodes every POLL_S until each partition has a live leader other than `old`; perf_counter_ns."""
    deadline = time.monotonic() + timeout_s
    pending = list(partitions)
    while pending:
        pending = [p for p in pending if cluster.state(topic, p).get("leader", -1) in (old, -1)]
        if not pending:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"partitions {pending} of {topic} still led by {old} (or by nobody) after {timeout_s} s")
        time.sleep(POLL_S)
    return time.perf_counter_ns()


def phase_failover(scratch: Path, args: argparse.Namespace) -> PhaseResult:
    rows = []
    targets = []
    parts = []
    for session_ms in args.session_timeouts:
        timings = failover_run(scratch, session_ms, args.kills)
        elected, direct, client = (np.asarray([t[i] for t in timings], dtype=np.int64) for i in range(3))
        limit_s = session_ms / 1000 + 1
        rows.append(
            [
                f"{session_ms:,}",
                str(len(timings)),
                f"{pct(elected, 50) / 1e3:.2f} / {float(elected.max()) / 1e9:.2f}",
                f"{pct(direct, 50) / 1e3:.2f} / {pct(direct, 99) / 1e3:.2f} / {float(direct.max()) / 1e9:.2f}",
                f"{pct(client, 50) / 1e3:.2f} / {pct(client, 99) / 1e3:.2f} / {float(client.max()) / 1e9:.2f}",
                f"{limit_s:g}",
            ]
        )
        worst = float(direct.max()) / 1e9
        targets.append(
            Target(
                f"failover, session {session_ms:,} ms", f"<= {limit_s:g} s (max)", f"{worst:.2f} s", worst <= limit_s
            )
        )
        parts.append(
            f"session {session_ms:,} ms: first ack on the new leader p50 {pct(direct, 50) / 1e3:.2f} s, max "
            f"{worst:.2f} s (librdkafka's p50 {pct(client, 50) / 1e3:.2f} s, max {float(client.max()) / 1e9:.2f} s)"
        )
    columns = (
        "session timeout ms",
        "kills",
        "new leader p50 / max s",
        "first ack on it p50 / p99 / max s",
        "librdkafka's first ack p50 / p99 / max s",
        "target s",
    )
    title = "Failover: SIGKILL of the leader (1 partition, rf3, min.insync.replicas=2) → first acks=all produce"
    notes = [
        "new leader: the state znode names another broker. ZooKeeper counts a session from the broker's last "
        "contact and expires it on its ticks (tickTime 500 in the zoo.cfg of src/tidelog/tools/cluster_up.py), so "
        "the new leader comes from a little before to about 0.5 s after the session timeout",
        "first ack on it: a Produce (acks=all) sent straight to the broker the znode names, again every 5 ms until "
        "it is acknowledged - the cluster's failover, what any client sees once its metadata names the new leader "
        "(the target is measured here)",
        "librdkafka's first ack: of a message sent after the kill by an idempotent acks=all producer on its default "
        "settings (one message every 5 ms). librdkafka asks for metadata again once a second while a partition's "
        "leader is down, and when the same answer both names the new leader and drops the dead broker, it may "
        "drop the partition's new leader with the dead broker's handle and find it on the next one-second query: "
        "up to two seconds more, which it spends against any Kafka cluster",
    ]
    return PhaseResult(title, columns, rows, "failover: " + "; ".join(parts), targets, notes)


# --- phase 4: controlled shutdown ------------------------------------------------------------------------------


def phase_shutdown(scratch: Path, args: argparse.Namespace) -> PhaseResult:
    topic = "shutdown"
    assignment = spread(6, 3)
    moved_ns: list[int] = []
    acked_ns: list[int] = []
    gap_ns: list[int] = []
    rows = []
    with BenchCluster(scratch / "shutdown", SHUTDOWN_SETTINGS) as cluster:
        cluster.create_topic(topic, assignment, {"min.insync.replicas": "2"})
        for index in range(args.shutdowns):
            victim = BROKER_IDS[index % len(BROKER_IDS)]
            preferred = [p for p, replicas in enumerate(assignment) if replicas[0] == victim]
            wait_for(
                functools.partial(cluster.leads, victim, topic, preferred),
                f"broker {victim} leading its preferred partitions",
                cluster,
            )
            producer = PacedProducer(
                cluster.bootstrap, topic, 1 / PACED_INTERVAL_S, partition=preferred[0], linger_ms=0
            )
            producer.start()
            try:
                wait_steady(producer, cluster, f"before SIGTERM {index + 1}")
                with console.status(f"controlled shutdown {index + 1}/{args.shutdowns} of broker {victim} …"):
                    broker = cluster.brokers[victim]
                    stopped = time.perf_counter_ns()
                    broker.signal(signal.SIGTERM)
                    moved = wait_leader_moved(cluster, topic, preferred, victim, 60)
                    wait_for(
                        functools.partial(producer.has_ack_since, stopped, 0),
                        f"an acknowledgement after SIGTERM {index + 1}",
                        cluster,
                    )
                    first = producer.acked_since(stopped)
                    assert first is not None
                    assert broker.proc is not None
                    broker.proc.wait(60)
                    exited = time.perf_counter_ns()
                    time.sleep(1.0)  # acknowledgements after the move, for the gap
            finally:
                producer.stop()
            acks = sorted(a for _, a in producer.acks)
            around = [a for a in acks if stopped - 1_000_000_000 <= a <= moved + 1_000_000_000]
            gap = max((b - a for a, b in itertools.pairwise(around)), default=0)
            moved_ns.append(moved - stopped)
            acked_ns.append(first[1] - stopped)
            gap_ns.append(gap)
            rows.append(
                [
                    str(index + 1),
                    str(victim),
                    ",".join(map(str, preferred)),
                    fmt_ms((moved - stopped) / 1e6),
                    fmt_ms((first[1] - stopped) / 1e6),
                    fmt_ms(gap / 1e6),
                    fmt_ms((exited - stopped) / 1e6),
                ]
            )
            console.print(
                f"  SIGTERM {index + 1}: broker {victim}, leadership moved after {fmt_ms((moved - stopped) / 1e6)} ms, "
                f"first acknowledgement after {fmt_ms((first[1] - stopped) / 1e6)} ms"
            )
            with console.status(f"restarting broker {victim}, waiting for the ISRs …"):
                broker.start()
                wait_for(lambda: cluster.full_isr(topic, len(assignment)), "the full ISRs after the restart", cluster)
    moved_arr, acked_arr, gap_arr = (np.asarray(v, dtype=np.int64) for v in (moved_ns, acked_ns, gap_ns))
    rows.append(
        [
            "p50",
            "",
            "",
            fmt_ms(pct(moved_arr, 50)),
            fmt_ms(pct(acked_arr, 50)),
            fmt_ms(pct(gap_arr, 50)),
            "",
        ]
    )
    rows.append(
        [
            "max",
            "",
            "",
            fmt_ms(float(moved_arr.max()) / 1e6),
            fmt_ms(float(acked_arr.max()) / 1e6),
            fmt_ms(float(gap_arr.max()) / 1e6),
            "",
        ]
    )
    worst_moved, worst_acked = float(moved_arr.max()) / 1e6, float(acked_arr.max()) / 1e6
    targets = [
        Target("SIGTERM → leadership moved", "< 1 s (max)", f"{fmt_ms(worst_moved)} ms", worst_moved < 1000),
        Target("SIGTERM → first acknowledgement", "< 1 s (max)", f"{fmt_ms(worst_acked)} ms", worst_acked < 1000),
    ]
    columns = (
        "#",
        "broker",
        "its partitions",
        "leaders moved ms",
        "first ack ms",
        "longest ack gap ms",
        "process exit ms",
    )
    title = "Controlled shutdown (SIGTERM) of a broker leading 2 of 6 partitions (rf3), times from the SIGTERM"
    notes = [
        "leaders moved: the last of its partitions' state znodes naming another leader (polled every 5 ms); first "
        "ack: of a message sent after the SIGTERM to one of its partitions (one every 5 ms, acks=all); longest ack "
        "gap: between two acknowledgements from 1 s before the SIGTERM to 1 s after the move"
    ]
    summary = (
        f"controlled shutdown: leadership moved p50 {fmt_ms(pct(moved_arr, 50))} ms, max {fmt_ms(worst_moved)} ms; "
        f"first acknowledgement p50 {fmt_ms(pct(acked_arr, 50))} ms, max {fmt_ms(worst_acked)} ms; longest gap "
        f"between acknowledgements max {fmt_ms(float(gap_arr.max()) / 1e6)} ms"
    )
    return PhaseResult(title, columns, rows, summary, targets, notes)


# --- the command -----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="everything short (2 s windows, 2 kills, 2 shutdowns)")
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)} (default: all)"
    )
    parser.add_argument("--seconds", type=float, help="each throughput and latency window (default 15; quick 2)")
    parser.add_argument("--kills", type=int, help="leader kills per session timeout (default 20; quick 2)")
    parser.add_argument(
        "--session-timeouts",
        help="zookeeper.session.timeout.ms values, comma-separated (default 18000,6000; quick 6000)",
    )
    parser.add_argument("--shutdowns", type=int, help="controlled shutdowns (default 5; quick 2)")
    parser.add_argument("--rate", type=float, default=10_000, help="the latency producer's msg/s (default 10000)")
    parser.add_argument("--sizes", default="100,1024", help="value sizes of the throughput phase (default 100,1024)")
    parser.add_argument(
        "--write-report",
        action="store_true",
        help=f"write (or replace) the section “{SECTION_HEADING[3:]}” of {BENCHMARKS_MD.relative_to(REPO)}",
    )
    add_dir_argument(parser)
    args = parser.parse_args(argv)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in args.phases if p not in PHASES]
    if unknown or not args.phases:
        parser.error(f"--phases: unknown {', '.join(unknown) or '(none)'}; pick from {', '.join(PHASES)}")
    quick = args.quick
    args.seconds = args.seconds if args.seconds is not None else (2.0 if quick else 15.0)
    args.warmup = 0.5 if quick else 2.0
    args.disk_seconds = 2.0 if quick else 16.0
    args.kills = args.kills if args.kills is not None else (2 if quick else 20)
    args.shutdowns = args.shutdowns if args.shutdowns is not None else (2 if quick else 5)
    timeouts = args.session_timeouts or ("6000" if quick else "18000,6000")
    try:
        args.session_timeouts = [int(t) for t in timeouts.split(",") if t.strip()]
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--session-timeouts and --sizes take comma-separated integers")
    if args.seconds <= 0 or args.kills < 1 or args.shutdowns < 1 or args.rate <= 0:
        parser.error("--seconds, --kills, --shutdowns and --rate must be positive")
    if any(s < STAMP.size for s in args.sizes) or not args.sizes:
        parser.error(f"--sizes: each at least {STAMP.size}")
    if any(t < 1000 or t > 60000 for t in args.session_timeouts) or not args.session_timeouts:
        parser.error("--session-timeouts: between 1000 and 60000 (ZooKeeper's bounds in cluster_up's zoo.cfg)")
    return args


def markdown_section(results: list[PhaseResult], facts: dict[str, str]) -> str:
    targets = [t for r in results for t in r.targets]
    verdicts = "\n".join(f"| {t.what} | {t.goal} | {t.value} | {'yes' if t.met else '**no**'} |" for t in targets)
    tables = "\n\n".join(r.markdown() for r in results)
    return f"""{SECTION_HEADING}

```
make bench-replication     # = .venv/bin/python bench/replication.py --write-report
```

Three brokers and a ZooKeeper on one machine (127.0.0.1, each broker its own log dir), librdkafka clients in the
benchmark process; how each phase is measured is in the docstring of `bench/replication.py`. The three brokers,
ZooKeeper and the clients share the machine's cores, so the broker CPU seconds are shown with the throughput.

Command: `{facts["command"]}`, run {facts["started"]}; tidelog {facts["revision"]}.
Machine: {facts["machine"]}. Load average {facts["load"]} at the start.

| target | goal | measured | met |
|---|---|---|---|
{verdicts}

{tables}"""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises SystemExit, so every `finally` runs and the clusters are stopped."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # As timeit does: no cyclic garbage collection in the measuring process. The clients keep a tuple per message,
    # and a full collection walking them would stall the producer and consumer threads for tens of milliseconds,
    # which the latency phase would report as the brokers' latency. (Nothing here builds reference cycles that
    # matter: the process ends after the run.)
    gc.disable()
    missing = zookeeper_missing()
    if missing:
        console.print(f"[bold red]Cannot run:[/] {missing}. `make system-deps` installs it.")
        return 2
    facts = {
        "command": "python bench/replication.py" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
        "started": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_line(),
        "revision": source_revision(),
        "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    results: list[PhaseResult] = []
    needed = 2 * GiB if "throughput" in args.phases else 256 << 20
    with stop_on_sigterm(), scratch_dir(args.dir, needed, "tidelog-replication-") as scratch:
        print_machine(scratch)
        try:
            if "throughput" in args.phases or "latency" in args.phases:
                with BenchCluster(scratch / "steady") as cluster:
                    cluster.create_topic("rf1", [[1], [2], [3]])
                    cluster.create_topic("rf3", spread(3, 3), {"min.insync.replicas": "2"})
                    for phase, run in (("throughput", phase_throughput), ("latency", phase_latency)):
                        if phase in args.phases:
                            results.append(run(cluster, args))
                            results[-1].show()
            if "failover" in args.phases:
                results.append(phase_failover(scratch, args))
                results[-1].show()
            if "shutdown" in args.phases:
                results.append(phase_shutdown(scratch, args))
                results[-1].show()
        except (BenchError, ClusterUpError, KafkaException, ValueError) as exc:
            console.print(f"replication benchmark failed: {exc}", markup=False)
            return 1
        except KeyboardInterrupt:
            console.print("interrupted: ZooKeeper and the brokers are stopped, the scratch dir is removed")
            return 130
    console.print("[bold]summaries[/]")
    for result in results:
        console.print(f"  {result.summary}")
    if args.write_report:
        action = write_doc_section(BENCHMARKS_MD, SECTION_HEADING, markdown_section(results, facts))
        console.print(f"{action} the section “{SECTION_HEADING[3:]}” in {BENCHMARKS_MD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
