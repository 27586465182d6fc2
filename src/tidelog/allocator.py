"""The C allocator's policy for a broker process, set at start: `keep_freed_memory()` asks glibc's malloc (mallopt)
to serve buffers of up to MMAP_THRESHOLD_BYTES from its heap and to keep up to TRIM_THRESHOLD_BYTES of freed heap
instead of handing it back to the system. `tidelog serve` calls it before the broker opens its log.

Why: a broker allocates and frees buffers of a megabyte and more on every request - the Kafka batches the RocketMQ
engine rebuilds for a Fetch and the numpy columns it rebuilds them from, a Produce request's records. By default
glibc maps each such buffer afresh (its mmap threshold starts at 128 KiB and only follows the largest buffer freed
so far) and unmaps or trims what is freed, so every request touches new zero pages and takes a page fault for each
4 KiB of them: measured on a 2-vCPU VM, 0.5 faults per 1 KiB record read from the RocketMQ engine, half the CPU
of the read. With the policy the same buffers are reused from the heap without a fault. The cost is memory kept
after a peak: up to TRIM_THRESHOLD_BYTES of free heap stays with the process (and per allocator arena, one per
thread that allocates). A C library without mallopt (musl, macOS) keeps its own policy; the function says so.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("tidelog")

M_TRIM_THRESHOLD = -1  # mallopt parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest allowed on 64-bit: larger buffers are still mapped and unmapped
TRIM_THRESHOLD_BYTES = 256 << 20


def keep_freed_memory() -> bool:
    """Set the policy above; False (and a log line) where the C library has no mallopt or refuses a value."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.info("the C library has no mallopt: large buffers follow its default allocation policy")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        log.warning("mallopt refused the broker's allocation policy: large buffers follow the default one")
        return False
    return True
