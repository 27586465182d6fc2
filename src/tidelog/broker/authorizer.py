"""Authorization in the broker: the one `authorize(connection, operation, resource_type, name)` check the request
handlers call, and the DescribeAcls, CreateAcls and DeleteAcls APIs.

ACLs are enforced when `authorizer.class.name` is set (Kafka's StandardAuthorizer or AclAuthorizer name);
otherwise every check passes, as in Kafka without an authorizer, and the ACL APIs answer SECURITY_DISABLED.
The decision itself is acl.py's (pure); the bindings come from `tidelog-acls.json` in the first log dir
(security_store.py), re-read when the file changes, so `tidelog acls` takes effect on a running broker.
CreateAcls and DeleteAcls need ALTER on the cluster, DescribeAcls DESCRIBE on the cluster. Denials are logged
at INFO on `tidelog.authorizer`, as Kafka's authorizer logger does, unless the check only filters a listing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

from tidelog.broker import acl
from tidelog.broker.acl import CLUSTER_NAME, AclBinding, AclFilter, AclPolicy, Operation, PatternType, ResourceType
from tidelog.broker.acl import PermissionType as Permission
from tidelog.broker.config import SecurityConfig
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.broker.security_store import AclStore
from tidelog.errors import ErrorCode, InvalidAclError, TidelogError
from tidelog.protocol.messages import ApiKey

log = logging.getLogger("tidelog.authorizer")

ALL_OPERATIONS = -(1 << 31)  # "authorized operations not requested" in Metadata and DescribeGroups


class Authorizer:
    def __init__(self, config: SecurityConfig, log_dir: Path) -> None:
        self.enabled = config.acls_enabled
        self.policy = AclPolicy(config.super_users, config.allow_everyone_if_no_acl_found)
        self.store = AclStore(log_dir) if self.enabled else None
        self._indexed: tuple[AclBinding, ...] | None = None
        self._by_type: dict[ResourceType, list[AclBinding]] = {}

    def _bindings(self, resource_type: ResourceType) -> list[AclBinding]:
        assert self.store is not None
        bindings = self.store.bindings()
        if bindings is not self._indexed:
            by_type: dict[ResourceType, list[AclBinding]] = defaultdict(list)
            for binding in bindings:
                by_type[binding.resource_type].append(binding)
            self._indexed, self._by_type = bindings, dict(by_type)
        return self._by_type.get(resource_type, [])

    def authorize(
        self,
        connection: Connection,
        operation: Operation,
        resource_type: ResourceType,
        name: str = CLUSTER_NAME,
        *,
        log_denied: bool = True,
    ) -> bool:
        """May this connection's principal perform `operation` on the resource? (Always, without ACLs.)"""
        if not self.enabled:
            return True
        allowed = acl.authorize(
            self._bindings(resource_type),
            self.policy,
            connection.principal,
            connection.host,
            operation,
            resource_type,
            name,
        )
        if not allowed and log_denied:
            log.info(
                "Principal = %s is Denied operation = %s from host = %s on resource = %s:%s",
                connection.principal,
                operation.name,
                connection.host,
                resource_type.name,
                name,
            )
        return allowed

    def authorize_any(self, connection: Connection, operation: Operation, resource_type: ResourceType) -> bool:
        """May the principal perform `operation` on at least one resource of the type (Kafka's
        authorizeByResourceType: InitProducerId without IDEMPOTENT_WRITE needs WRITE on some topic)?"""
        if not self.enabled:
            return True
        return acl.authorize_by_resource_type(
            self._bindings(resource_type), self.policy, connection.principal, connection.host, operation, resource_type
        )

    def authorized_operations(self, connection: Connection, resource_type: ResourceType, name: str) -> int:
        """The bit field Metadata and DescribeGroups return when the client asks for authorized operations."""
        if not self.enabled:
            return sum(1 << op.value for op in acl.SUPPORTED_OPERATIONS.get(resource_type, ()))
        return acl.authorized_operations(
            self._bindings(resource_type), self.policy, connection.principal, connection.host, resource_type, name
        )


# --- DescribeAcls, CreateAcls, DeleteAcls ------------------------------------------------------------------------


def _filter(entity: Any, name_field: str) -> AclFilter:
    return AclFilter(
        ResourceType(entity.resource_type_filter),
        getattr(entity, name_field),
        PatternType(getattr(entity, "pattern_type_filter", PatternType.LITERAL)),
        entity.principal_filter,
        entity.host_filter,
        Operation(entity.operation),
        Permission(entity.permission_type),
    ).validate()


def _binding_fields(binding: AclBinding) -> dict[str, Any]:
    return {
        "resource_type": int(binding.resource_type),
        "resource_name": binding.name,
        "pattern_type": int(binding.pattern_type),
        "principal": binding.principal,
        "host": binding.host,
        "operation": int(binding.operation),
        "permission_type": int(binding.permission),
    }


