"""Open store files, bounded: opened on first use, the idle ones closed (Kafka's LazyIndex, and a bound Kafka leaves to
`ulimit -n`). Both engines use it: the Kafka engine for its segments' files, the RocketMQ engine for its ConsumeQueue
files (one per queue; its few CommitLog files stay open and mapped).

A `LazyFile` stands for one file (a segment's `.log`, `.index`, `.timeindex` or `.txnindex`; a ConsumeQueue file).
Creating one opens nothing; `get()` opens the file on first use and hands out the open `StoreFile`. One `FileHandles`
per engine holds every open `LazyFile` and keeps at most `capacity` of them open: when a file opens past that, the
least recently used are let go (the clock algorithm: a use only sets a flag, so the append path takes no lock; a
file used since the hand last passed it gets a second chance). Nothing else closes a file until it is closed or
sealed (its segment or queue closes or is deleted): a partition or queue that nobody writes or reads holds no
descriptor once enough others were used after it, and opens its files again, by path, at its next use.

Letting go of a file only drops the reference: the descriptor closes when the last holder lets go of the
`StoreFile` (CPython frees it then, and `StoreFile.__del__` closes it quietly). Every use holds the object for as
long as it needs the descriptor - a pwrite, an fsync, a header walk, a `FileSlice` on its way to a socket - so a
descriptor is never closed under a use, and its number is never reused while one remains. Data written through a
descriptor that was let go stays in the page cache, and an fsync through the next one makes it durable (fsync acts on
the file, not on the descriptor). `seal()` is let-go for a deleted file: never opened again (by its name, which a
later file may take), its open descriptor left to its last holder.

When opening fails with EMFILE or ENFILE, half of the held files are let go and the open is tried once more; if it
fails again the error is a KafkaStorageError that names the limit and the setting to change (`ulimit -n`, systemd's
LimitNOFILE), logged at ERROR, never a bare OSError. `capacity_for_limit` gives the share of the process's open-file
limit an engine's store files may hold (the rest is for client connections and the files opened in passing:
checkpoints, snapshots).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import resource
import threading
from collections import OrderedDict
from pathlib import Path

from tidelog.errors import InvalidPartitionsError, KafkaStorageError

log = logging.getLogger("tidelog.storage")

SHARE_OF_OPEN_FILE_LIMIT = 0.5  # of the soft RLIMIT_NOFILE, for an engine's store files
MIN_CAPACITY = 16  # a partition's active segment needs 3 at once; a read crossing segments a few more
UNLIMITED_CAPACITY = 1 << 20  # RLIM_INFINITY: bounded all the same
# Partitions (queues) hold no descriptor while idle, so their number is not bounded by descriptors; an engine bounds
# it all the same, at PARTITIONS_PER_OPEN_FILE per descriptor of the hard open-file limit, so that a CreateTopics
# asking for 2^31 of them is refused instead of filling the disk with directories. A broker near that bound that
# uses all its partitions at once reopens files at every use.
PARTITIONS_PER_OPEN_FILE = 4


class StoreFile(io.FileIO):
    """An open store file whose descriptor closes when the last reference to it goes (without a ResourceWarning:
    the engine lets go of files on purpose, see the module docstring)."""

    def __del__(self) -> None:
        self.close()


def capacity_for_limit() -> int:
    """How many store files an engine keeps open: half of the soft open-file limit, at least MIN_CAPACITY."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return UNLIMITED_CAPACITY
    return max(MIN_CAPACITY, int(soft * SHARE_OF_OPEN_FILE_LIMIT))


def check_partition_budget(topic: str, new: int, held: int, noun: str = "partitions") -> None:
    """Refuse `new` more partitions (or queues) when, with the `held` ones, they pass PARTITIONS_PER_OPEN_FILE per
    descriptor of the hard open-file limit: an InvalidPartitionsError naming the limit and how many more fit."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return
    room = hard * PARTITIONS_PER_OPEN_FILE - held
    if new > room:
        raise InvalidPartitionsError(
            f"topic {topic}: {new} more {noun} would exceed {PARTITIONS_PER_OPEN_FILE} per descriptor of the "
            f"broker's hard open-file limit ({hard}, ulimit -Hn); {max(room, 0)} more fit"
        )


def open_file_limit_error(path: Path, exc: OSError) -> KafkaStorageError:
    """The error for a file the process's (EMFILE) or the system's (ENFILE) open-file limit kept closed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if exc.errno == errno.ENFILE:
        where = "the system's open-file limit (fs.file-max) is reached"
        change = "raise fs.file-max (sysctl) or close files elsewhere"
    else:
        where = f"the broker's open-file limit is reached (soft {soft}, hard {hard})"
        change = "raise the limit - `ulimit -n` in the shell that starts the broker, LimitNOFILE= in a systemd unit"
    return KafkaStorageError(f"cannot open {path}: {where}; {change}")


