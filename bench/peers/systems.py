"""The systems of the broker benchmark, one class each (tidelog, Redis Streams, NATS JetStream), and how one test
runs against them.

Contract of a system class (`System`):
- `name` is what `--systems` selects; `tools` lists, per client tier ("python", "compiled"), the executables its
  tests need, and `packages` the Debian packages of those that are not named after their package.
- `tests` are its throughput rows, `latency_tests` its latency rows as (key, label, flow). The run's order is
  TESTS (the Python tier, then the compiled tier; system by system inside each) and LATENCY_TESTS.
- `start(ctx)` prepares its compiled client's input when the compiled tier runs, starts its server(s) on
  ephemeral ports under ctx.scratch and adds them to ctx.servers (stopped by `harness.stop_servers`).
- `throughput_spec(ctx, test, rep)` and `latency_spec(ctx, key)` say which worker flow (clients.WORKERS) a test
  runs against which server; `versions()` gives (server, Python client, compiled client) versions for the docs.

`run_throughput()` and `run_latency()` run one test in fresh worker processes and check what they moved.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from benchutil import console
from peers.clients import (
    REDIS_BENCH_CONNECTIONS,
    REDIS_BENCH_PIPELINE,
    REDIS_XRANGE_CONNECTIONS,
    REDIS_XRANGE_COUNT,
    REDIS_XRANGE_PIPELINE,
)
from peers.harness import (
    VALUE,
    Context,
    Processes,
    Server,
    debian_version,
    finish_worker,
    first_output_line,
    free_port,
    run_one,
    server_cpu_seconds,
    start_worker,
    system_busy_seconds,
    wait_for_line,
    wait_until,
)

VENV_BIN = Path(sys.executable).parent
NATSBENCH_SOURCE = Path(__file__).resolve().parent.parent / "natsbench"


@dataclass(frozen=True)
class Test:
    key: str
    system: str  # tidelog | redis | nats
    kind: str  # write | read
    label: str
    client: str
    tier: str = "python"  # python | compiled: ratios and targets compare a tidelog row with the peers of its tier


class System(Protocol):
    name: ClassVar[str]
    tools: ClassVar[dict[str, list[str]]]
    packages: ClassVar[dict[str, str]]
    tests: ClassVar[list[Test]]
    latency_tests: ClassVar[list[tuple[str, str, str]]]

    def start(self, ctx: Context) -> None: ...

    def throughput_spec(self, ctx: Context, test: Test, rep: int) -> dict[str, Any]: ...

    def latency_spec(self, ctx: Context, key: str) -> tuple[Server, str, dict[str, Any]]: ...

    def versions(self) -> tuple[str, str, str]: ...


# --- tidelog ---------------------------------------------------------------------------------------------------


class Tidelog:
    """`tidelog serve` twice: the default flush policy (acks=1, the consumer) and log.flush.interval.messages=1
    (acks=all waits for a group-commit fsync). Clients: confluent-kafka, and kcat."""

    name = "tidelog"
    tools: ClassVar[dict[str, list[str]]] = {"compiled": ["kcat"]}
    packages: ClassVar[dict[str, str]] = {}
    tests: ClassVar[list[Test]] = [
        Test("tidelog_acks1", "tidelog", "write", "tidelog produce, acks=1", "confluent-kafka"),
        Test(
            "tidelog_acksall", "tidelog", "write", "tidelog produce, acks=all + fsync group commit", "confluent-kafka"
        ),
        Test("tidelog_consume", "tidelog", "read", "tidelog consume (assign, from the beginning)", "confluent-kafka"),
        Test("tidelog_kcat_acks1", "tidelog", "write", "tidelog produce, acks=1", "kcat (C)", "compiled"),
        Test(
            "tidelog_kcat_acksall",
            "tidelog",
            "write",
            "tidelog produce, acks=all + fsync group commit",
            "kcat (C)",
            "compiled",
        ),
        Test("tidelog_kcat_consume", "tidelog", "read", "tidelog consume (from the beginning)", "kcat (C)", "compiled"),
    ]
    latency_tests: ClassVar[list[tuple[str, str, str]]] = [
        ("tidelog_acks1", "tidelog, acks=1", "librdkafka linger.ms=1 → poll() after assign"),
        ("tidelog_acksall", "tidelog, acks=all + fsync", "librdkafka linger.ms=1, acks=all → poll()"),
        (
            "tidelog_acksall1",
            "tidelog, acks=all + fsync, in-flight 1",
            "the same with max.in.flight.requests.per.connection=1 (librdkafka's default is 1000000)",
        ),
    ]

    def __init__(self) -> None:
        self.lines_file: Path | None = None  # the records as lines, kcat's input

    def start(self, ctx: Context) -> None:
        if "compiled" in ctx.args.clients:
            self.lines_file = self.write_lines_file(ctx.scratch / "records.txt", ctx.args.records)
        ctx.servers["tidelog"] = self.start_broker(ctx.procs, "tidelog", ctx.scratch / "tidelog", {})
        ctx.servers["tidelog-durable"] = self.start_broker(
            ctx.procs, "tidelog-durable", ctx.scratch / "tidelog-durable", {"log.flush.interval.messages": "1"}
        )

    @staticmethod
    def start_broker(procs: Processes, name: str, data: Path, overrides: dict[str, str]) -> Server:
        data.mkdir(parents=True)
        settings = {
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "log.dirs": str(data / "logs"),
            "group.initial.rebalance.delay.ms": "0",
            **overrides,
        }
        argv = [str(VENV_BIN / "tidelog"), "serve"]
        for key, value in settings.items():
            argv += ["--override", f"{key}={value}"]
        log_path = data / "broker.log"
        proc = procs.start(name, argv, subprocess.PIPE, log_path.open("w"))
        match = wait_for_line(proc, r"ready on port\(s\) (\d+)", 60, name)
        return Server(name, proc, int(match[1]), log_path, trouble=r"\b(WARNING|ERROR|CRITICAL|Traceback)\b")

    @staticmethod
    def write_lines_file(path: Path, records: int) -> Path:
        """The records as kcat -P reads them: one 100-byte value per line."""
        with path.open("wb") as out:
            chunk = (VALUE + b"\n") * 10_000
            for _ in range(records // 10_000):
                out.write(chunk)
            out.write((VALUE + b"\n") * (records % 10_000))
        return path

    def throughput_spec(self, ctx: Context, test: Test, rep: int) -> dict[str, Any]:
        servers = ctx.servers
        if test.key == "tidelog_acks1":
            broker = servers["tidelog"]
            return {"kind": "kafka_produce", "acks": "1", "topic": f"bench-acks1-{rep}", "broker": broker}
        if test.key == "tidelog_acksall":
            broker = servers["tidelog-durable"]
            return {"kind": "kafka_produce", "acks": "all", "topic": f"bench-acksall-{rep}", "broker": broker}
        if test.key == "tidelog_consume":
            return {"kind": "kafka_consume", "topic": f"bench-acks1-{rep}", "broker": servers["tidelog"]}
        kcat = {"lines_file": str(self.lines_file)}
        if test.key == "tidelog_kcat_acks1":
            broker = servers["tidelog"]
            return {**kcat, "kind": "kcat_produce", "acks": "1", "topic": f"kcat-acks1-{rep}", "broker": broker}
        if test.key == "tidelog_kcat_acksall":
            broker = servers["tidelog-durable"]
            return {**kcat, "kind": "kcat_produce", "acks": "all", "topic": f"kcat-acksall-{rep}", "broker": broker}
        return {"kind": "kcat_consume", "topic": f"kcat-acks1-{rep}", "broker": servers["tidelog"]}

    def latency_spec(self, ctx: Context, key: str) -> tuple[Server, str, dict[str, Any]]:
        if key == "tidelog_acks1":
            return ctx.servers["tidelog"], "kafka", {"acks": "1", "topic": f"latency-acks1-{ctx.worker_count}"}
        extra: dict[str, Any] = {"acks": "all", "topic": f"latency-{key}-{ctx.worker_count}"}
        if key == "tidelog_acksall1":
            extra["max_in_flight"] = 1
        return ctx.servers["tidelog-durable"], "kafka", extra

    def versions(self) -> tuple[str, str, str]:
        import confluent_kafka

        try:
            text = subprocess.run(["kcat", "-V"], capture_output=True, text=True, check=False).stdout
        except OSError:
            text = ""
        found = re.search(r"Version (\S+) .*?librdkafka (\S+)", text)
        kcat = f"{found[1]} (librdkafka {found[2]})" if found else "?"
        python = f"confluent-kafka {confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})"
        return "", python, f"kcat {kcat}"


# --- Redis Streams ---------------------------------------------------------------------------------------------


class RedisStreams:
    """Debian's redis-server with an fsync every second. Clients: redis-py, and redis-benchmark."""

    name = "redis"
    tools: ClassVar[dict[str, list[str]]] = {
        "python": ["redis-server"],
        "compiled": ["redis-server", "redis-benchmark"],
    }
    packages: ClassVar[dict[str, str]] = {"redis-benchmark": "redis-tools"}
    tests: ClassVar[list[Test]] = [
        Test("redis_xadd", "redis", "write", "Redis XADD, pipeline of 1000", "redis-py"),
        Test("redis_xread", "redis", "read", "Redis XREAD COUNT 10000", "redis-py"),
        Test(
            "redis_bench_xadd",
            "redis",
            "write",
            f"Redis XADD, pipeline {REDIS_BENCH_PIPELINE} x {REDIS_BENCH_CONNECTIONS} connections",
            "redis-benchmark (C)",
            "compiled",
        ),
        Test(
            "redis_bench_xrange",
            "redis",
            "read",
            f"Redis XRANGE COUNT {REDIS_XRANGE_COUNT}, pipeline {REDIS_XRANGE_PIPELINE} x {REDIS_XRANGE_CONNECTIONS} "
            "connections",
            "redis-benchmark (C)",
            "compiled",
        ),
    ]
    latency_tests: ClassVar[list[tuple[str, str, str]]] = [
        ("redis", "Redis Streams", "XADD one by one → XREAD BLOCK 200"),
    ]

    def start(self, ctx: Context) -> None:
        data = ctx.scratch / "redis"
        data.mkdir(parents=True)
        port = free_port()
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--appendonly", "yes"]
        argv += ["--appendfsync", "everysec", "--dir", str(data), "--save", "", "--protected-mode", "yes"]
        log_path = data / "redis.log"
        proc = ctx.procs.start("redis-server", argv, log_path.open("w"), subprocess.STDOUT)  # type: ignore[arg-type]

        def pong() -> bool:
            import redis

            return bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping())

        wait_until(pong, 30, "redis-server")
        # errors only: Redis always warns about vm.overcommit_memory on this VM
        ctx.servers["redis"] = Server("redis-server", proc, port, log_path, trouble=r"# (Error|FATAL)")

    def throughput_spec(self, ctx: Context, test: Test, rep: int) -> dict[str, Any]:
        kind = {"redis_bench_xadd": "redis_benchmark_xadd", "redis_bench_xrange": "redis_benchmark_xrange"}
        return {"kind": kind.get(test.key, test.key), "broker": ctx.servers["redis"]}

    def latency_spec(self, ctx: Context, key: str) -> tuple[Server, str, dict[str, Any]]:
        return ctx.servers["redis"], "redis", {}

    def versions(self) -> tuple[str, str, str]:
        import redis

        found = re.search(r"v=(\S+)", first_output_line(["redis-server", "--version"]))
        version = found[1] if found else "?"
        return f"redis-server {version}", f"redis-py {redis.__version__} (hiredis parser)", f"redis-benchmark {version}"


