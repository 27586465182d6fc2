"""A `tidelog serve` child process on 127.0.0.1 for demos and tests: start, wait until ready, stop with SIGTERM.

The broker prints `tidelog broker ready on port(s) N` once it accepts connections; its stderr goes to a file
next to its log directory. Only the process started here is ever signalled (by its pid).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

from tidelog.errors import BrokerStartError

READY = re.compile(r"tidelog broker ready on port\(s\) (\d+)")


def _command() -> list[str]:
    script = Path(sys.executable).parent / "tidelog"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "tidelog.cli"]


class LocalBroker:
    def __init__(self, log_dir: str | os.PathLike[str], overrides: dict[str, str] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.overrides = {"group.initial.rebalance.delay.ms": "0", **(overrides or {})}
        self.stderr_path = self.log_dir.parent / f"{self.log_dir.name}.broker-stderr.log"
        self.port: int | None = None
        self.proc: subprocess.Popen[str] | None = None
        self._pump: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        assert self.port is not None, "the broker has not started"
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> LocalBroker:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        args = [
            *_command(),
            "serve",
            "--override",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "--override",
            f"log.dirs={self.log_dir}",
        ]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        with self.stderr_path.open("a") as stderr:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(None)

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise BrokerStartError(
                    f"tidelog serve was not ready within {timeout_s:.0f} s; see {self.stderr_path}"
                ) from None
            if line is None:
                code = self.proc.wait()
                raise BrokerStartError(f"tidelog serve exited with code {code}; see {self.stderr_path}")
            if match := READY.search(line):
                self.port = int(match.group(1))
                return self

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (a clean shutdown), then SIGKILL if it lingers; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._pump is not None:
            self._pump.join(timeout=5)
        self.proc = None
        return proc.returncode

    def __enter__(self) -> LocalBroker:
        return self.start() if self.proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
