"""A broker's own Kafka client: one asyncio TCP connection to another broker, one request in flight at a time.

What a follower's fetcher (broker/replica_fetcher.py) speaks to its leader. A request is `size | header | body`:
the header (v1, or v2 with tagged fields) is packed here; the body is a kio entity built from a plain dict by
`messages.build` (the same dict -> entity code the broker answers clients with), or bytes a caller encoded itself
(the follower's Fetch, replica_fetch_request.py); the response `size | header | body` is read by kio.
Record sets stay bytes (a Fetch response's `records`), which the caller hands to the storage engine unchanged.

Errors: a connection that breaks, closes or does not answer within the request's timeout raises
BrokerConnectionError and is closed; the caller connects again. Error codes inside a response are the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import struct
from typing import Any

from tidelog.errors import TidelogError
from tidelog.protocol.messages import build, reader, request_class, response_class, writer

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">ihhih")  # size (filled in last), api key, version, correlation id, client id length
MAX_RESPONSE_BYTES = 256 * 1024 * 1024  # a size above this is a stream out of step, not a response


class BrokerConnectionError(TidelogError):
    """The connection to another broker failed, closed, or timed out."""


class BrokerConnection:
    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation_id = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self, timeout_s: float) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise BrokerConnectionError(f"cannot connect to {self.address}: {exc or 'timed out'}") from exc

    async def request(self, api_key: int, version: int, body: dict[str, Any] | bytes, timeout_s: float) -> Any:
        """Send one request and return the response entity (kio's class for `api_key` and `version`); `body` is a
        dict kio encodes, or the body's bytes already encoded (replica_fetch_request.py)."""
        if self._reader is None or self._writer is None:
            await self.connect(timeout_s)
        assert self._reader is not None and self._writer is not None
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        correlation_id = self._correlation_id
        request_cls = request_class(api_key, version)
        client_id = self.client_id.encode()
        buffer = io.BytesIO()
        buffer.write(_HEADER.pack(0, api_key, version, correlation_id, len(client_id)))
        buffer.write(client_id)
        if request_cls.__header_schema__.__module__.split(".")[-2] == "v2":  # a flexible request's header
            buffer.write(b"\x00")  # no tagged fields
        if isinstance(body, bytes):
            buffer.write(body)
        else:
            writer(request_cls)(buffer, build(request_cls, body))
        data = buffer.getbuffer()
        _SIZE.pack_into(data, 0, len(data) - 4)
        try:
            self._writer.write(bytes(data))
            async with asyncio.timeout(timeout_s):  # no task per request, as wait_for would make
                payload = await self._read_response()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, BrokerConnectionError) as exc:
            await self.close()
            if isinstance(exc, BrokerConnectionError):
                raise
            reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            raise BrokerConnectionError(f"request to {self.address} failed: {reason}") from exc
        response_cls = response_class(api_key, version)
        try:
            response_header, offset = reader(response_cls.__header_schema__)(payload, 0)
            if response_header.correlation_id != correlation_id:
                raise BrokerConnectionError(
                    f"{self.address} answered correlation id {response_header.correlation_id}, "
                    f"expected {correlation_id}"
                )
            response, _ = reader(response_cls)(payload, offset)
        except BrokerConnectionError:
            await self.close()
            raise
        except Exception as exc:  # kio raises assorted errors on bytes it cannot read
            await self.close()
            raise BrokerConnectionError(f"cannot read the answer of {self.address}: {exc!r}") from exc
        return response

    async def _read_response(self) -> bytes:
        assert self._reader is not None and self._writer is not None
        await self._writer.drain()
        (size,) = _SIZE.unpack(await self._reader.readexactly(4))
        if not 0 < size <= MAX_RESPONSE_BYTES:
            raise BrokerConnectionError(f"{self.address} sent a response size of {size} bytes")
        return await self._reader.readexactly(size)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()
