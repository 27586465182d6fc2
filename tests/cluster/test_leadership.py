"""Leadership that moves on purpose, with a real ZooKeeper and three `tidelog serve` brokers: the controlled shutdown
on SIGTERM (the controller moves a stopping broker's leadership to other in-sync replicas, and takes it out of every
ISR, before its registration goes - also when the stopping broker is the controller itself), the automatic
preferred-leader rebalance, and the ElectLeaders API (librdkafka's AdminClient, and raw requests to a broker that is
not the controller, which forwards them).

A broker that comes back is put back into the ISR by its leaders once its fetchers have caught up (replication):
the tests wait for that before they expect it to lead again."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from cluster_checks import controller, registered, wait_for
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

import kafka_wire
from broker_process import BrokerProcess
from tidelog.protocol.messages import ApiKey
from zookeeper_process import ClusterBroker

TOPIC = "moves"
PARTITIONS = 3
ELECTION_NOT_NEEDED = 84
PREFERRED_LEADER_NOT_AVAILABLE = 80
UNKNOWN_TOPIC_OR_PARTITION = 3
QUIET = {
    "default.replication.factor": 3,
    "controlled.shutdown.retry.backoff.ms": 500,
    # followers copy nothing on this branch: keep the ISRs as the controller set them
    "replica.lag.time.max.ms": 600_000,
}


def state(zk: KazooClient, topic: str, partition: int) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])


def assignment(zk: KazooClient, topic: str) -> dict[int, list[int]]:
    data = json.loads(zk.get(f"/brokers/topics/{topic}")[0])
    return {int(p): replicas for p, replicas in data["partitions"].items()}


def leaders(zk: KazooClient, topic: str) -> dict[int, int]:
    return {p: state(zk, topic, p)["leader"] for p in range(PARTITIONS)}


def start_cluster(cluster_broker: ClusterBroker, overrides: dict[str, Any]) -> dict[int, BrokerProcess]:
    return cluster_broker.all((1, 2, 3), {**QUIET, **overrides})


def create_topic(zk: KazooClient, brokers: dict[int, BrokerProcess]) -> dict[int, list[int]]:
    wait_for(lambda: registered(zk) == [1, 2, 3], what="three registered brokers")
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])[TOPIC].result(30)
    wait_for(
        lambda: all(
            zk.exists(f"/brokers/topics/{TOPIC}/partitions/{p}/state") and len(state(zk, TOPIC, p)["isr"]) == 3
            for p in range(PARTITIONS)
        ),
        what="every partition led, with three in-sync replicas",
    )
    return assignment(zk, TOPIC)


def wait_in_isr(zk: KazooClient, topic: str, partitions: range | list[int], broker_id: int) -> None:
    """Wait until the leaders have taken `broker_id` back into the ISR of each partition (it caught up)."""
    wait_for(
        lambda: all(broker_id in state(zk, topic, p)["isr"] for p in partitions),
        what=f"broker {broker_id} back in the ISR",
    )


class Timeline:
    """Polls the state znodes and /brokers/ids every 10 ms from when it starts: when `broker_id` stopped leading
    each partition, and when its registration disappeared (monotonic seconds)."""

    def __init__(self, zk: KazooClient, broker_id: int, partitions: list[int]) -> None:
        self.zk, self.broker_id, self.partitions = zk, broker_id, partitions
        self.moved: dict[int, float] = {}
        self.unregistered: float | None = None
        self.start = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.is_set():
            now = time.monotonic()
            try:
                for p in self.partitions:
                    if p not in self.moved and state(self.zk, TOPIC, p)["leader"] != self.broker_id:
                        self.moved[p] = now
                if self.unregistered is None and self.broker_id not in registered(self.zk):
                    self.unregistered = now
            except KazooException:  # a dropped connection: kazoo reconnects
                time.sleep(0.01)
                continue
            if self.unregistered is not None and len(self.moved) == len(self.partitions):
                return
            time.sleep(0.01)

    def finish(self, timeout_s: float = 30) -> None:
        self._thread.join(timeout_s)
        self._done.set()

    def report(self, what: str) -> str:
        moved = {p: round(t - self.start, 3) for p, t in sorted(self.moved.items())}
        gone = round(self.unregistered - self.start, 3) if self.unregistered is not None else None
        return f"{what}: leadership moved at {moved} s after SIGTERM, registration gone at {gone} s"


def stop_and_watch(zk: KazooClient, broker: BrokerProcess, broker_id: int) -> Timeline:
    led = [p for p, leader in leaders(zk, TOPIC).items() if leader == broker_id]
    assert led, f"broker {broker_id} leads nothing to move"
    timeline = Timeline(zk, broker_id, led)
    broker.stop()  # SIGTERM, waits for exit code 0
    timeline.finish()
    return timeline


def moves_before_leaving(zk: KazooClient, partitions: list[int]) -> dict[int, bool]:
    """ZooKeeper's own order: was each partition's last state write (its mzxid) before the last change of
    /brokers/ids' children (its pzxid: the stopped broker's registration removed)?"""
    left = zk.exists("/brokers/ids").pzxid
    return {p: zk.exists(f"/brokers/topics/{TOPIC}/partitions/{p}/state").mzxid < left for p in partitions}


def assert_moved_before_leaving(zk: KazooClient, broker: BrokerProcess, broker_id: int, timeline: Timeline) -> None:
    assert timeline.unregistered is not None and len(timeline.moved) == len(timeline.partitions), timeline.report("")
    assert max(timeline.moved.values()) <= timeline.unregistered, timeline.report("moved only after it left")
    assert all(moves_before_leaving(zk, timeline.partitions).values()), timeline.report("moved only after it left")
    for p in range(PARTITIONS):
        current = state(zk, TOPIC, p)
        assert current["leader"] != broker_id, (p, current)
        assert broker_id not in current["isr"], (p, current)
    assert "controlled shutdown succeeded" in broker.stderr_text()


def test_sigterm_moves_leadership_before_the_broker_leaves_and_the_rebalance_brings_it_back(
    zk_client: KazooClient, cluster_broker: ClusterBroker
) -> None:
    brokers = start_cluster(
        cluster_broker, {"leader.imbalance.check.interval.seconds": 2, "leader.imbalance.per.broker.percentage": 0}
    )
    replicas = create_topic(zk_client, brokers)
    preferred = {p: r[0] for p, r in replicas.items()}
    wait_for(lambda: leaders(zk_client, TOPIC) == preferred, what="the preferred replicas leading")
    active = controller(zk_client)
    victim = next(b for b in (1, 2, 3) if b != active)

    timeline = stop_and_watch(zk_client, brokers[victim], victim)
    print(timeline.report(f"controlled shutdown of broker {victim}"))
    assert_moved_before_leaving(zk_client, brokers[victim], victim, timeline)

    brokers[victim].start()  # it comes back: the rebalance moves its preferred partitions back to it
    wait_for(lambda: victim in registered(zk_client), what="the broker registered again")
    wait_in_isr(zk_client, TOPIC, range(PARTITIONS), victim)
    back = time.monotonic()
    wait_for(lambda: leaders(zk_client, TOPIC) == preferred, what="leadership back on the preferred replicas")
    print(f"auto rebalance: leadership back on the preferred replicas {time.monotonic() - back:.1f} s after the ISR")


def test_the_controller_moves_its_own_leadership_and_elect_leaders_moves_it_back(
    zk_client: KazooClient, cluster_broker: ClusterBroker
) -> None:
    brokers = start_cluster(cluster_broker, {"auto.leader.rebalance.enable": "false"})
    replicas = create_topic(zk_client, brokers)
    preferred = {p: r[0] for p, r in replicas.items()}
    wait_for(lambda: leaders(zk_client, TOPIC) == preferred, what="the preferred replicas leading")
    active = controller(zk_client)
    assert active is not None

    timeline = stop_and_watch(zk_client, brokers[active], active)
    print(timeline.report(f"controlled shutdown of the controller, broker {active}"))
    assert_moved_before_leaving(zk_client, brokers[active], active, timeline)
    new_controller = wait_for(lambda: controller(zk_client), what="a new controller")
    assert new_controller != active

    [moved] = [p for p, r in preferred.items() if r == active]
    others = [b for b in (1, 2, 3) if b != active]

    # while it is away the preferred replica cannot lead (asked through a broker that is not the controller)
    answer = kafka_wire.request(
        brokers[next(b for b in others if b != new_controller)].bootstrap,
        ApiKey.ELECT_LEADERS,
        2,
        {"election_type": 0, "topic_partitions": [{"topic": TOPIC, "partitions": [moved, 7]}], "timeout": 10_000},
    )
    codes = {r.partition_id: int(r.error_code) for t in answer.replica_election_results for r in t.partition_result}
    assert codes == {moved: PREFERRED_LEADER_NOT_AVAILABLE, 7: UNKNOWN_TOPIC_OR_PARTITION}, answer

    brokers[active].start()
    wait_for(lambda: active in registered(zk_client), what="the old controller registered again")
    time.sleep(1)
    assert leaders(zk_client, TOPIC)[moved] != active  # no rebalance: auto.leader.rebalance.enable=false

    wait_in_isr(zk_client, TOPIC, [moved], active)
    admin = AdminClient({"bootstrap.servers": brokers[others[0]].bootstrap})
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    first = admin.elect_leaders(ElectionType.PREFERRED, partitions).result(30)
    errors = {tp.partition: error for tp, error in first.items()}
    assert errors[moved] is None, errors
    assert all(error is not None and error.code() == ELECTION_NOT_NEEDED for p, error in errors.items() if p != moved)
    assert leaders(zk_client, TOPIC) == preferred  # the answer came once the election was visible
    second = admin.elect_leaders(ElectionType.PREFERRED, partitions).result(30)
    assert {tp.partition: error.code() for tp, error in second.items() if error is not None} == dict.fromkeys(
        range(PARTITIONS), ELECTION_NOT_NEEDED
    )


def test_without_controlled_shutdown_leadership_moves_only_after_the_broker_left(
    zk_client: KazooClient, cluster_broker: ClusterBroker
) -> None:
    """The contrast: controlled.shutdown.enable=false. The stopping broker still removes its registration at once
    (cluster_membership.py's resign; a broker that is killed instead leaves when its ZooKeeper session times out),
    and only then does the controller move its leadership - the assertions of the test above fail here."""
    brokers = start_cluster(
        cluster_broker, {"controlled.shutdown.enable": "false", "auto.leader.rebalance.enable": "false"}
    )
    create_topic(zk_client, brokers)
    active = controller(zk_client)
    victim = next(b for b in (1, 2, 3) if b != active and b in leaders(zk_client, TOPIC).values())
    timeline = stop_and_watch(zk_client, brokers[victim], victim)
    print(timeline.report(f"broker {victim} stopped without a controlled shutdown"))
    assert timeline.unregistered is not None and len(timeline.moved) == len(timeline.partitions), timeline.report("")
    assert min(timeline.moved.values()) >= timeline.unregistered, timeline.report("moved before it left")
    assert not any(moves_before_leaving(zk_client, timeline.partitions).values())
    assert "controlled shutdown" not in brokers[victim].stderr_text()
