"""`tidelog demo` (what `make demo` runs) end to end on a short run through a real `tidelog serve`, and its
deadline: a demo stuck in a call that never returns still stops by itself, says where it was stuck, and stops
the broker it started. `tidelog demo --cluster` end to end on a short run: ZooKeeper, three brokers, a leader
killed mid-stream."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.spark import demo
from tidelog.tools import cluster_demo
from tidelog.tools.cluster_up import zookeeper_missing


def test_the_demo_end_to_end(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "demo"
    started = time.monotonic()
    code = demo.run(data, seconds=2, rate=200)
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 0, out
    assert took < demo.DEADLINE_S
    # not a terminal: plain status lines while it streams, not only a final frame
    status = [line for line in out.splitlines() if "produced" in line and "windows written" in line]
    assert len(status) >= 2, out
    assert "every window counted, none twice" in out
    windows = spark.read.parquet(str(data / "windows.parquet"))
    reader = spark.read.format("tidelog").option("subscribe", "page_visits_per_window")
    results = reader.option("kafka.isolation.level", "read_committed").load(str(data / "broker"))
    assert windows.count() == results.count() > 0
    assert "committed, each micro-batch once: the exactly-once sink" in out
    assert {json.loads(r.value)["page"] for r in results.collect()} <= set(demo.PAGES)
    # stopped cleanly: the query, the broker (its lock on the log directory is released), not our Spark session
    assert "tidelog serve stopped cleanly" in out
    assert not spark.streams.active
    with tidelog.open(data / "broker", background=False) as log:  # the records and a COMMIT marker per batch
        assert log.log_end_offset("page_visits_per_window", 0) > results.count()
        assert log.partition("page_visits_per_window", 0).last_stable_offset == log.log_end_offset(
            "page_visits_per_window", 0
        )
    assert spark.range(3).count() == 3


def test_a_slow_demo_is_cut_short_at_its_deadline(spark: Any, tmp_path: Path, capsys: Any) -> None:
    """Producing for a minute does not fit a deadline 6 s past the time kept for the report: the stream stops
    early, the report still runs, and the run says its results are partial."""
    started = time.monotonic()
    code = demo.run(tmp_path / "demo", seconds=60, rate=50, deadline_s=demo.STOP_RESERVE_S + 6)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "the demo's deadline (46 s) came before the last window closed" in out
    assert "tidelog serve stopped cleanly" in out and not spark.streams.active
    assert time.monotonic() - started < demo.STOP_RESERVE_S + 6


STUCK = """
    import sys, time
    from pathlib import Path
    from rich.console import Console
    from tidelog.spark.demo import Watchdog
    from tidelog.spark.local_broker import LocalBroker

    broker = LocalBroker(Path(sys.argv[1])).start()
    print(broker.proc.pid, flush=True)
    watchdog = Watchdog(1.0, Console(soft_wrap=True)).start()
    watchdog.on_expiry("tidelog serve", broker.stop)
    watchdog.phase = "waiting for a call that never returns"
    try:
        time.sleep(20)  # the watchdog ends the process long before
    finally:
        broker.stop()
"""


def test_a_stuck_demo_stops_by_itself_at_its_deadline(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(STUCK), str(tmp_path / "broker")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    broker_pid = int(done.stdout.split()[0])
    try:
        assert done.returncode == demo.DEADLINE_EXIT_CODE, done.stderr
        assert "did not finish within 1 s: it was stuck waiting for a call that never returns" in done.stdout
        assert "stopped tidelog serve" in done.stdout
        assert time.monotonic() - started < 30
        with pytest.raises(ProcessLookupError):  # the broker was stopped, not left running
            os.kill(broker_pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):  # only if the check above failed: the broker we started
            os.kill(broker_pid, signal.SIGKILL)


def _processes_under(directory: Path) -> list[str]:
    """Command lines of running processes that name `directory` (the cluster's ZooKeeper and brokers do)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(directory) in command:
                found.append(f"{proc.name}: {command}")
    return found


def test_the_cluster_demo_counts_every_window_once_across_a_failover(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tidelog demo --cluster`, short: ZooKeeper and three brokers, the leader of page_visits-0 killed with
    SIGKILL a third of the way through the producing, a new leader, the killed broker back in the ISR; every window
    counted once, every acknowledged record in page_visits once, everything stopped."""
    missing = zookeeper_missing()
    if missing:
        pytest.skip(missing)
    data = tmp_path / "demo"
    started = time.monotonic()
    code = cluster_demo.run(data, seconds=20, rate=200)
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 0, out
    assert took < demo.DEADLINE_S
    killed = re.search(r"SIGKILL broker (\d) \(pid \d+\): the leader of page_visits-0 \(leader epoch (\d+)", out)
    assert killed, out
    elected = re.search(r"broker (\d) leads page_visits-0 now, leader epoch (\d+)", out)
    assert elected and elected[1] != killed[1] and int(elected[2]) > int(killed[2]), out
    assert "the producer's next acknowledgement on page_visits-0:" in out
    assert f"broker {killed[1]} is back in the ISR of page_visits-0" in out
    # not a terminal: plain status lines with the partition's leader, not only a final frame
    assert len([line for line in out.splitlines() if "page_visits-0: leader" in line]) >= 2, out
    assert "every window counted, none twice" in out
    held = re.search(r"page_visits_per_window holds ([\d,]+) window results \(committed, each micro-batch once", out)
    assert held, out
    assert int(held[1].replace(",", "")) == spark.read.parquet(str(data / "windows.parquet")).count() > 0, out
    assert re.search(r"had ([\d,]+) acknowledged; page_visits holds \1 \(read through the brokers\): none lost", out)
    assert "stopped brokers 1,2,3 (SIGTERM, exit codes 0, 0, 0) and ZooKeeper" in out
    assert not spark.streams.active
    assert not _processes_under(data), "left running"
    print(f"the cluster demo took {took:.0f} s")