# --- NATS JetStream --------------------------------------------------------------------------------------------


class NatsJetStream:
    """Debian's nats-server -js (file storage). Clients: nats-py, and bench/natsbench (Go, nats.go), built here."""

    name = "nats"
    tools: ClassVar[dict[str, list[str]]] = {"python": ["nats-server"], "compiled": ["nats-server", "go"]}
    packages: ClassVar[dict[str, str]] = {"go": "golang-go golang-github-nats-io-go-nats-dev"}
    tests: ClassVar[list[Test]] = [
        Test("nats_publish", "nats", "write", "NATS publish_async, 4000 pending", "nats-py"),
        Test("nats_fetch", "nats", "read", "NATS pull fetch(10000), AckAll", "nats-py"),
        Test("nats_go_publish", "nats", "write", "NATS PublishAsync, 4000 pending", "nats.go (Go)", "compiled"),
        Test("nats_go_fetch", "nats", "read", "NATS pull Fetch(10000), AckAll", "nats.go (Go)", "compiled"),
    ]
    latency_tests: ClassVar[list[tuple[str, str, str]]] = [
        ("nats", "NATS JetStream", "publish_async → push consumer, AckNone"),
    ]

    def __init__(self) -> None:
        self.natsbench: Path | None = None  # the Go client, built for this run

    def start(self, ctx: Context) -> None:
        if "compiled" in ctx.args.clients:
            with console.status("building bench/natsbench (Go) …"):
                self.natsbench = self.build_natsbench(ctx.scratch)
        data = ctx.scratch / "nats"
        data.mkdir(parents=True)
        port = free_port()
        log_path = data / "nats.log"
        argv = ["nats-server", "-js", "-sd", str(data / "store"), "-a", "127.0.0.1", "-p", str(port)]
        proc = ctx.procs.start("nats-server", argv, log_path.open("w"), subprocess.STDOUT)  # type: ignore[arg-type]
        wait_until(lambda: "Server is ready" in log_path.read_text(errors="replace"), 30, "nats-server")
        ctx.servers["nats"] = Server("nats-server", proc, port, log_path, r"\[(ERR|FTL)\]", signal.SIGINT)

    @staticmethod
    def build_natsbench(scratch: Path) -> Path:
        """Build bench/natsbench with Debian's Go toolchain and nats.go (golang-go,
        golang-github-nats-io-go-nats-dev)."""
        binary = scratch / "natsbench"
        env = {**os.environ, "GO111MODULE": "off", "GOPATH": "/usr/share/gocode", "GOCACHE": str(scratch / "gocache")}
        built = subprocess.run(
            ["go", "build", "-o", str(binary), "."], cwd=NATSBENCH_SOURCE, env=env, capture_output=True, text=True
        )
        if built.returncode != 0:
            raise RuntimeError(f"building bench/natsbench failed:\n{built.stderr[-2000:]}")
        return binary

    def throughput_spec(self, ctx: Context, test: Test, rep: int) -> dict[str, Any]:
        broker = ctx.servers["nats"]
        if test.key == "nats_publish":
            return {"kind": "nats_publish", "broker": broker}
        if test.key == "nats_fetch":
            return {"kind": "nats_fetch", "durable": f"c{rep}", "broker": broker}
        flow = {"nats_go_publish": "publish", "nats_go_fetch": "fetch"}[test.key]
        return {
            "kind": "natsbench",
            "flow": flow,
            "durable": f"go{rep}",
            "natsbench": str(self.natsbench),
            "broker": broker,
        }

    def latency_spec(self, ctx: Context, key: str) -> tuple[Server, str, dict[str, Any]]:
        return ctx.servers["nats"], "nats", {}

    def versions(self) -> tuple[str, str, str]:
        import nats.aio.client

        server = first_output_line(["nats-server", "--version"]).split()[-1]
        go = first_output_line(["go", "version"])
        compiled = f"nats.go {debian_version('golang-github-nats-io-go-nats-dev')} ({go})"
        return f"nats-server {server}", f"nats-py {nats.aio.client.__version__}", compiled


