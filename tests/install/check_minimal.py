"""Prove that `pip install .` alone (no extras) gives a working tidelog, and that `[spark]` adds the data source.

Run by `make check-install` with the python of a fresh virtualenv into which only `pip install .` went:

    python -I tests/install/check_minimal.py --source DIR

It checks, printing one line per check and stopping at the first failure with exit code 1:
  1. tidelog is the installed copy in this environment (not the source tree) and no Spark package is installed;
  2. every module of tidelog outside tidelog.spark imports, and `tidelog demo` (Spark) says what to install;
  3. `tidelog serve` starts (log dir in a temp dir, an ephemeral port on 127.0.0.1), a librdkafka producer
     (confluent-kafka) writes a record and a librdkafka consumer in a group reads it back, the broker stops cleanly;
  4. the embedded API (`tidelog.open`), both engines: append, read back, reopen, read again;
  5. `pip install DIR[spark]` into this environment, then in a new interpreter `import tidelog.spark` and the data
     source module, whose class names the format `tidelog` (no Spark session);
  6. without a C compiler (CC=false): `pip install DIR` into a second fresh virtualenv goes on without the compiled
     RocketMQ reads and dispatcher writes (codec/_rocketmq_rebuild.c, storage/common/_positioned_writes.c, both
     optional), and that install reads its RocketMQ engine with numpy and writes its ConsumeQueues in Python.
     (Step 4 checked that this environment, built with the compiler `make` provides, has them.)
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

READY = re.compile(r"tidelog broker ready on port\(s\) (\d+)")
START_TIMEOUT_S = 60.0
CLIENT_TIMEOUT_S = 60.0
TOPIC = "install-check"


class CheckFailed(Exception):
    pass


def check(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def ok(message: str) -> None:
    print(f"check-install: ok   {message}", flush=True)


def child_env() -> dict[str, str]:
    """The environment of the processes started here: no PYTHONPATH, so nothing but the venv is importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --- 1, 2: what is installed -------------------------------------------------------------------------------------


def check_environment(source: Path) -> None:
    check(sys.prefix != sys.base_prefix, f"not running in a virtualenv: {sys.executable}")
    import tidelog

    location = Path(tidelog.__file__).resolve()
    check(
        location.is_relative_to(Path(sys.prefix).resolve()),
        f"tidelog imported from {location}, not from this environment ({sys.prefix})",
    )
    check(not location.is_relative_to(source.resolve()), f"tidelog imported from the source tree: {location}")
    ok(f"tidelog {tidelog.__version__} installed in {sys.prefix} (python {sys.version.split()[0]})")
    import importlib.util

    present = [name for name in ("pyspark", "pyarrow", "pandas") if importlib.util.find_spec(name) is not None]
    check(not present, f"a minimal install should not have {present}: is this a fresh venv with `pip install .`?")
    ok("no pyspark, pyarrow or pandas installed: the core dependencies alone")


def check_imports() -> None:
    import tidelog

    names = [
        module.name
        for module in pkgutil.walk_packages(tidelog.__path__, "tidelog.")
        if not (module.name == "tidelog.spark" or module.name.startswith("tidelog.spark."))
    ]
    failures = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ModuleNotFoundError above all: a dependency missing from `dependencies`
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    check(not failures, "modules that do not import without extras:\n  " + "\n  ".join(failures))
    check(len(names) > 20, f"found only {len(names)} modules under tidelog: is the package complete?")
    ok(f"all {len(names)} modules of tidelog outside tidelog.spark import")


def check_demo_without_spark() -> None:
    script = Path(sys.executable).parent / "tidelog"
    done = subprocess.run(
        [str(script), "demo", "--seconds", "1"], capture_output=True, text=True, env=child_env(), timeout=120
    )
    output = done.stdout + done.stderr
    check(
        done.returncode == 1 and "pip install 'tidelog[spark]'" in output,
        f"`tidelog demo` without the spark extra should exit 1 saying pip install 'tidelog[spark]'; it exited "
        f"{done.returncode}:\n{output}",
    )
    ok("`tidelog demo` without the spark extra exits 1 and says: pip install 'tidelog[spark]'")


# --- 3: the broker and librdkafka --------------------------------------------------------------------------------


