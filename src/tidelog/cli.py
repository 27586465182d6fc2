"""The `tidelog` command: one subcommand per tool.

tidelog dump-log --files F[,F...] [--print-data-log] [--verify-index-only] [--index-sanity-check]
tidelog serve [-c server.properties] [--override KEY=VALUE ...]
tidelog topics --bootstrap-server H:P --create|--list|--describe|--delete [--topic T] ...
tidelog produce --bootstrap-server H:P --topic T [--property parse.key=true ...] < lines
tidelog consume --bootstrap-server H:P --topic T [--group G] [--from-beginning] [--property print.key=true ...]
tidelog reassign --bootstrap-server H:P (--execute|--verify|--cancel) --reassignment-json-file F
tidelog reassign --bootstrap-server H:P --generate --topics-to-move-json-file F --broker-list 1,2,3
tidelog consumer-groups --bootstrap-server H:P --list|--describe|--reset-offsets|--delete|--delete-offsets ...
tidelog configs --bootstrap-server H:P --describe|--alter --entity-type T [--entity-name N | --entity-default] ...
tidelog perf produce --topic T --num-records N --record-size S --throughput R --bootstrap-server H:P
tidelog perf consume --bootstrap-server H:P --topic T --messages N [--group G] [--timeout MS]
tidelog dump-commitlog --store DIR [--print-body]
tidelog rocketmq ha-status --zookeeper H:P [--broker-name G] [--json]
tidelog rocketmq switch-role --zookeeper H:P --broker-name G --master ID [--force]
tidelog dump-consumequeue --store DIR --topic T --queue Q
tidelog query-message --store DIR (--topic T --key K [--begin MS] [--end MS] [--max N] | --msg-id ID)
tidelog demo [--storage | --cluster] [--seconds S] [--rate N] [--read-from broker|files]
tidelog users (--log-dir DIR | -c server.properties) --add U [--password P | --password-file F] | --remove U | --list
tidelog acls (--log-dir DIR | -c server.properties) --add|--remove|--list [kafka-acls.sh options]

A usage error is one line on stderr (`tidelog produce: error: ...`) and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypedDict

from rich.console import Console
from rich.logging import RichHandler

from tidelog.tools.dump_log import INT_MAX, DumpOptions, dump_files


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (argparse prints the whole usage first) naming the subcommand."""

    def error(self, message: str) -> NoReturn:
        self._fail(self.prog, message)

    def parse_args(self, args: Sequence[str] | None = None, namespace: None = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # argparse reports these from the top parser; say which subcommand did not know them
            command = getattr(parsed, "command", None)
            self._fail(
                f"{self.prog} {command}" if command else self.prog, f"unrecognized arguments: {' '.join(extras)}"
            )
        return parsed

    def _fail(self, prog: str, message: str) -> NoReturn:
        self.exit(2, f"{prog}: error: {message} (see {prog} --help)\n")


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


def _dump_commitlog(args: argparse.Namespace) -> int:
    from tidelog.tools import rocketmq_tools

    return rocketmq_tools.dump_commitlog(Path(args.store), print_body=args.print_body)


def _dump_consumequeue(args: argparse.Namespace) -> int:
    from tidelog.tools import rocketmq_tools

    return rocketmq_tools.dump_consumequeue(Path(args.store), args.topic, args.queue)


def _query_message(args: argparse.Namespace) -> int:
    from tidelog.errors import ToolError
    from tidelog.tools import rocketmq_tools

    store = Path(args.store)
    if args.msg_id is not None:
        return rocketmq_tools.query_by_id(store, args.msg_id)
    if args.topic is None or args.key is None:
        raise ToolError("give --topic and --key, or --msg-id", exit_code=2)
    return rocketmq_tools.query_by_key(
        store,
        args.topic,
        args.key,
        begin=args.begin,
        end=args.end,
        max_num=args.max,
        hash_slot_num=args.max_hash_slot_num,
        index_num=args.max_index_num,
    )


def _serve(args: argparse.Namespace) -> int:
    # kio registers hypothesis strategies for its types whenever hypothesis (a test dependency) can be imported: a
    # broker process generates no test data, and the registration would cost every start a few hundred ms (seconds
    # in a working directory without hypothesis's cache)
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    from tidelog.allocator import keep_freed_memory
    from tidelog.broker.run import serve
    from tidelog.open_files import raise_open_file_limit

    raise_open_file_limit()  # a broker with many partitions and connections needs many descriptors
    keep_freed_memory()  # request-sized buffers reused from the heap, not faulted in afresh on every request
    return serve(args.config, args.override)


def _cluster_up(args: argparse.Namespace) -> int:
    from tidelog.tools.cluster_up import ClusterUpOptions, run

    options = ClusterUpOptions(
        brokers=args.brokers,
        directory=Path(args.dir) if args.dir else None,
        base_port=args.base_port,
        zookeeper_port=args.zookeeper_port,
        interval_s=args.interval,
    )
    return run(options)


def _add_cluster_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    cluster = commands.add_parser("cluster", help="run a local cluster: ZooKeeper and N brokers")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    up = actions.add_parser(
        "up",
        help="start ZooKeeper and N brokers on 127.0.0.1, show who leads what, stop them all on Ctrl-C",
        description="Start a standalone ZooKeeper and N `tidelog serve` brokers joined to it (docs/cluster.md), "
        "print the bootstrap servers, the brokers and the partition leaders as they change; Ctrl-C or SIGTERM "
        "stops the brokers, then ZooKeeper.",
    )
    up.add_argument("--brokers", type=int, default=3, help="how many brokers (ids 1..N, default 3)")
    up.add_argument("--dir", help="where ZooKeeper and the brokers keep their data (default: a new temp dir, kept)")
    up.add_argument("--base-port", type=int, help="broker N listens on BASE_PORT + N - 1 (default: free ports)")
    up.add_argument("--zookeeper-port", type=int, help="ZooKeeper's client port (default: a free port)")
    up.add_argument("--interval", type=float, default=3.0, help="seconds between looks at the leaders (default 3)")
    up.set_defaults(handler=_cluster_up)


def _demo(args: argparse.Namespace) -> int:
    if args.storage:
        from tidelog import demo

        demo.run()
        return 0
    if args.cluster:
        if args.read_from == "files":
            print("tidelog demo: error: --cluster reads through the brokers, not --read-from files", file=sys.stderr)
            return 2
        from tidelog.tools import cluster_demo

        return cluster_demo.run(seconds=args.seconds, rate=args.rate)
    from tidelog.spark import demo as spark_demo

    return spark_demo.run(seconds=args.seconds, rate=args.rate, read_from=args.read_from)


Handler = Callable[[argparse.Namespace], int]


def _console_tool(handler: Handler) -> Handler:
    """A console tool's failure is one line on stderr and its exit code; Ctrl-C outside a consume loop is 130."""

    def run(args: argparse.Namespace) -> int:
        from tidelog.errors import ToolError

        try:
            return handler(args)
        except ToolError as exc:
            print(f"tidelog {args.command}: error: {exc}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt:
            return 130

    return run


def _topics(args: argparse.Namespace) -> int:
    from tidelog.config import load_properties
    from tidelog.errors import ConfigError
    from tidelog.tools import console

    try:
        client_config = load_properties(args.command_config) if args.command_config else {}
    except (ConfigError, OSError) as exc:
        raise console.ToolError(f"--command-config: {exc}", console.USAGE) from None
    options = console.TopicsOptions(
        bootstrap_server=args.bootstrap_server,
        action=args.action,
        topic=args.topic,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        configs=console.parse_key_values(args.config, "--config"),
        if_not_exists=args.if_not_exists,
        if_exists=args.if_exists,
        client_config=client_config,
        connect_timeout_ms=args.connect_timeout_ms,
    )
    return console.topics(options)


def _produce(args: argparse.Namespace) -> int:
    from tidelog.tools import console

    options = console.ProduceOptions(
        bootstrap_server=args.bootstrap_server,
        topic=args.topic,
        line_format=console.LineFormat.from_properties(console.parse_key_values(args.property, "--property")),
        partition=args.partition,
        acks=args.acks,
        compression_type=args.compression_type,
        producer_config=console.parse_key_values(args.producer_property, "--producer-property"),
        connect_timeout_ms=args.connect_timeout_ms,
    )
    return console.produce(options)


def _consume(args: argparse.Namespace) -> int:
    from tidelog.tools import console

    options = console.ConsumeOptions(
        bootstrap_server=args.bootstrap_server,
        topic=args.topic,
        record_format=console.RecordFormat.from_properties(console.parse_key_values(args.property, "--property")),
        group=args.group,
        from_beginning=args.from_beginning,
        partition=args.partition,
        offset=args.offset,
        max_messages=args.max_messages,
        timeout_ms=args.timeout_ms,
        consumer_config=console.parse_key_values(args.consumer_property, "--consumer-property"),
        connect_timeout_ms=args.connect_timeout_ms,
    )
    return console.consume(options)


def _reassign(args: argparse.Namespace) -> int:
    from tidelog.tools.reassign import ReassignOptions, reassign

    options = ReassignOptions(
        bootstrap_server=args.bootstrap_server,
        action=args.action,
        reassignment_json_file=args.reassignment_json_file,
        topics_to_move_json_file=args.topics_to_move_json_file,
        broker_list=args.broker_list,
        timeout_ms=args.timeout,
    )
    return reassign(options)


def _client_config(path: str | None) -> dict[str, str]:
    """--command-config: a properties file of client configs."""
    from tidelog.config import load_properties
    from tidelog.errors import ConfigError, ToolError

    try:
        return load_properties(path) if path else {}
    except (ConfigError, OSError) as exc:
        raise ToolError(f"--command-config: {exc}", 2) from None


def _consumer_groups(args: argparse.Namespace) -> int:
    from tidelog.tools.consumer_groups import ConsumerGroupsOptions, consumer_groups

    scenarios = {
        "to-earliest": args.to_earliest or None,
        "to-latest": args.to_latest or None,
        "to-offset": args.to_offset,
        "to-datetime": args.to_datetime,
        "shift-by": args.shift_by,
    }
    given = [(name, value) for name, value in scenarios.items() if value is not None]
    if len(given) > 1:
        from tidelog.errors import ToolError

        raise ToolError(f"give one of --{', --'.join(name for name, _ in given)}", 2)
    scenario, value = given[0] if given else (None, None)
    options = ConsumerGroupsOptions(
        bootstrap_server=args.bootstrap_server,
        action=args.action,
        groups=tuple(args.group),
        all_groups=args.all_groups,
        topics=tuple(args.topic),
        all_topics=args.all_topics,
        state=args.state,
        members=args.members,
        scenario=scenario,
        scenario_value=value if isinstance(value, str) else None,
        execute=args.execute,
        timeout_ms=args.timeout,
        client_config=_client_config(args.command_config),
    )
    return consumer_groups(options)


def _configs(args: argparse.Namespace) -> int:
    from tidelog.tools.configs import ConfigsOptions, configs, parse_delete_config

    options = ConfigsOptions(
        bootstrap_server=args.bootstrap_server,
        action=args.action,
        entity_types=tuple(args.entity_type),
        entity_names=tuple(args.entity_names),
        describe_all=args.all,
        add_config=args.add_config,
        delete_config=parse_delete_config(args.delete_config),
    )
    return configs(options)


def _perf(args: argparse.Namespace) -> int:
    from tidelog.tools import perf

    if args.perf_command == "produce":
        return perf.produce_perf(
            perf.ProducePerfOptions(
                topic=args.topic,
                num_records=args.num_records,
                record_size=args.record_size,
                throughput=args.throughput,
                producer_props=perf.parse_props(args.producer_props, "--producer-props"),
                bootstrap_server=args.bootstrap_server,
                reporting_interval_ms=args.reporting_interval,
            )
        )
    return perf.consume_perf(
        perf.ConsumePerfOptions(
            bootstrap_server=args.bootstrap_server,
            topic=args.topic,
            messages=args.messages,
            group=args.group,
            timeout_ms=args.timeout,
            from_latest=args.from_latest,
            hide_header=args.hide_header,
            consumer_props=perf.parse_props(args.consumer_props, "--consumer-props"),
        )
    )


def _users(args: argparse.Namespace) -> int:
    from tidelog.tools import security_tools

    options = security_tools.UsersOptions(
        log_dir=security_tools.resolve_log_dir(args.log_dir, args.config),
        action=args.action,
        user=args.user,
        password=args.password,
        password_file=args.password_file,
        mechanisms=tuple(args.mechanism),
        iterations=args.iterations,
    )
    return security_tools.users(options)


def _acls(args: argparse.Namespace) -> int:
    from tidelog.tools import security_tools

    options = security_tools.AclsOptions(
        log_dir=security_tools.resolve_log_dir(args.log_dir, args.config),
        action=args.action,
        allow_principals=tuple(args.allow_principal),
        deny_principals=tuple(args.deny_principal),
        allow_hosts=tuple(args.allow_host),
        deny_hosts=tuple(args.deny_host),
        operations=tuple(args.operation),
        topics=tuple(args.topic),
        groups=tuple(args.group),
        cluster=args.cluster,
        pattern_type=args.resource_pattern_type,
        producer=args.producer,
        consumer=args.consumer,
        principals=tuple(args.principal),
    )
    return security_tools.acls(options)


def _add_data_dir_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--log-dir", metavar="DIR", help="the broker's (first) log dir")
    where.add_argument("-c", "--config", metavar="FILE", help="the broker's server.properties (its log.dirs)")


def _add_users_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    users = commands.add_parser(
        "users",
        help="add, remove and list SASL/SCRAM users (stored salted and hashed, never the password)",
        description="Manage the SCRAM credentials a broker checks for SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 "
        "(kafka-configs.sh --entity-type users --alter --add-config 'SCRAM-SHA-256=[...]'). Works on the data dir, "
        "offline or while the broker runs; changes take effect without a restart.",
    )
    _add_data_dir_arguments(users)
    actions = users.add_mutually_exclusive_group(required=True)
    actions.add_argument("--add", dest="user", metavar="USER", help="add a user, or set a new password")
    actions.add_argument("--remove", metavar="USER", help="remove a user's credentials")
    actions.add_argument("--list", action="store_true", help="list users and their mechanisms")
    users.add_argument("--password", help="the password (visible to other local users; prefer --password-file)")
    users.add_argument("--password-file", metavar="FILE", help="read the password from FILE's first line (- = stdin)")
    users.add_argument(
        "--mechanism",
        action="append",
        default=[],
        choices=["SCRAM-SHA-256", "SCRAM-SHA-512"],
        help="the mechanism(s) to add or remove (default: both)",
    )
    users.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations, 4096-16384 (default 4096)")
    users.set_defaults(handler=_console_tool(_users_dispatch))


def _users_dispatch(args: argparse.Namespace) -> int:
    if args.remove is not None:
        args.action, args.user = "remove", args.remove
    else:
        args.action = "list" if args.list else "add"
    return _users(args)


class _Repeatable(TypedDict):
    """The add_argument keywords of a repeatable option (typed, so that `**repeatable` checks against argparse)."""

    action: str
    default: list[str]


def _add_acls_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    acls = commands.add_parser(
        "acls",
        help="add, remove and list ACLs, as kafka-acls.sh does",
        description="Manage the ACLs a broker with authorizer.class.name set enforces (kafka-acls.sh). Works on the "
        "data dir, offline or while the broker runs; changes take effect without a restart. Operations: Read, Write, "
        "Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All.",
    )
    _add_data_dir_arguments(acls)
    actions = acls.add_mutually_exclusive_group(required=True)
    for action, text in [("add", "add ACLs"), ("remove", "remove ACLs"), ("list", "list ACLs")]:
        actions.add_argument(f"--{action}", dest="action", action="store_const", const=action, help=text)
    repeatable: _Repeatable = {"action": "append", "default": []}
    acls.add_argument("--allow-principal", metavar="PRINCIPAL", help="e.g. User:alice (repeatable)", **repeatable)
    acls.add_argument("--deny-principal", metavar="PRINCIPAL", help="e.g. User:mallory (repeatable)", **repeatable)
    acls.add_argument(
        "--allow-host", metavar="HOST", help="client address for --allow-principal (default *)", **repeatable
    )
    acls.add_argument(
        "--deny-host", metavar="HOST", help="client address for --deny-principal (default *)", **repeatable
    )
    acls.add_argument("--operation", metavar="OP", help="an operation (repeatable)", **repeatable)
    acls.add_argument("--topic", metavar="TOPIC", help="a topic (or * for all; repeatable)", **repeatable)
    acls.add_argument("--group", metavar="GROUP", help="a consumer group (or * for all; repeatable)", **repeatable)
    acls.add_argument("--cluster", action="store_true", help="the cluster resource")
    acls.add_argument(
        "--resource-pattern-type",
        choices=["literal", "prefixed", "match", "any"],
        type=str.lower,
        help="literal or prefixed for --add (default literal); --list also takes match and any (default any)",
    )
    acls.add_argument("--producer", action="store_true", help="WRITE, DESCRIBE, CREATE on the --topic(s)")
    acls.add_argument("--consumer", action="store_true", help="READ, DESCRIBE on the --topic(s), READ on the --group")
    acls.add_argument("--principal", metavar="PRINCIPAL", help="with --list: only this principal's ACLs", **repeatable)
    acls.add_argument("--force", action="store_true", help="accepted for kafka-acls.sh compatibility (never prompts)")
    acls.set_defaults(handler=_console_tool(_acls))


def _add_client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="the brokers to contact")
    parser.add_argument(
        "--connect-timeout-ms",
        type=int,
        default=10_000,
        metavar="MS",
        help="give up when no broker answers within this time (default 10000)",
    )


def _add_topics_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    topics = commands.add_parser(
        "topics",
        help="create, list, describe and delete topics, as kafka-topics.sh does",
        description="Create, list, describe and delete topics on any Kafka-protocol broker (kafka-topics.sh).",
    )
    _add_client_arguments(topics)
    actions = topics.add_mutually_exclusive_group(required=True)
    for action, text in [
        ("create", "create a topic"),
        ("list", "list the topic names"),
        ("describe", "describe the --topic, or every topic"),
        ("delete", "delete a topic"),
    ]:
        actions.add_argument(f"--{action}", dest="action", action="store_const", const=action, help=text)
    topics.add_argument("--topic", help="the topic's name")
    topics.add_argument("--partitions", type=int, help="partition count of a new topic (default: the broker's)")
    topics.add_argument("--replication-factor", type=int, help="replicas per partition (default: the broker's)")
    topics.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="a topic config of a new topic (repeatable)"
    )
    topics.add_argument("--if-not-exists", action="store_true", help="with --create: succeed if the topic exists")
    topics.add_argument("--if-exists", action="store_true", help="with --describe/--delete: succeed if it does not")
    topics.add_argument("--command-config", metavar="FILE", help="a properties file of client configs (librdkafka)")
    topics.set_defaults(handler=_console_tool(_topics))


