"""A real ZooKeeper server for tests: Debian's `zookeeper` package (3.8), standalone, on 127.0.0.1.

`ZooKeeperProcess` writes a `zoo.cfg` in its directory (data dir, a free client port, no admin server, a short
tick so session timeouts of a few seconds are allowed), starts `QuorumPeerMain` with the machine's Java, and waits
until a client connects. It dies with the test process (PR_SET_PDEATHSIG), and `stop()` ends it. `make test`
installs the package (Makefile `system-deps`); without it the tests that need one are skipped with the reason.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from broker_process import BrokerFactory, BrokerProcess, _die_with_parent  # the same parent-death signal as the brokers

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")  # its manifest names the jars it needs
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TICK_MS = 200  # sessions may last 2-20 ticks: 0.4-4 s by default; maxSessionTimeout is raised below
START_TIMEOUT_S = 30.0
SESSION_TIMEOUT_MS = 4000  # the cluster suites' zookeeper.session.timeout.ms: a killed broker leaves within seconds


class ClusterBroker:
    """Starts brokers with `broker.id` that join one test's ZooKeeper (tests/cluster/conftest.py `cluster_broker`):
    `start(broker_id, overrides)` one; `start.all(broker_ids, overrides)` several, the first alone (it becomes the
    controller, as when they start one by one) and the others side by side (a start is mostly Python importing:
    two cores start two brokers in little more than the time of one). Every process is started from the calling
    thread: a broker dies with the thread that started it."""

    def __init__(self, factory: BrokerFactory, zookeeper_connect: str) -> None:
        self.factory = factory
        self.zookeeper_connect = zookeeper_connect

    def __call__(
        self, broker_id: int, overrides: Mapping[str, Any] | None = None, *, launch_only: bool = False
    ) -> BrokerProcess:
        return self.factory(
            {
                "broker.id": broker_id,
                "zookeeper.connect": self.zookeeper_connect,
                "zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
                # the last broker of a test to stop has nowhere to move its leadership: it retries its controlled
                # shutdown (3 times) half a second apart instead of Kafka's 5 s, so the test's teardown is quick
                "controlled.shutdown.retry.backoff.ms": 500,
                **(overrides or {}),
            },
            launch_only=launch_only,
        )

    def all(self, broker_ids: Sequence[int], overrides: Mapping[str, Any] | None = None) -> dict[int, BrokerProcess]:
        first, *others = broker_ids
        started = {first: self(first, overrides)}
        launched = {broker_id: self(broker_id, overrides, launch_only=True) for broker_id in others}
        for broker in launched.values():
            broker.wait_ready()
        return started | launched


class ZooKeeperChroot:
    """One test's ZooKeeper: a chroot of its own (`/test-N`) on a server the cluster suites share, so each test starts
    from an empty tree as with a server of its own, without starting a JVM per test. `connect` is what a broker's
    `zookeeper.connect` takes (`127.0.0.1:port/test-N`); `address` is the server's host:port (a fault proxy's
    upstream), to which `chroot` is added again on the proxy's side."""

    def __init__(self, server: ZooKeeperProcess, chroot: str) -> None:
        self.server = server
        self.chroot = chroot

    @property
    def address(self) -> str:
        return self.server.connect

    @property
    def connect(self) -> str:
        return f"{self.server.connect}{self.chroot}"


def zookeeper_missing() -> str | None:
    """Why no ZooKeeper can run here, or None."""
    if not ZOOKEEPER_JAR.is_file():
        return f"ZooKeeper is not installed ({ZOOKEEPER_JAR}; apt-get install -y zookeeper)"
    if shutil.which("java") is None:
        return "ZooKeeper needs Java (apt-get install -y openjdk-17-jre-headless)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ZooKeeperProcess:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ZooKeeperProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "data").mkdir(exist_ok=True)
        self.port = self.port or _free_port()
        config = self.directory / "zoo.cfg"
        config.write_text(
            f"tickTime={TICK_MS}\n"
            f"dataDir={self.directory / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "maxSessionTimeout=60000\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok\n"
        )
        with open(self.directory / "zookeeper.out", "ab") as out:
            self.proc = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", str(ZOOKEEPER_JAR), MAIN_CLASS, str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited at start: {(self.directory / 'zookeeper.out').read_text()}")
            if self._answers():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not answer on {self.connect} within {START_TIMEOUT_S} s")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(4) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
