"""`tidelog dump-log` prints what kafka-dump-log.sh prints, for files tidelog wrote and files Kafka wrote."""

from __future__ import annotations

import io
import json
import shutil
import struct
from pathlib import Path

import pytest

import tidelog
from tidelog.cli import main
from tidelog.codec.control_record import ControlRecordType, build_control_batch
from tidelog.tools.dump_log import DumpOptions, dump_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kafka-written"
WORKED_EXAMPLE_BATCH = (
    "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
    "partitionLeaderEpoch: 0 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty "
    "position: 0 CreateTime: 1700000000000 size: 70 magic: 2 compresscodec: none crc: 3919285720 isvalid: true"
)
WORKED_EXAMPLE_RECORD = (
    "| offset: 0 CreateTime: 1700000000000 keySize: 1 valueSize: 1 sequence: -1 headerKeys: [] key: k payload: v"
)


def dump(files: list[Path], **options: object) -> tuple[list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    dump_files([str(f) for f in files], DumpOptions(**options), out=out, err=err)  # type: ignore[arg-type]
    return out.getvalue().splitlines(), err.getvalue().splitlines()


@pytest.fixture
def one_record_segment(tmp_path: Path) -> Path:
    with tidelog.open(tmp_path, background=False) as log:
        log.create_topic("t", partitions=1)
        log.produce("t", 0, [tidelog.Record(value=b"v", key=b"k", timestamp_ms=1_700_000_000_000)])
    return tmp_path / "t-0" / "00000000000000000000.log"


def test_worked_example_matches_kafka_output_line_for_line(one_record_segment: Path) -> None:
    lines, err = dump([one_record_segment], print_data_log=True)
    assert lines == [
        f"Dumping {one_record_segment}",
        "Log starting offset: 0",
        WORKED_EXAMPLE_BATCH,
        WORKED_EXAMPLE_RECORD,
    ]
    assert err == []


def test_without_print_data_log_only_batches_are_printed(one_record_segment: Path) -> None:
    lines, _ = dump([one_record_segment])
    assert lines[2:] == [WORKED_EXAMPLE_BATCH]
    lines, _ = dump([one_record_segment], deep_iteration=True)
    assert lines[3] == WORKED_EXAMPLE_RECORD.removesuffix(" key: k payload: v")


def test_trailer_reports_invalid_bytes_at_the_end(one_record_segment: Path) -> None:
    with open(one_record_segment, "ab") as handle:
        handle.write(b"\x00" * 8 + struct.pack(">i", 500) + b"partial")
    lines, _ = dump([one_record_segment])
    assert lines[-1] == "Found 19 invalid bytes at the end of 00000000000000000000.log"
    assert lines[2] == WORKED_EXAMPLE_BATCH


def test_a_flipped_byte_prints_isvalid_false(one_record_segment: Path) -> None:
    data = bytearray(one_record_segment.read_bytes())
    data[-1] ^= 0xFF
    one_record_segment.write_bytes(bytes(data))
    lines, _ = dump([one_record_segment])
    assert lines[2].endswith("isvalid: false")


def test_garbage_size_stops_with_a_message_and_the_trailer(one_record_segment: Path) -> None:
    with open(one_record_segment, "ab") as handle:
        handle.write(b"\x00" * 8 + struct.pack(">i", 3) + b"\x00" * 20)
    lines, err = dump([one_record_segment])
    assert lines[-1] == "Found 32 invalid bytes at the end of 00000000000000000000.log"
    assert any("declares size 3" in line for line in err)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.records")))
def test_kafka_written_segments_dump_every_record(tmp_path: Path, name: str) -> None:
    segment = tmp_path / "kafka-0" / "00000000000000000000.log"
    segment.parent.mkdir()
    shutil.copy(FIXTURES / name, segment)
    expected = json.loads((FIXTURES / "expected.json").read_text())[name]
    lines, err = dump([segment], print_data_log=True)
    assert err == []
    records = [line for line in lines if line.startswith("| ")]
    assert len(records) == len(expected)
    for line, want in zip(records, expected, strict=True):
        assert line.startswith(f"| offset: {want['offset']} CreateTime: {want['timestamp_ms']} ")
        assert line.endswith(f" key: {want['key']} payload: {want['value']}")
        if want["magic"] == 1:
            assert " isValid: true crc: " in line
        else:
            assert " sequence: -1 headerKeys: []" in line
    batches = [line for line in lines[2:] if not line.startswith("| ")]
    assert batches and all(line.endswith("isvalid: true") for line in batches)
    assert all(("magic: 1" in line) == line.startswith("offset: ") for line in batches)
    assert not any(line.startswith("Found") for line in lines)


def make_indexed_segment(tmp_path: Path) -> Path:
    with tidelog.open(tmp_path, config={"log.index.interval.bytes": 200}, background=False) as log:
        log.create_topic("t", partitions=1)
        for i in range(40):
            log.produce("t", 0, [tidelog.Record(value=b"x" * 90, key=b"%d" % i, timestamp_ms=1_700_000_000_000 + i)])
    return tmp_path / "t-0"


def test_index_and_time_index_dumps_agree_with_the_log(tmp_path: Path) -> None:
    directory = make_indexed_segment(tmp_path)
    index, time_index = directory / "00000000000000000000.index", directory / "00000000000000000000.timeindex"
    raw_index = list(struct.iter_unpack(">ii", index.read_bytes()))
    lines, err = dump([index, time_index])
    assert err == []
    assert lines[0] == f"Dumping {index}"
    offset_lines = lines[1 : 1 + len(raw_index)]
    assert offset_lines == [f"offset: {rel} position: {pos}" for rel, pos in raw_index]
    raw_time = list(struct.iter_unpack(">qi", time_index.read_bytes()))
    assert lines[2 + len(raw_index) :] == [f"timestamp: {ts} offset: {rel}" for ts, rel in raw_time]

    lines, err = dump([index, time_index], verify_index_only=True)
    assert lines == [f"Dumping {index}", f"Dumping {time_index}"]
    assert err == []


def test_verify_index_only_reports_a_wrong_entry(tmp_path: Path) -> None:
    directory = make_indexed_segment(tmp_path)
    index = directory / "00000000000000000000.index"
    raw = bytearray(index.read_bytes())
    relative, position = struct.unpack_from(">ii", raw, 8)
    struct.pack_into(">ii", raw, 8, relative + 1, position)
    index.write_bytes(bytes(raw))
    lines, err = dump([index], verify_index_only=True)
    assert lines == [f"Dumping {index}"]
    assert err[0] == f"Mismatches in :{index.resolve()}"
    assert err[1] == f"  Index offset: {relative + 1}, log offset: {relative}"


def test_index_sanity_check(tmp_path: Path) -> None:
    directory = make_indexed_segment(tmp_path)
    index = directory / "00000000000000000000.index"
    lines, _ = dump([index], index_sanity_check=True)
    assert lines[1] == f"{index} passed sanity check."
    with open(index, "ab") as handle:
        handle.write(b"\x00\x00\x00")
    lines, _ = dump([index], index_sanity_check=True)
    assert "is corrupt, found" in lines[1] and "neither positive nor a multiple of 8" in lines[1]


def test_time_index_sanity_check(tmp_path: Path) -> None:
    """Kafka's TimeIndex.sanityCheck: the last timestamp below the first entry's (what a zero-filled preallocated
    tail looks like), the last offset below the base, then a partial entry."""
    directory = make_indexed_segment(tmp_path)
    time_index = directory / "00000000000000000000.timeindex"
    entries = list(struct.iter_unpack(">qi", time_index.read_bytes()))
    assert len(entries) >= 2
    lines, _ = dump([time_index], index_sanity_check=True)
    assert lines[1] == f"{time_index} passed sanity check."

    with open(time_index, "ab") as handle:  # the file as the active segment has it: preallocated with zeros
        handle.write(bytes(12 * 3))
    lines, _ = dump([time_index], index_sanity_check=True)
    assert lines[1] == (
        f"Corrupt time index found, time index file ({time_index.resolve()}) has non-zero size but the last "
        f"timestamp is 0 which is less than the first entry {entries[0][0]}"
    )

    time_index.write_bytes(b"".join(struct.pack(">qi", ts, rel) for ts, rel in entries[:-1]))
    with open(time_index, "ab") as handle:
        handle.write(struct.pack(">qi", entries[-1][0], -5))
    lines, _ = dump([time_index], index_sanity_check=True)
    assert lines[1] == (
        f"Corrupt time index found, time index file ({time_index.resolve()}) has non-zero size but the last "
        "offset is -5 which is less than the first offset 0"
    )

    time_index.write_bytes(b"".join(struct.pack(">qi", ts, rel) for ts, rel in entries) + b"\x00" * 5)
    lines, _ = dump([time_index], index_sanity_check=True)
    assert lines[1] == (
        f"Time index file {time_index.resolve()} is corrupt, found {12 * len(entries) + 5} bytes which is neither "
        "positive nor a multiple of 12."
    )


def test_control_batches_show_the_transaction_marker(tmp_path: Path) -> None:
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(
        build_control_batch(
            ControlRecordType.COMMIT,
            producer_id=7,
            producer_epoch=1,
            coordinator_epoch=3,
            timestamp_ms=1_700_000_000_000,
        )
    )
    lines, _ = dump([segment], print_data_log=True)
    assert "producerId: 7 producerEpoch: 1" in lines[2] and "isTransactional: true isControl: true" in lines[2]
    assert lines[3].endswith(" endTxnMarker: COMMIT coordinatorEpoch: 3")


def test_cli_entry_point(one_record_segment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump-log", "--files", str(one_record_segment), "--print-data-log"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:] == [WORKED_EXAMPLE_BATCH, WORKED_EXAMPLE_RECORD]


def test_a_file_that_is_not_a_segment_is_refused_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stray = tmp_path / "notes.log"
    stray.write_bytes(b"hello")
    assert main(["dump-log", "--files", str(stray)]) == 1
    assert "must start with its base offset" in capsys.readouterr().err


def test_a_live_brokers_active_segment_is_dumped_without_touching_it(tmp_path: Path) -> None:
    """The engine keeps the active segment's indexes preallocated (zeros after the entries) and a producer may be
    half-way through a batch: the dump reads what is there, reports the partial batch, and changes no file."""
    with tidelog.open(tmp_path, config={"log.index.interval.bytes": 200}, background=False) as log:
        log.create_topic("t", partitions=1)
        for i in range(30):
            log.produce("t", 0, [tidelog.Record(value=b"x" * 90, key=b"%d" % i, timestamp_ms=1_700_000_000_000 + i)])
        directory = tmp_path / "t-0"
        segment = directory / "00000000000000000000.log"
        batch = build_control_batch(ControlRecordType.COMMIT, producer_id=7, producer_epoch=1, coordinator_epoch=3)
        with open(segment, "ab") as handle:  # a batch being written: only part of it is there yet
            handle.write(batch[:40])
        files = [segment, segment.with_suffix(".index"), segment.with_suffix(".timeindex")]
        before = {f: f.read_bytes() for f in files}
        assert len(before[files[1]]) > 1000  # preallocated
        out, err = io.StringIO(), io.StringIO()
        assert dump_files([str(f) for f in files], DumpOptions(deep_iteration=True), out=out, err=err) == 0
        lines = out.getvalue().splitlines()
        assert sum(line.startswith("baseOffset: ") for line in lines) == 30
        assert "Found 40 invalid bytes at the end of 00000000000000000000.log" in lines
        offsets = [line for line in lines if line.startswith("offset: ")]
        assert offsets and all(not line.startswith("offset: 0 ") for line in offsets)  # the zero tail is not an entry
        assert err.getvalue() == ""
        assert {f: f.read_bytes() for f in files} == before