def _add_reassign_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    reassign = commands.add_parser(
        "reassign",
        help="move partition replicas between brokers, as kafka-reassign-partitions.sh does",
        description="Propose, start, check and cancel partition reassignments in a cluster "
        "(kafka-reassign-partitions.sh; docs/cluster.md, 'Moving replicas').",
    )
    reassign.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="the brokers to contact")
    actions = reassign.add_mutually_exclusive_group(required=True)
    for action, text in [
        ("generate", "print a proposed assignment of --topics-to-move-json-file's topics over --broker-list"),
        ("execute", "start the reassignment of --reassignment-json-file"),
        ("verify", "say whether each reassignment of --reassignment-json-file is done"),
        ("cancel", "cancel the ongoing reassignments of --reassignment-json-file's partitions"),
    ]:
        actions.add_argument(f"--{action}", dest="action", action="store_const", const=action, help=text)
    reassign.add_argument(
        "--reassignment-json-file",
        metavar="FILE",
        help='{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3]},...]}',
    )
    reassign.add_argument(
        "--topics-to-move-json-file", metavar="FILE", help='with --generate: {"version":1,"topics":[{"topic":"t"}]}'
    )
    reassign.add_argument("--broker-list", metavar="1,2,3", help="with --generate: the brokers to place replicas on")
    reassign.add_argument(
        "--timeout",
        type=int,
        default=30_000,
        metavar="MS",
        help="how long the brokers may take to start (default 30000)",
    )
    reassign.set_defaults(handler=_console_tool(_reassign))


