"""Log compaction: how fast the log cleaner (cleanup.policy=compact) cleans a log, against copying the same bytes.

A compacted topic gets `--records` records (default 1,000,000) over `--keys` keys (default 10,000, in random
order), `--value-bytes` each, in batches of `--batch-records`, in 16 MiB segments, then rolled (so all of it is
cleanable) and closed cleanly; it is kept as the pristine input. Each repetition copies it to a scratch dir (not
timed), opens it and times one `engine.clean_logs()`: the offset map over the whole dirty range, every segment
recopied into `.cleaned` files with rebuilt indexes, fsynced and swapped in. The script then checks that every key
kept exactly its latest value below the first dirty offset. Reference in the same run: copying the same `.log`
files with Python (os.pread / os.write in 4 MiB chunks, then fsync) - the I/O a cleaner cannot avoid, without
looking at a single record. MB/s = 10^6 bytes/s of `.log` read. All from the page cache (the input is read once
before each timed step). Figures are medians.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import time
from pathlib import Path

import tidelog
from benchutil import MiB, add_dir_argument, console, fmt_bytes, median, new_table, print_machine, ratio, scratch_dir
from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import assemble_batch
from tidelog.codec.varint import encode_varint

TOPIC = "bench-compaction"
SEGMENT_BYTES = 16 * MiB
COPY_CHUNK = 4 * MiB
CONFIG = {"log.segment.bytes": SEGMENT_BYTES, "log.segment.delete.delay.ms": 0, "log.cleaner.enable": False}


def encode_record(offset_delta: int, key: bytes, value: bytes) -> bytes:
    """One v2 record with timestampDelta 0 and no headers (what build_batch writes, without its generality)."""
    body = b"".join(
        (
            b"\x00\x00",
            encode_varint(offset_delta),
            encode_varint(len(key)),
            key,
            encode_varint(len(value)),
            value,
            b"\x00",
        )
    )
    return encode_varint(len(body)) + body


def write_log(log_dir: Path, records: int, keys: int, value_bytes: int, batch_records: int, codec: Compression) -> None:
    rng = random.Random(7)
    filler = rng.randbytes(value_bytes)
    now = int(time.time() * 1000)
    with tidelog.open(log_dir, config=CONFIG, background=False) as engine:
        engine.create_topic(TOPIC, 1, configs={"cleanup.policy": "compact"})
        for start in range(0, records, batch_records):
            count = min(batch_records, records - start)
            body = b"".join(
                encode_record(i, b"key-%06d" % rng.randrange(keys), b"%09d" % (start + i) + filler[9:])
                for i in range(count)
            )
            batch = assemble_batch(
                body,
                records_count=count,
                attributes=int(codec),
                base_offset=0,
                last_offset_delta=count - 1,
                base_timestamp=now,
                max_timestamp=now,
                producer_id=-1,
                producer_epoch=-1,
                base_sequence=-1,
                partition_leader_epoch=-1,
            )
            engine.append(TOPIC, 0, batch)
        engine.partition_log(TOPIC, 0).roll()


def log_files(log_dir: Path) -> list[Path]:
    return sorted((log_dir / f"{TOPIC}-0").glob("*.log"))


def warm(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while handle.read(COPY_CHUNK):
                pass


def time_copy(files: list[Path], target: Path) -> float:
    target.mkdir()
    start = time.perf_counter()
    for path in files:
        source = os.open(path, os.O_RDONLY)
        sink = os.open(target / path.name, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            position = 0
            while chunk := os.pread(source, COPY_CHUNK, position):
                os.write(sink, chunk)
                position += len(chunk)
            os.fsync(sink)
        finally:
            os.close(source)
            os.close(sink)
    elapsed = time.perf_counter() - start
    shutil.rmtree(target)
    return elapsed


def time_clean(pristine: Path, work: Path, keys: int) -> tuple[float, int, int, int, int]:
    """(seconds, bytes read, bytes written, records read, records kept) of one cleaning of a fresh copy;
    checks the result."""
    shutil.copytree(pristine, work)
    warm(log_files(work))
    engine = tidelog.open(work, config=CONFIG, background=False)
    try:
        start = time.perf_counter()
        stats = engine.clean_logs()
        elapsed = time.perf_counter() - start
        if len(stats) != 1:
            raise SystemExit(f"expected one cleaned log, got {len(stats)}")
        latest: dict[bytes | None, bytes | None] = {}
        seen_below: set[bytes | None] = set()
        for record in engine.consume(TOPIC, 0):
            if record.offset < stats[0].end_offset:
                if record.key in seen_below:
                    raise SystemExit(f"key {record.key!r} survived twice below the first dirty offset")
                seen_below.add(record.key)
            latest[record.key] = record.value
        if len(latest) != keys:
            raise SystemExit(f"{len(latest)} keys after cleaning, expected {keys}")
        result = (elapsed, stats[0].bytes_read, stats[0].bytes_written, stats[0].records_read, stats[0].records_kept)
    finally:
        engine.close()
        shutil.rmtree(work)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="records produced (default: 1000000)")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys (default: 10000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size (default: 100)")
    parser.add_argument("--batch-records", type=int, default=200, help="records per batch (default: 200)")
    parser.add_argument(
        "--codecs", default="none,zstd", help="comma-separated codecs, one log each (default: none,zstd)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per measurement (default: 3)")
    add_dir_argument(parser)
    args = parser.parse_args()
    logging.getLogger("tidelog.storage").setLevel(logging.WARNING)

    console.print(
        f"[bold]log compaction[/]: {args.records:,} records over {args.keys:,} keys, {args.value_bytes}-byte values, "
        f"{args.batch_records} records per batch, {args.repeat} repetitions"
    )
    table = new_table(
        f"one cleaner pass over the whole log, median of {args.repeat}",
        "codec",
        "log size",
        "after",
        "records kept",
        "clean MB/s",
        "clean records/s",
        "copy+fsync MB/s",
        "clean vs copy",
    )
    needed = 4 * args.records * (args.value_bytes + 30) + 256 * MiB
    with scratch_dir(args.dir, needed, "tidelog-bench-compaction-") as scratch:
        print_machine(scratch)
        for codec_name in args.codecs.split(","):
            codec = Compression.from_name(codec_name)
            pristine = scratch / f"pristine-{codec_name}"
            started = time.perf_counter()
            write_log(pristine, args.records, args.keys, args.value_bytes, args.batch_records, codec)
            files = log_files(pristine)
            size = sum(p.stat().st_size for p in files)
            console.print(
                f"  {codec_name}: wrote {fmt_bytes(size)} in {len(files)} segments "
                f"in {time.perf_counter() - started:.1f} s"
            )
            cleans, rates, copies = [], [], []
            for _ in range(args.repeat):
                elapsed, read, written, records, kept = time_clean(pristine, scratch / "work", args.keys)
                cleans.append(read / elapsed / 1e6)
                rates.append(records / elapsed)
                warm(files)
                copies.append(size / time_copy(files, scratch / "copy") / 1e6)
            console.print(
                f"    runs (MB/s): clean {', '.join(f'{x:.0f}' for x in cleans)}; "
                f"copy {', '.join(f'{x:.0f}' for x in copies)}"
            )
            clean_mbps, copy_mbps = median(cleans), median(copies)
            table.add_row(
                codec_name,
                fmt_bytes(size),
                fmt_bytes(written),
                f"{kept:,}",
                f"{clean_mbps:.0f}",
                f"{median(rates):,.0f}",
                f"{copy_mbps:.0f}",
                ratio(clean_mbps, copy_mbps),
            )
            shutil.rmtree(pristine)
    console.print(table)


if __name__ == "__main__":
    main()
