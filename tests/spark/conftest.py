"""Shared fixtures of the Spark suite: ONE local SparkSession per test run, log directories, a broker.

The session is the one `tidelog.spark.local_session` builds: local[2], 2 shuffle partitions, UI off, UTC,
loopback only, Python filter pushdown on, a 10 s stream stop timeout and the C1-only JIT flags that shorten the
JVM's warm-up (the JVM starts once, about 10 s). Every test that needs Spark is marked `spark`; the pure tests
of the decoder, options and offsets in this directory run without a JVM.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import write_topic

import tidelog
from tidelog.spark.local_broker import LocalBroker

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    import tidelog.spark

    session = tidelog.spark.local_session("tidelog-tests", fast_start=True)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def stream_cleanup(spark: Any) -> Iterator[None]:
    """Stops any streaming query a test leaves running (a failed assertion must not leak a query)."""
    yield
    for query in spark.streams.active:
        query.stop()


@pytest.fixture(scope="session")
def small_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log dir written by the embedded API: topic `visits` (3 partitions x 300 records, every codec, small
    segments and a dense index), `other` (2 x 40), `empty` (2 partitions, no records)."""
    root = tmp_path_factory.mktemp("small-log") / "data"
    config = {"log.segment.bytes": 8 * 1024, "log.index.interval.bytes": 512}
    with tidelog.open(root, config=config, background=False) as log:
        write_topic(log, "visits", 3, 300)
        write_topic(log, "other", 2, 40, batch=7)
        log.create_topic("empty", partitions=2)
    return root


@pytest.fixture
def stats_dir(tmp_path: Path) -> Callable[[], list[dict[str, Any]]]:
    """A directory for the reader's per-task stats (option tidelog.statsDir) and a function reading them back."""
    directory = tmp_path / "stats"

    def read() -> list[dict[str, Any]]:
        if not directory.exists():
            return []
        return [json.loads(p.read_text()) for p in sorted(directory.iterdir())]

    read.path = str(directory)  # type: ignore[attr-defined]
    return read


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A `tidelog serve` on 127.0.0.1 shared by a test module (tests use distinct topics). It writes its log start
    offsets every 200 ms (Kafka: every minute), so the path reader sees DeleteRecords without waiting."""
    log_dir = tmp_path_factory.mktemp("broker") / "logs"
    overrides = {"num.partitions": "3", "log.flush.start.offset.checkpoint.interval.ms": "200"}
    with LocalBroker(log_dir, overrides) as running:
        yield running


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE) and "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
