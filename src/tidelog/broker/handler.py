"""What a request handler sees and returns: the leaf types every part of the broker shares.

A handler is `async (request, connection) -> Response` for one API key, registered with the versions it serves
(`ApiHandler`); the broker's composition root (broker.py) builds the one table of them, and the server (server.py)
routes each decoded request through it. A handler answers with:

- a dict: the response body, kio field names as keys (protocol/messages.py builds the negotiated version);
- a RawResponse: bytes and file slices the handler encoded itself (Fetch, so record bytes go out by sendfile);
- a Deferred: an awaitable of the body, for an answer that waits (acks=all waits for its fsync) - the connection
  reads its next request meanwhile and still answers in order;
- None: no response (acks=0).

`Connection` is the per-client state handlers read: the listener, the principal, SASL progress; a handler that
throttles a client (quotas.py) mutes its connection through `throttle`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidelog.broker.config import Listener
from tidelog.broker.tls import ANONYMOUS
from tidelog.protocol.fetch_response import Part
from tidelog.protocol.messages import Request

if TYPE_CHECKING:
    from tidelog.broker.sasl import SaslSession


@dataclass
class RawResponse:
    """A response encoded by its handler: bytes and file slices, already framed."""

    parts: list[Part]
    size: int


@dataclass
class Deferred:
    """A response that is ready later (an acks=all produce waiting for its fsync)."""

    body: Awaitable[dict[str, Any] | None]


Response = dict[str, Any] | RawResponse | Deferred | None


@dataclass(eq=False)
class Connection:
    listener: Listener
    advertised_host: str
    advertised_port: int
    peer: str
    host: str = ""  # the client's address, which ACL host fields match
    in_flight: int = 0  # requests read whose response has not been written yet
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    principal: str = ANONYMOUS
    authenticated: bool = True  # False on a SASL listener until SaslAuthenticate succeeds
    sasl: SaslSession | None = None
    closing: bool = False  # answer what is pending, then close (failed authentication)
    muted_until: float = 0.0  # time.monotonic() before which the server reads nothing more (a quota's throttle)

    @property
    def busy(self) -> bool:
        return self.in_flight > 0

    def throttle(self, throttle_ms: int) -> None:
        """Mute the connection for `throttle_ms` from now (KIP-219: the response goes out, the next request waits)."""
        if throttle_ms > 0:
            self.muted_until = max(self.muted_until, time.monotonic() + throttle_ms / 1000)


Handler = Callable[[Request, Connection], Awaitable[Response]]

# (topic, partition, the client's current leader epoch or -1) -> None, raising unless this broker leads the partition
# (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, ...). A broker of a cluster passes its metadata cache's check to the
# produce and fetch handlers; a single broker leads everything and passes none.
LeaderCheck = Callable[[str, int, int], None]


@dataclass
class ApiHandler:
    min_version: int
    max_version: int
    handle: Handler


HandlerTable = dict[int, ApiHandler]
