"""`tidelog cluster up`: a local cluster in one command - one ZooKeeper and N brokers on 127.0.0.1.

What it starts, and where (DIR is `--dir`, or a new temporary directory that is kept and printed):

- a standalone ZooKeeper (Debian's `zookeeper` package: `java -cp /usr/share/java/zookeeper.jar QuorumPeerMain`)
  from the `zoo.cfg` written in `DIR/zookeeper/` (data in `DIR/zookeeper/data`, output in
  `DIR/zookeeper/zookeeper.out`), listening on 127.0.0.1 at `--zookeeper-port` or a free port;
- N `tidelog serve` processes (`python -m tidelog.cli serve --override ...`), broker ids 1..N, each with
  `listeners=PLAINTEXT://127.0.0.1:<port>` (`--base-port` + id - 1, or free ports), `log.dirs=DIR/broker-<id>`,
  `default.replication.factor=min(3, N)`; their stdout and stderr go to `DIR/broker-<id>.out` and `.err`.

It waits until every broker printed its ready line and ZooKeeper lists all of them under `/brokers/ids`, prints the
bootstrap servers and the brokers (and which is the controller), then, whenever it changes (looked at every few
seconds), who leads what: each topic's partitions with leader, replicas and ISR from `/brokers/topics`. Ctrl-C or
SIGTERM stops the brokers (SIGTERM, then waits), then ZooKeeper, and exits 0. A broker or ZooKeeper that exits on
its own stops everything, with the tail of its output, and exit code 1. With an existing `--dir` the data is reused.
Only the processes started here are ever signalled, by their pids.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from rich.console import Console
from rich.table import Table

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
READY_LINE = "tidelog broker ready on port(s)"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
TAIL_LINES = 20


class ClusterUpError(Exception):
    """Why the cluster could not start (printed as one message, exit code 1)."""


@dataclass(frozen=True)
class ClusterUpOptions:
    brokers: int = 3
    directory: Path | None = None
    base_port: int | None = None
    zookeeper_port: int | None = None
    interval_s: float = 3.0
    overrides: Mapping[str, str] = field(default_factory=dict)  # more broker settings (`tidelog demo --cluster`)


@dataclass
class _Process:
    name: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def tail(self) -> str:
        texts = []
        for path in (self.err, self.out) if self.err != self.out else (self.out,):
            try:
                lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
            except OSError:
                continue
            if lines:
                texts.append("\n".join(lines))
        return "\n".join(texts) or "(no output)"


@dataclass
class _Broker(_Process):
    broker_id: int = 0
    port: int = 0
    log_dir: Path = Path()


class _Stop(Exception):
    """SIGTERM (or Ctrl-C) asked the cluster to stop."""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL if `cluster up` itself dies, so a killed run leaves no process behind."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def zookeeper_missing() -> str | None:
    if not ZOOKEEPER_JAR.is_file():
        return f"ZooKeeper is not installed ({ZOOKEEPER_JAR}; apt-get install -y zookeeper)"
    if shutil.which("java") is None:
        return "ZooKeeper needs Java (apt-get install -y default-jre-headless)"
    return None


class Cluster:
    """The processes of one `cluster up` run; `stop()` ends the brokers, then ZooKeeper.

    `kill_broker` and `restart_broker` are for demos of a failover (`tidelog demo --cluster`). Every child is started
    with PR_SET_PDEATHSIG, which Linux ties to the thread that started it: start and restart them from a thread that
    lives as long as the cluster (the main thread)."""

    def __init__(self, options: ClusterUpOptions, directory: Path, console: Console) -> None:
        self.options = options
        self.directory = directory
        self.console = console
        self.zookeeper: _Process | None = None
        self.zookeeper_port = 0
        self.brokers: list[_Broker] = []
        self.killed: set[int] = set()  # broker ids killed on purpose and not restarted: `check_alive` passes them

    @property
    def zookeeper_connect(self) -> str:
        return f"127.0.0.1:{self.zookeeper_port}"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers)

    # --- start ---------------------------------------------------------------------------------------------------

    def start_zookeeper(self) -> None:
        missing = zookeeper_missing()
        if missing:
            raise ClusterUpError(missing)
        home = self.directory / "zookeeper"
        (home / "data").mkdir(parents=True, exist_ok=True)
        self.zookeeper_port = self.options.zookeeper_port or _free_port()
        config = home / "zoo.cfg"
        config.write_text(  # short ticks: a dead broker's session ends within half a second of its timeout
            "tickTime=500\n"
            "maxSessionTimeout=60000\n"
            f"dataDir={home / 'data'}\n"
            f"clientPort={self.zookeeper_port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok\n"
        )
        out = home / "zookeeper.out"
        with out.open("ab") as sink:
            proc = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", str(ZOOKEEPER_JAR), ZOOKEEPER_MAIN, str(config)],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches `cluster up` only; it stops the others in order
                preexec_fn=_die_with_parent,
            )
        self.zookeeper = _Process("ZooKeeper", proc, out, out)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._zookeeper_answers():
            self.check_alive()
            if time.monotonic() > deadline:
                raise ClusterUpError(f"ZooKeeper did not answer on {self.zookeeper_connect} within {START_TIMEOUT_S} s")
            time.sleep(0.2)
        self.console.print(f"ZooKeeper on {self.zookeeper_connect} (pid {proc.pid}, config {config})")

    def _zookeeper_answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.zookeeper_port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(4) == b"imok"
        except OSError:
            return False

    def start_brokers(self) -> None:
        for broker_id in range(1, self.options.brokers + 1):
            port = self.options.base_port + broker_id - 1 if self.options.base_port else _free_port()
            self.brokers.append(self._spawn_broker(broker_id, port))
        self.wait_ready(self.brokers)

    def _spawn_broker(self, broker_id: int, port: int) -> _Broker:
        log_dir = self.directory / f"broker-{broker_id}"
        overrides = {
            "broker.id": str(broker_id),
            "zookeeper.connect": self.zookeeper_connect,
            "listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "log.dirs": str(log_dir),
            "default.replication.factor": str(min(3, self.options.brokers)),
            **self.options.overrides,
        }
        args = [sys.executable, "-m", "tidelog.cli", "serve"]
        for key, value in overrides.items():
            args += ["--override", f"{key}={value}"]
        out = self.directory / f"broker-{broker_id}.out"
        err = self.directory / f"broker-{broker_id}.err"
        with out.open("wb") as stdout, err.open("ab") as stderr:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # Ctrl-C reaches the parent only; it stops the others in order
                preexec_fn=_die_with_parent,
            )
        return _Broker(f"broker {broker_id}", proc, out, err, broker_id, port, log_dir)

    def is_ready(self, broker: _Broker) -> bool:
        """Printed its ready line (since its last start: the output file starts empty each time)."""
        return READY_LINE in broker.out.read_text(errors="replace")

    def wait_ready(self, brokers: list[_Broker]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = list(brokers)
        while waiting:
            self.check_alive()
            waiting = [b for b in waiting if not self.is_ready(b)]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(b.name for b in waiting)
                raise ClusterUpError(f"no ready line within {START_TIMEOUT_S:.0f} s from {names}:\n{waiting[0].tail()}")
            time.sleep(0.2)

    def broker(self, broker_id: int) -> _Broker:
        for broker in self.brokers:
            if broker.broker_id == broker_id:
                return broker
        raise KeyError(f"no broker {broker_id}")

    def kill_broker(self, broker_id: int) -> int:
        """SIGKILL (no controlled shutdown: its ZooKeeper session has to time out); returns the pid killed."""
        broker = self.broker(broker_id)
        self.killed.add(broker_id)
        broker.proc.kill()
        broker.proc.wait()
        return broker.proc.pid

    def restart_broker(self, broker_id: int) -> _Broker:
        """Starts a stopped broker again, same id, listener and log directory, without waiting for its ready line
        (`is_ready` says when)."""
        old = self.broker(broker_id)
        if old.proc.poll() is None:
            raise ClusterUpError(f"{old.name} is still running")
        new = self._spawn_broker(broker_id, old.port)
        self.brokers[self.brokers.index(old)] = new
        self.killed.discard(broker_id)
        return new

    def wait_registered(self, client: KazooClient) -> None:
        wanted = {str(b.broker_id) for b in self.brokers}
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            self.check_alive()
            try:
                registered = set(client.get_children("/brokers/ids"))
            except NoNodeError:
                registered = set()
            if wanted <= registered:
                return
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(wanted - registered, key=int))
                raise ClusterUpError(f"brokers {missing} are not in /brokers/ids after {START_TIMEOUT_S:.0f} s")
            time.sleep(0.2)

    def check_alive(self) -> None:
        alive = [b for b in self.brokers if b.broker_id not in self.killed]
        for process in ([self.zookeeper] if self.zookeeper else []) + alive:
            code = process.proc.poll()
            if code is not None:
                raise ClusterUpError(
                    f"{process.name} exited with code {code}; the end of its output:\n{process.tail()}"
                )

    # --- stop ----------------------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to every broker, each waited for up to `timeout_s` (then SIGKILL), then the same for ZooKeeper."""
        for broker in self.brokers:
            if broker.proc.poll() is None:
                broker.proc.send_signal(signal.SIGTERM)
        for broker in self.brokers:
            _wait_or_kill(broker.proc, timeout_s)
        if self.zookeeper is not None:
            if self.zookeeper.proc.poll() is None:
                self.zookeeper.proc.terminate()
            _wait_or_kill(self.zookeeper.proc, timeout_s)


