"""`tidelog demo --cluster` (`make demo-cluster`): the page-visits pipeline of `tidelog demo` on three brokers,
the leader of a partition killed mid-stream, and every window still counted exactly once.

1. starts ZooKeeper and brokers 1-3 with the `Cluster` of `tidelog cluster up` (cluster_up.py) in
   `tidelog-demo-data/cluster`, each broker with `zookeeper.session.timeout.ms=6000` (SESSION_TIMEOUT_MS: a killed
   broker leaves the cluster 6 s after its last heartbeat instead of Kafka's 18 s) and a `__consumer_offsets` of
   5 partitions;
2. creates `page_visits` (5 partitions) and `page_visits_per_window` with replication factor 3 and
   `min.insync.replicas=2`; the producer (idempotent, acks=all) and Spark's source and sink get all three brokers
   as bootstrap servers;
3. runs the flow of `tidelog demo` (`tidelog.spark.demo.run_demo`: the same query, live display and deadline) and,
   a third of the way through the producing, SIGKILLs the broker leading `page_visits-0` (from the partition's state
   znode, read with kazoo). The display (or the plain status lines) shows the kill; the new leader and its leader
   epoch once the controller has elected it (state znode); the time from the kill to the producer's first
   acknowledgement of a record of that partition produced after the kill; then the killed broker restarting
   (RESTART_AFTER_S after the election, same id, port and log directory) and rejoining the partition's ISR;
4. reports `tidelog demo`'s check (the top pages of a batch read of `page_visits`, through the brokers, against the
   sum of the windowed counts in Parquet: "every window counted, none twice"), the records the producer had
   acknowledged against those in `page_visits`, the window results in `page_visits_per_window` read read_committed
   (the exactly-once sink writes each micro-batch in transactions committed with Spark's batch, so a batch replayed
   across the failover leaves its first attempt aborted, never counted), and the failover's figures. Exit code 0 only
   when the last window closed, both counts agree, no delivery failed and the failover went through to the rejoin;
5. stops the brokers (SIGTERM: a controlled shutdown each), then ZooKeeper - also on Ctrl-C or an error, and at the
   deadline through `tidelog demo`'s watchdog. The children are started with PR_SET_PDEATHSIG, so even a demo that
   is killed leaves none behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kazoo.client import KazooClient
from rich.console import Console

from tidelog.spark.demo import DEADLINE_S, EVENTS_PARTITIONS, STOP_RESERVE_S, DemoBrokers, Progress, run_demo
from tidelog.tools.cluster_up import (
    START_TIMEOUT_S,
    Cluster,
    ClusterUpError,
    ClusterUpOptions,
    controller_id,
    partition_state,
    zookeeper_missing,
)

BROKERS = 3
SESSION_TIMEOUT_MS = 6000
TOPIC, PARTITION = "page_visits", 0  # the partition whose leader is killed
KILL_AT = 1 / 3  # of the producing time
RESTART_AFTER_S = 2.0  # after the new leader is elected
REJOIN_WAIT_S = 20.0  # after the stream, at most, for a rejoin not seen yet
WATCHDOG_STOP_S = 2.0  # per process, when the watchdog stops the cluster
OVERRIDES = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "offsets.topic.num.partitions": "5",  # not 50 partitions x 3 replicas on a laptop's cores
    "transaction.state.log.num.partitions": "5",  # the exactly-once sink's coordinators, likewise
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": str(EVENTS_PARTITIONS),
    # at the end the last broker to stop has nowhere to move its leadership: it asks again 3 times, 0.5 s apart
    # (Kafka's 5 s would add 15 s to every demo)
    "controlled.shutdown.retry.backoff.ms": "500",
}


@dataclass
class Failover:
    """What happened to the partition's leadership, in time.monotonic() seconds."""

    old_leader: int = -1
    old_epoch: int = -1
    controller: int | None = None
    pid: int = 0
    killed_at: float | None = None
    killed_wall_ms: int = 0  # records with a timestamp from then on were produced after the kill
    new_leader: int = -1
    new_epoch: int = -1
    elected_at: float | None = None
    first_ack_at: float | None = None  # set on the producer's thread
    first_ack_shown: bool = False
    restarted_at: float | None = None
    ready_at: float | None = None
    rejoined_at: float | None = None
    rejoined_isr: tuple[int, ...] = ()

    @property
    def complete(self) -> bool:
        return self.rejoined_at is not None and self.first_ack_at is not None


