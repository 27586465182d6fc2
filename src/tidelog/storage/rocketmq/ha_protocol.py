"""The bytes of a RocketMQ 4.x HA connection (DefaultHAConnection / DefaultHAClient), master to slave and back.
No I/O here: encoders, and stream readers that turn received bytes into frames or refuse them.

Slave -> master, a report (at the start, after each transfer it appended, and every haSendHeartbeatInterval):

    [8-byte big-endian signed: the slave's max CommitLog offset]

The first report says where the slave's CommitLog ends (0: an empty store); each later one acknowledges what it
holds. A report is negative, goes back, or names an offset the master never sent: refused.

Master -> slave, a transfer (or, with a body size of 0, a heartbeat sent every haSendHeartbeatInterval while there is
nothing to send):

    [8-byte big-endian signed: the CommitLog offset of the body][4-byte big-endian signed: body size][body]

The body is the master's CommitLog bytes from that offset, BLANK end-of-file markers included, at most
haTransferBatchSize bytes, and never past the end of the CommitLog file holding its first byte (a message may be cut
between two transfers). A negative offset, a negative body size, one above the receiver's batch size, or a body that
would cross a file boundary is refused before the body is read; whether the offset is the slave's own end is the
slave's check (ha_client.py).

The roles a store plays (brokerRole): ASYNC_MASTER, SYNC_MASTER (puts wait for a slave) and SLAVE.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tidelog.errors import HAProtocolError

ASYNC_MASTER = "ASYNC_MASTER"
SYNC_MASTER = "SYNC_MASTER"
SLAVE = "SLAVE"
MASTER_ROLES = (ASYNC_MASTER, SYNC_MASTER)

REPORT = struct.Struct(">q")
TRANSFER_HEADER = struct.Struct(">qi")
REPORT_SIZE = REPORT.size  # 8
TRANSFER_HEADER_SIZE = TRANSFER_HEADER.size  # 12


def encode_report(offset: int) -> bytes:
    return REPORT.pack(offset)


def encode_transfer(offset: int, body: bytes | bytearray | memoryview = b"") -> bytes:
    """A transfer of `body` at `offset`; an empty body is a heartbeat."""
    return TRANSFER_HEADER.pack(offset, len(body)) + bytes(body)


@dataclass(frozen=True, slots=True)
class Transfer:
    offset: int
    body: bytes

    @property
    def is_heartbeat(self) -> bool:
        return not self.body


def check_transfer_header(offset: int, size: int, *, max_body: int, file_size: int) -> None:
    """Raise HAProtocolError unless a transfer of `size` bytes at `offset` is one the receiver may take."""
    if offset < 0:
        raise HAProtocolError(f"transfer at negative CommitLog offset {offset}")
    if size < 0 or size > max_body:
        raise HAProtocolError(
            f"transfer of {size} bytes at {offset}: sizes go from 0 to {max_body} (haTransferBatchSize)"
        )
    if offset % file_size + size > file_size:
        raise HAProtocolError(
            f"transfer of {size} bytes at {offset} crosses the end of a CommitLog file of {file_size} bytes"
        )


class TransferReader:
    """The slave's side: bytes from the master in, whole transfers out (a header is checked before its body is
    waited for)."""

    def __init__(self, *, max_body: int, file_size: int) -> None:
        self.max_body = max_body
        self.file_size = file_size
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Transfer]:
        """The transfers `data` completes, in order; raises HAProtocolError at the first malformed header (the
        transfers before it are lost with the connection: nothing of this call is returned)."""
        buffer = self._buffer
        buffer += data
        frames: list[Transfer] = []
        position = 0
        while len(buffer) - position >= TRANSFER_HEADER_SIZE:
            offset, size = TRANSFER_HEADER.unpack_from(buffer, position)
            check_transfer_header(offset, size, max_body=self.max_body, file_size=self.file_size)
            end = position + TRANSFER_HEADER_SIZE + size
            if len(buffer) < end:
                break
            frames.append(Transfer(offset, bytes(buffer[position + TRANSFER_HEADER_SIZE : end])))
            position = end
        del buffer[:position]
        return frames


class ReportReader:
    """The master's side: bytes from a slave in, its newest complete report out."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[int]:
        """The reports `data` completes, in order; raises HAProtocolError on a negative one."""
        buffer = self._buffer
        buffer += data
        whole = len(buffer) - len(buffer) % REPORT_SIZE
        reports = [REPORT.unpack_from(buffer, at)[0] for at in range(0, whole, REPORT_SIZE)]
        del buffer[:whole]
        for offset in reports:
            if offset < 0:
                raise HAProtocolError(f"slave reported a negative CommitLog offset {offset}")
        return reports
