"""The ACL matcher (tidelog.broker.acl), the users/ACL files (security_store) and the DN of a client certificate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tidelog.broker.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    AclPolicy,
    Operation,
    PatternType,
    PermissionType,
    ResourceType,
    authorize,
    authorize_by_resource_type,
    authorized_operations,
    camel,
    parse_enum,
)
from tidelog.broker.scram import make_credential
from tidelog.broker.security_store import ACLS_FILE, USERS_FILE, AclStore, UserStore
from tidelog.broker.tls import distinguished_name
from tidelog.errors import InvalidAclError, SecurityStoreError

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"
STRICT = AclPolicy()


def acl(
    name: str,
    operation: Operation,
    principal: str = ALICE,
    permission: PermissionType = ALLOW,
    pattern: PatternType = LITERAL,
    resource_type: ResourceType = TOPIC,
    host: str = "*",
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission).validate()


def may(
    bindings: list[AclBinding],
    operation: Operation,
    name: str,
    principal: str = ALICE,
    resource_type: ResourceType = TOPIC,
    policy: AclPolicy = STRICT,
    host: str = HOST,
) -> bool:
    return authorize(bindings, policy, principal, host, operation, resource_type, name)


def test_literal_match_only_that_name_and_operation() -> None:
    bindings = [acl("orders", Operation.READ)]
    assert may(bindings, Operation.READ, "orders")
    assert not may(bindings, Operation.READ, "orders2")
    assert not may(bindings, Operation.WRITE, "orders")
    assert not may(bindings, Operation.READ, "orders", principal=BOB)
    assert not may(bindings, Operation.READ, "orders", resource_type=GROUP)


def test_prefixed_and_wildcard() -> None:
    bindings = [acl("sales-", Operation.WRITE, pattern=PREFIXED), acl("*", Operation.READ, principal=BOB)]
    assert may(bindings, Operation.WRITE, "sales-eu")
    assert may(bindings, Operation.WRITE, "sales-")
    assert not may(bindings, Operation.WRITE, "sales")
    assert not may(bindings, Operation.WRITE, "presales-eu")
    assert may(bindings, Operation.READ, "anything", principal=BOB)
    assert not may(bindings, Operation.READ, "anything")


def test_wildcard_principal_and_host() -> None:
    bindings = [acl("t", Operation.READ, principal="User:*"), acl("t", Operation.WRITE, host="10.0.0.2")]
    assert may(bindings, Operation.READ, "t", principal=BOB)
    assert may(bindings, Operation.READ, "t", principal="User:CN=client,O=tidelog")
    assert not may(bindings, Operation.WRITE, "t")  # from 10.0.0.1
    assert may(bindings, Operation.WRITE, "t", host="10.0.0.2")


def test_deny_wins() -> None:
    bindings = [
        acl("*", Operation.ALL),
        acl("secret-", Operation.READ, permission=DENY, pattern=PREFIXED),
        acl("audit", Operation.ALL, principal="User:*", permission=DENY),
    ]
    assert may(bindings, Operation.READ, "public")
    assert not may(bindings, Operation.READ, "secret-plans")
    assert may(bindings, Operation.WRITE, "secret-plans")  # the deny names READ only
    assert may(bindings, Operation.DESCRIBE, "secret-plans")  # a DENY READ does not deny DESCRIBE
    assert not may(bindings, Operation.DESCRIBE, "audit")  # DENY ALL denies everything
    assert not may(bindings, Operation.READ, "secret-x", policy=AclPolicy(allow_everyone_if_no_acl_found=True))


@pytest.mark.parametrize(
    ("granted", "implied"),
    [
        (Operation.READ, Operation.DESCRIBE),
        (Operation.WRITE, Operation.DESCRIBE),
        (Operation.DELETE, Operation.DESCRIBE),
        (Operation.ALTER, Operation.DESCRIBE),
        (Operation.ALTER_CONFIGS, Operation.DESCRIBE_CONFIGS),
    ],
)
def test_implied_describe(granted: Operation, implied: Operation) -> None:
    assert may([acl("t", granted)], implied, "t")
    assert not may([acl("t", implied)], granted, "t")


def test_implied_describe_only_for_allow() -> None:
    bindings = [acl("t", Operation.DESCRIBE), acl("t", Operation.READ, permission=DENY)]
    assert may(bindings, Operation.DESCRIBE, "t")
    assert not may([acl("t", Operation.CREATE)], Operation.DESCRIBE, "t")  # CREATE implies nothing


def test_all_grants_every_operation() -> None:
    bindings = [acl("g", Operation.ALL, resource_type=GROUP)]
    for operation in (Operation.READ, Operation.DESCRIBE, Operation.DELETE):
        assert may(bindings, operation, "g", resource_type=GROUP)


def test_no_acl_found_default_and_super_users() -> None:
    other = [acl("other", Operation.READ)]
    assert not may([], Operation.READ, "t")
    assert not may(other, Operation.READ, "t")
    everyone = AclPolicy(allow_everyone_if_no_acl_found=True)
    assert may([], Operation.READ, "t", policy=everyone)
    assert may(other, Operation.READ, "t", policy=everyone)  # no ACL on *this* resource
    # an ACL for someone else on the resource: no longer "no ACL found"
    assert not may([acl("t", Operation.READ, principal=BOB)], Operation.READ, "t", policy=everyone)
    admins = AclPolicy(super_users=frozenset({"User:admin"}))
    assert may(
        [acl("t", Operation.ALL, principal="User:*", permission=DENY)],
        Operation.ALTER,
        "t",
        "User:admin",
        policy=admins,
    )


def test_by_resource_type() -> None:
    def any_write(bindings: list[AclBinding], policy: AclPolicy = STRICT) -> bool:
        return authorize_by_resource_type(bindings, policy, ALICE, HOST, Operation.WRITE, TOPIC)

    assert not any_write([])
    assert any_write([], AclPolicy(allow_everyone_if_no_acl_found=True))
    assert any_write([acl("t", Operation.WRITE)])
    assert any_write([acl("t", Operation.ALL)])
    assert not any_write([acl("t", Operation.READ)])
    assert not any_write([acl("t", Operation.WRITE), acl("t", Operation.WRITE, permission=DENY)])
    assert not any_write([acl("t-1", Operation.WRITE), acl("t", Operation.WRITE, permission=DENY, pattern=PREFIXED)])
    assert not any_write([acl("t", Operation.WRITE), acl("*", Operation.WRITE, permission=DENY)])
    assert any_write([acl("*", Operation.WRITE), acl("t", Operation.WRITE, permission=DENY)])
    assert any_write([], AclPolicy(super_users=frozenset({ALICE})))


def test_authorized_operations_bits() -> None:
    bits = authorized_operations([acl("t", Operation.READ)], STRICT, ALICE, HOST, TOPIC, "t")
    assert bits == (1 << Operation.READ) | (1 << Operation.DESCRIBE)
    cluster = [acl(CLUSTER_NAME, Operation.DESCRIBE, resource_type=CLUSTER)]
    assert authorized_operations(cluster, STRICT, ALICE, HOST, CLUSTER, CLUSTER_NAME) == 1 << Operation.DESCRIBE


@pytest.mark.parametrize(
    "binding",
    [
        AclBinding(ResourceType.ANY, "t", LITERAL, ALICE, "*", Operation.READ, ALLOW),
        AclBinding(TOPIC, "t", PatternType.MATCH, ALICE, "*", Operation.READ, ALLOW),
        AclBinding(TOPIC, "t", LITERAL, ALICE, "*", Operation.ANY, ALLOW),
        AclBinding(TOPIC, "t", LITERAL, ALICE, "*", Operation.READ, PermissionType.ANY),
        AclBinding(TOPIC, "", LITERAL, ALICE, "*", Operation.READ, ALLOW),
        AclBinding(TOPIC, "t", LITERAL, "alice", "*", Operation.READ, ALLOW),
        AclBinding(TOPIC, "t", LITERAL, ALICE, "", Operation.READ, ALLOW),
        AclBinding(CLUSTER, "my-cluster", LITERAL, ALICE, "*", Operation.ALTER, ALLOW),
        AclBinding(TOPIC, "*", PREFIXED, ALICE, "*", Operation.READ, ALLOW),
    ],
)
def test_invalid_bindings(binding: AclBinding) -> None:
    with pytest.raises(InvalidAclError):
        binding.validate()


def test_filters() -> None:
    literal = acl("orders", Operation.READ)
    prefixed = acl("ord", Operation.WRITE, pattern=PREFIXED, principal=BOB)
    wildcard = acl("*", Operation.DESCRIBE)
    group = acl("g", Operation.READ, resource_type=GROUP)
    everything = [literal, prefixed, wildcard, group]

    def matching(f: AclFilter) -> list[AclBinding]:
        return [b for b in everything if f.validate().matches(b)]

    assert matching(AclFilter()) == everything
    assert matching(AclFilter(resource_type=TOPIC)) == [literal, prefixed, wildcard]
    assert matching(AclFilter(TOPIC, "orders")) == [literal]  # ANY pattern: exact name
    assert matching(AclFilter(TOPIC, "orders", PatternType.MATCH)) == [literal, prefixed, wildcard]
    assert matching(AclFilter(TOPIC, "ord", PREFIXED)) == [prefixed]
    assert matching(AclFilter(principal=BOB)) == [prefixed]
    assert matching(AclFilter(operation=Operation.READ)) == [literal, group]
    assert matching(AclFilter(permission=DENY)) == []
    with pytest.raises(InvalidAclError):
        AclFilter(resource_type=ResourceType.UNKNOWN).validate()


def test_enum_parsing_and_names() -> None:
    assert parse_enum(Operation, "Read") is Operation.READ
    assert parse_enum(Operation, "describe-configs") is Operation.DESCRIBE_CONFIGS
    assert parse_enum(Operation, "IdempotentWrite") is Operation.IDEMPOTENT_WRITE
    assert parse_enum(Operation, "8") is Operation.DESCRIBE
    assert camel(Operation.DESCRIBE_CONFIGS) == "DescribeConfigs"
    with pytest.raises(InvalidAclError, match="not a Operation"):
        parse_enum(Operation, "Fly")


# --- the files ------------------------------------------------------------------------------------------------


def test_acl_store_round_trip_and_reload(tmp_path: Path) -> None:
    store = AclStore(tmp_path, check_interval=0)
    assert store.bindings() == ()
    added = store.add(
        [acl("t", Operation.READ), acl("t", Operation.READ), acl("g", Operation.READ, resource_type=GROUP)]
    )
    assert len(added) == 2
    assert store.add([acl("t", Operation.READ)]) == []  # already there
    other = AclStore(tmp_path, check_interval=0)  # another process: the CLI
    assert set(other.bindings()) == set(store.bindings())
    removed = other.remove([AclFilter(resource_type=GROUP)])
    assert [len(r) for r in removed] == [1]
    assert store.bindings() == (acl("t", Operation.READ),)  # the first store saw the change
    data = json.loads((tmp_path / ACLS_FILE).read_text())
    assert data["version"] == 1 and data["acls"][0]["operation"] == "READ"


def test_corrupt_acl_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / ACLS_FILE).write_text("{not json")
    with pytest.raises(SecurityStoreError, match=ACLS_FILE):
        AclStore(tmp_path)
    (tmp_path / ACLS_FILE).write_text('{"version": 1, "acls": []}')
    store = AclStore(tmp_path, check_interval=0)
    store.add([acl("t", Operation.READ)])
    (tmp_path / ACLS_FILE).write_text('{"version": 1, "acls": [{"bogus": 1}]}')
    assert store.bindings() == (acl("t", Operation.READ),)  # the last good version stays in force
    assert "keeping the previous version" in caplog.text


def test_user_store(tmp_path: Path) -> None:
    users = UserStore(tmp_path, check_interval=0)
    password = "correct horse battery staple"  # (a short one could turn up by chance in the base64 of a key)
    users.set("alice", {m: make_credential(m, password) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")})
    path = tmp_path / USERS_FILE
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert password not in path.read_text()
    assert users.any_credential("alice") is not None and users.any_credential("alice")[0] == "SCRAM-SHA-256"
    assert users.remove("alice", ["SCRAM-SHA-256"]) == ["SCRAM-SHA-256"]
    assert users.credential("alice", "SCRAM-SHA-256") is None
    assert users.credential("alice", "SCRAM-SHA-512") is not None
    assert users.remove("alice") == ["SCRAM-SHA-512"]
    assert users.users() == {}
    assert users.remove("nobody") == []


def test_distinguished_name_rfc2253() -> None:
    subject = (
        (("countryName", "US"),),
        (("organizationName", "Acme, Inc."),),
        (("organizationalUnitName", "eng"),),
        (("commonName", "alice"),),
    )
    assert distinguished_name(subject) == r"CN=alice,OU=eng,O=Acme\, Inc.,C=US"
    assert distinguished_name(((("commonName", " lead"), ("userId", "7")),)) == r"CN=\ lead+UID=7"
