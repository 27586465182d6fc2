"""`tidelog configs`: describe and change topic, broker, user and client configs, as kafka-configs.sh does.

Everything goes over the Kafka protocol with the brokers' own client (tools/wire_admin.py), so it works against any
Kafka-protocol broker; librdkafka's AdminClient has no client-quota calls and keeps one synonym per name, where
kafka-configs.sh prints every synonym (a dynamic, a static and a default value of the same broker key):

    --describe --entity-type topics [--entity-name T] [--all]
        `Dynamic configs for topic T are:` (or `All configs ...` with --all), then a line per config, by name:
        `  name=value sensitive=false synonyms={SOURCE:name=value, ...}` (DescribeConfigs v4 with synonyms); only
        the topic's own overrides (source DYNAMIC_TOPIC_CONFIG) without --all. No name: every topic.
    --describe --entity-type brokers (--entity-name ID | --entity-default) [--all]
        `Dynamic configs for broker ID are:` (source DYNAMIC_BROKER_CONFIG, asked of that broker) or `Default configs
        for brokers in the cluster are:` (DYNAMIC_DEFAULT_BROKER_CONFIG). No name: every broker, then the default.
    --describe --entity-type users|clients [--entity-name N | --entity-default]
        `Quota configs for user-principal 'N' are k=v, ...` per entity with quotas (DescribeClientQuotas; values as
        Java prints a double: 1024.0, 2.0E7); for users, not for a default, `SCRAM credential configs for
        user-principal 'N' are SCRAM-SHA-256=iterations=8192, ...` (DescribeUserScramCredentials), or for a user
        without any `Error retrieving SCRAM credential configs for user-principal 'N': ExecutionException:
        org.apache.kafka.common.errors.ResourceNotFoundException: ...`, the Java exception Kafka's tool prints.
        `--entity-type users --entity-name U --entity-type clients --entity-name C` names a user's client.
    --alter --entity-type T (--entity-name N | --entity-default) [--add-config k=v,k2=[a,b]] [--delete-config k,...]
        topics and brokers: IncrementalAlterConfigs (SET and DELETE; a deleted key must be set now: `Invalid
        config(s): k`). Users and clients: the quotas producer_byte_rate, consumer_byte_rate, request_percentage,
        controller_mutation_rate (AlterClientQuotas); users also SCRAM credentials,
        `SCRAM-SHA-256=[iterations=8192,password=secret]` to add, `SCRAM-SHA-256` to delete (AlterUserScramCredentials;
        the salted password is computed here, the password never leaves this process). Quotas and SCRAM credentials
        are not altered in one command, as in Kafka. Prints `Completed updating config for topic T.`.

A broker's error (per resource, entity or user) is a ToolError: one line on stderr, exit code 1 (2 for bad usage).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tidelog.broker.scram import DEFAULT_ITERATIONS, MECHANISMS, MIN_ITERATIONS, SALT_BYTES
from tidelog.errors import ErrorCode, ToolError
from tidelog.protocol.messages import ApiKey
from tidelog.tools.wire_admin import WireAdmin, error_text

USAGE = 2
CLIENT_ID = "tidelog-configs"
ENTITY_TYPES = ("topics", "brokers", "users", "clients")
QUOTA_KEYS = ("consumer_byte_rate", "controller_mutation_rate", "producer_byte_rate", "request_percentage")

DESCRIBE_CONFIGS_VERSION = 4
INCREMENTAL_ALTER_CONFIGS_VERSION = 1
# the client quota and SCRAM APIs (tidelog's ApiKey names the APIs the broker serves)
DESCRIBE_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS_VERSION = 48, 1
ALTER_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS_VERSION = 49, 1
DESCRIBE_USER_SCRAM_CREDENTIALS, DESCRIBE_USER_SCRAM_CREDENTIALS_VERSION = 50, 0
ALTER_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS_VERSION = 51, 0
API_NAMES = {
    DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotas",
    ALTER_CLIENT_QUOTAS: "AlterClientQuotas",
    DESCRIBE_USER_SCRAM_CREDENTIALS: "DescribeUserScramCredentials",
    ALTER_USER_SCRAM_CREDENTIALS: "AlterUserScramCredentials",
}

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
SET, DELETE = 0, 1
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2
CONFIG_SOURCES = {  # DescribeConfigs' config_source (Kafka's ConfigEntry.ConfigSource)
    0: "UNKNOWN",
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG",
    7: "CLIENT_METRICS_CONFIG",
    8: "GROUP_CONFIG",
}
SCRAM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
# the Java client's exception per error code (Errors), for the codes printed as kafka-configs.sh prints them
JAVA_EXCEPTIONS: dict[int, str] = {
    ErrorCode.RESOURCE_NOT_FOUND: "ResourceNotFoundException",
    ErrorCode.DUPLICATE_RESOURCE: "DuplicateResourceException",
    ErrorCode.UNKNOWN_SERVER_ERROR: "UnknownServerException",
}
QUOTA_ENTITY = {"users": "user", "clients": "client-id"}  # ClientQuotaEntity.USER / CLIENT_ID
QUOTA_ENTITY_TEXT = {"user": "user-principal", "client-id": "client-id"}


@dataclass(frozen=True)
class ConfigsOptions:
    bootstrap_server: str
    action: str  # describe or alter
    entity_types: tuple[str, ...]
    entity_names: tuple[str, ...] = ()  # "" is --entity-default, in command-line order
    describe_all: bool = False
    add_config: str | None = None
    delete_config: tuple[str, ...] = ()
    add: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        if self.action not in ("describe", "alter"):
            raise ToolError("Command must include exactly one action: --describe, --alter", USAGE)
        types = self.entity_types
        if not types:
            raise ToolError("At least one entity type must be specified", USAGE)
        for entity_type in types:
            if entity_type not in ENTITY_TYPES:
                raise ToolError(
                    f"Invalid entity type {entity_type}, the entity type must be one of {', '.join(ENTITY_TYPES)}",
                    USAGE,
                )
        if len(set(types)) != len(types):
            raise ToolError(f"Duplicate entity type(s) specified: {','.join(types)}", USAGE)
        if len(types) > 1 and set(types) != {"users", "clients"}:
            raise ToolError("Only 'users' and 'clients' entity types may be specified together", USAGE)
        if len(self.entity_names) > len(types):
            raise ToolError("More entity names specified than entity types", USAGE)
        if types[0] == "topics" and "" in self.entity_names:
            raise ToolError("--entity-default can't be used with topics", USAGE)
        if types[0] == "brokers":
            for name in self.entity_names:
                if name and not name.isdigit():
                    raise ToolError(
                        f"The entity name for brokers must be a valid integer broker id, but it is: {name}", USAGE
                    )
        if self.action == "describe":
            if self.add_config is not None or self.delete_config:
                raise ToolError("--add-config and --delete-config go with --alter", USAGE)
            object.__setattr__(self, "add", {})
            return
        if len(self.entity_names) != len(types):
            raise ToolError("An entity name must be specified for every entity type", USAGE)
        if self.describe_all:
            raise ToolError("--all goes with --describe", USAGE)
        if self.add_config is None and not self.delete_config:
            raise ToolError("At least one of --add-config or --delete-config must be specified with --alter", USAGE)
        object.__setattr__(self, "add", parse_add_config(self.add_config or ""))


# --- pure parts --------------------------------------------------------------------------------------------------

_OUTSIDE_BRACKETS = r"(?=[^\]]*(?:\[|$))"


def parse_add_config(text: str) -> dict[str, str]:
    """kafka-configs.sh's --add-config: `k=v,k2=[a,b]` split at commas outside brackets, brackets then dropped."""
    if not text.strip():
        return {}
    settings: dict[str, str] = {}
    for item in re.split("," + _OUTSIDE_BRACKETS, text):
        pair = re.split(r"\s*=\s*" + _OUTSIDE_BRACKETS, item)
        if len(pair) != 2:
            raise ToolError(
                'Invalid entity config: all configs to be added must be in the format "key=val" or "key=[val1,val2]" '
                "to group values which contain commas.",
                USAGE,
            )
        key = pair[0].strip()
        if not re.fullmatch(r"[a-zA-Z0-9._-]*", key):
            raise ToolError(f"Invalid character found for config key: {key}", USAGE)
        settings[key] = re.sub(r"\[?\]?", "", pair[1]).strip()
    return settings


