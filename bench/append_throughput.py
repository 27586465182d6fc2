"""Append throughput: pre-built 1 MiB record batches through `engine.append`, against `dd` on the same filesystem.

Each repetition makes four runs of the same size, in this order, each on an emptied and synced directory:

  dd                  dd if=/dev/zero of=<dir>/dd.bin bs=1M count=N            (page cache)
  python pwrite       a plain os.pwrite loop of the same batches into one file  (page cache; the Python floor)
  tidelog append      engine.append(topic, 0, batch) per batch, default flush policy (no fsync per append)
  dd fdatasync        dd ... conv=fdatasync                                     (durable)
  tidelog + flush     the same tidelog run, timed until one engine.flush() returns (durable)

tidelog cycles through 16 different pre-built batches (--distinct-batches), dd repeats one buffer of zeros.
One untimed dd of the same size comes first: on a VM that hands freed memory back to its host, a write into memory
freed a second or more before runs at a fraction of the speed (benchutil.returns_freed_memory_to_host), and every
timed run starts right after the run before it freed its pages.
Figures are medians over the repetitions, as MB/s (10^6 bytes, as dd prints them) and as a ratio to dd.
The issue's target: tidelog append >= 80 % of dd.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time
from pathlib import Path

import tidelog
from benchutil import (
    MiB,
    add_dir_argument,
    console,
    empty_dir,
    fmt_bytes,
    median,
    new_table,
    percent,
    print_machine,
    run_quiet,
    scratch_dir,
)
from tidelog.codec.record_batch import Record, build_batch

TOPIC = "bench-append"
DISTINCT_BATCHES = 16
TARGET_FRACTION = 0.80
DD_SECONDS = re.compile(r"copied, ([0-9.eE+-]+) s")


def build_batch_of_size(size: int, value_size: int, seed: int) -> bytes:
    """A v2 batch of exactly `size` bytes: records with `value_size`-byte random values, the last one padded."""
    rng = random.Random(seed)
    probe = len(build_batch([Record(value=b"x" * value_size, timestamp_ms=0)]))
    count = max(1, size // probe)
    values = [rng.randbytes(value_size) for _ in range(count)]
    now = int(time.time() * 1000)
    for _ in range(8):  # varint widths may shift by a byte or two: converge in a few steps
        batch = build_batch([Record(value=v, timestamp_ms=now) for v in values])
        missing = size - len(batch)
        if missing == 0:
            return batch
        values[-1] = rng.randbytes(max(0, len(values[-1]) + missing))
    raise RuntimeError(f"could not build a batch of exactly {size} bytes")


def time_dd(path: Path, count: int, *, durable: bool) -> float:
    argv = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}"]
    if durable:
        argv.append("conv=fdatasync")
    result = run_quiet(argv)
    match = DD_SECONDS.search(result.stderr)
    if match is None:
        raise RuntimeError(f"cannot parse dd's report: {result.stderr!r}")
    return float(match.group(1))


def time_python_pwrite(path: Path, batches: list[bytes], count: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        position = 0
        start = time.perf_counter()
        for i in range(count):
            batch = batches[i % len(batches)]
            position += os.pwrite(fd, batch, position)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def time_tidelog(log_dir: Path, batches: list[bytes], count: int, segment_bytes: int | None) -> tuple[float, float]:
    """(seconds for the appends, seconds for the appends plus one engine.flush())."""
    config = {} if segment_bytes is None else {"log.segment.bytes": segment_bytes}
    engine = tidelog.open(log_dir, config=config)
    try:
        engine.create_topic(TOPIC, partitions=1)
        append = engine.append
        start = time.perf_counter()
        for i in range(count):
            append(TOPIC, 0, batches[i % len(batches)])
        appended = time.perf_counter()
        engine.flush()
        flushed = time.perf_counter()
    finally:
        engine.close()
    return appended - start, flushed - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-mib", type=int, default=1024, help="MiB written per run (default: 1024)")
    parser.add_argument("--repeat", type=int, default=7, help="repetitions; medians are reported (default: 7)")
    parser.add_argument(
        "--distinct-batches",
        type=int,
        default=DISTINCT_BATCHES,
        help=f"different batches to cycle through, so the CRC check reads memory (default: {DISTINCT_BATCHES})",
    )
    parser.add_argument(
        "--value-bytes", type=int, default=1000, help="value size of the records inside each batch (default: 1000)"
    )
    parser.add_argument(
        "--segment-bytes", type=int, default=None, help="log.segment.bytes (default: the engine's, 1 GiB)"
    )
    add_dir_argument(parser)
    args = parser.parse_args()

    count = args.total_mib
    total = count * MiB
    console.print(
        f"[bold]append throughput[/]: {count} x 1 MiB batches ({fmt_bytes(total)}) per run, {args.repeat} runs"
    )
    batches = [build_batch_of_size(MiB, args.value_bytes, seed) for seed in range(args.distinct_batches)]

    with scratch_dir(args.dir, total + 32 * MiB, "tidelog-bench-append-") as work:
        print_machine(work)
        results: dict[str, list[float]] = {k: [] for k in ("dd", "pwrite", "tidelog", "dd_sync", "tidelog_sync")}
        time_dd(work / "warm-up.bin", count, durable=False)  # not counted: see the module's docstring
        for run in range(1, args.repeat + 1):
            empty_dir(work)
            results["dd"].append(time_dd(work / "dd.bin", count, durable=False))
            empty_dir(work)
            results["pwrite"].append(time_python_pwrite(work / "pwrite.bin", batches, count))
            empty_dir(work)
            appended, flushed = time_tidelog(work / "log", batches, count, args.segment_bytes)
            results["tidelog"].append(appended)
            results["tidelog_sync"].append(flushed)
            empty_dir(work)
            results["dd_sync"].append(time_dd(work / "dd.bin", count, durable=True))
            mbps = {k: total / v[-1] / 1e6 for k, v in results.items()}
            console.print(
                f"  run {run}: dd {mbps['dd']:.0f}, pwrite {mbps['pwrite']:.0f}, tidelog {mbps['tidelog']:.0f}, "
                f"dd fdatasync {mbps['dd_sync']:.0f}, tidelog+flush {mbps['tidelog_sync']:.0f} MB/s"
            )
        empty_dir(work)

    def rate(key: str) -> float:
        return total / median(results[key]) / 1e6

    def spread(key: str) -> str:
        rates = sorted(total / s / 1e6 for s in results[key])
        return f"{rates[0]:.0f}-{rates[-1]:.0f}"

    table = new_table(
        f"append throughput, {fmt_bytes(total)} per run, median of {args.repeat}",
        "writer",
        "MB/s",
        "range MB/s",
        "vs dd",
    )
    for key, label, reference in (
        ("dd", "dd bs=1M (page cache)", "dd"),
        ("pwrite", "python os.pwrite loop (page cache)", "dd"),
        ("tidelog", "tidelog engine.append (page cache)", "dd"),
        ("dd_sync", "dd bs=1M conv=fdatasync (durable)", "dd_sync"),
        ("tidelog_sync", "tidelog append + engine.flush() (durable)", "dd_sync"),
    ):
        table.add_row(label, f"{rate(key):.0f}", spread(key), percent(rate(key), rate(reference)))
    console.print(table)

    page_cache = rate("tidelog") / rate("dd")
    durable = rate("tidelog_sync") / rate("dd_sync")
    verdict = "[green]met[/]" if page_cache >= TARGET_FRACTION else "[red]missed[/]"
    console.print(
        f"target tidelog append >= {TARGET_FRACTION:.0%} of dd: {verdict} ({page_cache:.0%}); "
        f"durable: {durable:.0%} of dd conv=fdatasync"
    )


if __name__ == "__main__":
    main()
