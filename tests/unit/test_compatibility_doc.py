"""docs/compatibility.md's "API versions" section is generated from the broker's handler table: it must be what the
generator renders now."""

from __future__ import annotations

from pathlib import Path

from tidelog.tools import api_versions

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"


def test_compatibility_md_is_current() -> None:
    actual = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert api_versions.section_of(actual) == api_versions.render(), (
        "docs/compatibility.md is not what src/tidelog/tools/api_versions.py renders from the handler table: "
        "run `make docs-compat` and commit the result"
    )


def test_no_served_range_reaches_beyond_kafka_3_9() -> None:
    """Unless the table says why (a later Kafka's version that a client needs): then only that far."""
    for key, (low, high) in api_versions.served().items():
        kafka_low, kafka_high = api_versions.KAFKA_3_9[key]
        if key in api_versions.BEYOND_BECAUSE:
            assert kafka_low <= low and high > kafka_high, f"{key}: no longer beyond Kafka 3.9, drop its reason"
            continue
        assert kafka_low <= low <= high <= kafka_high, key


def test_splice_replaces_only_its_section() -> None:
    doc = "# Compatibility\n\n## API versions\n\nold\n\n## Clients\n\nkept\n"
    assert api_versions.splice(doc, "## API versions\n\nnew\n") == (
        "# Compatibility\n\n## API versions\n\nnew\n\n## Clients\n\nkept\n"
    )
    assert api_versions.splice("# Compatibility\n\n## Clients\n\nkept\n", "## API versions\n\nnew\n") == (
        "# Compatibility\n\n## API versions\n\nnew\n\n## Clients\n\nkept\n"
    )
