"""What the cluster suites read from ZooKeeper, as an operator would with zkCli.sh, and their patient wait."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from kazoo.client import KazooClient

from zookeeper_process import SESSION_TIMEOUT_MS

WAIT_S = SESSION_TIMEOUT_MS / 1000 + 10  # the session timeout, and room for two busy cores


def wait_for(condition: Callable[[], object], timeout_s: float = WAIT_S, what: str = "the condition") -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def controller(zk: KazooClient) -> int | None:
    if not zk.exists("/controller"):
        return None
    return int(json.loads(zk.get("/controller")[0])["brokerid"])


def controller_epoch(zk: KazooClient) -> int:
    return int(zk.get("/controller_epoch")[0])


def registered(zk: KazooClient) -> list[int]:
    return sorted(int(child) for child in zk.get_children("/brokers/ids"))
