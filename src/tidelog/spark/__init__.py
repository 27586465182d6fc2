"""Spark's Kafka source and sink for tidelog, installed with pip alone (PySpark's Python Data Source API, no jar).

    import tidelog.spark
    tidelog.spark.register(spark)           # format "tidelog"; also enables Python filter pushdown
    df = (spark.read.format("tidelog")
          .option("subscribe", "page_visits")
          .load("/data/tidelog"))           # or .option("kafka.bootstrap.servers", "host:9092").load()

`local_session()` builds a local SparkSession with the settings this package is tested with. Spark's Python
workers must run an interpreter that can import tidelog: set PYSPARK_PYTHON (local_session does) and install
the package (`pip install 'tidelog[spark]'`) on every machine that runs executors.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

__all__ = ["PUSHDOWN_CONF", "local_session", "register"]


def register(spark: SparkSession) -> None:
    """Register format `tidelog` in `spark` and enable Python filter pushdown, which its batch reader uses."""
    from tidelog.spark.source import TidelogDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(TidelogDataSource)


def local_session(
    app_name: str = "tidelog",
    *,
    cores: int = 2,
    shuffle_partitions: int = 2,
    fast_start: bool = False,
    extra: dict[str, Any] | None = None,
) -> SparkSession:
    """A local SparkSession wired for tidelog: workers run this interpreter, traffic stays on 127.0.0.1, UI off.

    `fast_start` trades JIT throughput for a shorter JVM warm-up (tests); leave it off for real work."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config(PUSHDOWN_CONF, "true")
    )
    if fast_start:
        builder = builder.config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    for key, value in (extra or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
