"""Transactions on one broker: what a transactional producer costs against an idempotent one, and what reading
read_committed costs against read_uncommitted on a log with aborted transactions.

    .venv/bin/python bench/transactions.py                   # both phases, about 2 minutes
    .venv/bin/python bench/transactions.py --quick           # everything short: a smoke test (~30 s)
    .venv/bin/python bench/transactions.py --write-report    # also write its section of docs/benchmarks.md
    PYTHONPATH=/elsewhere/src .venv/bin/python bench/transactions.py   # the broker of another checkout

One `tidelog serve` (`python -m tidelog.cli serve` with this interpreter, so the tidelog PYTHONPATH points to is
the one measured) on 127.0.0.1 with its log dir in a fresh scratch directory; the clients are confluent_kafka
(librdkafka) in this process. Phases:

  produce   topics `idempotent` and `transactional`, 3 partitions each. For --seconds per window, after a short
            warm-up, an idempotent acks=all producer (linger.ms=5) produces 100-byte values as fast as it can; a
            transactional producer (the same settings and a transactional.id) produces transactions of 1,000
            such records (begin, 1,000 produce calls, commit) back to back: the records of the transactions
            committed within the window count. Windows alternate, idempotent, transactional, idempotent,
            transactional (to even out drift); records/s of both rounds summed. Each count of --producers
            (default 1 and 4) runs this with that many producers at once, each in a process of its own (with
            its own transactional.id), their records/s added up. One producer measures the client: librdkafka
            sends a transaction's registration, its records and its commit one after another, and the broker
            idles in between. Several measure the broker, as several producers keep it busy either way. Target:
            transactional >= 80 % of idempotent with the most producers; every count is reported.
  fetch     a topic `mixed` (3 partitions) gets --transactions transactions of 1,000 100-byte records, every tenth
            aborted (10 % of the records), all committed or aborted before reading. Then a consumer (assigned,
            from the start, fetch.max.bytes and max.partition.fetch.bytes at their defaults) reads every partition
            to its end (enable.partition.eof), in read_uncommitted and in read_committed in turn, twice each;
            the rate is log records passed per second (the same log both ways: read_committed gets 90 % of them,
            drops the aborted ones, which the broker names in every answer). Target: read_committed >= 80 % of
            read_uncommitted.

The broker runs in its own session, dies with this script (PR_SET_PDEATHSIG) and is killed at the end, also after
Ctrl-C or an error; its output is in the scratch dir while it runs and the end of it is printed when it fails.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchutil import (
    BENCHMARKS_MD,
    REPO,
    add_dir_argument,
    console,
    machine_line,
    median,
    new_table,
    percent,
    print_machine,
    scratch_dir,
    source_revision,
    write_doc_section,
)

SECTION_HEADING = "## Transactions (issue 15)"
READY = re.compile(r"tidelog broker ready on port\(s\) (\d+)")
START_TIMEOUT_S = 60.0
TIMEOUT_S = 120.0
PARTITIONS = 3
VALUE_BYTES = 100
TXN_RECORDS = 1000
ABORT_EVERY = 10  # every tenth transaction of the fetch phase's log is aborted
TARGET = 0.80
BROKER_SETTINGS = {
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
}
PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 120_000}
TRANSACTIONAL = {**PRODUCER, "transaction.timeout.ms": 180_000}  # librdkafka wants it >= message.timeout.ms


class BenchError(Exception):
    """A step that did not happen in time, or a broker that died: the run stops."""


def _die_with_parent() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def running_broker(directory: Path) -> Iterator[str]:
    """A `tidelog serve` on an ephemeral port; yields its bootstrap address."""
    out, err = directory / "broker.out", directory / "broker.err"
    argv = [sys.executable, "-m", "tidelog.cli", "serve", "--override", "listeners=PLAINTEXT://127.0.0.1:0",
            "--override", f"log.dirs={directory / 'logs'}"]  # fmt: skip
    for key, value in BROKER_SETTINGS.items():
        argv += ["--override", f"{key}={value}"]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                preexec_fn=_die_with_parent, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (match := READY.search(out.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(err.read_text(errors="replace").splitlines()[-20:])
                raise BenchError(f"the broker did not start (status {proc.poll()}); the end of its stderr:\n{tail}")
            time.sleep(0.05)
        yield f"127.0.0.1:{match.group(1)}"
    finally:
        proc.kill()
        proc.wait()


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names]).values():
        future.result(TIMEOUT_S)


# --- phase 1: transactional produce against idempotent produce ---------------------------------------------------


def idempotent_window(bootstrap: str, topic: str, seconds: float, warmup_s: float) -> tuple[int, float]:
    """Records acknowledged within the window, and its length."""
    delivered = [0]
    errors: list[str] = []

    def on_delivery(err: Any, _message: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered[0] += 1

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER})
    value = os.urandom(VALUE_BYTES)

    def run_until(deadline: float) -> None:
        sent = 0
        while time.perf_counter() < deadline:
            try:
                producer.produce(topic, value, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.005)
                continue
            sent += 1
            if sent % 256 == 0:
                producer.poll(0)
        producer.poll(0)

    run_until(time.perf_counter() + warmup_s)
    n0, t0 = delivered[0], time.perf_counter()
    run_until(t0 + seconds)
    n1, t1 = delivered[0], time.perf_counter()
    if producer.flush(TIMEOUT_S):
        raise BenchError(f"records to {topic} not acknowledged after {TIMEOUT_S:.0f} s")
    if errors:
        raise BenchError(f"{len(errors)} deliveries to {topic} failed, the first: {errors[0]}")
    return n1 - n0, t1 - t0


def transactional_window(
    bootstrap: str, topic: str, seconds: float, warmup_s: float, transactional_id: str
) -> tuple[int, float, list[float]]:
    """Records of the transactions committed within the window (each begun, produced and committed in it), its
    length, and each commit's seconds once its records were acknowledged (the EndTxn round trip: the coordinator's
    writes and markers)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **TRANSACTIONAL})
    producer.init_transactions(TIMEOUT_S)
    value = os.urandom(VALUE_BYTES)
    commits: list[float] = []

    def one_transaction() -> None:
        producer.begin_transaction()
        for _ in range(TXN_RECORDS):
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:
                    producer.poll(0.005)
        producer.flush(TIMEOUT_S)  # what commit_transaction does first; timed apart from the commit
        started = time.perf_counter()
        producer.commit_transaction(TIMEOUT_S)
        commits.append(time.perf_counter() - started)

    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:
        one_transaction()
    commits.clear()
    committed, t0 = 0, time.perf_counter()
    while time.perf_counter() < t0 + seconds:
        one_transaction()
        committed += TXN_RECORDS
    return committed, time.perf_counter() - t0, commits


