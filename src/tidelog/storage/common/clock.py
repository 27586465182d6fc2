"""The wall clock both engines stamp files and records with: milliseconds since the epoch, as Kafka's Time."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
