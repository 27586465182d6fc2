"""The demo's pipeline (examples/page_visits_pipeline.py) on a small, known input: every finished window is
written once to the results topic and to Parquet, and the batch read's top pages agree with the windows."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.codec.record_batch import Record
from tidelog.partitioner import partition_for_key

pytestmark = pytest.mark.spark
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "page_visits_pipeline.py"
T0 = 1_700_000_000_000  # a multiple of 10 s: window boundaries fall on T0 + k * 10 s


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("page_visits_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_windowed_counts_on_a_small_input(spark: Any, tmp_path: Path, stream_cleanup: None) -> None:
    pipeline = load_example()
    source, target = tmp_path / "events", tmp_path / "results"
    pages = ["/", "/cart", "/", "/about", "/", "/cart"]
    visits = [(f"user-{i % 9}", pages[i % len(pages)], T0 + i * 700) for i in range(60)]  # 42 s of visits
    with tidelog.open(source, background=False) as log:
        log.create_topic("page_visits", partitions=3)
        for user, page, ts in visits:
            value = json.dumps({"user": user, "page": page, "ts": ts}).encode()
            log.produce("page_visits", partition_for_key(user.encode(), 3), [Record(value, user.encode(), ts)])
        heartbeat = T0 + 42_000 + 20_000  # moves the watermark past the last window
        log.produce("page_visits", 0, [Record(b'{"ts": 0}', b"heartbeat", heartbeat)])
    with tidelog.open(target, background=False) as log:
        log.create_topic("page_visits_per_window", partitions=1)

    query = pipeline.start_pipeline(
        spark,
        {"path": str(source)},
        {"path": str(target)},
        str(tmp_path / "windows.parquet"),
        str(tmp_path / "checkpoint"),
        trigger={"availableNow": True},
    )
    assert query.awaitTermination(120) and query.exception() is None

    expected = Counter(((ts - T0) // 10_000, page) for _, page, ts in visits)
    windows = spark.read.parquet(str(tmp_path / "windows.parquet")).collect()
    got = Counter()
    for row in windows:
        got[(int(row["start"].timestamp() * 1000 - T0) // 10_000, row["page"])] += row["count"]
    assert got == expected  # every window, each once
    results = spark.read.format("tidelog").option("subscribe", "page_visits_per_window").load(str(target))
    written = [json.loads(r.value) for r in results.collect()]
    assert sorted((w["page"], w["count"]) for w in written) == sorted((p, c) for (_, p), c in expected.items())
    assert pipeline.top_pages(spark, {"path": str(source)}, n=2) == [("/", 30), ("/cart", 20)]