def _add_consumer_groups_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    groups = commands.add_parser(
        "consumer-groups",
        help="list, describe, reset and delete consumer groups, as kafka-consumer-groups.sh does",
        description="List, describe (offsets and lag, members, state), reset the offsets of, and delete consumer "
        "groups on any Kafka-protocol broker (kafka-consumer-groups.sh; docs/tools.md).",
    )
    groups.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="the brokers to contact")
    groups.add_argument("--command-config", metavar="FILE", help="a properties file of client configs (librdkafka)")
    groups.add_argument("--timeout", type=int, default=5000, metavar="MS", help="request timeout (default 5000)")
    actions = groups.add_mutually_exclusive_group(required=True)
    for action, text in [
        ("list", "list the consumer groups"),
        ("describe", "describe --group(s): offsets and lag (default), --members or --state"),
        ("reset-offsets", "plan (--dry-run, the default) or --execute a reset of committed offsets"),
        ("delete", "delete --group(s)"),
        ("delete-offsets", "delete the --group's committed offsets of --topic(s)"),
    ]:
        actions.add_argument(f"--{action}", dest="action", action="store_const", const=action, help=text)
    groups.add_argument("--group", action="append", default=[], help="a consumer group (repeatable)")
    groups.add_argument("--all-groups", action="store_true", help="every consumer group")
    groups.add_argument("--topic", action="append", default=[], metavar="T[:P,...]", help="a topic (repeatable)")
    groups.add_argument("--all-topics", action="store_true", help="with --reset-offsets: every committed partition")
    groups.add_argument(
        "--state",
        nargs="?",
        const="",
        metavar="STATES",
        help="with --list: show states (only these, comma-separated, when given); with --describe: the state view",
    )
    groups.add_argument("--members", action="store_true", help="with --describe: the members view")
    scenario = groups.add_mutually_exclusive_group()
    scenario.add_argument("--to-earliest", action="store_true", help="reset to the log start offset")
    scenario.add_argument("--to-latest", action="store_true", help="reset to the log end offset")
    scenario.add_argument("--to-offset", metavar="N", help="reset to offset N")
    scenario.add_argument(
        "--to-datetime", metavar="ISO", help="reset to the first offset at or after YYYY-MM-DDTHH:mm:SS.sss[zone]"
    )
    scenario.add_argument("--shift-by", metavar="N", help="move the committed offsets by N (may be negative)")
    run = groups.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="only print the reset plan (the default)")
    run.add_argument("--execute", action="store_true", help="commit the reset plan")
    groups.set_defaults(handler=_console_tool(_consumer_groups))