class Broker:
    def __init__(self, work: Path) -> None:
        self.log_dir = work / "broker-logs"
        self.stderr_path = work / "broker.stderr"
        script = Path(sys.executable).parent / "tidelog"
        check(script.is_file(), f"no `tidelog` script next to {sys.executable}: the console entry point is missing")
        self.args = [
            str(script),
            "serve",
            "--override",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "--override",
            f"log.dirs={self.log_dir}",
            "--override",
            "num.partitions=1",
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> None:
        with self.stderr_path.open("w") as stderr:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=child_env(),
            )
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                message = f"`tidelog serve` printed no ready line in {START_TIMEOUT_S:.0f} s{self.tail()}"
                raise CheckFailed(message) from None
            if line is None:
                code = self.proc.wait(timeout=30)
                raise CheckFailed(f"`tidelog serve` exited with code {code} before it was ready{self.tail()}")
            if match := READY.search(line):
                self.port = int(match.group(1))
                return

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise CheckFailed(f"`tidelog serve` ignored SIGTERM for 30 s{self.tail()}") from None
        check(code == 0, f"`tidelog serve` exited with code {code} after SIGTERM{self.tail()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n--- broker stderr (tail) ---\n" + "\n".join(text.splitlines()[-lines:])


def check_broker(work: Path) -> None:
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = Broker(work)
    try:
        broker.start()
        ok(f"`tidelog serve` is ready on 127.0.0.1:{broker.port} (log dir {broker.log_dir})")
        bootstrap = f"127.0.0.1:{broker.port}"

        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])
        try:
            futures[TOPIC].result(timeout=CLIENT_TIMEOUT_S)
        except Exception as exc:
            raise CheckFailed(f"CreateTopics {TOPIC} failed: {exc}{broker.tail()}") from exc
        ok(f"librdkafka AdminClient created topic {TOPIC}")

        delivered: list[object] = []
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
        producer.produce(
            TOPIC,
            key=b"install-key",
            value=b"installed with pip alone",
            headers=[("check", b"minimal")],
            on_delivery=lambda err, msg: delivered.append(err if err is not None else msg),
        )
        remaining = producer.flush(CLIENT_TIMEOUT_S)
        check(remaining == 0 and len(delivered) == 1, f"the record was not delivered in {CLIENT_TIMEOUT_S:.0f} s")
        result = delivered[0]
        check(not isinstance(result, KafkaError), f"produce failed: {result}{broker.tail()}")
        ok(f"librdkafka producer (idempotent) wrote a record at offset {result.offset()}")  # type: ignore[attr-defined]

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "install-check",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.subscribe([TOPIC])
            deadline = time.monotonic() + CLIENT_TIMEOUT_S
            message = None
            while message is None and time.monotonic() < deadline:
                polled = consumer.poll(0.5)
                if polled is None:
                    continue
                check(polled.error() is None, f"consumer error: {polled.error()}{broker.tail()}")
                message = polled
            check(message is not None, f"the consumer got no record in {CLIENT_TIMEOUT_S:.0f} s{broker.tail()}")
            assert message is not None
            got = (message.key(), message.value(), message.headers())
            want = (b"install-key", b"installed with pip alone", [("check", b"minimal")])
            check(got == want, f"the consumer read {got!r}, expected {want!r}")
            consumer.commit(message=message, asynchronous=False)
        finally:
            consumer.close()
        ok("librdkafka consumer (group install-check) read the same key, value and header back and committed")
        del admin, producer, consumer  # librdkafka clients are destroyed here, so none logs the broker's stop
        broker.stop()
        ok("`tidelog serve` stopped cleanly on SIGTERM (exit code 0)")
    finally:
        broker.kill()


# --- 4: the embedded API -----------------------------------------------------------------------------------------


def check_embedded(work: Path) -> None:
    import tidelog

    for engine in ("kafka", "rocketmq"):
        log_dir = work / f"embedded-{engine}"
        records = [
            tidelog.Record(value=f"value-{i}".encode(), key=f"key-{i}".encode(), headers=[("n", str(i).encode())])
            for i in range(100)
        ]
        with tidelog.open(log_dir, engine=engine) as log:
            log.create_topic("embedded", partitions=2)
            first = log.produce("embedded", 1, records[:50], compression="zstd")
            log.produce("embedded", 1, records[50:])
            got = [(r.offset, r.key, r.value, list(r.headers)) for r in log.consume("embedded", 1)]
        want = [(i, r.key, r.value, list(r.headers)) for i, r in enumerate(records)]
        check(first == 0, f"{engine}: the first batch got offset {first}, expected 0")
        check(got == want, f"{engine}: read back {len(got)} records that differ from the 100 appended")
        with tidelog.open(log_dir, engine=engine) as log:
            again = [(r.offset, r.key, r.value, list(r.headers)) for r in log.consume("embedded", 1)]
        check(again == want, f"{engine}: after reopening, read back {len(again)} records that differ")
        ok(f"tidelog.open(engine={engine!r}): 100 records (zstd and plain) appended, read back, reopened, read again")
    from tidelog.codec import rocketmq_batches
    from tidelog.storage.common import positioned_writes

    check(rocketmq_batches.compiled_rebuild is not None, "the install has no compiled RocketMQ reads (a C compiler?)")
    check(
        positioned_writes.write_pieces is not positioned_writes.write_pieces_in_python,
        "the install has no compiled ConsumeQueue writes (a C compiler?)",
    )
    ok(
        "the RocketMQ engine's reads and its dispatcher's writes are the compiled ones "
        "(tidelog.codec._rocketmq_rebuild, tidelog.storage.common._positioned_writes)"
    )