# --- the registry ----------------------------------------------------------------------------------------------

SYSTEMS: dict[str, System] = {s.name: s for s in (Tidelog(), RedisStreams(), NatsJetStream())}
TESTS = [t for tier in ("python", "compiled") for s in SYSTEMS.values() for t in s.tests if t.tier == tier]
LATENCY_TESTS = [row for s in SYSTEMS.values() for row in s.latency_tests]
PEERS = {  # (direction, tier) -> (the Redis row, the NATS row) a tidelog row is compared with
    ("write", "python"): ("redis_xadd", "nats_publish"),
    ("read", "python"): ("redis_xread", "nats_fetch"),
    ("write", "compiled"): ("redis_bench_xadd", "nats_go_publish"),
    ("read", "compiled"): ("redis_bench_xrange", "nats_go_fetch"),
}


def versions() -> str:
    """Every system's server and client versions: servers; Python clients; compiled clients."""
    columns = zip(*(s.versions() for s in SYSTEMS.values()), strict=True)
    return "; ".join(", ".join(part for part in column if part) for column in columns)


# --- running one test ------------------------------------------------------------------------------------------


def worker_spec(spec: dict[str, Any], records: int) -> dict[str, Any]:
    broker: Server = spec.pop("broker")
    return {
        **spec,
        "records": records,
        "server_pid": broker.pid,
        "port": broker.port,
        "bootstrap": f"127.0.0.1:{broker.port}",
    }


