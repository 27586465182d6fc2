"""`tidelog demo --storage`: the storage engine end to end, in a few seconds.

Writes page-visit events to topic `page_visits` (5 partitions, keys placed by Kafka's murmur2
partitioner) with small segments so several roll, then shows the directory Kafka would recognise,
a `dump-log` excerpt, a lookup by offset and by timestamp, and a recovery after a simulated crash.

`tidelog demo` (what `make demo` runs) is the Spark pipeline instead: see tidelog/spark/demo.py.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.tree import Tree

import tidelog
from tidelog.partitioner import partition_for_key
from tidelog.storage.kafka.checkpoints import CLEAN_SHUTDOWN_FILE
from tidelog.storage.kafka.engine import KafkaEngine
from tidelog.storage.kafka.partition_log import PartitionLog
from tidelog.tools.dump_log import DumpOptions, dump_files

TOPIC = "page_visits"
PARTITIONS = 5
EVENTS = 20_000
START_MS = 1_700_000_000_000
PAGES = ["/", "/products", "/products/42", "/cart", "/checkout", "/blog/kafka-on-disk", "/about", "/search"]


def run(data_dir: Path = Path("tidelog-demo-data")) -> None:
    """The storage demo (`tidelog demo --storage`)."""
    console = Console()
    shutil.rmtree(data_dir, ignore_errors=True)
    config = {"log.segment.bytes": 64 * 1024, "log.index.interval.bytes": 4096}
    console.rule("[bold]tidelog storage demo")
    console.print(f"Writing {EVENTS:,} page visits to [bold]{TOPIC}[/] ({PARTITIONS} partitions) under {data_dir}/")

    rng = random.Random(7)
    pending: dict[int, list[tidelog.Record]] = defaultdict(list)
    with tidelog.open(data_dir, config=config) as log:
        log.create_topic(TOPIC, partitions=PARTITIONS)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("producing", total=EVENTS)
            for i in range(EVENTS):
                user = f"user-{rng.randrange(500)}"
                timestamp = START_MS + i * 50
                value = json.dumps({"user": user, "page": rng.choice(PAGES), "ts": timestamp}).encode()
                partition = partition_for_key(user.encode(), PARTITIONS)
                pending[partition].append(
                    tidelog.Record(
                        value=value, key=user.encode(), timestamp_ms=timestamp, headers=[("source", b"demo")]
                    )
                )
                if len(pending[partition]) == 100:
                    log.produce(TOPIC, partition, pending.pop(partition), compression="lz4" if i % 2 else "none")
                progress.advance(task)
            for partition, records in pending.items():
                log.produce(TOPIC, partition, records)

        _show_partitions(console, log)
        _show_tree(console, data_dir)
        _show_dump(console, data_dir)
        _show_lookups(console, log)

    _show_crash_recovery(console, data_dir, config)
    console.rule("[bold green]done")
    console.print(
        f"The data is in {data_dir}/ - try: tidelog dump-log --files {data_dir}/{TOPIC}-0/"
        f"00000000000000000000.log --print-data-log"
    )


def _partition_log(log: tidelog.StorageEngine, partition: int) -> PartitionLog:
    assert isinstance(log, KafkaEngine)
    return log.partition_log(TOPIC, partition)


def _show_partitions(console: Console, log: tidelog.StorageEngine) -> None:
    table = Table(title=f"{TOPIC}: one directory per partition")
    for column in ("partition", "segments", "log start", "log end", "bytes"):
        table.add_column(column, justify="right")
    for partition in range(PARTITIONS):
        plog = _partition_log(log, partition)
        table.add_row(
            str(partition),
            str(len(plog.segments)),
            str(plog.log_start_offset),
            str(plog.log_end_offset),
            f"{plog.size_in_bytes:,}",
        )
    console.print(table)


def _show_tree(console: Console, data_dir: Path) -> None:
    tree = Tree(f"[bold]{data_dir}/")
    for path in sorted(data_dir.iterdir()):
        if path.is_dir() and path.name != f"{TOPIC}-0":
            tree.add(f"{path.name}/  [dim]({len(list(path.iterdir()))} files)")
        elif path.is_dir():
            branch = tree.add(f"[bold]{path.name}/")
            for child in sorted(path.iterdir()):
                branch.add(f"{child.name}  [dim]{child.stat().st_size:,} B")
        else:
            tree.add(f"{path.name}  [dim]{path.stat().st_size:,} B")
    console.print(tree)


def _show_dump(console: Console, data_dir: Path) -> None:
    segment = data_dir / f"{TOPIC}-0" / "00000000000000000000.log"
    out = io.StringIO()
    dump_files([str(segment)], DumpOptions(print_data_log=True), out=out, err=io.StringIO())
    lines = out.getvalue().splitlines()
    console.rule("tidelog dump-log --print-data-log (first lines; same format as kafka-dump-log.sh)")
    console.print("\n".join(lines[:6]), soft_wrap=True, highlight=False, markup=False)
    console.print(f"[dim]... {len(lines) - 6:,} more lines")


def _show_lookups(console: Console, log: tidelog.StorageEngine) -> None:
    console.rule("lookups")
    plog = _partition_log(log, 0)
    offset = plog.log_end_offset // 2
    slot = max(i for i, s in enumerate(plog.segments) if s.base_offset <= offset)
    segment = plog.segments[slot]
    entry = segment.index.lookup(offset)
    record = next(log.consume(TOPIC, 0, offset))
    assert record.value is not None  # every demo event has a value
    console.print(
        f"offset {offset}: segment {segment.base_offset:020d}.log (bisect) -> index entry "
        f"(offset {entry.offset}, position {entry.position}) -> scan -> {record.key!r} {record.value.decode()}"
    )
    target = START_MS + EVENTS * 25
    found = log.offset_for_timestamp(TOPIC, 0, target)
    assert found is not None
    record = next(log.consume(TOPIC, 0, found.offset))
    assert record.value is not None
    console.print(
        f"timestamp {target}: time index -> first record at or after it is offset {found.offset} "
        f"(ts {found.timestamp}) {record.value.decode()}"
    )


def _show_crash_recovery(console: Console, data_dir: Path, config: dict[str, int]) -> None:
    console.rule("crash recovery")
    segments = sorted((data_dir / f"{TOPIC}-1").glob("*.log"))
    last = segments[-1]
    with open(last, "ab") as handle:
        handle.write(b"\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x40" + b"torn write" * 7)
    (data_dir / CLEAN_SHUTDOWN_FILE).unlink()
    console.print(f"Simulated a crash: removed {CLEAN_SHUTDOWN_FILE} and left a torn batch at the end of {last.name}")
    with tidelog.open(data_dir, config=config) as log:
        plog = _partition_log(log, 1)
        records = sum(1 for _ in log.consume(TOPIC, 1))
        console.print(
            f"Reopened: {last.name} was rescanned, the torn tail cut off; partition 1 serves {records:,} records "
            f"(log end offset {plog.log_end_offset})"
        )