def _idempotent_rate(job: tuple[str, str, float, float]) -> tuple[float, list[float]]:
    """One producer's idempotent records/s (run in a worker process of phase_produce's pool)."""
    records, seconds = idempotent_window(*job)
    return records / seconds, []


def _transactional_rate(job: tuple[str, str, float, float, str]) -> tuple[float, list[float]]:
    """One producer's transactional records/s and its commit times (run in a worker process)."""
    records, seconds, commits = transactional_window(*job)
    return records / seconds, commits


# --- phase 2: read_committed against read_uncommitted ------------------------------------------------------------


def fill_mixed(bootstrap: str, topic: str, transactions: int) -> int:
    """`transactions` transactions of TXN_RECORDS records, every ABORT_EVERY-th aborted; returns the records aborted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-fill", **TRANSACTIONAL})
    producer.init_transactions(TIMEOUT_S)
    value = os.urandom(VALUE_BYTES)
    aborted = 0
    for n in range(transactions):
        producer.begin_transaction()
        for _ in range(TXN_RECORDS):
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:
                    producer.poll(0.005)
        if n % ABORT_EVERY == ABORT_EVERY - 1:
            producer.flush(TIMEOUT_S)  # in the log first: abort_transaction purges what is still queued
            producer.abort_transaction(TIMEOUT_S)
            aborted += TXN_RECORDS
        else:
            producer.commit_transaction(TIMEOUT_S)
    return aborted


def read_to_end(bootstrap: str, topic: str, isolation: str, ends: dict[int, int]) -> tuple[int, float]:
    """Records delivered and seconds until every partition reported its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-reader",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    received, at_end = 0, set()
    t0 = time.perf_counter()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(at_end) < PARTITIONS:
            if time.monotonic() > deadline:
                raise BenchError(f"{isolation}: {topic} not read to its end after {TIMEOUT_S:.0f} s")
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                error = message.error()
                if error is None:
                    received += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    if message.offset() >= ends[message.partition()]:
                        at_end.add(message.partition())
                else:
                    raise KafkaException(error)
        return received, time.perf_counter() - t0
    finally:
        consumer.close()


