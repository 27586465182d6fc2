"""Recovery scan: how fast `tidelog.open()` rescans a log after an unclean shutdown, against reading the same files.

For each batch size (default: ~16 KiB and 1 MiB) a log of about 2 GiB is written in 512 MiB segments and closed
cleanly. Each repetition then simulates an unclean shutdown the way a crash leaves the directory: the
`.kafka_cleanshutdown` marker is deleted and `recovery-point-offset-checkpoint` is rewritten to offset 0, so every
segment is recovered (CRC check of every batch, offset checks, offset- and time-index rebuild). Timed:

  tidelog.open()        opening the log dir until the engine is ready (all segments recovered)
  cat > /dev/null       `cat <all .log files> > /dev/null`: reading the bytes, no work
  python read + crc32c  os.pread in 8 MiB chunks + crc32c over every byte: the floor for the same work in Python

Before every timed step all segment files are read once, so all three run from the page cache (the data set
must fit in RAM; it is checked). GB/s counts the bytes of the .log files (10^9). Figures are medians.
The issue's target: >= 1 GB/s.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import time
from pathlib import Path

from crc32c import crc32c

import tidelog
from benchutil import (
    MiB,
    add_dir_argument,
    console,
    empty_dir,
    fmt_bytes,
    median,
    new_table,
    print_machine,
    ratio,
    run_quiet,
    scratch_dir,
)
from tidelog.codec.record_batch import Record, build_batch

TOPIC = "bench-recovery"
DISTINCT_BATCHES = 16
READ_CHUNK = 8 * MiB
TARGET_GBPS = 1.0


class RecoveryWitness(logging.Handler):
    """Counts the engine's "no clean-shutdown marker" messages: proof that open() really recovered."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.unclean_opens = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "no clean-shutdown marker" in record.getMessage():
            self.unclean_opens += 1


