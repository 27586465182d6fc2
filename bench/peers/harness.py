"""The harness of the broker benchmark (bench/broker_vs_peers.py): processes, ports, timing and CPU accounting,
with nothing specific to one system.

Contract:
- `Processes` owns every process a run starts (servers, worker processes, py-spy); `stop_all()` ends the ones
  still running, and a child gets SIGTERM if the benchmark dies (PR_SET_PDEATHSIG). What went wrong while
  stopping goes to `Processes.problems`, one line each (they are printed and written to the docs).
- A `Server` is a started server process on 127.0.0.1 with its port, its log file and the regular expression of
  the log lines that report trouble; `stop_servers()` stops them in start order and `scan_server_logs()`
  reports what they logged.
- A test's client runs in a fresh worker process: `bench/broker_vs_peers.py --worker JSON`, which prints
  `RESULT <json>` as its last line; `run_one()` starts one and returns that result (or raises with its stderr).
- `Meter` measures wall time and the CPU of the client and of one server between start() and stop();
  `settle()` waits for the rest of the machine to go quiet before a test.
- Records are RECORD_SIZE bytes; a latency record starts with STAMP (sequence number, CLOCK_MONOTONIC at the
  send call): `paced()` sends them at a steady rate, `LatencyRecorder` turns received ones into percentiles.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchutil import console

WORKER_SCRIPT = Path(__file__).resolve().parent.parent / "broker_vs_peers.py"
RECORD_SIZE = 100
VALUE = b"x" * RECORD_SIZE
STAMP = struct.Struct(">QQ")  # sequence number, CLOCK_MONOTONIC ns at the send call; then padding to 100 bytes
PAD = b"x" * (RECORD_SIZE - STAMP.size)
SLOW_STOP_SECONDS = 5.0  # a server that takes longer than this to stop after SIGTERM is reported
NOISE_CPU = 25.0  # % of a core used by the rest of the machine above which a figure is called disturbed


# --- measuring ------------------------------------------------------------------------------------------------


def server_cpu_seconds(pid: int) -> float:
    """utime+stime of a process (all its threads) from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def system_busy_seconds() -> float:
    """CPU time all processes spent busy, machine-wide (first line of /proc/stat)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def client_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_seconds() -> float:
    """CPU of the child processes this process has waited for (all their threads)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Meter:
    """Wall time, the client's CPU and a server's CPU between start() and stop(). The client is this process, or
    with `children=True` the compiled client it ran as a child process (waited for before stop())."""

    def __init__(self, server_pid: int, children: bool = False) -> None:
        self.server_pid = server_pid
        self.client_cpu_seconds = children_cpu_seconds if children else client_cpu_seconds

    def start(self) -> None:
        self._server = server_cpu_seconds(self.server_pid)
        self._client = self.client_cpu_seconds()
        self._thread = time.thread_time()
        self._system = system_busy_seconds()
        self._wall = time.perf_counter()

    def stop(self, records: int, **extra: Any) -> dict[str, Any]:
        wall = time.perf_counter() - self._wall
        client = 100 * (self.client_cpu_seconds() - self._client) / wall
        server = 100 * (server_cpu_seconds(self.server_pid) - self._server) / wall
        return {
            "records": records,
            "seconds": wall,
            "rate": records / wall,
            "client_cpu": client,
            "client_thread_cpu": 100 * (time.thread_time() - self._thread) / wall,  # the Python thread alone
            "server_cpu": server,
            # everything else on the machine (other processes, kernel threads such as writeback): noise
            "other_cpu": max(0.0, 100 * (system_busy_seconds() - self._system) / wall - client - server),
            **extra,
        }


def stamped(seq: int) -> bytes:
    return STAMP.pack(seq, time.monotonic_ns()) + PAD


def paced(total: int, rate: float, send: Any) -> dict[str, Any]:
    """Send records 0..total-1 at `rate` per second on average: at every wake-up, send(first, last) gets the
    sequence numbers that are due (usually one; a few after a late wake-up), then sleep until the next is due."""
    interval = 1e9 / rate
    start = time.monotonic_ns()
    i = 0
    worst_lag = 0.0
    wakeups = 0
    while i < total:
        now = time.monotonic_ns()
        due = min(total, int((now - start) / interval) + 1)
        if due > i:
            worst_lag = max(worst_lag, now - (start + i * interval))
            send(i, due)
            wakeups += 1
            i = due
        if i < total:
            wait = start + i * interval - time.monotonic_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
    seconds = (time.monotonic_ns() - start) / 1e9
    return {"sent": total, "send_rate": total / seconds, "worst_lag_ms": worst_lag / 1e6, "per_wakeup": total / wakeups}


