"""RocketMQ master/slave groups in a cluster (docs/cluster.md): what copying the CommitLog to a slave costs a
producer, how far a slave lags under full load, and how long a group is unwritable after kill -9 of its master.

    .venv/bin/python bench/rocketmq_ha.py                     # 5 s windows, 10 kills (~3 minutes)
    .venv/bin/python bench/rocketmq_ha.py --seconds 2 --kills 3   # a smoke test
    PYTHONPATH=/elsewhere/src .venv/bin/python bench/rocketmq_ha.py   # the brokers of another checkout

Every cluster is real processes on 127.0.0.1: a standalone ZooKeeper (src/tidelog/tools/cluster_up.py) and
`tidelog serve` brokers of the RocketMQ engine (bench/replication.py's `Broker`: this interpreter, a fresh scratch
dir); the clients are confluent_kafka (librdkafka) in this process. Phases:

  throughput  three clusters in turn, each with a 1-partition topic: a lone master (haEnable=false), a group of two
              with SYNC_MASTER, a group of two with ASYNC_MASTER. An idempotent acks=all producer (linger.ms=5,
              100-byte values, bench/replication.py's `produce_flat_out`) as fast as it can for --seconds after a
              warm-up: messages/s, and each group's figure as a share of the lone master's of the same run.
  lag         during each group's window, every --sample-ms: the slave's CommitLog end and the master's, from their
              member znodes (/tidelog/rocketmq/<group>/brokers/<id>, which each broker writes at most once a second
              while its end moves - so the figures are coarse by up to a second's writes); lag in bytes p50/p99/max,
              and in ms as bytes / the master's write rate in the window.
  failover    a group of three (SYNC_MASTER) and a 1-partition topic; --kills times: wait until the SyncStateSet
              holds a live slave, SIGKILL the master, time the kill to the new master in the group znode and to the
              new master's first acknowledgement of an acks=all Produce sent straight to it (one every 5 ms: the
              group's failover, the ZooKeeper session timeout --session-ms included); then restart the killed broker
              (it comes back as a slave). p50/p99/max.

Figures are indicative on a shared machine; docs/benchmarks.md is written by the lead on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from rich.console import Console

from benchutil import add_dir_argument, console, new_table, percent, print_machine, scratch_dir
from replication import BenchError, Broker, _free_port, produce_directly, produce_flat_out, wait_for
from tidelog.tools.cluster_up import Cluster, ClusterUpOptions, zookeeper_missing

GROUP = "bench"
TOPIC = "ha"
VALUE_BYTES = 100
POLL_S = 0.005


class HACluster:
    """ZooKeeper and `members` RocketMQ brokers: broker 1 in `role`, the others its SLAVEs (members 1 and role
    None: a lone broker without HA). A context manager that stops everything it started."""

    def __init__(self, directory: Path, members: int, role: str | None, session_ms: int) -> None:
        self.directory = directory
        self.members = members
        self.role = role
        self.session_ms = session_ms
        self.zookeeper = Cluster(ClusterUpOptions(brokers=0), directory, Console(quiet=True))
        self.brokers: dict[int, Broker] = {}
        self.zk: KazooClient | None = None

    def __enter__(self) -> HACluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self.zookeeper.start_zookeeper()
            self.zk = KazooClient(hosts=self.zookeeper.zookeeper_connect)
            self.zk.start(timeout=60)
            for broker_id in range(1, self.members + 1):
                self.brokers[broker_id] = broker = Broker(
                    broker_id,
                    _free_port(),
                    self.directory / f"broker-{broker_id}",
                    self._settings(broker_id),
                    self.directory / f"broker-{broker_id}.out",
                    self.directory / f"broker-{broker_id}.err",
                )
                broker.start()
                if broker_id == 1 and self.role is not None:
                    wait_for(lambda: self.group().get("master") == 1, "the group's master")
            if self.role is not None:
                wait_for(
                    lambda: len(self.group().get("sync_state_set", [])) == self.members, "the group in sync", None, 60
                )
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            admin.create_topics([NewTopic(TOPIC, 1, 1)], operation_timeout=60)[TOPIC].result(timeout=90)
            wait_for(lambda: self.state().get("leader", -1) >= 0, "the topic's leader")
        except BaseException:
            self.stop()
            raise
        return self

    def _settings(self, broker_id: int) -> dict[str, str]:
        settings = {
            "zookeeper.connect": self.zookeeper.zookeeper_connect,
            "zookeeper.session.timeout.ms": str(self.session_ms),
            "tidelog.storage.engine": "rocketmq",
            "offsets.topic.num.partitions": "1",
        }
        if self.role is not None:
            settings |= {
                "tidelog.rocketmq.haEnable": "true",
                "tidelog.rocketmq.haListenHost": "127.0.0.1",
                "tidelog.rocketmq.haListenPort": str(_free_port()),
                "tidelog.rocketmq.brokerName": GROUP,
                "tidelog.rocketmq.brokerRole": self.role if broker_id == 1 else "SLAVE",
            }
        return settings

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.zk is not None:
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
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers.values() if b.alive)

    def broker_cpu(self) -> dict[int, float]:
        return {broker_id: broker.cpu_seconds() for broker_id, broker in self.brokers.items()}

    def _json(self, path: str) -> dict[str, Any]:
        assert self.zk is not None
        try:
            value = json.loads(self.zk.get(path)[0])
        except NoNodeError:
            return {}
        return value if isinstance(value, dict) else {}

    def group(self) -> dict[str, Any]:
        return self._json(f"/tidelog/rocketmq/{GROUP}")

    def member(self, broker_id: int) -> dict[str, Any]:
        return self._json(f"/tidelog/rocketmq/{GROUP}/brokers/{broker_id}")

    def state(self) -> dict[str, Any]:
        return self._json(f"/brokers/topics/{TOPIC}/partitions/0/state")

    def live(self) -> set[int]:
        assert self.zk is not None
        return {int(b) for b in self.zk.get_children("/brokers/ids")}


class LagSampler(threading.Thread):
    """Master's end minus the slave's (broker 2) from their member znodes, every `interval_s`."""

    def __init__(self, cluster: HACluster, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.interval_s = interval_s
        self.samples: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            master, slave = self.cluster.member(1), self.cluster.member(2)
            if "commitlog_end" in master and "commitlog_end" in slave:
                self.samples.append(max(0, master["commitlog_end"] - slave["commitlog_end"]))


def phase_throughput(scratch: Path, args: argparse.Namespace) -> None:
    rows: list[list[str]] = []
    lone_rate = 0.0
    for label, members, role in (("lone master", 1, None), ("SYNC_MASTER + 1", 2, "SYNC_MASTER"),
                                 ("ASYNC_MASTER + 1", 2, "ASYNC_MASTER")):  # fmt: skip
        with HACluster(scratch / label.split()[0].lower(), members, role, args.session_ms) as cluster:
            sampler = LagSampler(cluster, args.sample_ms / 1000) if role is not None else None
            if sampler is not None:
                sampler.start()
            end0 = cluster.member(1).get("commitlog_end", 0)
            window = produce_flat_out(cluster, TOPIC, VALUE_BYTES, args.seconds, args.warmup)  # type: ignore[arg-type]
            rate = window.messages / window.seconds
            lag = ["-", "-", "-", "-"]
            if sampler is not None:
                sampler.stopping.set()
                sampler.join()
                time.sleep(1.2)  # the members' znodes are written at most once a second
                bytes_per_s = (cluster.member(1).get("commitlog_end", 0) - end0) / (window.seconds + args.warmup)
                samples = np.array(sampler.samples or [0])
                p50, p99, top = (float(np.percentile(samples, q)) for q in (50, 99, 100))
                lag = [f"{p50 / 1024:.0f} KiB", f"{p99 / 1024:.0f} KiB", f"{top / 1024:.0f} KiB",
                       f"{p99 / bytes_per_s * 1000:.0f} ms" if bytes_per_s > 0 else "-"]  # fmt: skip
            if role is None:
                lone_rate = rate
            share = percent(rate, lone_rate) if role is not None else "100 %"
            rows.append([label, f"{rate:,.0f}", share, *lag])
            console.print(f"{label}: {rate:,.0f} msg/s")
    table = new_table(
        f"produce, acks=all idempotent, {VALUE_BYTES} B, {args.seconds:g} s windows",
        "cluster", "msg/s", "of lone", "lag p50", "lag p99", "lag max", "lag p99 (ms)",
    )  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console.print(table)


def phase_failover(scratch: Path, args: argparse.Namespace) -> None:
    elected: list[float] = []
    acked: list[float] = []
    with HACluster(scratch / "failover", 3, "SYNC_MASTER", args.session_ms) as cluster:
        for kill in range(args.kills):
            group = cluster.group()
            master = int(group["master"])
            wait_for(
                lambda m=master: (
                    any(b != m and b in cluster.live() for b in cluster.group()["sync_state_set"])
                    and all(b.alive for b in cluster.brokers.values())
                ),
                f"a live slave in the SyncStateSet before kill {kill + 1}",
            )
            start = time.perf_counter()
            cluster.brokers[master].kill()
            wait_for(lambda m=master: cluster.group().get("master") not in (m, -1, None), "a new master")
            elected.append(time.perf_counter() - start)
            new = int(cluster.group()["master"])
            port = cluster.brokers[new].port
            deadline = time.monotonic() + 60
            while produce_directly("127.0.0.1", port, TOPIC, 0, 2.0) != 0:
                if time.monotonic() > deadline:
                    raise BenchError(f"broker {new} did not acknowledge a produce within 60 s of its election")
                time.sleep(POLL_S)
            acked.append(time.perf_counter() - start)
            console.print(f"kill {kill + 1}: master {master} -> {new}: elected {elected[-1]:.2f} s, "
                          f"first ack {acked[-1]:.2f} s")  # fmt: skip
            cluster.brokers[master].start()  # on this thread: a broker dies with the thread that started it
    table = new_table(
        f"failover: kill -9 of the SYNC_MASTER of three, {args.kills} kills, session {args.session_ms} ms",
        "from kill -9 to", "p50", "p99", "max",
    )  # fmt: skip
    for label, values in (("new master in the group znode", elected), ("first acks=all acknowledged", acked)):
        data = np.array(values)
        table.add_row(label, *(f"{np.percentile(data, q):.2f} s" for q in (50, 99, 100)))
    console.print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", default="throughput,failover", help="throughput (with lag), failover")
    parser.add_argument("--seconds", type=float, default=5.0, help="each produce window")
    parser.add_argument("--warmup", type=float, default=1.0, help="produce before each window")
    parser.add_argument("--sample-ms", type=int, default=100, help="how often the lag is sampled")
    parser.add_argument("--kills", type=int, default=10, help="kill -9 of the master, for the failover times")
    parser.add_argument("--session-ms", type=int, default=3000, help="zookeeper.session.timeout.ms of the brokers")
    add_dir_argument(parser)
    args = parser.parse_args()
    missing = zookeeper_missing()
    if missing:
        console.print(f"[red]{missing}[/]")
        return 2
    with scratch_dir(args.dir, 2 << 30, "tidelog-bench-rocketmq-ha-") as scratch:
        print_machine(scratch)
        phases = args.phases.split(",")
        try:
            if "throughput" in phases:
                phase_throughput(scratch, args)
            if "failover" in phases:
                phase_failover(scratch, args)
        except BenchError as exc:
            console.print(f"[red]{exc}[/]")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
