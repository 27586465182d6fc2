"""RocketMQ master/slave groups in a cluster: which brokers copy one CommitLog, who is master, who is in sync.

RocketMQ replicates a whole broker (one CommitLog for every topic), not a partition: a master and its slaves share a
`brokerName` (`tidelog.rocketmq.brokerName`). A group's state is kept in ZooKeeper as RocketMQ 5's controller keeps
it (ReplicasInfoManager: SyncStateInfo and BrokerReplicaInfo; zk_layout.py has the znodes):
`/tidelog/rocketmq/<brokerName>` holds every broker that joined the group, the master (-1: none), the master epoch,
the SyncStateSet (the brokers in sync with the master) and its epoch, the master flavour (SYNC_MASTER or
ASYNC_MASTER) and the CommitLog offset the master's epoch began at; every change is a conditional write on the
znode's version. `/tidelog/rocketmq/<brokerName>/brokers/<id>` holds each member's HA address. Liveness is the
cluster's (`/brokers/ids`).

Who writes what:
- a broker joining (`start`, blocking, off the loop): adds itself to `brokers`; creates the group when it is the
  first, as master if its configured `brokerRole` is a master role (master epoch 1, SyncStateSet itself), else
  without a master (master epoch 0); a configured master that finds a group that never had a master takes it (as
  RocketMQ 5 makes the first broker to ask master);
- the controller (controller.py, `elect_master`): when the master's registration is gone, the first live member of
  the SyncStateSet becomes master, master epoch + 1, SyncStateSet = {it} (ElectMasterEvent); with none, the group has
  no master (SyncStateSet kept) until a member of it comes back, or - `unclean.leader.election.enable` - any live
  member leads. It also mirrors the group into each partition state of the group's topics (`group_state`: leader =
  the live master, ISR = SyncStateSet, leader epoch = the master epoch, or the previous one + 1 when that is not
  higher);
- the master (its `tidelog-rocketmq-role` thread, every CHECK_INTERVAL_S): the SyncStateSet (RocketMQ 5's
  AlterSyncStateSet): a slave leaves it when it has been disconnected or silent for haHousekeepingInterval, or is
  haSlaveFallbehindMax or more behind; it joins once it reported the master's CommitLog end of the previous check.
  After a promotion it writes the epoch's start offset;
- every member, on the same thread: takes the role the group gives it (`become_master` with the group's flavour,
  `become_slave` of the master's HA address), and publishes its HA address and, on a slave, its HA connection's own
  address, by which the master tells its connections apart.

Produce on a group's partitions (replica_manager.py calls `CommitLogReplication`): the master alone appends; an
acks=all produce on a SYNC_MASTER is refused before the append with NOT_ENOUGH_REPLICAS when no slave is connected
and near enough, and after the append waits (on a thread of its own pool, not the event loop) until a slave holds
it: SlaveNotAvailableError is NOT_ENOUGH_REPLICAS_AFTER_APPEND, FlushSlaveTimeoutError (syncFlushTimeout) is
REQUEST_TIMED_OUT; both are errors Kafka producers retry, an idempotent one without duplicates (the message is
stored either way). ASYNC_MASTER answers after the local write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from tidelog.atomic_files import write_atomically
from tidelog.broker import zk_layout as zk
from tidelog.errors import ConfigError, NotEnoughReplicasError
from tidelog.storage.api import MasterSlaveStore

log = logging.getLogger("tidelog.rocketmq.groups")

SLAVE = "SLAVE"
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
SYNC_MASTER = "SYNC_MASTER"
NO_MASTER = -1
CHECK_INTERVAL_S = 0.5  # the role thread's round: roles, published addresses, the master's SyncStateSet check
WAIT_THREADS = 64  # SYNC_MASTER waits in flight (each blocks a thread up to syncFlushTimeout)
MEMBER_PROGRESS_S = 1.0  # how often at most a member writes its CommitLog end into its znode
EPOCH_HISTORY = 100  # the (epoch, start offset) entries the group znode keeps
EPOCH_FILE = "tidelog-rocketmq-epoch"  # in the broker's log dir: the master epoch its records come from
BROKER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class GroupView:
    name: str
    state: zk.RocketMQGroup | None
    version: int  # the group znode's version (-1: none)
    members: Mapping[int, zk.RocketMQMember] = field(default_factory=dict)


def elect_master(group: zk.RocketMQGroup, live: Collection[int], unclean: bool) -> zk.RocketMQGroup | None:
    """The group the controller writes when its master is gone, or None if nothing changes (module docstring)."""
    if group.master in live or (group.master == NO_MASTER and group.master_epoch == 0):
        return None  # a live master; or a group that never had one: its first configured master takes it
    candidates = [b for b in group.sync_state_set if b in live and b != group.master]
    if not candidates and unclean:
        candidates = [b for b in group.brokers if b in live]
        if candidates:
            log.warning(
                "group %s: unclean election: broker %d is master without being in the SyncStateSet %s",
                group.brokers, candidates[0], list(group.sync_state_set),
            )  # fmt: skip
    if not candidates:
        return None if group.master == NO_MASTER else replace(group, master=NO_MASTER)
    new = candidates[0]
    return replace(
        group,
        master=new,
        master_epoch=group.master_epoch + 1,
        sync_state_set=(new,),
        sync_state_set_epoch=group.sync_state_set_epoch + 1,
        epoch_start_offset=-1,
    )


def truncation_point(group: zk.RocketMQGroup, local_epoch: int | None) -> int | None:
    """Where a store whose records come from master epoch `local_epoch` (None: not known) must cut its CommitLog
    before following the group's master: the start of the first epoch after its own (every later master held the
    log of the one before up to where its own epoch began, so what the store holds below that start is the
    group's); the oldest start kept when its epoch is older than the history (or not known); None when the store
    is of the current epoch."""
    if local_epoch is not None and local_epoch >= group.master_epoch:
        return None
    later = [start for epoch, start in group.epochs if local_epoch is None or epoch > local_epoch]
    return min(later) if later else min((start for _epoch, start in group.epochs), default=None)


def read_local_epoch(path: Path) -> int | None:
    """The master epoch this store's records come from (the file `EPOCH_FILE` in its log dir), or None."""
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def group_state(group: zk.RocketMQGroup, live: Collection[int], controller_epoch: int) -> zk.PartitionState:
    """A partition of the group's topics: leader the live master, leader epoch the master epoch, ISR the set."""
    leader = group.master if group.master in live else zk.NO_LEADER
    return zk.PartitionState(leader, group.master_epoch, group.sync_state_set, controller_epoch)


