"""Network partitions, made with fault-injecting TCP proxies (tests/cluster/fault_proxy.py) between real processes:

- a leader cut off from ZooKeeper keeps believing it leads until it hears otherwise, but its followers follow the
  leader the controller elects instead, so it acknowledges no acks=all write from then on; when the network heals it
  learns it is a follower, truncates what it alone appended, and copies the new leader: the records acknowledged on
  the new leader's side all survive, the ones the old leader appended on its side are gone from every replica, and
  nothing was acknowledged on both sides;
- a leader cut off from its followers (and from clients that reach it through its advertised address) but not from
  ZooKeeper answers acks=all writes with REQUEST_TIMED_OUT while they wait for followers that do not come, takes the
  followers out of the ISR replica.lag.time.max.ms after they fell behind, and from then on refuses acks=all
  writes with NOT_ENOUGH_REPLICAS (min.insync.replicas 2); when the network heals they catch up and rejoin the
  ISR. (A write that timed out was appended: it is replicated after the heal, as in Kafka - the producer was told
  it may or may not be there.)

The proxies are the first fixture of each test, so they are closed last: the brokers stop (a controlled shutdown
each) while they can still reach ZooKeeper and each other.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cluster_checks import registered, wait_for
from confluent_kafka.admin import AdminClient, NewTopic
from fault_proxy import ProxyRegistry
from kazoo.client import KazooClient
from replica_files import assert_replicas_identical

import kafka_wire
from broker_process import BrokerProcess
from tidelog.codec.record_batch import Record, build_batch
from tidelog.protocol.messages import ApiKey
from zookeeper_process import SESSION_TIMEOUT_MS, ClusterBroker, ZooKeeperChroot

TOPIC = "split"
FAILOVER_S = SESSION_TIMEOUT_MS / 1000 + 30
LAG_MS = 3000
SETTINGS = {"replica.lag.time.max.ms": LAG_MS, "offsets.topic.num.partitions": 1}
NONE = 0
NOT_ENOUGH_REPLICAS = 19
REQUEST_TIMED_OUT = 7


def state(zk: KazooClient) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{TOPIC}/partitions/0/state")[0])


def produce(bootstrap: str, value: bytes, *, acks: int = -1, timeout_ms: int = 3000) -> tuple[int, int]:
    """(error code, offset) of a one-record Produce to partition 0 sent straight to `bootstrap`."""
    body = {
        "transactional_id": None,
        "acks": acks,
        "timeout": timeout_ms,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": build_batch([Record(value)])}]}],
    }
    response = kafka_wire.request(bootstrap, ApiKey.PRODUCE, kafka_wire.PRODUCE_VERSION, body, timeout_s=30)
    answer = response.responses[0].partition_responses[0]
    return int(answer.error_code), int(answer.base_offset)


def values_on_disk(broker: BrokerProcess) -> list[bytes]:
    from replica_files import replica_batches

    from tidelog.codec.record_set import decode_batch, iter_batches

    values = []
    for batch in replica_batches(broker.log_dir, TOPIC, 0):
        for info in iter_batches(batch.data):
            values += [record.value for record in decode_batch(batch.data, info) if record.value is not None]
    return values


def create_topic(bootstrap: str, zk: KazooClient) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(timeout=60)
    wait_for(lambda: sorted(state(zk)["isr"]) == [1, 2, 3], what="the full ISR")


def test_a_leader_cut_off_from_zookeeper_acknowledges_nothing_that_is_lost(
    fault_proxies: ProxyRegistry, zookeeper: ZooKeeperChroot, zk_client: KazooClient, cluster_broker: ClusterBroker
) -> None:
    host, _, port = zookeeper.address.rpartition(":")
    brokers = {}
    for broker_id in (1, 2, 3):
        proxy = fault_proxies.add(f"zk{broker_id}", host, int(port))
        zk_connect = f"{proxy.address}{zookeeper.chroot}"
        brokers[broker_id] = cluster_broker(broker_id, {**SETTINGS, "zookeeper.connect": zk_connect})
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    create_topic(brokers[1].bootstrap, zk_client)
    before = state(zk_client)
    old_leader = before["leader"]
    acknowledged = [f"before-{i}".encode() for i in range(5)]
    for value in acknowledged:
        assert produce(brokers[old_leader].bootstrap, value)[0] == NONE

    fault_proxies[f"zk{old_leader}"].cut()
    wait_for(
        lambda: state(zk_client)["leader"] not in (old_leader, -1),
        timeout_s=FAILOVER_S,
        what="a new leader elected without the cut-off one",
    )
    new_leader = state(zk_client)["leader"]
    assert state(zk_client)["leader_epoch"] > before["leader_epoch"]
    assert old_leader not in state(zk_client)["isr"]

    # the old leader still takes appends from a client that reaches it, but cannot get them replicated: no ack.
    # (A follower's fetch already on its way to the old leader when the new state was written may still copy one;
    # the new leader would then hold it too and it would survive. The pause lets every follower switch first, so
    # that the test can insist on no acknowledgement at all.)
    time.sleep(1)
    stranded = [f"stranded-{i}".encode() for i in range(3)]
    for value in stranded:
        error, _offset = produce(brokers[old_leader].bootstrap, value, timeout_ms=2000)
        assert error != NONE, "a leader cut off from ZooKeeper acknowledged an acks=all write"
    for i in range(5):  # the new side acknowledges
        value = f"after-{i}".encode()
        assert produce(brokers[new_leader].bootstrap, value)[0] == NONE
        acknowledged.append(value)

    fault_proxies.heal(f"zk{old_leader}")
    wait_for(lambda: registered(zk_client) == [1, 2, 3], timeout_s=FAILOVER_S, what="the old leader back")
    wait_for(lambda: sorted(state(zk_client)["isr"]) == [1, 2, 3], timeout_s=FAILOVER_S, what="it rejoins the ISR")
    end = max(produce(brokers[new_leader].bootstrap, b"last")[1] + 1, 0)
    acknowledged.append(b"last")
    wait_for(
        lambda: all(values_on_disk(b) == acknowledged for b in brokers.values()),
        what="every replica holding exactly the acknowledged records",
    )
    log_dirs = {f"broker{b}": broker.log_dir for b, broker in brokers.items()}
    assert_replicas_identical(log_dirs, TOPIC, 0, up_to=end)
    assert "truncating" in brokers[old_leader].stderr_text()


def test_a_leader_cut_off_from_its_followers_refuses_acks_all_once_the_isr_shrinks(
    fault_proxies: ProxyRegistry, zk_client: KazooClient, cluster_broker: ClusterBroker
) -> None:
    brokers: dict[int, BrokerProcess] = {}
    for broker_id in (1, 2, 3):  # every broker advertises a proxy in front of its listener
        proxy = fault_proxies.add(f"b{broker_id}", "127.0.0.1", 1)
        brokers[broker_id] = cluster_broker(
            broker_id, {**SETTINGS, "advertised.listeners": f"PLAINTEXT://{proxy.address}"}
        )
        assert brokers[broker_id].port is not None
        proxy.retarget("127.0.0.1", brokers[broker_id].port)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    create_topic(brokers[1].bootstrap, zk_client)
    leader = state(zk_client)["leader"]
    direct = brokers[leader].bootstrap  # the test's own client reaches the leader past the proxy
    assert produce(direct, b"before")[0] == NONE

    fault_proxies.cut(f"b{leader}")
    # A follower is out of sync once the leader has records it has not fetched for replica.lag.time.max.ms (one
    # that is level with the leader stays in, fetching or not, as in Kafka): acks=1 needs only the leader.
    appended_at = time.monotonic()
    assert produce(direct, b"acks-1", acks=1)[0] == NONE
    assert produce(direct, b"unreplicated", timeout_ms=1000)[0] == REQUEST_TIMED_OUT  # acks=all waits for the ISR
    wait_for(lambda: state(zk_client)["isr"] == [leader], timeout_s=FAILOVER_S, what="the ISR to shrink to the leader")
    shrunk_after = time.monotonic() - appended_at
    assert shrunk_after >= LAG_MS / 1000 * 0.8, f"the ISR shrank {shrunk_after:.1f} s after the append"
    assert state(zk_client)["leader"] == leader  # ZooKeeper still sees it: it stays the leader
    assert produce(direct, b"refused")[0] == NOT_ENOUGH_REPLICAS  # nothing appended

    fault_proxies.heal(f"b{leader}")
    wait_for(lambda: sorted(state(zk_client)["isr"]) == [1, 2, 3], timeout_s=FAILOVER_S, what="the ISR to expand")
    assert produce(direct, b"after")[0] == NONE
    wait_for(
        lambda: all(values_on_disk(b) == [b"before", b"acks-1", b"unreplicated", b"after"] for b in brokers.values()),
        what="every replica holding what the leader took",
    )
