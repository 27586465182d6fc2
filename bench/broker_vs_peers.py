"""The tidelog broker against Redis Streams and NATS JetStream, in one run on one machine, with Python clients
and with compiled ones.

Every system gets the same records (100 bytes of value) and the same count (default 1,000,000), over 127.0.0.1.
Python clients (one tier):

  tidelog  `tidelog serve` driven by confluent-kafka (librdkafka). Produce with acks=1 to a broker with the default
           flush policy (the OS flushes, as Kafka does), produce with acks=all to a second broker started with
           log.flush.interval.messages=1 (acks=all waits for a group-commit fsync), and a consumer that assigns
           the acks=1 topic from the beginning and reads it all.
  Redis    Debian redis-server, --appendonly yes --appendfsync everysec. redis-py XADD in pipelines of 1000,
           then XREAD COUNT 10000 until the stream is drained.
  NATS     Debian nats-server -js (file storage). nats-py publish_async with at most 4000 acks pending, then a
           pull consumer fetch(10000) acknowledging the last message of each batch (AckAll).

Compiled clients (the other tier: the client no longer sets the pace, so the servers are measured):

  tidelog  Debian's kcat (C, librdkafka): `kcat -P` of the records as lines from a file (acks=1, and acks=all to
           the durable broker), `kcat -C -o beginning -e` to /dev/null.
  Redis    redis-benchmark (C): XADD with 64 commands pipelined on each of 50 connections; XRANGE - + COUNT 1000
           (the stream's first 1000 entries, over and over: Redis's read path, 1000 entries per command).
  NATS     bench/natsbench (Go, nats.go, built with Debian's golang-go): PublishAsync with 4000 acks pending, and a
           pull consumer Fetch(10000) with AckAll, the nats-py flows in Go.

Ratios and targets compare each tidelog row with the peers of its own tier and direction. Each test runs in a
fresh client process; tests are interleaved system by system inside each repetition, and records/s is the median
over the repetitions. CPU is CPU seconds over wall time (100 % = one core): servers from /proc/PID/stat utime+stime,
clients from getrusage (all of the client's threads, so librdkafka can pass 100 %).

End-to-end latency: a producer process sends at a steady rate (default 10,000 msg/s) for a warm-up plus a
measured period; each value starts with the sequence number and CLOCK_MONOTONIC at the send call; a consumer
process computes now - sent for every record after the warm-up. Same 100-byte values. Producers: librdkafka with
linger.ms=1 (acks=1; acks=all on the durable broker, once with librdkafka's default of 1,000,000 requests in flight
and once with 1), redis-py XADD one call per record, nats-py publish_async; consumers: librdkafka poll() after
assign, XREAD BLOCK, a JetStream push consumer (AckNone).

This 2-vCPU box is shared: before each test the script syncs and waits for the rest of the machine to go quiet,
and it reports the CPU the rest of the machine used during each test, flagging disturbed figures.
Servers run on ephemeral ports with data under a fresh scratch directory, and are always stopped at the end
(they also get SIGTERM if this script dies). `--profile DIR` adds untimed tidelog runs under py-spy and prints
the broker's hot spots for produce, fetch and the latency flows.

This script is the entry point (options, the order of the run, the worker processes' --worker hook); the rest is
in bench/peers/: harness.py (processes, ports, timing, CPU), clients.py (the flows a worker process runs),
systems.py (one class per system, and one test's run), report.py (ratios, tables, plot, the docs section) and
profile.py (py-spy).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchutil import (
    add_dir_argument,
    console,
    filesystem_type,
    machine_line,
    scratch_dir,
    source_revision,
    write_doc_section,
)
from peers.clients import run_worker
from peers.harness import Context, Processes, scan_server_logs, settle, stop_servers
from peers.profile import print_profiles, profile_broker
from peers.report import (
    BENCHMARKS_MD,
    PNG,
    REPO,
    SECTION_HEADING,
    markdown_section,
    plot,
    print_tables,
    summarize,
)
from peers.systems import LATENCY_TESTS, SYSTEMS, TESTS, Test, run_latency, run_throughput, versions


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--records", type=int, default=None, help="records per throughput test (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions per throughput test (default 3)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 100k records, 1 repetition, 5 s of latency; docs are not written",
    )
    parser.add_argument("--rate", type=int, default=10_000, help="messages/s for the latency tests (default 10000)")
    parser.add_argument("--latency-seconds", type=float, default=None, help="measured latency period (default 15)")
    parser.add_argument("--warmup-seconds", type=float, default=None, help="latency warm-up, not counted (default 2)")
    parser.add_argument("--systems", default="tidelog,redis,nats", help="comma-separated subset to run")
    parser.add_argument(
        "--clients",
        default="python,compiled",
        help="client tiers to run: python (confluent-kafka, redis-py, nats-py) and/or compiled (kcat, "
        "redis-benchmark, nats.go); default both",
    )
    parser.add_argument("--no-latency", action="store_true", help="skip the latency tests")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="before each test, wait up to this many seconds for the rest of the machine to go quiet (default 120)",
    )
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"write {PNG.relative_to(REPO)} and the section of {BENCHMARKS_MD.relative_to(REPO)} "
        "(default: yes, except with --quick)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        default=None,
        help="after the timed runs, run the tidelog tests once more under py-spy (attached to the "
        "broker) and print its hot spots; raw stacks go to DIR",
    )
    parser.add_argument("--profile-top", type=int, default=15, help="rows per hot-spot table (default 15)")
    add_dir_argument(parser)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    args.records = args.records or (100_000 if args.quick else 1_000_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.latency_seconds = args.latency_seconds or (5.0 if args.quick else 15.0)
    args.warmup_seconds = args.warmup_seconds if args.warmup_seconds is not None else (1.0 if args.quick else 2.0)
    args.docs = (not args.quick) if args.docs is None else args.docs
    args.systems = {s.strip() for s in args.systems.split(",") if s.strip()}
    unknown = args.systems - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown system(s) {', '.join(sorted(unknown))}")
    args.clients = {c.strip() for c in args.clients.split(",") if c.strip()}
    if not args.clients or args.clients - {"python", "compiled"}:
        parser.error("--clients takes python, compiled or both")
    return args


def selected(test: Test, args: argparse.Namespace) -> bool:
    return test.system in args.systems and test.tier in args.clients


def check_tools(args: argparse.Namespace) -> None:
    systems = [SYSTEMS[name] for name in args.systems]
    missing = sorted(
        {
            tool
            for system in systems
            for tier, tools in system.tools.items()
            if tier in args.clients
            for tool in tools
            if shutil.which(tool) is None
        }
    )
    if missing:
        packages = {tool: package for system in systems for tool, package in system.packages.items()}
        apt = " ".join(packages.get(tool, tool) for tool in missing)
        console.print(f"[bold red]missing:[/] {', '.join(missing)} (Debian: apt-get install -y {apt})")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker(args.worker)
    check_tools(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: servers are stopped
    command = "python bench/broker_vs_peers.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    per_rep = 4 * 140 * args.records  # four tidelog topics a repetition
    needed = args.repeat * per_rep + 4 * 400 * args.records  # plus NATS's store, Redis's AOF and kcat's input
    procs = Processes()
    results: dict[str, list[dict[str, Any]]] = {t.key: [] for t in TESTS if selected(t, args)}
    latency: dict[str, dict[str, Any]] = {}
    phases: list[dict[str, Any]] = []
    with scratch_dir(args.dir, needed, "tidelog-vs-peers-") as scratch:
        ctx = Context(args, procs, scratch, revision=source_revision())
        console.print(
            f"machine: {machine_line()}; data dir {scratch} on {filesystem_type(scratch)}; {started}; "
            f"tidelog {ctx.revision}"
        )
        try:
            for name, system in SYSTEMS.items():
                if name in args.systems:
                    system.start(ctx)
            version_text = versions()
            console.print(version_text)
            for rep in range(args.repeat):
                for test in TESTS:
                    if not selected(test, args):
                        continue
                    with console.status(f"[{rep + 1}/{args.repeat}] {test.label} …"):
                        settle(ctx)
                        result = run_throughput(ctx, test, rep)
                    results[test.key].append(result)
                    console.print(
                        f"[{rep + 1}/{args.repeat}] {test.label + ' (' + test.client + ')':<70} "
                        f"{result['rate']:>10,.0f} rec/s   server CPU "
                        f"{result['server_cpu']:4.0f} %   client CPU {result['client_cpu']:4.0f} %   rest of the "
                        f"machine {result['other_cpu']:4.0f} %"
                    )
            if not args.no_latency:
                for key, label, _ in LATENCY_TESTS:
                    if key.split("_")[0] not in args.systems:
                        continue
                    with console.status(f"latency: {label} …"):
                        settle(ctx)
                        latency[key] = run_latency(ctx, key)
                    row = latency[key]
                    console.print(
                        f"latency {label:<28} sent {row['producer_send_rate']:,.0f}/s  p50 {row.get('p50', 0):.2f} ms"
                        f"  p99 {row.get('p99', 0):.2f} ms  (received {row['received']:,} of {row['expected']:,})"
                    )
            if args.profile and "tidelog" in args.systems:
                phases = profile_broker(ctx, args.profile)
        except (KeyboardInterrupt, SystemExit):
            console.print("interrupted: stopping every server and client process this run started")
            raise
        finally:
            stop_servers(ctx)
            procs.stop_all()
            for short, detail in scan_server_logs(ctx.servers):
                procs.problems.append(short)
                procs.details[short] = detail
        summary = summarize(results)
        print_tables(summary, latency, args)
        print_profiles(phases)
        for problem in procs.problems:
            console.print("note: " + procs.details.get(problem, problem), markup=False)
        if args.docs:
            plot(summary, latency, args, PNG)
            section = markdown_section(ctx, summary, latency, command, version_text, started, procs.problems)
            action = write_doc_section(BENCHMARKS_MD, SECTION_HEADING, section)
            console.print(
                f"wrote {PNG.relative_to(REPO)}; {action} the section “{SECTION_HEADING[3:]}” in "
                f"{BENCHMARKS_MD.relative_to(REPO)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
