"""The repository stands alone: no tracked text file points outside it.

A clone has no sibling `shared` notes directory and no `/work/...` tree beside it, so a link, a docstring's
citation or a test's fallback path to one is dead for every reader but the authors. This scans every file
`git ls-files` lists for
  - a relative path out to a sibling `shared` directory, or an absolute path into the authors' `/work` tree;
  - a citation of a notes file, `reference/<name>.md` or `<name>.md §<section>`, naming a Markdown file the
    repository does not track.
State the fact in the text instead, or cite a file in the repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()

# the patterns are spelled in pieces so that this file does not match itself
OUTSIDE_PATH = re.compile(r"\.\./" + r"shared\b|/work/" + r"|\bshared/" + r"reference\b")
MD_CITATION = re.compile(r"(?:\breference/(?P<ref>[\w.-]+\.md)\b|\b(?P<sec>[\w-]+\.md) " + "§)")


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    return [name for name in listing.split("\0") if name]


def offences(path: str, text: str, markdown_names: set[str]) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in OUTSIDE_PATH.finditer(line):
            found.append(f"{path}:{number}: path outside the repository {match.group(0)!r}: {line.strip()[:100]}")
        for match in MD_CITATION.finditer(line):
            name = match.group("ref") or match.group("sec")
            if match.group("ref") or name not in markdown_names:
                found.append(f"{path}:{number}: cites {match.group(0)!r}, not a file of the repository")
    return found


def scan() -> dict[str, list[str]]:
    files = tracked_files()
    markdown_names = {Path(name).name for name in files if name.endswith(".md")}
    result: dict[str, list[str]] = {}
    for path in files:
        if path == THIS_FILE:
            continue
        try:
            data = (ROOT / path).read_bytes()
        except FileNotFoundError:  # deleted in the work tree, not yet committed
            continue
        if b"\0" in data[:8192]:
            continue  # binary (fixtures, plots)
        text = data.decode("utf-8", errors="replace")
        if found := offences(path, text, markdown_names):
            result[path] = found
    return result


def test_no_tracked_file_points_outside_the_repository() -> None:
    found = scan()
    offenders = [line for _path, lines in sorted(found.items()) for line in lines]
    assert not offenders, "files pointing outside the repository:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "line",
    [
        "See `../" + "shared/DESIGN.md` for the design",  # spelled in pieces, as the patterns are
        'Path("/work/shared/fixtures/kafka-written")',
        "The session follows shared/" + "reference/pyspark-datasource.md §7",
        "(measured, see reference/python-libraries.md §3)",
        "Crash recovery on real files (kafka-storage.md §4)",
    ],
)
def test_the_scan_catches(line: str) -> None:
    assert offences("x.py", line, {"README.md"})


@pytest.mark.parametrize(
    "line",
    [
        "see README.md §2 for the layout",
        "benchmarks that print ratios against a reference run",
        "a shared filesystem; shared by the suites",
        "docs/architecture.md describes the design",
    ],
)
def test_the_scan_lets_pass(line: str) -> None:
    assert not offences("x.py", line, {"README.md"})