def parse_delete_config(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(key.strip() for value in values for key in value.split(",") if key.strip())


def java_double(value: float) -> str:
    """A double as Java's Double.toString prints it: 1024.0, 0.5, 2.0E7, 1.0E-4."""
    if value == 0:
        return "0.0"
    if 1e-3 <= abs(value) < 1e7:
        return repr(float(value))
    sign, digits, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    power = exponent + len(text) - 1
    mantissa = f"{text[0]}.{text[1:] or '0'}"
    return f"{'-' if sign else ''}{mantissa}E{power}"


@dataclass(frozen=True)
class ConfigLine:
    name: str
    value: str | None
    sensitive: bool
    synonyms: tuple[tuple[str, str, str | None], ...]  # (source, name, value)

    def render(self) -> str:
        synonyms = ", ".join(f"{source}:{name}={_java(value)}" for source, name, value in self.synonyms)
        return f"  {self.name}={_java(self.value)} sensitive={str(self.sensitive).lower()} synonyms={{{synonyms}}}"


def _java(value: str | None) -> str:
    return "null" if value is None else value


def java_exception_text(code: int, message: str | None) -> str:
    """A per-user error as kafka-configs.sh prints the ExecutionException its future throws:
    `ExecutionException: org.apache.kafka.common.errors.ResourceNotFoundException: message` (the codes a
    DescribeUserScramCredentials answer has per user; another code by its name, as `error_text` names it)."""
    exception = JAVA_EXCEPTIONS.get(code)
    if exception is None:
        return error_text(code, message)
    cause = f"org.apache.kafka.common.errors.{exception}"
    return f"ExecutionException: {cause}: {message}" if message else f"ExecutionException: {cause}"


def quota_entity_text(entity: Sequence[tuple[str, str | None]]) -> str:
    """`user-principal 'alice', client-id 'app'`; a default entity is `the default user-principal`."""
    order = {"user": 0, "client-id": 1}
    parts = []
    for entity_type, name in sorted(entity, key=lambda e: order.get(e[0], 2)):
        text = QUOTA_ENTITY_TEXT.get(entity_type, entity_type)
        parts.append(f"{text} '{name}'" if name is not None else f"the default {text}")
    return ", ".join(parts)


def scram_upsertion(user: str, mechanism: str, credential: str) -> dict[str, Any]:
    """`[iterations=8192,]password=secret` -> an AlterUserScramCredentials upsertion: a new random salt and the
    salted password (PBKDF2, as the Java client computes it)."""
    match = re.fullmatch(r"(?:iterations=(-?[0-9]*),)?password=(.*)", credential)
    if match is None:
        raise ToolError(f"Invalid credential property {mechanism}={credential}", USAGE)
    iterations_text, password = match.groups()
    iterations = int(iterations_text) if iterations_text not in (None, "", "-1") else DEFAULT_ITERATIONS
    if iterations < MIN_ITERATIONS:
        raise ToolError(
            f"Iterations {iterations} is less than the minimum {MIN_ITERATIONS} required for {mechanism}", USAGE
        )
    salt = secrets.token_bytes(SALT_BYTES)
    return {
        "name": user,
        "mechanism": SCRAM_IDS[mechanism],
        "iterations": iterations,
        "salt": salt,
        "salted_password": MECHANISMS[mechanism].salted_password(password, salt, iterations),
    }


# --- the actions -------------------------------------------------------------------------------------------------


def configs(options: ConfigsOptions) -> int:
    return asyncio.run(_run(options))


async def _run(options: ConfigsOptions) -> int:
    admin = WireAdmin(options.bootstrap_server, CLIENT_ID)
    try:
        head = options.entity_types[0]
        if options.action == "describe":
            if head in ("topics", "brokers"):
                await _describe_resources(admin, options)
            else:
                await _describe_quotas_and_scram(admin, options)
            return 0
        name = options.entity_names[0]
        if head in ("topics", "brokers"):
            await _alter_resource(admin, options)
        else:
            await _alter_quotas_or_scram(admin, options)
        print(
            f"Completed updating config for {head[:-1]} {name}."
            if name
            else f"Completed updating default config for {head} in the cluster."
        )
        return 0
    finally:
        await admin.close()


async def _describe_resources(admin: WireAdmin, options: ConfigsOptions) -> None:
    entity_type = options.entity_types[0]
    names: list[str] = list(options.entity_names)
    if not names:
        if entity_type == "topics":
            names = sorted(t.name for t in (await admin.metadata(None)).topics)
        else:
            names = [str(b) for b in sorted(await admin.brokers())] + [""]
    for name in names:
        if entity_type == "brokers" and not name:
            print("Default configs for brokers in the cluster are:")
        else:
            print(f"{'All' if options.describe_all else 'Dynamic'} configs for {entity_type[:-1]} {name} are:")
        for line in await _resource_configs(admin, entity_type, name, options.describe_all):
            print(line.render())


def _dynamic_source(entity_type: str, name: str) -> int:
    if entity_type == "topics":
        return 1
    return 2 if name else 3


async def _resource_configs(admin: WireAdmin, entity_type: str, name: str, describe_all: bool) -> list[ConfigLine]:
    """The resource's configs from DescribeConfigs (with synonyms), sorted by name: every config with
    `describe_all`, else only those set dynamically on this very resource."""
    resource_type = TOPIC_RESOURCE if entity_type == "topics" else BROKER_RESOURCE
    body = {
        "resources": [{"resource_type": resource_type, "resource_name": name, "configuration_keys": None}],
        "include_synonyms": True,
        "include_documentation": False,
    }
    if entity_type == "brokers" and name:
        answer = await admin.request_to(int(name), ApiKey.DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION, body)
    else:
        answer = await admin.request(ApiKey.DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION, body)
    (result,) = answer.results
    if result.error_code != ErrorCode.NONE:
        raise ToolError(f"{entity_type[:-1]} {name}: {error_text(int(result.error_code), result.error_message)}")
    wanted = _dynamic_source(entity_type, name)
    lines = [
        ConfigLine(
            c.name,
            c.value,
            bool(c.is_sensitive),
            tuple((CONFIG_SOURCES.get(int(s.source), str(s.source)), s.name, s.value) for s in c.synonyms),
        )
        for c in result.configs
        if describe_all or int(c.config_source) == wanted
    ]
    return sorted(lines, key=lambda line: line.name)


async def _alter_resource(admin: WireAdmin, options: ConfigsOptions) -> None:
    entity_type, name = options.entity_types[0], options.entity_names[0]
    current = {line.name for line in await _resource_configs(admin, entity_type, name, describe_all=False)}
    invalid = [key for key in options.delete_config if key not in current]
    if invalid:
        raise ToolError(f"Invalid config(s): {','.join(invalid)}")
    changes = [{"name": k, "config_operation": DELETE, "value": None} for k in options.delete_config]
    changes += [{"name": k, "config_operation": SET, "value": v} for k, v in options.add.items()]
    resource_type = TOPIC_RESOURCE if entity_type == "topics" else BROKER_RESOURCE
    body = {
        "resources": [{"resource_type": resource_type, "resource_name": name, "configs": changes}],
        "validate_only": False,
    }
    api, version = ApiKey.INCREMENTAL_ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS_VERSION
    if entity_type == "brokers" and name:
        answer = await admin.request_to(int(name), api, version, body)
    else:
        answer = await admin.request(api, version, body)
    for response in answer.responses:
        if response.error_code != ErrorCode.NONE:
            raise ToolError(error_text(int(response.error_code), response.error_message))


async def _check_api(admin: WireAdmin, api_key: int, version: int) -> None:
    """A broker without the API would close the connection on the request: say so instead."""
    answer = await admin.request(ApiKey.API_VERSIONS, 0, {})
    for api in answer.api_keys:
        if int(api.api_key) == api_key and api.min_version <= version <= api.max_version:
            return
    raise ToolError(f"the broker does not support {API_NAMES[api_key]} (API key {api_key}) version {version}")


async def _quotas(
    admin: WireAdmin, options: ConfigsOptions
) -> list[tuple[tuple[tuple[str, str | None], ...], dict[str, float]]]:
    """DescribeClientQuotas over the named entities (only those entity types: strict)."""
    components = []
    for index, entity_type in enumerate(options.entity_types):
        name = options.entity_names[index] if index < len(options.entity_names) else None
        if name is None:
            components.append({"entity_type": QUOTA_ENTITY[entity_type], "match_type": MATCH_ANY, "match": None})
        elif name == "":
            components.append({"entity_type": QUOTA_ENTITY[entity_type], "match_type": MATCH_DEFAULT, "match": None})
        else:
            components.append({"entity_type": QUOTA_ENTITY[entity_type], "match_type": MATCH_EXACT, "match": name})
    await _check_api(admin, DESCRIBE_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS_VERSION)
    answer = await admin.request(
        DESCRIBE_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS_VERSION, {"components": components, "strict": True}
    )
    if answer.error_code != ErrorCode.NONE:
        raise ToolError(error_text(int(answer.error_code), answer.error_message))
    return [
        (
            tuple((e.entity_type, e.entity_name) for e in entry.entity),
            {v.key: float(v.value) for v in entry.values},
        )
        for entry in answer.entries or ()
    ]


async def _describe_quotas_and_scram(admin: WireAdmin, options: ConfigsOptions) -> None:
    for entity, values in sorted(await _quotas(admin, options), key=lambda e: quota_entity_text(e[0])):
        settings = ", ".join(f"{k}={java_double(v)}" for k, v in sorted(values.items()))
        print(f"Quota configs for {quota_entity_text(entity)} are {settings}")
    if "clients" in options.entity_types or "" in options.entity_names:
        return
    await _check_api(admin, DESCRIBE_USER_SCRAM_CREDENTIALS, DESCRIBE_USER_SCRAM_CREDENTIALS_VERSION)
    users = [{"name": n} for n in options.entity_names] or None
    answer = await admin.request(
        DESCRIBE_USER_SCRAM_CREDENTIALS, DESCRIBE_USER_SCRAM_CREDENTIALS_VERSION, {"users": users}
    )
    if answer.error_code != ErrorCode.NONE:
        raise ToolError(error_text(int(answer.error_code), answer.error_message))
    names = {v: k for k, v in SCRAM_IDS.items()}
    for result in sorted(answer.results, key=lambda r: r.user):
        if result.error_code != ErrorCode.NONE:
            reason = java_exception_text(int(result.error_code), result.error_message)
            print(f"Error retrieving SCRAM credential configs for user-principal '{result.user}': {reason}")
            continue
        infos = ", ".join(
            f"{names.get(int(i.mechanism), str(i.mechanism))}=iterations={i.iterations}"
            for i in result.credential_infos
        )
        print(f"SCRAM credential configs for user-principal '{result.user}' are {infos}")


async def _alter_quotas_or_scram(admin: WireAdmin, options: ConfigsOptions) -> None:
    head = options.entity_types[0]
    add_quotas = [k for k in options.add if k in QUOTA_KEYS]
    add_scram = {k: v for k, v in options.add.items() if k in SCRAM_IDS}
    delete_quotas = [k for k in options.delete_config if k in QUOTA_KEYS]
    delete_scram = [k for k in options.delete_config if k in SCRAM_IDS]
    unknown_add = [k for k in options.add if k not in QUOTA_KEYS and k not in SCRAM_IDS]
    unknown_delete = [k for k in options.delete_config if k not in QUOTA_KEYS and k not in SCRAM_IDS]
    if head == "clients" or len(options.entity_types) == 2:
        if unknown_add or add_scram or unknown_delete or delete_scram:
            unexpected = [*unknown_add, *add_scram, *unknown_delete, *delete_scram]
            raise ToolError(
                f"Only quota configs can be changed for 'clients'. Unexpected config names: {','.join(unexpected)}",
                USAGE,
            )
    else:
        if unknown_add or unknown_delete:
            raise ToolError(
                "Only quota and SCRAM credential configs can be changed for 'users'. Unexpected config names: "
                f"{','.join([*unknown_add, *unknown_delete])}",
                USAGE,
            )
        if add_scram or delete_scram:
            if "" in options.entity_names:
                raise ToolError("The use of --entity-default is not allowed with User SCRAM Credentials", USAGE)
            if add_quotas or delete_quotas:
                raise ToolError(
                    "Cannot alter both quota and SCRAM credential configs simultaneously for 'users'", USAGE
                )
            await _alter_scram(admin, options.entity_names[0], add_scram, delete_scram)
            return
    await _alter_quotas(admin, options)


async def _alter_quotas(admin: WireAdmin, options: ConfigsOptions) -> None:
    found = await _quotas(admin, options)
    current = found[0][1] if found else {}
    invalid = [key for key in options.delete_config if key not in current]
    if invalid:
        raise ToolError(f"Invalid config(s): {','.join(invalid)}")
    ops: list[dict[str, Any]] = []
    for key, text in options.add.items():
        try:
            ops.append({"key": key, "value": float(text), "remove": False})
        except ValueError:
            raise ToolError(f"Cannot parse quota configuration value for {key}: {text}", USAGE) from None
    ops += [{"key": key, "value": 0.0, "remove": True} for key in options.delete_config]
    entity = [
        {"entity_type": QUOTA_ENTITY[t], "entity_name": name or None}
        for t, name in zip(options.entity_types, options.entity_names, strict=True)
    ]
    await _check_api(admin, ALTER_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS_VERSION)
    answer = await admin.request(
        ALTER_CLIENT_QUOTAS,
        ALTER_CLIENT_QUOTAS_VERSION,
        {"entries": [{"entity": entity, "ops": ops}], "validate_only": False},
    )
    for entry in answer.entries:
        if entry.error_code != ErrorCode.NONE:
            raise ToolError(error_text(int(entry.error_code), entry.error_message))


async def _alter_scram(admin: WireAdmin, user: str, add: dict[str, str], delete: list[str]) -> None:
    body = {
        "deletions": [{"name": user, "mechanism": SCRAM_IDS[m]} for m in delete],
        "upsertions": [scram_upsertion(user, m, credential) for m, credential in add.items()],
    }
    await _check_api(admin, ALTER_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS_VERSION)
    answer = await admin.request(ALTER_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS_VERSION, body)
    for result in answer.results:
        if result.error_code != ErrorCode.NONE:
            raise ToolError(f"user {result.user}: {error_text(int(result.error_code), result.error_message)}")