def _add_configs_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    configs = commands.add_parser(
        "configs",
        help="describe and alter topic, broker, user and client configs, as kafka-configs.sh does",
        description="Describe and alter topic and broker configs, client quotas and SCRAM credentials on any "
        "Kafka-protocol broker (kafka-configs.sh; docs/tools.md). Users and clients take the quotas "
        "producer_byte_rate, consumer_byte_rate, request_percentage and controller_mutation_rate; users also "
        "SCRAM-SHA-256=[iterations=8192,password=...] and SCRAM-SHA-512=[...].",
    )
    configs.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="the brokers to contact")
    actions = configs.add_mutually_exclusive_group(required=True)
    actions.add_argument("--describe", dest="action", action="store_const", const="describe", help="list configs")
    actions.add_argument("--alter", dest="action", action="store_const", const="alter", help="change configs")
    configs.add_argument(
        "--entity-type",
        action="append",
        default=[],
        choices=["topics", "brokers", "users", "clients"],
        help="the kind of entity (users and clients may be given together)",
    )
    configs.add_argument(
        "--entity-name", action="append", dest="entity_names", default=[], help="topic, broker id, user or client id"
    )
    configs.add_argument(
        "--entity-default",
        action="append_const",
        const="",
        dest="entity_names",
        help="the default entity (brokers, users, clients) in place of a name",
    )
    configs.add_argument("--all", action="store_true", help="with --describe: every config, not only dynamic ones")
    configs.add_argument("--add-config", metavar="K=V,K2=[A,B]", help="configs to set")
    configs.add_argument("--delete-config", action="append", default=[], metavar="K,K2", help="configs to remove")
    configs.set_defaults(handler=_console_tool(_configs))


