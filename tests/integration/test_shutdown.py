"""A broker stops promptly and cleanly even when a client vanishes in the middle of pipelined requests."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.codec.record_batch import Record, build_batch


def produce_request(correlation_id: int, topic: str) -> bytes:
    """Produce v3, acks=all, one small batch (hand-built: the test needs hundreds in flight at once)."""
    batch = build_batch([Record(value=b"x" * 100)])
    name = topic.encode()
    body = (
        struct.pack(">hhih", 0, 3, correlation_id, 4)
        + b"test"  # header v1: api, version, correlation, client id
        + struct.pack(">hhi", -1, -1, 30_000)  # transactional id null, acks=all, timeout
        + struct.pack(">ih", 1, len(name))
        + name
        + struct.pack(">iii", 1, 0, len(batch))
        + batch
    )
    return struct.pack(">i", len(body)) + body


def test_a_client_vanishing_with_hundreds_of_acks_all_produces_in_flight(start_broker: Any) -> None:
    broker = start_broker({"log.flush.interval.messages": 1})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("vanishing", 1, 1)])["vanishing"].result(10)
    host, port = broker.bootstrap.split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # read nothing, and let little pile up here
    sock.connect((host, int(port)))
    sock.settimeout(5)
    # Far more requests than the broker keeps responses in flight for; a timeout means the broker stopped
    # reading because its response window is full, which is the state under test.
    with contextlib.suppress(TimeoutError):
        sock.sendall(b"".join(produce_request(i, "vanishing") for i in range(3000)))
    time.sleep(1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # RST: the responses the broker still owes cannot be delivered
    time.sleep(0.5)
    started = time.monotonic()
    assert broker.stop() == 0
    assert time.monotonic() - started < 10, "the broker waited for a connection whose client was gone"
