"""The message versions Kafka 3.9 accepts and kio (generated from Kafka 4's schemas) no longer carries.

Kafka 4 dropped the oldest versions of several APIs (KIP-896); Kafka 3.9 still serves them and old clients still send
them (Sarama's OffsetCommit v1 and DescribeConfigs v0, librdkafka with `api.version.request=false`, kafka-python with
an old `api_version`). Each version here is kio's lowest version of the same message with the fields that version
lacks left out and the fields only older versions had put in, the facts below taken from the `*Request.json` /
`*Response.json` files of Kafka 3.9 (field order is the wire order). All of them are non-flexible: request header v1,
response header v0, like the kio version they are derived from.

    API (key)                  versions  derived from  request                          response
    Produce (0)                0-2       v3            - transactional_id               v0-v1 - log_append_time_ms,
                                                                                        v0 - throttle_time_ms (the
                                                                                        last field)
    Fetch (1)                  0-3       v4            - isolation_level, v0-v2         - last_stable_offset,
                                                       - max_bytes                      - aborted_transactions,
                                                                                        v0 - throttle_time_ms
    ListOffsets (2)            0         v1            + max_num_offsets int32 after    + old_style_offsets []int64
                                                       timestamp                        after error_code,
                                                                                        - timestamp, - offset
    OffsetCommit (8)           0-1       v2            - retention_time_ms, v1 +        as v2
                                                       commit_timestamp int64 (-1)
                                                       after committed_offset, v0
                                                       - generation_id, - member_id
    OffsetFetch (9)            0         v1            as v1 (v0 read ZooKeeper's       as v1
                                                       offsets)
    CreateTopics (19)          0-1       v2            v0 - validate_only               - throttle_time_ms, v0
                                                                                        - error_message
    DeleteTopics (20)          0         v1            as v1                            - throttle_time_ms
    OffsetForLeaderEpoch (23)  0-1       v2            - current_leader_epoch           - throttle_time_ms, v0
                                                                                        - leader_epoch
    DescribeAcls (29)          0         v1            - pattern_type_filter (3)        - pattern_type
    CreateAcls (30)            0         v1            - resource_pattern_type (3)      as v1
    DeleteAcls (31)            0         v1            - pattern_type_filter (3)        - pattern_type
    DescribeConfigs (32)       0         v1            - include_synonyms               + is_default bool after
                                                                                        read_only, - config_source,
                                                                                        - synonyms
    DescribeLogDirs (35)       0         v1            as v1                            as v1

A request field an old version lacks reads as Kafka's default for it (a class attribute, not a field: kio's reader
and writer see only fields), so handlers read one shape; a field only old versions have is read with `getattr`.
`request_schema` / `response_schema` answer from this table first, then from protocol/controlled_shutdown.py (which
falls back to kio): protocol/messages.py and protocol/client.py look classes up through them.

No `from __future__ import annotations` here: kio reads the field types from the classes at run time.
"""

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.static.primitive import i32, i64

from tidelog.protocol import controlled_shutdown


@dataclass(frozen=True)
class _Added:
    """A field only older versions have, placed after `after` (the first field when None)."""

    name: str
    type: Any
    kafka_type: str
    after: str | None
    default: Any = dataclasses.MISSING


# (kio package, "request" | "response", class name) -> the field names legacy versions add to that class
_ADDED_NAMES: dict[tuple[str, str, str], set[str]] = {}


