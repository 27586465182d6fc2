"""Collection sizes checked, and unknown tagged fields removed, before a request is decoded: Kafka's "tried to
allocate a collection of size N, but there are only M bytes remaining" rule, applied ahead of kio's native reader.

kio (0.6.5) reserves memory for a compact array (flexible versions) from its declared length before reading any
element, and a length near 2^32 makes that reservation fail, which aborts the whole process: twelve bytes could
stop the broker. So every array, string and bytes length in the request is walked first - fields skipped by their
wire size, tagged fields by their declared size - and a length larger than the bytes left is refused with
MalformedRequestError, as Kafka's own parser refuses it. The walk reads lengths only, never builds objects, and
skips runs of fixed-size fields in one step; non-flexible versions are not walked (kio checks an int32 array count
against the bytes left itself).

The same walk removes tagged fields whose tag the schema does not know. The protocol says a reader skips them (a
newer client may send tags this version has not heard of); kio 0.6.5 raises KeyError instead, which would close
the connection. A tagged-field section holding unknown tags is rewritten with the known ones only (its count
re-encoded; a known tagged struct holding unknown tags itself is rewritten and its size re-encoded), at every
nesting level and in the header; a request without unknown tags is returned as it came, uncopied.

Wire sizes per kafka_type: int8/uint8/bool 1, int16/uint16/error_code 2, int32/uint32/timedelta_i32 4,
int64/uint64/float64/timedelta_i64/datetime_i64 8, uuid 16. Strings and bytes: int16 (string) or int32 (bytes,
records) length, -1 for null; in flexible versions an unsigned varint of length + 1, 0 for null. Arrays: int32
count, -1 for null; flexible: unsigned varint of count + 1. A nullable struct starts with an int8 marker (-1 null).
A flexible struct ends with its tagged fields: count, then per field tag, size and `size` bytes. The request
header's client_id is always a non-flexible nullable string.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from dataclasses import dataclass
from functools import cache
from types import NoneType, UnionType

from tidelog.errors import MalformedRequestError

FIXED_SIZES = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kafka_type: str
    entity: type | None  # the struct type of a struct field or of an array's elements
    is_array: bool
    nullable: bool
    legacy_string: bool  # RequestHeader.client_id: non-flexible whatever the version
    fixed: int = 0  # > 0: a run of fixed-size fields taking this many bytes, skipped in one step


@dataclass(frozen=True, slots=True)
class _Layout:
    flexible: bool
    fields: tuple[_Field, ...]  # in wire order, tagged fields left out
    tagged: dict[int, _Field]


# A byte range of the payload and what replaces it (a tagged-field section without its unknown tags).
_Edit = tuple[int, int, bytes]


def check_sizes_and_strip_unknown_tags(payload: bytes, classes: tuple[type, ...]) -> bytes:
    """Walk `payload` as the kio entity classes in `classes`, one after the other (header, body); raise
    MalformedRequestError for a length beyond the bytes left; return the payload without unknown tagged fields
    (`payload` itself when it has none).

    Only flexible versions need it: tagged fields exist only there, and kio checks a legacy (int32) array count
    against the bytes left itself."""
    if not any(getattr(cls, "__flexible__", False) for cls in classes):
        return payload
    pos = 0
    edits: list[_Edit] = []
    for cls in classes:
        pos = _skip_entity(_layout(cls), payload, pos, len(payload), edits)
    return _apply(payload, 0, len(payload), edits) if edits else payload


@cache
def _layout(cls: type) -> _Layout:
    hints = typing.get_type_hints(cls)
    fields: list[_Field] = []
    tagged: dict[int, _Field] = {}
    for field in dataclasses.fields(cls):
        field_type = hints[field.name]
        nullable = False
        if typing.get_origin(field_type) in (UnionType, typing.Union):
            nullable = NoneType in typing.get_args(field_type)
            field_type = next(a for a in typing.get_args(field_type) if a is not NoneType)
        is_array = typing.get_origin(field_type) is tuple
        element = typing.get_args(field_type)[0] if is_array else field_type
        spec = _Field(
            field.name,
            field.metadata.get("kafka_type", ""),
            element if isinstance(element, type) and dataclasses.is_dataclass(element) else None,
            is_array,
            nullable,
            cls.__name__ == "RequestHeader" and field.name == "client_id",
        )
        if "tag" in field.metadata:
            tagged[int(field.metadata["tag"])] = spec
        elif fields and fields[-1].fixed and _fixed_size(spec):
            fields[-1] = dataclasses.replace(fields[-1], fixed=fields[-1].fixed + _fixed_size(spec))
        else:
            fields.append(dataclasses.replace(spec, fixed=_fixed_size(spec)))
    return _Layout(bool(getattr(cls, "__flexible__", False)), tuple(fields), tagged)


def _fixed_size(field: _Field) -> int:
    if field.is_array or field.entity is not None:
        return 0
    return FIXED_SIZES.get(field.kafka_type, 0)


def _skip_entity(layout: _Layout, buf: bytes, pos: int, end: int, edits: list[_Edit]) -> int:
    for field in layout.fields:
        if field.fixed:
            _need(field.fixed, pos, end, field.name)
            pos += field.fixed
        else:
            pos = _skip_field(field, layout.flexible, buf, pos, end, edits)
    if layout.flexible:
        pos = _skip_tagged_fields(layout, buf, pos, end, edits)
    return pos


def _skip_tagged_fields(layout: _Layout, buf: bytes, pos: int, end: int, edits: list[_Edit]) -> int:
    """Skip a tagged-field section; if it holds unknown tags (or known ones rewritten inside), add the edit that
    replaces it by its known tags only."""
    section_start = pos
    count, pos = _uvarint(buf, pos, end)
    kept: list[bytes | tuple[int, int]] = []  # rewritten fields, or byte ranges kept as they are
    rewritten = False
    for _ in range(count):
        field_start = pos
        tag, pos = _uvarint(buf, pos, end)
        size, pos = _uvarint(buf, pos, end)
        _need(size, pos, end, "tagged field")
        field = layout.tagged.get(tag)
        if field is None:
            rewritten = True
        else:  # kio decodes the tags it knows: their contents are bounded by their size
            inner: list[_Edit] = []
            _skip_field(field, True, buf, pos, pos + size, inner)
            if inner:
                data = _apply(buf, pos, pos + size, inner)
                kept.append(_encode_uvarint(tag) + _encode_uvarint(len(data)) + data)
                rewritten = True
            else:
                kept.append((field_start, pos + size))
        pos += size
    if rewritten:
        parts = [part if isinstance(part, bytes) else buf[part[0] : part[1]] for part in kept]
        edits.append((section_start, pos, _encode_uvarint(len(kept)) + b"".join(parts)))
    return pos


def _apply(buf: bytes, start: int, end: int, edits: list[_Edit]) -> bytes:
    """buf[start:end] with each edit's range (in order, within it) replaced by the edit's bytes."""
    parts = []
    for edit_start, edit_end, replacement in edits:
        parts += [buf[start:edit_start], replacement]
        start = edit_end
    parts.append(buf[start:end])
    return b"".join(parts)


def _skip_field(field: _Field, flexible: bool, buf: bytes, pos: int, end: int, edits: list[_Edit]) -> int:
    if not field.is_array:
        return _skip_value(field, flexible, buf, pos, end, edits)
    if flexible:
        count, pos = _uvarint(buf, pos, end)
        count -= 1
    else:
        count, pos = _int(buf, pos, end, _INT32)
    _need(count, pos, end, f"array {field.name}")  # every element takes at least one byte
    for _ in range(count):
        pos = _skip_value(field, flexible, buf, pos, end, edits, in_array=True)
    return pos


def _skip_value(
    field: _Field, flexible: bool, buf: bytes, pos: int, end: int, edits: list[_Edit], *, in_array: bool = False
) -> int:
    if field.entity is not None:
        if field.nullable and not in_array:
            marker, pos = _int(buf, pos, end, _INT8)
            if marker < 0:
                return pos
        return _skip_entity(_layout(field.entity), buf, pos, end, edits)
    kafka_type = field.kafka_type
    size = FIXED_SIZES.get(kafka_type)
    if size is not None:
        _need(size, pos, end, field.name)
        return pos + size
    if kafka_type not in ("string", "bytes", "records"):
        raise MalformedRequestError(f"field {field.name} has a type this check does not know: {kafka_type!r}")
    if flexible and not field.legacy_string:
        length, pos = _uvarint(buf, pos, end)
        length -= 1
    else:
        length, pos = _int(buf, pos, end, _INT16 if kafka_type == "string" else _INT32)
    _need(length, pos, end, field.name)
    return pos + max(length, 0)


def _need(size: int, pos: int, end: int, what: str) -> None:
    if size > end - pos:
        raise MalformedRequestError(f"{what} declares {size} elements or bytes, only {end - pos} bytes remain")


def _int(buf: bytes, pos: int, end: int, fmt: struct.Struct) -> tuple[int, int]:
    _need(fmt.size, pos, end, "an integer")
    return fmt.unpack_from(buf, pos)[0], pos + fmt.size


def _uvarint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    for shift in range(0, 35, 7):
        if pos >= end:
            raise MalformedRequestError(f"an unsigned varint runs past the end at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
    raise MalformedRequestError(f"an unsigned varint longer than 5 bytes ends at byte {pos}")


def _encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
