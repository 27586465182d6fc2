"""Checking large batches while they are written: one thread, owned by the engine, shared by its partitions.

A producer's batch of CRC_IN_PARALLEL_BYTES or more has its CRC and records (Kafka's LogValidator, as for a small
batch) checked by this thread while the appending thread writes it; the append counts only once the check passed
(PartitionLog undoes the write otherwise). Contract:
- `submit()` hands a check over and returns its PendingCheck; `PendingCheck.result()` (once) returns the check or
  raises what it raised. Whichever thread claims a check first runs it: the worker when it picks it up, or the
  appending thread in `result()` when the worker has not started it by the end of the write. So a check is never
  run twice, and `result()` never waits for a worker that is busy, descheduled or stopped.
- `start()` starts the thread; `stop()` ends it (a sentinel after the checks already queued) and waits for it.
  A check submitted after `stop()` runs on the appending thread in `result()`.
"""

from __future__ import annotations

import threading
import time
from queue import Empty, SimpleQueue

from tidelog.codec.record_batch import BatchHeader, check_crc, compute_crc
from tidelog.codec.record_check import RecordsCheck, check_batch_records

CRC_IN_PARALLEL_BYTES = 256 * 1024

# After a check the worker looks for the next one every CHECK_POLL_INTERVAL_S (about 70 µs with the kernel's timer
# slack) for CHECK_POLL_WINDOW_S before it blocks on its queue. Handing a check to a blocked thread costs the
# appending thread a wake-up (a futex call and an interrupt to the idle CPU: about 9 µs on the VM of
# docs/benchmarks.md, 5 % of a 1 MiB append), a put into the queue of a polling one 0.1 µs; a check picked up
# 70 µs late still ends before the write (about 70 µs of work against 180). A sleep that ends more than
# CHECK_POLL_LATE_S late means other processes hold the CPUs: the worker stops polling until its next check (its
# wake-ups took CPU time from the appending thread there: about 10 % less throughput with other work running).
CHECK_POLL_INTERVAL_S = 20e-6
CHECK_POLL_WINDOW_S = 0.002
CHECK_POLL_LATE_S = 0.0003


def check_large_batch(view: memoryview, position: int, header: BatchHeader, from_client: bool) -> RecordsCheck:
    """The CRC, then (for a producer's batch) every record. crc32c, the decompressors and numpy's larger operations
    release the GIL, so on the worker this overlaps with the write."""
    check_crc(header, compute_crc(view, position, header.size_in_bytes), position)
    if not from_client:
        return RecordsCheck(header.max_timestamp, 0)
    return check_batch_records(view, position, header)


class PendingCheck:
    """A large batch's check, handed to the worker thread: run by whichever thread claims it first (see above)."""

    __slots__ = ("_claim", "_outcome", "_task")

    def __init__(self, view: memoryview, position: int, header: BatchHeader, from_client: bool) -> None:
        self._claim = threading.Lock()
        self._outcome: SimpleQueue[tuple[RecordsCheck | None, BaseException | None]] = SimpleQueue()
        self._task: tuple[memoryview, int, BatchHeader, bool] | None = (view, position, header, from_client)

    def run_if_unclaimed(self) -> None:
        """On the worker: run the check unless the appending thread already took it."""
        if self._claim.acquire(blocking=False):
            self._outcome.put(self._run())

    def _run(self) -> tuple[RecordsCheck | None, BaseException | None]:
        task, self._task = self._task, None  # no reference to the caller's buffer once done
        assert task is not None
        try:
            return check_large_batch(*task), None
        except BaseException as exc:  # raised by result(), on the appending thread
            return None, exc

    def result(self) -> RecordsCheck:
        check, error = self._run() if self._claim.acquire(blocking=False) else self._outcome.get()
        if error is not None:
            raise error
        assert check is not None
        return check


class BatchCheckWorker:
    """The thread that checks large batches while the appending threads write them: a queue of PendingCheck in
    (a ThreadPoolExecutor's submit and Future cost the appending thread 5 µs more), polled while appends of large
    batches follow each other."""

    def __init__(self) -> None:
        self._tasks: SimpleQueue[PendingCheck | None] = SimpleQueue()  # None: stop
        self._thread = threading.Thread(target=self._run, name="tidelog-check", daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread once it has taken the checks queued before, and wait for it."""
        self._stopped = True
        if self._thread.is_alive():
            self._tasks.put(None)
            self._thread.join()

    def submit(self, view: memoryview, position: int, header: BatchHeader, from_client: bool) -> PendingCheck:
        pending = PendingCheck(view, position, header, from_client)
        if not self._stopped:  # else result() runs it
            self._tasks.put(pending)
        return pending

    def _run(self) -> None:
        tasks = self._tasks
        poll_until = 0.0
        while True:
            try:
                pending = tasks.get_nowait()
            except Empty:
                now = time.monotonic()
                if now < poll_until:
                    time.sleep(CHECK_POLL_INTERVAL_S)
                    if time.monotonic() - now > CHECK_POLL_LATE_S:  # the CPUs are busy: stop taking them
                        poll_until = 0.0
                    continue
                pending = tasks.get()
            if pending is None:
                return
            pending.run_if_unclaimed()
            del pending
            poll_until = time.monotonic() + CHECK_POLL_WINDOW_S