class LatencyRecorder:
    def __init__(self, total: int, warmup: int) -> None:
        self.total = total
        self.warmup = warmup
        self.received = 0
        self.samples: list[int] = []
        self.bad = 0

    def add(self, value: bytes, now_ns: int) -> None:
        self.received += 1
        if len(value) != RECORD_SIZE:
            self.bad += 1
            return
        seq, sent = STAMP.unpack_from(value)
        if seq >= self.warmup:
            self.samples.append(now_ns - sent)

    @property
    def done(self) -> bool:
        return self.received >= self.total

    def summary(self) -> dict[str, Any]:
        import numpy as np

        result: dict[str, Any] = {"received": self.received, "measured": len(self.samples), "bad": self.bad}
        if self.samples:
            ms = np.asarray(self.samples, dtype=np.float64) / 1e6
            for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
                result[name] = float(np.percentile(ms, q))
            result["max"] = float(ms.max())
        return result


def ready() -> None:
    print("READY", flush=True)


# --- compiled clients: a worker runs the tool as a child process and measures it -------------------------------


def run_compiled(spec: dict[str, Any], argv: list[str], stdin: IO[bytes] | None = None) -> tuple[dict[str, Any], str]:
    """Run a compiled client to completion under a Meter; its stdout goes to /dev/null unless it is the result
    (natsbench), its stderr is returned. A non-zero exit status fails the test with the client's own message."""
    meter = Meter(spec["server_pid"], children=True)
    meter.start()
    proc = subprocess.run(
        argv,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE if spec.get("keep_stdout") else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
        timeout=600,
    )
    result = meter.stop(spec["records"])
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited with status {proc.returncode}: {stderr[-2000:]}")
    result["stdout"] = proc.stdout.decode() if proc.stdout else ""
    return result, stderr


# --- processes: servers and workers, always stopped ----------------------------------------------------------


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the benchmark process dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Processes:
    """Every process this benchmark starts; stop_all() ends them (SIGTERM, then SIGKILL after a grace period)."""

    def __init__(self) -> None:
        self._running: list[tuple[str, subprocess.Popen[str]]] = []
        self.problems: list[str] = []  # one line each: they go into docs/benchmarks.md too
        self.details: dict[str, str] = {}  # the same with a traceback, for the console

    def start(self, name: str, argv: list[str], stdout: Any, stderr: IO[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            text=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, and we stop them in order
            preexec_fn=_die_with_parent,
        )
        self._running.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen[str], grace: float = 60.0, signum: int = signal.SIGTERM) -> int:
        name = next((n for n, p in self._running if p is proc), str(proc.args))
        if proc.poll() is None:
            proc.send_signal(signum)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.problems.append(f"{name} (pid {proc.pid}) ignored SIGTERM for {grace:.0f} s and was killed")
                proc.kill()
                proc.wait()
        self._running = [(n, p) for n, p in self._running if p is not proc]
        return proc.returncode

    def stop_all(self) -> None:
        for _, proc in reversed(list(self._running)):
            self.stop(proc)


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[str]
    port: int
    log_path: Path
    trouble: str  # a regular expression matching the log lines that report a problem
    stop_signal: int = signal.SIGTERM  # nats-server exits with status 1 on SIGTERM, 0 on SIGINT

    @property
    def pid(self) -> int:
        return self.proc.pid


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_line(proc: subprocess.Popen[str], pattern: str, timeout: float, what: str) -> re.Match[str]:
    """Read proc's stdout until a line matches (the process keeps writing to the pipe; we drain it later)."""
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    seen = []
    try:
        while time.monotonic() < deadline:
            if not selector.select(max(0.0, deadline - time.monotonic())):
                break
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line.rstrip())
            match = re.search(pattern, line)
            if match:
                return match
    finally:
        selector.close()
    tail = "\n".join(seen[-10:])
    raise RuntimeError(f"{what} did not become ready (exit status {proc.poll()}); its output:\n{tail}")


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not become ready within {timeout:.0f} s")