def _add_perf_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    perf = commands.add_parser(
        "perf",
        help="producer and consumer throughput and latency, as kafka-producer/consumer-perf-test.sh do",
        description="Measure a producer (records/s, MB/s, latency percentiles) or a consumer (MB/s, records/s, "
        "rebalance and fetch time) against any Kafka-protocol broker, with a progress display (docs/tools.md).",
    )
    kinds = perf.add_subparsers(dest="perf_command", required=True)
    produce = kinds.add_parser("produce", help="kafka-producer-perf-test.sh")
    produce.add_argument("--bootstrap-server", metavar="HOST:PORT[,...]", help="the brokers (or bootstrap.servers)")
    produce.add_argument("--topic", required=True)
    produce.add_argument("--num-records", type=int, required=True, help="how many records to send")
    produce.add_argument("--record-size", type=int, required=True, help="bytes per record")
    produce.add_argument("--throughput", type=float, required=True, help="records/s at most; -1 for no limit")
    produce.add_argument(
        "--producer-props", nargs="+", default=[], metavar="KEY=VALUE", help="librdkafka producer configs"
    )
    produce.add_argument("--reporting-interval", type=int, default=5000, metavar="MS", help="default 5000")
    consume = kinds.add_parser("consume", help="kafka-consumer-perf-test.sh")
    consume.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="the brokers")
    consume.add_argument("--topic", required=True)
    consume.add_argument("--messages", type=int, required=True, help="how many records to read")
    consume.add_argument("--group", help="the consumer group (default perf-consumer-<random>)")
    consume.add_argument("--timeout", type=int, default=10_000, metavar="MS", help="give up after MS without a record")
    consume.add_argument("--from-latest", action="store_true", help="start at the log end, not the log start")
    consume.add_argument("--hide-header", action="store_true", help="print the figures without the header line")
    consume.add_argument(
        "--consumer-props", nargs="+", default=[], metavar="KEY=VALUE", help="librdkafka consumer configs"
    )
    perf.set_defaults(handler=_console_tool(_perf))