# --- 5: the spark extra ------------------------------------------------------------------------------------------

SPARK_IMPORTS = """
import sys
import tidelog, tidelog.spark, tidelog.spark.source
from pathlib import Path
assert Path(tidelog.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), tidelog.__file__
import pyspark
print(pyspark.__version__, tidelog.spark.source.TidelogDataSource.name())
"""


def check_spark_extra(source: Path) -> None:
    command = [sys.executable, "-m", "pip", "install", "-q", f"{source}[spark]"]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=1200)
    check(done.returncode == 0, f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    ok(f"pip install '{source.name}[spark]' into the same environment ({time.monotonic() - started:.0f} s)")
    done = subprocess.run(
        [sys.executable, "-I", "-c", SPARK_IMPORTS], capture_output=True, text=True, env=child_env(), timeout=300
    )
    check(done.returncode == 0, f"importing tidelog.spark failed:\n{done.stdout}{done.stderr}")
    version, name = done.stdout.split()
    check(name == "tidelog", f"the data source's name() is {name!r}, expected 'tidelog'")
    ok(f"import tidelog.spark and tidelog.spark.source (pyspark {version}): data source format {name!r}")


# --- 6: no C compiler ----------------------------------------------------------------------------------------

NUMPY_READS = """
import tempfile
import tidelog
from tidelog.codec import rocketmq_batches
from tidelog.storage.common import positioned_writes
assert rocketmq_batches.compiled_rebuild is None, "compiled without a compiler?"
assert positioned_writes.write_pieces is positioned_writes.write_pieces_in_python, "compiled without a compiler?"
with tempfile.TemporaryDirectory() as tmp, tidelog.open(tmp, engine="rocketmq") as log:
    log.create_topic("t", partitions=1)
    log.produce("t", 0, [tidelog.Record(value=b"v%d" % i, key=b"k%d" % i) for i in range(1000)])
    values = [r.value for r in log.consume("t", 0)]
    log.create_topic("many", partitions=50)  # dispatch rounds over many queues: their writes in Python
    for partition in range(50):
        log.produce("many", partition, [tidelog.Record(value=b"p%d" % partition)])
    many = [[r.value for r in log.consume("many", partition)] for partition in range(50)]
assert values == [b"v%d" % i for i in range(1000)], len(values)
assert many == [[b"p%d" % partition] for partition in range(50)], many
print("ok")
"""


def check_without_compiler(source: Path, work: Path) -> None:
    venv = work / "venv-no-compiler"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
    check(done.returncode == 0, f"python -m venv failed:\n{done.stdout}{done.stderr}")
    python = str(venv / "bin" / "python")
    environment = {**child_env(), "CC": "false"}  # distutils' compiler: a command that fails
    clean = work / "source-no-compiler"  # without the build/ of the install before, which holds a compiled module
    shutil.copytree(source, clean, ignore=shutil.ignore_patterns("build", "*.egg-info", "*.so"))
    command = [python, "-m", "pip", "install", "-q", "--no-cache-dir", str(clean)]  # no wheel built with one
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=1200)
    check(done.returncode == 0, f"pip install with CC=false failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    done = subprocess.run([python, "-I", "-c", NUMPY_READS], capture_output=True, text=True, timeout=300)
    check(done.stdout.strip() == "ok", f"the install without a compiler:\n{done.stdout}{done.stderr}")
    ok(f"pip install without a C compiler, then 1,000 records read from the RocketMQ engine with numpy, 50 queues "
       f"written in Python ({time.monotonic() - started:.0f} s)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, type=Path, help="the repository (what `pip install .` installed)")
    parser.add_argument("--skip-spark", action="store_true", help="leave out step 5 (the [spark] extra)")
    args = parser.parse_args(argv)
    source = args.source.resolve()
    steps: list[tuple[str, Callable[[], None]]] = []
    with tempfile.TemporaryDirectory(prefix="tidelog-check-install-") as tmp:
        work = Path(tmp)
        steps = [
            ("environment", lambda: check_environment(source)),
            ("imports", check_imports),
            ("demo without spark", check_demo_without_spark),
            ("broker", lambda: check_broker(work)),
            ("embedded", lambda: check_embedded(work)),
        ]
        if not args.skip_spark:
            steps.append(("spark extra", lambda: check_spark_extra(source)))
        steps.append(("without a compiler", lambda: check_without_compiler(source, work)))
        for name, step in steps:
            try:
                step()
            except CheckFailed as exc:
                print(f"check-install: FAIL {name}: {exc}", file=sys.stderr, flush=True)
                return 1
            except Exception:
                print(f"check-install: FAIL {name}: unexpected error", file=sys.stderr, flush=True)
                traceback.print_exc()
                return 1
    print(f"check-install: all {len(steps)} steps passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
