"""The short variant of the coverage-guided fuzzing (run.py, atheris): 10,000 inputs per target, a fixed seed.

`make fuzz-long` runs the same targets for 1,000,000 inputs each with a new seed every time.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from targets import TARGETS

RUN = Path(__file__).resolve().parent / "run.py"
SHORT_RUNS = 10_000
FIGURES = re.compile(r"^(\w+)\s+([\d,]+) inputs\s+([\d,]+)/s\s+(\d+) crashes", re.MULTILINE)


@pytest.mark.parametrize("target", list(TARGETS))
def test_short_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN), "--runs", str(SHORT_RUNS), "--seed", "1", "--out", str(tmp_path), target],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    print(proc.stdout)
    log = tmp_path / target / "libfuzzer.log"
    details = log.read_text(errors="replace")[-4000:] if log.exists() else proc.stderr
    assert proc.returncode == 0, f"fuzzing {target} failed:\n{proc.stdout}\n{details}"
    match = FIGURES.search(proc.stdout)
    assert match is not None, proc.stdout
    assert match[1] == target
    assert int(match[2].replace(",", "")) >= SHORT_RUNS  # libFuzzer also counts the seed corpus it replays
    assert int(match[4]) == 0
    assert "line coverage" in proc.stdout and "n/a" not in proc.stdout
