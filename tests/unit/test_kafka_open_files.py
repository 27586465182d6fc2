"""The Kafka engine's open files (storage/common/file_handles.py): segment and index files open on first use, idle ones
are closed past the engine's capacity and reopen transparently, many partitions fit a small open-file limit, and a
limit that really is reached is a clear error that loses nothing. The low limits are set in child processes."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.config import LogConfig
from tidelog.open_files import raise_open_file_limit
from tidelog.storage.common.file_handles import FileHandles
from tidelog.storage.kafka.partition_log import PartitionLog


def batch(value: bytes) -> bytes:
    return build_batch([Record(value=value, key=b"k", timestamp_ms=1_700_000_000_000)])


def open_fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if fd.isdigit() and _link(fd)}


def _link(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    return True


def partition_files(directory: Path) -> set[str]:
    return {name for name in open_fds() if name.startswith(str(directory))}


def test_idle_segment_files_are_closed_and_reopen_transparently(tmp_path: Path) -> None:
    config = LogConfig(index_interval_bytes=1)  # every append writes an index entry: all three files are used
    handles = FileHandles(capacity=3)  # one active segment's .log, .index and .timeindex
    first = PartitionLog(tmp_path / "t-0", "t", 0, "id", config, handles=handles)
    second = PartitionLog(tmp_path / "t-1", "t", 1, "id", config, handles=handles)
    try:
        first.append(batch(b"a0"))
        first.append(batch(b"a1"))
        assert len(partition_files(first.directory)) == 3
        in_flight = first.read(0, 1 << 20)  # a fetch's slices, not yet sent

        second.append(batch(b"b0"))
        second.append(batch(b"b1"))
        assert len(partition_files(second.directory)) == 3
        assert len(handles) == 3
        # the idle partition's files are let go; the .log stays open only as long as the slice in flight needs it
        assert partition_files(first.directory) == {str(first.active_segment.log_path)}
        assert b"a1" in in_flight.read_bytes()
        del in_flight
        assert partition_files(first.directory) == set()

        assert b"a0" in first.read(0, 1 << 20).read_bytes()  # reopened by path
        assert first.append(batch(b"a2")).base_offset == 2
        assert first.offset_for_timestamp(1_700_000_000_000) is not None  # the time index, reopened
        assert b"a2" in first.read(2, 1 << 20).read_bytes()
        assert partition_files(second.directory) == set()
        assert second.append(batch(b"b2")).base_offset == 2
        stored = second.read(0, 1 << 20).read_bytes()
        assert all(value in stored for value in (b"b0", b"b1", b"b2"))
    finally:
        first.close()
        second.close()
    assert partition_files(tmp_path) == set()
    reopened = PartitionLog(tmp_path / "t-0", "t", 0, "id", config, handles=handles)
    try:
        assert reopened.log_end_offset == 3
        assert reopened.recovery_point == 3  # a clean close: everything was flushed through whatever descriptor
    finally:
        reopened.close()


CHILD = """
import os, resource, sys, logging
from pathlib import Path
import tidelog
from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.errors import KafkaStorageError

LIMIT = {limit}
resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
logging.basicConfig(level=logging.ERROR, format="LOG %(levelname)s %(message)s", stream=sys.stdout)
directory = Path(sys.argv[1])

def batch(p):
    return build_batch([Record(value=b"<v%d>" % p, key=b"k", timestamp_ms=1_700_000_000_000)])

def fds():
    return len(os.listdir("/proc/self/fd"))

def hog_descriptors():  # /dev/null opened until no descriptor is left; the caller closes them
    hogs = []
    try:
        while True:
            hogs.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        return hogs
"""

MANY_PARTITIONS = """
PARTITIONS = {partitions}
most = 0
with tidelog.open(directory, background=False) as engine:
    engine.create_topic("t", PARTITIONS)
    for p in range(PARTITIONS):
        engine.append("t", p, batch(p))
        most = max(most, fds())
    for p in range(PARTITIONS):
        assert engine.read("t", p, 0, 1 << 20).read_bytes().count(b"<v%d>" % p) == 1
