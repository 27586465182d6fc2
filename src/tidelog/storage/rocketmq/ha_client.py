"""The slave's side of RocketMQ master/slave replication (DefaultHAClient), over the frames of ha_protocol.py.

One thread connects to `haMasterAddress`, reports the slave's max CommitLog offset, and appends each transfer at
that offset (`ReplicaLog.append`), reporting again after each one and every haSendHeartbeatInterval. The
connection is closed - with a WARNING naming why - and opened again at once when a frame is malformed, when a
transfer or heartbeat does not start at the slave's own max offset (an empty slave takes the first transfer at any
file start: the master's first file), when a body is not CommitLog bytes continuing the slave's messages, or when
nothing came for haHousekeepingInterval; a refused frame writes nothing. A failed connect, or a failure of the store
itself, is retried after RECONNECT_WAIT_SECONDS.

`ReplicaLog` keeps what the slave's dispatcher may read: a transfer can end inside a message, so only the end of the
last whole Kafka batch (`complete_end`) is dispatched; recovery after a crash cuts the rest (commitlog.py).
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.codec.rocketmq_message import (
    BLANK,
    BLANK_MAGIC,
    FIXED_SIZE,
    MAGIC_V1,
    MAGIC_V2,
    PHYSICAL_OFFSET_POSITION,
)
from tidelog.errors import ConfigError, HAProtocolError, UnexpectedAppendOffsetError
from tidelog.storage.rocketmq.commitlog import CommitLog
from tidelog.storage.rocketmq.ha_protocol import TransferReader, encode_report

log = logging.getLogger("tidelog.storage.rocketmq.ha")

RECONNECT_WAIT_SECONDS = 1.0  # after a failed connect (RocketMQ waits 5 s) or a store failure
CONNECT_TIMEOUT_SECONDS = 3.0
POLL_SECONDS = 0.2
RECEIVE_BYTES = 1 << 20
_PHYSICAL_OFFSET = struct.Struct(">q")
_HEAD_BYTES = PHYSICAL_OFFSET_POSITION + 8  # what is checked of each message before it is written


class ReplicaLog:
    """The slave's CommitLog as transfers arrive: checks each body against the messages it continues, appends it,
    and moves `complete_end` (with `on_complete` called when it moves)."""

    def __init__(self, commitlog: CommitLog, on_complete: Callable[[], None]) -> None:
        self.commitlog = commitlog
        self.on_complete = on_complete
        self.complete_end = commitlog.max_offset  # recovery leaves the log at the end of a whole batch
        self._next_message = self.complete_end  # where the next message header starts
        self._scanned = self.complete_end  # where the walk for the end of a whole batch goes on from

    def append(self, offset: int, body: bytes) -> int:
        """Append a transfer's body at `offset` (the CommitLog's max offset); returns the new max offset. Raises
        HAProtocolError or UnexpectedAppendOffsetError, having written nothing, when it does not fit."""
        commitlog = self.commitlog
        with commitlog.put_lock:
            next_message = offset if not commitlog.queue.files else self._next_message
            next_message = self._check_body(next_message, offset, body)
            commitlog.append_at(offset, body)  # checks the offset
            self._next_message = next_message
            self.complete_end = max(self.complete_end, commitlog.min_offset)  # an empty slave starts at a file start
            end, timestamp, self._scanned = commitlog.complete_end(
                self.complete_end, commitlog.max_offset, self._scanned
            )
            moved = end > self.complete_end
            self.complete_end = end
            if timestamp:
                commitlog.last_store_timestamp = timestamp
            max_offset = commitlog.max_offset
        if moved:
            self.on_complete()
        return max_offset

    def _check_body(self, next_message: int, offset: int, body: bytes) -> int:
        """Each message header that starts in `body` (or before it, not yet checked) must be a message or a BLANK
        marker at the right place; returns where the next header starts."""
        file_size = self.commitlog.file_size
        end = offset + len(body)
        position = next_message
        while position < end:
            if position < offset:  # a header begun in an earlier transfer
                head = self.commitlog.read(position, offset - position) + body[:_HEAD_BYTES]
            else:
                head = body[position - offset : position - offset + _HEAD_BYTES]
            if len(head) < BLANK.size:
                break  # checked when the rest has come
            total, magic = BLANK.unpack_from(head)
            room = file_size - position % file_size
            if magic == BLANK_MAGIC:
                if total != room:
                    raise HAProtocolError(
                        f"BLANK marker at {position} declares {total} bytes, its file has {room} left"
                    )
                position += room
                continue
            if magic not in (MAGIC_V1, MAGIC_V2) or not FIXED_SIZE < total <= room:
                raise HAProtocolError(
                    f"no CommitLog message at offset {position} (magic {magic & 0xFFFFFFFF:#010x}, size {total})"
                )
            if len(head) < _HEAD_BYTES:
                break  # its PHYSICALOFFSET is checked when the rest has come
            (physical_offset,) = _PHYSICAL_OFFSET.unpack_from(head, PHYSICAL_OFFSET_POSITION)
            if physical_offset != position:
                raise HAProtocolError(
                    f"the message at CommitLog offset {position} says it belongs at {physical_offset}"
                )
            position += total
        return position


@dataclass(frozen=True)
class SlaveHAStatus:
    master_address: str
    connected: bool
    max_offset: int  # the slave's CommitLog end
    reported_offset: int  # the offset it last reported to its master (-1 before the first report)
    local_address: str | None = None  # the connection's own end, "host:port", as the master sees the slave


class HAClient:
    """Connects to the master and follows its CommitLog until `shutdown`."""

    def __init__(
        self,
        master_address: str,
        replica: ReplicaLog,
        *,
        transfer_batch_size: int,
        heartbeat_interval_ms: int,
        housekeeping_interval_ms: int,
    ) -> None:
        host, _, port = master_address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"config tidelog.rocketmq.haMasterAddress: {master_address!r} is not host:port")
        self.master_address = master_address
        self._endpoint = (host.strip("[]"), int(port))
        self.replica = replica
        self.transfer_batch_size = transfer_batch_size
        self.heartbeat_seconds = heartbeat_interval_ms / 1000
        self.housekeeping_seconds = housekeeping_interval_ms / 1000
        self.reported_offset = -1
        self._socket: socket.socket | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tidelog-ha-client", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def connected(self) -> bool:
        return self._socket is not None

    def status(self) -> SlaveHAStatus:
        sock, local = self._socket, None
        if sock is not None:
            with contextlib.suppress(OSError):
                host, port = sock.getsockname()[:2]
                local = f"{host}:{port}"
        return SlaveHAStatus(
            self.master_address, self.connected, self.replica.commitlog.max_offset, self.reported_offset, local
        )

    def _run(self) -> None:
        last_failure = ""
        while not self._stop.is_set():
            try:
                sock = socket.create_connection(self._endpoint, timeout=CONNECT_TIMEOUT_SECONDS)
            except OSError as exc:
                if str(exc) != last_failure:
                    log.warning("HA client: cannot connect to master %s: %s", self.master_address, exc)
                    last_failure = str(exc)
                self._stop.wait(RECONNECT_WAIT_SECONDS)
                continue
            last_failure = ""
            sock.settimeout(None)
            self._socket = sock
            log.info("HA client: connected to master %s", self.master_address)
            try:
                self._follow(sock)
            except (OSError, HAProtocolError, UnexpectedAppendOffsetError) as exc:
                if not self._stop.is_set():
                    log.warning("HA client: closing the connection to master %s: %s", self.master_address, exc)
            except Exception:  # a store failure (a full disk): try again later
                log.exception("HA client: following master %s failed", self.master_address)
                self._stop.wait(RECONNECT_WAIT_SECONDS)
            finally:
                self._socket = None
                sock.close()

    def _report(self, sock: socket.socket, offset: int) -> float:
        sock.sendall(encode_report(offset))
        self.reported_offset = offset
        return time.monotonic()

    def _follow(self, sock: socket.socket) -> None:
        commitlog = self.replica.commitlog
        reader = TransferReader(max_body=self.transfer_batch_size, file_size=commitlog.file_size)
        last_write = self._report(sock, commitlog.max_offset)
        last_read = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_write >= self.heartbeat_seconds:
                last_write = self._report(sock, commitlog.max_offset)
            readable, _, _ = select.select([sock], [], [], POLL_SECONDS)
            if not readable:
                if time.monotonic() - last_read > self.housekeeping_seconds:
                    raise HAProtocolError(f"nothing from the master for {self.housekeeping_seconds * 1000:.0f} ms")
                continue
            data = sock.recv(RECEIVE_BYTES)
            if not data:
                raise ConnectionError("the master closed the connection")
            last_read = time.monotonic()
            for transfer in reader.feed(data):
                if transfer.body:  # append_at checks the offset
                    last_write = self._report(sock, self.replica.append(transfer.offset, transfer.body))
                elif commitlog.queue.files and transfer.offset != commitlog.max_offset:
                    raise UnexpectedAppendOffsetError(
                        f"master's heartbeat names CommitLog offset {transfer.offset}, the slave's CommitLog ends at "
                        f"{commitlog.max_offset}"
                    )

    def shutdown(self) -> None:
        self._stop.set()
        sock = self._socket
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive():
            self._thread.join()
