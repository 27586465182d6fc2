"""`tidelog.spark.register` checks the Python that Spark starts for its workers before it registers the source.

Spark runs its Python workers, and the planner process of a Python data source, with `SparkContext.pythonExec`:
PYSPARK_PYTHON when the context was created, else `python3` from PATH (`spark.pyspark.python` only counts where
spark-submit launches the driver). When that interpreter lacks tidelog, `spark.read.format("tidelog").load()` fails
with PYTHON_DATA_SOURCE_ERROR and a worker's ModuleNotFoundError inside a JVM stack trace; `register` says instead
which interpreter it is and what to set. The shared session cannot be re-created with another PYSPARK_PYTHON, so
these tests set `pythonExec` on its context, which is what a new context takes from PYSPARK_PYTHON.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tidelog.spark
from tidelog.errors import WorkerPythonError

DRIVER_VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(scope="module")
def python_without_tidelog() -> str:
    """A real interpreter other than this one that cannot import what the data source needs: the venv's base
    interpreter or the system python3."""
    candidates = [getattr(sys, "_base_executable", None), "/usr/bin/python3", shutil.which("python3")]
    for candidate in candidates:
        if not candidate or not os.path.isfile(candidate):
            continue
        if os.path.abspath(candidate) == os.path.abspath(sys.executable):
            continue
        probe = [candidate, "-c", "import tidelog, numpy, pyarrow"]
        if subprocess.run(probe, capture_output=True, timeout=60).returncode != 0:
            return candidate
    pytest.skip("every other Python on this machine has tidelog, numpy and pyarrow")


def test_workers_run_the_context_python(
    spark: Any, monkeypatch: pytest.MonkeyPatch, python_without_tidelog: str
) -> None:
    """What the check looks at is what Spark runs: a task's `sys.executable` is the context's pythonExec."""
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python_without_tidelog)
    rdd = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable)
    ran = rdd.collect()[0]
    assert os.path.realpath(ran) == os.path.realpath(python_without_tidelog)


def test_register_names_a_worker_python_without_tidelog(
    spark: Any, monkeypatch: pytest.MonkeyPatch, python_without_tidelog: str
) -> None:
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python_without_tidelog)
    with pytest.raises(WorkerPythonError) as caught:
        tidelog.spark.register(spark)
    message = str(caught.value)
    print(message)
    assert f"Spark's Python workers would run {python_without_tidelog!r}" in message
    assert f"not the driver's Python ({sys.executable})" in message
    assert "it cannot import what the data source needs (ModuleNotFoundError: No module named" in message
    assert f"Set PYSPARK_PYTHON={sys.executable} in the environment before the SparkSession is created" in message


def test_register_names_another_python_version(spark: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    other = tmp_path / "python3.99"
    other.write_text("#!/bin/sh\necho 3.99\nexit 1\n")
    other.chmod(0o755)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(other))
    with pytest.raises(WorkerPythonError) as caught:
        tidelog.spark.register(spark)
    message = str(caught.value)
    print(message)
    assert f"it is Python 3.99 and the driver is Python {DRIVER_VERSION}: PySpark needs the same version" in message
    assert f"PYSPARK_PYTHON={sys.executable}" in message


def test_register_names_a_worker_python_that_does_not_exist(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "python3-not-installed-here")
    with pytest.raises(WorkerPythonError, match=r"'python3-not-installed-here'.* it is not found on PATH"):
        tidelog.spark.register(spark)


def test_register_runs_nothing_when_workers_run_this_python(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark.sparkContext, "pythonExec", sys.executable)  # as local_session's PYSPARK_PYTHON

    def no_probe(*args: object, **kwargs: object) -> None:
        raise AssertionError("register probed the worker Python although it is the driver's")

    monkeypatch.setattr(subprocess, "run", no_probe)
    tidelog.spark.register(spark)


def test_without_the_check_the_read_fails_in_a_worker(
    spark: Any, monkeypatch: pytest.MonkeyPatch, python_without_tidelog: str, small_log: Path
) -> None:
    """What the check saves a user from: `check_workers=False` registers the source anyway (the registration keeps
    the worker Python it was made with), and the first read fails inside Spark with a worker's import error."""
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python_without_tidelog)
    try:
        tidelog.spark.register(spark, check_workers=False)
        with pytest.raises(Exception, match="PYTHON_DATA_SOURCE_ERROR") as caught:
            spark.read.format("tidelog").option("subscribe", "visits").load(str(small_log)).count()
        assert "ModuleNotFoundError" in str(caught.value)
    finally:
        monkeypatch.undo()
        tidelog.spark.register(spark)  # again with the session's own worker Python, for the tests after this one
    assert spark.read.format("tidelog").option("subscribe", "visits").load(str(small_log)).count() == 900


def test_the_message_says_that_spark_pyspark_python_was_ignored() -> None:
    message = tidelog.spark._advice("python3", "it cannot import what the data source needs (x)", "/opt/py/bin/python")
    assert "spark.pyspark.python=/opt/py/bin/python is set, but a session created from a running Python" in message
    assert tidelog.spark._advice("python3", "x", "python3").count("spark.pyspark.python") == 0