def _add_produce_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    produce = commands.add_parser(
        "produce",
        help="send stdin lines as records, as kafka-console-producer.sh does",
        description="Send one record per stdin line (kafka-console-producer.sh). --property keys: parse.key, "
        "key.separator, parse.headers, headers.delimiter, headers.separator, headers.key.separator, ignore.error, "
        "null.marker.",
    )
    _add_client_arguments(produce)
    produce.add_argument("--topic", required=True, help="the topic to write to")
    produce.add_argument(
        "--property", action="append", default=[], metavar="KEY=VALUE", help="how lines are parsed (repeatable)"
    )
    produce.add_argument("--partition", type=int, help="write every record to this partition")
    produce.add_argument("--acks", choices=["0", "1", "all", "-1"], help="acknowledgements to wait for")
    produce.add_argument(
        "--compression-type", choices=["none", "gzip", "snappy", "lz4", "zstd"], help="compression of batches"
    )
    produce.add_argument(
        "--producer-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka producer config (repeatable)",
    )
    produce.set_defaults(handler=_console_tool(_produce))


def _add_consume_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    consume = commands.add_parser(
        "consume",
        help="print records, as kafka-console-consumer.sh does",
        description="Print a topic's records (kafka-console-consumer.sh). --property keys: print.timestamp, "
        "print.partition, print.offset, print.headers, print.key, print.value, key.separator, line.separator, "
        "headers.separator, null.literal.",
    )
    _add_client_arguments(consume)
    consume.add_argument("--topic", required=True, help="the topic to read")
    consume.add_argument("--group", help="consumer group (offsets are committed); default: a random group")
    consume.add_argument(
        "--from-beginning", action="store_true", help="start at the earliest record when there is no committed offset"
    )
    consume.add_argument("--partition", type=int, help="read only this partition (no group)")
    consume.add_argument("--offset", help="with --partition: earliest, latest or an offset (default latest)")
    consume.add_argument("--max-messages", type=int, help="stop after this many records")
    consume.add_argument("--timeout-ms", type=int, help="stop when no record arrives for this long")
    consume.add_argument(
        "--property", action="append", default=[], metavar="KEY=VALUE", help="what is printed (repeatable)"
    )
    consume.add_argument(
        "--consumer-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka consumer config (repeatable)",
    )
    consume.set_defaults(handler=_console_tool(_consume))


