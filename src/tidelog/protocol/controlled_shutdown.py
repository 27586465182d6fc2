"""Kafka's ControlledShutdown messages (API key 7), in the form of kio's generated schema classes.

kio generates the client-facing messages only; ControlledShutdown is one broker asking the controller to move its
leadership away before it stops (`ControlledShutdownRequest.json` / `ControlledShutdownResponse.json` of Kafka
3.9), so its classes are written here, field for field, with the metadata kio's reader and writer use. Versions 1
and 2 are non-flexible (request header v1, response header v0); version 3 is flexible (request header v2, response
header v1). Version 2 added `broker_epoch` (-1: unknown). Version 0, whose request header (v0) has no client id, is
not served.

No `from __future__ import annotations` here: kio reads the field types from the classes at run time.

`request_schema` and `response_schema` answer for API key 7 and fall back to kio for every other key:
protocol/messages.py and protocol/client.py look classes up through them.
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i64

API_KEY = 7
MIN_VERSION = 1
MAX_VERSION = 3


# --- version 1 ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlledShutdownRequestV1:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[RequestHeaderV1]] = RequestHeaderV1
    broker_id: i32 = field(metadata={"kafka_type": "int32"})
    """The id of the broker for which controlled shutdown has been requested."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RemainingPartitionV1:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[ResponseHeaderV0]] = ResponseHeaderV0
    topic_name: str = field(metadata={"kafka_type": "string"})
    partition_index: i32 = field(metadata={"kafka_type": "int32"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlledShutdownResponseV1:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[ResponseHeaderV0]] = ResponseHeaderV0
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The top-level error code."""
    remaining_partitions: tuple[RemainingPartitionV1, ...]
    """The partitions that the broker still leads."""


# --- version 2: broker_epoch ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlledShutdownRequestV2:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[RequestHeaderV1]] = RequestHeaderV1
    broker_id: i32 = field(metadata={"kafka_type": "int32"})
    broker_epoch: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))
    """The broker epoch (the czxid of its registration in ZooKeeper mode); -1: unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RemainingPartitionV2:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[ResponseHeaderV0]] = ResponseHeaderV0
    topic_name: str = field(metadata={"kafka_type": "string"})
    partition_index: i32 = field(metadata={"kafka_type": "int32"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlledShutdownResponseV2:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[ResponseHeaderV0]] = ResponseHeaderV0
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    remaining_partitions: tuple[RemainingPartitionV2, ...]


# --- version 3: flexible --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlledShutdownRequestV3:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[RequestHeaderV2]] = RequestHeaderV2
    broker_id: i32 = field(metadata={"kafka_type": "int32"})
    broker_epoch: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))


@dataclass(frozen=True, slots=True, kw_only=True)
class RemainingPartitionV3:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[ResponseHeaderV1]] = ResponseHeaderV1
    topic_name: str = field(metadata={"kafka_type": "string"})
    partition_index: i32 = field(metadata={"kafka_type": "int32"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlledShutdownResponseV3:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(API_KEY)
    __header_schema__: ClassVar[type[ResponseHeaderV1]] = ResponseHeaderV1
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    remaining_partitions: tuple[RemainingPartitionV3, ...]


_REQUESTS: dict[int, type] = {
    1: ControlledShutdownRequestV1,
    2: ControlledShutdownRequestV2,
    3: ControlledShutdownRequestV3,
}
_RESPONSES: dict[int, type] = {
    1: ControlledShutdownResponseV1,
    2: ControlledShutdownResponseV2,
    3: ControlledShutdownResponseV3,
}


def request_schema(api_key: int, version: int) -> Any:
    """The request class of `api_key` at `version`: ControlledShutdown's from here, every other from kio."""
    if api_key == API_KEY:
        if version not in _REQUESTS:
            raise ValueError(f"ControlledShutdown v{version} is not served (versions {MIN_VERSION}-{MAX_VERSION})")
        return _REQUESTS[version]
    return load_request_schema(api_key, version)


def response_schema(api_key: int, version: int) -> Any:
    """The response class of `api_key` at `version` (as `request_schema`)."""
    if api_key == API_KEY:
        if version not in _RESPONSES:
            raise ValueError(f"ControlledShutdown v{version} is not served (versions {MIN_VERSION}-{MAX_VERSION})")
        return _RESPONSES[version]
    return load_response_schema(api_key, version)
