"""A cheap asyncio Kafka client for the soak: one TCP connection, requests built with tidelog.protocol.

Hundreds of these cost one socket and a few coroutines each, where a librdkafka client costs threads and
several connections. Requests are kio entities filled by `tidelog.protocol.messages.build` (the same dict ->
entity code the broker answers with) and written by kio; responses are read by kio, record sets by tidelog's codec.
Requests on a connection are answered in order, so one request is in flight at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from tidelog.codec import record_set
from tidelog.codec.record_batch import Record, build_batch
from tidelog.protocol.messages import ApiKey, build

PRODUCE_VERSION = 7
FETCH_VERSION = 11


class WireError(Exception):
    """The broker answered with an error code, or the connection broke."""


class WireClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str) -> None:
        self.reader = reader
        self.writer = writer
        self.client_id = client_id
        self.correlation_id = 0

    @classmethod
    async def connect(cls, host: str, port: int, client_id: str) -> WireClient:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, client_id)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

    async def request(self, api_key: int, version: int, body: dict[str, Any], *, expect_answer: bool = True) -> Any:
        self.correlation_id += 1
        request_cls = load_request_schema(api_key, version)
        header_cls = request_cls.__header_schema__
        buffer = io.BytesIO()
        header = {"request_api_key": api_key, "request_api_version": version, "correlation_id": self.correlation_id}
        entity_writer(header_cls)(buffer, build(header_cls, {**header, "client_id": self.client_id}))
        entity_writer(request_cls)(buffer, build(request_cls, body))
        payload = buffer.getvalue()
        self.writer.write(struct.pack(">i", len(payload)) + payload)
        await self.writer.drain()
        if not expect_answer:
            return None
        (size,) = struct.unpack(">i", await self.reader.readexactly(4))
        data = await self.reader.readexactly(size)
        response_cls = load_response_schema(api_key, version)
        response_header, offset = entity_reader(response_cls.__header_schema__)(data, 0)
        if response_header.correlation_id != self.correlation_id:
            raise WireError(f"answer to request {response_header.correlation_id}, expected {self.correlation_id}")
        response, _ = entity_reader(response_cls)(data, offset)
        return response

    async def produce(self, topic: str, partition: int, records: list[Record]) -> int:
        """Append one batch with acks=all; the base offset the broker assigned."""
        body = {
            "transactional_id": None,
            "acks": -1,
            "timeout": 30_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": build_batch(records)}]}],
        }
        response = await self.request(ApiKey.PRODUCE, PRODUCE_VERSION, body)
        [topic_response] = response.responses
        [answer] = topic_response.partition_responses
        if answer.error_code != 0:
            raise WireError(f"produce to {topic}-{partition}: error {answer.error_code!r}")
        return int(answer.base_offset)

    async def fetch(self, topic: str, partition: int, offset: int, max_wait_ms: int = 500) -> list[Record]:
        """Records from `offset` on (a long poll of at most max_wait_ms when there are none)."""
        body = {
            "replica_id": -1,
            "max_wait": max_wait_ms,
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
                            "fetch_offset": offset,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                            "current_leader_epoch": -1,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        }
        response = await self.request(ApiKey.FETCH, FETCH_VERSION, body)
        if response.error_code != 0:
            raise WireError(f"fetch: error {response.error_code!r}")
        [topic_response] = response.responses
        [answer] = topic_response.partitions
        if answer.error_code != 0:
            raise WireError(f"fetch {topic}-{partition} at {offset}: error {answer.error_code!r}")
        return list(record_set.iter_records(answer.records or b"", min_offset=offset))
