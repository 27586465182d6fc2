"""20,000 partitions on one broker with either storage engine (issue 17): create, produce to all, consume from all, a
clean restart and an unclean one (kill -9), each checked and timed, with the broker's resident memory and open files.

    .venv/bin/python bench/partitions_broker.py                     # the Kafka engine, 200 topics x 100 partitions
    .venv/bin/python bench/partitions_broker.py --engine rocketmq   # the RocketMQ engine: 20,000 queues

A real `tidelog serve` (soft open-file limit raised to the hard one by the broker itself, the machine's hard limit
left as it is) on a fresh directory, and confluent-kafka clients:

1. start the empty broker: the start time and the resident memory of a broker without partitions;
2. CreateTopics for --topics topics of --partitions-per-topic partitions (default 200 x 100), --create-batch topics a
   request;
3. produce one record to every partition (acks=all), consume every partition from offset 0 and check each record;
4. clean restart (SIGTERM, then start): shutdown and start times (ready to serve, then, on the Kafka engine, every
   partition opened by the engine's opener thread, from the broker's log; the RocketMQ engine opens its queues
   before it serves); resident memory once idle, and per partition against the empty broker; every partition read
   again;
5. one more record to every partition (acks=all), kill -9, start (every partition recovers from its recovery point):
   the start time; every partition read again, both records each.

Figures are printed, not written to the docs: the machine is shared, so they are indicative.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchutil import add_dir_argument, console, new_table, print_machine, scratch_dir

READY = re.compile(r"tidelog broker ready on port\(s\) (\d+)")
ALL_OPENED = re.compile(r"opened (\d+) partitions in the background in (\d+) ms")
ENGINES = ("kafka", "rocketmq")
ENGINE_NAMES = {"kafka": "Kafka engine", "rocketmq": "RocketMQ engine"}
START_TIMEOUT_S = 600.0
CLIENT_TIMEOUT_S = 600.0


def _child_setup() -> None:
    """In the broker before exec: SIGKILL when this script dies (the broker raises its own open-file limit)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Broker:
    proc: subprocess.Popen[bytes]
    port: int
    started_s: float
    began: float  # perf_counter at the start of the process
    stderr_path: Path
    stderr_start: int  # where this run's log starts in stderr_path

    @classmethod
    def start(cls, scratch: Path, engine: str) -> Broker:
        argv = [sys.executable, "-m", "tidelog.cli", "serve", "--override", "listeners=PLAINTEXT://127.0.0.1:0"]
        argv += ["--override", f"log.dirs={scratch / 'logs'}", "--override", "auto.create.topics.enable=false"]
        argv += ["--override", f"tidelog.storage.engine={engine}"]
        stdout, stderr = scratch / "broker.out", scratch / "broker.err"
        begin = time.perf_counter()
        with stdout.open("ab") as out, stderr.open("ab") as err:
            start_at = stdout.stat().st_size
            stderr_at = stderr.stat().st_size
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, preexec_fn=_child_setup, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            with stdout.open("rb") as handle:
                handle.seek(start_at)
                found = READY.search(handle.read().decode(errors="replace"))
            if found:
                return cls(proc, int(found[1]), time.perf_counter() - begin, begin, stderr, stderr_at)
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        raise RuntimeError(f"the broker did not start: {stderr.read_text(errors='replace')[-3000:]}")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def all_opened_s(self) -> float | None:
        """Seconds from the start of the process until the engine's opener thread logged that every partition left
        after a clean start is open (waits for it); None if the broker exits or the line never comes."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            with self.stderr_path.open("rb") as handle:
                handle.seek(self.stderr_start)
                if ALL_OPENED.search(handle.read().decode(errors="replace")):
                    return time.perf_counter() - self.began
            time.sleep(0.05)
        return None

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        assert found is not None
        return int(found[1]) / 1024

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> float:
        begin = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(START_TIMEOUT_S)
        return time.perf_counter() - begin

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def create_topics(bootstrap: str, topics: list[str], partitions: int, batch: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for first in range(0, len(topics), batch):
        new = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics[first : first + batch]]
        for future in admin.create_topics(new, request_timeout=CLIENT_TIMEOUT_S, operation_timeout=60).values():
            future.result()


def produce_all(bootstrap: str, topics: list[str], partitions: int, round_: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "queue.buffering.max.messages": 1_000_000}
    )
    failures: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for topic in topics:
        for partition in range(partitions):
            producer.produce(
                topic, value=f"{topic}/{partition}/{round_}".encode(), partition=partition, on_delivery=delivered
            )
        producer.poll(0)
    left = producer.flush(CLIENT_TIMEOUT_S)
    if left or failures:
        raise RuntimeError(f"{left} records undelivered, {len(failures)} failed: {failures[:3]}")


def consume_all(bootstrap: str, topics: list[str], partitions: int, rounds: int) -> None:
    """Every partition from offset 0: exactly `rounds` records each, the ones produce_all wrote."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-partitions",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(t, p, 0) for t in topics for p in range(partitions)])
    expected = {f"{t}/{p}/{r}".encode() for t in topics for p in range(partitions) for r in range(rounds)}
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while expected and time.monotonic() < deadline:
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is None:
                expected.discard(message.value())
    consumer.close()
    if expected:
        raise RuntimeError(f"{len(expected)} records not read back, e.g. {sorted(expected)[:3]}")


