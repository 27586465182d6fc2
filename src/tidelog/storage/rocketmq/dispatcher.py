"""The dispatcher (RocketMQ's ReputMessageService): follows the CommitLog from `reput_from_offset` and hands every
message to the dispatch chain (build ConsumeQueue, build IndexFile), then tells listeners which queues grew.

It reads up to `end_offset()`: the written end under ASYNC_FLUSH, the flushed end under SYNC_FLUSH (RocketMQ 5's
confirmOffset rule: a consumer never sees what a crash could still take back). A background thread runs it, woken by
every append and every flush; a reader that needs entries not yet dispatched runs it inline instead of waiting
(`catch_up`), so reading your own write costs no thread hand-off. Without the thread appends dispatch inline.
A batch that cannot be written (a full disk) is logged and dispatched again on the next round: the messages are
stored, and neither the append nor a reader that caught up inline sees the error.
The format it reads is the CommitLog's (codec/rocketmq_message.py); it writes nothing itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from tidelog.codec.rocketmq_message import Blank, DispatchInfo, InvalidMessage, decode_dispatch_info
from tidelog.errors import KafkaStorageError
from tidelog.storage.rocketmq.commitlog import CommitLog

log = logging.getLogger("tidelog.storage.rocketmq")

DispatchBatch = Sequence[tuple[int, DispatchInfo]]
Dispatcher = Callable[[DispatchBatch], None]
BATCH_MESSAGES = 2048
IDLE_WAIT_SECONDS = 0.1


class ReputMessageService:
    def __init__(
        self,
        commitlog: CommitLog,
        end_offset: Callable[[], int],
        dispatchers: list[Dispatcher],
        *,
        background: bool,
    ) -> None:
        self.commitlog = commitlog
        self.end_offset = end_offset
        self.dispatchers = dispatchers
        self.reput_from_offset = 0
        self.last_store_timestamp = 0  # of the last message dispatched (the checkpoint's logics timestamp)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._running = background
        self._stuck_at = -1
        self._failed_at = -1  # where a dispatch failed to write (a full disk), until one succeeds
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._running and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tidelog-reput", daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        """Is a background thread dispatching? (Else appends dispatch inline.)"""
        return self._thread is not None

    def wakeup(self) -> None:
        self._wake.set()

    @property
    def behind_bytes(self) -> int:
        """dispatchBehindBytes: what the CommitLog holds that the queues do not yet."""
        return max(0, self.end_offset() - self.reput_from_offset)

    def catch_up(self) -> int:
        """Dispatch everything up to the current end, in the calling thread."""
        return self.do_reput()

    def do_reput(self) -> int:
        dispatched = 0
        with self._lock:
            end = self.end_offset()
            while self.reput_from_offset < end:
                batch, next_offset = self._read_batch(self.reput_from_offset, end)
                if not batch:
                    if next_offset == self.reput_from_offset:
                        if self._stuck_at != next_offset:
                            self._stuck_at = next_offset
                            log.error("dispatcher: cannot read a message at CommitLog offset %d", next_offset)
                        break
                    self.reput_from_offset = next_offset
                    continue
                try:
                    for dispatch in self.dispatchers:
                        dispatch(batch)
                except (KafkaStorageError, OSError) as exc:  # the batch goes again next round (idempotent)
                    if self._failed_at != self.reput_from_offset:
                        self._failed_at = self.reput_from_offset
                        log.error(
                            "dispatcher: cannot dispatch from CommitLog offset %d (%s); the messages are stored and "
                            "become readable once their ConsumeQueues can be written",
                            self.reput_from_offset,
                            exc,
                        )
                    break
                if self._failed_at >= 0:
                    log.warning("dispatcher: dispatching again from CommitLog offset %d", self.reput_from_offset)
                    self._failed_at = -1
                self.last_store_timestamp = batch[-1][1].store_timestamp
                self.reput_from_offset = next_offset
                dispatched += len(batch)
        return dispatched

    def _read_batch(self, start: int, end: int) -> tuple[list[tuple[int, DispatchInfo]], int]:
        batch: list[tuple[int, DispatchInfo]] = []
        offset = start
        file_size = self.commitlog.file_size
        while offset < end and len(batch) < BATCH_MESSAGES:
            mapped_file = self.commitlog.queue.find(offset)
            if mapped_file is None or mapped_file.map is None:
                if offset < self.commitlog.min_offset:  # retention deleted what was never dispatched
                    log.warning("dispatcher: skipping to %d, the CommitLog's new start", self.commitlog.min_offset)
                    offset = self.commitlog.min_offset
                    continue
                break
            base = mapped_file.file_from_offset
            position = offset - base
            limit = min(end - base, mapped_file.wrote_position)
            if position >= limit:
                if mapped_file.is_full:
                    offset = base + file_size
                    continue
                break
            try:
                item = decode_dispatch_info(mapped_file.map, position, limit)
            except InvalidMessage as exc:
                if self._stuck_at != offset:
                    log.error("dispatcher: %s", exc)
                break
            if isinstance(item, Blank):
                offset = base + file_size
                continue
            batch.append((offset, item))
            offset += item.total_size
        return batch, offset

    def _run(self) -> None:
        while self._running:
            self._wake.wait(IDLE_WAIT_SECONDS)
            self._wake.clear()
            if not self._running:
                return
            try:
                self.do_reput()
            except Exception:
                log.exception("dispatcher round failed; retrying")
                time.sleep(0.1)

    def shutdown(self) -> None:
        self._running = False
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
