"""The fault suites' own tools, checked with real sockets and real files, no ZooKeeper: the fault-injecting proxy
(fault_proxy.py) forwards, cuts silently, heals and resets; the replica comparison (replica_files.py) passes on
copies of the same segment files and names the offset where a changed byte or a missing batch makes them part; the
delivery check (delivery_check.py) catches a lost, a duplicated and a reordered record."""

from __future__ import annotations

import contextlib
import queue
import shutil
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from delivery_check import assert_delivery, check_delivery, make_value, parse_value
from fault_proxy import FaultProxy, ProxyRegistry, make_proxies
from replica_files import (
    REPLICATION_OFFSET_CHECKPOINT,
    assert_all_replicas_identical,
    assert_replicas_identical,
    compare_replicas,
    read_replica,
    replica_batches,
)

import tidelog
from tidelog import Record

SILENCE_S = 0.4  # how long a recv waits to call a connection stalled
TS = 1_700_000_000_000


# --- the proxy -----------------------------------------------------------------------------------------------------


class EchoServer(socketserver.ThreadingTCPServer):
    """Echoes every byte; records what it received and how many connections it accepted."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), EchoHandler)
        self.received: queue.Queue[bytes] = queue.Queue()
        self.accepted = 0
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class EchoHandler(socketserver.BaseRequestHandler):
    server: EchoServer

    def handle(self) -> None:
        self.server.accepted += 1
        with contextlib.suppress(ConnectionError):
            while data := self.request.recv(65536):
                self.server.received.put(data)
                self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.stop()


def connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.settimeout(5)
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"EOF after {len(data)} of {size} bytes")
        data += chunk
    return data


def round_trip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    return recv_exactly(sock, len(payload))


def assert_silent(sock: socket.socket) -> None:
    sock.settimeout(SILENCE_S)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.settimeout(5)


def assert_ended(sock: socket.socket) -> None:
    """The connection is over: EOF or a reset, not silence."""
    with contextlib.suppress(ConnectionError):
        assert sock.recv(1) == b""


def test_the_proxy_forwards_both_ways_with_flow_control_and_eof(echo: EchoServer) -> None:
    with FaultProxy("127.0.0.1", echo.port) as proxy:
        assert proxy.address == f"127.0.0.1:{proxy.port}"
        with connect(proxy) as sock:
            assert round_trip(sock, b"hello") == b"hello"
            big = bytes(range(256)) * 4096  # 1 MiB: more than any buffer between the two ends
            sender = threading.Thread(target=sock.sendall, args=(big,))
            sender.start()
            assert recv_exactly(sock, len(big)) == big
            sender.join()
            sock.shutdown(socket.SHUT_WR)  # the echo server sees EOF and closes: the client sees EOF
            assert sock.recv(1) == b""
        with connect(proxy) as second, connect(proxy) as third:
            assert round_trip(second, b"2") == b"2" and round_trip(third, b"3") == b"3"


def test_cut_stalls_silently_and_heal_closes_the_stalled_connections(echo: EchoServer) -> None:
    with FaultProxy("127.0.0.1", echo.port) as proxy, connect(proxy) as sock:
        assert round_trip(sock, b"before") == b"before"
        echo.received.get(timeout=5)
        proxy.cut()
        assert proxy.is_cut
        sock.sendall(b"during")
        assert_silent(sock)  # no reset, no EOF: silence
        assert echo.received.empty()
        accepted = echo.accepted
        with connect(proxy) as late:  # accepted, but goes nowhere
            late.sendall(b"late")
            assert_silent(late)
            assert echo.accepted == accepted
            proxy.heal()
            assert not proxy.is_cut
            assert_ended(sock)
            assert_ended(late)
        assert echo.received.empty()  # the held bytes were dropped
        with connect(proxy) as fresh:
            assert round_trip(fresh, b"after") == b"after"


def test_heal_can_resume_the_stalled_connections_with_their_held_bytes(echo: EchoServer) -> None:
    with FaultProxy("127.0.0.1", echo.port) as proxy, connect(proxy) as sock:
        assert round_trip(sock, b"a") == b"a"
        proxy.cut()
        sock.sendall(b"held")
        late = connect(proxy)
        late.sendall(b"late")
        assert_silent(sock)
        proxy.heal(close_stalled=False)
        assert recv_exactly(sock, 4) == b"held"
        assert recv_exactly(late, 4) == b"late"
        late.close()


def test_one_way_cuts(echo: EchoServer) -> None:
    with FaultProxy("127.0.0.1", echo.port) as proxy, connect(proxy) as sock:
        assert round_trip(sock, b"x") == b"x"
        echo.received.get(timeout=5)
        proxy.cut_direction("downstream")  # the server hears the client, the client hears nothing
        sock.sendall(b"ping")
        assert echo.received.get(timeout=5) == b"ping"
        assert_silent(sock)
        proxy.heal()
        assert_ended(sock)
    with FaultProxy("127.0.0.1", echo.port) as proxy, connect(proxy) as sock:
        assert round_trip(sock, b"y") == b"y"
        echo.received.get(timeout=5)
        proxy.cut_direction("upstream")
        sock.sendall(b"lost")
        assert_silent(sock)
        assert echo.received.empty()
        with pytest.raises(ValueError):
            proxy.cut_direction("sideways")  # type: ignore[arg-type]


def test_reset_gives_the_client_a_connection_error_and_the_proxy_goes_on(echo: EchoServer) -> None:
    with FaultProxy("127.0.0.1", echo.port) as proxy:
        sock = connect(proxy)
        assert round_trip(sock, b"one") == b"one"
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            sock.recv(1)
        sock.close()
        assert proxy.connection_count() == 0
        with connect(proxy) as again:
            assert round_trip(again, b"two") == b"two"


def test_a_refused_target_resets_the_client_and_close_ends_everything(echo: EchoServer) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead_port = unused.getsockname()[1]
    with FaultProxy("127.0.0.1", dead_port) as proxy:
        try:
            sock = connect(proxy)
        except ConnectionResetError:
            pass  # the reset came before connect() returned
        else:
            with sock:
                assert_ended(sock)
        proxy.retarget("127.0.0.1", echo.port)
        with connect(proxy) as live:
            assert round_trip(live, b"ok") == b"ok"
    proxy = FaultProxy("127.0.0.1", echo.port)
    sock = connect(proxy)
    assert round_trip(sock, b"z") == b"z"
    proxy.close()
    proxy.close()  # idempotent
    assert_ended(sock)
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()


def test_a_registry_of_proxies_cuts_by_name(echo: EchoServer, fault_proxies: ProxyRegistry) -> None:
    fault_proxies.add("b1", "127.0.0.1", echo.port)
    fault_proxies.add("b2", "127.0.0.1", echo.port)
    with connect(fault_proxies["b1"]) as one, connect(fault_proxies["b2"]) as two:
        fault_proxies.cut("b1")
        one.sendall(b"1")
        assert_silent(one)
        assert round_trip(two, b"2") == b"2"
        fault_proxies.heal()
        assert_ended(one)
    assert len(fault_proxies) == 2 and "b1" in fault_proxies
    with make_proxies({"zk": ("127.0.0.1", echo.port)}) as proxies, connect(proxies["zk"]) as sock:
        assert round_trip(sock, b"zk") == b"zk"


# --- replicas on disk ----------------------------------------------------------------------------------------------


def write_replica(log_dir: Path, batches: int = 30) -> None:
    """Batches of 1-3 records into t-0 through tidelog's Kafka engine, with small segments (several files)."""
    engine = tidelog.open(log_dir, engine="kafka", config={"log.segment.bytes": 2048}, background=False)
    try:
        engine.create_topic("t", 1)
        for b in range(batches):
            records = [
                Record(value=f"value {b}.{i} ".encode() * 4, key=f"k{b}".encode(), timestamp_ms=TS + b)
                for i in range(1 + b % 3)
            ]
            engine.produce("t", 0, records)
    finally:
        engine.close()


