"""`tidelog users` and `tidelog acls`: SCRAM users and ACLs, edited in a broker's data dir (offline or while it runs).

Both work on the files in the first log dir (`--log-dir DIR`, or `-c server.properties` to take `log.dirs` from
the broker's own config): `tidelog-users.json` and `tidelog-acls.json` (see broker/security_store.py). A running
broker notices the new file within a fraction of a second, so no restart is needed.

    tidelog users -c server.properties --add alice [--password PW | --password-file F|-] [--mechanism M ...]
                  [--iterations N]
    tidelog users --log-dir DIR --remove alice [--mechanism M ...]
    tidelog users --log-dir DIR --list

`tidelog acls` takes kafka-acls.sh's options: --add/--remove/--list, --allow-principal/--deny-principal,
--allow-host/--deny-host, --operation, --topic/--group/--cluster, --resource-pattern-type, the --producer and
--consumer shortcuts, --principal (a --list filter), and prints what kafka-acls.sh prints
(`Current ACLs for resource `ResourcePattern(...)`:` and one `(principal=..., host=..., operation=...,
permissionType=...)` line per ACL). The option parsing and formatting are pure; the file I/O is at the end.
"""

from __future__ import annotations

import getpass
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.broker.acl import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    PermissionType,
    ResourceType,
    parse_enum,
)
from tidelog.broker.scram import DEFAULT_ITERATIONS, MECHANISMS, make_credential
from tidelog.broker.security_store import AclStore, UserStore
from tidelog.errors import ConfigError, InvalidAclError, SecurityStoreError, ToolError

USAGE = 2


def resolve_log_dir(log_dir: str | None, config_path: str | None) -> Path:
    """The first log dir: `--log-dir`, or `log.dirs` of the broker's server.properties."""
    if (log_dir is None) == (config_path is None):
        raise ToolError("give exactly one of --log-dir DIR and -c/--config server.properties", USAGE)
    if log_dir is not None:
        return Path(log_dir).resolve()
    from tidelog.broker.config import BrokerConfig
    from tidelog.config import load_properties

    assert config_path is not None
    try:
        config = BrokerConfig.from_mapping(load_properties(config_path))
    except (ConfigError, OSError) as exc:
        raise ToolError(f"--config {config_path}: {exc}", USAGE) from None
    return Path(config.engine.log_dirs[0]).resolve()


# --- users -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsersOptions:
    log_dir: Path
    action: str  # add | remove | list
    user: str | None = None
    password: str | None = None
    password_file: str | None = None
    mechanisms: tuple[str, ...] = ()
    iterations: int = DEFAULT_ITERATIONS


def read_password(options: UsersOptions) -> str:
    if options.password is not None and options.password_file is not None:
        raise ToolError("give --password or --password-file, not both", USAGE)
    if options.password is not None:
        password = options.password
    elif options.password_file == "-":
        password = sys.stdin.readline().rstrip("\r\n")
    elif options.password_file is not None:
        try:
            password = Path(options.password_file).read_text(encoding="utf-8").splitlines()[0]
        except (OSError, IndexError, UnicodeDecodeError) as exc:
            raise ToolError(f"--password-file {options.password_file}: cannot read a password: {exc}") from None
    elif sys.stdin.isatty():
        password = getpass.getpass(f"Password for {options.user}: ")
        if getpass.getpass("Again: ") != password:
            raise ToolError("the passwords differ")
    else:
        raise ToolError("no password: give --password, --password-file FILE (- for stdin), or run on a terminal", USAGE)
    if not password:
        raise ToolError("the password is empty", USAGE)
    return password


def users(options: UsersOptions) -> int:
    try:
        store = UserStore(options.log_dir)
        if options.action == "list":
            for name, credentials in sorted(store.users().items()):
                described = ", ".join(f"{m}=iterations={c.iterations}" for m, c in sorted(credentials.items()))
                print(f"SCRAM credential configs for user-principal '{name}' are {described}")
            return 0
        assert options.user is not None
        mechanisms = list(options.mechanisms) or sorted(MECHANISMS)
        if options.action == "add":
            password = read_password(options)
            try:
                credentials = {m: make_credential(m, password, iterations=options.iterations) for m in mechanisms}
            except ValueError as exc:
                raise ToolError(str(exc), USAGE) from None
            store.set(options.user, credentials)
            print(f"Added SCRAM credentials ({', '.join(mechanisms)}) for user '{options.user}' in {store.file.path}")
            return 0
        removed = store.remove(options.user, list(options.mechanisms) or None)
        if not removed:
            raise ToolError(f"user '{options.user}' has no {' or '.join(mechanisms)} credentials")
        print(f"Removed SCRAM credentials ({', '.join(removed)}) of user '{options.user}'")
        return 0
    except (SecurityStoreError, OSError) as exc:
        raise ToolError(str(exc)) from None


# --- acls --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AclsOptions:
    log_dir: Path
    action: str  # add | remove | list
    allow_principals: tuple[str, ...] = ()
    deny_principals: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    deny_hosts: tuple[str, ...] = ()
    operations: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    cluster: bool = False
    pattern_type: str | None = None
    producer: bool = False
    consumer: bool = False
    principals: tuple[str, ...] = ()  # --list filter

    @property
    def resources(self) -> list[tuple[ResourceType, str]]:
        resources = [(ResourceType.TOPIC, t) for t in self.topics] + [(ResourceType.GROUP, g) for g in self.groups]
        if self.cluster:
            resources.append((ResourceType.CLUSTER, CLUSTER_NAME))
        return resources


def _pattern(options: AclsOptions, default: PatternType) -> PatternType:
    if options.pattern_type is None:
        return default
    try:
        return parse_enum(PatternType, options.pattern_type)
    except InvalidAclError as exc:
        raise ToolError(f"--resource-pattern-type: {exc}", USAGE) from None