class FileHandles:
    """The open LazyFiles of one engine, at most `capacity` of them (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._lock = threading.Lock()
        self._open: OrderedDict[LazyFile, None] = OrderedDict()  # the clock: the hand is at the front

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, lazy: LazyFile) -> None:
        """`lazy` just opened its file: hold it, letting go of idle ones past the capacity."""
        with self._lock:
            self._open[lazy] = None
            self._sweep(self.capacity)

    def forget(self, lazy: LazyFile) -> None:
        with self._lock:
            self._open.pop(lazy, None)

    def shrink(self) -> None:
        """Let go of half of the open files (an open failed for want of descriptors)."""
        with self._lock:
            self._sweep(len(self._open) // 2)

    def _sweep(self, keep: int) -> None:
        """Under the lock: advance the clock until at most `keep` files are held."""
        chances = len(self._open)  # each file gets one second chance at most
        while len(self._open) > keep:
            lazy, _ = self._open.popitem(last=False)
            if lazy.used and chances:
                chances -= 1
                lazy.used = False
                self._open[lazy] = None
            else:
                lazy.let_go()


class LazyFile:
    """A store file opened on first use (`get`): read-write and created if missing, or read-only (`writable`
    False: the dump-log tool's and the Spark path reader's indexes)."""

    __slots__ = ("_closed", "_file", "_handles", "_writable", "path", "used")

    def __init__(self, path: Path, handles: FileHandles | None, *, writable: bool = True) -> None:
        self.path = path
        self.used = False
        self._writable = writable
        self._file: StoreFile | None = None
        self._handles = handles
        self._closed = False  # by close(): never opened again (a deleted segment's name must not be recreated)

    @property
    def is_open(self) -> bool:
        return self._file is not None

    @property
    def sealed(self) -> bool:
        return self._closed

    def get(self) -> StoreFile:
        """The open file (opened now if it is not). Hold the returned object for as long as its descriptor is used."""
        file = self._file
        if file is None:
            return self._open()
        self.used = True
        return file

    def if_open(self) -> StoreFile | None:
        """The open file, or None when it is not open (nothing is opened). Hold it as `get`'s."""
        file = self._file
        if file is not None:
            self.used = True
        return file

    def _open(self) -> StoreFile:
        if self._closed:
            raise KafkaStorageError(f"{self.path} is closed")
        flags = os.O_CLOEXEC | (os.O_RDWR | os.O_CREAT if self._writable else os.O_RDONLY)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            if self._handles is not None:
                self._handles.shrink()
            try:
                fd = os.open(self.path, flags, 0o644)
            except OSError as again:
                if again.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                error = open_file_limit_error(self.path, again)
                log.error("%s", error)
                raise error from again
        file = self._file = StoreFile(fd, "r+b" if self._writable else "rb")
        if self._handles is not None:
            self._handles.opened(self)
        return file

    def let_go(self) -> None:
        """Drop the open file (it closes once no use holds it); the next `get` opens it again."""
        self._file = None
        self.used = False

    def seal(self) -> None:
        """Never open the file again (it was deleted); an open descriptor closes with its last holder, as in
        `let_go`, so a use still running finishes on it."""
        self._file = None
        self._closed = True
        if self._handles is not None:
            self._handles.forget(self)

    def close(self) -> None:
        """Close the file now (the segment closes or is deleted)."""
        file, self._file = self._file, None
        self._closed = True
        if self._handles is not None:
            self._handles.forget(self)
        if file is not None:
            file.close()

    def rename(self, new_path: Path) -> None:
        """Rename the file on disk (an open descriptor follows it) and open it by the new name from now on."""
        os.rename(self.path, new_path)
        self.path = new_path