def build_batches(batch_bytes: int, value_bytes: int) -> list[bytes]:
    """Batches of about `batch_bytes` (never above it) made of `value_bytes`-byte random records."""
    rng = random.Random(batch_bytes)
    now = int(time.time() * 1000)
    values = [rng.randbytes(value_bytes) for _ in range(64)]

    def batch(count: int, salt: int) -> bytes:
        return build_batch([Record(value=values[(i + salt) % len(values)], timestamp_ms=now) for i in range(count)])

    count = max(1, batch_bytes // (value_bytes + 8))
    while count > 1 and len(batch(count, 0)) > batch_bytes:
        count -= 1
    return [batch(count, salt) for salt in range(DISTINCT_BATCHES)]


def write_log(log_dir: Path, config: dict[str, int], batches: list[bytes], total_bytes: int) -> int:
    """Append until `total_bytes`, close cleanly; returns the log end offset."""
    with tidelog.open(log_dir, config=config, background=False) as engine:
        engine.create_topic(TOPIC, partitions=1)
        written = 0
        i = 0
        while written < total_bytes:
            batch = batches[i % len(batches)]
            engine.append(TOPIC, 0, batch)
            written += len(batch)
            i += 1
        return engine.log_end_offset(TOPIC, 0)


def make_unclean(log_dir: Path) -> None:
    """What a crash leaves: no clean-shutdown marker, and a recovery point below every segment."""
    (log_dir / ".kafka_cleanshutdown").unlink()
    (log_dir / "recovery-point-offset-checkpoint").write_text(f"0\n1\n{TOPIC} 0 0\n", encoding="utf-8")


def warm(files: list[Path]) -> None:
    """Read every file once so the timed step finds it in the page cache."""
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while handle.read(READ_CHUNK):
                pass


def time_python_read_crc(files: list[Path]) -> float:
    start = time.perf_counter()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            position, crc = 0, 0
            while chunk := os.pread(fd, READ_CHUNK, position):
                crc = crc32c(chunk, crc)
                position += len(chunk)
        finally:
            os.close(fd)
    return time.perf_counter() - start


def time_cat(files: list[Path]) -> float:
    start = time.perf_counter()
    run_quiet(["sh", "-c", 'cat "$@" > /dev/null', "cat", *map(str, files)])
    return time.perf_counter() - start


def time_recovery(log_dir: Path, config: dict[str, int], expected_end: int) -> float:
    start = time.perf_counter()
    engine = tidelog.open(log_dir, config=config)
    elapsed = time.perf_counter() - start
    try:
        end = engine.log_end_offset(TOPIC, 0)
        if end != expected_end:
            raise SystemExit(f"recovery lost data: log end offset {end}, expected {expected_end}")
    finally:
        engine.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-mib", type=int, default=2048, help="MiB of log per batch size (default: 2048)")
    parser.add_argument("--segment-mib", type=int, default=512, help="log.segment.bytes in MiB (default: 512)")
    parser.add_argument(
        "--batch-kib", default="16,1024", help="comma-separated batch sizes in KiB, one log each (default: 16,1024)"
    )
    parser.add_argument(
        "--value-bytes", type=int, default=1000, help="value size of the records in the batches (default: 1000)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="repetitions per measurement (default: 5)")
    add_dir_argument(parser)
    args = parser.parse_args()

    total = args.total_mib * MiB
    config = {"log.segment.bytes": args.segment_mib * MiB}
    batch_sizes = [int(x) * 1024 for x in args.batch_kib.split(",")]
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    if total > available * 0.8:
        console.print(
            f"[bold red]{fmt_bytes(total)} of log will not stay in the page cache[/] "
            f"({fmt_bytes(available)} of RAM is free); pass a smaller --total-mib."
        )
        raise SystemExit(2)
    console.print(
        f"[bold]recovery scan[/]: {fmt_bytes(total)} per log in {args.segment_mib} MiB segments, "
        f"batches of {', '.join(fmt_bytes(b) for b in batch_sizes)}, {args.repeat} repetitions"
    )
    witness = RecoveryWitness()
    logging.getLogger("tidelog.storage").addHandler(witness)
    logging.getLogger("tidelog.storage").setLevel(logging.INFO)
    logging.getLogger("tidelog.storage").propagate = False  # the per-segment messages are not the benchmark's

    table = new_table(
        f"recovery of {fmt_bytes(total)} from the page cache, median of {args.repeat}",
        "batch size",
        "batches",
        "segments",
        "tidelog.open() GB/s",
        "python read+crc32c GB/s",
        "cat GB/s",
        "open vs read+crc",
        "open vs cat",
    )
    verdicts = []
    with scratch_dir(args.dir, total + 64 * MiB, "tidelog-bench-recovery-") as work:
        print_machine(work)
        for batch_bytes in batch_sizes:
            empty_dir(work)
            log_dir = work / "log"
            batches = build_batches(batch_bytes, args.value_bytes)
            started = time.perf_counter()
            end_offset = write_log(log_dir, config, batches, total)
            files = sorted((log_dir / f"{TOPIC}-0").glob("*.log"))
            size = sum(p.stat().st_size for p in files)
            console.print(
                f"  {fmt_bytes(len(batches[0]))} batches: wrote {fmt_bytes(size)} in {len(files)} segments, "
                f"{end_offset:,} records, in {time.perf_counter() - started:.1f} s (including the closing fsync)"
            )
            timings: dict[str, list[float]] = {"open": [], "crc": [], "cat": []}
            for _ in range(args.repeat):
                make_unclean(log_dir)
                warm(files)
                before = witness.unclean_opens
                timings["open"].append(time_recovery(log_dir, config, end_offset))
                if witness.unclean_opens != before + 1:
                    raise SystemExit("tidelog.open() did not see an unclean shutdown: the measurement is void")
                warm(files)
                timings["crc"].append(time_python_read_crc(files))
                warm(files)
                timings["cat"].append(time_cat(files))
            gbps = {k: size / median(v) / 1e9 for k, v in timings.items()}
            console.print(
                "    runs (s): " + "; ".join(f"{k} " + ", ".join(f"{t:.2f}" for t in v) for k, v in timings.items())
            )
            table.add_row(
                fmt_bytes(len(batches[0])),
                f"{size // len(batches[0]):,}",
                str(len(files)),
                f"{gbps['open']:.2f}",
                f"{gbps['crc']:.2f}",
                f"{gbps['cat']:.2f}",
                ratio(gbps["open"], gbps["crc"]),
                ratio(gbps["open"], gbps["cat"]),
            )
            verdicts.append((fmt_bytes(len(batches[0])), gbps["open"]))
        empty_dir(work)
    console.print(table)
    for label, value in verdicts:
        verdict = "[green]met[/]" if value >= TARGET_GBPS else "[red]missed[/]"
        console.print(f"target >= {TARGET_GBPS:g} GB/s with {label} batches: {verdict} ({value:.2f} GB/s)")


if __name__ == "__main__":
    main()
