"""Incremental fetch sessions (KIP-227) against one broker, spoken by hand (Fetch v12, tests/kafka_wire.py).

A full request with session epoch 0 opens a session; incremental requests (epoch 1, 2, ...) name only what changed
and are answered with only the partitions that have records, an error, or a moved offset; a repeated epoch, an
unknown session id and a session whose partitions are all forgotten are answered as Kafka answers them. Followers
in a cluster fetch this way (tests/cluster cover replication through it).
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire
from broker_process import BrokerProcess
from tidelog.codec.record_set import iter_records
from tidelog.protocol.messages import ApiKey

TOPIC = "fetch-sessions"
VERSION = 12
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
UNKNOWN_TOPIC_OR_PARTITION = 3


def fetch(
    broker: BrokerProcess,
    session_id: int,
    epoch: int,
    partitions: list[tuple[int, int]],
    *,
    forgotten: list[int] = (),  # type: ignore[assignment]
    max_wait: int = 0,
) -> Any:
    body = {
        "replica_id": -1,
        "max_wait": max_wait,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": session_id,
        "session_epoch": epoch,
        "topics": [
            {
                "topic": TOPIC,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                    for partition, offset in partitions
                ],
            }
        ]
        if partitions
        else [],
        "forgotten_topics_data": [{"topic": TOPIC, "partitions": list(forgotten)}] if forgotten else [],
        "rack_id": "",
    }
    return kafka_wire.request(broker.bootstrap, ApiKey.FETCH, VERSION, body)


def answered(response: Any) -> dict[int, tuple[int, int, list[bytes | None]]]:
    """partition -> (error code, high watermark, record values) of each partition the response carries."""
    return {
        p.partition_index: (p.error_code, p.high_watermark, [r.value for r in iter_records(p.records or b"")])
        for t in response.responses
        for p in t.partitions
    }


def produce(broker: BrokerProcess, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(TOPIC, f"p{partition}-{i}".encode(), partition=partition)
    assert producer.flush(10) == 0


@pytest.fixture(scope="module")
def topic(broker: BrokerProcess) -> str:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, 3, 1)]).values():
        future.result(15)
    produce(broker, 0, 5)
    produce(broker, 1, 5)
    return TOPIC


def test_a_session_answers_only_what_changed(broker: BrokerProcess, topic: str) -> None:
    opened = fetch(broker, 0, 0, [(0, 5), (1, 5), (2, 0), (7, 0)])
    assert opened.error_code == 0 and opened.session_id != 0
    assert answered(opened) == {
        0: (0, 5, []),
        1: (0, 5, []),
        2: (0, 0, []),
        7: (UNKNOWN_TOPIC_OR_PARTITION, -1, []),
    }
    session = opened.session_id

    # nothing new: only the partition in error is answered again, after the wait
    quiet = fetch(broker, session, 1, [], max_wait=100)
    assert (quiet.error_code, quiet.session_id) == (0, session)
    assert answered(quiet) == {7: (UNKNOWN_TOPIC_OR_PARTITION, -1, [])}

    # records on partition 1, asked for by nobody in this request: the session's offset is read
    produce(broker, 1, 2)
    moved = fetch(broker, session, 2, [])
    assert answered(moved) == {1: (0, 7, [b"p1-0", b"p1-1"]), 7: (UNKNOWN_TOPIC_OR_PARTITION, -1, [])}

    # the fetcher moves its offset; forgets the unknown partition
    caught_up = fetch(broker, session, 3, [(1, 7)], forgotten=[7])
    assert answered(caught_up) == {}

    # a repeated epoch, and an unknown session, are the response's own errors
    repeated = fetch(broker, session, 3, [])
    assert (repeated.error_code, answered(repeated)) == (INVALID_FETCH_SESSION_EPOCH, {})
    unknown = fetch(broker, session + 1 if session < (1 << 31) - 1 else 1, 1, [])
    assert unknown.error_code == FETCH_SESSION_ID_NOT_FOUND

    # the session goes on at the epoch it expected
    produce(broker, 2, 1)
    later = fetch(broker, session, 4, [])
    assert answered(later) == {2: (0, 1, [b"p2-0"])}

    # every partition forgotten: the session ends
    assert fetch(broker, session, 5, [], forgotten=[0, 1, 2]).error_code == 0
    assert fetch(broker, session, 6, []).error_code == FETCH_SESSION_ID_NOT_FOUND


def test_a_full_request_without_a_session_gets_none(broker: BrokerProcess, topic: str) -> None:
    """Session epoch -1 (what librdkafka sends): a full answer with session id 0; a full request naming a session
    closes it."""
    response = fetch(broker, 0, -1, [(0, 0)])
    assert (response.error_code, response.session_id) == (0, 0)
    assert len(answered(response)[0][2]) == 5
    opened = fetch(broker, 0, 0, [(0, 5)])
    closed = fetch(broker, opened.session_id, -1, [(0, 5)])
    assert (closed.error_code, closed.session_id) == (0, 0)
    assert fetch(broker, opened.session_id, 1, []).error_code == FETCH_SESSION_ID_NOT_FOUND
