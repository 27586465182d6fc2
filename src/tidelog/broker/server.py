"""The Kafka protocol server: listeners, connections, framing, routing through the handler table, sending.

It knows nothing of what the handlers do: the broker's composition root (broker.py) builds the table and owns the
parts. The server answers ApiVersions itself, from the table it was given.

Each connection reads frames one at a time and answers them in order (as Kafka does, a connection's
next request waits for the current response; clients pipeline across connections). A frame that is
too large, too small or does not decode closes that connection and is logged; a handler failure
closes that connection too. A request of an API or version outside the table (which ApiVersions advertises;
docs/compatibility.md sets it beside Kafka 3.9's) is answered as Kafka answers it: ApiVersions with v0,
UNSUPPORTED_VERSION and the table; any other closes its connection (after the responses owed), logged once per
(client id, API, version). Nothing a client sends stops the broker or touches stored data.
Shutdown (broker.py drives it): stop accepting, then - once the broker has woken what waits inside handlers - let
in-flight requests finish for up to shutdown.timeout.ms and close the connections.
Zero-copy: a Fetch response's record bytes are file slices; on plain TCP each slice of at least SENDFILE_MIN_BYTES
(64 KiB) goes out with `loop.sendfile` (os.sendfile) straight from the segment file, a smaller one with one pread and
a buffered write. sendfile first drains the transport and costs a loop round trip, ~45-70 us per slice whatever its
size here; pread+write costs 4 us at 1 KiB and 42 us at 64 KiB; the two cross between 64 and 128 KiB (2 cores,
loopback, one connection). So small fetches (a consumer at the tail) skip the round trip, large ones copy nothing.
A response smaller than that altogether goes out as one buffer: one send and one wake-up of the receiver, not one
per part; and when nothing else is owed on its connection and the socket's buffer is empty, the reader writes it
itself instead of waking the sender task (a loop pass less per request).
Security: SSL and SASL_SSL listeners wrap connections in TLS; each connection carries its principal, set by
sasl.py (SASL listeners start unauthenticated and may only authenticate) or from the client certificate, and
handlers check it with their authorizer (authorizer.py).
Quotas (quotas.py): the time each handler spends before it answers is recorded against the client's
`request_percentage` (ApiVersions, SASL and inter-broker requests are exempt, as in Kafka); when a request quota or
a handler's byte-rate quota throttles the client, the response carries the throttle time and the connection is
muted: its next request is not read before the throttle time has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from typing import Any

from tidelog.broker import tls
from tidelog.broker.config import BrokerConfig, Listener
from tidelog.broker.handler import ApiHandler, Connection, Deferred, HandlerTable, RawResponse, Response
from tidelog.broker.metrics import Metrics
from tidelog.broker.quotas import NANOS_TO_PERCENT, ClientQuotaManager, QuotaKind
from tidelog.broker.sasl import PRE_AUTHENTICATION_APIS, open_session
from tidelog.broker.zk_layout import Endpoint
from tidelog.errors import FrameError, MalformedRequestError, UnsupportedVersionError
from tidelog.protocol.fetch_response import Part
from tidelog.protocol.framing import SIZE, check_frame_size
from tidelog.protocol.messages import ApiKey, Request, decode_request, encode_response, millis, peek_client_id
from tidelog.storage.api import FileSlice, MemorySlice

log = logging.getLogger("tidelog.broker")


_Pending = bytes | RawResponse | None | asyncio.Task[bytes | RawResponse | None]
_END_OF_REQUESTS: Any = object()
MAX_PIPELINED_RESPONSES = 128
SENDFILE_MIN_BYTES = 64 * 1024  # slices below this go by pread + write (see the module header for the figures)
TLS_WRITE_CHUNK_BYTES = 1024 * 1024  # over TLS (no sendfile) slices are pread and written in chunks of this size
TLS_HANDSHAKE_TIMEOUT_S = 10.0
API_VERSIONS_MAX_VERSION = 4
# Requests no request quota applies to (Kafka exempts these and the inter-broker ones; a follower's Fetch too).
QUOTA_EXEMPT_APIS = frozenset(
    {
        ApiKey.API_VERSIONS,
        ApiKey.SASL_HANDSHAKE,
        ApiKey.SASL_AUTHENTICATE,
        ApiKey.CONTROLLED_SHUTDOWN,
    }
)


class KafkaServer:
    def __init__(
        self,
        config: BrokerConfig,
        handlers: HandlerTable,
        metrics: Metrics,
        quotas: ClientQuotaManager | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.quotas = quotas
        self.handlers: HandlerTable = {
            ApiKey.API_VERSIONS: ApiHandler(0, API_VERSIONS_MAX_VERSION, self._api_versions),
            **handlers,
        }
        self.supported = {key: (h.min_version, h.max_version) for key, h in self.handlers.items()}
        self.stopping = False
        self._servers: list[tuple[Listener, asyncio.Server, int]] = []
        self._connections: set[Connection] = set()
        self._refused: set[tuple[str | None, int, int]] = set()  # (client id, API key, version) already logged

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    # --- lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        context = self._ssl_context() if any(listener.tls for listener in self.config.listeners) else None
        for listener in self.config.listeners:
            server = await asyncio.start_server(
                functools.partial(self._accept, listener),
                listener.host,
                listener.port,
                reuse_address=True,
                ssl=context if listener.tls else None,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if listener.tls else None,
            )
            port = server.sockets[0].getsockname()[1]
            self._servers.append((listener, server, port))
            log.info("listening on %s://%s:%d", listener.name, listener.host, port)

    def _ssl_context(self) -> ssl.SSLContext:
        security = self.config.security
        assert security.ssl_keystore_location is not None  # checked when the config was read
        return tls.server_context(
            security.ssl_keystore_location,
            security.ssl_key_password,
            security.ssl_truststore_location,
            security.ssl_client_auth,
            security.ssl_enabled_protocols,
            security.ssl_cipher_suites,
        )

    def endpoints(self) -> tuple[Endpoint, ...]:
        """Each listener at the address clients are told to use (advertised.listeners, or where it is bound)."""
        endpoints = []
        for listener, _server, port in self._servers:
            host, advertised_port = self.config.advertised_for(listener, port)
            endpoints.append(Endpoint(listener.name, host, advertised_port, listener.protocol))
        return tuple(endpoints)

    @property
    def bound_ports(self) -> list[int]:
        return [port for _, _, port in self._servers]

    def stop_accepting(self) -> None:
        self.stopping = True
        for _, server, _ in self._servers:
            server.close()

    async def close_connections(self, timeout_s: float) -> None:
        """Let in-flight requests finish for up to `timeout_s`, then close every connection."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        for connection in list(self._connections):
            if not connection.busy and connection.task is not None:
                connection.task.cancel()
        while any(c.busy for c in self._connections) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self._connections):
            if connection.task is not None:
                connection.task.cancel()
        for _, server, _ in self._servers:
            await server.wait_closed()

    # --- connections ------------------------------------------------------------------------------------------

    async def _accept(self, listener: Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = next(p for lst, _, p in self._servers if lst is listener)
        host, advertised_port = self.config.advertised_for(listener, port)
        peer = writer.get_extra_info("peername")
        connection = Connection(
            listener, host, advertised_port, f"{peer[0]}:{peer[1]}" if peer else "?", host=peer[0] if peer else ""
        )
        connection.task = asyncio.current_task()
        open_session(connection, writer.get_extra_info("ssl_object"))
        self._connections.add(connection)
        try:
            await self._serve(connection, reader, writer)
        except asyncio.CancelledError:
            pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except (FrameError, MalformedRequestError) as exc:
            log.warning("closing connection from %s: %s", connection.peer, exc)
        except Exception:
            log.exception("closing connection from %s after an unexpected error", connection.peer)
        finally:
            self._connections.discard(connection)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, connection: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read and handle requests in order; a sender task writes the responses in the same order. A handler
        that must wait for durability (Deferred) lets the next request in meanwhile, so pipelined acks=all
        produces share fsync rounds instead of queueing one round each."""
        max_bytes = self.config.socket_request_max_bytes
        responses: asyncio.Queue[_Pending] = asyncio.Queue()
        window = asyncio.Semaphore(MAX_PIPELINED_RESPONSES)  # responses owed at most; the sender frees slots
        sender = asyncio.create_task(self._send_in_order(responses, writer, connection, window))
        sender.add_done_callback(functools.partial(_close_if_sending_failed, writer, connection))
        try:
            while not self.stopping and not sender.done():
                muted_s = connection.muted_until - time.monotonic()
                if muted_s > 0:  # a quota throttled this client: its next request waits
                    await asyncio.sleep(muted_s)
                    continue
                try:
                    (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        raise
                    break  # the client closed its side between requests: answer what is pending, then close
                if not connection.authenticated and size > self.config.security.sasl_server_max_receive_size:
                    raise FrameError(
                        f"frame of {size} bytes before authentication exceeds sasl.server.max.receive.size"
                    )
                check_frame_size(size, max_bytes)
                payload = await reader.readexactly(size)
                if not await _acquire_unless_done(window, sender):
                    break  # the sender failed (the socket is gone): stop reading
                connection.in_flight += 1
                response = await self._handle(payload, connection)
                if connection.in_flight == 1 and _write_at_once(writer, response):
                    connection.in_flight -= 1  # nothing owed before it: written here, the sender not woken
                    window.release()
                else:
                    responses.put_nowait(response)
                if connection.closing:
                    break  # e.g. failed authentication: send what is owed, then close
            responses.put_nowait(_END_OF_REQUESTS)
            await sender
        finally:
            await _abandon(sender, responses, connection)

    async def _send_in_order(
        self,
        responses: asyncio.Queue[_Pending],
        writer: asyncio.StreamWriter,
        connection: Connection,
        window: asyncio.Semaphore,
    ) -> None:
        while (item := await responses.get()) is not _END_OF_REQUESTS:
            try:
                response = await item if isinstance(item, asyncio.Task) else item
                if response is not None:
                    await self._send(writer, response, zero_copy=not connection.listener.tls)
            finally:
                connection.in_flight -= 1
                window.release()

    async def _handle(self, payload: bytes, connection: Connection) -> _Pending:
        try:
            request = decode_request(payload, self.supported)
        except UnsupportedVersionError as exc:
            if exc.api_key == ApiKey.API_VERSIONS:  # answered with v0 and the versions we do speak
                return encode_response(ApiKey.API_VERSIONS, 0, exc.correlation_id, self._versions_body(35))
            self._refuse_version(exc, payload, connection)
            return None
        if not connection.authenticated and request.api_key not in PRE_AUTHENTICATION_APIS:
            log.warning(
                "closing connection from %s: %s request before SASL authentication",
                connection.peer,
                _api_name(request.api_key),
            )
            connection.closing = True
            return None
        started = time.perf_counter()
        body = await self.handlers[request.api_key].handle(request, connection)
        throttle_ms = self._request_quota(request, connection, time.perf_counter() - started)
        if isinstance(body, Deferred):
            return asyncio.create_task(self._finish(request, body, started, throttle_ms))
        return self._encode(request, body, started, throttle_ms)

    def _refuse_version(self, exc: UnsupportedVersionError, payload: bytes, connection: Connection) -> None:
        """A request of an API or version outside the table ends its connection, as Kafka's SocketServer does (its
        request header cannot be parsed into a request: InvalidRequestException, the channel closed); ApiVersions
        told the client the truth beforehand. Logged once per (client id, API, version) per broker run: a client
        that reconnects and asks again is the same news."""
        client_id = peek_client_id(payload)
        if (seen := (client_id, exc.api_key, exc.api_version)) not in self._refused:
            self._refused.add(seen)
            name = _api_name(exc.api_key) if exc.api_key in ApiKey._value2member_map_ else f"API key {exc.api_key}"
            versions = self.supported.get(exc.api_key)
            log.warning(
                "closing connections of client id %r (first from %s): %s v%d is not served (%s); "
                "logged once per client id, API and version",
                client_id,
                connection.peer,
                name,
                exc.api_version,
                f"versions {versions[0]}-{versions[1]}" if versions else "unknown API",
            )
        connection.closing = True

    def _request_quota(self, request: Request, connection: Connection, handler_s: float) -> int:
        """Record the handler's time against the client's request quota; mute the connection when throttled."""
        if (
            self.quotas is None
            or request.api_key in QUOTA_EXEMPT_APIS
            or (request.api_key == ApiKey.FETCH and getattr(request.body, "replica_id", -1) >= 0)
        ):
            return 0
        percent = handler_s * 1e9 * NANOS_TO_PERCENT
        throttle_ms = self.quotas.record(QuotaKind.REQUEST, connection.principal, request.client_id, percent)
        connection.throttle(throttle_ms)
        return throttle_ms

    async def _finish(
        self, request: Request, deferred: Deferred, started: float, throttle_ms: int
    ) -> bytes | RawResponse | None:
        return self._encode(request, await deferred.body, started, throttle_ms)

    def _encode(self, request: Request, body: Response, started: float, throttle_ms: int) -> bytes | RawResponse | None:
        response: bytes | RawResponse | None
        if body is None or isinstance(body, RawResponse):
            response = body
        else:
            assert not isinstance(body, Deferred)
            if throttle_ms > millis(body.get("throttle_time", throttle_ms)):  # only where the response has one
                body["throttle_time"] = throttle_ms
            response = encode_response(request.api_key, request.api_version, request.correlation_id, body)
        self.metrics.latency_of(request.api_key).observe(time.perf_counter() - started)
        return response

    async def _send(self, writer: asyncio.StreamWriter, response: bytes | RawResponse, *, zero_copy: bool) -> None:
        """Write one response. File slices go by sendfile on plain TCP; over TLS (no sendfile: the bytes must be
        encrypted in user space) they are pread and written in chunks, draining between chunks."""
        if isinstance(response, bytes) or response.size < SENDFILE_MIN_BYTES:
            writer.write(_small_response_bytes(response))
            await writer.drain()
            return
        loop = asyncio.get_running_loop()
        for part in response.parts:
            if isinstance(part, FileSlice) and not zero_copy:
                for start in range(0, part.length, TLS_WRITE_CHUNK_BYTES):
                    length = min(TLS_WRITE_CHUNK_BYTES, part.length - start)
                    writer.write(part.read_range(start, length))
                    if length == TLS_WRITE_CHUNK_BYTES:
                        await writer.drain()
            elif isinstance(part, FileSlice) and part.length < SENDFILE_MIN_BYTES:
                writer.write(part.read())  # small: one pread beats the drain + sendfile round trip
            elif isinstance(part, FileSlice):
                await writer.drain()
                try:
                    await loop.sendfile(writer.transport, part.file, part.position, part.length, fallback=False)
                except (NotImplementedError, asyncio.SendfileNotAvailableError):
                    writer.write(part.read())  # no zero-copy on this transport (e.g. TLS): pread and write
            elif isinstance(part, MemorySlice):
                writer.write(part.data)  # a buffer the engine built for this read: written without a copy
            else:
                writer.write(part)
        await writer.drain()

    # --- ApiVersions ------------------------------------------------------------------------------------------

    def _versions_body(self, error_code: int = 0) -> dict[str, Any]:
        return {
            "error_code": error_code,
            "api_keys": [
                {"api_key": key, "min_version": h.min_version, "max_version": h.max_version}
                for key, h in sorted(self.handlers.items())
            ],
            "throttle_time": 0,
        }

    async def _api_versions(self, request: Request, connection: Connection) -> Response:
        return self._versions_body()


def _small_response_bytes(response: bytes | RawResponse) -> bytes:
    """A response under SENDFILE_MIN_BYTES as one buffer: one send, one wake-up of the receiver (not one per part:
    a follower's Fetch answer is a header, a slice and the rest of the partitions)."""
    if isinstance(response, bytes):
        return response
    return b"".join(_buffer(part) for part in response.parts)


def _buffer(part: Part) -> bytes | memoryview:
    """A response part's bytes in memory: a file slice read, an engine's buffer as it is."""
    if isinstance(part, FileSlice):
        return part.read()
    return part.data if isinstance(part, MemorySlice) else part


def _write_at_once(writer: asyncio.StreamWriter, response: _Pending) -> bool:
    """Write a ready response now when it is small and the transport holds nothing unsent (so the write cannot
    pile up: the next one waits for an empty buffer again); False leaves it to the sender task. Used when nothing
    else is owed on the connection: one loop pass sooner than waking the sender."""
    if response is None or isinstance(response, asyncio.Task) or writer.transport.get_write_buffer_size():
        return False
    if not isinstance(response, bytes) and response.size >= SENDFILE_MIN_BYTES:
        return False
    writer.write(_small_response_bytes(response))
    return True


def _api_name(key: int) -> str:
    return ApiKey(key).name.lower()


async def _acquire_unless_done(window: asyncio.Semaphore, sender: asyncio.Task[None]) -> bool:
    """Take a response slot; False if the sender ends first (then no slot would ever be freed)."""
    if not window.locked():
        await window.acquire()
        return True
    acquiring = asyncio.ensure_future(window.acquire())
    await asyncio.wait({acquiring, sender}, return_when=asyncio.FIRST_COMPLETED)
    if acquiring.done():
        return True
    acquiring.cancel()
    return False


def _close_if_sending_failed(writer: asyncio.StreamWriter, connection: Connection, sender: asyncio.Task[None]) -> None:
    """A response that could not be prepared or written (a read error on a segment file, say) ends the connection:
    its client would wait for that answer for ever while the reader waited for the client's next request."""
    if sender.cancelled() or sender.exception() is None:
        return
    error = sender.exception()
    if not isinstance(error, ConnectionError):
        log.error("closing connection from %s: a response could not be sent", connection.peer, exc_info=error)
    writer.transport.abort()


async def _abandon(sender: asyncio.Task[None], responses: asyncio.Queue[_Pending], connection: Connection) -> None:
    """On the way out: stop the sender, cancel responses still being prepared, and collect every outcome
    (so no 'exception was never retrieved'); the connection owes nothing any more."""
    sender.cancel()
    await asyncio.gather(sender, return_exceptions=True)
    leftovers = []
    while not responses.empty():
        item = responses.get_nowait()
        if item is _END_OF_REQUESTS:
            continue
        connection.in_flight -= 1
        if isinstance(item, asyncio.Task):
            item.cancel()
            leftovers.append(item)
    await asyncio.gather(*leftovers, return_exceptions=True)
