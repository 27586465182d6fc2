"""CommitLog flushing (RocketMQ's FlushRealTimeService and GroupCommitService). No file format of its own.

ASYNC_FLUSH: a thread flushes every `flushIntervalCommitLog` ms when at least `flushCommitLogLeastPages` 4 KiB pages
are dirty, and everything every `flushCommitLogThoroughInterval` ms. SYNC_FLUSH: producers put a request (the
CommitLog offset they need on disk) and wait; the group-commit thread wakes on a request (or every 10 ms), runs one
fdatasync that covers every request queued so far, and completes them all - one fsync per round however many
producers wait. Requests not covered within `syncFlushTimeout` fail (FLUSH_DISK_TIMEOUT), and a failed fsync fails
its round's requests (the flushed position only moves after a successful sync).
Without a background thread (`background=False`) both flush in the caller.

After each flush the checkpoint's physicMsgTimestamp moves to the store time of the last message flushed, and the
dispatcher is woken (under SYNC_FLUSH it may only dispatch what is flushed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tidelog.errors import FlushDiskTimeoutError, KafkaStorageError
from tidelog.storage.rocketmq.commitlog import CommitLog

log = logging.getLogger("tidelog.storage.rocketmq")

GROUP_COMMIT_WAIT_SECONDS = 0.01


class CommitLogFlusher:
    """Both flush policies behind one call: `wait_flushed(offset)` returns once the CommitLog is on disk up to
    `offset` (SYNC_FLUSH, or an explicit flush), and the background thread keeps the asynchronous policy."""

    def __init__(
        self,
        commitlog: CommitLog,
        *,
        sync_flush: bool,
        background: bool,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        sync_flush_timeout_ms: int,
        on_flushed: Callable[[int], None],
    ) -> None:
        self.commitlog = commitlog
        self.sync_flush = sync_flush
        self.interval_ms = interval_ms
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self.sync_flush_timeout_ms = sync_flush_timeout_ms
        self.on_flushed = on_flushed  # called with the store timestamp of the last message now on disk
        self.flush_count = 0
        self._cond = threading.Condition()
        self._requests = 0
        self._error: BaseException | None = None
        self._flush_lock = threading.Lock()
        self._running = background
        self._thread: threading.Thread | None = None
        self._last_thorough = time.monotonic()  # of the last thorough ASYNC_FLUSH round

    def start(self) -> None:
        if self._running and self._thread is None:
            target = self._run_group_commit if self.sync_flush else self._run_real_time
            name = "tidelog-group-commit" if self.sync_flush else "tidelog-flush-commitlog"
            self._thread = threading.Thread(target=target, name=name, daemon=True)
            self._thread.start()

    # --- the calls ------------------------------------------------------------------------------------------------

    def flush_now(self, least_pages: int = 0) -> bool:
        """One flush round in the caller's thread (serialised with the others)."""
        with self._flush_lock:
            timestamp = self.commitlog.last_store_timestamp
            flushed = self.commitlog.flush(least_pages)
            self.flush_count += 1 if flushed else 0
        if flushed:
            self.on_flushed(timestamp)
        return flushed

    def wait_flushed(self, offset: int) -> None:
        """Block until the CommitLog is flushed up to `offset`: a GroupCommitRequest under SYNC_FLUSH; under
        ASYNC_FLUSH (whose thread may wait for its dirty pages or its thorough round for seconds) an explicit flush
        in the caller."""
        if self.commitlog.flushed_where >= offset:
            return
        if self._thread is None or not self.sync_flush:
            self.flush_now()
            return
        deadline = time.monotonic() + self.sync_flush_timeout_ms / 1000
        with self._cond:
            self._requests += 1
            self._cond.notify_all()
            try:
                while self.commitlog.flushed_where < offset:
                    if self._error is not None:
                        raise KafkaStorageError(f"flush failed: {self._error}") from self._error
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._running:
                        raise FlushDiskTimeoutError(
                            f"the CommitLog was not flushed up to {offset} within {self.sync_flush_timeout_ms} ms "
                            "(FLUSH_DISK_TIMEOUT)"
                        )
                    self._cond.wait(remaining)
            finally:
                self._requests -= 1

    # --- the threads ----------------------------------------------------------------------------------------------

    def _run_group_commit(self) -> None:
        while self._running:
            with self._cond:
                if not self._requests:
                    self._cond.wait(GROUP_COMMIT_WAIT_SECONDS)
            if not self._running:
                break
            try:
                self.flush_now()  # RocketMQ flushes even without requests (messages sent without WAIT)
                error = None
            except Exception as exc:
                log.error("group commit failed: %s", exc)
                error = exc
                time.sleep(GROUP_COMMIT_WAIT_SECONDS)
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _run_real_time(self) -> None:
        while self._running:
            with self._cond:
                self._cond.wait(self.interval_ms / 1000)
            if not self._running:
                break
            try:
                self.real_time_round(time.monotonic())
            except Exception as exc:
                log.error("CommitLog flush failed: %s", exc)
            with self._cond:
                self._cond.notify_all()

    def real_time_round(self, now: float) -> bool:
        """One FlushRealTimeService round at monotonic time `now` (seconds): flush when at least `least_pages`
        pages are dirty, or everything when `thorough_interval_ms` passed since the last thorough round."""
        least_pages = self.least_pages
        if (now - self._last_thorough) * 1000 >= self.thorough_interval_ms:
            self._last_thorough, least_pages = now, 0
        return self.flush_now(least_pages)

    def shutdown(self) -> None:
        """Stop the thread, then flush everything (FlushRealTimeService retries 10 times on shutdown)."""
        self._running = False
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for attempt in range(10):
            try:
                self.flush_now()
                return
            except KafkaStorageError:
                if attempt == 9:
                    raise
                time.sleep(0.01)
