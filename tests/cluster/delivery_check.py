"""What a fault run produced and consumed, checked: no acknowledged record lost, none read twice, order kept.

Independent of any client library: the inputs are plain data a test collects with whatever client it uses.

- `acknowledged`: partition -> [(offset, value), ...], the records whose produce the cluster acknowledged, with the
  offset the acknowledgement gave each one.
- `consumed`: partition -> [(offset, value), ...], the records read back at the end, each partition in the order it
  was read (which must be offset order).

Values are bytes (or str, taken as UTF-8) that carry their producer and a sequence number unique to it:
`make_value(producer, sequence)` writes `<producer>:<sequence>` (padded to a size if asked), `parse_value` reads it
back; a test with its own format passes its own `parse`. Values are unique across the run.

Contract of `check_delivery(acknowledged, consumed, *, parse=parse_value, check_offsets=True)`, returning a
`DeliveryReport` (`ok`, `offences`, `str()` the report), and of `assert_delivery(...)`, which raises AssertionError
with the report:

- lost: an acknowledged value that is not read back in its partition (the report says if it turned up in another);
- moved (with check_offsets): an acknowledged value read back in its partition at another offset than the one
  acknowledged - the log was rewritten under an acknowledgement;
- duplicated: a value read back more than once (anywhere), or acknowledged more than once;
- reordered: within a partition, offsets that do not increase, or a producer's sequence number that does not
  increase (a record read after one with a higher sequence of the same producer; duplicates are left to the
  duplicated check);
- unparsable: a value `parse` rejects.

Records read back that were never acknowledged are allowed (a produce whose acknowledgement was lost to a fault may
still have been written). The report counts each kind of offence and names the first offending record of each, in
partition and offset order, the first of all on its first line (lost, then moved, duplicated, reordered,
unparsable).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Value = bytes | str
Records = Mapping[int, Sequence[tuple[int, Value]]]
KINDS = ("lost", "moved", "duplicated", "reordered", "unparsable")
EXAMPLES = 5  # offences listed per kind in the report


def make_value(producer: str, sequence: int, size: int = 0) -> bytes:
    """`<producer>:<sequence>`, then `|` and padding up to `size` bytes when asked."""
    if ":" in producer or "|" in producer:
        raise ValueError(f"a producer name holds no ':' or '|': {producer!r}")
    value = f"{producer}:{sequence:010d}".encode()
    if size > len(value):
        value += b"|" + b"x" * (size - len(value) - 1)
    return value


def parse_value(value: Value) -> tuple[str, int]:
    """(producer, sequence) of a `make_value` value; ValueError for anything else."""
    text = value.decode() if isinstance(value, bytes) else value
    head = text.split("|", 1)[0]
    producer, colon, sequence = head.rpartition(":")
    if not colon or not producer or not sequence.isdigit():
        raise ValueError(f"not a <producer>:<sequence> value: {text[:60]!r}")
    return producer, int(sequence)


def _as_bytes(value: Value) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _show(value: bytes) -> str:
    text = value.decode(errors="replace")
    return repr(text if len(text) <= 60 else text[:57] + "...")


@dataclass(frozen=True)
class Offence:
    kind: str  # one of KINDS
    partition: int
    offset: int
    value: bytes
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: partition {self.partition} offset {self.offset} value {_show(self.value)}: {self.detail}"


@dataclass
class DeliveryReport:
    acknowledged: int
    consumed: int
    offences: list[Offence] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.offences

    def of_kind(self, kind: str) -> list[Offence]:
        return [o for o in self.offences if o.kind == kind]

    def first(self) -> Offence | None:
        for kind in KINDS:
            found = sorted(self.of_kind(kind), key=lambda o: (o.partition, o.offset))
            if found:
                return found[0]
        return None

    def __str__(self) -> str:
        summary = f"{self.acknowledged} records acknowledged, {self.consumed} read back"
        first = self.first()
        if first is None:
            return f"delivery ok: {summary}, none lost, none twice, order kept"
        counts = ", ".join(f"{len(self.of_kind(k))} {k}" for k in KINDS if self.of_kind(k))
        lines = [f"delivery check failed: first offending record: {first}", f"{summary}: {counts}"]
        for kind in KINDS:
            found = sorted(self.of_kind(kind), key=lambda o: (o.partition, o.offset))
            lines += [f"  {o}" for o in found[:EXAMPLES]]
            if len(found) > EXAMPLES:
                lines.append(f"  ... and {len(found) - EXAMPLES} more {kind}")
        return "\n".join(lines)


def check_delivery(
    acknowledged: Records,
    consumed: Records,
    *,
    parse: Callable[[bytes], tuple[str, int]] = parse_value,
    check_offsets: bool = True,
) -> DeliveryReport:
    report = DeliveryReport(
        acknowledged=sum(len(records) for records in acknowledged.values()),
        consumed=sum(len(records) for records in consumed.values()),
    )
    offend = report.offences.append

    # where each value was read back; the second and later readings are duplicates
    read_at: dict[bytes, list[tuple[int, int]]] = {}
    for partition in sorted(consumed):
        for offset, raw in consumed[partition]:
            value = _as_bytes(raw)
            seen = read_at.setdefault(value, [])
            if seen:
                first_partition, first_offset = seen[0]
                detail = f"read back again (first at partition {first_partition} offset {first_offset})"
                offend(Offence("duplicated", partition, offset, value, detail))
            seen.append((partition, offset))

    acked_at: dict[bytes, tuple[int, int]] = {}
    for partition in sorted(acknowledged):
        for offset, raw in acknowledged[partition]:
            value = _as_bytes(raw)
            if value in acked_at:
                first_partition, first_offset = acked_at[value]
                detail = f"acknowledged again (first at partition {first_partition} offset {first_offset})"
                offend(Offence("duplicated", partition, offset, value, detail))
                continue
            acked_at[value] = (partition, offset)
            readings = read_at.get(value, [])
            here = [o for p, o in readings if p == partition]
            if not here:
                elsewhere = ", ".join(f"partition {p} offset {o}" for p, o in readings)
                detail = "acknowledged, not read back"
                if elsewhere:
                    detail += f" in its partition (read at {elsewhere})"
                offend(Offence("lost", partition, offset, value, detail))
            elif check_offsets and offset not in here:
                detail = f"acknowledged at offset {offset}, read back at offset {here[0]}"
                offend(Offence("moved", partition, here[0], value, detail))

    for partition in sorted(consumed):
        last_offset: int | None = None
        last_sequence: dict[str, tuple[int, int]] = {}  # producer -> (sequence, offset) of its last record here
        counted: set[bytes] = set()
        for offset, raw in consumed[partition]:
            value = _as_bytes(raw)
            if last_offset is not None and offset <= last_offset:
                detail = f"read after offset {last_offset}: the partition was not read in offset order"
                offend(Offence("reordered", partition, offset, value, detail))
            last_offset = offset
            try:
                producer, sequence = parse(value)
            except ValueError as exc:
                offend(Offence("unparsable", partition, offset, value, str(exc)))
                continue
            if value in counted or read_at[value][0] != (partition, offset):
                continue  # a second reading: reported as a duplicate
            counted.add(value)
            previous = last_sequence.get(producer)
            if previous is not None and sequence <= previous[0]:
                detail = (
                    f"producer {producer!r} sequence {sequence} comes after its sequence {previous[0]} "
                    f"(offset {previous[1]})"
                )
                offend(Offence("reordered", partition, offset, value, detail))
            else:
                last_sequence[producer] = (sequence, offset)
    return report


def assert_delivery(
    acknowledged: Records,
    consumed: Records,
    *,
    parse: Callable[[bytes], tuple[str, int]] = parse_value,
    check_offsets: bool = True,
) -> DeliveryReport:
    report = check_delivery(acknowledged, consumed, parse=parse, check_offsets=check_offsets)
    if not report.ok:
        raise AssertionError(str(report))
    return report
