"""Spark's Kafka source and sink for tidelog, installed with pip alone (PySpark's Python Data Source API, no jar).

    import tidelog.spark
    tidelog.spark.register(spark)           # format "tidelog"; also enables Python filter pushdown
    df = (spark.read.format("tidelog")
          .option("subscribe", "page_visits")
          .load("/data/tidelog"))           # or .option("kafka.bootstrap.servers", "host:9092").load()

`local_session()` builds a local SparkSession with the settings this package is tested with. Spark's Python
workers must run an interpreter that can import tidelog: set PYSPARK_PYTHON (local_session does) and install
the package (`pip install 'tidelog[spark]'`) on every machine that runs executors. With a local master, `register`
checks that interpreter and raises WorkerPythonError, naming what to set, when it cannot run the data source.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidelog.errors import WorkerPythonError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
PROBE_TIMEOUT_S = 30.0

__all__ = ["PUSHDOWN_CONF", "WorkerPythonError", "check_worker_python", "local_session", "register"]


def register(spark: SparkSession, *, check_workers: bool = True) -> None:
    """Register format `tidelog` in `spark` and enable Python filter pushdown, which its batch reader uses.

    First, with a local master, `check_worker_python(spark)`: WorkerPythonError when the interpreter Spark starts
    for its Python workers cannot import tidelog or runs another Python version. `check_workers=False` skips it."""
    if check_workers:
        check_worker_python(spark)
    from tidelog.spark.source import TidelogDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(TidelogDataSource)


# The imports a Python worker needs to run the data source (pyspark itself comes from Spark's own path). The
# version goes first, so that a worker of another Python version is named as such even when the imports fail.
_PROBE = (
    "import sys; print('%d.%d' % sys.version_info[:2], flush=True); "
    "import tidelog, numpy, pyarrow; print(tidelog.__version__)"
)
_CHECKED: set[tuple[str, str]] = set()  # (worker python, its PYTHONPATH) found fit: probed once per process


def check_worker_python(spark: SparkSession) -> None:
    """Raise WorkerPythonError when Spark's Python workers would run an interpreter that cannot run this data source.

    Spark starts its workers (and the driver-side planner process of a Python data source) with
    `SparkContext.pythonExec`: the PYSPARK_PYTHON of the driver's environment when the context was created, else
    `python3` from PATH. `spark.pyspark.python` counts only where spark-submit or bin/pyspark launch the driver
    (they turn it into PYSPARK_PYTHON); a session built from a running Python ignores it. When the worker
    interpreter is not this one, it is run once with `-c` (about a second, then remembered for the process): it
    must exist, be the driver's major.minor version, and import tidelog, numpy and pyarrow. Only with a local
    master (executors on other machines cannot be checked from here); never for Spark Connect sessions."""
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect: the workers belong to the server
        return
    if not str(context.master).startswith("local"):
        return
    worker = str(context.pythonExec)
    if os.path.abspath(worker) == os.path.abspath(sys.executable):
        return
    env = {**os.environ, **{str(k): str(v) for k, v in (getattr(context, "environment", None) or {}).items()}}
    problem = _probe(worker, env, f"{sys.version_info[0]}.{sys.version_info[1]}")
    if problem is None:
        return
    configured = context.getConf().get("spark.pyspark.python", None)
    raise WorkerPythonError(_advice(worker, problem, configured))


def _probe(worker: str, env: Mapping[str, str], driver_version: str) -> str | None:
    """What keeps `worker` from running the data source, or None when it can."""
    path = shutil.which(worker, path=env.get("PATH"))
    if path is None:
        return "it is not found" + ("" if os.sep in worker else " on PATH")
    key = (os.path.abspath(path), env.get("PYTHONPATH", ""))
    if key in _CHECKED:
        return None
    try:
        done = subprocess.run(
            [path, "-c", _PROBE],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        warnings.warn(
            f"tidelog.spark: could not check Spark's worker Python {worker}: it did not answer within "
            f"{PROBE_TIMEOUT_S:.0f} s",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    except OSError as exc:
        return f"it does not run ({exc})"
    lines = done.stdout.split()
    version = lines[0] if lines else None
    if version is not None and version != driver_version:
        return f"it is Python {version} and the driver is Python {driver_version}: PySpark needs the same version"
    if done.returncode != 0:
        errors = done.stderr.strip().splitlines()
        why = errors[-1] if errors else f"exit code {done.returncode}"
        return f"it cannot import what the data source needs ({why})"
    _CHECKED.add(key)
    return None


def _advice(worker: str, problem: str, configured: str | None) -> str:
    here = sys.executable
    message = (
        f"Spark's Python workers would run {worker!r}, not the driver's Python ({here}), and {problem}. "
        f"Set PYSPARK_PYTHON={here} in the environment before the SparkSession is created (or build it with "
        f"tidelog.spark.local_session(), which does), or install 'tidelog[spark]' into {worker}."
    )
    if configured and configured != worker:
        message += (
            f" spark.pyspark.python={configured} is set, but a session created from a running Python process "
            f"ignores it (only spark-submit and bin/pyspark turn it into PYSPARK_PYTHON)."
        )
    return message


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
