"""Storage engines behind one interface (see api.py)."""

from __future__ import annotations

from pathlib import Path

from tidelog.config import EngineConfig
from tidelog.errors import ConfigError
from tidelog.storage.api import StorageEngine

KAFKA_LOG_DIR_MARKER = "meta.properties"
ROCKETMQ_STORE_MARKERS = ("commitlog", "consumequeue")


def open_engine(config: EngineConfig, *, background: bool = True, cluster_id: str | None = None) -> StorageEngine:
    """The engine `tidelog.storage.engine` names, opened on `log.dirs`. `cluster_id`: the cluster the directories
    must belong to (a broker in a ZooKeeper cluster passes the cluster's id); new directories take it."""
    _check_written_by(config)
    if config.engine == "kafka":
        from tidelog.storage.kafka.engine import KafkaEngine

        return KafkaEngine(config, background=background, cluster_id=cluster_id)
    if config.engine == "rocketmq":
        from tidelog.storage.rocketmq.engine import RocketMQEngine

        return RocketMQEngine(config, background=background, cluster_id=cluster_id)
    raise ConfigError(f"config tidelog.storage.engine: unknown engine {config.engine!r}")


def _check_written_by(config: EngineConfig) -> None:
    """Refuse a directory the other engine wrote: neither would read the other's files, and both would write."""
    for log_dir in map(Path, config.log_dirs):
        rocketmq = all((log_dir / name).is_dir() for name in ROCKETMQ_STORE_MARKERS)
        kafka = (log_dir / KAFKA_LOG_DIR_MARKER).is_file()
        other = (
            "rocketmq"
            if rocketmq and config.engine != "rocketmq"
            else "kafka"
            if kafka and config.engine != "kafka"
            else None
        )
        if other is not None:
            raise ConfigError(
                f"config tidelog.storage.engine: {log_dir} holds data of the {other} engine, "
                f"not the {config.engine} engine; open it with tidelog.storage.engine={other}"
            )
