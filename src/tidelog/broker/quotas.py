"""Client quotas (KIP-13, KIP-55, KIP-124): what each client may produce, fetch and spend of the broker's handler
time, measured and enforced as Kafka's ClientQuotaManager does.

Contract:

- A quota entity is the protocol's: a tuple of (entity type, name) pairs sorted by type, the types `client-id` and
  `user`, a name of None standing for that type's default (`<default>` in ZooKeeper). Its configs are the keys
  `producer_byte_rate`, `consumer_byte_rate` (bytes per second), `request_percentage` (percent of one handler's
  time per second) and `controller_mutation_rate` (stored and described; nothing here is rate-limited by it).
- The quota that applies to a client (user U, client id C) is the first entity in Kafka's order that sets the key:
  (U, C), (U, default client), (U), (default user, C), (default user, default client), (default user), (C),
  (default client). The rate it is measured against is shared by every client that entity covers, keyed as Kafka
  keys its sensors: by user and client id, by user alone (a user quota) or by client id alone (a client-id quota).
- The rate is Kafka's sampled Rate: `quota.window.num` samples of `quota.window.size.seconds` each; the measured
  rate is the samples' sum over the time they span, counted as at least `quota.window.num - 1` whole windows (so a
  new client is not throttled for its first bytes). A value is recorded, then the rate is checked: above the bound
  the throttle time is `(rate - bound) / bound * window` milliseconds, the delay after which the rate is back at the
  bound if nothing more arrives (request quotas: at most one window, as Kafka bounds them).
- The handler puts the throttle time in its response's `throttle_time_ms`, and the connection is muted (the server
  reads nothing more from it) for that long (KIP-219). A throttled fetch answers with no data, and its bytes are
  taken back out of the rate (Kafka's unrecord), so the consumer fetches them again later.
- Rates of clients idle for an hour are dropped. Configs change live (`set_entity`), from AlterClientQuotas or from
  another broker's change in a cluster (quota_store.py); a changed bound applies to the rates already measured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidelog.broker.config import QuotaConfig

USER = "user"
CLIENT_ID = "client-id"

Entity = tuple[tuple[str, str | None], ...]


class QuotaKind(Enum):
    """The three quotas a client has, each named by its config key."""

    PRODUCE = "producer_byte_rate"
    FETCH = "consumer_byte_rate"
    REQUEST = "request_percentage"


CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
QUOTA_KEYS = (QuotaKind.PRODUCE.value, QuotaKind.FETCH.value, QuotaKind.REQUEST.value, CONTROLLER_MUTATION_RATE)
LONG_KEYS = frozenset({QuotaKind.PRODUCE.value, QuotaKind.FETCH.value})  # Kafka types these LONG, the others DOUBLE

INACTIVE_RATE_EXPIRY_S = 3600.0  # ClientQuotaManagerConfig.InactiveSensorExpirationTimeSeconds
_PRUNE_EVERY = 1024  # records between two sweeps for idle rates
NANOS_TO_PERCENT = 100.0 / 1e9  # request time in ns -> percent of one second


def user_of(principal: str) -> str:
    """The user name a quota matches: the principal's name without its type (`User:alice` -> `alice`)."""
    return principal.partition(":")[2] or principal


def _precedence(user: str, client_id: str) -> tuple[tuple[Entity, tuple[str, str]], ...]:
    """Kafka's order of the entities that may hold a client's quota, each with the key its rate is kept under."""
    both, by_user, by_client = (user, client_id), (user, ""), ("", client_id)
    return (
        (((CLIENT_ID, client_id), (USER, user)), both),
        (((CLIENT_ID, None), (USER, user)), both),
        (((USER, user),), by_user),
        (((CLIENT_ID, client_id), (USER, None)), both),
        (((CLIENT_ID, None), (USER, None)), both),
        (((USER, None),), by_user),
        (((CLIENT_ID, client_id),), by_client),
        (((CLIENT_ID, None),), by_client),
    )


