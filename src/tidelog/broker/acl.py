"""Kafka's ACL model and its matcher, pure: bindings, filters and the allow/deny decision (no I/O).

A binding says: `principal` from `host` is ALLOWed or DENYed `operation` on resources of `resource_type` whose
name matches `name` under `pattern_type` (LITERAL: equal, or `*` for every name; PREFIXED: starts with). The
decision follows Kafka's StandardAuthorizer:
- super users may do anything;
- a binding applies if its principal is the caller's or `User:*`, its host the caller's address or `*`;
- a DENY that applies wins over any ALLOW; a DENY matches its own operation (or ALL) only;
- an ALLOW for READ, WRITE, DELETE or ALTER also allows DESCRIBE; ALTER_CONFIGS also allows DESCRIBE_CONFIGS;
  ALL allows everything;
- with no binding at all on the resource (any principal, any operation), `allow.everyone.if.no.acl.found`
  decides; otherwise no matching ALLOW means denied.
Filters (DescribeAcls, DeleteAcls, `tidelog acls --list/--remove`) follow Kafka's AclBindingFilter: ANY matches
everything, MATCH matches the patterns that would apply to a name. Codes are Kafka's wire codes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from tidelog.errors import InvalidAclError

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


IMPLIES_DESCRIBE = frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})

# The operations each resource type knows (for authorized-operations bit fields), as Kafka lists them.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DESCRIBE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
        Operation.ALTER,
        Operation.DESCRIBE,
    ),
}


def parse_enum(enum: type[IntEnum], text: str) -> Any:
    """`Read`, `read`, `READ`, `DescribeConfigs`, `describe-configs` or a wire code -> the enum member."""
    cleaned = text.strip()
    if cleaned.lstrip("-").isdigit():
        try:
            return enum(int(cleaned))
        except ValueError:
            pass
    wanted = cleaned.replace("_", "").replace("-", "").upper()
    for member in enum:
        if member.name.replace("_", "") == wanted:
            return member
    names = ", ".join(m.name for m in enum if m.name not in ("UNKNOWN", "ANY", "MATCH"))
    raise InvalidAclError(f"{text!r} is not a {enum.__name__} (one of {names})")


def camel(member: IntEnum) -> str:
    """READ -> Read, DESCRIBE_CONFIGS -> DescribeConfigs (how kafka-acls.sh names operations)."""
    return "".join(part.capitalize() for part in member.name.split("_"))


@dataclass(frozen=True, order=True)
class AclBinding:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: PermissionType

    def validate(self) -> AclBinding:
        """Raise InvalidAclError unless every field is definite (what CreateAcls and `--add` accept)."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAclError(f"an ACL needs a definite resource type, not {self.resource_type.name}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(f"an ACL's pattern type is LITERAL or PREFIXED, not {self.pattern_type.name}")
        if self.operation in (Operation.UNKNOWN, Operation.ANY):
            raise InvalidAclError(f"an ACL needs a definite operation, not {self.operation.name}")
        if self.permission not in (PermissionType.ALLOW, PermissionType.DENY):
            raise InvalidAclError(f"an ACL's permission is ALLOW or DENY, not {self.permission.name}")
        if not self.name:
            raise InvalidAclError("an ACL needs a resource name")
        if self.resource_type is ResourceType.CLUSTER and (
            self.name != CLUSTER_NAME or self.pattern_type is not PatternType.LITERAL
        ):
            raise InvalidAclError(f"the only CLUSTER resource is the LITERAL {CLUSTER_NAME!r}")
        if self.pattern_type is PatternType.PREFIXED and self.name == WILDCARD:
            raise InvalidAclError("a PREFIXED ACL cannot use the wildcard name '*' (use LITERAL '*')")
        principal_type, sep, principal_name = self.principal.partition(":")
        if not sep or not principal_type or not principal_name:
            raise InvalidAclError(f"principal {self.principal!r} is not of the form Type:name (e.g. User:alice)")
        if not self.host:
            raise InvalidAclError("an ACL needs a host ('*' for any)")
        return self

    def resource_matches(self, resource_type: ResourceType, name: str) -> bool:
        """Does this binding's pattern cover the concrete resource (type, name)?"""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type is PatternType.LITERAL:
            return self.name == name or self.name == WILDCARD
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.name)
        return False

    def to_json(self) -> dict[str, str]:
        return {
            "resource_type": self.resource_type.name,
            "name": self.name,
            "pattern_type": self.pattern_type.name,
            "principal": self.principal,
            "host": self.host,
            "operation": self.operation.name,
            "permission": self.permission.name,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AclBinding:
        return cls(
            ResourceType[data["resource_type"]],
            str(data["name"]),
            PatternType[data["pattern_type"]],
            str(data["principal"]),
            str(data["host"]),
            Operation[data["operation"]],
            PermissionType[data["permission"]],
        ).validate()

    def resource_text(self) -> str:
        return (
            f"ResourcePattern(resourceType={self.resource_type.name}, name={self.name}, "
            f"patternType={self.pattern_type.name})"
        )

    def entry_text(self) -> str:
        return (
            f"(principal={self.principal}, host={self.host}, operation={self.operation.name}, "
            f"permissionType={self.permission.name})"
        )


@dataclass(frozen=True)
class AclFilter:
    """Kafka's AclBindingFilter: None and ANY match anything; pattern MATCH matches what applies to `name`."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: PermissionType = PermissionType.ANY

    def validate(self) -> AclFilter:
        for value, what in [
            (self.resource_type, "resource type"),
            (self.pattern_type, "pattern type"),
            (self.operation, "operation"),
            (self.permission, "permission"),
        ]:
            if value.name == "UNKNOWN":
                raise InvalidAclError(f"an ACL filter cannot have an UNKNOWN {what}")
        return self

    def matches(self, binding: AclBinding) -> bool:
        return self._pattern_matches(binding) and self._entry_matches(binding)

    def _pattern_matches(self, binding: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and self.resource_type != binding.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != binding.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, binding.pattern_type):
            return self.name == binding.name
        if binding.pattern_type is PatternType.LITERAL:  # MATCH
            return self.name == binding.name or binding.name == WILDCARD
        return self.name.startswith(binding.name)

    def _entry_matches(self, binding: AclBinding) -> bool:
        return (
            (self.principal is None or self.principal == binding.principal)
            and (self.host is None or self.host == binding.host)
            and (self.operation is Operation.ANY or self.operation == binding.operation)
            and (self.permission is PermissionType.ANY or self.permission == binding.permission)
        )


# --- the decision ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AclPolicy:
    """The authorizer's configuration: `super.users` and `allow.everyone.if.no.acl.found`."""

    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False


def _entry_applies(binding: AclBinding, principal: str, host: str, operation: Operation) -> bool:
    if binding.principal != principal and binding.principal != WILDCARD_PRINCIPAL:
        return False
    if binding.host != WILDCARD and binding.host != host:
        return False
    if binding.operation is Operation.ALL or binding.operation == operation:
        return True
    if binding.permission is PermissionType.ALLOW:  # implied operations: ALLOW bindings only
        if operation is Operation.DESCRIBE:
            return binding.operation in IMPLIES_DESCRIBE
        if operation is Operation.DESCRIBE_CONFIGS:
            return binding.operation in IMPLIES_DESCRIBE_CONFIGS
    return False


def authorize(
    bindings: Iterable[AclBinding],
    policy: AclPolicy,
    principal: str,
    host: str,
    operation: Operation,
    resource_type: ResourceType,
    name: str,
) -> bool:
    """May `principal` connecting from `host` perform `operation` on the resource (type, name)?"""
    if principal in policy.super_users:
        return True
    resource_has_acls = False
    allowed = False
    for binding in bindings:
        if not binding.resource_matches(resource_type, name):
            continue
        resource_has_acls = True
        if _entry_applies(binding, principal, host, operation):
            if binding.permission is PermissionType.DENY:
                return False
            allowed = True
    if allowed:
        return True
    return not resource_has_acls and policy.allow_everyone_if_no_acl_found


def authorize_by_resource_type(
    bindings: Iterable[AclBinding],
    policy: AclPolicy,
    principal: str,
    host: str,
    operation: Operation,
    resource_type: ResourceType,
) -> bool:
    """May `principal` perform `operation` on at least one resource of the type (Kafka's authorizeByResourceType,
    e.g. InitProducerId: WRITE on any topic)? An ALLOW counts unless a DENY covers its whole pattern."""
    relevant = [b for b in bindings if b.resource_type == resource_type]
    if authorize(relevant, policy, principal, host, operation, resource_type, "hardcode"):
        return True  # super user, or no ACLs at all under allow.everyone.if.no.acl.found (Kafka's probe)
    deny_literal: set[str] = set()
    deny_prefixed: set[str] = set()
    allow: list[AclBinding] = []
    for binding in relevant:
        if not (binding.principal in (principal, WILDCARD_PRINCIPAL) and binding.host in (host, WILDCARD)):
            continue
        if binding.operation not in (operation, Operation.ALL):
            continue
        if binding.permission is PermissionType.DENY:
            if binding.pattern_type is PatternType.LITERAL and binding.name == WILDCARD:
                return False
            (deny_literal if binding.pattern_type is PatternType.LITERAL else deny_prefixed).add(binding.name)
        else:
            allow.append(binding)
    if any(b.pattern_type is PatternType.LITERAL and b.name == WILDCARD for b in allow):
        return True
    for binding in allow:
        if binding.pattern_type is PatternType.LITERAL and binding.name in deny_literal:
            continue
        if any(binding.name[:end] in deny_prefixed for end in range(1, len(binding.name) + 1)):
            continue
        return True
    return False


def authorized_operations(
    bindings: Iterable[AclBinding],
    policy: AclPolicy,
    principal: str,
    host: str,
    resource_type: ResourceType,
    name: str,
) -> int:
    """Kafka's authorized-operations bit field (bit `op.value` set for each allowed operation of the type)."""
    snapshot = [b for b in bindings if b.resource_type == resource_type]
    field = 0
    for operation in SUPPORTED_OPERATIONS.get(resource_type, ()):
        if authorize(snapshot, policy, principal, host, operation, resource_type, name):
            field |= 1 << operation.value
    return field
