"""Operator tools for RocketMQ master/slave groups in a cluster, reading and writing ZooKeeper as the brokers do
(broker/rocketmq_groups.py, the znodes in broker/zk_layout.py):

    tidelog rocketmq ha-status   --zookeeper HOST:PORT [--broker-name G]
    tidelog rocketmq switch-role --zookeeper HOST:PORT --broker-name G --master ID [--force]

ha-status prints one row per member of each group: live (registered in /brokers/ids) or not, master or slave, in
the SyncStateSet or not, its CommitLog end and a slave's lag behind its master in bytes, from the member znodes
(each member writes its CommitLog end there at most once a second when it moved; the age of that figure is shown),
then the group's master epoch and where it began.

switch-role is RocketMQ 4's manual switch, done as RocketMQ 5's controller elects: it names broker ID master of
group G with the master epoch + 1 and the SyncStateSet {ID}, in one write conditional on the znode's version (so it
never overwrites a change it did not see). ID must be a live member of the group and, unless --force, in the
SyncStateSet (a broker outside it may lack acknowledged records: --force is an unclean election). The brokers
follow the znode: the old master cuts what the new one lacks and follows it (docs/cluster.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import TextIO

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError
from rich.console import Console
from rich.table import Table

from tidelog.broker import zk_layout as zk
from tidelog.errors import ToolError

CONNECT_TIMEOUT_S = 15.0


def _connect(zookeeper: str) -> KazooClient:
    client = KazooClient(hosts=zookeeper)
    try:
        client.start(timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:
        raise ToolError(f"cannot reach ZooKeeper at {zookeeper}: {exc}") from exc
    return client


def _group(client: KazooClient, name: str) -> tuple[zk.RocketMQGroup, int]:
    try:
        data, stat = client.get(zk.rocketmq_group_path(name))
    except NoNodeError:
        raise ToolError(f"no RocketMQ group {name!r} in ZooKeeper ({zk.rocketmq_group_path(name)})") from None
    return zk.RocketMQGroup.decode(name, data), stat.version


def _members(client: KazooClient, name: str) -> dict[int, zk.RocketMQMember]:
    members = {}
    for child in client.get_children(zk.rocketmq_members_path(name)):
        if child.isdigit():
            path = zk.rocketmq_member_path(name, int(child))
            members[int(child)] = zk.RocketMQMember.decode(path, client.get(path)[0])
    return members


def ha_status_rows(client: KazooClient, broker_name: str | None = None) -> list[dict[str, object]]:
    """One dict per member of each group (or of `broker_name`): what ha-status prints."""
    names = [broker_name] if broker_name else sorted(client.get_children(zk.ROCKETMQ_GROUPS_PATH))
    live = {int(child) for child in client.get_children(zk.BROKER_IDS_PATH) if child.isdigit()}
    now_ms = int(time.time() * 1000)
    rows: list[dict[str, object]] = []
    for name in names:
        group, _version = _group(client, name)
        members = _members(client, name)
        master = members.get(group.master)
        master_end = master.commitlog_end if master is not None else -1
        for broker in group.brokers:
            member = members.get(broker, zk.RocketMQMember())
            is_master = broker == group.master
            lag = (
                master_end - member.commitlog_end if not is_master and master_end >= 0 <= member.commitlog_end else None
            )
            rows.append(
                {
                    "group": name, "broker": broker, "live": broker in live,
                    "role": "master" if is_master else "slave", "in_sync": broker in group.sync_state_set,
                    "commitlog_end": member.commitlog_end, "lag_bytes": lag,
                    "age_ms": now_ms - member.updated_ms if member.updated_ms else None,
                    "master_epoch": group.master_epoch, "epoch_start_offset": group.epoch_start_offset,
                }
            )  # fmt: skip
    return rows


def ha_status(
    zookeeper: str, broker_name: str | None = None, *, as_json: bool = False, out: TextIO | None = None
) -> int:
    client = _connect(zookeeper)
    try:
        rows = ha_status_rows(client, broker_name)
    except NoNodeError:
        raise ToolError(f"ZooKeeper at {zookeeper} holds no RocketMQ groups ({zk.ROCKETMQ_GROUPS_PATH})") from None
    finally:
        client.stop()
        client.close()
    if as_json:
        print(json.dumps(rows), file=out)
        return 0
    table = Table("group", "broker", "live", "role", "in sync", "CommitLog end", "lag (bytes)", "as of", "epoch")
    for row in rows:
        age = row["age_ms"]
        assert age is None or isinstance(age, int)
        table.add_row(
            str(row["group"]), str(row["broker"]), "yes" if row["live"] else "no", str(row["role"]),
            "yes" if row["in_sync"] else "no", str(row["commitlog_end"]),
            "" if row["lag_bytes"] is None else str(row["lag_bytes"]),
            "" if age is None else f"{age / 1000:.1f} s ago",
            f"{row['master_epoch']} (from {row['epoch_start_offset']})",
        )  # fmt: skip
    Console(file=out, width=140).print(table)
    return 0


def switch_role(
    zookeeper: str, broker_name: str, master: int, *, force: bool = False, out: TextIO | None = None
) -> int:
    client = _connect(zookeeper)
    try:
        group, version = _group(client, broker_name)
        live = {int(child) for child in client.get_children(zk.BROKER_IDS_PATH) if child.isdigit()}
        if master not in group.brokers:
            raise ToolError(f"broker {master} is not a member of group {broker_name} ({list(group.brokers)})", 2)
        if group.master == master:
            print(f"broker {master} is already master of {broker_name} (master epoch {group.master_epoch})", file=out)
            return 0
        if master not in live:
            raise ToolError(f"broker {master} is not live (not registered in {zk.BROKER_IDS_PATH})")
        if master not in group.sync_state_set and not force:
            raise ToolError(
                f"broker {master} is not in the SyncStateSet {list(group.sync_state_set)} of {broker_name}: it may "
                "lack acknowledged records (--force elects it anyway, an unclean election)"
            )
        new = replace(
            group,
            master=master,
            master_epoch=group.master_epoch + 1,
            sync_state_set=(master,),
            sync_state_set_epoch=group.sync_state_set_epoch + 1,
            epoch_start_offset=-1,
        )
        try:
            client.set(zk.rocketmq_group_path(broker_name), new.encode(), version=version)
        except BadVersionError:
            raise ToolError(f"group {broker_name} changed while switching; run the command again") from None
    finally:
        client.stop()
        client.close()
    print(f"broker {master} is master of {broker_name} now (master epoch {new.master_epoch})", file=out)
    return 0
