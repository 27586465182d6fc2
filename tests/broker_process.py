"""A real `tidelog serve` subprocess for tests (tests/integration, tests/security, ...).

`BrokerProcess` is one broker and its log dir; `BrokerFactory` starts brokers in a base directory and stops them
all at teardown. Every broker listens on 127.0.0.1 on ephemeral ports (one per listener name: PLAINTEXT by
default, or e.g. `listeners=("PLAINTEXT", "SASL_SSL")`), writes its stderr to a file next to its log dir, and is
stopped (SIGTERM, then SIGKILL if it lingers) when its fixture is torn down. `LIVE` lists the brokers alive, so a
conftest can attach the tail of their stderr to a failed test's report.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

READY = re.compile(r"tidelog broker ready on port\(s\) ([\d, ]+)")
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 30.0
STDERR_TAIL_LINES = 60

LIVE: list[BrokerProcess] = []  # brokers owned by a fixture that is not torn down yet


def tidelog_command() -> list[str]:
    """The venv's `tidelog` script next to this interpreter, else `python -m tidelog.cli`."""
    script = Path(sys.executable).parent / "tidelog"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "tidelog.cli"]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when pytest dies, so even a killed test run leaves no broker behind."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _config_key(name: str) -> str:
    """`log_flush_interval_messages` -> `log.flush.interval.messages` (Kafka's keys have no underscores)."""
    return name.replace("_", ".")


class BrokerStartError(RuntimeError):
    pass


class BrokerProcess:
    """One `tidelog serve` process and its log dir; `restart()` keeps the log dir (and the ports if it can)."""

    def __init__(
        self, log_dir: Path, stderr_path: Path, overrides: dict[str, str], listeners: Sequence[str] = ("PLAINTEXT",)
    ) -> None:
        self.log_dir = log_dir
        self.stderr_path = stderr_path
        self.overrides = dict(overrides)
        self.listeners = tuple(listeners)
        self.ports: dict[str, int] = {}  # listener name -> bound port, once started
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0
        self._stdout_thread: threading.Thread | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()  # the stdout lines of the running process

    # --- addresses and state ---------------------------------------------------------------------------------

    @property
    def port(self) -> int | None:
        """The first listener's port."""
        return self.ports.get(self.listeners[0])

    @property
    def bootstrap(self) -> str:
        assert self.port is not None, "the broker has not started"
        return f"127.0.0.1:{self.port}"

    def bootstrap_for(self, listener: str) -> str:
        assert listener in self.ports, f"no started listener {listener}"
        return f"127.0.0.1:{self.ports[listener]}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def shut_down_cleanly_on_disk(self) -> bool:
        """Does the log dir say the last run shut down cleanly? Kafka writes `.kafka_cleanshutdown` at a clean
        stop; the RocketMQ engine removes its `abort` file."""
        if self.overrides.get("tidelog.storage.engine") == "rocketmq":
            return not (self.log_dir / "abort").exists()
        return (self.log_dir / ".kafka_cleanshutdown").exists()

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        return "\n".join(self.stderr_text().splitlines()[-lines:])

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self, ports: dict[str, int] | None = None) -> None:
        """Start on `ports` (listener name -> port; 0 or missing = ephemeral)."""
        self.launch(ports)
        self.wait_ready()

    def launch(self, ports: dict[str, int] | None = None) -> None:
        """Start the process without waiting for it (`wait_ready`). Call it from a thread that outlives the broker:
        the broker dies with the thread that started it (PR_SET_PDEATHSIG)."""
        assert not self.running, "the broker is already running"
        wanted = ports or {}
        listeners = ",".join(f"{name}://127.0.0.1:{wanted.get(name, 0)}" for name in self.listeners)
        args = [
            *tidelog_command(),
            "serve",
            "--override",
            f"listeners={listeners}",
            "--override",
            f"log.dirs={self.log_dir}",
        ]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        self.starts += 1
        with self.stderr_path.open("a") as stderr:
            stderr.write(f"===== start #{self.starts}: {' '.join(args)}\n")
            stderr.flush()
            env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stdout_thread = threading.Thread(target=_pump, args=(self.proc, self._lines), daemon=True)
        self._stdout_thread.start()

    def wait_ready(self) -> None:
        """Wait for the ready line of the process `launch` started; its ports from it."""
        assert self.proc is not None
        args, lines = self.proc.args, self._lines
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                reason = f"no ready line within {START_TIMEOUT_S:.0f} s"
                break
            if line is None:
                reason = f"the broker exited with code {self.proc.wait(timeout=STOP_TIMEOUT_S)} before it was ready"
                break
            if match := READY.search(line):
                bound = [int(port) for port in match.group(1).split(",")]
                self.ports = dict(zip(self.listeners, bound, strict=True))
                return
        self._reap()
        raise BrokerStartError(f"{reason}: {' '.join(map(str, args))}\n--- stderr ---\n{self.stderr_tail()}")

    def stop(self) -> int:
        """SIGTERM, wait, and assert a clean exit (code 0)."""
        assert self.proc is not None and self.running, "the broker is not running"
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._reap()
            raise AssertionError(f"the broker ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s") from None
        self._join_stdout()
        assert code == 0, f"the broker exited with code {code} after SIGTERM\n{self.stderr_tail()}"
        return code

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        assert self.proc is not None and self.running, "the broker is not running"
        self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._join_stdout()

    def restart(self) -> None:
        """Stop cleanly if running, then start on the same log dir, on the same port if it is still free."""
        if self.running:
            self.stop()
        old_ports = dict(self.ports)
        try:
            self.start(old_ports)
        except BrokerStartError:
            if not old_ports:
                raise
            self.start()  # someone took a port: take new ones (tests use the new .bootstrap)

    def close(self) -> None:
        """Teardown: end the process whatever state it is in, with SIGKILL. A teardown checks nothing, and a graceful
        stop costs a second or more (in a cluster a controlled shutdown each, the last one retrying); the tests of
        stopping stop their brokers themselves (`stop()`, which asserts a clean exit)."""
        if self.proc is None or not self.running:
            return
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._join_stdout()

    def _join_stdout(self) -> None:
        if self._stdout_thread is not None:
            self._stdout_thread.join(timeout=5)
            self._stdout_thread = None

    def cpu_seconds(self) -> float:
        """User + system CPU time the broker process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5), after pid and comm
        return (utime + stime) / os.sysconf("SC_CLK_TCK")

    def __repr__(self) -> str:
        return f"BrokerProcess({self.bootstrap if self.port else 'not started'}, log_dir={self.log_dir})"


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Read the broker's stdout to its end (so it never blocks on a full pipe), passing lines on."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


class BrokerFactory:
    """Starts brokers, each with a log dir of its own under `base_dir`."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.brokers: list[BrokerProcess] = []

    def __call__(
        self,
        overrides: dict[str, Any] | None = None,
        /,
        *,
        engine: str = "kafka",
        sync_flush: bool = False,
        listeners: Sequence[str] = ("PLAINTEXT",),
        before_start: Callable[[Path], None] | None = None,
        launch_only: bool = False,
        **kwargs: Any,
    ) -> BrokerProcess:
        """A started broker; `before_start(log_dir)` may prepare its log dir first (e.g. `tidelog users --add`);
        `launch_only`: its process started, not waited for (`BrokerProcess.wait_ready`)."""
        settings = engine_overrides(engine, sync_flush=sync_flush)
        settings.update({str(k): str(v) for k, v in (overrides or {}).items()})
        settings.update({_config_key(k): str(v) for k, v in kwargs.items()})
        index = len(self.brokers)
        log_dir = self.base_dir / f"broker{index}-logs"
        log_dir.mkdir(parents=True)
        if before_start is not None:
            before_start(log_dir)
        broker = BrokerProcess(log_dir, self.base_dir / f"broker{index}.stderr", settings, listeners)
        self.brokers.append(broker)
        LIVE.append(broker)
        if launch_only:
            broker.launch()
        else:
            broker.start()
        return broker

    def close_all(self) -> None:
        for broker in self.brokers:
            try:
                broker.close()
            finally:
                if broker in LIVE:
                    LIVE.remove(broker)


