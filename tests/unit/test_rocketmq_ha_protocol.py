"""The RocketMQ HA frames (storage/rocketmq/ha_protocol.py): their bytes, built here with struct, read back from
streams cut anywhere, and malformed ones refused before a body is taken."""

from __future__ import annotations

import random
import struct

import pytest

from tidelog.errors import HAProtocolError
from tidelog.storage.rocketmq.ha_protocol import (
    ReportReader,
    Transfer,
    TransferReader,
    encode_report,
    encode_transfer,
)

FILE_SIZE = 65536
BATCH = 32768


def test_frames_are_rocketmq_4_bytes() -> None:
    assert encode_report(0x0102030405060708) == bytes(range(1, 9))
    assert encode_transfer(65536, b"abc") == struct.pack(">qi", 65536, 3) + b"abc"
    assert encode_transfer(7) == struct.pack(">qi", 7, 0)  # a heartbeat: header only


def test_transfers_split_anywhere_come_out_whole() -> None:
    frames = [(0, b"x" * 100), (100, b""), (100, bytes(range(256)) * 40), (FILE_SIZE - 5, b"12345")]
    stream = b"".join(encode_transfer(offset, body) for offset, body in frames)
    rng = random.Random(16)
    for _ in range(50):
        reader = TransferReader(max_body=BATCH, file_size=FILE_SIZE)
        got: list[Transfer] = []
        position = 0
        while position < len(stream):
            step = rng.randint(1, 300)
            got += reader.feed(stream[position : position + step])
            position += step
        assert [(t.offset, t.body) for t in got] == frames
    assert got[1].is_heartbeat and not got[0].is_heartbeat


@pytest.mark.parametrize(
    ("offset", "size", "why"),
    [
        (-1, 10, "negative CommitLog offset"),
        (0, -1, "sizes go from 0 to"),
        (0, BATCH + 1, "sizes go from 0 to"),
        (FILE_SIZE - 10, 11, "crosses the end of a CommitLog file"),
        (3 * FILE_SIZE - 1, 2, "crosses the end"),
    ],
)
def test_malformed_transfer_headers_are_refused_before_the_body(offset: int, size: int, why: str) -> None:
    reader = TransferReader(max_body=BATCH, file_size=FILE_SIZE)
    assert reader.feed(encode_transfer(0, b"ok")) == [Transfer(0, b"ok")]
    with pytest.raises(HAProtocolError, match=why):
        reader.feed(struct.pack(">qi", offset, size))  # no body sent: the header alone is refused


def test_a_good_transfer_before_a_bad_header_in_one_read_is_not_returned() -> None:
    reader = TransferReader(max_body=BATCH, file_size=FILE_SIZE)
    with pytest.raises(HAProtocolError):
        reader.feed(encode_transfer(0, b"good") + struct.pack(">qi", 4, -7))


def test_the_largest_transfer_and_one_ending_at_the_file_end_are_taken() -> None:
    reader = TransferReader(max_body=BATCH, file_size=FILE_SIZE)
    body = b"z" * BATCH
    assert reader.feed(encode_transfer(FILE_SIZE - BATCH, body)) == [Transfer(FILE_SIZE - BATCH, body)]


def test_reports_are_read_in_whole_eights() -> None:
    reader = ReportReader()
    stream = encode_report(5) + encode_report(1 << 40) + encode_report(9)
    assert reader.feed(stream[:3]) == []
    assert reader.feed(stream[3:12]) == [5]
    assert reader.feed(stream[12:]) == [1 << 40, 9]


def test_a_negative_report_is_refused() -> None:
    with pytest.raises(HAProtocolError, match="negative"):
        ReportReader().feed(encode_report(-8))


def test_random_bytes_never_pass_as_a_bad_frame() -> None:
    """Seeded garbage: every header the reader returns a frame for obeys the rules; the rest is refused or waits."""
    rng = random.Random(1616)
    for _ in range(300):
        reader = TransferReader(max_body=BATCH, file_size=FILE_SIZE)
        data = rng.randbytes(rng.randint(1, 64))
        try:
            frames = reader.feed(data)
        except HAProtocolError:
            continue
        for frame in frames:
            assert frame.offset >= 0 and 0 <= len(frame.body) <= BATCH
            assert frame.offset % FILE_SIZE + len(frame.body) <= FILE_SIZE