def _add_rocketmq_tool_parsers(commands: argparse._SubParsersAction[_Parser]) -> None:
    store_help = "a RocketMQ-engine store directory (the one holding commitlog/); only read"
    dump = commands.add_parser(
        "dump-commitlog",
        help="print every message of a RocketMQ-engine store's CommitLog",
        description="Print each CommitLog message's fields (MessageExt's names) and the BLANK markers ending files.",
    )
    dump.add_argument("--store", required=True, help=store_help)
    dump.add_argument("--print-body", action="store_true", help="print each message's body too")
    dump.set_defaults(handler=_console_tool(_dump_commitlog))

    queue = commands.add_parser(
        "dump-consumequeue",
        help="print the units of one ConsumeQueue, each checked against the CommitLog",
        description="Print the 20-byte units (CommitLog offset, size, tags code) of consumequeue/<topic>/<queue>/.",
    )
    queue.add_argument("--store", required=True, help=store_help)
    queue.add_argument("--topic", required=True)
    queue.add_argument("--queue", required=True, type=int, help="the queue id (= the Kafka partition)")
    queue.set_defaults(handler=_console_tool(_dump_consumequeue))

    query = commands.add_parser(
        "query-message",
        help="find messages by key (through the index/ files) or by message id",
        description="Print each message of TOPIC whose key (a KEYS entry or the UNIQ_KEY) is KEY and whose store "
        "time is in [BEGIN, END] ms, newest first, body included; or the message an offsetMsgId names.",
    )
    query.add_argument("--store", required=True, help=store_help)
    query.add_argument("--topic")
    query.add_argument("--key")
    query.add_argument("--msg-id", help="an offsetMsgId: store host and CommitLog offset, 32 hex digits")
    query.add_argument("--begin", type=int, default=0, help="earliest store time, ms since the epoch (default 0)")
    query.add_argument("--end", type=int, default=(1 << 63) - 1, help="latest store time, ms (default: no limit)")
    query.add_argument("--max", type=int, default=64, help="the most messages to print (default 64)")
    query.add_argument("--max-hash-slot-num", type=int, help="the store's maxHashSlotNum (default: from the files)")
    query.add_argument("--max-index-num", type=int, help="the store's maxIndexNum (default: from the files)")
    query.set_defaults(handler=_console_tool(_query_message))


