"""Fixed-size store files named by their 20-digit start offset, and the queue of them (RocketMQ's MappedFile,
MappedFileQueue and AllocateMappedFileService).

A file is created at its full size and never grows: `<dir>/00000000000000000000`, `<dir>/00000000001073741824`, ...
Loading refuses a file longer than the configured size, or named at an offset the size does not divide (written
with another size); a shorter one was cut (a torn write, a crash while it was made) and is extended with zeros, with
a WARNING, for recovery to check as a torn tail (RocketMQ refuses to start instead).
Positions, as in RocketMQ: `wrote_position` (appended, readable) >= `flushed_position` (known on disk). Offsets are
global: file start + position.

Writes: CommitLog files are preallocated (posix_fallocate, so a write through the mapping never meets a full disk
with SIGBUS) and memory-mapped; appends under PWRITE_MIN_BYTES are copied into the mapping, larger ones go through
pwrite (measured in Python: mmap wins for 1 KiB writes, pwrite for 16 KiB and up). ConsumeQueue files are sparse
(5,000 queues x 6 MB would otherwise reserve 30 GB) and use pread/pwrite only; their descriptors are opened on use
and let go when idle (storage/common/file_handles.py, the engine's FileHandles), so a store's queues are not bounded
by the open-file limit.

A deleted file is unlinked and dropped from the queue; its mapping and descriptor close when the last reader lets go
of the object (Python's reference counting plays the part of RocketMQ's hold/release); a ConsumeQueue file that was
let go is not opened again (its reads find nothing).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tidelog.errors import KafkaStorageError
from tidelog.storage.common.file_handles import FileHandles, LazyFile, StoreFile

log = logging.getLogger("tidelog.storage.rocketmq")

FILE_NAME = re.compile(r"^\d{20}$")
OS_PAGE_SIZE = 4096
PWRITE_MIN_BYTES = 8192
ZERO_CHUNK = 1 << 20


def offset_to_file_name(offset: int) -> str:
    """UtilAll.offset2FileName: the offset zero-padded to 20 digits."""
    return f"{offset:020d}"


class MappedFile:
    """One store file. `mapped=True`: preallocated and memory-mapped (CommitLog), its descriptor open for its life;
    False: sparse, pread/pwrite through a descriptor opened on use and let go when idle (`handles`)."""

    def __init__(
        self,
        path: Path,
        file_size: int,
        *,
        mapped: bool = True,
        create: bool = False,
        handles: FileHandles | None = None,
    ) -> None:
        self.path = path
        self.file_size = file_size
        self.file_from_offset = int(path.name)
        self.mapped = mapped
        extended_from: int | None = None
        if create:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise KafkaStorageError(f"cannot create {path}: {exc}") from exc
            try:
                if mapped:
                    _preallocate(fd, file_size)
                else:
                    os.ftruncate(fd, file_size)
            except (OSError, KafkaStorageError) as exc:  # no file of the wrong size is left for the next load
                os.close(fd)
                path.unlink(missing_ok=True)
                if isinstance(exc, KafkaStorageError):
                    raise
                raise KafkaStorageError(f"cannot create {path}: {exc}") from exc
        else:
            fd = os.open(path, os.O_RDWR)
            actual = os.fstat(fd).st_size
            if actual != file_size:
                try:
                    self._extend_short_file(fd, actual)
                except BaseException:
                    os.close(fd)
                    raise
                extended_from = actual
        self.map: mmap.mmap | None = None
        self._lazy: LazyFile | None = None
        if mapped:
            self.fd = fd
            self.map = mmap.mmap(fd, file_size)
        else:  # created and checked: from now on opened on use
            os.close(fd)
            self._lazy = LazyFile(path, handles)
        self.wrote_position = 0
        self.flushed_position = 0
        self.last_store_timestamp = 0  # of the last message appended (CommitLog), for the checkpoint
        self.extended_from = extended_from  # the length it had when it was found short (a torn file), else None
        self._closed = False

    def _extend_short_file(self, fd: int, actual: int) -> None:
        """A file shorter than the store's size, at a start that fits that size, was cut (a torn write, a crash
        while it was being made): it is extended with zeros, so recovery checks it like any torn tail. A longer
        file, or one at a start the size does not divide, was written with another size: refused."""
        if actual > self.file_size or self.file_from_offset % self.file_size:
            raise KafkaStorageError(
                f"{self.path} is {actual} bytes long, but store files here are {self.file_size} bytes "
                "(was the file size setting changed?)"
            )
        log.warning(
            "%s is %d bytes long, %d short of the store's file size: extended with zeros (a torn file); recovery "
            "checks it",
            self.path,
            actual,
            self.file_size - actual,
        )
        try:
            if self.mapped:
                _preallocate(fd, self.file_size)
            else:
                os.ftruncate(fd, self.file_size)
        except OSError as exc:
            raise KafkaStorageError(f"cannot extend {self.path} to {self.file_size} bytes: {exc}") from exc

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position}, flushed={self.flushed_position})"

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.wrote_position

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write at the wrote position; returns the global offset written at. The caller checked the room."""
        position = self.wrote_position
        self.write_at(position, data)
        self.wrote_position = position + len(data)
        return self.file_from_offset + position

    def write_at(self, position: int, data: bytes | bytearray | memoryview) -> None:
        size = len(data)
        if position + size > self.file_size:
            raise KafkaStorageError(f"write of {size} bytes at {position} runs past the end of {self.path}")
        try:
            if self.map is not None and size < PWRITE_MIN_BYTES:
                self.map[position : position + size] = data
            else:
                fd, _held = self._descriptor()
                written = os.pwrite(fd, data, position)
                while written < size:
                    written += os.pwrite(fd, memoryview(data)[written:], position + written)
        except OSError as exc:
            raise KafkaStorageError(f"cannot write {self.path}: {exc}") from exc

    def write_target(self) -> tuple[int | bytes, StoreFile | None]:
        """Where storage/common/positioned_writes.py writes this file now: its open descriptor, with the object to
        hold until the write is done, or - a lazily opened file that is not open - its path, which the write opens
        for itself (opening it here would let go of another file past the budget, to no use at many queues)."""
        if self._lazy is None:
            return self.fd, None
        if self._lazy.sealed:
            raise KafkaStorageError(f"{self.path} is closed")
        file = self._lazy.if_open()
        if file is None:
            return os.fsencode(self.path), None
        return file.fileno(), file

    def _descriptor(self) -> tuple[int, StoreFile | None]:
        """The descriptor to use now, and what to hold while it is used: a lazily opened file's descriptor closes
        when the last holder of its StoreFile lets go (file_handles.py), never under a use."""
        if self._lazy is None:
            return self.fd, None
        file = self._lazy.get()
        return file.fileno(), file

    def read(self, position: int, size: int) -> bytes:
        size = max(0, min(size, self.file_size - position))
        if self.map is not None:
            return self.map[position : position + size]
        if self._lazy is not None and self._lazy.sealed:
            return b""  # deleted (retention, truncation) after the reader found it
        fd, _held = self._descriptor()
        return os.pread(fd, size, position)

    def read_into(self, position: int, target: memoryview) -> None:
        """Fill `target` with the bytes at `position` (inside the file): one copy, none in between."""
        if self.map is not None:
            with memoryview(self.map) as mapped:
                target[:] = mapped[position : position + len(target)]
            return
        fd, _held = self._descriptor()
        if os.preadv(fd, [target], position) != len(target):
            raise KafkaStorageError(f"{self.path}: short read of {len(target)} bytes at {position}")

    def data_end(self) -> int:
        """Where the file's data ends as far as the filesystem knows: the start of its first hole (a sparse
        ConsumeQueue file), or its size where holes are not reported."""
        fd, _held = self._descriptor()
        try:
            return min(os.lseek(fd, 0, os.SEEK_HOLE), self.file_size)
        except OSError:
            return self.file_size

    def flush(self) -> int:
        """fdatasync what was written so far (covers writes through the mapping, too); returns the new flushed
        position. Only a successful sync advances it (RocketMQ issue #2706: never acknowledge what failed)."""
        target = self.wrote_position
        if target <= self.flushed_position:
            return self.flushed_position
        try:
            fd, _held = self._descriptor()
            os.fdatasync(fd)
        except OSError as exc:
            raise KafkaStorageError(f"cannot flush {self.path}: {exc}") from exc
        self.flushed_position = max(self.flushed_position, target)
        return self.flushed_position

    def dirty_pages(self) -> int:
        return self.wrote_position // OS_PAGE_SIZE - self.flushed_position // OS_PAGE_SIZE

    def data_extent(self, position: int) -> int:
        """Bytes from `position` to the end of the non-zero data that follows it (checked a megabyte at a time up
        to the first megabyte of zeros)."""
        end = position
        while end < self.file_size:
            chunk = self.read(end, min(ZERO_CHUNK, self.file_size - end))
            stripped = len(chunk.rstrip(b"\0"))
            if stripped == 0:
                break
            end += len(chunk) if stripped == len(chunk) else stripped
            if stripped < len(chunk):
                break
        return end - position

    def zero_from(self, position: int) -> None:
        """Overwrite the data after `position` with zeros: a truncated tail must not come back as messages after
        the next crash."""
        extent = self.data_extent(position)
        done = 0
        while done < extent:
            size = min(ZERO_CHUNK, extent - done)
            self.write_at(position + done, bytes(size))
            done += size

    def destroy(self) -> None:
        """Unlink the file. Readers holding this object may finish; the mapping closes with the last of them, and a
        lazily opened file is never opened again (its name may be taken by a new file)."""
        if self._lazy is not None:
            self._lazy.seal()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._lazy is not None:  # its descriptor closes with the last use holding it (at once when none does)
            self._lazy.seal()
            return
        if self.map is not None:
            with contextlib.suppress(BufferError):  # a view is still exported: let garbage collection close it
                self.map.close()
        os.close(self.fd)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and getattr(self, "_lazy", None) is None:
            with contextlib.suppress(OSError):
                os.close(self.fd)


