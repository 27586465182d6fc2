"""The master's side of RocketMQ master/slave replication (DefaultHAService, DefaultHAConnection and
GroupTransferService), over the frames of ha_protocol.py.

`HAService` listens on haListenPort; each accepted slave gets an `HAConnection` with two threads:
- the reader takes the slave's 8-byte reports: the first says where to start (0: an empty slave, started at this
  master's min offset, the start of its first CommitLog file), each later one what the slave holds; a report that is
  negative, goes back, names an offset not yet sent, or (the first) lies beyond this CommitLog's end is refused, and
  so is silence longer than haHousekeepingInterval;
- the writer sends transfers from the CommitLog file holding the next offset up to that file's written end, at most
  haTransferBatchSize bytes each, and a heartbeat (body size 0) after haSendHeartbeatInterval without a transfer;
  it is woken by every put (`notify_appended`).
A refused report, an I/O error or the slave's close ends that connection (both threads) with a log line; others go
on. `wait_replicated` is GroupTransferService: a SYNC_MASTER put waits until some slave reported an offset at or
past its end, up to syncFlushTimeout; without a connected slave, or when the nearest is haSlaveFallbehindMax or more
behind, it fails at once (SLAVE_NOT_AVAILABLE), as DefaultHAService.isSlaveOK.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from dataclasses import dataclass

from tidelog.errors import FlushSlaveTimeoutError, HAProtocolError, SlaveNotAvailableError
from tidelog.storage.rocketmq.commitlog import CommitLog
from tidelog.storage.rocketmq.ha_protocol import ReportReader, encode_transfer

log = logging.getLogger("tidelog.storage.rocketmq.ha")

POLL_SECONDS = 0.2
WAIT_FOR_DATA_SECONDS = 0.1  # the writer's nap when nothing is new (WriteSocketService waits 100 ms)
RECEIVE_BYTES = 4096


@dataclass(frozen=True)
class SlaveStatus:
    address: str
    reported_offset: int  # -1 before its first report
    lag_bytes: int  # this CommitLog's end minus what the slave reported
    since_last_report_ms: int


class HAConnection:
    def __init__(self, service: HAService, sock: socket.socket, address: str) -> None:
        self.service = service
        self.sock = sock
        self.address = address
        self.request_offset = -1  # the slave's first report
        self.acked_offset = -1  # its latest report
        self.next_transfer = -1  # the offset of the next byte to send
        self.last_report = time.monotonic()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name=f"tidelog-ha-read-{address}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"tidelog-ha-write-{address}", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def status(self) -> SlaveStatus:
        lag = self.service.commitlog.max_offset - self.acked_offset if self.acked_offset >= 0 else -1
        since = int((time.monotonic() - self.last_report) * 1000)
        return SlaveStatus(self.address, self.acked_offset, lag, since)

    # --- reports ----------------------------------------------------------------------------------------------

    def _read_loop(self) -> None:
        reader = ReportReader()
        housekeeping = self.service.housekeeping_interval_ms / 1000
        try:
            while not self._closed.is_set():
                readable, _, _ = select.select([self.sock], [], [], POLL_SECONDS)
                if not readable:
                    if time.monotonic() - self.last_report > housekeeping:
                        raise HAProtocolError(f"no report for {self.service.housekeeping_interval_ms} ms")
                    continue
                data = self.sock.recv(RECEIVE_BYTES)
                if not data:
                    self.close("the slave closed the connection")
                    return
                for offset in reader.feed(data):
                    self._accept_report(offset)
        except (OSError, ValueError, HAProtocolError) as exc:
            self.close(str(exc))

    def _accept_report(self, offset: int) -> None:
        commitlog = self.service.commitlog
        if self.request_offset < 0:
            if offset > commitlog.max_offset:
                raise HAProtocolError(
                    f"the slave's CommitLog ends at {offset}, beyond this master's end {commitlog.max_offset}: it "
                    "holds data this master lacks (cut or wipe the slave's store)"
                )
            self.request_offset = offset
        else:
            sent = self.next_transfer if self.next_transfer >= 0 else self.request_offset
            if offset < self.acked_offset:
                raise HAProtocolError(f"the slave's report went back from {self.acked_offset} to {offset}")
            if offset > sent:
                raise HAProtocolError(f"the slave reports offset {offset}, only {sent} was sent")
        self.acked_offset = offset
        self.last_report = time.monotonic()
        self.service.slave_reported(offset)

    # --- transfers --------------------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        service = self.service
        commitlog = service.commitlog
        heartbeat = service.heartbeat_interval_ms / 1000
        last_write = time.monotonic()
        try:
            while not self._closed.is_set():
                if self.request_offset < 0:
                    self._closed.wait(0.01)
                    continue
                if self.next_transfer < 0:
                    self.next_transfer = self.request_offset or commitlog.min_offset
                    log.info("HA: slave %s starts at CommitLog offset %d", self.address, self.next_transfer)
                if self.next_transfer < commitlog.min_offset:
                    raise HAProtocolError(
                        f"the slave needs CommitLog offset {self.next_transfer}, below this master's first file "
                        f"{commitlog.min_offset} (deleted by retention): wipe the slave's store"
                    )
                offset = self.next_transfer
                body = commitlog.read(offset, service.transfer_batch_size)
                if body:
                    self.next_transfer = offset + len(body)  # before sending: a report may follow at once
                    self.sock.sendall(encode_transfer(offset, body))
                    last_write = time.monotonic()
                    continue
                if time.monotonic() - last_write >= heartbeat:
                    self.sock.sendall(encode_transfer(offset))
                    last_write = time.monotonic()
                service.wait_for_data(WAIT_FOR_DATA_SECONDS)
        except (OSError, ValueError, HAProtocolError) as exc:
            self.close(str(exc))

    def close(self, reason: str) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if not self.service.stopping:
            log.warning("HA: closing the connection of slave %s: %s", self.address, reason)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.service.remove(self)

    def join(self) -> None:
        for thread in (self._reader, self._writer):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join()


class HAService:
    def __init__(
        self,
        commitlog: CommitLog,
        *,
        host: str,
        port: int,
        heartbeat_interval_ms: int,
        housekeeping_interval_ms: int,
        transfer_batch_size: int,
        slave_fallbehind_max: int,
    ) -> None:
        self.commitlog = commitlog
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.housekeeping_interval_ms = housekeeping_interval_ms
        self.transfer_batch_size = transfer_batch_size
        self.slave_fallbehind_max = slave_fallbehind_max
        self.push_to_slave_max_offset = 0  # the highest offset any slave reported (push2SlaveMaxOffset)
        self.stopping = False
        self._connections: list[HAConnection] = []
        self._cond = threading.Condition()  # connections, the reported offset, waiters
        self._data = threading.Condition()  # writers waiting for puts
        self._listener = socket.create_server((host, port), reuse_port=False)
        self.port: int = self._listener.getsockname()[1]
        self._accepter = threading.Thread(target=self._accept_loop, name="tidelog-ha-accept", daemon=True)

    def start(self) -> None:
        log.info("HA: listening for slaves on port %d", self.port)
        self._accepter.start()

    def _accept_loop(self) -> None:
        while not self.stopping:
            try:
                readable, _, _ = select.select([self._listener], [], [], POLL_SECONDS)
                if not readable:
                    continue
                sock, peer = self._listener.accept()
            except (OSError, ValueError):
                if self.stopping:
                    return
                log.exception("HA: accept failed")
                time.sleep(POLL_SECONDS)
                continue
            address = f"{peer[0]}:{peer[1]}"
            log.info("HA: slave %s connected", address)
            connection = HAConnection(self, sock, address)
            with self._cond:
                if self.stopping:
                    sock.close()
                    return
                self._connections.append(connection)
            connection.start()

    def remove(self, connection: HAConnection) -> None:
        with self._cond:
            if connection in self._connections:
                self._connections.remove(connection)
            self._cond.notify_all()

    # --- puts -------------------------------------------------------------------------------------------------

    def notify_appended(self) -> None:
        """A put reached the CommitLog: wake the writers."""
        with self._data:
            self._data.notify_all()

    def wait_for_data(self, timeout: float) -> None:
        with self._data:
            self._data.wait(timeout)

    def slave_reported(self, offset: int) -> None:
        with self._cond:
            if offset > self.push_to_slave_max_offset:
                self.push_to_slave_max_offset = offset
                self._cond.notify_all()

    def is_slave_ok(self, master_put_where: int) -> bool:
        """isSlaveOK: a slave is connected, the nearest less than haSlaveFallbehindMax behind `master_put_where`."""
        with self._cond:
            return bool(self._connections) and (
                master_put_where - self.push_to_slave_max_offset < self.slave_fallbehind_max
            )

    def wait_replicated(self, offset: int, timeout_ms: int) -> None:
        """Return once a slave reported `offset` or more; SlaveNotAvailableError at once when none can be waited
        for, FlushSlaveTimeoutError after `timeout_ms`."""
        if self.push_to_slave_max_offset >= offset:
            return
        if not self.is_slave_ok(offset):
            raise SlaveNotAvailableError(
                f"no slave holds CommitLog offset {offset}: "
                + (
                    f"the nearest is at {self.push_to_slave_max_offset}, haSlaveFallbehindMax "
                    f"({self.slave_fallbehind_max}) or more behind"
                    if self._connections
                    else "none is connected"
                )
            )
        deadline = time.monotonic() + timeout_ms / 1000
        with self._cond:
            while self.push_to_slave_max_offset < offset:
                remaining = deadline - time.monotonic()
                if self.stopping:
                    raise SlaveNotAvailableError("the HA service stopped while a put waited for its slave")
                if remaining <= 0:
                    raise FlushSlaveTimeoutError(
                        f"no slave reported CommitLog offset {offset} within {timeout_ms} ms (syncFlushTimeout); "
                        f"the nearest is at {self.push_to_slave_max_offset}"
                    )
                self._cond.wait(remaining)

    # --- status and shutdown ----------------------------------------------------------------------------------

    def status(self) -> list[SlaveStatus]:
        with self._cond:
            connections = list(self._connections)
        return [connection.status() for connection in connections]

    def shutdown(self) -> None:
        """Stop listening, close every slave's connection and fail the puts waiting for one."""
        with self._cond:
            self.stopping = True
            connections = list(self._connections)
            self._cond.notify_all()
        self._listener.close()
        if self._accepter.is_alive():
            self._accepter.join()
        for connection in connections:
            connection.close("the master stops")
            connection.join()
        self.notify_appended()