def log_ends(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ends"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), TIMEOUT_S)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


# --- the run --------------------------------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]
    target: str
    met: bool
    notes: list[str] = field(default_factory=list)

    def show(self) -> None:
        table = new_table(self.title, *self.columns)
        for row in self.rows:
            table.add_row(*row)
        console.print(table)
        for note in self.notes:
            console.print(f"note: {note}")
        console.print(f"target {self.target} - {'[green]met[/]' if self.met else '[red]not met[/]'}")

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |"]
        lines.append("|---|" + "---:|" * (len(self.columns) - 1))
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines += [
            "",
            *(f"- {note}" for note in self.notes),
            f"- target {self.target}: {'met' if self.met else 'NOT met'}",
        ]
        return "\n".join(lines)


def phase_produce(bootstrap: str, args: argparse.Namespace) -> PhaseResult:
    create_topics(bootstrap, "idempotent", "transactional")
    rows = []
    notes = []
    shares: dict[int, float] = {}
    spawn = multiprocessing.get_context("spawn")  # librdkafka's threads do not survive a fork
    for producers in args.producers:
        totals = {"idempotent": 0.0, "transactional": 0.0}
        commits: list[float] = []
        with spawn.Pool(producers) as pool:
            for round_ in (1, 2):
                for kind in ("idempotent", "transactional"):
                    if kind == "idempotent":
                        jobs: list[Any] = [(bootstrap, kind, args.seconds, args.warmup)] * producers
                        done = pool.map(_idempotent_rate, jobs)
                    else:
                        jobs = [
                            (bootstrap, kind, args.seconds, args.warmup, f"bench-{producers}-{round_}-{k}")
                            for k in range(producers)
                        ]
                        done = pool.map(_transactional_rate, jobs)
                    rate = sum(rate for rate, _ in done)
                    commits += [t for _, times in done for t in times]
                    totals[kind] += rate
                    rows.append([str(producers), f"{kind}, round {round_}", f"{rate:,.0f}"])
        shares[producers] = totals["transactional"] / totals["idempotent"]
        rows.append(
            [str(producers), "transactional / idempotent", percent(totals["transactional"], totals["idempotent"])]
        )
        per_txn_ms = 1000 * TXN_RECORDS * producers / (totals["transactional"] / 2)
        notes.append(
            f"{producers} producer{'s' if producers > 1 else ''}: a transaction took {per_txn_ms:.1f} ms, of which "
            f"the commit after its records "
            f"were acknowledged (EndTxn: the coordinator's writes and the markers) {1000 * median(commits):.1f} ms "
            f"median, {1000 * max(commits):.1f} ms max ({len(commits)} commits)"
        )
    most = max(args.producers)
    share = shares[most]
    return PhaseResult(
        f"Transactional produce (transactions of {TXN_RECORDS:,} records of {VALUE_BYTES} B) vs idempotent, acks=all",
        ("producers", "window", "records/s"),
        rows,
        f"transactional >= {TARGET:.0%} of idempotent with {most} producer{'s' if most > 1 else ''}: {share:.0%}",
        share >= TARGET,
        notes,
    )


def phase_fetch(bootstrap: str, args: argparse.Namespace) -> PhaseResult:
    create_topics(bootstrap, "mixed")
    t0 = time.perf_counter()
    aborted = fill_mixed(bootstrap, "mixed", args.transactions)
    fill_s = time.perf_counter() - t0
    ends = log_ends(bootstrap, "mixed")
    total = args.transactions * TXN_RECORDS
    times: dict[str, float] = {"read_uncommitted": 0.0, "read_committed": 0.0}
    rows = []
    for round_ in (1, 2):
        for isolation in times:
            received, seconds = read_to_end(bootstrap, "mixed", isolation, ends)
            expected = total if isolation == "read_uncommitted" else total - aborted
            if received != expected:
                raise BenchError(f"{isolation} got {received:,} records, expected {expected:,}")
            times[isolation] += seconds
            rows.append([f"{isolation}, round {round_}", f"{received:,}", f"{seconds:.2f}", f"{total / seconds:,.0f}"])
    share = times["read_uncommitted"] / times["read_committed"]
    rows.append(["read_committed / read_uncommitted", "", "", f"{share:.0%}"])
    return PhaseResult(
        f"read_committed vs read_uncommitted: {total:,} records in {args.transactions} transactions, "
        f"{aborted:,} aborted ({aborted / total:.0%})",
        ("read", "records delivered", "seconds", "log records/s"),
        rows,
        f"read_committed >= {TARGET:.0%} of read_uncommitted: {share:.0%}",
        share >= TARGET,
        [f"the log was written in {fill_s:.1f} s; {sum(ends.values()):,} offsets with the markers"],
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="everything short (2 s windows, 30 transactions)")
    parser.add_argument("--seconds", type=float, help="each produce window (default 10; quick 2)")
    parser.add_argument(
        "--transactions", type=int, help="transactions of the fetch phase's log (default 300; quick 30)"
    )
    parser.add_argument(
        "--write-report",
        action="store_true",
        help=f"write (or replace) the section “{SECTION_HEADING[3:]}” of {BENCHMARKS_MD.relative_to(REPO)}",
    )
    parser.add_argument(
        "--producers", default="1,4", help="producer counts of the produce phase, comma-separated (default 1,4)"
    )
    add_dir_argument(parser)
    args = parser.parse_args(argv)
    try:
        args.producers = [int(count) for count in args.producers.split(",")]
    except ValueError:
        parser.error(f"--producers must be counts separated by commas, not {args.producers!r}")
    if min(args.producers) < 1:
        parser.error("--producers must be at least 1")
    args.seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 10.0)
    args.warmup = 0.5 if args.quick else 2.0
    args.transactions = args.transactions if args.transactions is not None else (30 if args.quick else 300)
    if args.seconds <= 0 or args.transactions < ABORT_EVERY:
        parser.error(f"--seconds must be positive and --transactions at least {ABORT_EVERY}")
    return args


