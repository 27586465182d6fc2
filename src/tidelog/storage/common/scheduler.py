"""A single background thread for the log's timed work (Kafka's KafkaScheduler, with one thread).

Periodic tasks: time-based flush, recovery-point and log-start-offset checkpoints, retention.
One-shot tasks: flushing a segment that was just rolled, unlinking `.deleted` files after the delay.
A task that raises is logged and, if periodic, runs again at its next time; it never kills the thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("tidelog.storage")


class Scheduler:
    def __init__(self, name: str = "tidelog-scheduler") -> None:
        self._queue: list[tuple[float, int, str, Callable[[], object], float | None]] = []
        self._sequence = itertools.count()
        self._wakeup = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def schedule(
        self, name: str, task: Callable[[], object], delay_ms: float = 0, period_ms: float | None = None
    ) -> None:
        """Run `task` after `delay_ms`, then every `period_ms` if given."""
        with self._wakeup:
            if not self._running:
                return
            due = time.monotonic() + delay_ms / 1000
            heapq.heappush(self._queue, (due, next(self._sequence), name, task, period_ms))
            self._wakeup.notify()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while self._running and (not self._queue or self._queue[0][0] > time.monotonic()):
                    timeout = self._queue[0][0] - time.monotonic() if self._queue else None
                    self._wakeup.wait(timeout)
                if not self._running:
                    return
                _due, _seq, name, task, period_ms = heapq.heappop(self._queue)
            try:
                task()
            except Exception:
                log.exception("background task %s failed", name)
            if period_ms is not None:
                self.schedule(name, task, period_ms, period_ms)

    def shutdown(self, run_pending_one_shots: bool = True) -> None:
        """Stop the thread; one-shot tasks still queued (segment flushes, file deletions) run here first."""
        with self._wakeup:
            self._running = False
            pending = [entry for entry in self._queue if entry[4] is None] if run_pending_one_shots else []
            self._queue.clear()
            self._wakeup.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        for _due, _seq, name, task, _period in sorted(pending):
            try:
                task()
            except Exception:
                log.exception("background task %s failed during shutdown", name)
