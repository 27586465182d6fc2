"""Request and response messages of the Kafka protocol, through kio's generated schema classes (sans-I/O).

A request payload is `header | body`; the header version (v1, or v2 with tagged fields) follows from the
API and version, which kio's classes carry. Handlers answer with plain nested dicts whose keys are kio's
field names; `build()` turns one into the entity class of the negotiated version, keeping the fields
that version has, filling the others' defaults, and converting milliseconds, ids and error codes to
kio's types. So one handler serves every version of its API.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import importlib
import io
import struct
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from types import NoneType, UnionType
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from tidelog.errors import MalformedRequestError, UnsupportedVersionError
from tidelog.protocol.bounds import check_sizes_and_strip_unknown_tags
from tidelog.protocol.legacy_schemas import added_field_names, request_schema, response_schema
from tidelog.protocol.produce_request import FIRST_VERSION as PRODUCE_BY_HAND_FROM
from tidelog.protocol.produce_request import decode_produce_request
from tidelog.protocol.produce_response import encode_produce_response

_SIZE = struct.Struct(">i")  # a frame size, a correlation id

_API_KEY_VERSION = struct.Struct(">hh")
MAX_SCHEMA_VERSION = 20  # above the highest version of any message kio generates


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request entity of this version (Produce v3+: produce_request.ProduceRequestBody)


def peek_api(payload: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) from the fixed start of every request header."""
    if len(payload) < 8:
        raise MalformedRequestError(f"request of {len(payload)} bytes is shorter than a request header")
    api_key, api_version = _API_KEY_VERSION.unpack_from(payload, 0)
    (correlation_id,) = struct.unpack_from(">i", payload, 4)
    return api_key, api_version, correlation_id


def peek_client_id(payload: bytes) -> str | None:
    """The client id of a request header (v1 and v2 both carry it right after the correlation id, as a nullable
    int16-length string), or None where it is absent or unreadable: enough to name a client whose API version
    cannot be decoded."""
    if len(payload) < 10:
        return None
    (length,) = struct.unpack_from(">h", payload, 8)
    if length < 0 or len(payload) < 10 + length:
        return None
    return payload[10 : 10 + length].decode("utf-8", errors="replace")


def decode_request(payload: bytes, supported: Mapping[int, tuple[int, int]]) -> Request:
    """Header and body of a request. Raises UnsupportedVersionError or MalformedRequestError."""
    api_key, api_version, correlation_id = peek_api(payload)
    versions = supported.get(api_key)
    if versions is None or not versions[0] <= api_version <= versions[1]:
        raise UnsupportedVersionError(
            f"API key {api_key} version {api_version} is not supported", api_key, api_version, correlation_id
        )
    if api_key == ApiKey.PRODUCE and api_version >= PRODUCE_BY_HAND_FROM:  # the busiest request (produce_request.py)
        produce = decode_produce_request(payload, api_version)
        return Request(api_key, api_version, correlation_id, produce.client_id, produce.body)
    request_cls = request_class(api_key, api_version)
    # before kio's reader allocates anything, and without the tagged fields kio would refuse
    payload = check_sizes_and_strip_unknown_tags(payload, (request_cls.__header_schema__, request_cls))
    try:
        header, header_size = reader(request_cls.__header_schema__)(payload, 0)
        body, body_size = reader(request_cls)(payload, header_size)
    except Exception as exc:  # kio raises assorted errors (ValueError, UnicodeDecodeError, ...)
        raise MalformedRequestError(
            f"cannot decode {ApiKey(api_key).name if api_key in ApiKey._value2member_map_ else api_key} "
            f"v{api_version} request: {exc!r}"
        ) from exc
    # Bytes after the body are ignored, as Kafka's parser does (librdkafka sends some in Metadata v12).
    del body_size
    if (null_field := _null_array(body)) is not None:
        raise MalformedRequestError(
            f"{ApiKey(api_key).name} v{api_version} request: non-nullable field {null_field} was serialized as null"
        )
    return Request(api_key, api_version, correlation_id, header.client_id, body)


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Mapping[str, Any]) -> bytes:
    """The framed response: size | header (v0, or v1 with tagged fields) | body. Produce's body is encoded by hand
    (produce_response.py: the busiest answer), every other one by kio from the dict."""
    header = response_header(api_key, api_version, correlation_id)
    if api_key == ApiKey.PRODUCE:
        encoded = encode_produce_response(api_version, body)
        return _SIZE.pack(len(header) + len(encoded)) + header + encoded
    response_cls = response_class(api_key, api_version)
    buffer = io.BytesIO()
    buffer.write(b"\x00\x00\x00\x00")
    buffer.write(header)
    writer(response_cls)(buffer, build(response_cls, body))
    data = buffer.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def response_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    """Just the response header bytes: correlation id i32, and in header v1 (flexible versions but ApiVersions'),
    no tagged fields."""
    correlation = _SIZE.pack(correlation_id)
    return correlation + b"\x00" if _flexible_response_header(api_key, api_version) else correlation


@cache
def _flexible_response_header(api_key: int, api_version: int) -> bool:
    return response_class(api_key, api_version).__header_schema__.__module__.split(".")[-2] == "v1"


def _null_array(entity: object, path: str = "") -> str | None:
    """The path of the first array that is null where the schema says it may not be (kio reads any array of
    length -1 as None; Kafka's own parser refuses it), or None. Strings are checked by kio itself."""
    entity_class: type = type(entity)  # `type`: mypy does not take type[object] as Hashable (mypy issue 11470)
    for spec in _fields(entity_class):
        if not spec.is_array and spec.entity is None:
            continue
        value = getattr(entity, spec.name)
        if value is None:
            if spec.is_array and not spec.optional:
                return path + spec.name
            continue
        if spec.entity is not None:
            for index, item in enumerate(value if spec.is_array else (value,)):
                if (inner := _null_array(item, f"{path}{spec.name}[{index}].")) is not None:
                    return inner
    return None


