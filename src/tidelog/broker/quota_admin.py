"""DescribeClientQuotas (48) and AlterClientQuotas (49): client quotas over the protocol (KIP-546), as a Kafka 3.9
broker in ZooKeeper mode answers them.

Contract:

- Describe needs DESCRIBE_CONFIGS on the cluster, Alter ALTER_CONFIGS (else CLUSTER_AUTHORIZATION_FAILED: the
  whole describe, or each entity altered).
- Describe filters the entities by components, one per entity type at most: match type 0 (exact: that name), 1 (the
  type's default), 2 (any name the type has, the default included). With `strict` an entity must have no type the
  filter does not name; without it, other types are free. A component named twice, an empty type, an exact match
  without a name or a default/any match with one: INVALID_REQUEST; a type other than user, client-id and ip:
  UNSUPPORTED_VERSION ("Custom entity type ... not supported"); an ip component (no IP quotas here) matches nothing,
  and mixed with user or client-id is INVALID_REQUEST. Each matching entity is listed with every quota key it sets.
- Alter checks each entity on its own (its error does not stop the others): at least one part, user and client-id
  only (ip: INVALID_REQUEST, this broker has no connection-rate quotas), no part twice, no empty name (a null name is
  the default). Each op removes its key, or sets it: the key must be a quota key (`producer_byte_rate`,
  `consumer_byte_rate`, `request_percentage`, `controller_mutation_rate`), the two byte rates whole numbers, every
  value above zero (INVALID_REQUEST otherwise, naming the key). With `validate_only` nothing is stored. Otherwise the
  entity's new configs are stored (quota_store.py: a file on a single broker, its znode and a change notification
  in a cluster) and enforced at once (quotas.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.broker.quotas import CLIENT_ID, LONG_KEYS, QUOTA_KEYS, USER, ClientQuotaManager, Entity
from tidelog.errors import ErrorCode, InvalidRequestError, TidelogError
from tidelog.protocol.messages import ApiKey, Request

if TYPE_CHECKING:
    from tidelog.broker.admin import AdminExecutor
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.quota_store import FileQuotaStore, ZooKeeperQuotaStore

log = logging.getLogger("tidelog.broker")

IP = "ip"
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2
_ANY: Any = object()  # a component matching any name of its type
_UNNAMED: Any = object()  # no component for that type


class CustomEntityTypeError(TidelogError):
    """A filter naming an entity type Kafka does not know (it answers UNSUPPORTED_VERSION)."""

    kafka_error_code = ErrorCode.UNSUPPORTED_VERSION


class QuotaApis:
    """The client quota APIs over `quotas` (enforcement) and `store` (persistence)."""

    def __init__(
        self,
        quotas: ClientQuotaManager,
        store: FileQuotaStore | ZooKeeperQuotaStore,
        authorizer: Authorizer,
        admin: AdminExecutor,
    ) -> None:
        self.quotas = quotas
        self.store = store
        self.authorizer = authorizer
        self.admin = admin

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.DESCRIBE_CLIENT_QUOTAS: ApiHandler(0, 1, self.handle_describe),
            ApiKey.ALTER_CLIENT_QUOTAS: ApiHandler(0, 1, self.handle_alter),
        }

    # --- DescribeClientQuotas ---------------------------------------------------------------------------------

    async def handle_describe(self, request: Request, connection: Connection) -> Response:
        body = request.body
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "error_message": None, "entries": None}
        if not self.authorizer.authorize(connection, Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
            answer["error_code"] = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            return answer
        try:
            wanted = _filter(body.components)
        except TidelogError as exc:
            answer.update(error_code=exc.kafka_error_code, error_message=str(exc))
            return answer
        entries = []
        if IP not in wanted:
            for quota_entity, values in sorted(self.quotas.entities().items(), key=lambda item: str(item[0])):
                parts = dict(quota_entity)
                if all(
                    _matches(wanted.get(t, _UNNAMED), t in parts, parts.get(t), body.strict) for t in (USER, CLIENT_ID)
                ):
                    entries.append(
                        {
                            "entity": [{"entity_type": t, "entity_name": n} for t, n in quota_entity],
                            "values": [{"key": k, "value": float(v)} for k, v in sorted(values.items())],
                        }
                    )
        answer["entries"] = entries
        return answer

    # --- AlterClientQuotas ------------------------------------------------------------------------------------

    async def handle_alter(self, request: Request, connection: Connection) -> Response:
        body = request.body
        authorized = self.authorizer.authorize(connection, Operation.ALTER_CONFIGS, ResourceType.CLUSTER)
        results = []
        for entry in body.entries:
            result: dict[str, Any] = {
                "error_code": 0,
                "error_message": None,
                "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity],
            }
            results.append(result)
            if not authorized:
                result["error_code"] = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                continue
            try:
                quota_entity = check_entity((e.entity_type, e.entity_name) for e in entry.entity)
                configs = dict(self.quotas.entities().get(quota_entity, {}))
                for op in entry.ops:
                    if op.remove:
                        configs.pop(op.key, None)
                    else:
                        configs[op.key] = check_value(op.key, op.value)
                if not body.validate_only:
                    await self._store(quota_entity, configs)
            except TidelogError as exc:
                result.update(error_code=exc.kafka_error_code, error_message=str(exc))
        return {"throttle_time": 0, "entries": results}

    async def _store(self, quota_entity: Entity, configs: dict[str, float]) -> None:
        await self.admin.run(self.store.write, quota_entity, configs)
        self.quotas.set_entity(quota_entity, configs)
        log.info("client quotas of %s: %s", quota_entity, configs or "none")


def check_entity(parts: Iterable[tuple[str, str | None]]) -> Entity:
    """An AlterClientQuotas entity as Kafka checks it (InvalidRequestError)."""
    seen: dict[str, str | None] = {}
    for entity_type, name in parts:
        if entity_type == IP:
            raise InvalidRequestError("IP quotas (connection_creation_rate) are not supported by this broker")
        if entity_type not in (USER, CLIENT_ID):
            raise InvalidRequestError(f"Unhandled client quota entity type: {entity_type}")
        if entity_type in seen:
            raise InvalidRequestError(f"Duplicate {entity_type} in the client quota entity")
        if name is not None and not name:
            raise InvalidRequestError(f"Empty {entity_type} not supported")
        seen[entity_type] = name
    if not seen:
        raise InvalidRequestError("Invalid empty client quota entity")
    return tuple(sorted(seen.items()))


def check_value(key: str, value: float) -> float:
    if key not in QUOTA_KEYS:
        raise InvalidRequestError(f"Invalid configuration key {key}")
    if key in LONG_KEYS and abs(round(value) - value) > 1e-6:
        raise InvalidRequestError(f"Configuration {key} must be a LONG value")
    if not value > 0:
        raise InvalidRequestError(f"Configuration {key} must be above zero, not {value}")
    return float(round(value)) if key in LONG_KEYS else float(value)


def _filter(components: Iterable[Any]) -> dict[str, Any]:
    """entity type -> the name it must have (None: the default; _ANY: any name), as Kafka reads the components."""
    wanted: dict[str, Any] = {}
    for component in components:
        entity_type, match_type, match = component.entity_type, component.match_type, component.match
        if entity_type == "":
            raise InvalidRequestError("Unexpected empty filter component entity type")
        if entity_type not in (USER, CLIENT_ID, IP):
            raise CustomEntityTypeError(f"Custom entity type '{entity_type}' not supported")
        if entity_type in wanted:
            raise InvalidRequestError(f"Duplicate {entity_type} filter component entity type")
        if match_type == MATCH_EXACT:
            if match is None:
                raise InvalidRequestError("Request specified MATCH_TYPE_EXACT, but set match string to null")
            wanted[entity_type] = match
        elif match_type in (MATCH_DEFAULT, MATCH_ANY):
            if match is not None:
                kind = "MATCH_TYPE_DEFAULT" if match_type == MATCH_DEFAULT else "MATCH_TYPE_SPECIFIED"
                raise InvalidRequestError(f"Request specified {kind}, but also specified a match string")
            wanted[entity_type] = None if match_type == MATCH_DEFAULT else _ANY
        else:
            raise InvalidRequestError(f"Unexpected match type: {match_type}")
    if IP in wanted and (USER in wanted or CLIENT_ID in wanted):
        raise InvalidRequestError(
            "Invalid entity filter component combination, IP filter component should not be used with user or "
            "clientId filter component."
        )
    return wanted


def _matches(component: Any, has_type: bool, name: str | None, strict: bool) -> bool:
    """Kafka's matches(): a component asks for that name (or the default, or any); without one, the entity may
    have the type only when the filter is not strict."""
    if component is _UNNAMED:
        return not has_type or not strict
    if component is _ANY:
        return has_type
    return has_type and name == component