def timed(label: str, rows: list[tuple[str, str]], action: object) -> float:
    begin = time.perf_counter()
    assert callable(action)
    action()
    seconds = time.perf_counter() - begin
    rows.append((label, f"{seconds:.1f} s"))
    console.print(f"{label}: {seconds:.1f} s")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--partitions-per-topic", type=int, default=100)
    parser.add_argument("--create-batch", type=int, default=10, help="topics per CreateTopics request")
    parser.add_argument("--engine", choices=ENGINES, default="kafka", help="the storage engine (default kafka)")
    add_dir_argument(parser)
    args = parser.parse_args()
    topics = [f"bench-{n:04d}" for n in range(args.topics)]
    per_topic = args.partitions_per_topic
    total = len(topics) * per_topic
    rows: list[tuple[str, str]] = []
    with scratch_dir(args.dir, 2 << 30, "tidelog-bench-20k-") as scratch:
        print_machine(scratch)
        console.print(f"load average at the start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
        broker = Broker.start(scratch, args.engine)
        rows.append(("start, empty", f"{broker.started_s:.1f} s"))
        time.sleep(2)
        empty_rss = broker.rss_mib()
        rows.append(("resident memory, empty broker", f"{empty_rss:.0f} MiB"))
        try:
            timed(
                f"create {total} partitions",
                rows,
                lambda: create_topics(broker.bootstrap, topics, per_topic, args.create_batch),
            )
            timed(
                "produce 1 record to every partition", rows, lambda: produce_all(broker.bootstrap, topics, per_topic, 0)
            )
            timed("consume every partition", rows, lambda: consume_all(broker.bootstrap, topics, per_topic, 1))
            rows.append(("open files after produce and consume", str(broker.open_files())))
            rows.append(("clean shutdown", f"{broker.stop():.1f} s"))
            broker = Broker.start(scratch, args.engine)
            rows.append(("clean restart: start (ready to serve)", f"{broker.started_s:.1f} s"))
            if args.engine == "kafka":  # the RocketMQ engine has opened every queue once it serves
                opened = broker.all_opened_s()
                rows.append(("clean restart: every partition opened", "-" if opened is None else f"{opened:.1f} s"))
            time.sleep(5)
            idle_rss = broker.rss_mib()
            rows.append(("resident memory, idle after the clean restart", f"{idle_rss:.0f} MiB"))
            rows.append(("resident memory per idle partition", f"{(idle_rss - empty_rss) * 1024 / total:.1f} KiB"))
            rows.append(("open files, idle", str(broker.open_files())))
            timed(
                "consume every partition after the clean restart",
                rows,
                lambda: consume_all(broker.bootstrap, topics, per_topic, 1),
            )
            timed(
                "produce 1 more record to every partition",
                rows,
                lambda: produce_all(broker.bootstrap, topics, per_topic, 1),
            )
            broker.kill()
            broker = Broker.start(scratch, args.engine)
            rows.append(("unclean restart (kill -9): start", f"{broker.started_s:.1f} s"))
            timed(
                "consume every partition after the unclean restart",
                rows,
                lambda: consume_all(broker.bootstrap, topics, per_topic, 2),
            )
            rows.append(("resident memory after reading everything", f"{broker.rss_mib():.0f} MiB"))
            rows.append(("clean shutdown", f"{broker.stop():.1f} s"))
        finally:
            if broker.proc.poll() is None:
                broker.kill()
        console.print(f"load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    table = new_table(
        f"{total} partitions ({len(topics)} topics x {per_topic}), {ENGINE_NAMES[args.engine]}, one broker",
        "step",
        "figure",
    )
    for label, figure in rows:
        table.add_row(label, figure)
    console.print(table)


if __name__ == "__main__":
    main()
