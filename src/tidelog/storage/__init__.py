"""Storage engines behind one interface (see api.py)."""

from __future__ import annotations

from tidelog.config import EngineConfig
from tidelog.errors import ConfigError
from tidelog.storage.api import StorageEngine


def open_engine(config: EngineConfig, *, background: bool = True) -> StorageEngine:
    """The engine `tidelog.storage.engine` names, opened on `log.dirs`."""
    if config.engine == "kafka":
        from tidelog.storage.kafka.engine import KafkaEngine

        return KafkaEngine(config, background=background)
    if config.engine == "rocketmq":
        from tidelog.storage.rocketmq.engine import RocketMQEngine

        return RocketMQEngine(config, background=background)
    raise ConfigError(f"config tidelog.storage.engine: unknown engine {config.engine!r}")
