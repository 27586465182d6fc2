"""How long admin work (creating, growing and deleting a topic of many partitions) stalls the broker's event loop.

    .venv/bin/python bench/admin_stall.py                   # 1,000 partitions created, grown to 2,000, deleted
    .venv/bin/python bench/admin_stall.py --partitions 200  # a quick, smaller run
    .venv/bin/python bench/admin_stall.py --write-report    # also write its section of docs/benchmarks.md
    PYTHONPATH=/elsewhere/src .venv/bin/python bench/admin_stall.py   # the broker of another checkout
    .venv/bin/python bench/admin_stall.py --baseline /old/checkout/src   # before and after, in one run

One `tidelog serve` subprocess (`python -m tidelog.cli serve` with this interpreter, so the tidelog package
PYTHONPATH points to is the one measured) with default settings, an ephemeral port on 127.0.0.1, its log dir in
a fresh temp directory and its open-file limit raised to the hard limit (every partition keeps files open).
A client thread sends Kafka Heartbeat requests for a group that does not exist back to back on one connection
(the broker answers from memory: a request that costs the loop almost nothing) and times every round trip. The
main thread sends the admin requests on a second connection. Phases:

  idle              IDLE_SECONDS of heartbeats alone: the reference, measured in the same run
  CreateTopics      a topic with half the partitions (1,000), while the request is in flight
  CreatePartitions  the topic grown to --partitions (2,000), while the request is in flight
  DeleteTopics      the topic deleted, while the request is in flight

A round trip counts in the phase its interval overlaps (the pauses of PAUSE_SECONDS between phases count
nowhere). A heartbeat that arrives while the loop is busy waits, so a stall shows as one long round trip: max is
the longest stall, and a phase with few round trips spent most of its time stalled. For each phase the script
prints p50/p99/max and its p99 ÷ the idle p99. With --baseline, the same run is made first with the broker of
that source tree (PYTHONPATH) and then with this one, so a before/after comparison shares the machine's state.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import io
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from kio.schema.create_partitions.v3.request import CreatePartitionsRequest, CreatePartitionsTopic
from kio.schema.create_partitions.v3.response import CreatePartitionsResponse
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.create_topics.v7.response import CreateTopicsResponse
from kio.schema.delete_topics.v5.request import DeleteTopicsRequest
from kio.schema.delete_topics.v5.response import DeleteTopicsResponse
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.heartbeat.v4.response import HeartbeatResponse
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i32Timedelta

from benchutil import (
    BENCHMARKS_MD,
    REPO,
    add_dir_argument,
    console,
    filesystem_type,
    machine_line,
    new_table,
    run_quiet,
    scratch_dir,
    write_doc_section,
)

SECTION_HEADING = "## Admin work and the event loop"
TOPIC = "admin-stall"
IDLE_SECONDS = 5.0
WARMUP_SECONDS = 1.0  # heartbeats before the idle phase, not counted (connection, caches)
PAUSE_SECONDS = 1.0  # between phases, not counted
START_TIMEOUT_S = 60.0
ADMIN_TIMEOUT = datetime.timedelta(minutes=10)  # the admin requests' own timeout field, and the client's wait
_CHECKOUT_OF_BASELINE = "<a checkout of the Before commit>/src"
READY = re.compile(r"tidelog broker ready on port\(s\) (\d+)")
SIZE = struct.Struct(">i")


# --- the wire: one request at a time on a blocking socket, frames written and read by kio ----------------------


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=ADMIN_TIMEOUT.total_seconds() + 60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request_frame(body: Any, correlation_id: int) -> bytes:
    """`size | header | body` for a kio request entity (the header version its class names)."""
    header_cls = type(body).__header_schema__
    header = header_cls(
        request_api_key=body.__api_key__,
        request_api_version=body.__version__,
        correlation_id=i32(correlation_id),
        client_id="admin-stall",
    )
    buffer = io.BytesIO()
    entity_writer(header_cls)(buffer, header)
    entity_writer(type(body))(buffer, body)
    payload = buffer.getvalue()
    return SIZE.pack(len(payload)) + payload


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


def read_frame(sock: socket.socket) -> bytes:
    (size,) = SIZE.unpack(read_exactly(sock, 4))
    return read_exactly(sock, size)


def decode(response_cls: Any, payload: bytes, correlation_id: int) -> Any:
    header, offset = entity_reader(response_cls.__header_schema__)(payload, 0)
    if header.correlation_id != correlation_id:
        raise RuntimeError(f"answer to request {header.correlation_id}, expected {correlation_id}")
    response, _ = entity_reader(response_cls)(payload, offset)
    return response


class AdminClient:
    """CreateTopics, CreatePartitions and DeleteTopics on their own connection; each raises on an error code."""

    def __init__(self, port: int) -> None:
        self.sock = connect(port)
        self.correlation_id = 0
        self.timeout = i32Timedelta.parse(ADMIN_TIMEOUT)

    def call(self, body: Any, response_cls: Any) -> Any:
        self.correlation_id += 1
        self.sock.sendall(request_frame(body, self.correlation_id))
        return decode(response_cls, read_frame(self.sock), self.correlation_id)

    def create_topic(self, name: str, partitions: int) -> None:
        topic = CreatableTopic(
            name=name, num_partitions=i32(partitions), replication_factor=i16(1), assignments=(), configs=()
        )
        body = CreateTopicsRequest(topics=(topic,), timeout=self.timeout, validate_only=False)
        check("CreateTopics", self.call(body, CreateTopicsResponse).topics)

    def create_partitions(self, name: str, total: int) -> None:
        topic = CreatePartitionsTopic(name=name, count=i32(total), assignments=None)
        body = CreatePartitionsRequest(topics=(topic,), timeout=self.timeout, validate_only=False)
        check("CreatePartitions", self.call(body, CreatePartitionsResponse).results)

    def delete_topic(self, name: str) -> None:
        body = DeleteTopicsRequest(topic_names=(name,), timeout=self.timeout)
        check("DeleteTopics", self.call(body, DeleteTopicsResponse).responses)

    def close(self) -> None:
        self.sock.close()


def check(api: str, results: Any) -> None:
    for result in results:
        if result.error_code.value != 0:
            raise RuntimeError(f"{api} of {result.name}: {result.error_code.name} ({result.error_message})")


class Heartbeats(threading.Thread):
    """Heartbeat v4 for a group that does not exist, back to back on one connection: the start of every round trip
    and its duration (perf_counter ns), until stop()."""

    def __init__(self, port: int) -> None:
        super().__init__(name="heartbeats", daemon=True)
        self.sock = connect(port)
        self.frame = request_frame(HeartbeatRequest(group_id="admin-stall", generation_id=i32(-1), member_id=""), 1)
        self.sent: list[int] = []
        self.rtt: list[int] = []
        self.answer = ""  # the broker's error code for these heartbeats
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        sock, frame, sent, rtt, clock = self.sock, self.frame, self.sent, self.rtt, time.perf_counter_ns
        known = b""  # an answer already checked: the same bytes again need no decoding
        try:
            while not self._stopping.is_set():
                start = clock()
                sock.sendall(frame)
                payload = read_frame(sock)
                end = clock()
                if payload != known:
                    self.answer = decode(HeartbeatResponse, payload, 1).error_code.name.upper()
                    known = payload
                sent.append(start)
                rtt.append(end - start)
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def stop(self) -> None:
        self._stopping.set()
        self.join(ADMIN_TIMEOUT.total_seconds())
        self.sock.close()
        if self.error is not None:
            raise RuntimeError(f"the heartbeat connection failed: {self.error!r}") from self.error


# --- the broker ------------------------------------------------------------------------------------------------


def _child_setup() -> None:
    """In the broker before exec: the open-file limit raised to the hard limit (2,000 partitions keep about 10,000
    files open), and SIGTERM when this script dies."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Broker:
    proc: subprocess.Popen[bytes]
    port: int
    stdout: Path
    stderr: Path

    @classmethod
    def start(cls, scratch: Path, pythonpath: str | None = None) -> Broker:
        argv = [sys.executable, "-m", "tidelog.cli", "serve"]
        env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
        argv += ["--override", "listeners=PLAINTEXT://127.0.0.1:0", "--override", f"log.dirs={scratch / 'logs'}"]
        stdout, stderr = scratch / "broker.out", scratch / "broker.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                preexec_fn=_child_setup,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            found = READY.search(stdout.read_text(errors="replace"))
            if found:
                return cls(proc, int(found[1]), stdout, stderr)
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        tail = stderr.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the broker did not start (exit status {proc.returncode}): {' '.join(argv)}\n{tail}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def trouble(self) -> list[str]:
        """The lines of its stderr that report a warning or an error."""
        lines = self.stderr.read_text(errors="replace").splitlines()
        return [line for line in lines if re.search(r"\b(WARNING|ERROR|CRITICAL|Traceback)\b", line)]