def _preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (95, 22):  # EOPNOTSUPP / EINVAL: a filesystem without fallocate (tmpfs is fine)
            os.ftruncate(fd, size)
        else:
            raise KafkaStorageError(f"cannot preallocate {size} bytes: {exc}") from exc


class AllocateMappedFileService:
    """Creates the next file ahead of need (AllocateMappedFileService): asking for file N also orders file N+1,
    which a background thread creates, so rolling over is normally free. Without the thread files are created on
    demand."""

    def __init__(self, *, background: bool) -> None:
        self._pending: dict[Path, threading.Event] = {}
        self._ready: dict[Path, MappedFile | BaseException] = {}
        self._queue: list[tuple[Path, int, bool]] = []
        self._cond = threading.Condition()
        self._running = background
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="tidelog-allocate-mapped-file", daemon=True)
            self._thread.start()

    def get(self, path: Path, file_size: int, *, mapped: bool, next_path: Path | None = None) -> MappedFile:
        """The file at `path`, created now or taken from the preallocated ones; orders `next_path` ahead."""
        with self._cond:
            if next_path is not None and self._running and next_path not in self._pending:
                self._pending[next_path] = threading.Event()
                self._queue.append((next_path, file_size, mapped))
                self._cond.notify()
            event = self._pending.get(path)
        if event is not None:
            event.wait()
            with self._cond:
                self._pending.pop(path, None)
                result = self._ready.pop(path)
            if isinstance(result, MappedFile):
                return result
            log.warning("preallocating %s failed (%s); creating it now", path, result)
        return MappedFile(path, file_size, mapped=mapped, create=True)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._running and not self._queue:
                    self._cond.wait()
                if not self._running:
                    return
                path, size, mapped = self._queue.pop(0)
                event = self._pending[path]
            started = time.monotonic()
            result: MappedFile | BaseException
            try:
                result = MappedFile(path, size, mapped=mapped, create=True)
            except BaseException as exc:  # reported to whoever takes the file
                result = exc
            log.debug("preallocated %s in %.1f ms", path.name, (time.monotonic() - started) * 1000)
            with self._cond:
                self._ready[path] = result
            event.set()

    def shutdown(self) -> None:
        """Stop the thread; files made ahead and not taken are deleted (recovery would delete them anyway)."""
        with self._cond:
            self._running = False
            self._queue.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cond:
            for result in self._ready.values():
                if isinstance(result, MappedFile):
                    result.close()
                    result.destroy()
            self._ready.clear()
            for path, event in self._pending.items():
                if not event.is_set():
                    event.set()
                    self._ready[path] = KafkaStorageError("allocation service stopped")


