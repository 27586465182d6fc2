"""Random reads by offset: latency of locating one record among millions, against a raw pread of the same file.

The log is built by appending pre-built batches (default: 10 million 100-byte records, 100 per batch, so
about 1.1 GB, in 1 GiB segments). It was just written, so it is in the page cache. Then, for the same uniformly
random offsets, each operation is timed one call at a time:

  locate          engine.read(topic, 0, offset, max_bytes=1): segment bisect -> offset index (block directory,
                  one block, from the engine's index block cache after its first read) -> one pread at the start
                  of the batch the candidate entry names, of its header and, as the entry after it says the
                  batch ends there at the latest, the rest of it (segment.py's read-ahead); or a header walk.
                  Returns FileSlices, here carrying the batch's bytes
  locate + bytes  ... + FileSlices.read_bytes() (the bytes the slice carries, or an os.pread of them)
  + decode        ... + read_batch_info + decode_batch, then the record at `offset` (checked)
  raw pread       os.pread of one batch's size at a random batch-aligned position of a random segment file,
                  on an fd opened once: the floor for "locate + bytes"

The harness's long-lived objects are moved out of the GC's reach (gc.freeze) before timing; the garbage
collector still runs. Percentiles are in microseconds; ratios are against raw pread at the same percentile.
The targets (for locate + bytes, the read a fetch serves): p50 <= 3x raw pread, p99 <= 100 µs.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
from collections.abc import Callable

import numpy as np

import tidelog
from benchutil import (
    GiB,
    add_dir_argument,
    console,
    fmt_bytes,
    new_table,
    print_machine,
    ratio,
    scratch_dir,
)
from tidelog.codec.record_batch import Record, build_batch
from tidelog.codec.record_set import decode_batch, read_batch_info

TOPIC = "bench-read"
DISTINCT_BATCHES = 64
PERCENTILES = (50, 90, 99, 99.9)
TARGET_P99_US = 100.0
TARGET_P50_RATIO = 3.0
WARMUP = 2000


def build_log(engine: tidelog.StorageEngine, records: int, per_batch: int, value_bytes: int) -> int:
    rng = random.Random(7)
    now = int(time.time() * 1000)
    pool = [
        build_batch([Record(value=rng.randbytes(value_bytes), timestamp_ms=now + i) for _ in range(per_batch)])
        for i in range(DISTINCT_BATCHES)
    ]
    append = engine.append
    for i in range(records // per_batch):
        append(TOPIC, 0, pool[i % DISTINCT_BATCHES])
    return len(pool[0])


def time_each(op: Callable[[int], object], arguments: list[int]) -> np.ndarray:
    """Per-call latency in microseconds, one perf_counter_ns pair per call."""
    for argument in arguments[:WARMUP]:
        op(argument)
    clock = time.perf_counter_ns
    out = np.empty(len(arguments), dtype=np.int64)
    for i, argument in enumerate(arguments):
        start = clock()
        op(argument)
        out[i] = clock() - start
    return out / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000, help="records in the log (default: 10,000,000)")
    parser.add_argument("--record-bytes", type=int, default=100, help="value size of each record (default: 100)")
    parser.add_argument("--batch-records", type=int, default=100, help="records per batch (default: 100)")
    parser.add_argument(
        "--segment-bytes", type=int, default=GiB, help="log.segment.bytes (default: 1 GiB; smaller means more segments)"
    )
    parser.add_argument("--lookups", type=int, default=100_000, help="random offsets per operation (default: 100,000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random offsets (default: 1)")
    add_dir_argument(parser)
    args = parser.parse_args()

    per_record_estimate = args.record_bytes + 12  # record framing (varints, attributes) for small records
    needed = args.records * per_record_estimate + (args.records // args.batch_records) * 61
    console.print(
        f"[bold]random reads[/]: {args.records:,} records of {args.record_bytes} B, {args.batch_records} per batch, "
        f"segments of {fmt_bytes(args.segment_bytes)}, {args.lookups:,} random offsets"
    )
    with scratch_dir(args.dir, needed, "tidelog-bench-read-") as work:
        print_machine(work)
        engine = tidelog.open(work / "log", config={"log.segment.bytes": args.segment_bytes})
        fds: list[int] = []
        try:
            engine.create_topic(TOPIC, partitions=1)
            started = time.perf_counter()
            batch_bytes = build_log(engine, args.records, args.batch_records, args.record_bytes)
            built = time.perf_counter() - started
            end_offset = engine.log_end_offset(TOPIC, 0)
            segment_files = sorted((work / "log" / f"{TOPIC}-0").glob("*.log"))
            sizes = [p.stat().st_size for p in segment_files]
            console.print(
                f"built {end_offset:,} records, {fmt_bytes(sum(sizes))} in {len(segment_files)} segment(s) "
                f"of {batch_bytes} B batches in {built:.1f} s ({sum(sizes) / built / 1e6:.0f} MB/s); "
                "the files are in the page cache (just written)"
            )

            offsets = np.random.default_rng(args.seed).integers(0, end_offset, size=args.lookups).tolist()
            read = engine.read

            def locate(offset: int) -> object:
                return read(TOPIC, 0, offset, 1)

            def locate_bytes(offset: int) -> bytes:
                return read(TOPIC, 0, offset, 1).read_bytes()

            def locate_decode(offset: int) -> Record:
                data = read(TOPIC, 0, offset, 1).read_bytes()
                info = read_batch_info(data, 0)
                assert info is not None
                record = decode_batch(data, info)[offset - info.base_offset]
                assert record.offset == offset
                return record

            fds = [os.open(p, os.O_RDONLY) for p in segment_files]
            rng = np.random.default_rng(args.seed + 1)
            which = rng.choice(len(fds), size=args.lookups, p=np.array(sizes) / sum(sizes))
            slots = (rng.random(args.lookups) * (np.array(sizes)[which] // batch_bytes)).astype(np.int64)
            pread_targets = [(fds[w], int(s) * batch_bytes) for w, s in zip(which, slots, strict=True)]
            pread = os.pread

            def raw_pread(i: int) -> bytes:
                fd, position = pread_targets[i]
                return pread(fd, batch_bytes, position)

            indexes = list(range(args.lookups))
            gc.collect()
            gc.freeze()  # the harness's own long-lived objects (offset lists) are not the engine's GC cost
            results = {
                "raw pread (floor)": time_each(raw_pread, indexes),
                "locate (engine.read)": time_each(locate, offsets),
                "locate + bytes": time_each(locate_bytes, offsets),
                "locate + bytes + decode": time_each(locate_decode, offsets),
            }
        finally:
            for fd in fds:
                os.close(fd)
            engine.close()

    floor = np.percentile(results["raw pread (floor)"], PERCENTILES)
    table = new_table(
        f"random reads by offset over {end_offset:,} records, {args.lookups:,} lookups, latency in µs",
        "operation",
        *(f"p{p:g}" for p in PERCENTILES),
        "mean",
        *(f"p{p:g} vs pread" for p in PERCENTILES),
    )
    for name, latencies in results.items():
        points = np.percentile(latencies, PERCENTILES)
        table.add_row(
            name,
            *(f"{v:.1f}" for v in points),
            f"{latencies.mean():.1f}",
            *(ratio(v, f) for v, f in zip(points, floor, strict=True)),
        )
    console.print(table)
    p99 = float(np.percentile(results["locate + bytes"], 99))
    verdict = "[green]met[/]" if p99 <= TARGET_P99_US else "[red]missed[/]"
    console.print(f"target p99 <= {TARGET_P99_US:g} µs for locate + bytes: {verdict} (p99 = {p99:.1f} µs)")
    p50_ratio = float(np.percentile(results["locate + bytes"], 50)) / float(floor[0])
    verdict = "[green]met[/]" if p50_ratio <= TARGET_P50_RATIO else "[red]missed[/]"
    console.print(f"target p50 <= {TARGET_P50_RATIO:g}x raw pread for locate + bytes: {verdict} ({p50_ratio:.2f}x)")


if __name__ == "__main__":
    main()
