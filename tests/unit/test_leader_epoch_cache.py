"""The leader-epoch cache (storage/kafka/leader_epoch_cache.py): its entries, the leader-epoch-checkpoint file it
keeps in step, loading, and Kafka's endOffsetFor answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from tidelog.storage.common.scheduler import Scheduler
from tidelog.storage.kafka import checkpoints
from tidelog.storage.kafka.leader_epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEndOffset,
    LeaderEpochCache,
)

NAME = "t-0"


class ManualScheduler:
    """Keeps the one-shot tasks it is given until the test runs them."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, Callable[[], object]]] = []

    def schedule(
        self, name: str, task: Callable[[], object], delay_ms: float = 0, period_ms: float | None = None
    ) -> None:
        self.tasks.append((name, task))

    def run_all(self) -> None:
        tasks, self.tasks = self.tasks, []
        for _name, task in tasks:
            task()


def file_text(directory: Path) -> str:
    return (directory / checkpoints.LEADER_EPOCH_CHECKPOINT).read_text()


def cache_of(
    directory: Path, entries: list[tuple[int, int]], scheduler: ManualScheduler | None = None
) -> LeaderEpochCache:
    return LeaderEpochCache(directory, entries, name=NAME, scheduler=cast(Scheduler, scheduler))


def load(
    directory: Path,
    *,
    recovered: list[tuple[int, int]] | None = None,
    scanned: list[tuple[int, int]] | None = None,
    log_start_offset: int = 0,
    log_end_offset: int = 100,
) -> LeaderEpochCache:
    def scan() -> list[tuple[int, int]]:
        assert scanned is not None, "the log was scanned although the checkpoint was usable"
        return scanned

    return LeaderEpochCache.load(
        directory,
        name=NAME,
        scheduler=None,
        recovered=recovered or [],
        scan=scan,
        log_start_offset=log_start_offset,
        log_end_offset=log_end_offset,
    )


# --- changes and the file -----------------------------------------------------------------------------------------


def test_assign_adds_an_entry_only_for_a_higher_epoch_and_writes_the_file_without_a_scheduler(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, [])
    cache.assign(0, 0)
    assert file_text(tmp_path) == "0\n1\n0 0\n"
    cache.assign(0, 5)  # more records in the same epoch
    cache.assign(-1, 7)  # never lower
    assert cache.entries() == [(0, 0)]
    cache.assign(3, 9)
    assert cache.entries() == [(0, 0), (3, 9)]
    assert file_text(tmp_path) == "0\n2\n0 0\n3 9\n"
    assert not cache.unwritten


def test_changes_are_written_by_the_scheduler_once_however_many_came_before(tmp_path: Path) -> None:
    scheduler = ManualScheduler()
    cache = cache_of(tmp_path, [(0, 0)], scheduler)
    cache.assign(1, 10)
    cache.assign(2, 20)
    cache.truncate_from_start(5)
    assert cache.unwritten and len(scheduler.tasks) == 1
    assert not (tmp_path / checkpoints.LEADER_EPOCH_CHECKPOINT).exists()
    scheduler.run_all()
    assert file_text(tmp_path) == "0\n3\n0 5\n1 10\n2 20\n"
    assert not cache.unwritten
    cache.truncate_from_start(5)  # no change: nothing to write
    assert scheduler.tasks == []


def test_write_checkpoint_writes_at_once_and_a_failed_write_stays_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = ManualScheduler()
    cache = cache_of(tmp_path, [], scheduler)
    cache.assign(0, 0)
    real_write = checkpoints.write_leader_epoch_checkpoint

    def full_disk(path: Path, entries: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints, "write_leader_epoch_checkpoint", full_disk)
    with pytest.raises(OSError):
        cache.write_checkpoint()
    assert cache.unwritten
    monkeypatch.setattr(checkpoints, "write_leader_epoch_checkpoint", real_write)
    cache.write_checkpoint()  # as the partition's flush does, before the scheduled write came
    assert file_text(tmp_path) == "0\n1\n0 0\n" and not cache.unwritten
    scheduler.run_all()  # the scheduled write then finds nothing to do
    assert file_text(tmp_path) == "0\n1\n0 0\n"


def test_nothing_is_written_after_close(tmp_path: Path) -> None:
    scheduler = ManualScheduler()
    cache = cache_of(tmp_path, [], scheduler)
    cache.assign(0, 0)
    cache.close()
    scheduler.run_all()
    cache.write_checkpoint()
    assert not (tmp_path / checkpoints.LEADER_EPOCH_CHECKPOINT).exists()