class AclApis:
    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.DESCRIBE_ACLS: ApiHandler(0, 3, self.handle_describe_acls),
            ApiKey.CREATE_ACLS: ApiHandler(0, 3, self.handle_create_acls),
            ApiKey.DELETE_ACLS: ApiHandler(0, 3, self.handle_delete_acls),
        }

    def _refusal(self, connection: Connection, operation: Operation) -> tuple[int, str] | None:
        """(error code, message) if this connection may not use the ACL APIs, else None."""
        if self.authorizer.store is None:
            return ErrorCode.SECURITY_DISABLED, "No Authorizer is configured on the broker (authorizer.class.name)"
        if not self.authorizer.authorize(connection, operation, ResourceType.CLUSTER):
            return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{operation.name} on the cluster is not authorized"
        return None

    async def handle_describe_acls(self, request: Any, connection: Connection) -> Response:
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "error_message": None, "resources": []}
        refusal = self._refusal(connection, Operation.DESCRIBE)
        if refusal is not None:
            answer.update(error_code=refusal[0], error_message=refusal[1])
            return answer
        assert self.authorizer.store is not None
        try:
            wanted = _filter(request.body, "resource_name_filter")
        except (ValueError, InvalidAclError) as exc:
            answer.update(error_code=ErrorCode.INVALID_REQUEST, error_message=f"invalid ACL filter: {exc}")
            return answer
        resources: dict[tuple[int, str, int], list[dict[str, Any]]] = defaultdict(list)
        for binding in self.authorizer.store.bindings():
            if wanted.matches(binding):
                fields = _binding_fields(binding)
                key = (fields.pop("resource_type"), fields.pop("resource_name"), fields.pop("pattern_type"))
                resources[key].append(fields)
        answer["resources"] = [
            {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
            for (t, n, p), acls in resources.items()
        ]
        return answer

    async def handle_create_acls(self, request: Any, connection: Connection) -> Response:
        creations = request.body.creations
        refusal = self._refusal(connection, Operation.ALTER)
        if refusal is not None:
            return {
                "throttle_time": 0,
                "results": [{"error_code": refusal[0], "error_message": refusal[1]} for _ in creations],
            }
        assert self.authorizer.store is not None
        results: list[dict[str, Any]] = []
        valid: list[AclBinding] = []
        for creation in creations:
            result: dict[str, Any] = {"error_code": 0, "error_message": None}
            results.append(result)
            try:
                binding = AclBinding(
                    ResourceType(creation.resource_type),
                    creation.resource_name,
                    PatternType(getattr(creation, "resource_pattern_type", PatternType.LITERAL)),
                    creation.principal,
                    creation.host,
                    Operation(creation.operation),
                    Permission(creation.permission_type),
                ).validate()
            except (ValueError, InvalidAclError) as exc:
                result.update(error_code=ErrorCode.INVALID_REQUEST, error_message=f"invalid ACL: {exc}")
                continue
            valid.append(binding)
        if valid:
            try:
                added = await asyncio.to_thread(self.authorizer.store.add, valid)
                log.info("%s created %d ACL(s): %s", connection.principal, len(added), added)
            except (TidelogError, OSError) as exc:
                log.error("CreateAcls failed: %s", exc)
                for result in results:
                    if result["error_code"] == 0:
                        result.update(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=str(exc))
        return {"throttle_time": 0, "results": results}

    async def handle_delete_acls(self, request: Any, connection: Connection) -> Response:
        filters_in = request.body.filters
        refusal = self._refusal(connection, Operation.ALTER)
        if refusal is not None:
            return {
                "throttle_time": 0,
                "filter_results": [
                    {"error_code": refusal[0], "error_message": refusal[1], "matching_acls": []} for _ in filters_in
                ],
            }
        assert self.authorizer.store is not None
        results: list[dict[str, Any]] = []
        valid: list[tuple[dict[str, Any], AclFilter]] = []
        for entity in filters_in:
            result: dict[str, Any] = {"error_code": 0, "error_message": None, "matching_acls": []}
            results.append(result)
            try:
                valid.append((result, _filter(entity, "resource_name_filter")))
            except (ValueError, InvalidAclError) as exc:
                result.update(error_code=ErrorCode.INVALID_REQUEST, error_message=f"invalid ACL filter: {exc}")
        if valid:
            try:
                removed = await asyncio.to_thread(self.authorizer.store.remove, [f for _, f in valid])
            except (TidelogError, OSError) as exc:
                log.error("DeleteAcls failed: %s", exc)
                for result, _ in valid:
                    result.update(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=str(exc))
                return {"throttle_time": 0, "filter_results": results}
            for (result, _), bindings in zip(valid, removed, strict=True):
                result["matching_acls"] = [
                    {"error_code": 0, "error_message": None, **_binding_fields(b)} for b in bindings
                ]
            count = sum(len(bindings) for bindings in removed)
            log.info("%s deleted %d ACL(s)", connection.principal, count)
        return {"throttle_time": 0, "filter_results": results}