class MappedFileQueue:
    """The files of one directory in offset order (a CommitLog, or one ConsumeQueue)."""

    def __init__(
        self,
        directory: Path,
        file_size: int,
        *,
        mapped: bool,
        allocator: AllocateMappedFileService | None = None,
        handles: FileHandles | None = None,
    ) -> None:
        self.directory = directory
        self.file_size = file_size
        self.mapped = mapped
        self.allocator = allocator
        self.handles = handles  # where files that are not mapped keep their descriptors (file_handles.py)
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        self.lock = threading.RLock()  # the list of files

    @property
    def extended(self) -> list[MappedFile]:
        """The files found short at load and extended with zeros."""
        return [f for f in self.files if f.extended_from is not None]

    # --- loading ----------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Open every file; positions start at the full size (recovery moves the last ones back). A short file is
        extended (MappedFile._extend_short_file) and listed in `extended`."""
        if not self.directory.is_dir():
            return
        names = sorted(p.name for p in self.directory.iterdir() if FILE_NAME.match(p.name))
        misplaced = next((name for name in names if int(name) % self.file_size), None)
        if misplaced is not None:  # checked before any file is touched
            raise KafkaStorageError(
                f"{self.directory / misplaced} does not start at a multiple of the store's file size {self.file_size} "
                "(was the file size setting changed?)"
            )
        for name in names:
            mapped_file = MappedFile(self.directory / name, self.file_size, mapped=self.mapped, handles=self.handles)
            mapped_file.wrote_position = mapped_file.flushed_position = self.file_size
            if self.files and mapped_file.file_from_offset != self.files[-1].file_from_offset + self.file_size:
                log.warning(
                    "%s: file %s does not follow %s; offsets in between are missing",
                    self.directory,
                    name,
                    self.files[-1].path.name,
                )
            self.files.append(mapped_file)
        for stray in self.directory.iterdir():
            if not FILE_NAME.match(stray.name) and not stray.name.endswith(".tmp"):
                log.warning("%s: stray file %s is not a store file; leaving it alone", self.directory, stray.name)

    # --- positions --------------------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        with self.lock:
            return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """The end of what was written (RocketMQ's getMaxOffset)."""
        with self.lock:
            return self.files[-1].end_offset if self.files else 0

    @property
    def first_file(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    @property
    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        """The file holding `offset` (index arithmetic, as findMappedFileByOffset)."""
        with self.lock:
            if not self.files:
                return None
            first = self.files[0].file_from_offset
            index = (offset - first) // self.file_size
            if 0 <= index < len(self.files):
                candidate = self.files[index]
                if candidate.file_from_offset <= offset < candidate.file_from_offset + self.file_size:
                    return candidate
            for candidate in self.files:  # files with a gap between them: search
                if candidate.file_from_offset <= offset < candidate.file_from_offset + self.file_size:
                    return candidate
            return None

    def _first_file_ending_after(self, offset: int) -> MappedFile | None:
        """The file holding `offset`, or the first one after it when `offset` falls in a gap or before the first
        file; None when every file ends at or before `offset`. The caller holds the lock."""
        holder = self.find(offset)
        if holder is not None:
            return holder
        return next((f for f in self.files if f.file_from_offset + self.file_size > offset), None)

    def last_file_for_append(self, start_offset: int = 0) -> MappedFile:
        """The last file if it has room, else a new one after it (or at `start_offset` for an empty queue)."""
        with self.lock:
            last = self.last_file
            if last is not None and not last.is_full:
                return last
            if last is None:
                create_at = start_offset - start_offset % self.file_size
            else:
                create_at = last.file_from_offset + self.file_size
            path = self.directory / offset_to_file_name(create_at)
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.allocator is not None:
                next_path = self.directory / offset_to_file_name(create_at + self.file_size)
                new_file = self.allocator.get(path, self.file_size, mapped=self.mapped, next_path=next_path)
            else:
                new_file = MappedFile(path, self.file_size, mapped=self.mapped, create=True, handles=self.handles)
            self.files.append(new_file)
            return new_file

    def read(self, offset: int, size: int) -> bytes:
        mapped_file = self.find(offset)
        if mapped_file is None:
            return b""
        position = offset - mapped_file.file_from_offset
        return mapped_file.read(position, min(size, mapped_file.wrote_position - position))

    # --- flushing ---------------------------------------------------------------------------------------------

    def flush(self, least_pages: int = 0) -> bool:
        """Flush from `flushed_where` on (whole files while they are full); with `least_pages` > 0 only when that
        many pages are dirty. Returns True when something was synced."""
        flushed_any = False
        while True:
            with self.lock:
                mapped_file = self._first_file_ending_after(self.flushed_where)
                if mapped_file is None:  # flushed up to (or past) the end of the last file: nothing to do
                    return flushed_any
                if least_pages > 0 and mapped_file.dirty_pages() < least_pages and not mapped_file.is_full:
                    return flushed_any
                if mapped_file.flushed_position >= mapped_file.wrote_position:
                    if mapped_file.is_full:  # go on with the next file, if there is one
                        self.flushed_where = max(self.flushed_where, mapped_file.file_from_offset + self.file_size)
                        continue
                    self.flushed_where = max(self.flushed_where, mapped_file.end_offset)
                    return flushed_any
            position = mapped_file.flush()
            flushed_any = True
            with self.lock:
                self.flushed_where = max(self.flushed_where, mapped_file.file_from_offset + position)
                if not mapped_file.is_full:
                    return True

    # --- truncation and deletion ------------------------------------------------------------------------------

    def truncate_dirty_files(self, offset: int) -> None:
        """Everything from `offset` on goes: later files are deleted, the file holding it is cut back and zeroed
        after it (MappedFileQueue.truncateDirtyFiles)."""
        with self.lock:
            kept: list[MappedFile] = []
            for mapped_file in self.files:
                file_end = mapped_file.file_from_offset + self.file_size
                if file_end <= offset:
                    kept.append(mapped_file)
                elif mapped_file.file_from_offset <= offset:
                    position = offset - mapped_file.file_from_offset
                    mapped_file.zero_from(position)
                    mapped_file.wrote_position = mapped_file.flushed_position = position
                    kept.append(mapped_file)
                else:
                    log.info("%s: deleting %s after the truncation point %d", self.directory, mapped_file.path, offset)
                    mapped_file.close()
                    mapped_file.destroy()
            self.files = kept
            self.flushed_where = min(self.flushed_where, offset) if self.flushed_where else offset

    def delete_first_files(self, count: int) -> list[MappedFile]:
        with self.lock:
            doomed, self.files = self.files[:count], self.files[count:]
        for mapped_file in doomed:
            mapped_file.destroy()
        return doomed

    def expired_prefix(
        self,
        expired_ms: int,
        now_ms: int,
        *,
        clean_immediately: bool,
        limit: int,
        max_end_offset: int | None = None,
    ) -> int:
        """How many files from the oldest on may go (MappedFileQueue.deleteExpiredFileByTime's walk): modified more
        than `expired_ms` ago, or any age when `clean_immediately`; never the last one, none ending after
        `max_end_offset`, at most `limit`, stopping at the first that must stay."""
        with self.lock:
            count = 0
            for mapped_file in self.files[:-1]:
                if count >= limit:
                    break
                if max_end_offset is not None and mapped_file.file_from_offset + self.file_size > max_end_offset:
                    break
                modified_ms = int(os.stat(mapped_file.path).st_mtime * 1000)
                if not (now_ms >= modified_ms + expired_ms or clean_immediately):
                    break
                count += 1
            return count

    def close(self) -> None:
        with self.lock:
            for mapped_file in self.files:
                mapped_file.close()


def retry_io(action: Callable[[], None], what: str, attempts: int = 3) -> None:
    """Run a disk action, retrying a failing one a few times before giving up with KafkaStorageError."""
    for attempt in range(attempts):
        try:
            action()
            return
        except OSError as exc:
            if attempt == attempts - 1:
                raise KafkaStorageError(f"{what}: {exc}") from exc
            time.sleep(0.01)
