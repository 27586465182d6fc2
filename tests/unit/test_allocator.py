"""The broker's allocation policy (allocator.py): with it, buffers of about a megabyte that a process frees and
allocates again come from the heap without page faults; without it glibc faults each one in afresh. Measured in
two child processes (the policy is process-wide), by their minor page faults."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import resource, sys
import numpy as np
from tidelog.allocator import keep_freed_memory
if sys.argv[1] == "policy":
    assert keep_freed_memory()
def request():  # what one rebuilt Fetch allocates: several buffers of about a megabyte, freed at the end
    buffers = [np.ones((1 << 20) + i * 4096, dtype=np.uint8) for i in range(8)]
    return sum(int(b[-1]) for b in buffers)
request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    request()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def faults_per_request(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True, timeout=60)
    return float(out.stdout)


def test_freed_buffers_are_reused_without_page_faults() -> None:
    default, policy = faults_per_request("default"), faults_per_request("policy")
    assert default > 500, f"glibc's default no longer faults freed buffers in afresh ({default} a request)"
    assert policy < 50, f"{policy} page faults a request with the policy, {default} without"