def _older(
    base: type,
    version: int,
    *,
    drop: tuple[str, ...] = (),
    add: tuple[_Added, ...] = (),
    nested: Mapping[str, type] | None = None,
) -> type:
    """Entity `base` (a kio class) as it was at `version`: without `drop`, with `add`, its entity fields of the
    classes in `nested` (already derived). A dropped field with a default stays readable as a class attribute."""
    nested = nested or {}
    specs: list[tuple[str, Any, Any]] = []
    missing: dict[str, Any] = {}
    for base_field in dataclasses.fields(base):
        if base_field.name in drop:
            if base_field.default is not dataclasses.MISSING:
                missing[base_field.name] = base_field.default
            continue
        field_type: Any = base_field.type
        if base_field.name in nested:
            field_type = tuple.__class_getitem__((nested[base_field.name], ...))
        specs.append((base_field.name, field_type, _copy_field(base_field)))
    for extra in add:
        position = 0 if extra.after is None else 1 + next(i for i, s in enumerate(specs) if s[0] == extra.after)
        specs.insert(
            position,
            (
                extra.name,
                extra.type,
                dataclasses.field(metadata={"kafka_type": extra.kafka_type}, default=extra.default),
            ),
        )
        parts = base.__module__.split(".")
        _ADDED_NAMES.setdefault((parts[2], parts[4], base.__name__), set()).add(extra.name)
    namespace = {
        "__type__": base.__type__,  # type: ignore[attr-defined]
        "__version__": version,
        "__flexible__": False,
        "__api_key__": base.__api_key__,  # type: ignore[attr-defined]
        "__header_schema__": base.__header_schema__,  # type: ignore[attr-defined]
        "__kio_base__": base,
        **missing,
    }
    derived = dataclasses.make_dataclass(
        base.__name__, specs, namespace=namespace, frozen=True, slots=True, kw_only=True
    )
    derived.__module__ = __name__
    return derived


def _copy_field(source: "dataclasses.Field[Any]") -> Any:
    if source.default_factory is not dataclasses.MISSING:
        return dataclasses.field(metadata=source.metadata, default_factory=source.default_factory)
    return dataclasses.field(metadata=source.metadata, default=source.default)


def _restamp(base: type, version: int, change: "_Change") -> type:
    """`base` and every entity inside it at `version`, with the fields `change` drops and adds per class name."""
    drop, add = change.get(base.__name__, ((), ()))
    nested = {}
    for base_field in dataclasses.fields(base):
        inner = _entity_of(base_field.type)
        if inner is not None and base_field.name not in drop:
            nested[base_field.name] = _restamp(inner, version, change)
    return _older(base, version, drop=drop, add=add, nested=nested)


def _entity_of(field_type: Any) -> type | None:
    """The entity class of an array-of-entities field type, else None."""
    args = getattr(field_type, "__args__", ())
    if getattr(field_type, "__origin__", None) is tuple and args and isinstance(args[0], type):
        return args[0] if dataclasses.is_dataclass(args[0]) else None
    return None


# class name -> (fields dropped, fields added) at one version
_Change = dict[str, tuple[tuple[str, ...], tuple[_Added, ...]]]


def _versions(api: str, base_version: int, versions: range, changes: Callable[[int], _Change]) -> dict[Any, type]:
    """Request and response of each of `versions`: kio's `base_version` with `changes(version)` applied."""
    out: dict[tuple[str, int], type] = {}
    for kind in ("request", "response"):
        module = importlib.import_module(f"kio.schema.{api}.v{base_version}.{kind}")
        root = next(
            cls
            for cls in vars(module).values()
            if isinstance(cls, type)
            and getattr(cls, "__module__", "") == module.__name__
            and getattr(getattr(cls, "__type__", None), "name", None) == kind
        )
        for version in versions:
            out[kind, version] = _restamp(root, version, changes(version))
    return out


def _drop(*names: str) -> tuple[tuple[str, ...], tuple[_Added, ...]]:
    return names, ()


