"""The Prometheus endpoint of a real `tidelog serve` (`tidelog.metrics.port`, `tidelog.metrics.host`).

A broker with an ephemeral metrics port (the port it picked is read from its log) on 127.0.0.2 serves a producer and
a committing group consumer; each scrape is parsed with prometheus_client's own parser and every family the broker
promises is checked to move as the traffic says: bytes and messages in, bytes out, the request latency histogram
per API, partition sizes and the group count.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from tidelog.broker.config import BrokerConfig
from tidelog.errors import ConfigError

METRICS_LINE = re.compile(r"serving metrics on http://([\d.]+):(\d+)/metrics")
TOPIC, GROUP, PARTITIONS, RECORDS = "metered", "metered-group", 2, 200
TIMEOUT_S = 30.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, where: Callable[[dict[str, str]], bool]) -> float:
    return sum(v for (n, labels), v in samples.items() if n == name and where(dict(labels)))


def metrics_url(broker) -> str:
    deadline = time.monotonic() + 10
    while (match := METRICS_LINE.search(broker.stderr_text())) is None:
        assert time.monotonic() < deadline, f"the broker did not log its metrics port\n{broker.stderr_tail()}"
        time.sleep(0.05)
    return f"http://{match[1]}:{match[2]}/metrics"


def test_metrics_follow_produce_consume_and_groups(start_broker) -> None:
    broker = start_broker(
        {"tidelog.metrics.port": "0", "tidelog.metrics.host": "127.0.0.2", "group.initial.rebalance.delay.ms": "0"}
    )
    url = metrics_url(broker)
    assert url.startswith("http://127.0.0.2:") and not url.endswith(":0/metrics")
    with pytest.raises(urllib.error.URLError):  # bound to the configured host only
        urllib.request.urlopen(url.replace("127.0.0.2", "127.0.0.1"), timeout=5)

    before = scrape(url)
    assert value(before, "tidelog_consumer_groups") == 0
    assert value(before, "tidelog_messages_in_total", topic=TOPIC) == 0

    from confluent_kafka.admin import AdminClient, NewTopic

    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    client.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=TIMEOUT_S)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(TOPIC, key=str(i % 7).encode(), value=b"x" * 100)
    assert producer.flush(TIMEOUT_S) == 0

    produced = scrape(url)
    in_topic = lambda labels: labels.get("topic") == TOPIC  # noqa: E731
    sizes = total(produced, "tidelog_partition_size_bytes", in_topic)
    assert value(produced, "tidelog_messages_in_total", topic=TOPIC) == RECORDS
    assert value(produced, "tidelog_bytes_in_total", topic=TOPIC) == sizes > RECORDS * 100
    assert total(produced, "tidelog_partition_log_end_offset", in_topic) == RECORDS
    assert value(produced, "tidelog_bytes_out_total", topic=TOPIC) == 0
    assert value(produced, "tidelog_request_latency_seconds_count", api="produce") >= 1

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": GROUP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got = 0
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + TIMEOUT_S
        while got < RECORDS and time.monotonic() < deadline:
            got += sum(1 for m in consumer.consume(RECORDS, 0.5) if m.error() is None)
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    assert got == RECORDS and sum(tp.offset for tp in committed) == RECORDS

    consumed = scrape(url)
    assert value(consumed, "tidelog_consumer_groups") == 1
    assert value(consumed, "tidelog_bytes_out_total", topic=TOPIC) >= sizes
    assert value(consumed, "tidelog_messages_in_total", topic=TOPIC) == RECORDS  # reading appends nothing
    for api in ("metadata", "produce", "fetch", "find_coordinator", "join_group", "sync_group", "offset_commit"):
        count = value(consumed, "tidelog_request_latency_seconds_count", api=api)
        assert count >= 1, f"no latency observed for {api}"
        buckets = sorted(
            (float(dict(labels)["le"]), v)
            for (name, labels), v in consumed.items()
            if name == "tidelog_request_latency_seconds_bucket" and dict(labels)["api"] == api
        )
        assert [v for _, v in buckets] == sorted(v for _, v in buckets), f"{api}: buckets are not cumulative"
        assert buckets[-1] == (float("inf"), count)
        assert 0 < value(consumed, "tidelog_request_latency_seconds_sum", api=api) < count * 30
    broker.stop()


@pytest.mark.parametrize("host", ["", "x" * 64])
def test_a_bad_metrics_host_is_a_config_error(host: str) -> None:
    with pytest.raises(ConfigError, match=r"tidelog\.metrics\.host"):
        BrokerConfig.from_mapping({"tidelog.metrics.host": host})


def test_the_metrics_host_defaults_to_loopback() -> None:
    assert BrokerConfig.from_mapping({}).metrics_host == "127.0.0.1"
    assert BrokerConfig.from_mapping({"tidelog.metrics.host": "0.0.0.0"}).metrics_host == "0.0.0.0"
