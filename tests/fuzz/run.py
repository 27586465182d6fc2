"""Coverage-guided fuzzing of the targets in targets.py with atheris (libFuzzer for Python), and its figures.

    python tests/fuzz/run.py --runs 1000000                 # every target, 1M inputs each (make fuzz-long)
    python tests/fuzz/run.py --runs 20000 --seed 1 request  # one target, a short reproducible run

Each target runs in a child process (`--child`): tidelog's modules are instrumented as they are imported, the
corpus directory starts with the target's seeds, and libFuzzer mutates from there. A crash is any exception other
than a TidelogError, a run longer than --timeout seconds, or more than --rss-limit-mb of memory; libFuzzer writes
the input to <out>/<target>/crash-* (timeout-*, oom-*) and the run fails. Afterwards the corpus is replayed
uninstrumented under the stdlib tracer to measure the line coverage of the modules each target aims at.
Prints one line per target: inputs, inputs/s, crashes, libFuzzer's edge coverage (cov/ft), corpus size and the
line coverage; exits non-zero if any target crashed or ran fewer inputs than asked.
"""

from __future__ import annotations

import argparse
import dis
import inspect
import os
import re
import subprocess
import sys
import time
import trace
import types
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

# The modules each target is meant to exercise: the denominator of its line coverage.
AIMED_AT = {
    "record_batch": [
        "tidelog/codec/record_batch.py",
        "tidelog/codec/record_set.py",
        "tidelog/codec/legacy.py",
        "tidelog/codec/compression.py",
        "tidelog/codec/varint.py",
        "tidelog/codec/group_records.py",
        "tidelog/codec/batch_table.py",
        "tidelog/codec/batch_columns.py",
        "tidelog/codec/record_framing.py",
    ],
    "request": ["tidelog/protocol/messages.py", "tidelog/protocol/framing.py", "tidelog/protocol/bounds.py"],
    "config": ["tidelog/config.py", "tidelog/broker/config.py"],
    "rocketmq_read": ["tidelog/codec/rocketmq_batches.py"],
}
LIBFUZZER_STAT = re.compile(r"stat::(\w+):\s+(\d+)")
LIBFUZZER_PROGRESS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


@dataclass
class Figures:
    target: str
    inputs: int
    seconds: float
    crashes: list[str]
    cov: int
    ft: int
    corpus: int
    line_coverage: dict[str, tuple[int, int]]  # module -> (lines run, executable lines)
    exit_code: int

    @property
    def per_second(self) -> float:
        return self.inputs / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        run = sum(r for r, _ in self.line_coverage.values())
        total = sum(t for _, t in self.line_coverage.values())
        coverage = f"{100 * run / total:.0f}% of {total} lines" if total else "n/a"
        return (
            f"{self.target:13s} {self.inputs:>10,d} inputs  {self.per_second:>8,.0f}/s  {len(self.crashes)} crashes  "
            f"cov {self.cov} ft {self.ft}  corpus {self.corpus}  line coverage {coverage}"
        )


def run_child(target: str, libfuzzer_args: list[str]) -> None:
    """In the child: instrument tidelog, then hand the target to libFuzzer (which exits the process)."""
    import atheris

    with atheris.instrument_imports(include=["tidelog"]):
        import targets

    function, _seeds = targets.TARGETS[target]
    atheris.Setup([sys.argv[0], *libfuzzer_args], function)
    atheris.Fuzz()


def fuzz(target: str, runs: int, out: Path, seed: int | None, timeout_s: int, rss_limit_mb: int) -> Figures:
    from targets import TARGETS

    work = out / target
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for old in work.glob("crash-*"):
        old.unlink()
    for i, data in enumerate(TARGETS[target][1]()):
        (corpus / f"seed-{i:03d}").write_bytes(data)
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        target,
        str(corpus),
        f"-runs={runs}",
        "-max_len=4096",
        f"-timeout={timeout_s}",
        f"-rss_limit_mb={rss_limit_mb}",
        f"-artifact_prefix={work}/",
        "-print_final_stats=1",
    ]
    if seed is not None:
        args.append(f"-seed={seed}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    with (work / "libfuzzer.log").open("w") as log:
        proc = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    seconds = time.monotonic() - started
    text = (work / "libfuzzer.log").read_text(errors="replace")
    stats = {name: int(value) for name, value in LIBFUZZER_STAT.findall(text)}
    progress = LIBFUZZER_PROGRESS.findall(text)
    _last_run, cov, ft, corpus_size = (int(v) for v in progress[-1]) if progress else (0, 0, 0, 0)
    crashes = sorted(p.name for p in work.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-", "leak-")))
    return Figures(
        target,
        stats.get("number_of_executed_units", 0),
        seconds,
        crashes,
        cov,
        ft,
        corpus_size,
        replay_coverage(target, corpus) if proc.returncode == 0 else {},
        proc.returncode,
    )


def _executable_lines(path: Path) -> set[int]:
    """Lines inside function bodies (module and class bodies run at import, before any input)."""
    lines: set[int] = set()
    pending = [compile(path.read_text(), str(path), "exec")]
    while pending:
        code = pending.pop()
        if code.co_flags & inspect.CO_OPTIMIZED:
            lines.update(line for _, line in dis.findlinestarts(code) if line and line != code.co_firstlineno)
        pending.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return lines


def replay_coverage(target: str, corpus: Path) -> dict[str, tuple[int, int]]:
    """Run every corpus input once under the stdlib tracer; lines run per aimed-at module."""
    from targets import TARGETS

    function = TARGETS[target][0]
    tracer = trace.Trace(count=1, trace=0)
    for path in sorted(corpus.iterdir()):
        tracer.runfunc(function, path.read_bytes())
    counts = tracer.results().counts
    src = ROOT / "src"
    result = {}
    for module in AIMED_AT[target]:
        path = src / module
        executable = _executable_lines(path)
        ran = {line for (filename, line) in counts if filename == str(path)} & executable
        result[module] = (len(ran), len(executable))
    return result


def main() -> int:
    from targets import TARGETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help=f"some of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--runs", type=int, default=20_000, help="inputs per target (default 20000)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "fuzz", help="corpus, logs and crash files")
    parser.add_argument("--seed", type=int, help="libFuzzer's random seed (default: a new one each run)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--rss-limit-mb", type=int, default=2048)
    args = parser.parse_args()
    if unknown := set(args.targets) - set(TARGETS):
        parser.error(f"unknown target(s) {', '.join(sorted(unknown))}; the targets are {', '.join(TARGETS)}")
    failed = False
    for target in args.targets or list(TARGETS):
        figures = fuzz(target, args.runs, args.out, args.seed, args.timeout, args.rss_limit_mb)
        print(figures.line(), flush=True)
        for module, (ran, total) in figures.line_coverage.items():
            print(f"    {module:36s} {ran:4d}/{total:<4d} lines")
        if figures.crashes or figures.exit_code != 0 or figures.inputs < args.runs:
            failed = True
            print(f"    FAILED (exit {figures.exit_code}): {', '.join(figures.crashes) or 'see log'}")
            print(f"    log: {args.out / target / 'libfuzzer.log'}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        run_child(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main())