# API key -> how its legacy versions derive from kio: (kio package, base version, versions, changes per version).
# Built on first use (`_legacy`): making the classes costs a few hundred milliseconds, which every broker start
# would pay for versions few clients send.
_RECIPES: dict[int, tuple[str, int, range, Callable[[int], _Change]]] = {
    0: (
        "produce",
        3,
        range(3),
        lambda v: {
            "ProduceRequest": _drop("transactional_id"),
            "PartitionProduceResponse": _drop("log_append_time") if v < 2 else _drop(),
            "ProduceResponse": _drop("throttle_time") if v == 0 else _drop(),
        },
    ),
    1: (
        "fetch",
        4,
        range(4),
        lambda v: {
            "FetchRequest": _drop("isolation_level") if v == 3 else _drop("isolation_level", "max_bytes"),
            "PartitionData": _drop("last_stable_offset", "aborted_transactions"),
            "FetchResponse": _drop("throttle_time") if v == 0 else _drop(),
        },
    ),
    2: (
        "list_offsets",
        1,
        range(1),
        lambda v: {
            "ListOffsetsPartition": ((), (_Added("max_num_offsets", i32, "int32", "timestamp", i32(1)),)),
            "ListOffsetsPartitionResponse": (
                ("timestamp", "offset"),
                (_Added("old_style_offsets", tuple[i64, ...], "int64", "error_code", ()),),
            ),
        },
    ),
    8: (
        "offset_commit",
        2,
        range(2),
        lambda v: {
            "OffsetCommitRequest": _drop("retention_time")
            if v
            else _drop("retention_time", "generation_id_or_member_epoch", "member_id"),
            "OffsetCommitRequestPartition": (
                (),
                (_Added("commit_timestamp", i64, "int64", "committed_offset", i64(-1)),) if v else (),
            ),
        },
    ),
    9: ("offset_fetch", 1, range(1), lambda v: {}),
    19: (
        "create_topics",
        2,
        range(2),
        lambda v: {
            "CreateTopicsRequest": _drop() if v else _drop("validate_only"),
            "CreateTopicsResponse": _drop("throttle_time"),
            "CreatableTopicResult": _drop() if v else _drop("error_message"),
        },
    ),
    20: ("delete_topics", 1, range(1), lambda v: {"DeleteTopicsResponse": _drop("throttle_time")}),
    23: (
        "offset_for_leader_epoch",
        2,
        range(2),
        lambda v: {
            "OffsetForLeaderPartition": _drop("current_leader_epoch"),
            "OffsetForLeaderEpochResponse": _drop("throttle_time"),
            "EpochEndOffset": _drop() if v else _drop("leader_epoch"),
        },
    ),
    29: (
        "describe_acls",
        1,
        range(1),
        lambda v: {"DescribeAclsRequest": _drop("pattern_type_filter"), "DescribeAclsResource": _drop("pattern_type")},
    ),
    30: ("create_acls", 1, range(1), lambda v: {"AclCreation": _drop("resource_pattern_type")}),
    31: (
        "delete_acls",
        1,
        range(1),
        lambda v: {"DeleteAclsFilter": _drop("pattern_type_filter"), "DeleteAclsMatchingAcl": _drop("pattern_type")},
    ),
    32: (
        "describe_configs",
        1,
        range(1),
        lambda v: {
            "DescribeConfigsRequest": _drop("include_synonyms"),
            "DescribeConfigsResourceResult": (
                ("config_source", "synonyms"),
                (_Added("is_default", bool, "bool", "read_only", False),),
            ),
        },
    ),
    35: ("describe_log_dirs", 1, range(1), lambda v: {}),
}


def _legacy(api_key: int) -> dict[tuple[str, int], type]:
    return _built(int(api_key))  # an ApiKey and its int must find the same classes (cache keys differ by type)


@cache
def _built(api_key: int) -> dict[tuple[str, int], type]:
    recipe = _RECIPES.get(api_key)
    return {} if recipe is None else _versions(*recipe)


def request_schema(api_key: int, version: int) -> Any:
    """The request class of `api_key` at `version`: a legacy version from here, any other as controlled_shutdown.py
    (and kio) have it."""
    legacy = _legacy(api_key).get(("request", version))
    return legacy if legacy is not None else controlled_shutdown.request_schema(api_key, version)


def response_schema(api_key: int, version: int) -> Any:
    """The response class of `api_key` at `version` (as `request_schema`)."""
    legacy = _legacy(api_key).get(("response", version))
    return legacy if legacy is not None else controlled_shutdown.response_schema(api_key, version)


def added_field_names(kio_module: str, class_name: str) -> frozenset[str]:
    """The fields legacy versions add to kio's class `class_name` of module `kio.schema.<api>.v<N>.<kind>` (so a
    handler's answer may name them whatever version it is built for)."""
    parts = kio_module.split(".")
    if len(parts) != 5:
        return frozenset()
    for api_key, recipe in _RECIPES.items():
        if recipe[0] == parts[2]:
            _legacy(api_key)  # records what its versions add
    return frozenset(_ADDED_NAMES.get((parts[2], parts[4], class_name), ()))