StartBroker = Callable[..., BrokerProcess]


# --- the storage engine under the broker ---------------------------------------------------------------------

ENGINES = ("kafka", "rocketmq")
ROCKETMQ_COMMITLOG_FILE_BYTES = 64 << 20  # RocketMQ's 1 GiB files (two preallocated) are too much for tests
# The RocketMQ engine's disk ratios at their maxima. The tests share the machine's disk with whatever else runs there,
# and RocketMQ's defaults (75/85/90 %: delete files early, delete them before fileReservedTime, refuse appends) are
# crossed on a busy CI disk. tests/unit/test_rocketmq_retention.py tests the ratios by setting them around the real
# usage instead.
ROCKETMQ_IGNORE_DISK_USAGE = {
    "tidelog.rocketmq.diskMaxUsedSpaceRatio": 95,
    "tidelog.rocketmq.diskSpaceCleanForciblyRatio": 95,
    "tidelog.rocketmq.diskSpaceWarningLevelRatio": 99,
}


def engine_overrides(engine: str, *, sync_flush: bool = False) -> dict[str, str]:
    """Broker overrides selecting a storage engine. `sync_flush`: acks=all waits until the message is on disk
    (Kafka: log.flush.interval.messages=1; RocketMQ: flushDiskType=SYNC_FLUSH, its group commit)."""
    if engine == "kafka":
        return {"log.flush.interval.messages": "1"} if sync_flush else {}
    overrides = {
        "tidelog.storage.engine": "rocketmq",
        "tidelog.rocketmq.mapedFileSizeCommitLog": str(ROCKETMQ_COMMITLOG_FILE_BYTES),
        **{key: str(value) for key, value in ROCKETMQ_IGNORE_DISK_USAGE.items()},
    }
    if sync_flush:
        overrides["tidelog.rocketmq.flushDiskType"] = "SYNC_FLUSH"
    return overrides