def _ha_status(args: argparse.Namespace) -> int:
    from tidelog.tools import rocketmq_ha

    return rocketmq_ha.ha_status(args.zookeeper, args.broker_name, as_json=args.json)


def _switch_role(args: argparse.Namespace) -> int:
    from tidelog.tools import rocketmq_ha

    return rocketmq_ha.switch_role(args.zookeeper, args.broker_name, args.master, force=args.force)


def _add_rocketmq_group_parsers(commands: argparse._SubParsersAction[_Parser]) -> None:
    rocketmq = commands.add_parser(
        "rocketmq",
        help="RocketMQ master/slave groups of a cluster: ha-status, switch-role",
        description="Inspect and switch RocketMQ master/slave groups through the cluster's ZooKeeper.",
    )
    tools = rocketmq.add_subparsers(dest="rocketmq_command", required=True)
    zookeeper_help = "the cluster's ZooKeeper (zookeeper.connect)"
    status = tools.add_parser(
        "ha-status",
        help="each member's CommitLog end, and each slave's lag behind its master",
        description="One row per member of each group: live, role, in the SyncStateSet, CommitLog end, lag.",
    )
    status.add_argument("--zookeeper", required=True, metavar="HOST:PORT", help=zookeeper_help)
    status.add_argument("--broker-name", help="only this group (tidelog.rocketmq.brokerName)")
    status.add_argument("--json", action="store_true", help="print the rows as JSON")
    status.set_defaults(handler=_console_tool(_ha_status))
    switch = tools.add_parser(
        "switch-role",
        help="make a member of a group its master (RocketMQ 4's manual switch)",
        description="Name broker ID master of group G (master epoch + 1), conditional on the group znode's version.",
    )
    switch.add_argument("--zookeeper", required=True, metavar="HOST:PORT", help=zookeeper_help)
    switch.add_argument("--broker-name", required=True, help="the group (tidelog.rocketmq.brokerName)")
    switch.add_argument("--master", required=True, type=int, metavar="ID", help="the broker id to make master")
    switch.add_argument("--force", action="store_true", help="allow a broker outside the SyncStateSet (unclean)")
    switch.set_defaults(handler=_console_tool(_switch_role))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tidelog", description="A durable, partitioned, Kafka-compatible log.")
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

    _add_rocketmq_tool_parsers(commands)
    _add_rocketmq_group_parsers(commands)

    serve = commands.add_parser("serve", help="run a broker that speaks the Kafka protocol")
    serve.add_argument("-c", "--config", help="a server.properties file (Kafka's key names)")
    serve.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="set a config key (repeatable)"
    )
    serve.set_defaults(handler=_serve)
    _add_cluster_parser(commands)

    _add_topics_parser(commands)
    _add_reassign_parser(commands)
    _add_consumer_groups_parser(commands)
    _add_configs_parser(commands)
    _add_perf_parser(commands)
    _add_produce_parser(commands)
    _add_consume_parser(commands)
    _add_users_parser(commands)
    _add_acls_parser(commands)

    demo = commands.add_parser(
        "demo",
        help="the page-visits pipeline on Spark against a local broker (what `make demo` runs)",
        description="Start `tidelog serve`, produce page visits with a Kafka client, count them per page per "
        "10-second window with Structured Streaming into a topic and Parquet, print the top pages, stop.",
    )
    demo.add_argument("--storage", action="store_true", help="the short storage-engine demo instead (no Spark)")
    demo.add_argument(
        "--cluster",
        action="store_true",
        help="on ZooKeeper and three brokers (replication factor 3), the leader of a partition killed mid-stream "
        "(what `make demo-cluster` runs; needs Debian's zookeeper package)",
    )
    demo.add_argument("--seconds", type=float, default=40.0, help="how long to produce events (default 40)")
    demo.add_argument("--rate", type=int, default=500, help="events per second to produce (default 500)")
    demo.add_argument(
        "--read-from",
        choices=["broker", "files"],
        default="broker",
        help="stream from the broker (Kafka protocol, default) or from its log files directly",
    )
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