def _wait_or_kill(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- what ZooKeeper says -----------------------------------------------------------------------------------------


def _read_json(client: KazooClient, path: str) -> dict[str, object] | None:
    try:
        data, _ = client.get(path)
    except NoNodeError:
        return None
    try:
        value = json.loads(data)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def controller_id(client: KazooClient) -> int | None:
    value = _read_json(client, "/controller")
    broker = value.get("brokerid") if value else None
    return broker if isinstance(broker, int) else None


def partition_state(client: KazooClient, topic: str, partition: int) -> dict[str, object] | None:
    """The partition's state znode (leader, leader_epoch, isr, controller_epoch), None when there is none yet."""
    return _read_json(client, f"/brokers/topics/{topic}/partitions/{partition}/state")


Row = tuple[str, int, int, tuple[int, ...], tuple[int, ...]]  # topic, partition, leader, replicas, isr


def leadership(client: KazooClient) -> list[Row]:
    """Each partition of each topic: leader (-1: none yet, or offline), replicas and ISR, from the znodes."""
    rows: list[Row] = []
    try:
        topics = sorted(client.get_children("/brokers/topics"))
    except NoNodeError:
        return rows
    for topic in topics:
        assignment = _read_json(client, f"/brokers/topics/{topic}")
        partitions = assignment.get("partitions") if assignment else None
        if not isinstance(partitions, dict):
            continue
        for key in sorted(partitions, key=int):
            replicas = tuple(int(r) for r in partitions[key])
            state = _read_json(client, f"/brokers/topics/{topic}/partitions/{key}/state") or {}
            leader = state.get("leader", -1)
            isr = state.get("isr", [])
            rows.append(
                (
                    topic,
                    int(key),
                    leader if isinstance(leader, int) else -1,
                    replicas,
                    tuple(int(r) for r in isr) if isinstance(isr, list) else (),
                )
            )
    return rows


def _ids(values: tuple[int, ...]) -> str:
    return ",".join(map(str, values))


def brokers_table(cluster: Cluster, controller: int | None) -> Table:
    table = Table(title="Brokers")
    for column in ("id", "listener", "pid", "log dir", "controller"):
        table.add_column(column)
    for b in cluster.brokers:
        mark = "controller" if b.broker_id == controller else ""
        table.add_row(str(b.broker_id), f"127.0.0.1:{b.port}", str(b.proc.pid), str(b.log_dir), mark)
    return table


def leadership_table(rows: list[Row]) -> Table:
    """User topics partition by partition; internal topics (`__...`) in one line each: how many each broker leads."""
    table = Table(title="Leaders")
    for column in ("topic", "partition", "leader", "replicas", "isr"):
        table.add_column(column)
    internal: dict[str, list[int]] = {}
    for topic, partition, leader, replicas, isr in rows:
        if topic.startswith("__"):
            internal.setdefault(topic, []).append(leader)
            continue
        table.add_row(topic, str(partition), str(leader) if leader >= 0 else "none", _ids(replicas), _ids(isr))
    for topic, leaders in internal.items():
        counts = {leader: leaders.count(leader) for leader in sorted(set(leaders))}
        summary = " ".join(f"{'none' if k < 0 else k}:{n}" for k, n in counts.items())
        table.add_row(topic, f"{len(leaders)} partitions", f"per broker {summary}", "", "")
    return table


# --- the command -------------------------------------------------------------------------------------------------


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    def raise_stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, raise_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(options: ClusterUpOptions, console: Console | None = None) -> int:
    console = console or Console(highlight=False)
    if options.brokers < 1:
        console.print("tidelog cluster up: error: --brokers must be at least 1")
        return 2
    if options.directory is None:
        directory = Path(tempfile.mkdtemp(prefix="tidelog-cluster-"))
        console.print(f"Data directory: {directory} (new; kept after the cluster stops)")
    else:
        directory = options.directory.resolve()
        reused = directory.exists() and any(directory.iterdir())
        directory.mkdir(parents=True, exist_ok=True)
        console.print(f"Data directory: {directory}" + (" (reusing its data)" if reused else ""))
    cluster = Cluster(options, directory, console)
    client: KazooClient | None = None
    code = 0
    with _stop_on_sigterm():
        try:
            cluster.start_zookeeper()
            cluster.start_brokers()
            client = KazooClient(hosts=cluster.zookeeper_connect)
            client.start(timeout=START_TIMEOUT_S)
            cluster.wait_registered(client)
            console.print(f"Bootstrap servers: {cluster.bootstrap_servers}")
            _watch(cluster, client, console, options.interval_s)
        except (_Stop, KeyboardInterrupt):
            console.print("Stopping the brokers, then ZooKeeper ...")
        except ClusterUpError as exc:
            console.print(f"tidelog cluster up: error: {exc}", markup=False)
            code = 1
        finally:
            if client is not None:
                client.stop()
                client.close()
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave processes behind
            try:
                cluster.stop()
            finally:
                signal.signal(signal.SIGINT, signal.default_int_handler)
    console.print(f"Stopped. The data stays in {directory}")
    return code


def _watch(cluster: Cluster, client: KazooClient, console: Console, interval_s: float) -> None:
    """Print the brokers and the leaders whenever they change; return never (SIGTERM or Ctrl-C end it)."""
    shown: tuple[int | None, list[Row]] | None = None
    while True:
        cluster.check_alive()
        controller = controller_id(client)
        rows = leadership(client)
        if shown is None or shown[0] != controller:
            console.print(brokers_table(cluster, controller))
        if shown is None or shown[1] != rows:
            console.print(leadership_table(rows) if rows else "Leaders: no topics yet")
        shown = (controller, rows)
        time.sleep(interval_s)
