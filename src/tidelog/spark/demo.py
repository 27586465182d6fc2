"""`tidelog demo` (what `make demo` runs): the page-visits pipeline on Spark, end to end, in about a minute.

1. starts `tidelog serve` on 127.0.0.1 (an ephemeral port) over `tidelog-demo-data/broker`;
2. creates `page_visits` (5 partitions) and `page_visits_per_window` with a Kafka admin client, and produces
   page visits with a real Kafka client (confluent-kafka), keyed by user, the record timestamp being the visit time;
3. runs the Structured Streaming query of `examples/page_visits_pipeline.py`: visits per page per 10-second window
   with a 5-second watermark, each finished window written to `page_visits_per_window` (by the exactly-once
   sink: each micro-batch's windows in Kafka transactions committed with the batch) and to Parquet,
   with a live progress line (on a terminal), or a plain status line every few seconds (CI logs, `| tee`);
4. when the producer stops, sends one heartbeat 20 s later in event time so the watermark closes the last window,
   waits for it, stops the query, and prints the top pages from a batch read of the broker's log files, checked
   against the sum of the windowed counts;
5. stops Spark (if it started it) and the broker (SIGTERM) - also on Ctrl-C or an error.

`run_demo` is that flow for any `DemoBrokers`: `SingleBroker` here (`tidelog demo`), a three-broker cluster with a
failover in `tidelog.tools.cluster_demo` (`tidelog demo --cluster`), which adds its own steps through the hooks.

The whole demo stops by itself within DEADLINE_S + CLEANUP_BUDGET_S (under 3 minutes): the stream ends early enough to
leave time for the report, and a watchdog behind it ends a demo stuck in a call that never returns, saying where
it was stuck, after stopping Spark and the broker (exit code DEADLINE_EXIT_CODE).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tidelog.spark.local_broker import LocalBroker

COMMIT_WAIT_S = 15.0  # how long the report waits for the sink's last transaction to become visible

PAGES = ["/", "/products", "/products/42", "/cart", "/checkout", "/blog/kafka-on-disk", "/about", "/search"]
WEIGHTS = [30, 22, 15, 10, 7, 6, 5, 5]
EVENTS_PARTITIONS = 5
HEARTBEAT_AHEAD_MS = 20_000
DRAIN_TIMEOUT_S = 45.0
DEADLINE_S = 165.0  # start to finish, whatever happens (+ CLEANUP_BUDGET_S): under the 3 minutes promised
STOP_RESERVE_S = 40.0  # of the deadline, kept for stopping the query, the batch report and the shutdown
PLAIN_STATUS_EVERY_S = 5.0  # without a terminal (rich's live display shows nothing until it ends)
CLEANUP_BUDGET_S = 10.0  # past the deadline, for all the watchdog's cleanups together
BROKER_STOP_S = 5.0  # the watchdog's SIGTERM grace for tidelog serve before SIGKILL
DEADLINE_EXIT_CODE = 3
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "page_visits_pipeline.py"


def _missing_requirement() -> str | None:
    """Spark needs a Java runtime and the `spark` extra; say which is missing instead of failing deep inside."""
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        return "PySpark is not installed: pip install 'tidelog[spark]' (make demo does it)"
    java_home = os.environ.get("JAVA_HOME")
    if not shutil.which("java") and not (java_home and Path(java_home, "bin", "java").exists()):
        return "Spark needs a Java runtime (17 or newer) on PATH, e.g. apt-get install openjdk-17-jre-headless"
    return None


def load_pipeline() -> ModuleType:
    """The pipeline lives in examples/page_visits_pipeline.py, the copy-me example (one source of truth)."""
    if not EXAMPLE.exists():
        raise FileNotFoundError(
            f"{EXAMPLE} is missing: `tidelog demo` runs the example pipeline from a tidelog source checkout"
        )
    spec = importlib.util.spec_from_file_location("page_visits_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Progress:
    produced: int = 0
    producing: bool = True
    producing_since: float | None = None  # time.monotonic() when the first visit was produced
    acknowledged: int = 0  # records the producer was told are written (its delivery reports)
    delivery_errors: list[str] = field(default_factory=list)
    last_event_ms: int = 0
    windows_written: int = 0
    rows_in: int = 0
    batches: int = 0
    last_batch_ms: int = 0
    watermark: str = "-"
    max_window_end_ms: int = 0
    window_latencies_ms: list[float] = field(default_factory=list)
    seen_batches: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Watchdog:
    """The deadline's last resort, for a call that never returns (a JVM that does not start, a hung query):
    `deadline_s` after `started` it prints what the demo was doing, runs the cleanups registered with
    `on_expiry` in that order (within CLEANUP_BUDGET_S in all) and ends the process with DEADLINE_EXIT_CODE.
    A Spark JVM this process started exits with it (PySpark's gateway quits when its stdin pipe closes)."""

    def __init__(self, deadline_s: float, console: Console, started: float | None = None) -> None:
        self.deadline_s = deadline_s
        self.console = console
        self.started = time.monotonic() if started is None else started
        self.phase = "starting"
        self._cleanups: list[tuple[str, Callable[[], Any]]] = []
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="demo-deadline", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def on_expiry(self, name: str, cleanup: Callable[[], Any]) -> None:
        self._cleanups.append((name, cleanup))

    def cancel(self) -> None:
        self._finished.set()

    def _watch(self) -> None:
        if self._finished.wait(max(0.0, self.started + self.deadline_s - time.monotonic())):
            return
        self.console.print(
            f"[bold red]the demo did not finish within {self.deadline_s:.0f} s: it was stuck {self.phase}; "
            "stopping everything"
        )
        budget_end = time.monotonic() + CLEANUP_BUDGET_S
        for name, cleanup in self._cleanups:
            worker = threading.Thread(target=self._run_cleanup, args=(name, cleanup), daemon=True)
            worker.start()
            worker.join(max(0.0, budget_end - time.monotonic()))
            if worker.is_alive():
                self.console.print(f"[red]{name} did not stop in time")
        self.console.file.flush()
        os._exit(DEADLINE_EXIT_CODE)

    def _run_cleanup(self, name: str, cleanup: Callable[[], Any]) -> None:
        try:
            cleanup()
            self.console.print(f"stopped {name}")
        except Exception as exc:  # report it and go on with the other cleanups
            self.console.print(f"[red]stopping {name} failed: {exc}")


def produce_visits(
    bootstrap: str,
    seconds: float,
    rate: int,
    progress: Progress,
    stop: threading.Event,
    on_ack: Callable[[int, int], None] | None = None,
) -> None:
    """Page visits at about `rate` per second for `seconds`, then one heartbeat ahead in event time, with an
    idempotent producer (acks=all). `on_ack(partition, record timestamp)` is called for each acknowledged record,
    on this thread."""
    from confluent_kafka import Producer

    def delivered(error: Any, message: Any) -> None:
        with progress.lock:
            if error is not None:
                progress.delivery_errors.append(str(error))
                return
            progress.acknowledged += 1
        if on_ack is not None:
            on_ack(message.partition(), message.timestamp()[1])

    config = {"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True, "acks": "all"}
    producer = Producer({**config, "on_delivery": delivered})
    rng = random.Random(7)
    started = time.monotonic()
    with progress.lock:
        progress.producing_since = started
    sent = 0
    while not stop.is_set():
        elapsed = time.monotonic() - started
        if elapsed >= seconds:
            break
        due = int(elapsed * rate) - sent
        for _ in range(max(0, due)):
            now_ms = int(time.time() * 1000)
            user = f"user-{rng.randrange(2000)}"
            page = rng.choices(PAGES, WEIGHTS)[0]
            value = json.dumps({"user": user, "page": page, "ts": now_ms}).encode()
            producer.produce("page_visits", key=user.encode(), value=value, timestamp=now_ms)
            sent += 1
            with progress.lock:
                progress.produced = sent
                progress.last_event_ms = now_ms
        producer.poll(0)
        time.sleep(0.02)
    heartbeat_ms = progress.last_event_ms + HEARTBEAT_AHEAD_MS
    producer.produce("page_visits", key=b"heartbeat", value=b'{"ts": %d}' % heartbeat_ms, timestamp=heartbeat_ms)
    producer.flush(30)
    with progress.lock:
        progress.producing = False


def create_topics(bootstrap: str, replication_factor: int = 1, config: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [
        NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=config or {})
        for name, partitions in (("page_visits", EVENTS_PARTITIONS), ("page_visits_per_window", 1))
    ]
    for future in admin.create_topics(topics).values():
        future.result(timeout=30)


def _status(progress: Progress, started: float, brokers: DemoBrokers) -> Text:
    with progress.lock:
        state = "producing" if progress.producing else "draining: waiting for the watermark to close the last window"
        watermark = progress.watermark[11:19] if len(progress.watermark) >= 19 else progress.watermark
        text = (
            f"[bold]{time.monotonic() - started:5.1f} s[/]  {state}\n"
            f"        produced [bold]{progress.produced:,}[/] visits | Spark read [bold]{progress.rows_in:,}[/] "
            f"in {progress.batches} micro-batches (last {progress.last_batch_ms / 1000:.1f} s) | "
            f"watermark {watermark} | windows written [bold]{progress.windows_written}[/]"
        )
    extra = brokers.status(progress)
    return Text.from_markup(text + (f"\n        {extra}" if extra else ""))


def _plain_status(progress: Progress, started: float, brokers: DemoBrokers) -> str:
    """The status on one line, without styles (for logs)."""
    return " ".join(_status(progress, started, brokers).plain.split())


def _track(query: Any, progress: Progress) -> None:
    for report in query.recentProgress:
        batch_id = report["batchId"]
        if batch_id in progress.seen_batches:
            continue
        progress.seen_batches.add(batch_id)
        progress.rows_in += int(report.get("numInputRows", 0))
        progress.batches += 1
        progress.last_batch_ms = int(report.get("durationMs", {}).get("triggerExecution", 0))
        watermark = report.get("eventTime", {}).get("watermark")
        if watermark:
            progress.watermark = watermark.replace("T", " ").replace(".000Z", "Z")


class DemoBrokers:
    """What the demo's pipeline runs against, and the hooks by which a variant adds its own steps to the one flow of
    `run_demo`. The hooks run on the main thread, except `delivered` (on the producer's thread); the defaults do
    nothing. `SingleBroker` is `tidelog demo`'s; `tidelog.tools.cluster_demo` has `tidelog demo --cluster`'s."""

    name = "the broker"  # in the watchdog's messages: "starting ...", "stopped ..."
    through = "through the broker"  # how the streaming query reads page_visits (unless from the files)
    title = "page visits per window on Spark"
    replication_factor = 1
    topic_config: ClassVar[dict[str, str]] = {}  # of both topics
    stop_reserve_s = STOP_RESERVE_S  # of the deadline: the time kept for stopping the query, the report, the stop
    strict = False  # True: the exit code is 1 unless every check of the report passed
    exactly_once = False  # page_visits_per_window written in transactions, read read_committed (needs transactions)

    def missing(self) -> str | None:
        """What this variant needs beyond Spark and is not installed, or None."""
        return None

    def start(self, console: Console) -> None:
        raise NotImplementedError

    @property
    def bootstrap(self) -> str:
        raise NotImplementedError

    def source(self, read_from: str) -> dict[str, str]:
        """Where the streaming query reads page_visits (`read_from`: broker or files)."""
        return {"kafka.bootstrap.servers": self.bootstrap}

    def batch_source(self) -> tuple[dict[str, str], str]:
        """Where the report's batch reads go, and how to say it."""
        return {"kafka.bootstrap.servers": self.bootstrap}, "through the broker"

    def where(self) -> str:
        """Where its data is, for the last line."""
        return ""

    def tick(self, console: Console, progress: Progress) -> None:
        """Every half second while the query streams."""

    def delivered(self, partition: int, timestamp_ms: int) -> None:
        """A record was acknowledged (on the producer's thread)."""

    def status(self, progress: Progress) -> str:
        """More status (markup, one line), or ''."""
        return ""

    def before_report(self, console: Console, until: float) -> None:
        """After the query stopped, before the report; return by `until` (time.monotonic())."""

    def report(self, console: Console, spark: Any, progress: Progress) -> bool:
        """Its part of the report, after the windows' check; False when one of its checks failed."""
        return True

    def stop(self, console: Console) -> None:
        """Stop everything it started (also when start failed half way), saying how it went."""
        raise NotImplementedError

    def stop_now(self) -> None:
        """The watchdog's cleanup: stop within a few seconds."""
        raise NotImplementedError


class SingleBroker(DemoBrokers):
    """`tidelog demo`: one `tidelog serve` child (LocalBroker); the report reads the broker's log files."""

    name = "tidelog serve"
    exactly_once = True

    def __init__(self, log_dir: Path) -> None:
        self.broker = LocalBroker(log_dir, {"num.partitions": str(EVENTS_PARTITIONS)})

    def start(self, console: Console) -> None:
        self.broker.start()
        console.print(f"tidelog serve is up on [bold]{self.broker.bootstrap}[/] (log.dirs={self.broker.log_dir})")

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def source(self, read_from: str) -> dict[str, str]:
        return {"path": str(self.broker.log_dir)} if read_from == "files" else super().source(read_from)

    def batch_source(self) -> tuple[dict[str, str], str]:
        return {"path": str(self.broker.log_dir)}, "from the broker's log files"

    def where(self) -> str:
        return f"log files: {self.broker.log_dir}"

    def stop(self, console: Console) -> None:
        code = self.broker.stop()
        if code is not None:
            console.print("tidelog serve stopped" + (" cleanly" if code == 0 else f" with exit code {code}"))

    def stop_now(self) -> None:
        self.broker.stop(timeout_s=BROKER_STOP_S)


def run(
    data_dir: Path = Path("tidelog-demo-data"),
    *,
    seconds: float = 40.0,
    rate: int = 500,
    read_from: str = "broker",
    deadline_s: float = DEADLINE_S,
) -> int:
    """The demo; 0 when every window was written and checked, 1 when it was cut short, 130 on Ctrl-C.

    Uses the running SparkSession if there is one (and then leaves it running), else starts and stops its own."""
    brokers = SingleBroker(data_dir / "broker")
    return run_demo(brokers, data_dir, seconds=seconds, rate=rate, read_from=read_from, deadline_s=deadline_s)


def run_demo(
    brokers: DemoBrokers,
    data_dir: Path,
    *,
    seconds: float = 40.0,
    rate: int = 500,
    read_from: str = "broker",
    deadline_s: float = DEADLINE_S,
) -> int:
    """The demo's flow against `brokers` (see the module docstring); the exit code as `run` says, and 1 when a
    check failed if `brokers.strict`."""
    console = Console()
    console.soft_wrap = not console.is_terminal  # a log keeps each line whole instead of cutting it at 80 columns
    logging.getLogger("py4j").setLevel(logging.WARNING)  # py4j logs every callback at INFO
    console.rule(f"[bold]tidelog demo: {brokers.title}")
    problem = _missing_requirement() or brokers.missing()
    if problem:
        hint = "(`tidelog demo --storage` runs the storage demo, which needs neither)"
        console.print(f"[red]{escape(problem)}[/]\n{hint}")  # escaped: rich would take [spark] for markup
        return 1
    pipeline = load_pipeline()
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    started = time.monotonic()
    stream_until = started + deadline_s - brokers.stop_reserve_s  # the streaming phase ends by then, drained or not
    watchdog = Watchdog(deadline_s, console, started).start()
    stop = threading.Event()
    watchdog.on_expiry("the producer", stop.set)
    watchdog.on_expiry(brokers.name, brokers.stop_now)
    spark = None
    own_spark = False
    query = None
    producer_thread: threading.Thread | None = None
    try:
        watchdog.phase = f"starting {brokers.name}"
        brokers.start(console)
        watchdog.phase = "creating the topics"
        create_topics(brokers.bootstrap, brokers.replication_factor, brokers.topic_config)
        settings = "".join(f", {key}={value}" for key, value in brokers.topic_config.items())
        rf = f" (replication factor {brokers.replication_factor}{settings})" if brokers.replication_factor > 1 else ""
        console.print(f"created topics page_visits (5 partitions) and page_visits_per_window{rf}")
        watchdog.phase = "starting Spark"
        from pyspark.sql import SparkSession

        import tidelog.spark

        own_spark = SparkSession.getActiveSession() is None
        if own_spark:
            console.print("starting Spark (local[2]; the JVM takes 10-20 s to start) ...")
        spark = tidelog.spark.local_session("tidelog-demo", fast_start=True)
        if own_spark:
            watchdog.on_expiry("Spark", spark.stop)
        progress = Progress()

        def on_batch(batch: Any, batch_id: int) -> None:
            now = time.time() * 1000
            ends = [row["end"] for row in batch.select("window.end").collect()]
            with progress.lock:
                progress.windows_written += len(ends)
                for end in ends:
                    end_ms = end.timestamp() * 1000
                    progress.max_window_end_ms = max(progress.max_window_end_ms, int(end_ms))
                    progress.window_latencies_ms.append(now - end_ms)

        source = brokers.source(read_from)
        sink = sink_options(brokers)
        parquet_dir = str(data_dir / "windows.parquet")
        watchdog.phase = "starting the streaming query"
        query = pipeline.start_pipeline(
            spark, source, sink, parquet_dir, str(data_dir / "checkpoint"), on_batch=on_batch
        )
        reading = "the log files" if "path" in source else brokers.through
        console.print(f"streaming query started (reading {reading}); producing {rate} visits/s for {seconds:.0f} s")
        producer_thread = threading.Thread(
            target=produce_visits,
            args=(brokers.bootstrap, seconds, rate, progress, stop, brokers.delivered),
            daemon=True,
        )
        producer_thread.start()
        watchdog.phase = "streaming"
        closed, cut_short = _stream(console, query, progress, started, stream_until, brokers)
        stop.set()
        producer_thread.join(timeout=30)
        watchdog.phase = "stopping the streaming query"
        query.stop()
        query = None
        if cut_short:
            console.print(
                f"[yellow]the demo's deadline ({deadline_s:.0f} s) came before the last window closed: stopped "
                "the stream; results are partial"
            )
        elif not closed:
            console.print("[yellow]the last window did not close within the drain timeout; results are partial")
        watchdog.phase = "waiting before the report"
        brokers.before_report(console, stream_until)
        watchdog.phase = "reading the results"
        checked = _report(console, spark, pipeline, brokers, parquet_dir, progress)
        checked = brokers.report(console, spark, progress) and checked
        console.rule(f"[bold green]done in {time.monotonic() - started:.0f} s")
        console.print(f"Parquet: {parquet_dir}   {brokers.where()}")
        return 0 if closed and (checked or not brokers.strict) else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; stopping")
        return 130
    finally:
        stop.set()
        if producer_thread is not None:
            producer_thread.join(timeout=30)
        watchdog.phase = "stopping Spark"
        if query is not None:
            query.stop()
        if spark is not None and own_spark:
            spark.stop()
        watchdog.phase = f"stopping {brokers.name}"
        brokers.stop(console)
        watchdog.cancel()


def sink_options(brokers: DemoBrokers) -> dict[str, str]:
    """Where and how the pipeline writes page_visits_per_window: through the broker, in transactions the driver
    commits with each micro-batch when the brokers serve transactions (docs/spark.md, "Exactly-once")."""
    sink = {"kafka.bootstrap.servers": brokers.bootstrap}
    if brokers.exactly_once:
        sink["tidelog.sink.exactlyOnce"] = "true"
    return sink


def results_source(brokers: DemoBrokers, source: dict[str, str]) -> dict[str, str]:
    """How page_visits_per_window is read back: committed records only when it is written in transactions."""
    return {**source, "kafka.isolation.level": "read_committed"} if brokers.exactly_once else source


def _stream(
    console: Console, query: Any, progress: Progress, started: float, until: float, brokers: DemoBrokers
) -> tuple[bool, bool]:
    """Follows the query until the last window is written, the drain times out or `until` passes, showing
    progress. Returns (the last window was written, `until` cut the stream short)."""
    drain_deadline: float | None = None
    status = _status(progress, started, brokers)
    live = Live(status, console=console, refresh_per_second=4) if console.is_terminal else None
    next_line = time.monotonic()
    with live or contextlib.nullcontext():
        while True:
            time.sleep(0.5)
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
            with progress.lock:
                _track(query, progress)
                producing = progress.producing
                last_window_end = (progress.last_event_ms // 10_000 + 1) * 10_000
                closed = progress.max_window_end_ms >= last_window_end
            brokers.tick(console, progress)
            now = time.monotonic()
            if live is not None:
                live.update(_status(progress, started, brokers))
            elif now >= next_line:
                console.print(_plain_status(progress, started, brokers), highlight=False)
                next_line = now + PLAIN_STATUS_EVERY_S
            if not producing:
                drain_deadline = drain_deadline or now + DRAIN_TIMEOUT_S
                if closed or now > drain_deadline:
                    break
            if now > until:
                break
    if live is None:
        console.print(_plain_status(progress, started, brokers), highlight=False)
    console.print()
    return closed, not closed and time.monotonic() > until


def wait_for_committed(bootstrap: str, topic: str, timeout_s: float) -> bool:
    """Wait until no partition of `topic` has an open transaction - its last stable offset (what a read_committed
    ListOffsets answers) is its high watermark - or `timeout_s` passes; True when none had. A transaction's commit
    returns before its markers are written (the coordinator writes them next, as Kafka's does), so a read_committed
    read right after the sink's last commit may not see that commit yet."""
    from confluent_kafka import Consumer, TopicPartition

    def consumer(isolation: str) -> Any:
        return Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "tidelog-demo-check", "isolation.level": isolation}
        )

    committed, uncommitted = consumer("read_committed"), consumer("read_uncommitted")
    try:
        partitions = [
            TopicPartition(topic, p) for p in committed.list_topics(topic, timeout=10).topics[topic].partitions
        ]
        deadline = time.monotonic() + timeout_s
        while True:
            ends = [
                (committed.get_watermark_offsets(tp, timeout=5, cached=False)[1],
                 uncommitted.get_watermark_offsets(tp, timeout=5, cached=False)[1])
                for tp in partitions
            ]  # fmt: skip
            if all(stable == high for stable, high in ends):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
    finally:
        committed.close()
        uncommitted.close()


def _report(
    console: Console, spark: Any, pipeline: ModuleType, brokers: DemoBrokers, parquet_dir: str, progress: Progress
) -> bool:
    """The top pages from a batch read, checked against the sum of the windowed counts; True when they agree."""
    source, how = brokers.batch_source()
    top = pipeline.top_pages(spark, source, n=len(PAGES))
    windowed = (
        {
            row["page"]: row["visits"]
            for row in spark.read.parquet(parquet_dir)
            .groupBy("page")
            .agg({"count": "sum"})
            .withColumnRenamed("sum(count)", "visits")
            .collect()
        }
        # a run cut short before its first window closed wrote no part file (an interrupted write leaves only its
        # _temporary directory), and Spark cannot read a Parquet directory without one
        if any(Path(parquet_dir).glob("*.parquet"))
        else {}
    )
    table = Table(title=f"top pages (batch read of page_visits {how})")
    for column in ("page", "visits", "sum of windows (Parquet)"):
        table.add_column(column, justify="right" if column != "page" else "left")
    for page, visits in top:
        mark = "" if windowed.get(page) == visits else " [red](differs)"
        table.add_row(page, f"{visits:,}", f"{windowed.get(page, 0):,}{mark}")
    console.print(table)
    total = sum(v for _, v in top)
    matches = all(windowed.get(page) == visits for page, visits in top)
    verdict = "[green]every window counted, none twice" if matches else "[red]windowed counts differ"
    console.print(f"{total:,} visits; {verdict}")
    if brokers.exactly_once and not wait_for_committed(brokers.bootstrap, "page_visits_per_window", COMMIT_WAIT_S):
        console.print(f"[yellow]page_visits_per_window still had an open transaction after {COMMIT_WAIT_S:.0f} s")
    reader = pipeline.with_options(spark.read.format("tidelog"), results_source(brokers, source))
    topic_rows = reader.option("subscribe", "page_visits_per_window").load(
        *([source["path"]] if "path" in source else [])
    )
    how = " (committed, each micro-batch once: the exactly-once sink)" if brokers.exactly_once else ""
    console.print(f"page_visits_per_window holds {topic_rows.count():,} window results{how}; the first:")
    for row in topic_rows.orderBy("offset").limit(3).collect():
        console.print(f"  offset {row['offset']}: {row['value'].decode()}")
    if progress.window_latencies_ms:
        latencies = sorted(progress.window_latencies_ms)
        console.print(
            f"window results written {statistics.median(latencies) / 1000:.1f} s (median) / "
            f"{latencies[-1] / 1000:.1f} s (max) after their window ended (the 5 s watermark included)"
        )
    return matches
