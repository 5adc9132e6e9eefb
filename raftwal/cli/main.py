"""The ``raftwal`` command line: argparse front end, human output with rich, ``--json`` for
machines. Each sub-command lives in its own module and registers itself here.

Logging is set up here for every command: ``--log-level`` and ``--log-format`` (``text``,
the default, or ``json``: one object per line with ts, level, logger, message, node_id in
a node process, and exc_info as a string; default from ``RAFTWAL_LOG_FORMAT``). Python
warnings go through logging too, so that a JSON log holds nothing but JSON lines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from raftwal import __version__

if TYPE_CHECKING:
    from raftwal.node.config import ClusterConfig

LOG_FORMATS = ("text", "json")
LOG_FORMAT_ENV = "RAFTWAL_LOG_FORMAT"
TEXT_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# `raftwal node` exits with this when the cluster forgot the node (raftwal member remove).
EXIT_NODE_REMOVED = 3


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ISO 8601, ms), level, logger, message, node_id
    (when the process is a node), exc_info and stack_info (formatted, when present)."""

    def __init__(self, node_id: str | None = None) -> None:
        super().__init__()
        self._node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._node_id is not None:
            entry["node_id"] = self._node_id
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, log_format: str, node_id: str | None = None) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonLogFormatter(node_id) if log_format == "json" else logging.Formatter(TEXT_LOG_FORMAT)
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])
    logging.captureWarnings(True)


#: The top-level commands the other modules register, by module: a command line that names
#: one of them imports that module only (tests/unit/test_cli_modules.py checks the table
#: against each module's register()).
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "raftwal.cli.client": (
        "status", "wal", "channel", "vchannel", "events", "lock", "produce", "consume",
        "balance", "subscription", "seal", "segments",
    ),
    "raftwal.cli.spark": ("spark-read", "export"),
    "raftwal.chaos.runner": ("chaos",),
    "raftwal.cli.snapshot": ("snapshot",),
    "raftwal.cli.shards": ("shard", "consumer"),
    "raftwal.cli.member": ("member",),
    "raftwal.cli.replicate": ("replicate",),
    "raftwal.cli.simulate": ("simulate",),
    "raftwal.cli.init": ("init",),
}  # fmt: skip
#: The commands this module defines.
OWN_COMMANDS = ("demo", "node", "secret", "config", "dev")