@cache
def request_class(api_key: int, api_version: int) -> Any:
    """The request class of `api_key` at `api_version` (kio's, or legacy_schemas.py's for older versions); cached,
    like the readers and writers below: kio builds them by walking the dataclass fields, far too slow per request."""
    return request_schema(api_key, api_version)


@cache
def response_class(api_key: int, api_version: int) -> Any:
    return response_schema(api_key, api_version)


@cache
def reader(cls: type) -> Callable[[bytes, int], tuple[Any, int]]:
    return entity_reader(cls)


@cache
def writer(cls: type) -> Callable[[Any, Any], None]:
    return entity_writer(cls)


# --- dict -> entity ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    kafka_type: str | None
    entity: type | None  # nested entity class, if any
    is_array: bool
    optional: bool
    has_default: bool


@cache
def _fields(cls: type) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    specs = []
    for field in dataclasses.fields(cls):
        field_type = hints[field.name]
        optional = False
        is_array = False
        if typing.get_origin(field_type) in (UnionType, typing.Union):  # a nullable array: tuple[X, ...] | None
            args = [a for a in typing.get_args(field_type) if a is not NoneType]
            if typing.get_origin(args[0]) is tuple:
                optional = True
                field_type = args[0]
        if typing.get_origin(field_type) is tuple:
            is_array = True
            field_type = typing.get_args(field_type)[0]
        if typing.get_origin(field_type) in (UnionType, typing.Union):
            args = [a for a in typing.get_args(field_type) if a is not NoneType]
            optional = True
            field_type = args[0]
        entity = field_type if isinstance(field_type, type) and dataclasses.is_dataclass(field_type) else None
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        specs.append(_FieldSpec(field.name, field.metadata.get("kafka_type"), entity, is_array, optional, has_default))
    return tuple(specs)


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """An instance of kio entity `cls` from a dict; keys the version lacks are ignored, but a key that no version
    of the message has (a misspelt field) raises ValueError, so it cannot be dropped silently."""
    if not data.keys() <= _names_in_any_version(cls):
        unknown = sorted(data.keys() - _names_in_any_version(cls))
        raise ValueError(f"{cls.__module__}.{cls.__qualname__}: no version has field(s) {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    for spec in _fields(cls):
        if spec.name in data:
            value = data[spec.name]
            if value is None and not spec.optional:  # e.g. a name that older versions cannot leave null
                kwargs[spec.name] = _zero(spec)
            elif spec.is_array:
                kwargs[spec.name] = None if value is None else tuple(_convert(spec, item) for item in value)
            else:
                kwargs[spec.name] = _convert(spec, value)
        elif not spec.has_default:
            kwargs[spec.name] = _zero(spec)
    return cls(**kwargs)


@cache
def _names_in_any_version(cls: type) -> frozenset[str]:
    """The field names of entity `cls` in every version of its message: kio generates one module per version
    (`kio.schema.<api>.v<N>.<request|response>`), each with a class of the same qualified name."""
    cls = getattr(cls, "__kio_base__", cls)  # a version older than kio's (legacy_schemas.py): its kio family
    parts = cls.__module__.split(".")
    names = {spec.name for spec in _fields(cls)} | added_field_names(cls.__module__, cls.__name__)
    if len(parts) == 5 and parts[3].startswith("v") and parts[3][1:].isdigit():
        for version in range(MAX_SCHEMA_VERSION + 1):
            try:
                module = importlib.import_module(".".join([*parts[:3], f"v{version}", parts[4]]))
            except ImportError:
                continue
            sibling: Any = module
            for attribute in cls.__qualname__.split("."):
                sibling = getattr(sibling, attribute, None)
            if isinstance(sibling, type) and dataclasses.is_dataclass(sibling):
                names.update(field.name for field in dataclasses.fields(sibling))
    return frozenset(names)


def _convert(spec: _FieldSpec, value: Any) -> Any:
    if value is None:
        return None
    if spec.entity is not None:
        return build(spec.entity, value) if isinstance(value, Mapping) else value
    kafka_type = spec.kafka_type
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    if kafka_type == "error_code" and isinstance(value, int):
        return ErrorCode(value)
    if kafka_type == "uuid" and isinstance(value, str | bytes):
        return _to_uuid(value)
    return value


def _zero(spec: _FieldSpec) -> Any:
    if spec.is_array:
        return ()
    if spec.optional:
        return None
    if spec.entity is not None:
        return build(spec.entity, {})
    return {
        "bool": False,
        "bytes": b"",
        "records": b"",
        "string": "",
        "error_code": ErrorCode.none,
        "uuid": uuid.UUID(int=0),
        "timedelta_i32": datetime.timedelta(0),
        "timedelta_i64": datetime.timedelta(0),
        "datetime_i64": datetime.datetime.fromtimestamp(0, tz=datetime.UTC),
        "float64": 0.0,
    }.get(spec.kafka_type or "", 0)


def _to_uuid(value: str | bytes) -> uuid.UUID:
    """Kafka renders Uuids as 22-char base64url; accept that, raw bytes, or a standard UUID string."""
    if isinstance(value, bytes):
        return uuid.UUID(bytes=value)
    if len(value) == 22:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(value + "=="))
    return uuid.UUID(value)


def uuid_to_kafka(value: uuid.UUID | None) -> str:
    raw = (value or uuid.UUID(int=0)).bytes
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def millis(value: datetime.timedelta | int | None) -> int:
    """A kio timedelta field (or a plain int) as milliseconds."""
    if value is None:
        return 0
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)
