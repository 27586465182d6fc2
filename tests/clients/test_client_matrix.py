"""The matrix renderer (client_matrix.py) without a broker: the section it splices into docs/compatibility.md
leaves the other sections alone, and every row of the matrix is a test of some client."""

from __future__ import annotations

import re
from pathlib import Path

from client_matrix import CLIENTS, FEATURES, HEADING, render, splice

HERE = Path(__file__).resolve().parent


def test_splice_replaces_only_the_clients_section() -> None:
    doc = f"# Compatibility\n\n## API versions\n\ntable\n\n{HEADING}\n\nold matrix\n\n## Later\n\nkept\n"
    section = f"{HEADING}\n\nnew matrix\n"
    assert splice(doc, section) == (
        f"# Compatibility\n\n## API versions\n\ntable\n\n{HEADING}\n\nnew matrix\n\n## Later\n\nkept\n"
    )
    assert splice("# Compatibility\n\n## API versions\n\ntable\n", section) == (
        f"# Compatibility\n\n## API versions\n\ntable\n\n{HEADING}\n\nnew matrix\n"
    )
    assert splice(splice(doc, section), section) == splice(doc, section)


def test_render_marks_each_cell() -> None:
    results = [
        {"client": CLIENTS[0], "feature": FEATURES[0], "test": "t::a", "outcome": "passed", "reason": ""},
        {"client": CLIENTS[1], "feature": FEATURES[0], "test": "t::b", "outcome": "passed", "reason": ""},
        {"client": CLIENTS[1], "feature": FEATURES[0], "test": "t::c", "outcome": "failed", "reason": "EOF"},
    ]
    table = render(results)
    assert f"| {FEATURES[0]} | pass | FAIL | - |" in table
    assert f"| {FEATURES[1]} | - | - | - |" in table
    assert "- `t::c`: failed: `EOF`" in table and "t::a" not in table


def test_every_row_has_a_test() -> None:
    marked = set()
    for module in HERE.glob("test_*.py"):
        marked |= set(re.findall(r'@pytest\.mark\.matrix\("([^"]+)"', module.read_text()))
    codecs = {"producer: gzip", "producer: snappy", "producer: lz4", "producer: zstd"}
    assert "producer: {codec}" in marked
    assert marked - {"producer: {codec}"} | codecs == set(FEATURES)