def build_parser(
    all_commands: bool = True, modules: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    """The whole command line; with `all_commands` False, only the commands defined in
    this module (not those the other modules register, which import what they run); with
    `modules`, this module's commands and those of the named modules of COMMAND_MODULES."""
    parser = argparse.ArgumentParser(
        prog="raftwal",
        description="Event-sourced coordination service and term-fenced WAL on Raft.",
    )
    parser.add_argument("--version", action="version", version=f"raftwal {__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        help="logging level: DEBUG, INFO, WARNING, ERROR (default: WARNING)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=os.environ.get(LOG_FORMAT_ENV, "text"),
        help=f"log lines as text or as JSON objects (default: ${LOG_FORMAT_ENV}, else text); "
        "`dev up` passes it on to the nodes",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="start a three-node cluster on loopback and show it working"
    )
    demo.add_argument(
        "--state-machine",
        action="store_true",
        help="run the scripted scenario against the pure state machine only (no processes)",
    )
    demo.add_argument(
        "--json", action="store_true", help="with --state-machine: events as JSON lines"
    )
    demo.set_defaults(handler=_run_demo)

    node = commands.add_parser(
        "node",
        help="run one raftwal node in the foreground",
        description="Exit status 0: stopped (SIGTERM: after handing over); 2: a bad config "
        "or role file; 3: the cluster forgot this node (`raftwal member remove`): start it "
        "with --join to bring it back.",
    )
    node.add_argument("--config", required=True, type=Path, help="cluster TOML file")
    node.add_argument("--id", required=True, help="this node's id in the config")
    node.add_argument(
        "--join",
        default=None,
        metavar="ENDPOINTS",
        help="host:port,... gRPC endpoints of a running cluster to join as a data node (the "
        "config then names only this node; `raftwal member add ID` makes it a voter); "
        "default: [cluster] join in the config",
    )
    node.set_defaults(handler=_run_node)

    secret = commands.add_parser("secret", help="the cluster secret of the Raft transport")
    secret_commands = secret.add_subparsers(dest="secret_command", metavar="ACTION", required=True)
    secret_new = secret_commands.add_parser(
        "new",
        help="write a new random secret (256 bits, hex) to FILE with mode 0600; copy the same "
        "file to every node and point [cluster] secret_file at it",
    )
    secret_new.add_argument("file", type=Path, help="where to write it (must not exist)")
    secret_new.add_argument(
        "--force", action="store_true", help="replace FILE if it exists (default: refuse)"
    )
    secret_new.set_defaults(handler=_secret_new)
    config = commands.add_parser("config", help="node configuration files")
    config_commands = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    template = config_commands.add_parser(
        "template", help="print an annotated three-node config that uses a secret file"
    )
    template.add_argument(
        "--secret-file",
        default=None,
        help="the secret_file the template names (default: /etc/raftwal/secret)",
    )
    template.set_defaults(handler=_config_template)

    dev = commands.add_parser("dev", help="a local cluster on 127.0.0.1")
    dev_commands = dev.add_subparsers(dest="dev_command", metavar="ACTION", required=True)
    dev_up = dev_commands.add_parser("up", help="start local nodes in the background")
    dev_up.add_argument("--nodes", type=int, default=3, help="how many nodes (default: 3)")
    dev_up.add_argument(
        "--data-nodes",
        type=int,
        default=0,
        help="how many of them (the last ones) follow Raft without voting (default: 0)",
    )
    _dev_dir_argument(dev_up)
    dev_up.add_argument(
        "--timeout-s",
        type=float,
        default=60.0,
        help="how long to wait for a leader and every node to register (default: 60)",
    )
    dev_up.add_argument(
        "--json", action="store_true", help="print the members and credentials as JSON"
    )
    dev_up.add_argument(
        "--secure",
        action="store_true",
        help="TLS with client certificates and bearer tokens per role: makes a local CA, "
        "node and client certificates and tokens in the dev dir (the CLI uses them)",
    )
    dev_up.add_argument(
        "--ca-cert",
        type=Path,
        default=None,
        help="with --secure: sign the certificates with this CA (PEM) instead of a local one "
        "(default: the CA kept in the dev dir, else a new one)",
    )
    dev_up.add_argument(
        "--ca-key",
        type=Path,
        default=None,
        help="with --ca-cert: the CA's unencrypted PEM key (read, never copied)",
    )
    dev_up.add_argument(
        "--netns",
        action="store_true",
        help="each node in a network namespace of its own, on its own address on a private "
        "bridge (10.199.X.11, .12, ...), reachable from this machine only; needs root and "
        "iproute2; `dev down` removes them",
    )
    dev_up.add_argument(
        "--cluster-id",
        default=None,
        help="this cluster's id in a replication configuration (default: dev)",
    )
    dev_up.add_argument(
        "--with-nats",
        action="store_true",
        help="also start a nats-server with JetStream for the cluster (its store in "
        "<dir>/nats; its URL in cluster.json, where `channel create --wal jetstream` finds "
        "it); `dev down` stops it",
    )
    dev_up.set_defaults(handler=_dev_up)
    dev_renew = dev_commands.add_parser(
        "renew-certs",
        help="new node and client certificates under the dev cluster's CA (tokens stay); "
        "then `raftwal dev restart --rolling` so the nodes load them",
    )
    _dev_dir_argument(dev_renew)
    dev_renew.add_argument("--days", type=int, default=365, help="validity from now (default: 365)")
    dev_renew.add_argument(
        "--ca-cert", type=Path, default=None, help="a CA of your own (default: the kept one)"
    )
    dev_renew.add_argument("--ca-key", type=Path, default=None, help="its key (with --ca-cert)")
    dev_renew.set_defaults(handler=_dev_renew_certs)
    dev_down = dev_commands.add_parser("down", help="stop the local nodes")
    _dev_dir_argument(dev_down)
    dev_down.set_defaults(handler=_dev_down)
    dev_add = dev_commands.add_parser(
        "add-node",
        help="start one more node that joins the running dev cluster as a data node "
        "(raftwal node --join; a config file of its own, the others untouched); "
        "`raftwal member add ID` then makes it a voter",
    )
    _dev_dir_argument(dev_add)
    dev_add.add_argument(
        "--netns",
        action="store_true",
        help="expect a cluster started with --netns (the new node gets a namespace of its "
        "own on the same bridge; without the flag such a cluster is refused)",
    )
    dev_add.add_argument(
        "--timeout-s", type=float, default=60.0, help="how long to wait for it (default: 60)"
    )
    dev_add.add_argument("--json", action="store_true", help="print the new node as JSON")
    dev_add.set_defaults(handler=_dev_add_node)
    dev_restart = dev_commands.add_parser(
        "restart",
        help="restart nodes of the local cluster one at a time: SIGTERM (the node hands "
        "over its pchannels and Raft leadership first), wait for the exit, start it again, "
        "wait until it is caught up and the owners are balanced",
    )
    _dev_dir_argument(dev_restart)
    which = dev_restart.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--rolling",
        action="store_true",
        help="every node, the Raft leader last (default: off; this or --node is required)",
    )
    which.add_argument("--node", default=None, help="only this node id (default: none)")
    dev_restart.add_argument(
        "--kill",
        action="store_true",
        help="SIGKILL instead of SIGTERM: a crash with no handover, to compare with (default: off)",
    )
    dev_restart.add_argument(
        "--timeout-s",
        type=float,
        default=60.0,
        help="how long each node may take to be caught up after its start (default: 60)",
    )
    dev_restart.add_argument(
        "--balance-timeout-s",
        type=float,
        default=15.0,
        help="how long to wait for balanced owners after each node (0: do not wait; default: 15)",
    )
    dev_restart.add_argument(
        "--json", action="store_true", help="print one JSON object per restarted node"
    )
    dev_restart.set_defaults(handler=_dev_restart)
    if not all_commands:
        return parser

    for module in COMMAND_MODULES if modules is None else modules:
        importlib.import_module(module).register(commands)
    return parser


