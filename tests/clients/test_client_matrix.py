"""The matrix renderer (tests/client_matrix.py) without a broker: the section it splices into
docs/compatibility.md leaves the other sections alone, every row of the matrix is a test of some client, and every
module with marked tests is one the renderer runs."""

from __future__ import annotations

import re
from pathlib import Path

from client_matrix import CLIENTS, FEATURES, HEADING, MODULES, ROOT, render, splice

MARK = re.compile(r'pytest\.mark\.matrix\(\s*"([^"]+)"')


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
    rest = " - |" * (len(CLIENTS) - 2)
    table = render(results, "kcat 1.7.1")
    assert f"| {FEATURES[0]} | pass | FAIL |{rest}" in table
    assert f"| {FEATURES[1]} | - | - |{rest}" in table
    assert "- `t::c`: failed: `EOF`" in table and "t::a" not in table
    assert "This run: kcat 1.7.1." in table and "This run" not in render(results, "")


def test_every_row_has_a_test_and_every_marked_module_runs() -> None:
    marking = {
        path.relative_to(ROOT).as_posix(): set(MARK.findall(path.read_text()))
        for path in (ROOT / "tests").rglob("test_*.py")
        if path.name != Path(__file__).name
    }
    assert sorted(module for module, marks in marking.items() if marks) == sorted(MODULES)
    marked = set().union(*marking.values())
    codecs = {"producer: gzip", "producer: snappy", "producer: lz4", "producer: zstd"}
    assert "producer: {codec}" in marked
    assert marked - {"producer: {codec}"} | codecs == set(FEATURES)
