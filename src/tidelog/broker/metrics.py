"""Prometheus metrics of a broker, served at `http://<tidelog.metrics.host>:<tidelog.metrics.port>/metrics`.

Families: `tidelog_bytes_in_total`, `tidelog_messages_in_total` and `tidelog_bytes_out_total` per topic (record
bytes appended by producers, records appended, record bytes sent to fetchers); `tidelog_request_latency_seconds`, a
histogram per API (`api` label: produce, fetch, join_group, ...); `tidelog_partition_size_bytes` and
`tidelog_partition_log_end_offset` per partition; `tidelog_consumer_groups`; `tidelog_connections`.
Counters are updated on the request path (cheap increments); sizes are read from the engine when
Prometheus scrapes. Each broker has its own registry, so several brokers can live in one process.
The host defaults to 127.0.0.1; port 0 picks a free port (logged at start, see `Metrics.port`); -1 (the default)
serves nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tidelog.protocol.messages import ApiKey
from tidelog.storage.api import Partition

log = logging.getLogger("tidelog.broker")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _StateCollector(Collector):
    def __init__(
        self,
        partitions: Callable[[], Mapping[tuple[str, int], Partition]],
        group_count: Callable[[], int],
        connection_count: Callable[[], int],
    ) -> None:
        self.partitions = partitions
        self.group_count = group_count
        self.connection_count = connection_count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sizes = GaugeMetricFamily(
            "tidelog_partition_size_bytes", "Bytes in a partition's segments", labels=["topic", "partition"]
        )
        ends = GaugeMetricFamily(
            "tidelog_partition_log_end_offset", "Next offset of a partition", labels=["topic", "partition"]
        )
        for (topic, partition), partition_log in self.partitions().items():
            sizes.add_metric([topic, str(partition)], partition_log.size_in_bytes)
            ends.add_metric([topic, str(partition)], partition_log.log_end_offset)
        yield sizes
        yield ends
        groups = GaugeMetricFamily("tidelog_consumer_groups", "Consumer groups known to the coordinator")
        groups.add_metric([], self.group_count())
        yield groups
        connections = GaugeMetricFamily("tidelog_connections", "Open client connections")
        connections.add_metric([], self.connection_count())
        yield connections


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.bytes_in = Counter(
            "tidelog_bytes_in", "Record bytes appended by producers", ["topic"], registry=self.registry
        )
        self.messages_in = Counter(
            "tidelog_messages_in", "Records appended by producers", ["topic"], registry=self.registry
        )
        self.bytes_out = Counter(
            "tidelog_bytes_out", "Record bytes sent to fetchers", ["topic"], registry=self.registry
        )
        self.request_latency = Histogram(
            "tidelog_request_latency_seconds",
            "Time to answer a request",
            ["api"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._latency_by_api: dict[int, Any] = {}
        self._topic_counters: dict[str, tuple[Any, Any, Any]] = {}
        self._server: WSGIServer | None = None
        self.port: int | None = None

    def watch(
        self,
        partitions: Callable[[], Mapping[tuple[str, int], Partition]],
        group_count: Callable[[], int],
        connection_count: Callable[[], int],
    ) -> None:
        """Report the broker's state at each scrape: partition sizes and ends, groups, connections."""
        self.registry.register(_StateCollector(partitions, group_count, connection_count))

    def expect_apis(self, api_keys: Iterable[int]) -> None:
        """Export a latency series for each API the broker serves from the start, before any request."""
        for api_key in api_keys:
            self.latency_of(api_key)

    def latency_of(self, api_key: int) -> Any:
        latency = self._latency_by_api.get(api_key)
        if latency is None:
            latency = self._latency_by_api[api_key] = self.request_latency.labels(ApiKey(api_key).name.lower())
        return latency

    def of_topic(self, topic: str) -> tuple[Any, Any, Any]:
        """(bytes in, messages in, bytes out) counters of a topic; labelled children are cached."""
        counters = self._topic_counters.get(topic)
        if counters is None:
            counters = (self.bytes_in.labels(topic), self.messages_in.labels(topic), self.bytes_out.labels(topic))
            self._topic_counters[topic] = counters
        return counters

    def serve(self, host: str, port: int) -> None:
        if port < 0:
            return
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_address[1]
        log.info("serving metrics on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