def _dev_dir_argument(parser: argparse.ArgumentParser) -> None:
    # `--dev-dir`, as in every other command; `--dir` stays as a hidden alias.
    parser.add_argument(
        "--dev-dir",
        dest="dir",
        type=Path,
        default=Path(".raftwal-dev"),
        help="directory of the local cluster: config, logs, data (default: .raftwal-dev)",
    )
    parser.add_argument(
        "--dir", dest="dir", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )


def _run_demo(args: argparse.Namespace) -> int:
    from raftwal.cli.demo import run_cluster_demo, run_demo

    if args.state_machine:
        return run_demo(json_output=args.json)
    return run_cluster_demo()


def node_config(path: Path, node_id: str, join: str | None) -> ClusterConfig:
    """The config `raftwal node` runs `node_id` with: the file at `path`, plus, with a
    join (`join`: --join's comma-separated endpoints, else the file's), the members the
    cluster reports. The discovery runs in a child process of its own (`discover_apart`):
    the process that forks the node's processes must not have started gRPC. Raises
    ConfigError."""
    from raftwal.node.config import load_config, with_join

    config = load_config(path)
    if join:
        config = with_join(config, join)
    config.node(node_id)
    if config.join:
        from raftwal.node.join import discover_apart

        config = discover_apart(config, node_id, config.join)
    return config


