"""One long-lived client program (tests/clients/js/driver.js, tests/clients/go/driver.go) spoken to over pipes.

The program reads one JSON request per line on stdin, `{"op": ..., ...}`, and answers each with one JSON line on
stdout: `{"ok": true, "result": ...}` or `{"ok": false, "error": {...}}` (the client library's error: its name,
Kafka error type or code, message). `call()` returns the result or raises `ClientError` with that error; a program
that dies or stays silent past the timeout fails the test with the tail of its stderr.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 30.0


class ClientError(Exception):
    """A call the client library refused or the broker answered with an error."""

    def __init__(self, op: str, error: dict[str, Any]) -> None:
        super().__init__(f"{op}: {summary(error)}")
        self.error = error

    @property
    def text(self) -> str:
        """Everything the error says, flattened (for asserting on a Kafka error name wherever the client put it)."""
        return json.dumps(self.error)


def summary(error: dict[str, Any]) -> str:
    """`Name [KAFKA_ERROR_TYPE, code N]: message`, with the errors it wraps (per topic, per partition) after it."""
    kafka = ", ".join(str(x) for x in (error.get("type"), error.get("code")) if x is not None)
    text = f"{error.get('name')}{f' [{kafka}]' if kafka else ''}: {error.get('message')}"
    inner = list(error.get("errors") or []) + [p["error"] for p in error.get("partitions") or [] if p["error"]]
    return text + (f" ({'; '.join(summary(e) for e in inner)})" if inner else "")


class ClientDriver:
    def __init__(self, argv: Sequence[str], stderr_path: Path, cwd: Path | None = None) -> None:
        self.argv = list(argv)
        self.stderr_path = stderr_path
        self._stderr = stderr_path.open("a")
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ},
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def call(self, op: str, timeout: float = DEFAULT_TIMEOUT_S, **args: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            tail = self.stderr_tail()
            raise AssertionError(f"{self.argv[0]}: no answer to {op} within {timeout:.0f} s\n{tail}") from None
        if line is None:
            raise AssertionError(f"{self.argv[0]} exited ({self.proc.wait()}) during {op}\n{self.stderr_tail()}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise ClientError(op, answer["error"])
        return answer["result"]

    def error_of(self, op: str, timeout: float = DEFAULT_TIMEOUT_S, **args: Any) -> ClientError:
        """The call must fail: its error."""
        try:
            result = self.call(op, timeout, **args)
        except ClientError as error:
            return error
        raise AssertionError(f"{op} succeeded where it must fail: {result}")

    def stderr_tail(self, lines: int = 40) -> str:
        self._stderr.flush()
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # the program disconnects its clients and exits at the end of its input
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        self._stderr.close()