with tidelog.open(directory, background=False) as engine:  # a clean restart
    for p in range(PARTITIONS):
        assert engine.partition("t", p).log_end_offset == 1
        assert engine.read("t", p, 0, 1 << 20).read_bytes().count(b"<v%d>" % p) == 1
        most = max(most, fds())
print("OK", most)
"""


def run_child(script: str, directory: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_many_more_partitions_than_the_open_file_limit_allows_files(tmp_path: Path) -> None:
    """Before file_handles.py each partition kept 5 descriptors open, so 300 partitions needed 1,500; now files
    open when used and the idle ones are closed past half the limit (64 here: 32 segment files)."""
    out = run_child(CHILD.format(limit=64) + MANY_PARTITIONS.format(partitions=300), tmp_path)
    verdict, most = out.split()[-2:]
    assert verdict == "OK"
    assert int(most) <= 64


REACHED = """
with tidelog.open(directory, background=False) as engine:
    engine.create_topic("t", 2)
    engine.append("t", 0, batch(0))
    while len(engine.file_handles):  # the engine holds nothing it could close
        engine.file_handles.shrink()
    hogs = hog_descriptors()
    try:
        engine.append("t", 0, batch(1))
    except KafkaStorageError as exc:
        print("ERROR", exc)
    else:
        raise AssertionError("the append went through without a descriptor")
    for fd in hogs:
        os.close(fd)
    assert engine.append("t", 0, batch(2)).base_offset == 1, "nothing was written, nothing is lost"
    stored = engine.read("t", 0, 0, 1 << 20).read_bytes()
    assert b"<v0>" in stored and b"<v2>" in stored and b"<v1>" not in stored
print("DONE")
"""


def test_reaching_the_open_file_limit_is_a_clear_error(tmp_path: Path) -> None:
    out = run_child(CHILD.format(limit=64) + REACHED, tmp_path)
    error = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert "open-file limit is reached (soft 64, hard " in error
    assert "ulimit -n" in error and "LimitNOFILE" in error
    assert any(line.startswith("LOG ERROR") and "open-file limit" in line for line in out.splitlines())
    assert out.splitlines()[-1] == "DONE"


INDEX_TAIL = """
from tidelog.storage.common.file_handles import FileHandles
from tidelog.storage.kafka.index_tails import IndexTails
from tidelog.storage.kafka.offset_index import OffsetIndex, OffsetPosition

logging.getLogger().setLevel(logging.WARNING)
handles = FileHandles(capacity=8)
index = OffsetIndex(directory / "00000000000000000000.index", 0, 4096, handles=handles, tails=IndexTails())
for i in range(150):
    index.append(10 * i + 9, 100 * i)
    if i == 99:
        index.write_tail()  # 100 entries in the file, the next 50 in memory
while len(handles):
    handles.shrink()
hogs = hog_descriptors()
index.write_tail()  # no descriptor to write them with: dropped, not raised
try:
    index.flush()
except KafkaStorageError as exc:
    print("FLUSH", exc)
for fd in hogs:
    os.close(fd)
assert index.entries == 100, index.entries
assert index.lookup(10 * 149 + 9) == OffsetPosition(999, 9900)  # the last entry kept: a scan from there finds it
index.flush()
index.close()
assert (directory / "00000000000000000000.index").stat().st_size == 100 * 8
print("DONE")
"""


def test_index_entries_without_a_descriptor_to_write_them_are_dropped(tmp_path: Path) -> None:
    """Entries still in an index's memory when no descriptor is left to write them go, with a warning: the index is
    sparser, never wrong; the flush that cannot sync says so and syncs once a descriptor is free."""
    out = run_child(CHILD.format(limit=64) + INDEX_TAIL, tmp_path)
    lines = out.splitlines()
    assert any(line.startswith("LOG WARNING cannot write 50 index entries") for line in lines), out
    assert any(line.startswith("FLUSH") and "open-file limit is reached" in line for line in lines), out
    assert lines[-1] == "DONE"


def test_serve_raises_the_soft_open_file_limit_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 128), hard))
        assert raise_open_file_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
