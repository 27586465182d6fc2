"""Read-ahead for sequential readers of the RocketMQ engine: the next read of a queue rebuilt while the reader is busy.

A read of the RocketMQ engine rebuilds Kafka batches from CommitLog messages (codec/rocketmq_batches.py), which
costs the broker about half a microsecond per record, where the Kafka engine hands out file slices. A consumer
reads a queue in order and asks for the next range only after it has received and parsed the last one, so the
broker would rebuild while the consumer waits and wait while it parses. When a read stops because its byte budget
is spent (more records follow), MessageQueue offers the same read from where it stopped to this service, which
rebuilds it on one worker thread while the answer travels; if the queue's next read asks for exactly that, it
takes the result (waiting for it if the rebuild is still running) instead of rebuilding.

Contract:
- one pending read per queue, at most `max_queues` queues (the least recently offered is dropped beyond that), so
  the memory held is at most `max_queues` reads' budgets; `max_queues` 0 turns read-ahead off;
- a read is taken only when it gives what the reader's own read would: the same start offset, byte budget and
  generation of the queue (MessageQueue bumps it whenever records it may have read change other than by an
  append: truncation, a slave taking over, DeleteRecords); the same limit (high watermark or last stable offset),
  or a lower one if the budget stopped the read; the same min_one_message, or any when its first batch fitted the
  budget (a fetch sets it for its first partition only). Anything else is dropped and the reader reads for itself,
  as it does when the read-ahead failed (the failure is its own read's to report);
- reads of a queue stay thread-safe as they are (they share nothing but the files), so the worker may read while
  the event loop serves other queues.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from tidelog.storage.api import MemorySlice


class ReadKey(NamedTuple):
    """What a read's result depends on besides the queue's data, its limit and min_one_message."""

    offset: int
    max_bytes: int
    generation: int


class ReadResult(NamedTuple):
    """A read's batches (built in memory); the offset after their last record; the limit (high watermark or last
    stable offset) it read up to; whether the byte budget, not the limit, stopped it; its min_one_message; and
    whether its first batch fitted the budget (then min_one_message made no difference)."""

    batches: tuple[MemorySlice, ...]
    next_offset: int
    limit: int
    budget_bound: bool
    min_one_message: bool
    first_fits: bool


class _Pending(NamedTuple):
    key: ReadKey
    result: Future[ReadResult]


class ReadAhead:
    """One worker thread and a pending read per queue (see the module's docstring)."""

    def __init__(self, max_queues: int) -> None:
        self.max_queues = max_queues
        self._pending: OrderedDict[Hashable, _Pending] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self.taken = 0  # reads answered from a read-ahead

    def offer(self, queue: Hashable, key: ReadKey, read: Callable[[], ReadResult]) -> None:
        """Start `read` on the worker for `queue`'s next read, replacing what was pending for it."""
        if self.max_queues <= 0:
            return
        with self._lock:
            if self._closed:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidelog-read-ahead")
            self._pending.pop(queue, None)
            self._pending[queue] = _Pending(key, self._executor.submit(read))
            while len(self._pending) > self.max_queues:
                _, dropped = self._pending.popitem(last=False)
                dropped.result.cancel()

    def take(self, queue: Hashable, key: ReadKey, limit: int, min_one_message: bool) -> ReadResult | None:
        """The pending read of `queue` if it gives what the read asked for would (`key`, up to `limit`), else None."""
        with self._lock:
            pending = self._pending.pop(queue, None)
        if pending is None or pending.key != key:
            if pending is not None:
                pending.result.cancel()
            return None
        try:
            done = pending.result.result()
        except Exception:  # the reader's own read reports it
            return None
        same_limit = done.limit == limit or (done.limit < limit and done.budget_bound)
        if same_limit and (done.min_one_message == min_one_message or done.first_fits):
            self.taken += 1
            return done
        return None

    def forget(self, queue: Hashable) -> None:
        """Drop what is pending for `queue` (closed, deleted)."""
        with self._lock:
            pending = self._pending.pop(queue, None)
        if pending is not None:
            pending.result.cancel()

    def close(self) -> None:
        """Stop the worker; nothing is offered or taken afterwards."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