def write_checkpoint(log_dir: Path, high_watermark: int) -> None:
    (log_dir / REPLICATION_OFFSET_CHECKPOINT).write_text(f"0\n1\nt 0 {high_watermark}\n")


@pytest.fixture
def replicas(tmp_path: Path) -> dict[str, Path]:
    """Three log dirs holding the same replica of t-0: a, then b and c copied from it."""
    write_replica(tmp_path / "a")
    for name in ("b", "c"):
        shutil.copytree(tmp_path / "a", tmp_path / name)
    return {name: tmp_path / name for name in ("a", "b", "c")}


def test_copies_of_the_same_segments_are_identical(replicas: dict[str, Path]) -> None:
    batches = replica_batches(replicas["a"], "t", 0)
    assert len(batches) == 30
    assert len(list((replicas["a"] / "t-0").glob("*.log"))) > 2  # the batches span several segment files
    assert [b.base_offset for b in batches[1:]] == [b.last_offset + 1 for b in batches[:-1]]
    assert all(len(b.data) == int.from_bytes(b.data[8:12], "big") + 12 for b in batches)
    comparison = assert_replicas_identical(list(replicas.values()), "t", 0)
    assert comparison.up_to is None and "the whole logs" in comparison.report and "30 batches" in comparison.report
    assert_all_replicas_identical(list(replicas.values()))


