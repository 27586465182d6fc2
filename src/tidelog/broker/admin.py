"""The thread the broker runs admin work on, off the event loop.

The engine's topic calls (create_topic, delete_topic, create_partitions, alter_topic_configs) open or rename many
files and hold the engine lock meanwhile: a 2,000-partition CreateTopics takes seconds. Run on the event loop they
would stall every connection, group heartbeats included, long enough for members to be evicted. They run here
instead, one at a time and in arrival order (as Kafka's controller applies them), while the loop keeps serving;
the data calls handlers make on the loop (append, read, offsets) never wait for this lock.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class AdminExecutor:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidelog-admin")

    async def run(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`call(*args, **kwargs)` on the admin thread; its result or exception comes back to the caller."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(call, *args, **kwargs))

    def close(self) -> None:
        """Wait for the call in progress (a half-done topic change would be repaired only at the next start)."""
        self._executor.shutdown(wait=True)

    def submit(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """`call(*args, **kwargs)` on the admin thread, from any thread (a ZooKeeper callback's); raises RuntimeError
        once the thread has stopped."""
        return self._executor.submit(call, *args, **kwargs)