@dataclass
class Context:
    """One run: its options, its processes, its scratch directory and the servers started in it (by name)."""

    args: argparse.Namespace
    procs: Processes
    scratch: Path
    servers: dict[str, Server] = field(default_factory=dict)
    worker_count: int = 0
    revision: str = ""  # of the tidelog sources the brokers were started from (src/ may change during a run)


def start_worker(ctx: Context, spec: dict[str, Any]) -> tuple[subprocess.Popen[str], Path]:
    ctx.worker_count += 1
    err_path = ctx.scratch / f"worker-{ctx.worker_count:03d}-{spec['kind']}.err"
    argv = [sys.executable, str(WORKER_SCRIPT), "--worker", json.dumps(spec)]
    proc = ctx.procs.start(f"worker {spec['kind']}", argv, subprocess.PIPE, err_path.open("w"))
    return proc, err_path


def finish_worker(ctx: Context, proc: subprocess.Popen[str], err_path: Path, timeout: float) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        ctx.procs.stop(proc, grace=5)
        raise RuntimeError(f"{proc.args[3][:80]}… did not finish within {timeout:.0f} s") from None
    ctx.procs.stop(proc)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = err_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"worker {json.loads(proc.args[3])['kind']} failed (status {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len("RESULT ") :])


def run_one(ctx: Context, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    proc, err_path = start_worker(ctx, spec)
    return finish_worker(ctx, proc, err_path, timeout)


def settle(ctx: Context) -> None:
    """Before a test: write back dirty pages of the previous one, then wait (up to --quiet-wait seconds) for a
    second in which the rest of the machine uses less than NOISE_CPU (this box is shared with other work)."""
    os.sync()
    deadline = time.monotonic() + ctx.args.quiet_wait
    busy = 0.0
    while True:
        before = system_busy_seconds()
        time.sleep(0.5)
        busy = 100 * (system_busy_seconds() - before) / 0.5
        if busy < NOISE_CPU or time.monotonic() >= deadline:
            break
    if busy >= NOISE_CPU:
        console.print(
            f"  (the machine is still busy, {busy:.0f} % of a core, after {ctx.args.quiet_wait:g} s: going on)"
        )


def stop_servers(ctx: Context) -> None:
    """Stop every server of the run in start order; a bad exit status or a slow stop goes to the problems."""
    procs = ctx.procs
    for server in ctx.servers.values():
        signame = signal.Signals(server.stop_signal).name
        stopping = time.monotonic()
        status = procs.stop(server.proc, signum=server.stop_signal)
        took = time.monotonic() - stopping
        if status != 0:
            procs.problems.append(f"{server.name} exited with status {status} after {signame}")
        if took > SLOW_STOP_SECONDS:
            procs.problems.append(f"{server.name} took {took:.1f} s to stop after {signame}")


def scan_server_logs(servers: dict[str, Server]) -> list[tuple[str, str]]:
    """Warnings and errors the servers logged, as (one line, the first report with its traceback). A log with
    any is copied out of the scratch directory (removed at the end) so it can be read afterwards."""
    problems = []
    keep_dir = Path(tempfile.gettempdir()) / f"broker-vs-peers-logs-{time.strftime('%Y%m%d-%H%M%S')}"
    for server in servers.values():
        if not server.log_path.exists():
            continue
        lines = server.log_path.read_text(errors="replace").splitlines()
        bad = [i for i, line in enumerate(lines) if re.search(server.trouble, line)]
        if not bad:
            continue
        keep_dir.mkdir(parents=True, exist_ok=True)
        kept = keep_dir / f"{server.name}.log"
        shutil.copyfile(server.log_path, kept)
        first = lines[bad[0] : bad[0] + 25]  # the first report with its traceback
        kinds = sorted({re.sub(r"^\S+ \S+ ", "", lines[i]).strip() for i in bad if "Traceback" not in lines[i]})
        short = f"{server.name} logged {len(bad)} warning/error line(s): " + "; ".join(kinds[:3])
        problems.append((short, f"{short}\n  full log kept in {kept}; the first report:\n    " + "\n    ".join(first)))
    return problems


def first_output_line(argv: list[str]) -> str:
    """The first line a command prints (a version), "?" when it cannot run or prints nothing."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return "?"


def debian_version(package: str) -> str:
    shown = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    return shown.stdout.strip() or "?"
