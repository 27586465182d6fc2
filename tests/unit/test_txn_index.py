"""`.txnindex` (storage/kafka/txn_index.py): Kafka's AbortedTxn entries byte for byte, the search a read_committed
fetch makes, and the file's life with its segment (created at the first entry, cut, emptied)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tidelog.errors import CorruptIndexError
from tidelog.storage.common.aborted_txn import AbortedTxn
from tidelog.storage.kafka.txn_index import TransactionIndex


def test_an_entry_is_34_bytes_version_producer_first_last_lso(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "00000000000000000000.txnindex")
    index.append(AbortedTxn(producer_id=7, first_offset=3, last_offset=10, last_stable_offset=11))
    index.append(AbortedTxn(producer_id=1 << 40, first_offset=5, last_offset=20, last_stable_offset=12))
    index.flush()
    expected = bytes.fromhex(
        "0000" "0000000000000007" "0000000000000003" "000000000000000a" "000000000000000b"
        "0000" "0000010000000000" "0000000000000005" "0000000000000014" "000000000000000c"
    )  # fmt: skip
    assert index.path.read_bytes() == expected
    index.close()
    reopened = TransactionIndex(index.path)
    assert reopened.entries == [AbortedTxn(7, 3, 10, 11), AbortedTxn(1 << 40, 5, 20, 12)]
    reopened.sanity_check()


def test_the_file_exists_only_once_a_transaction_was_aborted(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "00000000000000000000.txnindex")
    index.truncate_to(0)
    index.reset()
    index.rename(tmp_path / "00000000000000000000.txnindex.deleted")
    assert list(tmp_path.iterdir()) == []
    index.append(AbortedTxn(1, 0, 1, 2))
    assert [p.name for p in tmp_path.iterdir()] == ["00000000000000000000.txnindex.deleted"]
    index.delete()
    assert list(tmp_path.iterdir()) == []


def test_markers_must_increase(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "0.txnindex")
    index.append(AbortedTxn(1, 0, 5, 6))
    with pytest.raises(CorruptIndexError):
        index.append(AbortedTxn(2, 1, 5, 6))


def test_collect_and_when_the_search_is_complete(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "0.txnindex")
    for entry in (AbortedTxn(1, 0, 4, 2), AbortedTxn(2, 2, 8, 6), AbortedTxn(3, 6, 12, 13)):
        index.append(entry)
    # markers before the fetch offset are left out; so are transactions starting at or after the upper bound
    found = index.collect(fetch_offset=5, upper_bound_offset=7)
    assert found.aborted == [AbortedTxn(2, 2, 8, 6), AbortedTxn(3, 6, 12, 13)] and found.complete
    assert index.collect(0, 100).complete is False  # no entry's last stable offset reaches 100: go on searching
    assert index.collect(0, 6).aborted == [AbortedTxn(1, 0, 4, 2), AbortedTxn(2, 2, 8, 6)]


def test_truncate_drops_the_markers_at_and_after_the_offset(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "0.txnindex")
    for entry in (AbortedTxn(1, 0, 4, 5), AbortedTxn(2, 2, 8, 9)):
        index.append(entry)
    index.truncate_to(8)
    assert index.entries == [AbortedTxn(1, 0, 4, 5)] and index.path.stat().st_size == 34
    index.reset()
    assert index.entries == [] and index.path.stat().st_size == 0


def test_a_torn_tail_fails_the_sanity_check_and_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "0.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 0, 1, 0, 4, 5) + b"\x00" * 10)
    index = TransactionIndex(path)
    assert index.entries == [AbortedTxn(1, 0, 4, 5)]
    with pytest.raises(CorruptIndexError, match="partial entry"):
        index.sanity_check()
    index.truncate_to(100)
    assert path.stat().st_size == 34
    index.sanity_check()