@dataclass
class SampledRate:
    """Kafka's Rate over a SampledStat: `samples` windows of `window_ms`, in a ring reused oldest first."""

    samples: int
    window_ms: int
    starts: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    current: int = 0
    last_used: float = 0.0

    def record(self, value: float, now_ms: float) -> None:
        if not self.starts:
            self.starts.append(now_ms)
            self.values.append(0.0)
            self.current = 0
        elif now_ms - self.starts[self.current] >= self.window_ms:
            self.current = (self.current + 1) % self.samples
            if self.current >= len(self.starts):
                self.starts.append(now_ms)
                self.values.append(0.0)
            else:
                self.starts[self.current] = now_ms
                self.values[self.current] = 0.0
        self.values[self.current] += value
        self.last_used = now_ms

    def _purge(self, now_ms: float) -> None:
        expire = self.samples * self.window_ms
        for i, start in enumerate(self.starts):
            if now_ms - start >= expire:
                self.starts[i] = now_ms
                self.values[i] = 0.0

    def window_size_ms(self, now_ms: float) -> float:
        """The time the samples span, counted as at least samples - 1 whole windows (Rate.windowSize)."""
        self._purge(now_ms)
        elapsed = now_ms - min(self.starts, default=now_ms)
        full_windows = int(elapsed // self.window_ms)
        if full_windows < self.samples - 1:
            elapsed += (self.samples - 1 - full_windows) * self.window_ms
        return max(elapsed, 1.0)

    def per_second(self, now_ms: float) -> float:
        window = self.window_size_ms(now_ms)  # purges first
        return sum(self.values) / (window / 1000.0)


class ClientQuotaManager:
    """Every quota entity's configs, and the rates of the clients they cover; see the module docstring.

    Runs on the event loop (records) and the admin/kazoo threads (`set_entity`): configs are replaced whole, as
    an immutable mapping, so the loop reads them without a lock."""

    def __init__(self, windows: QuotaConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.windows = windows
        self._clock = clock
        self._configs: Mapping[Entity, Mapping[str, float]] = {}
        self._configs_lock = threading.Lock()  # writers only: the loop reads `_configs` as it is
        self._rates: dict[tuple[QuotaKind, tuple[str, str]], SampledRate] = {}
        self._records = 0

    # --- configs ------------------------------------------------------------------------------------------------

    def entities(self) -> Mapping[Entity, Mapping[str, float]]:
        return self._configs

    def set_entity(self, quota_entity: Entity, configs: Mapping[str, float]) -> None:
        """Replace `quota_entity`'s configs (empty: it has none any more)."""
        with self._configs_lock:
            updated = dict(self._configs)
            if configs:
                updated[quota_entity] = dict(configs)
            else:
                updated.pop(quota_entity, None)
            self._configs = updated

    def replace_all(self, configs: Mapping[Entity, Mapping[str, float]]) -> None:
        with self._configs_lock:
            self._configs = {e: dict(c) for e, c in configs.items() if c}

    def quota(self, kind: QuotaKind, user: str, client_id: str) -> tuple[float, tuple[str, str]] | None:
        """The bound that applies to this client for `kind` and the key of the rate it is checked against."""
        configs = self._configs
        if not configs:
            return None
        key = kind.value
        for candidate, rate_key in _precedence(user, client_id):
            bound = configs.get(candidate, {}).get(key)
            if bound is not None:
                return bound, rate_key
        return None

    # --- enforcement --------------------------------------------------------------------------------------------

    def record(self, kind: QuotaKind, principal: str, client_id: str | None, value: float) -> int:
        """Record `value` (bytes, or percent for REQUEST) for this client; the throttle time in ms (0: within)."""
        found = self.quota(kind, user_of(principal), client_id or "")
        if found is None:
            return 0
        bound, rate_key = found
        now_ms = self._clock() * 1000.0
        rate = self._rate(kind, rate_key, now_ms)
        rate.record(value, now_ms)
        observed = rate.per_second(now_ms)
        if observed <= bound:
            return 0
        if bound <= 0:
            return int(rate.window_size_ms(now_ms))
        throttle = round((observed - bound) / bound * rate.window_size_ms(now_ms))
        if kind is QuotaKind.REQUEST:
            throttle = min(throttle, self.windows.quota_window_size_seconds * 1000)
        return int(throttle)

    def unrecord(self, kind: QuotaKind, principal: str, client_id: str | None, value: float) -> None:
        """Take back a value recorded for a response that was not sent (a throttled fetch answers without data)."""
        found = self.quota(kind, user_of(principal), client_id or "")
        if found is not None:
            now_ms = self._clock() * 1000.0
            self._rate(kind, found[1], now_ms).record(-value, now_ms)

    def max_fetch_bytes(self, principal: str, client_id: str | None) -> int | None:
        """The most one fetch may return without being throttled for certain (getMaxValueInQuotaWindow)."""
        found = self.quota(QuotaKind.FETCH, user_of(principal), client_id or "")
        if found is None:
            return None
        return int(found[0] * (self.windows.quota_window_num - 1) * self.windows.quota_window_size_seconds)

    def _rate(self, kind: QuotaKind, rate_key: tuple[str, str], now_ms: float) -> SampledRate:
        self._records += 1
        if self._records % _PRUNE_EVERY == 0:
            idle = now_ms - INACTIVE_RATE_EXPIRY_S * 1000.0
            for key in [k for k, r in self._rates.items() if r.last_used < idle]:
                del self._rates[key]
        rate = self._rates.get((kind, rate_key))
        if rate is None:
            windows = self.windows
            rate = SampledRate(windows.quota_window_num, windows.quota_window_size_seconds * 1000)
            self._rates[(kind, rate_key)] = rate
        return rate
