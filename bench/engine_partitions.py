"""Write throughput against the number of partitions, both storage engines, one run (the seeds' central claim:
RocketMQ's one CommitLog keeps its speed as topics multiply, Kafka's file-per-partition log does not).

For each flush policy, each engine and each partition count P (default 1, 10, 100, 1000, 5000; the Kafka engine also
20000, --kafka-partitions), on an emptied and
synced directory: open the engine, create one topic with P partitions and append one batch to each, flushed (not
timed: every partition's files exist and are open, the first CommitLog file is allocated), then append the same
bytes - batches of --batch-records records with 1 KiB values, pre-built - to partitions chosen round-robin, and
time until every append returned and one final engine.flush() finished (so every byte is on disk in every row).
A run writes --async-mib / --sync-mib, or 2 batches per partition when that is more. The whole sequence is
repeated --repeat times (so a change in the machine's load hits every configuration alike); medians are reported.

  async  both engines fsync in the background every 500 ms: Kafka engine log.flush.interval.ms=500 (its scheduler
         flushes each dirty partition), RocketMQ engine ASYNC_FLUSH with flushIntervalCommitLog=500; one writer.
  sync   an append returns once it is on disk: Kafka engine flush.messages=1 (each append fsyncs its partition's
         segment, as Kafka does), RocketMQ engine SYNC_FLUSH (group commit: one fdatasync covers every waiting
         writer); --writers threads append concurrently, each to its own share of the partitions.

References in the same run: `dd if=/dev/zero bs=<batch bytes>` to one file (page cache, then oflag=dsync for the
sync policy). Each figure is printed as MB/s (10^6 bytes/s), as a ratio to the same engine's 1-partition figure and
as a ratio to dd. `--plot` writes docs/engine-partitions.png. The targets: the RocketMQ engine loses at most 10 %
between 1 and 1000 partitions (async policy); the Kafka engine keeps at least 75 % (async policy) and runs at 20,000.
"""

from __future__ import annotations

import argparse
import errno
import multiprocessing
import os
import re
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tidelog
from benchutil import (
    MiB,
    add_dir_argument,
    console,
    empty_dir,
    fmt_bytes,
    new_table,
    percent,
    print_machine,
    run_quiet,
    scratch_dir,
)
from tidelog.codec.record_batch import Record, build_batch
from tidelog.errors import TidelogError

TOPIC = "bench-partitions"
ENGINES = ("kafka", "rocketmq")
POLICIES = ("async", "sync")
DD_SECONDS = re.compile(r"copied, ([0-9.eE+-]+) s")
TARGET_LOSS = 0.10
KAFKA_TARGET_KEPT = 0.75
MIN_APPENDS_PER_PARTITION = 2  # a run writes at least this many batches to every partition
PNG = Path(__file__).resolve().parent.parent / "docs" / "engine-partitions.png"

ENGINE_CONFIG: dict[tuple[str, str], dict[str, str]] = {
    ("kafka", "async"): {"log.flush.interval.ms": "500", "log.flush.scheduler.interval.ms": "500"},
    ("kafka", "sync"): {"log.flush.interval.messages": "1"},
    ("rocketmq", "async"): {
        "tidelog.rocketmq.flushDiskType": "ASYNC_FLUSH",
        "tidelog.rocketmq.flushIntervalCommitLog": "500",
    },
    ("rocketmq", "sync"): {"tidelog.rocketmq.flushDiskType": "SYNC_FLUSH"},
}


@dataclass(frozen=True)
class Result:
    policy: str
    writer: str  # "kafka", "rocketmq" or "dd"
    partitions: int
    seconds: float
    data_bytes: int
    open_files: int = 0
    error: str | None = None  # the run could not complete (e.g. too many open files)

    @property
    def mb_per_s(self) -> float:
        return self.data_bytes / self.seconds / 1e6 if self.error is None else 0.0

    def cell(self) -> str:
        return f"{self.mb_per_s:.1f}" if self.error is None else f"failed: {self.short_error}"

    @property
    def short_error(self) -> str:
        return (self.error or "").split(" ", 1)[0].rstrip(":")