def throughput_spec(ctx: Context, test: Test, rep: int) -> dict[str, Any]:
    return worker_spec(SYSTEMS[test.system].throughput_spec(ctx, test, rep), ctx.args.records)


def run_throughput(ctx: Context, test: Test, rep: int) -> dict[str, Any]:
    result = run_one(ctx, throughput_spec(ctx, test, rep), timeout=120 + ctx.args.records / 1000)
    check_count(test, ctx.args.records, result)
    return result


def check_count(test: Test, expected: int, result: dict[str, Any]) -> None:
    if result.get("at_least") and result["records"] >= expected:
        pass
    elif result["records"] != expected:
        raise RuntimeError(f"{test.label}: moved {result['records']} records, expected {expected}")
    if "stored" in result and result["stored"] != expected:
        raise RuntimeError(f"{test.label}: the server holds {result['stored']} records, expected {expected}")
    if result.get("undelivered"):
        raise RuntimeError(f"{test.label}: {result['undelivered']} records were never delivered")
    if result.get("errors"):
        raise RuntimeError(f"{test.label}: the consumer saw {result['errors']} errors")


def run_latency(ctx: Context, key: str) -> dict[str, Any]:
    args = ctx.args
    warmup = round(args.rate * args.warmup_seconds)
    total = warmup + round(args.rate * args.latency_seconds)
    base: dict[str, Any] = {"total": total, "warmup": warmup, "rate": args.rate}
    base["timeout"] = args.warmup_seconds + args.latency_seconds + 60
    broker, kinds, extra = SYSTEMS[key.split("_")[0]].latency_spec(ctx, key)
    spec = worker_spec({**base, **extra, "broker": broker}, 0)
    consumer, consumer_err = start_worker(ctx, {**spec, "kind": f"{kinds}_latency_consume"})
    assert consumer.stdout is not None
    try:
        wait_for_line(consumer, r"^READY", 60, f"{key} latency consumer")
    except RuntimeError:
        with contextlib.suppress(RuntimeError):
            finish_worker(ctx, consumer, consumer_err, 5)
        raise
    server_cpu = server_cpu_seconds(broker.pid)
    system_busy = system_busy_seconds()
    wall = time.perf_counter()
    produced = run_one(ctx, {**spec, "kind": f"{kinds}_latency_produce"}, timeout=base["timeout"] + 30)
    consumed = finish_worker(ctx, consumer, consumer_err, timeout=base["timeout"])
    wall = time.perf_counter() - wall
    result = {**consumed, **{f"producer_{k}": v for k, v in produced.items()}}
    result["server_cpu"] = 100 * (server_cpu_seconds(broker.pid) - server_cpu) / wall
    result["producer_cpu"] = 100 * produced["client_cpu_s"] / wall
    result["consumer_cpu"] = 100 * consumed["client_cpu_s"] / wall
    busy = 100 * (system_busy_seconds() - system_busy) / wall
    result["other_cpu"] = max(0.0, busy - result["server_cpu"] - result["producer_cpu"] - result["consumer_cpu"])
    result["expected"] = total
    return result
