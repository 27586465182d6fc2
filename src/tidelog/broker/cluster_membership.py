"""A broker's membership in a ZooKeeper-coordinated cluster: its registration, the live brokers, the controller.

The znodes are Kafka's (zk_layout.py). At start the broker connects (`connect`, blocking, before the log is
opened: the log directories must belong to the cluster ZooKeeper names), then, once its listeners are bound,
`register`s:

- its registration, an ephemeral `/brokers/ids/<id>` owned by its ZooKeeper session. A node left by an earlier
  session of the same id (a broker killed and restarted before that session expired) is waited out, up to the
  session timeout; a live second broker with the same id is a start-up error.
- a watch on `/brokers/ids`: `live_brokers` is always the registered set, for Metadata.
- the controller election (Kafka's KafkaController.elect): whoever creates the ephemeral `/controller` first is the
  controller. It creates the znode and raises `/controller_epoch` by one in one ZooKeeper transaction that checks the
  epoch's znode version, so two brokers can never both win the same epoch, and a controller that lost its session
  and comes back finds a higher epoch (controller epoch fencing: every write a controller makes checks that its
  epoch is still current). The others watch `/controller` and elect again when it disappears.

ZooKeeper's callbacks run on kazoo's threads; the attributes the event loop reads (`live_brokers`, `controller_id`,
`controller_epoch`, `is_controller`, `role`) are replaced whole, never mutated, so a reader sees one consistent value.
`role` is what the controller part (controller.py) acts on: the epoch this broker won and the ZooKeeper version of
`/controller_epoch` it left, which every controller write checks. Parts that follow the cluster register a listener
(`add_listener`), called on a kazoo thread after each change (it must not block).
When the session expires (the broker was paused or cut off longer than zookeeper.session.timeout.ms) ZooKeeper has
dropped the broker's ephemeral nodes: it stops being controller at once and, when kazoo connects a new session,
registers and joins the election again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat

from tidelog.broker import zk_layout as zk
from tidelog.errors import TidelogError
from tidelog.kafka_uuid import new_kafka_uuid

log = logging.getLogger("tidelog.cluster")

NO_CONTROLLER = -1
REGISTRATION_RETRY_S = 0.5


class ClusterError(TidelogError):
    """The broker cannot join the cluster (ZooKeeper unreachable, its id taken by a live broker)."""


@dataclass(frozen=True, slots=True)
class ControllerRole:
    """This broker is the controller of `epoch`; `epoch_zk_version` is the version of /controller_epoch its election
    left, which each of its writes checks (a later election changes it, and the write fails)."""

    epoch: int
    epoch_zk_version: int


class ClusterMembership:
    def __init__(
        self,
        connect: str,
        broker_id: int,
        *,
        session_timeout_ms: int,
        connection_timeout_ms: int,
        rack: str | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.rack = rack
        self._connect = connect
        self._session_timeout_ms = session_timeout_ms
        self._connection_timeout_ms = connection_timeout_ms
        self._listeners: list[Callable[[], None]] = [on_change] if on_change is not None else []
        self._client = KazooClient(hosts=connect, timeout=session_timeout_ms / 1000)
        self._registration: bytes | None = None
        self._session_lost = False
        self._lock = threading.Lock()  # one election or registration at a time
        self._closed = False
        self.cluster_id = ""
        self.live_brokers: dict[int, zk.BrokerRegistration] = {}
        self.controller_id = NO_CONTROLLER
        self.controller_epoch = 0
        self.is_controller = False
        self.role: ControllerRole | None = None  # set while this broker is the controller
        # the ZooKeeper czxid of this broker's registration, Kafka's broker epoch (-1: not registered yet)
        self.broker_epoch = -1

    @property
    def client(self) -> KazooClient:
        """The ZooKeeper client (its session is this broker's membership), for the parts that read and write the
        cluster's other znodes."""
        return self._client

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (on a kazoo thread; it must not block) after every change of the live brokers, the
        controller or the session."""
        self._listeners.append(listener)

    def _on_change(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("a cluster membership listener failed")

    # --- start and stop ---------------------------------------------------------------------------------------

    def connect(self) -> str:
        """Connect, create the top-level paths a Kafka cluster has, and return the cluster id (created by the
        first broker of a new cluster). Blocking."""
        try:
            self._client.start(timeout=self._connection_timeout_ms / 1000)
        except KazooTimeoutError:
            self._client.close()
            raise ClusterError(
                f"cannot connect to ZooKeeper at {self._connect} within {self._connection_timeout_ms} ms "
                "(zookeeper.connect, zookeeper.connection.timeout.ms)"
            ) from None
        self._client.add_listener(self._session_state_changed)
        for path in zk.PERSISTENT_PATHS:
            self._client.ensure_path(path)
        self.cluster_id = self._get_or_create_cluster_id()
        return self.cluster_id

    def _get_or_create_cluster_id(self) -> str:
        try:
            data, _stat = self._client.get(zk.CLUSTER_ID_PATH)
        except NoNodeError:
            self._client.ensure_path("/cluster")
            with contextlib.suppress(NodeExistsError):  # another broker of a new cluster may be first
                self._client.create(zk.CLUSTER_ID_PATH, zk.encode_cluster_id(new_kafka_uuid()))
            data, _stat = self._client.get(zk.CLUSTER_ID_PATH)
        return zk.decode_cluster_id(data)

    def register(self, endpoints: tuple[zk.Endpoint, ...]) -> None:
        """Register this broker (blocking: waits out a registration an earlier session of this id left), watch the
        live brokers, and join the controller election."""
        self._registration = zk.BrokerRegistration(
            self.broker_id, endpoints, self.rack, int(time.time() * 1000)
        ).encode()
        self._create_registration(deadline=time.monotonic() + self._session_timeout_ms / 1000 + 5)
        self._client.ChildrenWatch(zk.BROKER_IDS_PATH, self._brokers_changed)
        self._client.DataWatch(zk.CONTROLLER_PATH, self._controller_changed)

    def _create_registration(self, deadline: float) -> None:
        path = zk.broker_path(self.broker_id)
        assert self._registration is not None
        while True:
            try:
                self._client.create(path, self._registration, ephemeral=True, makepath=True)
                stat = self._client.exists(path)
                self.broker_epoch = stat.czxid if stat is not None else -1
                log.info("registered as broker %d at %s", self.broker_id, path)
                return
            except NodeExistsError:
                _data, stat = self._client.get(path)
                if stat.ephemeralOwner == self._client.client_id[0]:
                    return  # ours already (a retried create)
                if time.monotonic() >= deadline:
                    raise ClusterError(
                        f"broker id {self.broker_id} is registered at {path} by another live ZooKeeper session: "
                        "another broker with the same broker.id is running"
                    ) from None
                time.sleep(REGISTRATION_RETRY_S)  # an earlier session of ours: ZooKeeper drops it at its timeout

    def resign(self) -> None:
        """Give up the controller role and the registration now (a controlled shutdown): the others elect at once
        instead of waiting for the session to time out."""
        with self._lock:
            self._closed = True
            # the registration first: the controller the others elect next never sees this broker live
            self._delete_if_ours(zk.broker_path(self.broker_id))
            if self.is_controller:
                self._delete_if_ours(zk.CONTROLLER_PATH)
                self.is_controller = False
                self.role = None

    def abdicate(self) -> None:
        """Stop being the controller but stay a broker of the cluster (a controller whose writes were fenced by a
        newer epoch): /controller goes if it is still ours, and every broker elects again."""
        with self._lock:
            if self.is_controller:
                log.warning("giving up the controller role of epoch %d", self.controller_epoch)
            self.is_controller = False
            self.role = None
            self._delete_if_ours(zk.CONTROLLER_PATH)
        self._on_change()

    def close(self) -> None:
        self.resign()
        self._client.stop()
        self._client.close()

    def _delete_if_ours(self, path: str) -> None:
        try:
            _data, stat = self._client.get(path)
            if stat.ephemeralOwner == self._client.client_id[0]:
                self._client.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass
        except Exception as exc:  # ZooKeeper gone: the session timeout will remove it
            log.warning("could not remove %s at shutdown: %s", path, exc)

    # --- the session ------------------------------------------------------------------------------------------

    def _session_state_changed(self, state: str) -> None:
        """kazoo's connection listener (must not block): LOST means ZooKeeper expired the session and dropped this
        broker's ephemeral nodes."""
        if state == KazooState.LOST:
            self._session_lost = True
            if self.is_controller:
                log.warning("ZooKeeper session expired: no longer the controller (epoch %d)", self.controller_epoch)
            self.is_controller = False
            self.role = None
            self.controller_id = NO_CONTROLLER
            self._on_change()
        elif state == KazooState.CONNECTED and self._session_lost and not self._closed:
            self._session_lost = False
            self._client.handler.spawn(self._rejoin)

    def _rejoin(self) -> None:
        log.info("new ZooKeeper session: registering broker %d again", self.broker_id)
        try:
            self._create_registration(deadline=time.monotonic() + self._session_timeout_ms / 1000 + 5)
        except Exception:
            log.exception("could not register again after the session expired")
            return
        self._elect()

    # --- live brokers -----------------------------------------------------------------------------------------

    def _brokers_changed(self, children: list[str]) -> None:
        brokers = {}
        for broker_id in zk.sorted_broker_ids(children):
            try:
                data, _stat = self._client.get(zk.broker_path(broker_id))
                brokers[broker_id] = zk.BrokerRegistration.decode(broker_id, data)
            except NoNodeError:
                continue  # gone meanwhile: the next event drops it anyway
            except zk.MalformedZnodeError as exc:
                log.warning("ignoring broker %d: %s", broker_id, exc)
        if brokers.keys() != self.live_brokers.keys():
            log.info("live brokers: %s", ", ".join(map(str, brokers)) or "none")
        self.live_brokers = brokers
        self._on_change()

    # --- the controller ---------------------------------------------------------------------------------------

    def _controller_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is None:
            self.controller_id = NO_CONTROLLER
            self.is_controller = False
            self.role = None
            if not self._closed and not self._session_lost:
                self._client.handler.spawn(self._elect)
        else:
            try:
                self.controller_id = zk.decode_controller(data)
            except zk.MalformedZnodeError as exc:
                log.warning("%s", exc)
            if self.controller_id != self.broker_id and self.is_controller:
                self.is_controller = False  # another broker's /controller (ours was removed by hand)
                self.role = None
        self._on_change()

    def _elect(self) -> None:
        """Try to become the controller: create /controller and raise /controller_epoch in one transaction."""
        with self._lock:
            if self._closed:
                return
            try:
                epoch_data, epoch_stat = self._client.get(zk.CONTROLLER_EPOCH_PATH)
                epoch = zk.decode_controller_epoch(epoch_data)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    self._client.create(zk.CONTROLLER_EPOCH_PATH, zk.encode_controller_epoch(0))
                epoch_data, epoch_stat = self._client.get(zk.CONTROLLER_EPOCH_PATH)
                epoch = zk.decode_controller_epoch(epoch_data)
            transaction = self._client.transaction()
            transaction.create(
                zk.CONTROLLER_PATH, zk.encode_controller(self.broker_id, int(time.time() * 1000)), ephemeral=True
            )
            transaction.set_data(
                zk.CONTROLLER_EPOCH_PATH, zk.encode_controller_epoch(epoch + 1), version=epoch_stat.version
            )
            results = transaction.commit()
            if any(isinstance(result, Exception) for result in results):
                self._learn_controller()  # another broker won (the node exists, or the epoch moved)
                return
            self.controller_epoch = epoch + 1
            self.controller_id = self.broker_id
            self.role = ControllerRole(epoch + 1, results[1].version)
            self.is_controller = True
            log.info("elected controller with epoch %d", self.controller_epoch)
        self._on_change()

    def _learn_controller(self) -> None:
        try:
            data, _stat = self._client.get(zk.CONTROLLER_PATH)
            self.controller_id = zk.decode_controller(data)
            epoch_data, _stat = self._client.get(zk.CONTROLLER_EPOCH_PATH)
            self.controller_epoch = zk.decode_controller_epoch(epoch_data)
        except NoNodeError:
            self._client.handler.spawn(self._elect)  # it went away between our attempt and this read
        except zk.MalformedZnodeError as exc:
            log.warning("%s", exc)
