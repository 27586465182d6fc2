"""A full disk: a tmpfs of 8 MiB mounted for the test holds the log directory (as root, or with `sudo -n` where
that is allowed; where neither may mount the tests skip and say why). A filler file takes part of it, then records
are produced until the disk is full.

- Through the broker (librdkafka, acks=all, no retries): the produce fails with KAFKA_STORAGE_ERROR - a delivery
  error, not a hang - and the broker logs a line at ERROR naming the partition and the cause; every record
  acknowledged before is read back intact (CRC checked by librdkafka, values compared); metadata and reads keep
  being served; once the filler is deleted, writes resume at the next offset; the broker stops cleanly and the log
  directory opens with everything in it.
- Through the embedded API (`tidelog.open`), both engines: an append on the full disk raises KafkaStorageError and
  leaves the log as it was (same end offset, nothing half-written), reads go on, appends resume after space is
  freed, and a close on a full disk does not lose anything either. The RocketMQ engine stores a message when it is
  in the CommitLog (preallocated files: the append fails when the next one cannot be made); its key index, built
  after that and here at RocketMQ's default size (420 MB sparse, 20 MB of slots allocated), cannot be created on
  this disk at all - an ERROR, not a failed produce.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from crc32c import crc32c

import tidelog
from tidelog import Record
from tidelog.errors import KafkaStorageError

FS_BYTES = 8 * 1024 * 1024
FILLER_BYTES = 2 * 1024 * 1024
VALUE_BYTES = 4096
TIMEOUT_S = 30.0
TOPIC = "full"
TS = 1_700_000_000_000


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of FS_BYTES mounted at a fresh directory, unmounted afterwards."""
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount_point)]
    failures = []
    for prefix in ([], ["sudo", "-n"]):  # as we are, then through sudo where it needs no password
        if prefix and shutil.which("sudo") is None:
            failures.append("sudo: not installed")
            continue
        result = subprocess.run([*prefix, *mount], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            break
        failures.append(f"{' '.join([*prefix, 'mount'])}: {result.stderr.strip() or f'exit {result.returncode}'}")
    else:
        pytest.skip(f"cannot mount a tmpfs for the disk-full tests (needs root or sudo -n): {'; '.join(failures)}")
    try:
        yield mount_point
    finally:
        subprocess.run([*prefix, "umount", "-l", str(mount_point)], check=False)


def write_filler(path: Path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


# --- through the broker -------------------------------------------------------------------------------------------


def produce_round(bootstrap: str, values: list[bytes]) -> list[tuple[bytes, int, KafkaError | None]]:
    """Produce `values` to partition 0 (acks=all, no retries); returns (value, offset, error) per record."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "retries": 0,  # the first answer is the one reported: a storage error must come back as such
            "linger.ms": 5,
            "message.timeout.ms": int(TIMEOUT_S * 1000),
        }
    )
    results: list[tuple[bytes, int, KafkaError | None]] = []
    for value in values:
        producer.produce(
            TOPIC,
            value=value,
            partition=0,
            on_delivery=lambda err, msg: results.append((msg.value(), msg.offset(), err)),
        )
    started = time.monotonic()
    assert producer.flush(TIMEOUT_S) == 0, "records were neither acknowledged nor failed: the producer hangs"
    assert time.monotonic() - started < TIMEOUT_S
    return results


def read_all(bootstrap: str, end: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "disk-full-reader",
            "enable.auto.commit": False,
            "check.crcs": True,
        }
    )
    records: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(records) < end and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, f"reading back failed: {msg.error()}"
            records.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return records


def high_watermark(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "disk-full-watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=TIMEOUT_S)[1]
    finally:
        consumer.close()


def test_broker_on_a_full_disk(small_fs: Path, start_broker: Any) -> None:
    filler = small_fs / "filler"
    write_filler(filler, FILLER_BYTES)
    log_dir = small_fs / "logs"
    broker = start_broker(
        {
            "log.dirs": str(log_dir),
            "log.segment.bytes": 1024 * 1024,  # segments roll on the way to a full disk
            "offsets.topic.num.partitions": 2,
        }
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(TIMEOUT_S)

    rng = random.Random(5)
    acked: dict[int, bytes] = {}
    storage_errors: list[KafkaError] = []
    seq = 0
    started = time.monotonic()
    round_size = 64
    while True:  # rounds of 64 records until one fails, then single records until even one does not fit
        assert time.monotonic() - started < 120, f"the disk never filled up ({free_bytes(small_fs)} bytes free)"
        values = [b"%08d" % (seq + i) + rng.randbytes(VALUE_BYTES) for i in range(round_size)]
        seq += len(values)
        failed = False
        for value, offset, err in produce_round(broker.bootstrap, values):
            if err is None:
                acked[offset] = value
            else:
                assert err.code() == KafkaError.KAFKA_STORAGE_ERROR, f"expected KAFKA_STORAGE_ERROR, got {err}"
                storage_errors.append(err)
                failed = True
        if failed and round_size == 1:
            break
        if failed:
            round_size = 1
    fill_s = time.monotonic() - started
    full_disk_lines = [
        line for line in broker.stderr_text().splitlines() if f"{TOPIC}-0" in line and "No space left on device" in line
    ]
    assert full_disk_lines, "no clear log line about the full disk"
    assert all(" ERROR " in line for line in full_disk_lines), f"not logged at ERROR: {full_disk_lines[0]}"
    full_at = high_watermark(broker.bootstrap)
    assert sorted(acked) == list(range(full_at)), "what was acknowledged is not exactly the log"

    # still full: metadata and reads are served, and what is stored is intact
    metadata = admin.list_topics(timeout=TIMEOUT_S)
    assert TOPIC in metadata.topics and metadata.topics[TOPIC].error is None
    assert read_all(broker.bootstrap, full_at) == sorted(acked.items())
    [(_, _, err)] = produce_round(broker.bootstrap, [b"still full" + rng.randbytes(VALUE_BYTES)])
    assert err is not None and err.code() == KafkaError.KAFKA_STORAGE_ERROR
    assert high_watermark(broker.bootstrap) == full_at, "a failed produce moved the log end"

    # free space: writes resume right after what is stored
    filler.unlink()
    resumed = produce_round(broker.bootstrap, [b"resumed %d" % i for i in range(20)])
    assert [err for _, _, err in resumed] == [None] * 20, "writes did not resume after space was freed"
    end_before = max(acked) + 1
    assert [offset for _, offset, _ in resumed] == list(range(end_before, end_before + 20))
    acked.update({offset: value for value, offset, _ in resumed})
    assert read_all(broker.bootstrap, len(acked)) == sorted(acked.items())

    broker.stop()  # a clean stop (exit code 0) after the episode
    with tidelog.open(log_dir, background=False) as engine:
        raw = engine.read(TOPIC, 0, 0, 1 << 30).read_bytes()
        position = 0
        while position < len(raw):
            _base, length, _epoch, _magic, crc = struct.unpack_from(">qiibI", raw, position)
            assert crc32c(raw[position + 21 : position + length + 12]) == crc
            position += length + 12
        assert position == len(raw)
        assert [(r.offset, r.value) for r in engine.consume(TOPIC, 0)] == sorted(acked.items())
    print(
        f"\ndisk full (broker): {full_at} records of {VALUE_BYTES} B acknowledged before the {FS_BYTES >> 20} MiB "
        f"tmpfs filled ({fill_s:.1f} s); {len(storage_errors)} records refused with KAFKA_STORAGE_ERROR; "
        f"{len(resumed)} more after freeing {FILLER_BYTES >> 20} MiB; all {len(acked)} read back intact"
    )


# --- through the embedded API -----------------------------------------------------------------------------------


def fill(engine: tidelog.StorageEngine, rng: random.Random, stored: list[bytes]) -> KafkaStorageError:
    """Append batches of 8 records until the disk is full; returns the error."""
    for _ in range(10_000):
        batch = [rng.randbytes(VALUE_BYTES) for _ in range(8)]
        end = engine.log_end_offset(TOPIC, 0)
        try:
            engine.produce(TOPIC, 0, [Record(v, timestamp_ms=TS) for v in batch])
        except KafkaStorageError as exc:
            assert engine.log_end_offset(TOPIC, 0) == end, "a failed append moved the log end"
            return exc
        stored += batch
    raise AssertionError("the disk never filled up")


def check_log(engine: tidelog.StorageEngine, stored: list[bytes]) -> None:
    assert engine.log_end_offset(TOPIC, 0) == len(stored)
    assert [r.value for r in engine.consume(TOPIC, 0)] == stored


EMBEDDED_CONFIGS: dict[str, dict[str, object]] = {
    "kafka": {"log.segment.bytes": 1024 * 1024},
    "rocketmq": {
        "tidelog.rocketmq.mapedFileSizeCommitLog": 512 * 1024,
        # RocketMQ's own answer to a filling disk is to delete CommitLog files early (diskSpaceCleanForciblyRatio)
        # and refuse writes (diskSpaceWarningLevelRatio), on a cleaning round; none runs here, so the disk fills
        "tidelog.rocketmq.cleanResourceInterval": 3_600_000,
    },
}


@pytest.mark.parametrize(
    ("engine_name", "background"),
    [("kafka", True), ("rocketmq", True), ("rocketmq", False)],
    ids=["kafka", "rocketmq", "rocketmq-dispatching-inline"],  # without threads an append dispatches itself
)
def test_embedded_api_on_a_full_disk(
    small_fs: Path, engine_name: str, background: bool, caplog: pytest.LogCaptureFixture
) -> None:
    filler = small_fs / "filler"
    write_filler(filler, FILLER_BYTES)
    data = small_fs / "data"
    rng = random.Random(8)
    stored: list[bytes] = []
    config = EMBEDDED_CONFIGS[engine_name]

    def open_log() -> tidelog.StorageEngine:
        return tidelog.open(data, engine=engine_name, config=config, background=background)

    with open_log() as engine:
        engine.create_topic(TOPIC, 1)
        error = fill(engine, rng, stored)
        first_full_at = len(stored)
        assert "No space left on device" in str(error) and f"{TOPIC}-0" in str(error)
        check_log(engine, stored)
        with pytest.raises(KafkaStorageError):  # still full: a batch the size of the one refused is refused again
            engine.produce(TOPIC, 0, [Record(rng.randbytes(VALUE_BYTES), timestamp_ms=TS) for _ in range(8)])
        check_log(engine, stored)

        filler.unlink()
        more = [b"after %d" % i for i in range(10)]
        assert engine.produce(TOPIC, 0, [Record(v, timestamp_ms=TS) for v in more]) == len(stored)
        stored += more
        check_log(engine, stored)

        write_filler(small_fs / "filler", min(FILLER_BYTES, free_bytes(small_fs) - 64 * 1024))
        fill(engine, rng, stored)  # full again: the close below runs on a full disk
        check_log(engine, stored)
    with open_log() as engine:
        check_log(engine, stored)
    (small_fs / "filler").unlink()
    with open_log() as engine:
        check_log(engine, stored)
        assert engine.produce(TOPIC, 0, [Record(b"last", timestamp_ms=TS)]) == len(stored)
    if engine_name == "rocketmq":
        index_errors = [r for r in caplog.records if "key index cannot be written" in r.getMessage()]
        assert index_errors and all(r.levelname == "ERROR" for r in index_errors)
        assert "No space left on device" in index_errors[0].getMessage()
    shutil.rmtree(data)
    print(
        f"\ndisk full (embedded, {engine_name}{'' if background else ', no threads'}): {first_full_at} records of "
        f"{VALUE_BYTES} B stored before the first KafkaStorageError; {len(stored)} stored and read back in all"
    )
