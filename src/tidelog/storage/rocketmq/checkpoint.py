"""The store's `checkpoint`, `abort` and `lock` files (RocketMQ's StoreCheckpoint and DefaultMessageStore).

`checkpoint` is one 4 KiB page, big-endian i64 at
    @0  physicMsgTimestamp   store time of the last CommitLog message known flushed
    @8  logicsMsgTimestamp   store time of the last ConsumeQueue unit known flushed (set by a full CQ flush)
    @16 indexMsgTimestamp    end time of the last full IndexFile flushed
    @24 masterFlushedOffset  (5.x; 0 here)
    @32 confirmPhyOffset     (5.x) the CommitLog offset recovery may trust as dispatched; written, not relied on
min_timestamp() = min(physic, logics) - 3 s is where abnormal recovery starts re-dispatching.

`abort` exists while the store is open (it holds the pid); a clean shutdown deletes it, so finding it at start-up
means the last run crashed. `lock` is flock-ed for as long as the store is open, so two processes never share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
from pathlib import Path

from tidelog.errors import KafkaStorageError

log = logging.getLogger("tidelog.storage.rocketmq")

CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
CHECKPOINT_SIZE = 4096
_FIELDS = struct.Struct(">qqqqq")
RECOVERY_MARGIN_MS = 3000


class StoreCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.master_flushed_offset = 0
        self.confirm_phy_offset = 0
        exists = path.exists()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if exists:
            data = os.pread(self.fd, _FIELDS.size, 0)
            if len(data) >= 24:
                data = data.ljust(_FIELDS.size, b"\0")
                (
                    self.physic_msg_timestamp,
                    self.logics_msg_timestamp,
                    self.index_msg_timestamp,
                    self.master_flushed_offset,
                    self.confirm_phy_offset,
                ) = _FIELDS.unpack(data)
            else:
                log.warning("%s is %d bytes long; recovery starts from the first file", path, len(data))
        if os.fstat(self.fd).st_size < CHECKPOINT_SIZE:
            os.ftruncate(self.fd, CHECKPOINT_SIZE)

    def min_timestamp(self) -> int:
        """StoreCheckpoint.getMinTimestamp: where abnormal recovery starts (3 s of margin)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - RECOVERY_MARGIN_MS)

    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp(), self.index_msg_timestamp)

    def flush(self) -> None:
        data = _FIELDS.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        )
        try:
            os.pwrite(self.fd, data, 0)
            os.fdatasync(self.fd)
        except OSError as exc:
            raise KafkaStorageError(f"cannot write {self.path}: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def read_checkpoint(path: Path) -> dict[str, int]:
    """The fields of a checkpoint file, for tools and tests."""
    data = path.read_bytes()[: _FIELDS.size].ljust(_FIELDS.size, b"\0")
    names = ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp", "masterFlushedOffset", "confirmPhyOffset")
    return dict(zip(names, _FIELDS.unpack(data), strict=True))


def lock_store(root: Path) -> int:
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise KafkaStorageError(f"store directory {root} is in use by another process") from None
    return fd


def take_abort_file(root: Path) -> bool:
    """Was the last shutdown clean? (No `abort` file.) Then create it for this run, holding our pid."""
    path = root / ABORT_FILE
    clean = not path.exists()
    path.write_text(f"{os.getpid()}\n")
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return clean


def remove_abort_file(root: Path) -> None:
    (root / ABORT_FILE).unlink(missing_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
