"""One Kafka request over a socket, built and read with kio (as tests/soak/wire_client.py does, but blocking): what
the cluster suites ask a broker directly when librdkafka hides the answer (leader epochs, per-partition errors)."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.serial import entity_reader, entity_writer

from tidelog.codec.record_batch import Record, build_batch
from tidelog.protocol.legacy_schemas import request_schema, response_schema
from tidelog.protocol.messages import ApiKey, build

METADATA_VERSION = 12
PRODUCE_VERSION = 7
FETCH_VERSION = 12


def request(bootstrap: str, api_key: int, version: int, body: dict[str, Any], timeout_s: float = 15) -> Any:
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(encode_request(api_key, version, body))
        (size,) = struct.unpack(">i", _read(sock, 4))
        data = _read(sock, size)
    return decode_response(api_key, version, data)


def encode_request(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 1) -> bytes:
    """The framed request (size, header, body), kio's fields by name as `build` takes them."""
    request_cls = request_schema(api_key, version)  # kio's, or Kafka 3.9's oldest that kio lacks
    buffer = io.BytesIO()
    header = {
        "request_api_key": api_key,
        "request_api_version": version,
        "correlation_id": correlation_id,
        "client_id": "test",
    }
    entity_writer(request_cls.__header_schema__)(buffer, build(request_cls.__header_schema__, header))
    entity_writer(request_cls)(buffer, build(request_cls, body))
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def decode_response(api_key: int, version: int, data: bytes) -> Any:
    """The kio response entity of a response frame's payload (what follows its size)."""
    response_cls = response_schema(api_key, version)
    _header, offset = entity_reader(response_cls.__header_schema__)(data, 0)
    response, _ = entity_reader(response_cls)(data, offset)
    return response


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def metadata(bootstrap: str, topics: list[str] | None = None, *, auto_create: bool = False) -> Any:
    body = {
        "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
        "allow_auto_topic_creation": auto_create,
        "include_topic_authorized_operations": False,
    }
    return request(bootstrap, ApiKey.METADATA, METADATA_VERSION, body)


def partitions(bootstrap: str, topic: str) -> dict[int, tuple[int, int, int, list[int], list[int], list[int]]]:
    """partition -> (error code, leader, leader epoch, replicas, ISR, offline replicas) from the broker's Metadata
    ({} while the broker answers the topic with an error: it has not seen it yet, or it has no leaders yet)."""
    [answer] = [t for t in metadata(bootstrap, [topic]).topics if t.name == topic]
    if answer.error_code != 0:
        return {}
    return {
        p.partition_index: (
            int(p.error_code),
            int(p.leader_id),
            int(p.leader_epoch),
            sorted(p.replica_nodes),
            sorted(p.isr_nodes),
            sorted(p.offline_replicas),
        )
        for p in answer.partitions
    }


def produce_error(bootstrap: str, topic: str, partition: int) -> int:
    """The error code a Produce (acks=1) of one record to `topic`-`partition` gets from this broker."""
    body = {
        "transactional_id": None,
        "acks": 1,
        "timeout": 10_000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": build_batch([Record(b"wire")])}]}
        ],
    }
    response = request(bootstrap, ApiKey.PRODUCE, PRODUCE_VERSION, body)
    return int(response.responses[0].partition_responses[0].error_code)


def fetch_error(bootstrap: str, topic: str, partition: int, leader_epoch: int = -1) -> int:
    """The error code a consumer's Fetch of `topic`-`partition` from offset 0 gets from this broker."""
    return int(fetch_partition(bootstrap, topic, partition, leader_epoch=leader_epoch).error_code)


def fetch_partition(bootstrap: str, topic: str, partition: int, *, leader_epoch: int = -1, rack: str = "") -> Any:
    """What a consumer in `rack` gets for its Fetch of `topic`-`partition` from offset 0 (error_code, records,
    preferred_read_replica, ...)."""
    body = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "fetch_offset": 0,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                        "current_leader_epoch": leader_epoch,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": rack,
    }
    response = request(bootstrap, ApiKey.FETCH, FETCH_VERSION, body)
    return response.responses[0].partitions[0]


def find_coordinator(bootstrap: str, group: str) -> tuple[int, int]:
    """(error code, node id) of this broker's FindCoordinator answer for `group`."""
    response = request(bootstrap, ApiKey.FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
    return int(response.error_code), int(response.node_id)


def list_offsets_error(bootstrap: str, topic: str, partition: int) -> int:
    """The error code a ListOffsets (latest) of `topic`-`partition` gets from this broker."""
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}]}
        ],
    }
    response = request(bootstrap, ApiKey.LIST_OFFSETS, 7, body)
    return int(response.topics[0].partitions[0].error_code)
