"""`raftwal member list | add | remove`: the Raft voters (etcd's `etcdctl member`).

- ``list``: every configured node, its role in the leader's log (voter or data node), the
  role it runs in, whether it answers, how far its Raft log is behind, and what it holds.
- ``add NODE``: make a data node a voter (etcd's learner promotion). The node must be
  running as a data node (``role = "data"`` in its ``[[nodes]]`` table) and caught up;
  the command retries while it catches up, then waits until the node has restarted
  itself as a voter.
- ``remove NODE``: drain the node (freeze it: its pchannels move, the balancer replaces it
  in every replica set), wait until it holds nothing, remove it from the voters (and wait
  until it has restarted as a data node, when it answers), then forget it: its addresses
  leave the replicated state (status, routing, every node's view of the cluster) and its
  next heartbeat is refused, which stops it. It comes back only when started with
  ``--join``. A dead node's replacement is ``member add`` of the new one plus ``member
  remove`` of the dead one. ``--keep-data-node`` stops after the demotion instead: the
  node stays, frozen, as a data node (``raftwal balance unfreeze NODE`` to use it).

Each waits at most ``--wait-s`` and exits 1 with what it was waiting for when that runs out.
One change at a time: the cluster refuses a second while the first is uncommitted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable

from rich.table import Table

from raftwal.cli.client import (
    EXIT_ERROR,
    CliError,
    Target,
    _console,
    _handler,
    _print_json,
    common_arguments,
)
from rpc.client import CoordinatorClient, NotFoundError
from rpc.membership import MembershipTimeout, demote, promote, remove
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api


def register(commands: argparse._SubParsersAction) -> None:
    common = common_arguments()
    member = commands.add_parser(
        "member",
        help="the Raft voters: list them, make a data node a voter, make a voter a data node",
        description="A cluster keeps 3 or 5 voters; every other node is a data node that "
        "follows the Raft log without voting. `add` promotes a caught-up data node, `remove` "
        "drains a node, demotes it and forgets it. Each node restarts itself in its new role.",
    )
    actions = member.add_subparsers(dest="member_command", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", parents=[common], help="voters and data nodes")
    listing.set_defaults(handler=_handler(_list))
    for name, text, default_wait in (
        ("add", "make the data node NODE a voter", 120.0),
        ("remove", "drain the node NODE, make it a data node and forget it", 300.0),
    ):
        sub = actions.add_parser(name, parents=[common], help=text)
        sub.add_argument("node", metavar="NODE", help="a node id of the cluster configuration")
        sub.add_argument(
            "--wait-s",
            type=float,
            default=default_wait,
            help=f"how long to wait for the whole change (default: {default_wait:.0f})",
        )
        if name == "remove":
            sub.add_argument(
                "--keep-data-node",
                action="store_true",
                help="stop after the demotion: the node stays, frozen, as a data node "
                "(default: forget it, which stops it)",
            )
        sub.set_defaults(handler=_handler(_add if name == "add" else _remove))


def _member_rows(
    status: api.ClusterStatusResponse, members: api.ListMembersResponse
) -> list[dict[str, object]]:
    voters = set(members.voter_node_ids)
    leader_commit = max((m.commit_index for m in status.members if m.is_leader), default=0)
    frozen = {node.node_id for node in status.nodes if node.frozen}
    rows = []
    for member in status.members:
        owned = sum(
            1
            for c in status.pchannels
            if c.owner_node_id == member.node_id and c.state != pb.PCHANNEL_STATE_DROPPED
        )
        replicas = sum(
            1
            for c in status.pchannels
            if member.node_id in c.replica_node_ids and c.state != pb.PCHANNEL_STATE_DROPPED
        )
        rows.append(
            {
                "node_id": member.node_id,
                "role": "voter" if member.node_id in voters else "data",
                "running_as": member.role if member.reachable else "",
                "reachable": member.reachable,
                "leader": member.is_leader,
                "raft_behind": max(0, leader_commit - member.applied_index)
                if member.reachable
                else None,
                "frozen": member.node_id in frozen,
                "pchannels_owned": owned,
                "replicas_held": replicas,
            }
        )
    return rows


async def _list(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    members = await client.list_members()
    status = await client.cluster_status()
    rows = _member_rows(status, members)
    if args.json:
        _print_json(
            {
                "voter_node_ids": list(members.voter_node_ids),
                "change_pending": members.change_pending,
                "leader_node_id": members.leader_node_id,
                "members": rows,
            }
        )
        return 0
    console = _console()
    console.print(
        f"voters {', '.join(members.voter_node_ids)}  leader {members.leader_node_id}"
        + ("  [yellow]a change is not committed yet[/]" if members.change_pending else "")
    )
    table = Table()
    for column in (
        "node",
        "role",
        "running as",
        "answers",
        "raft behind",
        "frozen",
        "owns",
        "replicas",
    ):
        table.add_column(column)
    for row in rows:
        running = str(row["running_as"])
        mismatch = running and running != row["role"]
        table.add_row(
            str(row["node_id"]) + (" (leader)" if row["leader"] else ""),
            str(row["role"]),
            f"[yellow]{running}[/]" if mismatch else running or "-",
            "yes" if row["reachable"] else "[red]no[/]",
            "-" if row["raft_behind"] is None else str(row["raft_behind"]),
            "yes" if row["frozen"] else "",
            str(row["pchannels_owned"]),
            str(row["replicas_held"]),
        )
    console.print(table)
    return 0


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        _console().print(text)


async def _add(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    started = time.monotonic()
    response = await _changed(
        args, promote(client, args.node, args.wait_s, lambda text: _say(args, text))
    )
    if response is None:
        return EXIT_ERROR
    _report(args, response, started, f"{args.node} is a voter")
    return 0


async def _changed(
    args: argparse.Namespace, change: Awaitable[api.ChangeMembershipResponse]
) -> api.ChangeMembershipResponse | None:
    """The change's answer; None (after saying why on stderr) when --wait-s ran out. An
    unknown node is a usage error (exit 2)."""
    try:
        return await change
    except NotFoundError as error:
        raise CliError(f"NODE: {error.info.message}") from None
    except MembershipTimeout as error:
        print(f"error: gave up after --wait-s {args.wait_s:g}: {error}", file=sys.stderr)
        return None


def _report(
    args: argparse.Namespace, response: api.ChangeMembershipResponse, started: float, text: str
) -> None:
    seconds = time.monotonic() - started
    if args.json:
        _print_json(
            {
                "node_id": args.node,
                "changed": response.changed,
                "voter_node_ids": list(response.voter_node_ids),
                "seconds": round(seconds, 3),
            }
        )
    else:
        _say(args, f"{text}; voters {', '.join(response.voter_node_ids)} ({seconds:.1f} s)")


async def _remove(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    started = time.monotonic()
    say = lambda text: _say(args, text)  # noqa: E731
    if args.keep_data_node:
        response = await _changed(args, demote(client, args.node, args.wait_s, say))
        if response is None:
            return EXIT_ERROR
        _report(
            args,
            response,
            started,
            (
                f"{args.node} is a data node now"
                if response.changed
                else f"{args.node} was not a voter"
            )
            + f"; it stays frozen: stop it, or `raftwal balance unfreeze {args.node}` to "
            "keep it as a data node",
        )
        return 0
    response = await _changed(args, remove(client, args.node, args.wait_s, say))
    if response is None:
        return EXIT_ERROR
    _report(
        args,
        response,
        started,
        (f"{args.node} left the cluster" if response.changed else f"{args.node} was gone already")
        + "; its addresses are forgotten (start it with --join to bring it back)",
    )
    return 0
