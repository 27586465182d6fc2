"""docs/configuration.md is generated from the config key tables: it must be what the generator renders now."""

from __future__ import annotations

from pathlib import Path

from tidelog.broker.config import SERVER_KEYS
from tidelog.config import BROKER_KEYS, TOPIC_KEYS
from tidelog.tools import config_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_md_is_current() -> None:
    expected = config_reference.render()
    actual = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert actual == expected, (
        "docs/configuration.md is not what src/tidelog/tools/config_reference.py renders from the key tables: "
        "run `make docs-config` and commit the result"
    )


def test_every_key_has_a_row() -> None:
    page = config_reference.render()
    for name in (*SERVER_KEYS, *BROKER_KEYS, *TOPIC_KEYS):
        assert f"| `{name}` |" in page, name


def test_the_generator_writes_its_output_file(tmp_path: Path) -> None:
    target = tmp_path / "configuration.md"
    assert config_reference.main(["--output", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == config_reference.render()
