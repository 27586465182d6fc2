"""A fault-injecting TCP proxy the cluster's fault suites control: network partitions between brokers, and between a
broker and ZooKeeper, on one machine.

Contract of `FaultProxy(target_host, target_port)`:

- It listens on 127.0.0.1 on an ephemeral port (`.port`, `.address` = "127.0.0.1:<port>") as soon as it is built,
  and for every connection it accepts opens one to the target and forwards bytes both ways, half-closes (EOF)
  included. One asyncio loop in a background thread does all the socket work; the control methods below run on
  that loop and return once they are in effect. No polling: every wait is on a socket or an event.
- `cut()`: a silent partition in both directions. Existing connections stay open but nothing crosses: the proxy
  stops reading what a peer sends (it waits in the kernel's buffers, and the peer's writes block once they fill),
  and bytes it had already read are held, not forwarded. Neither peer sees a reset or an EOF - only silence, until
  its own timeouts fire. New connections are accepted but go nowhere: no connection to the target is opened (a TCP
  handshake needs both directions), whatever the client sends is held.
- `cut_direction("upstream" | "downstream")`: a one-way partition. "upstream" stops client -> target bytes,
  "downstream" target -> client; the other direction keeps flowing on existing connections. New connections, as
  under `cut()`, wait (no handshake gets through a one-way partition either).
- `heal()`: the network is whole again. The choice made here: every connection that was stalled (it existed, or
  was accepted, while any direction was cut) is closed - the held bytes are dropped, each peer sees its
  connection end (an EOF, or a reset if it had sent bytes the proxy never read) - so the peers reconnect, as they
  would after their timeouts over a real partition that lasted long. New connections work again at once.
  `heal(close_stalled=False)` instead resumes the stalled connections (the held bytes are delivered, waiting new
  connections reach the target): a partition shorter than every timeout, which TCP retransmission hides.
- `reset()`: every current connection is closed with a TCP RST on both sides now (SO_LINGER 0): the peers get a
  connection error (ECONNRESET). The cut state is unchanged; the proxy keeps accepting.
- `retarget(host, port)`: where connections accepted from now on go (a broker's port known only after it starts:
  make the proxy first, advertise its port, then point it at the broker).
- `close()`: stops listening, resets every connection, ends the thread; idempotent. A context manager closes on
  exit.

A target that refuses the connection (or does not answer within `connect_timeout_s`) gets the client a reset.
Bytes the proxy had handed to the kernel before a `cut()` returned may still arrive: a cut, like a real one, does
not recall packets already on the wire.

Use: point a broker's `zookeeper.connect` at a proxy to ZooKeeper and cut it to cut that broker from ZooKeeper;
advertise a broker's listener as a proxy's port and cut it to cut the other brokers and the clients from it.
`ProxyRegistry` makes and closes several proxies by name (`cut`/`heal` of some or all of them at once); the
`fault_proxies` fixture in tests/cluster/conftest.py yields one that is closed after the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine, Iterable, Iterator
from types import TracebackType
from typing import Any, Literal, TypeVar

UPSTREAM = "upstream"  # client -> target
DOWNSTREAM = "downstream"  # target -> client
Direction = Literal["upstream", "downstream"]
CHUNK = 64 * 1024
CONTROL_TIMEOUT_S = 10.0
_LINGER_ZERO = struct.pack("ii", 1, 0)  # close() then sends a RST instead of a FIN
T = TypeVar("T")


class _Connection:
    """One client connection and its connection to the target, with their tasks."""

    def __init__(self, client: asyncio.StreamWriter, stalled: bool) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.stalled = stalled
        self.task: asyncio.Task[Any] | None = None

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]

    def terminate(self, *, rst: bool) -> None:
        """Close both sides now (RST when asked, else a plain close) and stop the tasks that serve them."""
        for writer in self.writers():
            transport = writer.transport
            if transport.is_closing() and not rst:
                continue
            if rst:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
                transport.abort()
            else:
                transport.close()
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()


class FaultProxy:
    """A TCP proxy to `target_host:target_port` that tests can cut, heal and reset (see the module docstring)."""

    def __init__(self, target_host: str, target_port: int, *, name: str = "", connect_timeout_s: float = 5.0) -> None:
        self.name = name or f"proxy to {target_host}:{target_port}"
        self.target = (target_host, target_port)
        self.connect_timeout_s = connect_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fault-proxy {self.name}", daemon=True)
        self._connections: set[_Connection] = set()
        self._open: dict[str, asyncio.Event] = {}
        self._closed = False
        self._thread.start()
        try:
            self._server = self._call(self._start())
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            raise
        self.port: int = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __repr__(self) -> str:
        return f"FaultProxy({self.name!r}, {self.address} -> {self.target[0]}:{self.target[1]})"

    # --- controls (called from the test's thread) ----------------------------------------------------------------

    def cut(self) -> None:
        """Partition both directions: existing connections stall silently, new ones go nowhere."""
        self._call(self._cut((UPSTREAM, DOWNSTREAM)))

    def cut_direction(self, direction: Direction) -> None:
        """Partition one direction: "upstream" (client -> target) or "downstream" (target -> client)."""
        if direction not in (UPSTREAM, DOWNSTREAM):
            raise ValueError(f"direction must be {UPSTREAM!r} or {DOWNSTREAM!r}, not {direction!r}")
        self._call(self._cut((direction,)))

    def heal(self, *, close_stalled: bool = True) -> None:
        """Let bytes through again; stalled connections are closed (default) or resumed with their held bytes."""
        self._call(self._heal(close_stalled))

    def reset(self) -> None:
        """Close every current connection with a RST on both sides."""
        self._call(self._terminate_all(rst=True))

    def retarget(self, host: str, port: int) -> None:
        """Connections accepted from now on go to `host:port`."""
        self.target = (host, port)

    @property
    def is_cut(self) -> bool:
        """Is any direction cut?"""
        return self._call(self._is_cut_async())

    def connection_count(self) -> int:
        """Client connections the proxy holds now (stalled ones included)."""
        return self._call(self._count())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CONTROL_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # --- on the loop ---------------------------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed and not self._thread.is_alive():
            coro.close()
            raise RuntimeError(f"{self.name} is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CONTROL_TIMEOUT_S)

    async def _start(self) -> asyncio.Server:
        self._open = {UPSTREAM: asyncio.Event(), DOWNSTREAM: asyncio.Event()}
        for event in self._open.values():
            event.set()
        return await asyncio.start_server(self._serve, "127.0.0.1", 0, reuse_address=True)

    def _cut_now(self) -> bool:
        return not all(event.is_set() for event in self._open.values())

    async def _is_cut_async(self) -> bool:
        return self._cut_now()

    async def _count(self) -> int:
        return len(self._connections)

    async def _cut(self, directions: Iterable[str]) -> None:
        for direction in directions:
            self._open[direction].clear()
        for connection in self._connections:
            connection.stalled = True

    async def _heal(self, close_stalled: bool) -> None:
        # closed before the gates open, in this one step of the loop: no held byte slips through
        if close_stalled:
            for connection in [c for c in self._connections if c.stalled]:
                self._connections.discard(connection)
                connection.terminate(rst=False)
        else:
            for connection in self._connections:
                connection.stalled = False
        for event in self._open.values():
            event.set()

    async def _terminate_all(self, *, rst: bool) -> None:
        connections = list(self._connections)
        self._connections.clear()
        for connection in connections:
            connection.terminate(rst=rst)
        tasks = [c.task for c in connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=CONTROL_TIMEOUT_S)

    async def _shutdown(self) -> None:
        self._server.close()
        await self._terminate_all(rst=True)
        await self._server.wait_closed()

    async def _connectable(self) -> None:
        """Wait until both directions are open: a TCP handshake needs them both."""
        while self._cut_now():
            for event in self._open.values():
                await event.wait()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        connection = _Connection(client_writer, stalled=self._cut_now())
        connection.task = asyncio.current_task()
        self._connections.add(connection)
        try:
            await self._connectable()
            try:
                upstream_reader, upstream_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), self.connect_timeout_s
                )
            except (OSError, TimeoutError):
                connection.terminate(rst=True)  # the client sees what a refused connection would give it
                return
            connection.upstream = upstream_writer
            await asyncio.gather(
                self._pump(connection, UPSTREAM, client_reader, upstream_writer),
                self._pump(connection, DOWNSTREAM, upstream_reader, client_writer),
            )
        except asyncio.CancelledError:
            pass  # terminated by a control (heal, reset, close): it closed the transports
        finally:
            self._connections.discard(connection)
            for writer in connection.writers():
                writer.transport.close()

    async def _pump(
        self,
        connection: _Connection,
        direction: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        gate = self._open[direction]
        try:
            while True:
                await gate.wait()  # cut: read nothing more, so the peer's bytes wait in the kernel
                data = await reader.read(CHUNK)
                await gate.wait()  # cut meanwhile: what was read is held, not forwarded
                if not data:
                    if writer.can_write_eof() and not writer.transport.is_closing():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            connection.terminate(rst=True)  # a reset (or a write to a closed side) resets the other side too


class ProxyRegistry:
    """Several `FaultProxy`s by name: `add` makes one, `cut`/`heal`/`reset` act on the named ones (all when none is
    named), `close` closes them all; a context manager."""

    def __init__(self) -> None:
        self._proxies: dict[str, FaultProxy] = {}

    def add(self, name: str, target_host: str, target_port: int, **options: Any) -> FaultProxy:
        if name in self._proxies:
            raise ValueError(f"a proxy named {name!r} exists")
        proxy = FaultProxy(target_host, target_port, name=name, **options)
        self._proxies[name] = proxy
        return proxy

    def __getitem__(self, name: str) -> FaultProxy:
        return self._proxies[name]

    def __contains__(self, name: object) -> bool:
        return name in self._proxies

    def __iter__(self) -> Iterator[FaultProxy]:
        return iter(list(self._proxies.values()))

    def __len__(self) -> int:
        return len(self._proxies)

    def _named(self, names: tuple[str, ...]) -> list[FaultProxy]:
        return [self._proxies[n] for n in names] if names else list(self._proxies.values())

    def cut(self, *names: str) -> None:
        for proxy in self._named(names):
            proxy.cut()

    def heal(self, *names: str, close_stalled: bool = True) -> None:
        for proxy in self._named(names):
            proxy.heal(close_stalled=close_stalled)

    def reset(self, *names: str) -> None:
        for proxy in self._named(names):
            proxy.reset()

    def close(self) -> None:
        proxies = list(self._proxies.values())
        self._proxies.clear()
        for proxy in proxies:
            proxy.close()

    def __enter__(self) -> ProxyRegistry:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def make_proxies(targets: dict[str, tuple[str, int]], **options: Any) -> ProxyRegistry:
    """One proxy per name -> (host, port), in a registry."""
    registry = ProxyRegistry()
    try:
        for name, (host, port) in targets.items():
            registry.add(name, host, port, **options)
    except BaseException:
        registry.close()
        raise
    return registry
