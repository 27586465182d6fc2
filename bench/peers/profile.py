"""Profiling the tidelog broker during the broker benchmark (`--profile DIR`): untimed extra runs of the tidelog
tests with py-spy attached to the broker.

Contract: `profile_broker(ctx, out_dir)` reruns each tidelog throughput test of the selected client tiers (and
the tidelog latency tests unless --no-latency) once, each under `py-spy record --format raw` into out_dir, and
returns one entry per run with its result, py-spy's sample counts and the busy samples' own time by function and
by area of the code; `print_profiles()` prints them as tables. Samples of threads waiting (epoll_wait, idle pool
threads) are counted apart, since py-spy --nonblocking cannot always tell they are idle.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchutil import console, new_table
from peers.harness import Context, run_one, settle
from peers.systems import LATENCY_TESTS, TESTS, VENV_BIN, run_latency, throughput_spec

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def start_py_spy(ctx: Context, pid: int, out: Path) -> subprocess.Popen[str]:
    py_spy = shutil.which("py-spy", path=str(VENV_BIN)) or shutil.which("py-spy")
    if py_spy is None:
        raise RuntimeError(f"py-spy not found: {VENV_BIN / 'pip'} install py-spy")
    argv = [py_spy, "record", "-p", str(pid), "--nonblocking", "--rate", "250", "--format", "raw", "-o", str(out)]
    proc = ctx.procs.start("py-spy", argv, subprocess.DEVNULL, (out.with_suffix(".err")).open("w"))
    time.sleep(1.0)  # let it attach
    return proc


def stop_py_spy(ctx: Context, proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
    try:
        proc.wait(60)
    finally:
        ctx.procs.stop(proc, grace=5)


def short_frame(frame: str) -> tuple[str, str]:
    match = FRAME.match(frame.strip())
    if match is None:
        return frame, ""
    path = match["file"]
    for marker in ("/site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    location = f"{path}:{match['line']}" if match["line"] else path
    return match["func"], location


BROKER_FILES = {"server.py", "produce.py", "fetch.py", "groups.py", "run.py", "topics.py", "metrics.py", "cli.py"}
SYSCALL_LEAVES = {  # asyncio/selectors functions whose own time is a system call
    "_SelectorSocketTransport.write": "socket send (transport.write)",
    "_UnixSelectorEventLoop._sock_sendfile_native_impl": "sendfile",
    "_SelectorSocketTransport._read_ready__data_received": "socket recv",
}


WAITING_LEAVES = {  # frames where a thread sleeps: py-spy --nonblocking cannot always tell they are idle
    ("EpollSelector.select", "selectors.py:468"),  # the event loop in epoll_wait
    ("_worker", "concurrent/futures/thread.py:81"),  # a pool thread waiting for work
}


def is_waiting(func: str, location: str) -> bool:
    return (func, location) in WAITING_LEAVES or func in ("Condition.wait", "Event.wait")


def area_of(func: str, location: str) -> str:
    """A coarse bucket for a leaf frame (py-spy loses the outer frames of coroutines, so buckets by leaf are
    more trustworthy than inclusive times)."""
    path = location.rsplit(":", 1)[0]
    if func in SYSCALL_LEAVES:
        return SYSCALL_LEAVES[func]
    for prefix, name in (
        ("prometheus_client/", "prometheus_client (metrics)"),
        ("kio/", "kio (protocol (de)serialisation)"),
        ("tidelog/protocol/", "tidelog.protocol"),
        ("tidelog/codec/", "tidelog.codec"),
        ("tidelog/storage/", "tidelog.storage (incl. fsync/msync)"),
        ("concurrent/", "thread pool hand-off"),
        ("threading.py", "thread pool hand-off"),
        ("asyncio/", "asyncio (event loop, streams)"),
        ("selectors.py", "asyncio (event loop, streams)"),
    ):
        if path.startswith(prefix):
            return name
    if path in BROKER_FILES or path.startswith("tidelog/broker/"):
        return "tidelog.broker"
    return "other"


def hot_spots(raw: Path, top: int) -> tuple[int, int, list[tuple[str, str, float]], list[tuple[str, float]]]:
    """(samples, of which waiting, top self-time frames, self time by area) from py-spy's raw (collapsed stacks)
    output; the shares are of the samples that were not waiting (epoll_wait, idle pool threads)."""
    own: Counter[tuple[str, str]] = Counter()
    areas: Counter[str] = Counter()
    total = waiting = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [short_frame(f) for f in stack.split(";")]
        frames = [f for f in frames if not f[0].startswith(("process ", "thread "))]
        if not frames:
            continue
        count = int(count_text)
        total += count
        if is_waiting(*frames[-1]):
            waiting += count
            continue
        own[frames[-1]] += count
        areas[area_of(*frames[-1])] += count
    busy = total - waiting
    if not busy:
        return total, waiting, [], []
    self_rows = [(f, loc, 100 * n / busy) for (f, loc), n in own.most_common(top)]
    area_rows = [(name, 100 * n / busy) for name, n in areas.most_common()]
    return total, waiting, self_rows, area_rows


def profile_broker(ctx: Context, out_dir: Path) -> list[dict[str, Any]]:
    """Untimed extra runs of the tidelog tests with py-spy attached to the broker; one entry per phase."""
    out_dir.mkdir(parents=True, exist_ok=True)
    phases = []
    runs: list[tuple[str, str, Any]] = []
    for test in [t for t in TESTS if t.system == "tidelog" and t.tier in ctx.args.clients]:
        spec = throughput_spec(ctx, test, 999)
        runs.append((test.key, test.label, lambda spec=spec: run_one(ctx, spec, 300 + ctx.args.records / 500)))
    if not ctx.args.no_latency:
        for key, label, _ in LATENCY_TESTS[:3]:
            runs.append(
                (f"latency_{key}", f"latency at {ctx.args.rate:,} msg/s, {label}", lambda k=key: run_latency(ctx, k))
            )
    for key, label, run in runs:
        server = ctx.servers["tidelog-durable" if "acksall" in key else "tidelog"]
        raw = out_dir / f"broker-{key}.txt"
        settle(ctx)
        spy = start_py_spy(ctx, server.pid, raw)
        try:
            result = run()
        finally:
            stop_py_spy(ctx, spy)
        samples, waiting, self_rows, area_rows = hot_spots(raw, ctx.args.profile_top)
        phases.append(
            {
                "label": label,
                "result": result,
                "raw": raw,
                "samples": samples,
                "waiting": waiting,
                "self": self_rows,
                "areas": area_rows,
            }
        )
    return phases


def print_profiles(phases: list[dict[str, Any]]) -> None:
    for phase in phases:
        result = phase["result"]
        if "rate" in result:
            figures = f"{result['rate'] / 1000:.0f}k rec/s under py-spy, broker CPU {result['server_cpu']:.0f} %"
        else:
            figures = f"p50 {result.get('p50', 0):.2f} ms under py-spy, broker CPU {result['server_cpu']:.0f} %"
        title = (
            f"broker hot spots, {phase['label']} ({figures}; {phase['samples']} samples, {phase['waiting']} of "
            f"them waiting in epoll/queues and left out; {phase['raw']})"
        )
        table = new_table(title, "function (own time)", "file:line", "% of busy samples")
        for func, location, share in phase["self"]:
            table.add_row(func, location, f"{share:.1f}")
        console.print(table)
        console.print("  own time by area: " + ", ".join(f"{area} {share:.0f} %" for area, share in phase["areas"]))