def tidelog_under_test(pythonpath: str | None = None) -> str:
    """The tidelog package the broker imports (this interpreter's, or the one under `pythonpath`) and its commit,
    when it is a checkout."""
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    found = subprocess.run(
        [sys.executable, "-c", "import tidelog; print(tidelog.__file__)"],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    package = Path(found.stdout.strip()).parent
    try:
        top = run_quiet(["git", "-C", str(package), "rev-parse", "--show-toplevel"]).stdout.strip()
        commit = run_quiet(["git", "-C", top, "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = run_quiet(["git", "--no-optional-locks", "-C", top, "status", "--porcelain", "--", str(package)])
    except (OSError, subprocess.CalledProcessError):
        return f"from {package} (not a git checkout)"
    return f"commit {commit}{' +changes' if dirty.stdout.strip() else ''}"


# --- the run ---------------------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    start: int  # perf_counter ns
    end: int
    admin_seconds: float | None = None  # how long its admin request took


def run_phases(port: int, partitions: int) -> tuple[list[Phase], Heartbeats]:
    first = max(1, partitions // 2)
    heartbeats = Heartbeats(port)
    admin = AdminClient(port)
    phases = []
    heartbeats.start()
    try:
        time.sleep(WARMUP_SECONDS)
        start = time.perf_counter_ns()
        time.sleep(IDLE_SECONDS)
        phases.append(Phase("idle", start, time.perf_counter_ns()))
        steps = [
            (f"CreateTopics, {first:,} partitions", lambda: admin.create_topic(TOPIC, first)),
            (f"CreatePartitions, {first:,} → {partitions:,}", lambda: admin.create_partitions(TOPIC, partitions)),
            (f"DeleteTopics, {partitions:,} partitions", lambda: admin.delete_topic(TOPIC)),
        ]
        for name, step in steps:
            time.sleep(PAUSE_SECONDS)
            with console.status(f"{name} …"):
                start = time.perf_counter_ns()
                step()
                end = time.perf_counter_ns()
            phases.append(Phase(name, start, end, (end - start) / 1e9))
            console.print(f"{name}: {(end - start) / 1e9:.2f} s")
    finally:
        heartbeats.stop()
        admin.close()
    return phases, heartbeats


def phase_rows(phases: list[Phase], heartbeats: Heartbeats) -> list[dict[str, Any]]:
    """p50/p99/max of the round trips overlapping each phase (one overlapping two phases counts in the later)."""
    sent = np.asarray(heartbeats.sent, dtype=np.int64)
    rtt = np.asarray(heartbeats.rtt, dtype=np.int64)
    owner = np.full(len(sent), -1)
    for index, phase in enumerate(phases):
        owner[(sent < phase.end) & (sent + rtt > phase.start)] = index
    rows = []
    for index, phase in enumerate(phases):
        ms = rtt[owner == index] / 1e6
        if not len(ms):
            raise RuntimeError(f"no heartbeat round trip overlaps the phase {phase.name}")
        row = {"phase": phase.name, "admin_s": phase.admin_seconds, "n": len(ms), "max": float(ms.max())}
        row |= {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}
        rows.append(row)
    for row in rows:
        row["ratio"] = row["p99"] / rows[0]["p99"]
    return rows


COLUMNS = ("phase", "admin request", "round trips", "p50 ms", "p99 ms", "max ms", "p99 ÷ idle p99", "max ÷ request")


def ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def cells(row: dict[str, Any]) -> list[str]:
    figures = [row["phase"], "–", f"{row['n']:,}", ms(row["p50"]), ms(row["p99"]), ms(row["max"])]
    if row["admin_s"] is None:
        return [*figures, "1 (reference)", "–"]
    figures[1] = f"{row['admin_s']:.2f} s"
    ratio = f"{row['ratio']:,.0f}x" if row["ratio"] >= 10 else f"{row['ratio']:.1f}x"
    return [*figures, ratio, f"{row['max'] / 10 / row['admin_s']:.0f} %"]


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """The admin requests during which the loop answered nothing for most of the request."""
    notes = []
    for row in rows[1:]:
        share = row["max"] / 1000 / row["admin_s"]
        if share >= 0.5:
            notes.append(
                f"{row['phase']}: no heartbeat was answered for {row['max'] / 1000:.1f} s, {100 * share:.0f} % of "
                "the request's time: the event loop served no other request while it ran."
            )
    return notes


def markdown_table(rows: list[dict[str, Any]]) -> str:
    table = ["| " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * (len(COLUMNS) - 1)]
    table += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return "\n".join(table) + "\n" + "".join(f"\n- {note}" for note in findings(rows))


def markdown_section(runs: list[Run], facts: dict[str, str]) -> str:
    tables = "\n".join(
        f"{run.label}: the broker of tidelog {run.revision}.\n\n{markdown_table(run.rows)}" for run in runs
    )
    return f"""{SECTION_HEADING}

```
make bench-admin-stall     # = .venv/bin/python bench/admin_stall.py --write-report
```

How much admin work stalls the broker's event loop. One `tidelog serve` (default settings, Kafka engine, log dir in
a fresh temp directory); a client thread sends Heartbeat requests for a group that does not exist (answered from
memory, {facts["answer"]}) back to back on one connection and times each round trip, while the main thread sends
CreateTopics, CreatePartitions and DeleteTopics on a second connection. Idle is {IDLE_SECONDS:g} s of heartbeats
alone, the reference from the same run; each admin phase lasts while its request is in flight, and a round trip
counts in the phase it overlaps. A heartbeat that arrives while the loop is busy waits, so a stall shows as one
long round trip: max is the longest stall, and "max ÷ request" is the share of the admin request's time the loop
spent in that one stall (near 100 %: the whole request ran on the loop without yielding). Off the loop, an admin
request shares the interpreter (the GIL) with a loop that keeps answering thousands of heartbeats a second, so the
request itself may take longer than when it stalled everything else.
`--partitions N` runs a smaller version; `--baseline /other/checkout/src` measures that checkout's broker first,
in the same run, for a before/after comparison.

Command: `{facts["command"]}`, run {facts["started"]}.
Machine: {facts["machine"]}, data on {facts["filesystem"]}.
Load average {facts["load"]} at the start (the cores are shared by the broker, the heartbeat client and whatever
else runs on the machine).

{tables}"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--partitions",
        type=int,
        default=2000,
        help="partitions of the topic at its largest: created with half, grown to all (default 2000)",
    )
    parser.add_argument(
        "--write-report",
        action="store_true",
        help=f"write (or replace) the section “{SECTION_HEADING[3:]}” of {BENCHMARKS_MD.relative_to(REPO)}",
    )
    parser.add_argument(
        "--baseline",
        metavar="SRC",
        help="a source tree (its src/ directory) whose broker is measured first, as the before of a comparison",
    )
    add_dir_argument(parser)
    args = parser.parse_args(argv)
    if args.partitions < 2:
        parser.error("--partitions must be at least 2")
    return args


@dataclass
class Run:
    label: str
    revision: str
    rows: list[dict[str, Any]]
    answer: str


def measure(label: str, scratch: Path, partitions: int, pythonpath: str | None) -> Run:
    """One broker, the four phases, the table printed."""
    revision = tidelog_under_test(pythonpath)
    console.print(f"{label}: tidelog {revision}")
    broker = Broker.start(scratch, pythonpath)
    try:
        phases, heartbeats = run_phases(broker.port, partitions)
    finally:
        status = broker.stop()
    trouble = broker.trouble()
    rows = phase_rows(phases, heartbeats)
    title = f"{label}: heartbeat round trips on one connection (the broker answers {heartbeats.answer})"
    table = new_table(title, *COLUMNS)
    for row in rows:
        table.add_row(*cells(row))
    console.print(table)
    for note in findings(rows):
        console.print(f"• {note}")
    if status != 0:
        console.print(f"note: the broker exited with status {status} after SIGTERM")
    if trouble:
        console.print(f"note: the broker logged {len(trouble)} warning/error line(s), the first: {trouble[0]}")
    return Run(label, revision, rows, heartbeats.answer)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: the broker is stopped
    shown = [_CHECKOUT_OF_BASELINE if args.baseline and a == args.baseline else a for a in (argv or sys.argv[1:])]
    command = "python bench/admin_stall.py" + "".join(f" {a}" for a in shown)  # no local paths in the report
    facts = {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_line(),
        "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    plan = [("Before", str(Path(args.baseline).resolve())), ("After", None)] if args.baseline else [("This", None)]
    runs = []
    for label, pythonpath in plan:
        with scratch_dir(args.dir, 64 << 20, "tidelog-admin-stall-") as scratch:
            facts["filesystem"] = filesystem_type(scratch)
            runs.append(measure(label, scratch, args.partitions, pythonpath))
    facts["answer"] = runs[-1].answer
    if args.write_report:
        action = write_doc_section(BENCHMARKS_MD, SECTION_HEADING, markdown_section(runs, facts))
        console.print(f"{action} the section “{SECTION_HEADING[3:]}” in {BENCHMARKS_MD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