def test_truncate_from_start_moves_the_epoch_in_force_up_to_the_new_log_start(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, [(0, 0), (1, 5), (2, 10)])
    cache.truncate_from_start(0)  # nothing below
    assert cache.entries() == [(0, 0), (1, 5), (2, 10)]
    cache.truncate_from_start(7)
    assert cache.entries() == [(1, 7), (2, 10)]
    cache.truncate_from_start(10)  # exactly at an entry's start: the entries below it go
    assert cache.entries() == [(2, 10)]
    cache.truncate_from_start(15)
    assert cache.entries() == [(2, 15)]
    assert file_text(tmp_path) == "0\n1\n2 15\n"


def test_truncate_from_end_drops_the_entries_starting_at_or_above_it(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, [(0, 0), (1, 5), (2, 10)])
    cache.truncate_from_end(11)
    assert cache.entries() == [(0, 0), (1, 5), (2, 10)]
    cache.truncate_from_end(10)
    assert cache.entries() == [(0, 0), (1, 5)]
    assert file_text(tmp_path) == "0\n2\n0 0\n1 5\n"
    cache.truncate_from_end(0)
    assert cache.entries() == []


# --- reads ----------------------------------------------------------------------------------------------------------


def test_epoch_for_offset(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, [(1, 5), (4, 10)])
    assert [cache.epoch_for_offset(offset) for offset in (0, 4, 5, 9, 10, 1000)] == [None, None, 1, 1, 4, 4]
    assert cache_of(tmp_path, []).epoch_for_offset(0) is None


def test_end_offset_for_answers_as_kafkas_end_offset_for(tmp_path: Path) -> None:
    """Kafka's LeaderEpochFileCache.endOffsetFor, case by case (its LeaderEpochFileCacheTest has the same)."""
    undefined = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    assert (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET) == (-1, -1)
    empty = cache_of(tmp_path, [])
    assert empty.end_offset_for(0, 73) == undefined
    assert empty.end_offset_for(UNDEFINED_EPOCH, 73) == undefined

    cache = cache_of(tmp_path, [(2, 6), (3, 8), (5, 11)])
    assert cache.end_offset_for(UNDEFINED_EPOCH, 20) == undefined
    # the latest epoch is still being written: it ends at the log end
    assert cache.end_offset_for(5, 20) == (5, 20)
    # an earlier epoch ends where the next one starts
    assert cache.end_offset_for(2, 20) == (2, 8)
    assert cache.end_offset_for(3, 20) == (3, 11)
    # an epoch the log never had: the last epoch below it, up to the start of the first above it
    assert cache.end_offset_for(4, 20) == (3, 11)
    # below the first epoch: the requested epoch, up to where the log's epochs begin
    assert cache.end_offset_for(1, 20) == (1, 6)
    # above every epoch
    assert cache.end_offset_for(6, 20) == undefined
    assert cache.end_offset_for(5, 20).end_offset == 20 and cache.end_offset_for(2, 20).leader_epoch == 2


# --- loading --------------------------------------------------------------------------------------------------------


def test_load_takes_the_file_adds_the_recovered_epochs_and_cuts_to_the_log(tmp_path: Path) -> None:
    checkpoints.write_leader_epoch_checkpoint(tmp_path / checkpoints.LEADER_EPOCH_CHECKPOINT, [(0, 0), (1, 5)])
    cache = load(tmp_path, recovered=[(0, 40), (1, 45), (2, 50), (3, 70)], log_start_offset=3, log_end_offset=60)
    assert cache.entries() == [(0, 3), (1, 5), (2, 50)]
    assert file_text(tmp_path) == "0\n3\n0 3\n1 5\n2 50\n"
    assert not cache.unwritten


def test_load_leaves_a_file_that_holds_the_same_entries_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints.write_leader_epoch_checkpoint(tmp_path / checkpoints.LEADER_EPOCH_CHECKPOINT, [(0, 0), (1, 5)])
    writes: list[object] = []
    monkeypatch.setattr(checkpoints, "write_leader_epoch_checkpoint", lambda path, entries: writes.append(entries))
    assert load(tmp_path, recovered=[(1, 7)]).entries() == [(0, 0), (1, 5)]
    assert writes == []


@pytest.mark.parametrize("content", [None, b"0\n2\n0 0\n", b"\xff\xfe", b"7\n0\n"])
def test_load_scans_the_log_when_the_file_is_missing_or_unreadable(
    tmp_path: Path, content: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / checkpoints.LEADER_EPOCH_CHECKPOINT
    if content is not None:
        path.write_bytes(content)
    cache = load(tmp_path, recovered=[(9, 90)], scanned=[(0, 0), (2, 30)], log_end_offset=30)
    assert cache.entries() == [(0, 0)]  # the scan, cut to the log end; what recovery found is in the scan already
    assert file_text(tmp_path) == "0\n1\n0 0\n"
    if content is not None:
        assert "rebuilding leader epochs from the log" in caplog.text


def test_an_empty_log_gets_an_empty_file(tmp_path: Path) -> None:
    assert load(tmp_path, scanned=[], log_end_offset=0).entries() == []
    assert file_text(tmp_path) == "0\n0\n"
