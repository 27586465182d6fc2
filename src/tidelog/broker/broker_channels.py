"""The connections of an inter-broker channel: one destination per other broker of the cluster, each with its own
queue and connection (protocol/client.py), used by the channels that send other brokers requests a batch at a time
(txn_marker_channel.py's WriteTxnMarkers, txn_verification.py's AddPartitionsToTxn verify_only).

- `get(broker_id)` is the destination at the broker's current endpoint on the inter-broker listener, or None while it
  has none registered. The first call makes it; a broker that registered again at another address gets a new one,
  and the old one is retired (its queue answered as its channel says, its connection closed in the background).
- `close()` retires every destination and waits for their connections to close; `get` answers None from then on.

Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from tidelog.protocol.client import BrokerConnection

if TYPE_CHECKING:
    from tidelog.broker import zk_layout as zk


class Destination(Protocol):
    host: str
    port: int

    def retire(self) -> None:
        """Stop sending; answer what is queued."""

    async def closed(self) -> None:
        """Wait for the sending to stop, then close the connection."""


D = TypeVar("D", bound=Destination)


class BrokerChannels(Generic[D]):
    def __init__(
        self,
        live_brokers: Callable[[], Mapping[int, zk.BrokerRegistration]],
        listener_name: str,
        client_id: str,
        make: Callable[[BrokerConnection], D],
    ) -> None:
        """`make` builds a destination around a new connection; `client_id` names this broker's connections."""
        self.live_brokers = live_brokers
        self.listener_name = listener_name
        self.client_id = client_id
        self.make = make
        self._destinations: dict[int, D] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def get(self, broker_id: int) -> D | None:
        if self._closed:
            return None
        registration = self.live_brokers().get(broker_id)
        endpoint = registration.endpoint(self.listener_name) if registration is not None else None
        if endpoint is None:
            return None
        destination = self._destinations.get(broker_id)
        if destination is None or (destination.host, destination.port) != (endpoint.host, endpoint.port):
            if destination is not None:
                self._retire(destination)
            destination = self._destinations[broker_id] = self.make(
                BrokerConnection(endpoint.host, endpoint.port, self.client_id)
            )
        return destination

    def _retire(self, destination: D) -> None:
        destination.retire()
        task = asyncio.create_task(destination.closed())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        self._closed = True
        for destination in self._destinations.values():
            self._retire(destination)
        self._destinations = {}
        await asyncio.gather(*self._closing, return_exceptions=True)