def _operations(texts: Iterable[str]) -> list[Operation]:
    try:
        return [parse_enum(Operation, text) for text in texts]
    except InvalidAclError as exc:
        raise ToolError(f"--operation: {exc}", USAGE) from None


def bindings_to_add(options: AclsOptions) -> list[AclBinding]:
    """The ACLs `--add` creates: every principal x host x operation x resource (plus --producer/--consumer)."""
    if not options.allow_principals and not options.deny_principals:
        raise ToolError("--add needs --allow-principal or --deny-principal", USAGE)
    if not options.resources:
        raise ToolError("--add needs a resource: --topic, --group or --cluster", USAGE)
    if not options.operations and not (options.producer or options.consumer):
        raise ToolError("--add needs --operation (or --producer / --consumer)", USAGE)
    if options.consumer and not options.groups:
        raise ToolError("--consumer needs --group", USAGE)
    pattern = _pattern(options, PatternType.LITERAL)
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise ToolError("--add takes --resource-pattern-type literal or prefixed", USAGE)
    per_resource: dict[tuple[ResourceType, str], list[Operation]] = defaultdict(list)
    for resource in options.resources:
        per_resource[resource] += _operations(options.operations)
        if options.producer and resource[0] is ResourceType.TOPIC:
            per_resource[resource] += [Operation.WRITE, Operation.DESCRIBE, Operation.CREATE]
        if options.consumer and resource[0] is ResourceType.TOPIC:
            per_resource[resource] += [Operation.READ, Operation.DESCRIBE]
        if options.consumer and resource[0] is ResourceType.GROUP:
            per_resource[resource] += [Operation.READ]
    entries = [(p, PermissionType.ALLOW, options.allow_hosts or ("*",)) for p in options.allow_principals]
    entries += [(p, PermissionType.DENY, options.deny_hosts or ("*",)) for p in options.deny_principals]
    bindings = []
    for (resource_type, name), operations in per_resource.items():
        for operation in dict.fromkeys(operations):
            if operation is not Operation.ALL and operation not in SUPPORTED_OPERATIONS[resource_type]:
                supported = ", ".join(o.name for o in SUPPORTED_OPERATIONS[resource_type])
                raise ToolError(f"ResourceType {resource_type.name} only supports operations ALL, {supported}", USAGE)
            for principal, permission, hosts in entries:
                for host in hosts:
                    binding = AclBinding(
                        resource_type,
                        name,
                        PatternType.LITERAL if resource_type is ResourceType.CLUSTER else pattern,
                        principal,
                        host,
                        operation,
                        permission,
                    )
                    try:
                        bindings.append(binding.validate())
                    except InvalidAclError as exc:
                        raise ToolError(str(exc), USAGE) from None
    return bindings


def filters_to_remove(options: AclsOptions) -> list[AclFilter]:
    """What `--remove` deletes: per resource, the given principals/hosts/operations, or every ACL on it."""
    if not options.resources:
        raise ToolError("--remove needs a resource: --topic, --group or --cluster", USAGE)
    pattern = _pattern(options, PatternType.LITERAL)
    entries: list[tuple[str | None, PermissionType, Sequence[str | None]]] = [
        (p, PermissionType.ALLOW, options.allow_hosts or (None,)) for p in options.allow_principals
    ]
    entries += [(p, PermissionType.DENY, options.deny_hosts or (None,)) for p in options.deny_principals]
    entries = entries or [(None, PermissionType.ANY, (None,))]
    operations = _operations(options.operations) or [Operation.ANY]
    return [
        AclFilter(resource_type, name, pattern, principal, host, operation, permission)
        for resource_type, name in options.resources
        for principal, permission, hosts in entries
        for host in hosts
        for operation in operations
    ]


def filters_to_list(options: AclsOptions) -> list[AclFilter]:
    pattern = _pattern(options, PatternType.ANY)
    principals: Sequence[str | None] = options.principals or (None,)
    resources: Sequence[tuple[ResourceType, str | None]] = options.resources or [(ResourceType.ANY, None)]
    return [AclFilter(t, n, pattern, principal) for t, n in resources for principal in principals]


def format_acls(bindings: Iterable[AclBinding], heading: str = "Current ACLs for resource") -> str:
    """kafka-acls.sh's listing: one block per resource pattern."""
    by_resource: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = defaultdict(list)
    for binding in bindings:
        by_resource[(binding.resource_type, binding.name, binding.pattern_type)].append(binding)
    blocks = []
    for group in by_resource.values():
        lines = [f"{heading} `{group[0].resource_text()}`: "]
        lines += [f" \t{b.entry_text()} " for b in group]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def acls(options: AclsOptions) -> int:
    try:
        store = AclStore(options.log_dir)
        if options.action == "add":
            wanted = bindings_to_add(options)
            store.add(wanted)
            print(format_acls(wanted, "Adding ACLs for resource"))
            print()
            resources = {(b.resource_type, b.name, b.pattern_type) for b in wanted}
            print(format_acls(b for b in store.bindings() if (b.resource_type, b.name, b.pattern_type) in resources))
        elif options.action == "remove":
            removed = {b for group in store.remove(filters_to_remove(options)) for b in group}
            if not removed:
                raise ToolError("no ACL matched; nothing removed")
            print(format_acls(sorted(removed), "Removed ACLs for resource"))
        else:
            filters = filters_to_list(options)
            listed = [b for b in store.bindings() if any(f.matches(b) for f in filters)]
            if listed:
                print(format_acls(listed))
        return 0
    except (SecurityStoreError, OSError) as exc:
        raise ToolError(str(exc)) from None