def placement(group: zk.RocketMQGroup) -> tuple[int, ...]:
    """A partition's replicas on the group: the master first, then the others in joining order."""
    return tuple(sorted(group.brokers, key=lambda b: b != group.master))


class RocketMQGroups:
    """Every broker's view of the groups (watches; `view` is replaced whole), and its own membership and role."""

    def __init__(
        self,
        client: KazooClient,
        broker_id: int,
        broker_name: str,
        store: MasterSlaveStore,
        *,
        configured_role: str,
        housekeeping_interval_ms: int,
        slave_fallbehind_max: int,
        live_brokers: Callable[[], Collection[int]],
        log_dir: Path,
        serves_reads: bool = False,
    ) -> None:
        if not BROKER_NAME.match(broker_name):
            raise ConfigError(
                f"config tidelog.rocketmq.brokerName: {broker_name!r} is not 1-64 characters of [a-zA-Z0-9_-]"
            )
        self.client = client
        self.broker_id = broker_id
        self.broker_name = broker_name
        self.store = store
        self.configured_role = configured_role
        self.housekeeping_ms = housekeeping_interval_ms
        self.slave_fallbehind_max = slave_fallbehind_max
        self.live_brokers = live_brokers
        self.serves_reads = serves_reads  # slaveReadEnable, published in the member znode
        self.epoch_file = log_dir / EPOCH_FILE
        self.local_epoch = read_local_epoch(self.epoch_file)
        self.view: Mapping[str, GroupView] = {}
        self._host = "127.0.0.1"
        self._lock = threading.RLock()  # kazoo calls a new watch's function in the registering thread
        self._states: dict[str, tuple[zk.RocketMQGroup | None, int]] = {}
        self._members: dict[str, dict[int, zk.RocketMQMember]] = {}
        self._watched: set[str] = set()
        self._watched_members: set[tuple[str, int]] = set()
        self._listeners: list[Callable[[], None]] = []
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tidelog-rocketmq-role", daemon=True)
        self._published: zk.RocketMQMember | None = None
        self._following: tuple[str, int] | None = None  # the master's HA address and epoch
        self._last_seen: dict[int, float] = {}  # the master's slaves: when each was last seen in step
        self._end_at_last_check = 0
        self._topics_published: dict[str, tuple[str, int]] = {}  # the master's: what its topic znodes say
        self._topics_applied: set[tuple[str, str]] = set()  # a slave's: (topic, id) whose creation offset it took
        self.waits = ThreadPoolExecutor(WAIT_THREADS, thread_name_prefix="tidelog-sync-master")

    # --- start and stop ---------------------------------------------------------------------------------------

    def start(self, advertised_host: str) -> None:
        """Join the group and follow every group (blocking: off the loop); then take the role it gives."""
        self._host = advertised_host
        self.client.ensure_path(zk.rocketmq_members_path(self.broker_name))
        self._join()
        self.client.ChildrenWatch(zk.ROCKETMQ_GROUPS_PATH, self._groups_changed)
        self._thread.start()

    def _join(self) -> None:
        path = zk.rocketmq_group_path(self.broker_name)
        me = self.broker_id
        master_role = self.configured_role if self.configured_role in MASTER_ROLES else SYNC_MASTER
        while True:
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                data, stat = None, None
            group = zk.RocketMQGroup.decode(self.broker_name, data) if data else None
            if group is None:
                first = self.configured_role in MASTER_ROLES
                new = zk.RocketMQGroup(
                    (me,), me if first else NO_MASTER, 1 if first else 0, (me,) if first else (), 1, master_role
                )
            else:
                new = group
                if me not in group.brokers:
                    new = replace(new, brokers=(*group.brokers, me))
                if group.master == NO_MASTER and group.master_epoch == 0 and self.configured_role in MASTER_ROLES:
                    new = replace(
                        new, master=me, master_epoch=1, sync_state_set=(me,),
                        sync_state_set_epoch=group.sync_state_set_epoch + 1, master_role=self.configured_role,
                    )  # fmt: skip
                if new == group:
                    break
            try:
                if stat is None:
                    self.client.create(path, new.encode())
                else:
                    self.client.set(path, new.encode(), version=stat.version)
            except (NodeExistsError, BadVersionError):
                continue  # another member joined meanwhile: read again
            break
        member_path = zk.rocketmq_member_path(self.broker_name, me)
        with contextlib.suppress(NodeExistsError):
            self.client.create(member_path, zk.RocketMQMember().encode())
        log.info("joined RocketMQ group %s as broker %d (configured %s)", self.broker_name, me, self.configured_role)

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.waits.shutdown(wait=False, cancel_futures=True)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called (on a kazoo thread, must not block) after each new view."""
        self._listeners.append(listener)

    # --- the watches (kazoo threads) --------------------------------------------------------------------------

    def _groups_changed(self, children: list[str]) -> bool | None:
        if self._stopping:
            return False
        with self._lock:
            for name in sorted(set(children) - self._watched):
                self._watched.add(name)
                self.client.DataWatch(zk.rocketmq_group_path(name), partial(self._group_changed, name))
                self.client.ChildrenWatch(zk.rocketmq_members_path(name), partial(self._members_changed, name))
        return None

    def _group_changed(self, name: str, data: bytes | None, stat: Any, _event: Any = None) -> bool | None:
        if self._stopping:
            return False
        with self._lock:
            try:
                state = zk.RocketMQGroup.decode(name, data) if data else None
            except zk.MalformedZnodeError as exc:
                log.warning("ignoring RocketMQ group %s: %s", name, exc)
                state = None
            self._states[name] = (state, stat.version if stat is not None else -1)
            self._publish()
        return None

    def _members_changed(self, name: str, children: list[str]) -> bool | None:
        if self._stopping:
            return False
        with self._lock:
            for child in children:
                if not child.isdigit() or (name, int(child)) in self._watched_members:
                    continue
                self._watched_members.add((name, int(child)))
                self.client.DataWatch(
                    zk.rocketmq_member_path(name, int(child)), partial(self._member_changed, name, int(child))
                )
        return None

    def _member_changed(self, name: str, broker_id: int, data: bytes | None, _stat: Any, _event: Any = None) -> bool:
        if self._stopping:
            return False
        with self._lock:
            members = self._members.setdefault(name, {})
            if data is None:
                members.pop(broker_id, None)
            else:
                try:
                    members[broker_id] = zk.RocketMQMember.decode(zk.rocketmq_member_path(name, broker_id), data)
                except zk.MalformedZnodeError as exc:
                    log.warning("ignoring %s", exc)
            self._publish()
        return True

    def _publish(self) -> None:
        self.view = {
            name: GroupView(name, state, version, dict(self._members.get(name, {})))
            for name, (state, version) in self._states.items()
        }
        self._wake.set()
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("a RocketMQ group listener failed")

    # --- what the others ask -------------------------------------------------------------------------------------

    def group_of(self, replicas: Collection[int]) -> GroupView | None:
        """The group whose brokers are exactly `replicas` (a topic placed on it) if it has two or more: the
        partitions the controller mirrors from the group and the HA service copies."""
        return self.placed_on(replicas) if len(replicas) >= 2 else None

    def placed_on(self, replicas: Collection[int]) -> GroupView | None:
        """The group whose brokers are exactly `replicas`, whatever its size (a lone master's group included)."""
        wanted = set(replicas)
        return next((g for g in self.view.values() if g.state is not None and set(g.state.brokers) == wanted), None)

    def placement_for(self, name: str, factor: int) -> tuple[int, ...]:
        """The replicas of every partition of a new topic `name`: all the brokers of one group with a master and at
        least `factor` brokers (chosen by the topic's name), master first. A factor below the group's size is
        raised to it (the whole CommitLog is copied to every member anyway), so every partition is led by a
        group's master and follows it through failovers. No such group: a ValueError (the caller raises
        INVALID_REPLICATION_FACTOR from its text)."""
        groups = sorted(
            (g for g in self.view.values() if g.state is not None and g.state.master != NO_MASTER),
            key=lambda g: g.name,
        )
        fitting = [g for g in groups if g.state is not None and len(g.state.brokers) >= factor]
        if not fitting:
            sizes = ", ".join(f"{g.name}: {len(g.state.brokers)}" for g in groups if g.state is not None)
            raise ValueError(
                f"Replication factor {factor} needs a RocketMQ master/slave group of at least {factor} brokers with a "
                f"master; the groups with a master are {sizes or 'none'} (each group copies one CommitLog: a "
                "topic's replicas are its group's brokers)"
            )
        chosen = fitting[sum(name.encode()) % len(fitting)]
        assert chosen.state is not None
        return placement(chosen.state)

    # --- this broker's role (the tidelog-rocketmq-role thread) --------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(CHECK_INTERVAL_S)
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._round()
            except (KazooException, OSError) as exc:
                log.warning("RocketMQ group %s: %s; trying again", self.broker_name, exc)
            except Exception:
                log.exception("RocketMQ group %s: the role round failed", self.broker_name)

    def _round(self) -> None:
        view = self.view.get(self.broker_name)
        if view is None or view.state is None:
            return
        group, me, store = view.state, self.broker_id, self.store
        if group.master == me:
            if store.role == SLAVE:
                log.info(
                    "RocketMQ group %s: broker %d is master now (master epoch %d): promoting the store",
                    self.broker_name, me, group.master_epoch,
                )  # fmt: skip
                self._set_local_epoch(group.master_epoch)
                store.become_master(group.master_role)
                self._following = None
                self._last_seen.clear()
                self._end_at_last_check = store.commitlog_end
            self._set_local_epoch(group.master_epoch)
            self._publish_member(self._ha_address(), None)
            if group.epoch_start_offset < 0:
                start = store.commitlog_end
                epochs = (*[e for e in group.epochs if e[0] < group.master_epoch], (group.master_epoch, start))
                self._write_group(view, replace(group, epoch_start_offset=start, epochs=epochs[-EPOCH_HISTORY:]))
            else:
                self._check_sync_state_set(view)
            self._publish_topics()
            return
        master = view.members.get(group.master) if group.master != NO_MASTER else None
        address = master.ha_address if master is not None else None
        following = (address, group.master_epoch) if address is not None else None
        # a new master is followed once it wrote where its epoch began: a store with more must cut there first
        if (
            following is not None
            and group.epoch_start_offset >= 0
            and (store.role != SLAVE or self._following != following)
        ):
            cut = truncation_point(group, self.local_epoch)
            end = store.commitlog_end
            log.info(
                "RocketMQ group %s: following master %d at %s (master epoch %d) from CommitLog offset %d%s",
                self.broker_name, group.master, address, group.master_epoch, min(end, end if cut is None else cut),
                f" (cut from {end}: records of epoch {self.local_epoch} past the start of a later epoch)"
                if cut is not None and cut < end else "",
            )  # fmt: skip
            store.become_slave(following[0], cut)
            self._set_local_epoch(group.master_epoch)
            self._following = following
        if store.role == SLAVE:
            status = store.ha_status().master
            local = status.local_address if status is not None and status.connected else None
            self._publish_member(None, local)
            self._apply_topics()

    def _publish_topics(self) -> None:
        """The master: a znode per topic with the CommitLog offset it created the topic at; gone with the topic."""
        topics = self.store.topic_creation_offsets()
        for name, (topic_id, since) in topics.items():
            if self._topics_published.get(name) != (topic_id, since):
                data = zk.RocketMQTopic(topic_id, since).encode()
                path = zk.rocketmq_topic_path(self.broker_name, name)
                try:
                    self.client.create(path, data, makepath=True)
                except NodeExistsError:
                    self.client.set(path, data)
                self._topics_published[name] = (topic_id, since)
        for name in [n for n in self._topics_published if n not in topics]:
            with contextlib.suppress(NoNodeError):
                self.client.delete(zk.rocketmq_topic_path(self.broker_name, name))
            del self._topics_published[name]

    def _apply_topics(self) -> None:
        """A slave: a topic it created after its master's messages of it arrived gets them (engine's
        dispatch_topic_from), once the master's topic znode names the same topic id."""
        for name, (topic_id, since) in self.store.topic_creation_offsets().items():
            if (name, topic_id) in self._topics_applied:
                continue
            path = zk.rocketmq_topic_path(self.broker_name, name)
            try:
                published = zk.RocketMQTopic.decode(path, self.client.get(path)[0])
            except NoNodeError:
                continue  # the master has not created it yet: its messages cannot be here yet either
            except zk.MalformedZnodeError as exc:
                log.warning("ignoring %s", exc)
                continue
            if published.topic_id != topic_id:
                continue  # a namesake's: the master has not created this one yet
            if published.since < since:
                self.store.dispatch_topic_from(name, published.since)
            self._topics_applied.add((name, topic_id))

    def _set_local_epoch(self, epoch: int) -> None:
        """Record that this store's records from now on come from master epoch `epoch` (after any cut)."""
        if self.local_epoch != epoch:
            write_atomically(self.epoch_file, f"{epoch}\n")
            self.local_epoch = epoch

    def _ha_address(self) -> str | None:
        port = self.store.ha_port
        return f"{self._host}:{port}" if port is not None else None

    def _publish_member(self, ha_address: str | None, ha_client: str | None) -> None:
        """The member znode: written when an address changed, or when the CommitLog end moved and the last write
        is MEMBER_PROGRESS_S old."""
        now_ms = int(time.time() * 1000)
        end = self.store.commitlog_end
        published = self._published
        if (
            published is not None
            and (published.ha_address, published.ha_client) == (ha_address, ha_client)
            and (end == published.commitlog_end or now_ms - published.updated_ms < MEMBER_PROGRESS_S * 1000)
        ):
            return
        member = zk.RocketMQMember(ha_address, ha_client, end, now_ms, self.serves_reads)
        self.client.set(zk.rocketmq_member_path(self.broker_name, self.broker_id), member.encode())
        self._published = member

    def _write_group(self, view: GroupView, new: zk.RocketMQGroup) -> bool:
        try:
            self.client.set(zk.rocketmq_group_path(view.name), new.encode(), version=view.version)
        except BadVersionError:
            return False  # changed meanwhile: the next round sees the new state
        return True

    def _check_sync_state_set(self, view: GroupView) -> None:
        """The master's AlterSyncStateSet (module docstring)."""
        group = view.state
        assert group is not None
        store, me = self.store, self.broker_id
        now = time.monotonic()
        connections = {s.address: s for s in store.ha_status().slaves}
        end = store.commitlog_end
        in_sync = [me]
        for broker in group.brokers:
            if broker == me:
                continue
            member = view.members.get(broker)
            slave = connections.get(member.ha_client) if member is not None and member.ha_client else None
            reporting = (
                slave is not None and slave.reported_offset >= 0 and slave.since_last_report_ms < self.housekeeping_ms
            )
            if slave is not None and reporting and slave.lag_bytes >= self.slave_fallbehind_max:
                continue  # too far behind: out at once
            if (
                reporting
                and slave is not None
                and (broker in group.sync_state_set or slave.reported_offset >= self._end_at_last_check)
            ):
                self._last_seen[broker] = now
                in_sync.append(broker)
            elif broker in group.sync_state_set:
                seen = self._last_seen.setdefault(broker, now)
                if now - seen < self.housekeeping_ms / 1000:
                    in_sync.append(broker)  # silent or away for less than haHousekeepingInterval yet
        self._end_at_last_check = end
        if set(in_sync) != set(group.sync_state_set):
            new = replace(group, sync_state_set=tuple(in_sync), sync_state_set_epoch=group.sync_state_set_epoch + 1)
            if self._write_group(view, new):
                log.info(
                    "RocketMQ group %s: SyncStateSet %s -> %s (epoch %d)",
                    self.broker_name, list(group.sync_state_set), in_sync, new.sync_state_set_epoch,
                )  # fmt: skip


class CommitLogReplication:
    """What acks=all needs from a group's master (module docstring); replica_manager.py calls it."""

    def __init__(self, store: MasterSlaveStore, waits: ThreadPoolExecutor) -> None:
        self.store = store
        self.waits = waits

    def check_before_append(self, topic: str, partition: int) -> None:
        if self.store.role == SYNC_MASTER and not self.store.slave_available():
            raise NotEnoughReplicasError(
                f"{topic}-{partition}: this SYNC_MASTER has no slave connected and within haSlaveFallbehindMax"
            )

    async def wait_replicated(self, topic: str, partition: int, end_offset: int) -> None:
        if self.store.role != SYNC_MASTER:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.waits, self.store.wait_queue_replicated, topic, partition, end_offset)
