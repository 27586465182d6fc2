"""Follower truncation after leader changes (KIP-101, KIP-279), on real partition logs: the rounds a follower's
fetcher makes (`replica_fetcher.divergence` against the leader's `end_offset_for_epoch`, the answer of
OffsetForLeaderEpoch), then the copy of what follows, leave the follower's log byte-identical to the leader's -
whatever each of them wrote while it led alone."""

from __future__ import annotations

from pathlib import Path

from tidelog import Record
from tidelog.broker.replica_fetcher import divergence, whole_batches_length
from tidelog.codec.record_batch import build_batch
from tidelog.config import LogConfig
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.kafka.partition_log import PartitionLog

TOPIC_ID = new_kafka_uuid()


def open_log(directory: Path) -> PartitionLog:
    return PartitionLog(directory, "t", 0, TOPIC_ID, LogConfig(segment_bytes=600), replicated=True)


def lead(log: PartitionLog, epoch: int, values: range) -> None:
    """`log` leads in `epoch` and appends one batch per value."""
    log.leader_epoch = epoch
    for value in values:
        log.append(build_batch([Record(f"{epoch}:{value}".encode())]))


def copy(leader: PartitionLog, follower: PartitionLog, up_to: int | None = None) -> None:
    """Fetch from the leader into the follower, as a fetcher does (one batch a fetch, so that it can stop at
    `up_to`; default: the leader's end)."""
    end = leader.log_end_offset if up_to is None else up_to
    while follower.log_end_offset < end:
        data = leader.read(follower.log_end_offset, 1, up_to_log_end=True).read_bytes()
        follower.append_replica(data[: whole_batches_length(data)])


def rounds(follower: PartitionLog, leader: PartitionLog) -> int:
    """The truncation rounds of a follower of `leader`; how many it took."""
    for count in range(1, 10):
        epoch, end = leader.end_offset_for_epoch(follower.latest_epoch)
        target, done = divergence(follower, epoch, end)
        if target < follower.log_end_offset:
            follower.truncate_to(target)
        if done:
            return count
    raise AssertionError("the rounds do not end")


def log_bytes(log: PartitionLog) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(log.directory.glob("*.log")))


def test_a_follower_drops_what_it_alone_wrote_in_the_leaders_epoch(tmp_path: Path) -> None:
    """KIP-101: A led epoch 0 and wrote 5 records B never copied; B leads epoch 1 and writes 3 of its own. A
    follows B: its end of epoch 0 (15) is past B's (10): A is cut to 10, in one round, and copies B's."""
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    lead(a, 0, range(10))
    copy(a, b)
    lead(a, 0, range(10, 15))  # never copied: A dies
    lead(b, 1, range(10, 13))
    assert rounds(a, b) == 1
    assert a.log_end_offset == 10
    copy(b, a)
    assert log_bytes(a) == log_bytes(b)
    assert a.end_offset_for_epoch(1) == b.end_offset_for_epoch(1)


def test_a_follower_with_an_epoch_the_leader_never_had_takes_two_rounds(tmp_path: Path) -> None:
    """KIP-279: B led epoch 1 (records 10-11) that A never copied; A then led epoch 2 alone (10-14 on its own log);
    B leads epoch 3. A asks for epoch 2, which B never had: B answers epoch 1, ending at 12. A has no epoch 1: it is
    cut where its largest epoch below 1 ends (10), asks again for epoch 0, and the logs agree at 10."""
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    lead(b, 0, range(10))
    copy(b, a)
    lead(b, 1, range(10, 12))
    lead(a, 2, range(10, 15))  # A led alone; nobody copied
    lead(b, 3, range(12, 14))
    assert b.end_offset_for_epoch(2) == (1, 12)
    assert rounds(a, b) == 2
    assert a.log_end_offset == 10 and a.latest_epoch == 0
    copy(b, a)
    assert log_bytes(a) == log_bytes(b)


def test_an_older_epoch_both_have_is_cut_at_the_followers_end_of_it(tmp_path: Path) -> None:
    """B led epoch 1 (10-11) and A copied only offset 10; A then led epoch 2 alone (11-14); B leads epoch 3. B
    answers epoch 1 ending at 12; A's epoch 1 ends at 11: cut there, in one round."""
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    lead(b, 0, range(10))
    copy(b, a)
    lead(b, 1, range(10, 12))
    copy(b, a, up_to=11)
    lead(a, 2, range(11, 15))
    lead(b, 3, range(12, 14))
    assert rounds(a, b) == 1
    assert a.log_end_offset == 11 and a.latest_epoch == 1
    copy(b, a)
    assert log_bytes(a) == log_bytes(b)


def test_a_follower_that_is_behind_keeps_everything(tmp_path: Path) -> None:
    """A follower whose log is a prefix of the leader's is not cut at all."""
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    lead(b, 0, range(5))
    lead(b, 2, range(5, 9))
    copy(b, a, up_to=6)
    assert rounds(a, b) == 1
    assert a.log_end_offset == 6
    copy(b, a)
    assert log_bytes(a) == log_bytes(b)


def test_an_empty_follower_and_one_without_a_comparable_epoch_keep_their_high_watermark(tmp_path: Path) -> None:
    a = open_log(tmp_path / "a")
    assert divergence(a, 3, 40) == (0, True)  # empty: nothing to cut
    lead(a, 5, range(6))
    a.set_high_watermark(4)
    assert divergence(a, -1, -1) == (4, True)  # the leader knows no epoch at or below 5: keep the committed part
