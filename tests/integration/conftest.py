"""A real `tidelog serve` subprocess for integration tests.

`broker` is one broker per test module (tests share it through distinct topic names); `start_broker(...)` starts
a broker of the test's own, with config overrides, for tests that restart, kill or reconfigure it. Every broker
listens on 127.0.0.1 on an ephemeral port, writes its stderr to a file next to its log dir, and is stopped
(SIGTERM, then SIGKILL if it lingers) when its fixture is torn down. When a test fails, the tail of the stderr of
every broker alive during the test is attached to the report.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
READY = re.compile(r"tidelog broker ready on port\(s\) (\d+)")
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 30.0
STDERR_TAIL_LINES = 60

_LIVE: list[BrokerProcess] = []  # brokers owned by a fixture that is not torn down yet


def _tidelog_command() -> list[str]:
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
    """One `tidelog serve` process and its log dir; `restart()` keeps the log dir (and the port if it can)."""

    def __init__(self, log_dir: Path, stderr_path: Path, overrides: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.stderr_path = stderr_path
        self.overrides = dict(overrides)
        self.port: int | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0
        self._stdout_thread: threading.Thread | None = None

    # --- addresses and state ---------------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        assert self.port is not None, "the broker has not started"
        return f"127.0.0.1:{self.port}"

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

    def start(self, port: int = 0) -> None:
        assert not self.running, "the broker is already running"
        args = [
            *_tidelog_command(),
            "serve",
            "--override",
            f"listeners=PLAINTEXT://127.0.0.1:{port}",
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
        lines: queue.Queue[str | None] = queue.Queue()
        self._stdout_thread = threading.Thread(target=_pump, args=(self.proc, lines), daemon=True)
        self._stdout_thread.start()
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
                self.port = int(match.group(1))
                return
        self._reap()
        raise BrokerStartError(f"{reason}: {' '.join(args)}\n--- stderr ---\n{self.stderr_tail()}")

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
        old_port = self.port
        try:
            self.start(old_port or 0)
        except BrokerStartError:
            if not old_port:
                raise
            self.start(0)  # someone took the port: take a new one (tests use the new .bootstrap)

    def close(self) -> None:
        """Teardown: stop the process whatever state it is in (SIGTERM, then SIGKILL)."""
        if self.proc is None or not self.running:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._reap()
        self._join_stdout()

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
        **kwargs: Any,
    ) -> BrokerProcess:
        settings = engine_overrides(engine, sync_flush=sync_flush)
        settings.update({str(k): str(v) for k, v in (overrides or {}).items()})
        settings.update({_config_key(k): str(v) for k, v in kwargs.items()})
        index = len(self.brokers)
        log_dir = self.base_dir / f"broker{index}-logs"
        log_dir.mkdir(parents=True)
        broker = BrokerProcess(log_dir, self.base_dir / f"broker{index}.stderr", settings)
        self.brokers.append(broker)
        _LIVE.append(broker)
        broker.start()
        return broker

    def close_all(self) -> None:
        for broker in self.brokers:
            try:
                broker.close()
            finally:
                if broker in _LIVE:
                    _LIVE.remove(broker)


StartBroker = Callable[..., BrokerProcess]


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[StartBroker]:
    """`start_broker({"log.flush.interval.messages": 1})` or `start_broker(log_flush_interval_messages=1)`;
    `start_broker(engine="rocketmq", sync_flush=True)` for another storage engine or acks=all on disk."""
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close_all()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by a test module; its tests use distinct topic names and must not stop it."""
    factory = BrokerFactory(tmp_path_factory.mktemp("broker"))
    try:
        yield factory()
    finally:
        factory.close_all()


@pytest.fixture(scope="module")
def start_module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartBroker]:
    """Like `start_broker`, for a broker with overrides that a whole module shares."""
    factory = BrokerFactory(tmp_path_factory.mktemp("module-broker"))
    try:
        yield factory
    finally:
        factory.close_all()


# --- the storage engine under the broker ---------------------------------------------------------------------

ENGINES = ("kafka", "rocketmq")
ROCKETMQ_COMMITLOG_FILE_BYTES = 64 << 20  # RocketMQ's 1 GiB files (two preallocated) are too much for tests


def engine_overrides(engine: str, *, sync_flush: bool = False) -> dict[str, str]:
    """Broker overrides selecting a storage engine. `sync_flush`: acks=all waits until the message is on disk
    (Kafka: log.flush.interval.messages=1; RocketMQ: flushDiskType=SYNC_FLUSH, its group commit)."""
    if engine == "kafka":
        return {"log.flush.interval.messages": "1"} if sync_flush else {}
    overrides = {
        "tidelog.storage.engine": "rocketmq",
        "tidelog.rocketmq.mapedFileSizeCommitLog": str(ROCKETMQ_COMMITLOG_FILE_BYTES),
    }
    if sync_flush:
        overrides["tidelog.rocketmq.flushDiskType"] = "SYNC_FLUSH"
    return overrides


@pytest.fixture(scope="module", params=ENGINES)
def engine_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> BrokerProcess:
    """A broker per storage engine, for the tests every engine must pass; the Kafka one is the module's `broker`."""
    if request.param == "kafka":
        return request.getfixturevalue("broker")
    factory = BrokerFactory(tmp_path_factory.mktemp(f"{request.param}-broker"))
    request.addfinalizer(factory.close_all)
    return factory(engine=request.param)


# --- pytest hooks ---------------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: runs a real `tidelog serve` subprocess (tests/integration)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed and item.path.is_relative_to(HERE):
        for broker in _LIVE:
            report.sections.append((f"tidelog broker stderr, last lines ({broker.stderr_path})", broker.stderr_tail()))
    return report