def test_a_changed_byte_is_named_with_its_batch_offset(replicas: dict[str, Path]) -> None:
    log = read_replica(replicas["b"], "t", 0)
    batch, stored = log.batches[17], log.locations[17]
    path = replicas["b"] / "t-0" / stored.segment.name
    data = bytearray(path.read_bytes())
    data[stored.position + len(batch.data) - 3] ^= 0x01  # a byte of the last record's value
    path.write_bytes(bytes(data))
    with pytest.raises(AssertionError) as failure:
        assert_replicas_identical(replicas, "t", 0)
    report = str(failure.value)
    assert f"offset {batch.base_offset}: b differ(s) from a, c" in report, report
    assert "CRC INVALID" in report and "(records)" in report and stored.segment.name in report
    comparison = compare_replicas(replicas, "t", 0)
    assert comparison.first_difference_offset == batch.base_offset and comparison.differing == ["b"]
    # below the smallest high watermark the replicas agree
    for name, path in replicas.items():
        write_checkpoint(path, batch.base_offset if name == "c" else 1000)
    assert compare_replicas(replicas, "t", 0).identical
    assert not compare_replicas(replicas, "t", 0, up_to=batch.base_offset + 1).identical


def test_a_missing_batch_is_named_with_its_offset(replicas: dict[str, Path]) -> None:
    log = read_replica(replicas["c"], "t", 0)
    last, stored = log.batches[-1], log.locations[-1]
    with open(replicas["c"] / "t-0" / stored.segment.name, "r+b") as segment:
        segment.truncate(stored.position)
    comparison = compare_replicas(replicas, "t", 0)
    assert not comparison.identical and comparison.differing == ["c"]
    assert comparison.first_difference_offset == last.base_offset
    assert f"c: no batch here (its log ends after offset {last.base_offset - 1})" in comparison.report
    # the high watermarks all claim the last batch: every replica lacking it is reported
    for path in replicas.values():
        write_checkpoint(path, last.last_offset + 1)
    assert not compare_replicas(replicas, "t", 0).identical
    assert compare_replicas(replicas, "t", 0, up_to=last.base_offset).identical
    with pytest.raises(AssertionError, match="not every offset below"):
        assert_replicas_identical([replicas["c"]], "t", 0)


# --- delivery ------------------------------------------------------------------------------------------------------


def delivered() -> tuple[dict[int, list[tuple[int, bytes]]], dict[int, list[tuple[int, bytes]]]]:
    """Two producers' records over two partitions, all acknowledged and all read back; one more read back that was
    never acknowledged (allowed)."""
    acknowledged: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    for sequence in range(20):
        for producer in ("p1", "p2"):
            records = acknowledged[sequence % 2]
            records.append((len(records), make_value(producer, sequence, size=40)))
    consumed = {p: list(records) for p, records in acknowledged.items()}
    consumed[0].append((len(consumed[0]), make_value("p1", 100)))
    return acknowledged, consumed


def test_a_clean_run_passes() -> None:
    acknowledged, consumed = delivered()
    report = assert_delivery(acknowledged, consumed)
    assert report.ok and report.acknowledged == 40 and report.consumed == 41
    assert parse_value(make_value("p-1", 7, size=64)) == ("p-1", 7) and len(make_value("p", 1, size=64)) == 64


def test_a_lost_record_is_named() -> None:
    acknowledged, consumed = delivered()
    offset, value = consumed[1].pop(5)
    with pytest.raises(AssertionError) as failure:
        assert_delivery(acknowledged, consumed)
    first_line = str(failure.value).splitlines()[0]
    assert f"lost: partition 1 offset {offset} value {value.decode()!r}" in first_line


def test_a_duplicated_record_is_named() -> None:
    acknowledged, consumed = delivered()
    offset, value = consumed[0][3]
    consumed[0].append((100, value))  # written twice (a retried produce)
    report = check_delivery(acknowledged, consumed)
    assert [(o.kind, o.partition, o.offset) for o in report.offences] == [("duplicated", 0, 100)]
    assert f"first at partition 0 offset {offset}" in str(report)


def test_a_reordered_record_is_named() -> None:
    acknowledged, consumed = delivered()
    # p1's records in partition 0 sit at offsets 0, 2, 4...: swap the values at 2 and 4 (p1 sequences 2 and 4)
    (o2, v2), (o4, v4) = consumed[0][2], consumed[0][4]
    consumed[0][2], consumed[0][4] = (o2, v4), (o4, v2)
    report = check_delivery(acknowledged, consumed, check_offsets=False)
    assert [(o.kind, o.partition, o.offset, o.value) for o in report.offences] == [("reordered", 0, o4, v2)]
    assert "producer 'p1' sequence 2 comes after its sequence 4" in str(report)
    with pytest.raises(AssertionError, match="moved"):
        assert_delivery(acknowledged, consumed)  # with the offsets checked, both are also away from their acks


def test_out_of_offset_order_and_unparsable_values_are_caught() -> None:
    acknowledged, consumed = delivered()
    consumed[1][6], consumed[1][7] = consumed[1][7], consumed[1][6]
    consumed[1].append((50, b"garbage"))
    report = check_delivery(acknowledged, consumed)
    kinds = {o.kind for o in report.offences}
    assert "unparsable" in kinds and any("not read in offset order" in o.detail for o in report.offences)
