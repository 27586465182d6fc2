"""Plot the storage benchmarks (sections 1-4 of docs/benchmarks.md) as docs/storage-benchmarks.png.

    .venv/bin/python bench/plot_storage.py                       # the tables in docs/benchmarks.md
    .venv/bin/python bench/plot_storage.py append.txt read.txt   # tables from saved script outputs instead

The figures are not measured here: they are read from the tables, either the markdown tables of
docs/benchmarks.md or the rich tables the four scripts print (`make bench-append > append.txt`, ...). Each
source file may hold any of the four tables; a table found in a later file replaces the one from an earlier
file, so the plot shows exactly the numbers of the tables it was given. Four panels:

  append     MB/s of dd, the Python pwrite loop and engine.append (page cache), then dd conv=fdatasync and
             append + flush (durable); whiskers are the min-max range over the repetitions; the target line
             is 80 % of dd's median
  produce    log.produce records/s by records per call, for each value size; kafka-python's builder alone
             (no storage) as markers
  read       latency percentiles of raw pread, locate, locate + bytes and locate + bytes + decode (log scale);
             the target line is 100 µs for p99 of locate + bytes
  recovery   tidelog.open() GB/s after an unclean shutdown against Python read + crc32c, per batch size; the
             target line is 1 GB/s
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.container import BarContainer

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
PNG = REPO / "docs" / "storage-benchmarks.png"

APPEND_TARGET = 0.80  # of dd, page cache
READ_TARGET_US = 100.0  # p99 of locate + bytes
RECOVERY_TARGET_GBPS = 1.0
PERCENTILES = ("p50", "p90", "p99", "p99.9")

Table = list[list[str]]


def tables(text: str) -> list[Table]:
    """The data rows of every table in `text`: markdown (`| a | b |`, header and `---` rows dropped) or rich
    (`│ a │ b │`; its headers use other box characters and are not data rows)."""
    found: list[Table] = []
    current: Table = []
    markdown_header = False
    for line in [*text.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|"):
            cells = [c.strip() for c in stripped[1:-1].split("|")]
            if not current and not markdown_header:
                markdown_header = True  # the first row of a markdown table is its header
                continue
            if all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue
            current.append(cells)
        elif stripped.startswith("│") and stripped.endswith("│"):
            current.append([c.strip() for c in stripped[1:-1].split("│")])
        else:
            if current:
                found.append(current)
            current, markdown_header = [], False
    return found


def number(cell: str) -> float:
    """A figure as the tables print it: bold markers, thousands separators, %, x and units are dropped."""
    match = re.search(r"-?[0-9][0-9,]*(\.[0-9]+)?", cell.replace("*", ""))
    if match is None:
        raise ValueError(f"no number in table cell {cell!r}")
    return float(match.group(0).replace(",", ""))


def is_number(cell: str) -> bool:
    return re.fullmatch(r"\**[0-9][0-9,.]*\**", cell) is not None


def find_tables(paths: list[Path]) -> dict[str, Table]:
    """The append, produce, read and recovery tables, recognised by their rows."""
    out: dict[str, Table] = {}
    for path in paths:
        for table in tables(path.read_text(encoding="utf-8")):
            first = [row[0] for row in table]
            if any(c.startswith("tidelog engine.append") for c in first):
                out["append"] = table
            elif any(c.startswith("raw pread") for c in first):
                out["read"] = table
            elif all(len(row) == 8 and row[0].endswith("KiB") for row in table):
                out["recovery"] = table
            elif all(len(row) == 12 and is_number(row[0]) and is_number(row[1]) for row in table):
                out["produce"] = table
    return out


def title_from(paths: list[Path]) -> str:
    """ "tidelog <commits>, <date>" from the machine table of the markdown doc, when one of the sources is it."""
    for path in paths:
        rows = {row[0]: row[1] for table in tables(path.read_text(encoding="utf-8")) for row in table if len(row) == 2}
        if "tidelog" in rows and "date" in rows:
            return f"tidelog storage benchmarks, {rows['tidelog'].replace('`', '')}, {rows['date']}"
    return "tidelog storage benchmarks"


def bar_labels(ax: Axes, bars: BarContainer, values: Sequence[float], fmt: str) -> None:
    for bar, value in zip(bars, values, strict=True):
        ax.text(
            bar.get_x() + bar.get_width() / 2,
            bar.get_height(),
            fmt.format(value),
            ha="center",
            va="bottom",
            fontsize=7,
        )


def plot_append(ax: Axes, table: Table) -> None:
    labels = ["dd bs=1M", "python\npwrite loop", "tidelog\nengine.append", "dd\nconv=fdatasync", "tidelog\n+ flush()"]
    mbps = [number(row[1]) for row in table]
    ranges = [[number(x) for x in row[2].split("-")] for row in table]
    low = [m - r[0] for m, r in zip(mbps, ranges, strict=True)]
    high = [r[1] - m for m, r in zip(mbps, ranges, strict=True)]
    colors = ["#7f7f7f", "#bcbd22", "#1f77b4", "#7f7f7f", "#1f77b4"]
    x = [0, 1, 2, 3.6, 4.6]
    bars = ax.bar(x, mbps, 0.8, yerr=[low, high], color=colors, capsize=3, error_kw={"elinewidth": 0.8})
    for bar, value, row, extra in zip(bars, mbps, table, high, strict=True):
        ax.text(
            bar.get_x() + bar.get_width() / 2,
            value + extra,
            f"{value:.0f}\n{row[3].replace('*', '')}",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.axhline(APPEND_TARGET * mbps[0], xmin=0.02, xmax=0.56, color="red", linestyle="--", linewidth=1)
    ax.text(-0.4, APPEND_TARGET * mbps[0], f"target {APPEND_TARGET:.0%} of dd", color="red", fontsize=7, va="bottom")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("MB/s (median; whiskers min-max)")
    ax.set_title("1. append 1 MiB batches: page cache | durable", fontsize=9)
    ax.margins(y=0.25)


def plot_produce(ax: Axes, table: Table) -> None:
    sizes = sorted({int(number(row[0])) for row in table})
    per_call = sorted({int(number(row[1])) for row in table})
    width = 0.8 / len(sizes)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]
    for i, size in enumerate(sizes):
        rows = {int(number(row[1])): row for row in table if int(number(row[0])) == size}
        xs = [j + (i - (len(sizes) - 1) / 2) * width for j, n in enumerate(per_call) if n in rows]
        produce = [number(rows[n][2]) for n in per_call if n in rows]
        kafka = [number(rows[n][9]) for n in per_call if n in rows]
        bars = ax.bar(xs, produce, width * 0.95, color=colors[i % len(colors)], label=f"log.produce, {size} B values")
        bar_labels(ax, bars, produce, "{:,.0f}")
        ax.plot(
            xs,
            kafka,
            linestyle="none",
            marker="_",
            markersize=14,
            markeredgewidth=2,
            color="black",
            label="kafka-python builder alone (no storage)" if i == 0 else None,
        )
    ax.set_yscale("log")
    ax.set_xticks(range(len(per_call)), [f"{n:,} per call" for n in per_call], fontsize=8)
    ax.set_ylabel("records/s (median of rounds, log scale)")
    ax.set_title("2. produce through the embedded API", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.margins(y=0.2)


def plot_read(ax: Axes, table: Table) -> None:
    labels = ["raw pread (floor)", "locate", "locate + bytes", "locate + bytes + decode"]
    colors = ["#7f7f7f", "#aec7e8", "#1f77b4", "#ff7f0e"]
    width = 0.8 / len(table)
    for i, row in enumerate(table):
        values = [number(c) for c in row[1:5]]
        xs = [j + (i - (len(table) - 1) / 2) * width for j in range(len(PERCENTILES))]
        bars = ax.bar(xs, values, width * 0.95, color=colors[i % len(colors)], label=labels[i % len(labels)])
        bar_labels(ax, bars, values, "{:.0f}")
    ax.axhline(READ_TARGET_US, color="red", linestyle="--", linewidth=1)
    ax.text(-0.45, READ_TARGET_US, f"target: p99 of locate + bytes <= {READ_TARGET_US:g} µs", color="red", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(range(len(PERCENTILES)), PERCENTILES, fontsize=8)
    ax.set_ylabel("µs per call (log scale)")
    ax.set_title("3. random read by offset, 10M records", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.margins(y=0.25)


def plot_recovery(ax: Axes, table: Table) -> None:
    labels = [f"{row[0].replace('*', '')} batches" for row in table]
    opened = [number(row[3]) for row in table]
    reference = [number(row[4]) for row in table]
    xs = range(len(table))
    bars = ax.bar([x - 0.2 for x in xs], opened, 0.4, color="#1f77b4", label="tidelog.open() (recovery)")
    bar_labels(ax, bars, opened, "{:.2f}")
    bars = ax.bar([x + 0.2 for x in xs], reference, 0.4, color="#7f7f7f", label="python read + crc32c")
    bar_labels(ax, bars, reference, "{:.2f}")
    ax.axhline(RECOVERY_TARGET_GBPS, color="red", linestyle="--", linewidth=1)
    ax.text(-0.45, RECOVERY_TARGET_GBPS, f"target {RECOVERY_TARGET_GBPS:g} GB/s", color="red", fontsize=7, va="bottom")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("GB/s from the page cache (median)")
    ax.set_title("4. recovery scan after an unclean shutdown, 2 GiB", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.margins(y=0.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "sources", nargs="*", type=Path, default=[DOC], help=f"files holding the tables (default: {DOC})"
    )
    parser.add_argument("--out", type=Path, default=PNG, help=f"the PNG to write (default: {PNG})")
    parser.add_argument("--title", default=None, help="figure title (default: from the doc's machine table)")
    args = parser.parse_args()

    found = find_tables(args.sources)
    missing = [name for name in ("append", "produce", "read", "recovery") if name not in found]
    if missing:
        raise SystemExit(f"no {', '.join(missing)} table in {', '.join(map(str, args.sources))}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    plot_append(axes[0][0], found["append"])
    plot_produce(axes[0][1], found["produce"])
    plot_read(axes[1][0], found["read"])
    plot_recovery(axes[1][1], found["recovery"])
    fig.suptitle(args.title or title_from(args.sources), fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    plt.close(fig)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
