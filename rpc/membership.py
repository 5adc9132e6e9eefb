"""Raft membership changes as an operator runs them (``raftwal member add | remove``), for
any program: ``promote`` a data node to voter, ``demote`` a voter after draining it,
``remove`` a node (demote it, then forget its addresses).

Both wait, bounded by `wait_s`, until the node runs in its new role; they raise
``MembershipTimeout`` when that time runs out (saying what was still awaited), NotFoundError
for a node the cluster does not know, and the SDK's typed errors for the rest. The leader
refuses a change whose precondition does not hold yet (IGNORED_OPERATION: the node still
catching up, another change committing); these functions ask again until `wait_s` runs out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rpc.coordinator_client import CoordinatorClient
from rpc.errors import (
    IgnoredOperationError,
    NotFoundError,
    UnavailableError,
    UnknownError,
    error_info,
)
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2

POLL_S = 0.5
# Asked again until the deadline: a precondition that does not hold yet, no leader for a
# moment (a promoted voter restarts itself, and with a dead voter among four that leaves
# no quorum until it is back), or an outcome the leader could not tell (ChangeMembership
# and the forget are idempotent: asking again says `changed` False).
RETRIED = (IgnoredOperationError, UnavailableError, UnknownError)


class MembershipTimeout(TimeoutError):
    """A membership change did not finish within its time; the message says what was
    still awaited (what already happened stays done: a retry picks up from there)."""


async def _change(
    client: CoordinatorClient, node_id: str, add: bool, deadline: float
) -> api.ChangeMembershipResponse:
    """ChangeMembership, asked again while a precondition does not hold yet (the node
    catching up, another change committing) until `deadline`."""
    while True:
        try:
            return await client.change_membership(node_id, add)
        except RETRIED as error:
            if time.monotonic() + POLL_S >= deadline:
                raise MembershipTimeout(error.info.message) from None
            await asyncio.sleep(POLL_S)


async def _status(client: CoordinatorClient, deadline: float) -> api.ClusterStatusResponse:
    """ClusterStatus, asked again while no node can answer (a leader change) until
    `deadline`."""
    while True:
        try:
            return await client.cluster_status()
        except UnavailableError as error:
            if time.monotonic() + POLL_S >= deadline:
                raise MembershipTimeout(error.info.message) from None
            await asyncio.sleep(POLL_S)


async def _wait_running_as(
    client: CoordinatorClient, node_id: str, role: str, deadline: float
) -> bool:
    """Wait until `node_id` answers and runs as `role`; False if it does not by then."""
    while True:
        status = await _status(client, deadline)
        member = next((m for m in status.members if m.node_id == node_id), None)
        if member is not None and member.reachable and member.role == role:
            return True
        if time.monotonic() + POLL_S >= deadline:
            return False
        await asyncio.sleep(POLL_S)


async def promote(
    client: CoordinatorClient, node_id: str, wait_s: float, say: Callable[[str], None]
) -> api.ChangeMembershipResponse:
    """Make the data node `node_id` a voter and wait until it runs as one (at most
    `wait_s`); raises MembershipTimeout when that time runs out, RaftwalError for the
    rest."""
    deadline = time.monotonic() + wait_s
    known_node(await client.cluster_status(), node_id)
    response = await _change(client, node_id, True, deadline)
    if not response.changed:
        say(f"{node_id} is a voter already")
    if not await _wait_running_as(client, node_id, "voter", deadline):
        raise MembershipTimeout(
            f"{node_id} is a voter in the Raft log, but did not answer as one within "
            f"{wait_s:g} s (it restarts itself as a voter; see its log)"
        )
    return response


def known_node(status: api.ClusterStatusResponse, node_id: str) -> None:
    """Raise NotFoundError unless `node_id` is a member of the cluster's configuration."""
    known = {m.node_id for m in status.members}
    if node_id not in known:
        raise NotFoundError(
            error_info(
                errors_pb2.NOT_FOUND,
                f"unknown node {node_id[:64]!r} (expected one of {', '.join(sorted(known))})",
            )
        )


def _held(status: api.ClusterStatusResponse, node_id: str) -> tuple[int, int]:
    owned = replicas = 0
    for channel in status.pchannels:
        if channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        if channel.owner_node_id == node_id:
            owned += 1
        elif node_id in channel.replica_node_ids or node_id in channel.stable_replica_node_ids:
            replicas += 1
    return owned, replicas


async def demote(
    client: CoordinatorClient, node_id: str, wait_s: float, say: Callable[[str], None]
) -> api.ChangeMembershipResponse:
    """Freeze `node_id`, wait until it holds nothing, remove it from the voters and wait
    until it runs as a data node (at most `wait_s` for all of it; not when it did not
    answer to begin with: a dead machine); raises MembershipTimeout when that time runs
    out, RaftwalError for the rest."""
    started = time.monotonic()
    deadline = started + wait_s
    status = await client.cluster_status()
    known_node(status, node_id)
    answered = any(m.node_id == node_id and m.reachable for m in status.members)
    policy = status.balance_policy
    if node_id not in {n.node_id for n in status.nodes if n.frozen}:
        await client.set_balance_policy(
            policy.allow_rebalance, policy.max_moves_per_round, freeze=[node_id]
        )
        say(f"froze {node_id}: its pchannels move and it leaves every replica set")
    while True:
        owned, replicas = _held(await _status(client, deadline), node_id)
        if owned == 0 and replicas == 0:
            break
        if time.monotonic() + POLL_S >= deadline:
            raise MembershipTimeout(
                f"{node_id} still owns {owned} pchannel(s) and holds {replicas} replica(s) "
                f"after {wait_s:g} s: the balancer needs another node to move them "
                "to (see raftwal status)"
            )
        await asyncio.sleep(POLL_S)
    say(f"{node_id} holds nothing ({time.monotonic() - started:.1f} s)")
    response = await _change(client, node_id, False, deadline)
    if (
        response.changed
        and answered
        and not await _wait_running_as(client, node_id, "data", deadline)
    ):
        say(f"{node_id} did not answer as a data node yet (stopped, or restarting)")
    return response


async def remove(
    client: CoordinatorClient, node_id: str, wait_s: float, say: Callable[[str], None]
) -> api.ChangeMembershipResponse:
    """``demote`` `node_id`, then forget it (its addresses leave the cluster's state; it
    stops at its next heartbeat and comes back only when started with --join). A node
    forgotten already is no error (``changed`` False). Raises like ``demote``."""
    deadline = time.monotonic() + wait_s
    status = await client.cluster_status()
    if node_id not in {m.node_id for m in status.members}:
        # Forgotten already (changed False), or unknown (NotFoundError).
        return await client.forget_node(node_id)
    demoted = await demote(client, node_id, wait_s, say)
    while True:
        try:
            forgotten = await client.forget_node(node_id)
            break
        except RETRIED as error:
            # The voter set settling, or a replica set still naming it for a moment.
            if time.monotonic() + POLL_S >= deadline:
                raise MembershipTimeout(error.info.message) from None
            await asyncio.sleep(POLL_S)
    say(f"forgot {node_id}: its addresses left the cluster's state")
    return api.ChangeMembershipResponse(
        voter_node_ids=forgotten.voter_node_ids, changed=demoted.changed or forgotten.changed
    )