class ClusterBrokers(DemoBrokers):
    """ZooKeeper and three brokers (cluster_up.Cluster), and the failover, as `run_demo`'s hooks."""

    name = "the cluster"
    through = "through the brokers"
    title = "page visits per window on three brokers, with a failover"
    replication_factor = BROKERS
    topic_config: ClassVar[dict[str, str]] = {"min.insync.replicas": "2"}
    stop_reserve_s = STOP_RESERVE_S + 15.0  # the report reads through the brokers, and three brokers stop
    strict = True
    exactly_once = True  # the sink's transactions span the failover: their markers are replicated like any batch

    def __init__(self, directory: Path, seconds: float) -> None:
        self.kill_after_s = seconds * KILL_AT
        self.cluster = Cluster(ClusterUpOptions(brokers=BROKERS, overrides=OVERRIDES), directory, Console(quiet=True))
        self.client: KazooClient | None = None
        self.started = time.monotonic()
        self.failover = Failover()
        self.leader = -1
        self.epoch = -1
        self.isr: tuple[int, ...] = ()

    def missing(self) -> str | None:
        return zookeeper_missing()

    def start(self, console: Console) -> None:
        self.started = time.monotonic()
        self.cluster.start_zookeeper()
        console.print(
            f"ZooKeeper is up on [bold]{self.cluster.zookeeper_connect}[/] "
            f"(brokers' zookeeper.session.timeout.ms={SESSION_TIMEOUT_MS})"
        )
        self.cluster.start_brokers()
        self.client = KazooClient(hosts=self.cluster.zookeeper_connect)
        self.client.start(timeout=START_TIMEOUT_S)
        self.cluster.wait_registered(self.client)
        brokers = ", ".join(f"{b.broker_id} on 127.0.0.1:{b.port}" for b in self.cluster.brokers)
        console.print(f"brokers {brokers} are up (controller: broker {controller_id(self.client)})")

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    def batch_source(self) -> tuple[dict[str, str], str]:
        return {"kafka.bootstrap.servers": self.bootstrap}, "through the brokers"

    def where(self) -> str:
        return f"the cluster's data: {self.cluster.directory}"

    # --- the failover, step by step (on the main thread, every half second while the query streams) -----------------

    def _elapsed(self, at: float | None = None) -> str:
        return f"{(time.monotonic() if at is None else at) - self.started:5.1f} s"

    def _read_state(self) -> None:
        assert self.client is not None
        state = partition_state(self.client, TOPIC, PARTITION) or {}
        leader, epoch, isr = state.get("leader", -1), state.get("leader_epoch", -1), state.get("isr", [])
        self.leader = leader if isinstance(leader, int) else -1
        self.epoch = epoch if isinstance(epoch, int) else -1
        self.isr = tuple(i for i in isr if isinstance(i, int)) if isinstance(isr, list) else ()

    def tick(self, console: Console, progress: Progress) -> None:
        self.cluster.check_alive()  # a broker that died on its own (not the one killed here) ends the demo
        self._read_state()
        f = self.failover
        now = time.monotonic()
        with progress.lock:
            since = progress.producing_since
        if f.killed_at is None:
            if since is not None and now - since >= self.kill_after_s and self.leader >= 0:
                self._kill(console)
        elif f.elected_at is None:
            if self.leader not in (-1, f.old_leader) and self.epoch > f.old_epoch:
                f.new_leader, f.new_epoch, f.elected_at = self.leader, self.epoch, now
                console.print(
                    f"[bold green]{self._elapsed()}  broker {f.new_leader} leads {TOPIC}-{PARTITION} now, leader "
                    f"epoch {f.new_epoch}, ISR {_ids(self.isr)}: elected {now - f.killed_at:.1f} s after the kill",
                    highlight=False,
                )
        elif f.restarted_at is None:
            if now - f.elected_at >= RESTART_AFTER_S:
                broker = self.cluster.restart_broker(f.old_leader)  # on the main thread: see Cluster (PDEATHSIG)
                f.restarted_at = now
                console.print(
                    f"[bold]{self._elapsed()}  restarting broker {f.old_leader} (pid {broker.proc.pid}, same id, port "
                    "and log directory)",
                    highlight=False,
                )
        else:
            if f.ready_at is None and self.cluster.is_ready(self.cluster.broker(f.old_leader)):
                f.ready_at = now
            if f.rejoined_at is None and f.old_leader in self.isr:
                f.rejoined_at, f.rejoined_isr = now, self.isr
                console.print(
                    f"[bold green]{self._elapsed()}  broker {f.old_leader} is back in the ISR of {TOPIC}-{PARTITION} "
                    f"(ISR {_ids(self.isr)}), {now - f.restarted_at:.1f} s after its restart",
                    highlight=False,
                )
        if f.first_ack_at is not None and not f.first_ack_shown and f.killed_at is not None:
            f.first_ack_shown = True
            console.print(
                f"[bold green]{self._elapsed(f.first_ack_at)}  the producer's next acknowledgement on "
                f"{TOPIC}-{PARTITION}: {f.first_ack_at - f.killed_at:.1f} s after the kill",
                highlight=False,
            )

    def _kill(self, console: Console) -> None:
        assert self.client is not None
        f = self.failover
        f.old_leader, f.old_epoch, f.controller = self.leader, self.epoch, controller_id(self.client)
        isr = self.isr
        f.pid = self.cluster.kill_broker(f.old_leader)
        f.killed_at = time.monotonic()
        f.killed_wall_ms = int(time.time() * 1000)
        also = ", and the controller" if f.controller == f.old_leader else ""
        console.print(
            f"[bold red]{self._elapsed()}  SIGKILL broker {f.old_leader} (pid {f.pid}): the leader of "
            f"{TOPIC}-{PARTITION} (leader epoch {f.old_epoch}, ISR {_ids(isr)}){also}; a new leader comes when its "
            f"ZooKeeper session expires ({SESSION_TIMEOUT_MS / 1000:.0f} s)",
            highlight=False,
        )

    def delivered(self, partition: int, timestamp_ms: int) -> None:
        f = self.failover
        if f.first_ack_at is None and partition == PARTITION and f.killed_wall_ms and timestamp_ms >= f.killed_wall_ms:
            f.first_ack_at = time.monotonic()

    def status(self, progress: Progress) -> str:
        f = self.failover
        now = time.monotonic()
        with progress.lock:
            acknowledged = progress.acknowledged
        if self.leader in self.cluster.killed:
            leader = f"leader [red]{self.leader} (killed; ZooKeeper still names it)[/]"
        elif self.leader >= 0:
            leader = f"leader [bold]{self.leader}[/]"
        else:
            leader = "[red]no leader[/]" if self.epoch >= 0 else "leader -"
        line = f"{TOPIC}-{PARTITION}: {leader} (epoch {self.epoch}), ISR {_ids(self.isr)}"
        line += f" | acknowledged {acknowledged:,}"
        if f.killed_at is None:
            step = f"the leader is killed {self.kill_after_s:.0f} s into the producing"
        elif f.elected_at is None:
            step = f"[red]broker {f.old_leader} killed {now - f.killed_at:.1f} s ago[/], waiting for a new leader"
        elif f.first_ack_at is None:
            step = "waiting for the producer's next acknowledgement"
        elif f.restarted_at is None:
            step = f"broker {f.old_leader} restarts in {max(0.0, f.elected_at + RESTART_AFTER_S - now):.1f} s"
        elif f.rejoined_at is None:
            step = f"broker {f.old_leader} " + ("catching up" if f.ready_at else "starting")
        else:
            step = f"broker {f.old_leader} back in the ISR"
        return f"{line} | {step}"

    def before_report(self, console: Console, until: float) -> None:
        """The rejoin may come after the last window: wait for it a little (not when the stream was cut short)."""
        if self.failover.killed_at is None:
            return
        until = min(until, time.monotonic() + REJOIN_WAIT_S)
        progress = Progress()  # the stream is over: only the failover's steps are left to see
        while self.failover.rejoined_at is None and time.monotonic() < until:
            self.tick(console, progress)
            time.sleep(0.5)

    # --- the report --------------------------------------------------------------------------------------------------

    def report(self, console: Console, spark: Any, progress: Progress) -> bool:
        events = spark.read.format("tidelog").option("kafka.bootstrap.servers", self.bootstrap)
        in_topic = events.option("subscribe", TOPIC).load().count()
        with progress.lock:
            produced = progress.produced + (0 if progress.producing else 1)  # the heartbeat
            acknowledged, errors = progress.acknowledged, list(progress.delivery_errors)
        same = acknowledged == in_topic and not errors
        verdict = "[green]none lost, none twice" if same else "[red]they differ"
        failed = f", {len(errors)} deliveries failed ({errors[0]})" if errors else ""
        console.print(
            f"the producer sent {produced:,} records (the heartbeat included) and had {acknowledged:,} acknowledged"
            f"{failed}; page_visits holds {in_topic:,} (read through the brokers): {verdict}",
            highlight=False,
        )
        return self._report_failover(console) and same

    def _report_failover(self, console: Console) -> bool:
        f = self.failover
        if f.killed_at is None:
            console.print("[red]failover: none (the stream ended before the kill)")
            return False
        lines = [
            f"broker {f.old_leader} (leader of {TOPIC}-{PARTITION}, leader epoch {f.old_epoch}"
            + (", the controller" if f.controller == f.old_leader else "")
            + f") SIGKILLed at {self._elapsed(f.killed_at).strip()}"
        ]
        if f.elected_at is not None:
            lines.append(
                f"new leader: broker {f.new_leader}, leader epoch {f.new_epoch}, elected "
                f"{f.elected_at - f.killed_at:.1f} s after the kill (zookeeper.session.timeout.ms={SESSION_TIMEOUT_MS})"
            )
        else:
            lines.append("[red]no new leader was elected")
        if f.first_ack_at is not None:
            lines.append(
                f"the producer's next acknowledgement on {TOPIC}-{PARTITION}: {f.first_ack_at - f.killed_at:.1f} s "
                "after the kill"
            )
        else:
            lines.append(f"[red]no record of {TOPIC}-{PARTITION} produced after the kill was acknowledged")
        if f.restarted_at is not None and f.rejoined_at is not None:
            lines.append(
                f"broker {f.old_leader} restarted {f.restarted_at - f.killed_at:.1f} s after the kill, back in the ISR "
                f"({_ids(f.rejoined_isr)}) {f.rejoined_at - f.restarted_at:.1f} s after its restart"
            )
        else:
            lines.append(f"[red]broker {f.old_leader} did not rejoin the ISR of {TOPIC}-{PARTITION}")
        console.print("failover:\n" + "\n".join(f"  {line}" for line in lines), highlight=False)
        return f.complete

    # --- stopping ----------------------------------------------------------------------------------------------------

    def stop(self, console: Console) -> None:
        if self.client is not None:
            self.client.stop()
            self.client.close()
            self.client = None
        if self.cluster.zookeeper is None:
            return
        began = time.monotonic()
        self.cluster.stop()
        codes = ", ".join(str(b.proc.returncode) for b in self.cluster.brokers)
        console.print(
            f"stopped brokers {_ids(tuple(b.broker_id for b in self.cluster.brokers))} (SIGTERM, exit codes {codes}) "
            f"and ZooKeeper in {time.monotonic() - began:.1f} s",
            highlight=False,
        )

    def stop_now(self) -> None:
        self.cluster.stop(timeout_s=WATCHDOG_STOP_S)


def _ids(values: tuple[int, ...]) -> str:
    return ",".join(map(str, values)) or "-"


def run(
    data_dir: Path = Path("tidelog-demo-data"),
    *,
    seconds: float = 40.0,
    rate: int = 500,
    deadline_s: float = DEADLINE_S,
) -> int:
    """`tidelog demo --cluster`; exit codes as `tidelog.spark.demo.run` says, and 1 when a check failed."""
    brokers = ClusterBrokers(data_dir.resolve() / "cluster", seconds)
    try:
        return run_demo(brokers, data_dir, seconds=seconds, rate=rate, deadline_s=deadline_s)
    except ClusterUpError as exc:  # everything it started is stopped by now
        Console(stderr=True).print(f"tidelog demo --cluster: error: {exc}", markup=False, highlight=False)
        return 1
