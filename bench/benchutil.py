"""Helpers the benchmark scripts share: a scratch directory with a free-space check, machine facts, timing
statistics, the rich console they print to and the writer of their sections of docs/benchmarks.md. Not a
benchmark itself."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)  # no wrapping in logs

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = REPO / "docs" / "benchmarks.md"  # the report the --write-report scripts write their sections of
MiB = 1 << 20
GiB = 1 << 30
SPACE_MARGIN_BYTES = 256 * MiB  # never fill a filesystem to the last byte


def add_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="parent directory for the scratch data (default: the system temp dir, usually /tmp); "
        "a fresh subdirectory is created there and removed afterwards",
    )


def check_free_space(parent: Path, needed_bytes: int) -> None:
    """Exit politely (status 2) when `parent`'s filesystem cannot hold `needed_bytes` plus a margin."""
    free = shutil.disk_usage(parent).free
    if free < needed_bytes + SPACE_MARGIN_BYTES:
        console.print(
            f"[bold red]Not enough free space[/] in {parent}: this run needs about {fmt_bytes(needed_bytes)} "
            f"(+{fmt_bytes(SPACE_MARGIN_BYTES)} margin) but only {fmt_bytes(free)} is free.\n"
            "Pass a smaller size (see --help) or --dir on a filesystem with more room."
        )
        sys.exit(2)


@contextlib.contextmanager
def scratch_dir(parent: Path | None, needed_bytes: int, prefix: str) -> Iterator[Path]:
    """A fresh directory under `parent` (default: the temp dir), removed on exit even after an error."""
    parent = Path(parent or tempfile.gettempdir()).resolve()
    parent.mkdir(parents=True, exist_ok=True)
    check_free_space(parent, needed_bytes)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def empty_dir(path: Path) -> None:
    """Remove everything inside `path` (kept itself) and let the kernel settle writeback before the next run."""
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    os.sync()


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path`, from /proc/mounts (longest matching mount point)."""
    target = str(Path(path).resolve())
    best, fs_type = "", "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 3:
                continue
            mount_point = fields[1].replace("\\040", " ")
            inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) > len(best):
                best, fs_type = mount_point, fields[2]
    return fs_type


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


VIRTIO_BALLOON_DEVICE_ID = "0x0005"
VIRTIO_BALLOON_F_REPORTING = 5  # the feature bit of free page reporting


def returns_freed_memory_to_host() -> bool:
    """Is this a VM whose balloon device reports free pages, so that its host takes memory the guest freed?

    There a page-cache write into memory freed a second or more before runs at a fraction of the speed of one into
    memory freed just before (each page is faulted back in on the host): 1.4-2.5 against 4.8-6.5 GB/s for dd, a
    Python pwrite loop and tidelog alike on the AMD VM of docs/benchmarks.md. Benchmarks that compare writers start
    each one right after the one before freed its pages; `print_machine` says when the machine is such a VM.
    The kernel shows a virtio device's negotiated features as a string of 0 and 1, bit 0 first."""
    for device in Path("/sys/bus/virtio/devices").glob("*"):
        with contextlib.suppress(OSError):
            if (device / "device").read_text().strip() == VIRTIO_BALLOON_DEVICE_ID:
                features = (device / "features").read_text().strip()
                if features[VIRTIO_BALLOON_F_REPORTING : VIRTIO_BALLOON_F_REPORTING + 1] == "1":
                    return True
    return False


def machine_line() -> str:
    return (
        f"{os.cpu_count()} vCPU {cpu_model()}, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}"
    )


def source_revision() -> str:
    """The commit the benchmarked code comes from, "+changes" when src/ differs from it (read-only git calls)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        commit = run_quiet(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = run_quiet(["git", "--no-optional-locks", "-C", str(repo), "status", "--porcelain", "--", "src"]).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"commit {commit}{' +changes in src/' if dirty.strip() else ''}"


def print_machine(data_dir: Path) -> None:
    console.print(
        f"machine: {os.cpu_count()} CPUs ({cpu_model()}), data dir {data_dir} on {filesystem_type(data_dir)}, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M %Z')}; tidelog {source_revision()}"
    )
    if returns_freed_memory_to_host():
        console.print(
            "  this VM's balloon reports free pages to its host: writes into memory freed a second or more before are "
            "slower (benchutil.returns_freed_memory_to_host)"
        )


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else "n/a"


def percent(value: float, reference: float) -> str:
    return f"{100 * value / reference:.0f} %" if reference else "n/a"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def run_quiet(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a command with the C locale (so its messages parse the same everywhere); raise if it fails."""
    return subprocess.run(argv, check=True, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})


def new_table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    return table


def write_doc_section(path: Path, heading: str, section: str) -> str:
    """Add a script's section (starting with the line `heading`, "## ...") to docs/benchmarks.md, or replace its
    previous one up to the next heading of level 1 or 2; other sections stay as they are. Returns "appended" or
    "replaced".

    The file is re-read just before writing (other scripts write other sections of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
        action = "appended"
    else:
        end = next((i for i in range(start + 1, len(lines)) if re.match(r"^#{1,2} ", lines[i])), len(lines))
        before, after = "".join(lines[:start]), "".join(lines[end:])
        new = before + section.rstrip("\n") + "\n" + ("\n" + after if after else "")
        action = "replaced"
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(new, encoding="utf-8")
    os.replace(tmp, path)
    return action