def build_batches(count: int, records: int, value_bytes: int) -> list[bytes]:
    now = int(time.time() * 1000)

    def record(i: int, j: int) -> Record:
        return Record(value=os.urandom(value_bytes), key=f"k{i}-{j}".encode(), timestamp_ms=now)

    return [build_batch([record(i, j) for j in range(records)]) for i in range(count)]


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def raise_open_file_limit() -> int:
    """Many partitions mean many open files (Kafka: .log, .index, .timeindex each; RocketMQ: a ConsumeQueue file
    each): lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def open_file_count() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no descriptor left to list them with: all of them are open
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def time_dd(path: Path, block: int, count: int, *, sync: bool) -> float:
    argv = ["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={count}"]
    if sync:
        argv.append("oflag=dsync")
    match = DD_SECONDS.search(run_quiet(argv).stderr)
    if match is None:
        raise RuntimeError("cannot parse dd's report")
    return float(match.group(1))


def run_engine(
    directory: Path, engine_name: str, policy: str, partitions: int, batches: list[bytes], appends: int, writers: int
) -> Result:
    """One timed run; a run the engine cannot complete (e.g. EMFILE: it needs more files than the limit allows)
    comes back as a Result with `error` set, without a clean close (that would need files too: the process ends
    after the run and the OS closes them)."""
    config = {"num.partitions": "1", **ENGINE_CONFIG[(engine_name, policy)]}
    try:
        engine = tidelog.open(directory, engine=engine_name, config=config)
        engine.create_topic(TOPIC, partitions=partitions)
        for partition in range(partitions):  # not timed: every partition's files exist and are open
            engine.append(TOPIC, partition, batches[0])
        engine.flush()
        total = sum(len(batches[i % len(batches)]) for i in range(appends))
        threads = writers if policy == "sync" else 1
        errors: list[BaseException] = []

        def writer(index: int) -> Callable[[], None]:
            def run() -> None:
                try:
                    for n in range(index, appends, threads):
                        engine.append(TOPIC, n % partitions, batches[n % len(batches)])
                except BaseException as exc:  # reported after the join
                    errors.append(exc)

            return run

        workers = [threading.Thread(target=writer(i)) for i in range(threads)]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if errors:
            raise errors[0]
        engine.flush()
        seconds = time.perf_counter() - start
        files = open_file_count()
        engine.close()
    except (OSError, TidelogError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        if isinstance(cause, OSError) and cause.errno:
            reason = f"{errno.errorcode.get(cause.errno, cause.errno)} ({os.strerror(cause.errno).lower()})"
        else:
            reason = f"{type(exc).__name__}: {exc}"
        return Result(policy, engine_name, partitions, 0.0, 0, open_file_count(), reason)
    return Result(policy, engine_name, partitions, seconds, total, files)


def run_engine_in_child(*args: Any) -> Result:
    """run_engine in a fresh process: open files, mappings and threads of one run never reach the next, and a run
    that fails for want of file descriptors leaves nothing behind."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_engine, *args).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="1,10,100,1000,5000", help="comma-separated partition counts")
    parser.add_argument(
        "--kafka-partitions", default="20000", help="more partition counts, for the Kafka engine only (comma-separated)"
    )
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--async-mib", type=int, default=128, help="data per async run (default 128 MiB)")
    parser.add_argument("--sync-mib", type=int, default=16, help="data per sync run (default 16 MiB)")
    parser.add_argument("--batch-records", type=int, default=16, help="records per append (default 16)")
    parser.add_argument("--value-bytes", type=int, default=1024, help="record value size (default 1024)")
    parser.add_argument("--writers", type=int, default=4, help="writer threads under the sync policy (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions, interleaved; medians are reported")
    parser.add_argument("--plot", action="store_true", help=f"write {PNG.relative_to(PNG.parent.parent)}")
    add_dir_argument(parser)
    args = parser.parse_args()
    counts = [int(p) for p in args.partitions.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    kafka_only = [int(p) for p in args.kafka_partitions.split(",") if p and int(p) not in counts]
    counts_of = {engine: counts + (kafka_only if engine == "kafka" else []) for engine in engines}
    policies = [p for p in args.policies.split(",") if p]
    limit = raise_open_file_limit()
    batches = build_batches(64, args.batch_records, args.value_bytes)
    batch_bytes = len(batches[0])
    needed = 2 * 1024 * MiB + 2 * max(args.async_mib, args.sync_mib) * MiB  # a preallocated CommitLog file or two
    raw: list[Result] = []
    with scratch_dir(args.dir, needed, "tidelog-bench-partitions-") as scratch:
        print_machine(scratch)
        console.print(f"load average at the start: {load_average()} (1, 5, 15 min): other work on the machine")
        console.print(
            f"batches of {args.batch_records} x {args.value_bytes} B values = {fmt_bytes(batch_bytes)} per append; "
            f"async runs {args.async_mib} MiB, sync runs {args.sync_mib} MiB with {args.writers} writers; "
            f"open-file limit {limit}"
        )
        for repetition in range(1, args.repeat + 1):
            for policy in policies:
                data_mib = args.async_mib if policy == "async" else args.sync_mib
                appends = max(1, data_mib * MiB // batch_bytes)
                empty_dir(scratch)
                seconds = time_dd(scratch / "dd.bin", batch_bytes, appends, sync=policy == "sync")
                raw.append(Result(policy, "dd", 1, seconds, batch_bytes * appends))
                for engine_name in engines:
                    for count in counts_of[engine_name]:
                        empty_dir(scratch)
                        runs = max(appends, MIN_APPENDS_PER_PARTITION * count)
                        result = run_engine_in_child(scratch, engine_name, policy, count, batches, runs, args.writers)
                        raw.append(result)
                        label = f"  #{repetition} {policy:5} {engine_name:8} {count:5} partitions:"
                        if result.error is not None:
                            console.print(f"{label} failed ({result.error}) with {result.open_files} files open")
                            continue
                        console.print(
                            f"{label} {result.mb_per_s:8.1f} MB/s ({fmt_bytes(result.data_bytes)} in "
                            f"{result.seconds:.2f} s, {result.open_files} open files at the end)"
                        )
        console.print(f"load average at the end: {load_average()} (1, 5, 15 min)")
    results = medians(raw)
    report(results, counts + kafka_only, engines, policies)
    if args.plot:
        plot(results, counts, engines, policies)


def medians(raw: list[Result]) -> list[Result]:
    """One Result per (policy, writer, partitions): the median run by MB/s, or the first failure."""
    groups: dict[tuple[str, str, int], list[Result]] = {}
    for result in raw:
        groups.setdefault((result.policy, result.writer, result.partitions), []).append(result)
    chosen = []
    for runs in groups.values():
        failed = [r for r in runs if r.error is not None]
        chosen.append(failed[0] if failed else sorted(runs, key=lambda r: r.mb_per_s)[len(runs) // 2])
    return chosen


def report(results: list[Result], counts: list[int], engines: list[str], policies: list[str]) -> None:
    for policy in policies:
        dd = next(r for r in results if r.policy == policy and r.writer == "dd")
        dd_label = "dd oflag=dsync" if policy == "sync" else "dd (page cache)"
        table = new_table(
            f"{policy}: MB/s by partitions (vs the engine's 1-partition figure; vs {dd_label} {dd.mb_per_s:.0f} MB/s)",
            "partitions",
            *(f"{engine} MB/s" for engine in engines),
            *(f"{engine} vs 1" for engine in engines),
            *(f"{engine} vs dd" for engine in engines),
        )
        base = {e: next(r for r in results if (r.policy, r.writer) == (policy, e)) for e in engines}
        for count in counts:
            row = {e: find(results, policy, e, count) for e in engines}
            table.add_row(
                str(count),
                *(result_cell(row[e]) for e in engines),
                *(ratio_cell(row[e], base[e].mb_per_s) for e in engines),
                *(ratio_cell(row[e], dd.mb_per_s) for e in engines),
            )
        console.print(table)
    if "rocketmq" in engines and "async" in policies and 1 in counts and 1000 in counts:
        one = next(r for r in results if (r.policy, r.writer, r.partitions) == ("async", "rocketmq", 1))
        thousand = next(r for r in results if (r.policy, r.writer, r.partitions) == ("async", "rocketmq", 1000))
        kept = thousand.mb_per_s / one.mb_per_s
        verdict = "met" if thousand.error is None and 1 - kept <= TARGET_LOSS else "missed"
        console.print(
            f"target (the RocketMQ engine loses <= 10 % from 1 to 1000 partitions, async): {verdict}, "
            f"1000 partitions run at {kept:.0%} of the 1-partition figure"
        )
    kafka_one, kafka_thousand = find(results, "async", "kafka", 1), find(results, "async", "kafka", 1000)
    if kafka_one is not None and kafka_thousand is not None:
        kept = kafka_thousand.mb_per_s / kafka_one.mb_per_s
        verdict = "met" if kafka_thousand.error is None and kept >= KAFKA_TARGET_KEPT else "missed"
        console.print(
            f"target (the Kafka engine keeps >= 75 % of its 1-partition figure at 1000 partitions, async): {verdict}, "
            f"{kept:.0%}"
        )
    for count in (c for c in counts if c > 1000):  # the Kafka engine refused 5,000 partitions before file_handles.py
        for policy in policies:
            result = find(results, policy, "kafka", count)
            if result is not None:
                state = "ran" if result.error is None else f"failed ({result.error})"
                console.print(f"the Kafka engine at {count} partitions ({policy}): {state}")


def find(results: list[Result], policy: str, writer: str, partitions: int) -> Result | None:
    """The result of one configuration, None when it was not run (the Kafka engine's extra partition counts)."""
    return next((r for r in results if (r.policy, r.writer, r.partitions) == (policy, writer, partitions)), None)


def result_cell(result: Result | None) -> str:
    return "-" if result is None else result.cell()


def ratio_cell(result: Result | None, reference: float) -> str:
    return "-" if result is None or result.error else percent(result.mb_per_s, reference)


def plot(results: list[Result], counts: list[int], engines: list[str], policies: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(policies), figsize=(6 * len(policies), 4.5), squeeze=False)
    for axis, policy in zip(axes[0], policies, strict=True):
        dd = next(r for r in results if r.policy == policy and r.writer == "dd")
        for engine in engines:
            runs = [
                next(r for r in results if (r.policy, r.writer, r.partitions) == (policy, engine, c)) for c in counts
            ]
            done = [r for r in runs if r.error is None]
            line = axis.plot(
                [r.partitions for r in done], [r.mb_per_s for r in done], marker="o", label=f"{engine} engine"
            )
            for failed in (r for r in runs if r.error is not None):
                axis.plot([failed.partitions], [0], marker="x", markersize=10, color=line[0].get_color())
                axis.annotate(failed.short_error, (failed.partitions, 0), textcoords="offset points", xytext=(-60, 8))
        axis.axhline(dd.mb_per_s, color="grey", linestyle="--", label="dd oflag=dsync" if policy == "sync" else "dd")
        axis.set_xscale("log")
        axis.set_xlabel("partitions (log scale)")
        axis.set_ylabel("MB/s")
        axis.set_title(f"{policy} flush: 1 KiB records, write + final flush")
        axis.set_ylim(bottom=0)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(PNG, dpi=110)
    console.print(f"wrote {PNG}")


if __name__ == "__main__":
    main()