def markdown_section(results: list[PhaseResult], facts: dict[str, str]) -> str:
    tables = "\n\n".join(r.markdown() for r in results)
    return f"""{SECTION_HEADING}

```
make bench-transactions     # = .venv/bin/python bench/transactions.py --write-report
```

One broker on 127.0.0.1 and librdkafka clients (the produce phase's producers in worker processes of their own); how
each phase is measured is in the docstring of `bench/transactions.py`. Both figures are ratios within one run, so the
machine's speed cancels out.

Command: `{facts["command"]}`, run {facts["started"]}; tidelog {facts["revision"]}.
Machine: {facts["machine"]}. Load average {facts["load"]} at the start.

{tables}"""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    facts = {
        "command": "python bench/transactions.py" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
        "started": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_line(),
        "revision": source_revision(),
        "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    results: list[PhaseResult] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with scratch_dir(args.dir, 1 << 30, "tidelog-transactions-") as scratch:
            print_machine(scratch)
            with running_broker(scratch) as bootstrap:
                for phase in (phase_produce, phase_fetch):
                    results.append(phase(bootstrap, args))
                    results[-1].show()
    except (BenchError, KafkaException) as exc:
        console.print(f"transactions benchmark failed: {exc}", markup=False)
        return 1
    except KeyboardInterrupt:
        console.print("interrupted: the broker is stopped, the scratch dir is removed")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.write_report:
        action = write_doc_section(BENCHMARKS_MD, SECTION_HEADING, markdown_section(results, facts))
        console.print(f"{action} the section “{SECTION_HEADING[3:]}” of {BENCHMARKS_MD.relative_to(REPO)}")
    return 0 if all(r.met for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
