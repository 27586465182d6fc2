"""Running a broker as a process: config file + overrides, signals, exit status.

SIGTERM and SIGINT trigger a clean shutdown (exit 0); a config error exits 2 with a message naming
the key; a failure to start (port in use, log dir locked) exits 1.

Once started, the objects of the broker's first moments (its modules, the protocol schemas, the logs' state) are
frozen out of Python's cyclic garbage collector (`gc.freeze`): they live as long as the process, and a full
collection that walks them held the event loop for 40-60 ms on this project's machine - every request in flight
waited that long (docs/benchmarks.md, replication latency).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

from tidelog.broker.broker import Broker
from tidelog.broker.config import BrokerConfig
from tidelog.config import load_properties
from tidelog.errors import ConfigError, TidelogError

log = logging.getLogger("tidelog.broker")


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    settings = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override {item!r}: expected KEY=VALUE")
        settings[key.strip()] = value.strip()
    return settings


def serve(config_path: str | None, overrides: list[str]) -> int:
    try:
        settings: dict[str, str] = load_properties(config_path) if config_path else {}
        settings.update(parse_overrides(overrides))
        config = BrokerConfig.from_mapping(settings)
    except (ConfigError, OSError) as exc:
        log.error("configuration error: %s", exc)
        return 2
    try:
        return asyncio.run(_run(config))
    except (TidelogError, OSError) as exc:
        log.error("cannot start the broker: %s", exc)
        return 1


async def _run(config: BrokerConfig) -> int:
    broker = Broker(config)
    try:
        await broker.start()
    except BaseException:
        await broker.stop()
        raise
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    gc.collect()
    gc.freeze()
    print(f"tidelog broker ready on port(s) {', '.join(map(str, broker.bound_ports))}", flush=True)
    await stopped.wait()
    log.info("shutting down")
    await broker.stop()
    return 0
