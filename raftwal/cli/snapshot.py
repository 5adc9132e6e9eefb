"""`raftwal snapshot save|restore`: back up the coordination state and bootstrap a new
cluster from it (like `etcdctl snapshot save` / `etcdutl snapshot restore`).

- ``save FILE`` asks the cluster for the whole coordination state at one revision (a
  linearizable read, admin only), checks its digest and writes FILE atomically (0600) in
  the format of ``raftwal.node.backup``.
- ``restore FILE --data-dir DIR`` checks FILE and hands it to the node that will run in DIR
  (a new, empty data directory): its coordinator proposes the restore once it leads a
  fresh cluster. Run it for every node's data directory (any one is enough; more make it
  independent of who is elected first), then start the nodes.

The state does not include segment data; see the README, "Backups".
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from raftwal.cli.client import CliError, add_security_arguments, client_security, resolve_target
from raftwal.cli.progress import Progress
from raftwal.node.backup import RESTORE_FILE, Backup, BackupError, read_backup, write_backup
from rpc.errors import code_name, from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2

#: files a data directory that already served a node holds: restore refuses those
_USED_MARKERS = ("raft", "events.db", "catalog.db", "wal")


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "snapshot", help="back up the coordination state, or bootstrap a new cluster from one"
    )
    actions = parser.add_subparsers(dest="snapshot_command", required=True)
    save = actions.add_parser(
        "save", help="write the coordination state at one revision, with its digest, to FILE"
    )
    save.add_argument("file", type=Path, help="where to write the snapshot (replaced atomically)")
    save.add_argument("--endpoints", help="host:port,... (default: the dev cluster)")
    save.add_argument(
        "--dev-dir",
        type=Path,
        default=Path(".raftwal-dev"),
        help="directory of `raftwal dev up` (default: .raftwal-dev)",
    )
    save.add_argument(
        "--timeout-s", type=float, default=30.0, help="how long to try the nodes (default: 30)"
    )
    add_security_arguments(save)
    save.set_defaults(handler=run_save)
    restore = actions.add_parser(
        "restore",
        help="check FILE and hand it to a new node's data directory (restored when it leads)",
    )
    restore.add_argument("file", type=Path, help="a file written by `raftwal snapshot save`")
    restore.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        action="append",
        help="a new node's (empty) data directory; repeat for every node (required)",
    )
    restore.set_defaults(handler=run_restore)


def save_snapshot(  # type: ignore[no-untyped-def]
    endpoints: list[str],
    channel_of,
    timeout_s: float,
    on_progress: Callable[[str], None] | None = None,
) -> Backup:
    """The state from the first node that answers (following NOT_LEADER hints), bounded
    in attempts and time; `on_progress` hears which node is asked and why the last did
    not answer."""
    deadline = time.monotonic() + timeout_s
    order = list(endpoints)
    last = "no node answered"
    for attempt in range(100):
        if time.monotonic() > deadline:
            break
        endpoint = order[attempt % len(order)]
        if on_progress is not None:
            on_progress(f"asking {endpoint}" + (f" (last: {last})" if attempt else ""))
        channel = channel_of(endpoint)
        try:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            reply = stub.SaveSnapshot(
                api.SaveSnapshotRequest(), timeout=max(1.0, min(10.0, deadline - time.monotonic()))
            )
        except grpc.RpcError as error:
            info = from_rpc_error(error)
            last = f"{endpoint}: {code_name(info.code)}: {info.message}"
            if info.code in (errors_pb2.UNAUTHENTICATED, errors_pb2.PERMISSION_DENIED):
                raise CliError(last) from None
            if info.leader_hint and info.leader_hint not in order:
                order.append(info.leader_hint)
            time.sleep(0.1)
            continue
        finally:
            channel.close()
        return Backup(
            revision=reply.revision,
            state_digest=reply.state_digest,
            state=reply.state,
            saved_at_ms=int(time.time() * 1000),
            source=endpoint,
        )
    raise CliError(f"no snapshot within {timeout_s:g} s ({last})")


def run_save(args: argparse.Namespace) -> int:
    if not 0 < args.timeout_s <= 3600:
        print(
            f"error: invalid --timeout-s ({args.timeout_s:g}; expected 0 < s <= 3600)",
            file=sys.stderr,
        )
        return 2
    try:
        target = resolve_target(args.endpoints, args.dev_dir)
        security = client_security(args, target)
        with Progress.for_args("snapshot save", args) as progress:
            backup = save_snapshot(
                target.endpoints, security.channel, args.timeout_s, progress.update
            )
            progress.update(f"checking revision {backup.revision} ({len(backup.state)} bytes)")
            # Check what came back as a reader will: digest and decodable state.
            from raftwal.node.backup import decode_backup, encode_backup

            decode_backup(encode_backup(backup), "the state received")
            progress.update(f"writing {args.file}")
            write_backup(args.file, backup)
    except (CliError, BackupError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot write {args.file}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(
        f"saved revision {backup.revision} ({len(backup.state)} bytes, sha256 "
        f"{backup.state_digest}) from {backup.source} to {args.file}"
    )
    return 0


def run_restore(args: argparse.Namespace) -> int:
    try:
        backup = read_backup(args.file)
    except BackupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for data_dir in args.data_dir:
        used = [m for m in _USED_MARKERS if (data_dir / m).exists()]
        if used:
            print(
                f"error: {data_dir} already holds {', '.join(used)} (expected a new, empty data "
                "directory: a restore bootstraps a new cluster)",
                file=sys.stderr,
            )
            return 2
    with Progress.for_args("snapshot restore", args) as progress:
        for data_dir in args.data_dir:
            progress.update(f"writing {data_dir / RESTORE_FILE}")
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_backup(data_dir / RESTORE_FILE, backup)
    print(
        f"snapshot at revision {backup.revision} (sha256 {backup.state_digest}) handed to "
        f"{', '.join(str(d) for d in args.data_dir)}: start the new cluster's nodes; the "
        "first leader restores it"
    )
    return 0
