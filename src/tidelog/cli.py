"""The `tidelog` command: one subcommand per tool.

tidelog dump-log --files F[,F...] [--print-data-log] [--verify-index-only] [--index-sanity-check]
tidelog demo
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.logging import RichHandler

from tidelog.tools.dump_log import INT_MAX, DumpOptions, dump_files


def _dump_log(args: argparse.Namespace) -> int:
    options = DumpOptions(
        print_data_log=args.print_data_log,
        deep_iteration=args.deep_iteration,
        verify_index_only=args.verify_index_only,
        index_sanity_check=args.index_sanity_check,
        skip_record_metadata=args.skip_record_metadata,
        max_bytes=args.max_bytes,
        max_message_size=args.max_message_size,
    )
    files = [f for f in args.files.split(",") if f]
    return dump_files(files, options)


def _serve(args: argparse.Namespace) -> int:
    from tidelog.broker.run import serve

    return serve(args.config, args.override)


def _demo(args: argparse.Namespace) -> int:
    from tidelog import demo

    demo.run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidelog", description="A durable, partitioned, Kafka-compatible log.")
    commands = parser.add_subparsers(dest="command", required=True)

    dump = commands.add_parser(
        "dump-log",
        help="print .log, .index, .timeindex and .txnindex files as kafka-dump-log.sh does",
        description="Parse segment files and dump their contents (the same output as Kafka's kafka-dump-log.sh).",
    )
    dump.add_argument("--files", required=True, help="comma-separated list of data and index files to dump")
    dump.add_argument("--print-data-log", action="store_true", help="print the keys and values of the records")
    dump.add_argument("--deep-iteration", action="store_true", help="print every record, not only batches")
    dump.add_argument(
        "--verify-index-only", action="store_true", help="check the index against the log, print nothing else"
    )
    dump.add_argument("--index-sanity-check", action="store_true", help="run the start-up sanity check on index files")
    dump.add_argument("--skip-record-metadata", action="store_true", help="do not print record metadata")
    dump.add_argument("--max-bytes", type=int, default=INT_MAX, help="read at most this many bytes of each .log file")
    dump.add_argument("--max-message-size", type=int, default=5 * 1024 * 1024, help="size of the largest batch")
    dump.set_defaults(handler=_dump_log)

    serve = commands.add_parser("serve", help="run a broker that speaks the Kafka protocol")
    serve.add_argument("-c", "--config", help="a server.properties file (Kafka's key names)")
    serve.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="set a config key (repeatable)"
    )
    serve.set_defaults(handler=_serve)

    demo = commands.add_parser("demo", help="a short storage demo (what `make demo` runs)")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if sys.stderr.isatty():
        handler: logging.Handler = RichHandler(console=Console(stderr=True), show_path=False, markup=False)
        logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[handler])
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