def _run_node(args: argparse.Namespace) -> int:
    from raftwal.node.config import ConfigError
    from raftwal.node.membership import RoleFileError
    from raftwal.node.supervisor import run_node

    try:
        config = node_config(args.config, args.id, args.join)
        # A supervisor of the node's processes (raftwal/node/supervisor.py). Its status:
        # EXIT_NODE_REMOVED (3) when the cluster forgot the node, not a failure to restart
        # from (the unit's RestartPreventExitStatus). A change of Raft role restarts the
        # same command line in this process (same pid; it reads role.json).
        return run_node(config, args.id)
    except (ConfigError, RoleFileError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _secret_new(args: argparse.Namespace) -> int:
    from raftwal.node.config import ConfigError, write_secret_file

    try:
        write_secret_file(args.file, overwrite=args.force)
    except (ConfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote a new cluster secret to {args.file} (mode 0600)")
    return 0


def _config_template(args: argparse.Namespace) -> int:
    from raftwal.node.config import DEFAULT_SECRET_FILE, config_template

    print(config_template(args.secret_file or DEFAULT_SECRET_FILE), end="")
    return 0


def _dev_up(args: argparse.Namespace) -> int:
    from raftwal.cli import dev, devcerts
    from raftwal.node.config import CLUSTER_ID_MAX_CHARS
    from statemachine.validation import NAME_RULE, is_plain_name

    if not 1 <= args.nodes <= 9:
        print(f"error: invalid --nodes ({args.nodes}; expected 1..9)", file=sys.stderr)
        return 2
    if not 0 <= args.data_nodes < args.nodes:
        print(
            f"error: invalid --data-nodes ({args.data_nodes}; expected 0..{args.nodes - 1}: "
            "at least one node votes)",
            file=sys.stderr,
        )
        return 2
    if args.cluster_id is not None and not (
        is_plain_name(args.cluster_id) and len(args.cluster_id) <= CLUSTER_ID_MAX_CHARS
    ):
        print(
            f"error: invalid --cluster-id ({args.cluster_id!r}; expected {NAME_RULE}, "
            f"1..{CLUSTER_ID_MAX_CHARS} chars)",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ)
    env[LOG_FORMAT_ENV] = args.log_format
    from raftwal.cli.progress import Progress

    # Time to ready: from here until a leader is known and every node is registered UP
    # (`dev.wait_ready`), what a newcomer waits for (issue 35).
    started = time.monotonic()
    try:
        with Progress.for_args("dev up", args) as progress:
            cluster = dev.up(
                args.dir,
                args.nodes,
                args.timeout_s,
                env=env,
                secure=args.secure,
                data_nodes=args.data_nodes,
                ca_cert_file=args.ca_cert,
                ca_key_file=args.ca_key,
                on_progress=progress.update,
                in_netns=args.netns,
                cluster_id=args.cluster_id,
                with_nats=args.with_nats,
            )
    except (RuntimeError, TimeoutError, devcerts.CertificateError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    ready_s = time.monotonic() - started
    members = [
        {
            "id": n.id,
            "grpc": n.grpc_address,
            "raft": n.raft_address,
            "role": n.role,
            "metrics": f"http://{n.host}:{n.metrics_port}/metrics" if n.metrics_port else None,
            "console": f"http://{n.host}:{n.metrics_port}/console" if n.metrics_port else None,
            "pid": cluster.pid(n.id),
        }
        for n in cluster.config.nodes
    ]
    security = None
    if cluster.security is not None:
        security = {
            "tls_ca_file": str(cluster.security.ca_file),
            "tls_cert_file": str(cluster.security.client_cert_file),
            "tls_key_file": str(cluster.security.client_key_file),
            "token_files": {r: str(f) for r, f in cluster.security.token_files.items()},
        }
    if args.json:
        print(
            json.dumps(
                {
                    "dir": str(cluster.directory),
                    "cluster_id": cluster.config.cluster_id,
                    "nodes": members,
                    "security": security,
                    "nats": cluster.nats,
                    "ready_s": round(ready_s, 2),
                }
            )
        )
    else:
        print(
            f"raftwal dev cluster {cluster.config.cluster_id} up ({len(members)} nodes, state "
            f"in {cluster.directory}), ready in {ready_s:.1f} s"
        )
        for member in members:
            print(
                f"  {member['id']}  {member['role']}  grpc {member['grpc']}  raft {member['raft']}  "
                f"metrics {member['metrics'] or '-'}  pid {member['pid']}"
            )
        print(f"endpoints: {','.join(m['grpc'] for m in members)}")
        consoles = [m["console"] for m in members if m["console"]]
        if consoles:
            print(f"console (read-only, any node): {consoles[0]}")
        if cluster.nats is not None:
            print(
                f"nats-server (JetStream) {cluster.nats['url']}  pid {cluster.nats['pid']}: "
                "`raftwal channel create --wal jetstream` uses it"
            )
        if security is not None:
            print(
                "secure: TLS with client certificates, bearer tokens per role; CLI commands "
                f"with --dev-dir {args.dir} use the admin token. For other clients:"
            )
            print(f"  export RAFTWAL_CLIENT_TLS_CA_FILE={security['tls_ca_file']}")
            print(f"  export RAFTWAL_CLIENT_TLS_CERT_FILE={security['tls_cert_file']}")
            print(f"  export RAFTWAL_CLIENT_TLS_KEY_FILE={security['tls_key_file']}")
            for role, path in security["token_files"].items():
                print(f"  export RAFTWAL_TOKEN_FILE={path}   # role {role}")
    return 0


def _dev_renew_certs(args: argparse.Namespace) -> int:
    import datetime

    from raftwal.cli import dev, devcerts

    if not 1 <= args.days <= 3650:
        print(f"error: invalid --days ({args.days}; expected 1..3650)", file=sys.stderr)
        return 2
    try:
        config = dev.load(args.dir).config
        devcerts.renew(
            args.dir,
            [n.id for n in config.nodes],
            datetime.timedelta(days=args.days),
            args.ca_cert,
            args.ca_key,
            hosts={n.id: n.host for n in config.nodes},
        )
    except (OSError, RuntimeError, ValueError, devcerts.CertificateError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(
        f"renewed node and client certificates in {args.dir}/{devcerts.TLS_DIR} for "
        f"{args.days} days; restart the nodes to load them: raftwal dev restart --rolling "
        f"--dir {args.dir}"
    )
    return 0


def _dev_add_node(args: argparse.Namespace) -> int:
    from raftwal.cli import dev
    from raftwal.cli.progress import Progress

    if not 1 <= args.timeout_s <= 3600:
        print(f"error: invalid --timeout-s ({args.timeout_s}; expected 1..3600)", file=sys.stderr)
        return 2
    try:
        cluster = dev.load(args.dir)
        if args.netns != (cluster.netns is not None):
            started = "with" if cluster.netns is not None else "without"
            print(
                f"error: the dev cluster in {args.dir} was started {started} --netns (expected "
                f"add-node {'--netns' if cluster.netns is not None else 'without --netns'})",
                file=sys.stderr,
            )
            return 2
        with Progress.for_args("adding a node", args) as progress:
            node = dev.add_node(cluster, args.timeout_s, on_progress=progress.update)
    except (RuntimeError, TimeoutError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"id": node.id, "grpc": node.grpc_address, "raft": node.raft_address}))
    else:
        print(
            f"{node.id} joined as a data node: grpc {node.grpc_address}, raft "
            f"{node.raft_address}; make it a voter with: raftwal member add {node.id} "
            f"--dev-dir {args.dir}"
        )
    return 0


def _dev_down(args: argparse.Namespace) -> int:
    from raftwal.cli import dev

    try:
        pids = dev.down(args.dir)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"stopped {len(pids)} node process(es)" + (f": {pids}" if pids else ""))
    return 0


def _dev_restart(args: argparse.Namespace) -> int:
    import dataclasses
    import signal

    from raftwal.cli import dev
    from raftwal.node.config import ConfigError

    for flag, value in (
        ("--timeout-s", args.timeout_s),
        ("--balance-timeout-s", args.balance_timeout_s),
    ):
        if not 0 <= value <= 3600:
            print(f"error: invalid {flag} ({value}; expected 0..3600)", file=sys.stderr)
            return 2
    try:
        cluster = dev.load(args.dir)
        if args.node is not None:
            cluster.node(args.node)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    def report(step: dev.RestartStep) -> None:
        if args.json:
            print(json.dumps(dataclasses.asdict(step)), flush=True)
            return
        balanced = f"{step.balanced_s:.1f} s later" if step.balanced_s is not None else "not yet"
        print(
            f"{step.node_id}: pid {step.old_pid} exited in {step.exit_s:.1f} s"
            + (" (killed: no exit in time)" if step.killed else "")
            + f", pid {step.new_pid} caught up in {step.ready_s:.1f} s, owners balanced "
            + balanced,
            flush=True,
        )

    signum = signal.SIGKILL if args.kill else signal.SIGTERM
    try:
        if args.rolling:
            dev.rolling_restart(
                cluster,
                signum=signum,
                ready_timeout_s=args.timeout_s,
                balance_timeout_s=args.balance_timeout_s,
                report=report,
            )
        else:
            report(
                dev.restart_node(
                    cluster,
                    args.node,
                    signum=signum,
                    ready_timeout_s=args.timeout_s,
                    balance_timeout_s=args.balance_timeout_s,
                )
            )
    except (RuntimeError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _command_named(argv: Sequence[str]) -> str | None:
    """The command `argv` runs (global options first), or None when it asks for help or the
    version first or names no command."""
    args = iter(argv)
    for arg in args:
        if arg in ("--log-level", "--log-format"):
            next(args, None)
        elif arg.startswith(("--log-level=", "--log-format=")):
            continue
        else:
            return None if arg.startswith("-") else arg
    return None


def _parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser with what `argv` needs: a command of the other modules imports its own
    module only, and `raftwal node` none of them (registering them all imports the chaos
    runner, the SQLite shards and pyarrow: over a second of CPU before a node can answer a
    vote on a slow host, issue 35, and about 1 s more for every CLI call). Help, the
    version, no command or an unknown one get the whole command line."""
    command = _command_named(argv)
    for module, names in COMMAND_MODULES.items():
        if command in names:
            return build_parser(modules=[module])
    if command in OWN_COMMANDS:
        return build_parser(all_commands=False)
    return build_parser()


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser_for(argv)
    args = parser.parse_args(argv)
    if args.log_format not in LOG_FORMATS:
        # Only the environment default can get here (argparse checks the flag's value).
        parser.error(
            f"invalid ${LOG_FORMAT_ENV} ({args.log_format!r}; expected {' or '.join(LOG_FORMATS)})"
        )
    configure_logging(args.log_level, args.log_format, args.id if args.command == "node" else None)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
