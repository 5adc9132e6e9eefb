"""The demo (`./run demo`): a three-node raftwal cluster on loopback, used as a user would.

It starts three `raftwal node` processes with `raftwal dev up` (free ports on 127.0.0.1,
state in a temporary directory), then through the gRPC API: creates pchannels and watches
the leader's balancer place them, creates vchannels, takes a lease and an EXCLUSIVE lock
(fencing token), runs a broadcast that holds a resource key until every vchannel acks,
kills the Raft leader with SIGKILL in the middle of a stream of writes and measures how
long until a write succeeds again, watches the dead node's pchannels move to a survivor
with a term bump, restarts the node and checks that all three replicas hold the same
state (digest), and replays the event history from revision 1. Everything it started is
stopped by pid at the end.

`raftwal demo --state-machine` runs the older scripted scenario against the pure state
machine alone (no processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import grpc
from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from rpc.request_ids import with_request_id
from statemachine import apply_command, new_state, state_digest
from statemachine.balancer import plan
from statemachine.invariants import check

RETRYABLE = (errors_pb2.NOT_LEADER, errors_pb2.ON_SHUTDOWN, errors_pb2.UNKNOWN)

# A generous bound on `dev up`: a starved 2-core host has taken 100 s (issue 35).
START_TIMEOUT_S = 300.0
# How long `dev up` takes on a quiet 2-core machine; a host that takes longer is that much
# slower, and every later deadline of the demo is stretched by the same factor (at most
# MAX_SLOWNESS times).
QUICK_START_S = 10.0
MAX_SLOWNESS = 10.0


def host_slowness(start_s: float) -> float:
    """The factor by which this host is slower than a quiet one, judged by the cluster's
    start time (1 .. MAX_SLOWNESS)."""
    return min(MAX_SLOWNESS, max(1.0, start_s / QUICK_START_S))


class _Client:
    """Plain gRPC with bounded retries across the endpoints (the SDK does this for apps).

    Every write carries one request id for all its attempts (`with_request_id`), so a retry
    after an unknown outcome (a deadline that expired after the commit, a leader killed
    after it replicated) gets the stored answer instead of ALREADY_EXISTS or a second
    application. `slowness` scales every deadline: the demo measures how long the cluster
    took to come up and sets it, so a slow host makes the demo slower, never wrong."""

    #: Bounds of one attempt and of one call (retries included) on a quick host.
    ATTEMPT_TIMEOUT_S = 5.0
    CALL_TIMEOUT_S = 30.0
    MAX_ATTEMPTS = 400

    def __init__(self, endpoints: list[str]) -> None:
        self._channels = [grpc.insecure_channel(e) for e in endpoints]
        self._stubs = [coordinator_pb2_grpc.CoordinatorStub(c) for c in self._channels]
        self.slowness = 1.0

    def call(self, method: str, request, timeout_s: float | None = None):
        request = with_request_id(request)
        total_s = (timeout_s or self.CALL_TIMEOUT_S) * self.slowness
        deadline = time.monotonic() + total_s
        attempt = 0
        while True:
            stub = self._stubs[attempt % len(self._stubs)]
            attempt += 1
            remaining_s = max(0.5, deadline - time.monotonic())
            try:
                return getattr(stub, method)(
                    request, timeout=min(self.ATTEMPT_TIMEOUT_S * self.slowness, remaining_s)
                )
            except grpc.RpcError as error:
                info = from_rpc_error(error)
                retryable = (
                    error.code()
                    in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    )
                    or info.code in RETRYABLE
                )
                if not retryable or time.monotonic() > deadline or attempt > self.MAX_ATTEMPTS:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


def _pchannel_table(title: str, pchannels: list[pb.PChannel]) -> Table:
    table = Table(title=title)
    for column in ("pchannel", "term", "owner", "replicas", "state"):
        table.add_column(column)
    for channel in pchannels:
        table.add_row(
            channel.name,
            str(channel.term),
            channel.owner_node_id,
            ",".join(channel.replica_node_ids),
            pb.PChannelState.Name(channel.state).removeprefix("PCHANNEL_STATE_"),
        )
    return table


def _wait_assigned(client: _Client, names: list[str], timeout_s: float) -> list[pb.PChannel]:
    timeout_s *= client.slowness
    deadline = time.monotonic() + timeout_s
    while True:
        described = client.call("DescribeChannels", api.DescribeChannelsRequest(pchannels=names))
        channels = list(described.pchannels)
        if all(c.state == pb.PCHANNEL_STATE_ASSIGNED for c in channels):
            return channels
        if time.monotonic() > deadline:
            raise TimeoutError(f"pchannels not assigned after {timeout_s:.0f} s")
        time.sleep(0.2)


async def _wal_demo(
    console: Console, cluster: dev.LocalCluster, slowness: float = 1.0
) -> dict[bytes, int]:
    """Produce to `orders` one message at a time (the SDK batches them), kill -9 the owner
    of its pchannel in the middle, keep producing, then consume everything from the
    beginning and check it against what was acknowledged."""
    from rpc.streaming_client import StreamingClient

    async with StreamingClient(cluster.endpoints) as client:
        route = await client.router.owner(await client.router.pchannel_of("orders"), 20 * slowness)
        owner = route.owner_node_id or next(
            n.id for n in cluster.config.nodes if n.grpc_address == route.owner_address
        )
        producer = client.producer()
        acked: dict[bytes, int] = {}

        async def send(index: int) -> None:
            payload = b"order-%05d" % index
            position = await producer.send("orders", payload)
            acked[payload] = position.lsn

        started = time.monotonic()
        await asyncio.gather(*(send(i) for i in range(2000)))
        rate = 2000 / (time.monotonic() - started)
        console.print(
            f"2,000 messages acknowledged on orders ({route.pchannel}, owner {owner}, term "
            f"{route.term}) at {rate:,.0f} msgs/s, each durable on a majority"
        )
        cluster.kill(owner, signal.SIGKILL)
        killed_at = time.monotonic()
        first = asyncio.ensure_future(send(2000))
        rest = [asyncio.ensure_future(send(i)) for i in range(2001, 3000)]
        await first
        console.print(
            f"killed owner {owner}; the producer re-routed and the next message was "
            f"acknowledged {time.monotonic() - killed_at:.2f} s later"
        )
        await asyncio.gather(*rest)
        await producer.close()
        new_route = await client.router.owner(route.pchannel, 20 * slowness)
        console.print(
            f"{route.pchannel} now at term {new_route.term} on {new_route.owner_node_id or new_route.owner_address}"
        )
        seen: dict[bytes, int] = {}
        consumer = client.consumer("orders", msg_types=["message"])
        async for entry in consumer:
            seen[entry.payload] = entry.lsn
            if len(seen) >= len(acked):
                break
        await consumer.close()
        lost = [p for p, lsn in acked.items() if seen.get(p) != lsn]
        console.print(
            f"consumed {len(seen):,} messages from the beginning: every acknowledged message "
            f"at its acknowledged LSN ({len(lost)} missing), in LSN order, none twice"
        )
        if lost:
            raise AssertionError(f"acknowledged messages missing: {lost[:5]}")
    cluster.start_node(owner)
    return acked


def _spark_demo(
    console: Console, client: _Client, cluster: dev.LocalCluster, acked: dict[bytes, int]
) -> None:
    """Read the committed segments with Spark at one revision and check the `orders` rows
    against the acknowledged messages those segments cover."""
    from pyspark.sql import functions as F

    import spark_connector
    from raftwal.cli.spark import session

    # Sealed segments are committed through Raft just after their seal: wait until the
    # manifest stops growing (bounded), then read exactly that revision.
    deadline = time.monotonic() + 15 * client.slowness
    previous, stable_since = -1, time.monotonic()
    while True:
        listed = client.call("ListSegments", api.ListSegmentsRequest(pchannels=["wal_0"]))
        count = len(listed.segments)
        if count != previous:
            previous, stable_since = count, time.monotonic()
        if time.monotonic() - stable_since >= 1.0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    through = max((s.last_lsn for s in listed.segments), default=0)
    started = time.monotonic()
    spark = session("local[2]", "raftwal demo")
    try:
        console.print(f"SparkSession local[2] up in {time.monotonic() - started:.1f} s")
        spark_connector.register(spark)
        df = (
            spark.read.format("raftwal")
            .option("endpoints", ",".join(cluster.endpoints))
            .option("asOfRevision", str(listed.revision))
            .load()
        )
        started = time.monotonic()
        summary = (
            df.groupBy("vchannel", "msg_type")
            .agg(
                F.count(F.lit(1)).alias("rows"),
                F.countDistinct("segment_id").alias("segments"),
                F.min("lsn").alias("first_lsn"),
                F.max("lsn").alias("last_lsn"),
            )
            .orderBy("vchannel", "msg_type")
            .collect()
        )
        table = Table(title=f"committed segments at revision {listed.revision}, read by Spark")
        for column in ("vchannel", "msg_type", "rows", "segments", "lsns"):
            table.add_column(column)
        for row in summary:
            table.add_row(
                row.vchannel,
                row.msg_type,
                f"{row.rows:,}",
                str(row.segments),
                f"{row.first_lsn}..{row.last_lsn}",
            )
        console.print(table)
        orders = {
            bytes(r.payload): r.lsn
            for r in df.where("vchannel = 'orders' AND msg_type = 'message'")
            .select("payload", "lsn")
            .collect()
        }
        expected = {p: lsn for p, lsn in acked.items() if lsn <= through}
        console.print(
            f"orders: {len(orders):,} rows in {time.monotonic() - started:.1f} s, exactly the "
            f"{len(expected):,} acknowledged messages up to lsn {through} (the segments "
            "committed so far; the open segment is not read)"
        )
        if orders != expected:
            missing = len(set(expected) - set(orders))
            raise AssertionError(
                f"Spark rows differ from the acknowledged messages ({missing} missing)"
            )
    finally:
        spark.stop()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SIGTERM's default action ends the process at once, leaving the node processes (each
    # in a session of its own) running: exit through the finally blocks that stop them.
    raise SystemExit(128 + signum)


def run_cluster_demo(directory: Path | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _run_cluster_demo(directory)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_cluster_demo(directory: Path | None) -> int:
    console = Console(highlight=False)
    temp = None
    if directory is None:
        temp = tempfile.TemporaryDirectory(prefix="raftwal-demo-")
        directory = Path(temp.name)
    console.rule("raftwal: three nodes on 127.0.0.1")
    started = time.monotonic()
    # Small segments, so that the demo's few thousand messages fill several and Spark has
    # committed segments to read (the default is 64 MiB).
    environ = dict(os.environ)
    environ.setdefault("RAFTWAL_SEGMENT_MAX_BYTES", str(64 * 1024))
    try:
        cluster = dev.up(directory, 3, timeout_s=START_TIMEOUT_S, env=environ)
    except BaseException:
        # Stopped (SIGTERM, Ctrl-C) or failed while starting: stop what had started.
        with contextlib.suppress(Exception):
            dev.down(directory)
        if temp is not None:
            temp.cleanup()
        raise
    client = _Client(cluster.endpoints)
    client.slowness = host_slowness(time.monotonic() - started)
    try:
        status = client.call("ClusterStatus", api.ClusterStatusRequest())
        console.print(
            f"cluster up in {time.monotonic() - started:.1f} s, leader [bold]"
            f"{status.leader_node_id}[/bold], Raft term {max(m.raft_term for m in status.members)}"
        )
        for member in status.members:
            console.print(
                f"  {member.node_id}  grpc {member.grpc_address}  raft {member.raft_address}  "
                f"pid {member.pid}"
            )

        console.rule("pchannels, placed by the leader's balancer")
        created = client.call("CreateChannels", api.CreateChannelsRequest(prefix="wal", count=4))
        names = list(created.pchannels)
        console.print(_pchannel_table("after placement", _wait_assigned(client, names, 20)))
        for vchannel, pchannel in (("orders", "wal_0"), ("payments", "wal_1"), ("audit", "wal_2")):
            client.call(
                "CreateVChannel", api.CreateVChannelRequest(name=vchannel, pchannel=pchannel)
            )
        console.print("vchannels orders, payments, audit created")

        console.rule("a lease, a lock and a broadcast")
        lease = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=10_000, holder="demo"))
        lock = client.call(
            "Lock",
            api.LockRequest(key="db/orders", mode=pb.LOCK_MODE_EXCLUSIVE, lease_id=lease.lease_id),
        )
        console.print(f"lease {lease.lease_id} holds db/orders, fencing token {lock.fencing_token}")
        ddl = api.BroadcastRequest(
            message=b"CREATE INDEX ON orders",
            msg_type="ddl",
            vchannels=["orders", "payments"],
            resource_keys=[pb.ResourceKey(key="db/orders", mode=pb.LOCK_MODE_EXCLUSIVE)],
            idempotency_key="ddl-1",
        )
        try:
            client.call("Broadcast", ddl)
        except grpc.RpcError as error:
            info = from_rpc_error(error)
            console.print(
                f"broadcast while the lock is held: [red]{errors_pb2.ErrorCode.Name(info.code)}"
                f"[/red] {info.message}"
            )
        client.call("Unlock", api.UnlockRequest(key="db/orders", lease_id=lease.lease_id))
        broadcast = client.call("Broadcast", ddl)
        again = client.call("Broadcast", ddl)
        console.print(
            f"broadcast {broadcast.broadcast_id} created after unlock; the same idempotency key "
            f"again returns broadcast {again.broadcast_id}"
        )
        for vchannel in ("orders", "payments"):
            acked = client.call(
                "Ack",
                api.AckRequest(
                    broadcast_id=broadcast.broadcast_id, vchannel=vchannel, checkpoint=1
                ),
            )
        console.print(
            f"acked on both vchannels: {pb.BroadcastState.Name(acked.state)}, db/orders released"
        )

        console.rule("the WAL: produce, kill -9 the owner mid-produce, consume")
        acked = asyncio.run(_wal_demo(console, cluster, client.slowness))

        console.rule("kill -9 the Raft leader during writes")
        leader = client.call("ClusterStatus", api.ClusterStatusRequest()).leader_node_id
        owned = [c.name for c in _wait_assigned(client, names, 10) if c.owner_node_id == leader]
        for k in range(20):
            client.call(
                "CreateVChannel", api.CreateVChannelRequest(name=f"pre-{k}", pchannel="wal_3")
            )
        cluster.kill(leader, signal.SIGKILL)
        killed_at = time.monotonic()
        client.call("CreateVChannel", api.CreateVChannelRequest(name="post-kill", pchannel="wal_3"))
        failover_s = time.monotonic() - killed_at
        status = client.call("ClusterStatus", api.ClusterStatusRequest())
        console.print(
            f"killed leader {leader}; first write acknowledged {failover_s:.2f} s later; "
            f"new leader {status.leader_node_id}"
        )
        console.print(
            f"{leader} owned {', '.join(owned) or 'no pchannel'}; after node_timeout the leader "
            "marks it DOWN and moves them within their replica sets at term + 1"
        )
        if owned:
            deadline = time.monotonic() + 30 * client.slowness
            while time.monotonic() < deadline:
                moved = client.call(
                    "DescribeChannels", api.DescribeChannelsRequest(pchannels=owned)
                ).pchannels
                if all(
                    c.owner_node_id != leader and c.state == pb.PCHANNEL_STATE_ASSIGNED
                    for c in moved
                ):
                    break
                time.sleep(0.3)
            console.print(_pchannel_table("after failover", list(moved)))

        console.rule("restart the killed node; compare the replicas")
        cluster.start_node(leader)
        deadline = time.monotonic() + 30 * client.slowness
        while True:
            status = client.call("ClusterStatus", api.ClusterStatusRequest())
            reachable = [m for m in status.members if m.reachable]
            if len(reachable) == 3 and len({(m.revision, m.state_digest) for m in reachable}) == 1:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("replicas did not converge after the restart")
            time.sleep(0.3)
        table = Table(title="replicas")
        for column in ("node", "leader", "raft term", "commit index", "revision", "state digest"):
            table.add_column(column)
        for member in status.members:
            table.add_row(
                member.node_id,
                "*" if member.is_leader else "",
                str(member.raft_term),
                str(member.commit_index),
                str(member.revision),
                member.state_digest[:16],
            )
        console.print(table)
        console.print("every replica holds the same state at the same revision")

        stream = coordinator_pb2_grpc.CoordinatorStub(
            grpc.insecure_channel(cluster.endpoints[0])
        ).WatchEvents(
            api.WatchEventsRequest(from_revision=1),
            timeout=20 * client.slowness,
            wait_for_ready=True,
        )
        kinds: dict[str, int] = {}
        count = 0
        for batch in stream:
            for event in batch.events:
                kind = event.WhichOneof("body") or "?"
                kinds[kind] = kinds.get(kind, 0) + 1
                count += 1
            if count >= status.revision:
                stream.cancel()
                break
        console.print(
            f"WatchEvents from revision 1 replays {count} events: "
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:6])
        )

        console.rule("Spark reads the committed segments (spark.read.format('raftwal'))")
        _spark_demo(console, client, cluster, acked)
    finally:
        client.close()
        cluster.stop_all()
        if temp is not None:
            temp.cleanup()
    console.rule("done: all node processes stopped")
    return 0


# ---------------------------------------------------------------------------------------
# The pure state-machine scenario (no processes): `raftwal demo --state-machine`.
# ---------------------------------------------------------------------------------------

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the scenario's scripted clock.


class _Scenario:
    def __init__(self, console: Console, json_output: bool) -> None:
        self.state = new_state()
        self.index = 0
        self.now_ms = START_MS
        self.console = console
        self.json_output = json_output

    def step(self, title: str, **body: object) -> pb.CommandResult:
        self.index += 1
        self.now_ms += 250
        command = pb.Command(proposed_at_ms=self.now_ms, **body)  # type: ignore[arg-type]
        result = apply_command(self.state, command.SerializeToString(), self.index)
        check(self.state)
        self.show(title, result)
        return result

    def show(self, title: str, result: pb.CommandResult) -> None:
        if self.json_output:
            for event in result.events:
                print(json.dumps(json_format.MessageToDict(event), sort_keys=True))
            if result.rejection.code != errors_pb2.OK:
                print(json.dumps({"rejection": json_format.MessageToDict(result.rejection)}))
            return
        if result.rejection.code != errors_pb2.OK:
            code = errors_pb2.ErrorCode.Name(result.rejection.code)
            self.console.print(
                f"[bold]{title}[/bold]  [red]rejected {code}[/red]: {result.rejection.message}"
            )
            return
        self.console.print(f"[bold]{title}[/bold]  [green]ok[/green]")
        for event in result.events:
            kind = event.WhichOneof("body")
            body = json_format.MessageToDict(getattr(event, kind))
            self.console.print(f"   rev {event.revision:>3}  {kind:<28} {body}")


def run_demo(json_output: bool = False) -> int:
    """The scripted scenario against the pure state machine and balancer."""
    console = Console(highlight=False)
    s = _Scenario(console, json_output)
    for k in (1, 2, 3):
        s.step(
            f"node n{k} joins",
            register_node=pb.RegisterNode(node_id=f"n{k}", address=f"127.0.0.1:{7200 + k}"),
        )
    s.step(
        "create 4 pchannels",
        create_pchannels=pb.CreatePChannels(
            prefix="wal", count=4, owner=pb.OwnerDescription(role="demo", text="quickstart")
        ),
    )
    for command in plan(s.state, ["n1", "n2", "n3"]):
        s.step(f"balancer places {command.assign_pchannel.pchannel}", **_body(command))
    for name in sorted(s.state.pchannels):
        channel = s.state.pchannels[name]
        s.step(
            f"{channel.owner_node_id} finished recovery of {name}",
            pchannel_ready=pb.PChannelReady(
                pchannel=name, term=channel.term, node_id=channel.owner_node_id, start_lsn=1
            ),
        )
    for vchannel, pchannel in (("orders", "wal_0"), ("payments", "wal_1"), ("audit", "wal_2")):
        s.step(
            f"create vchannel {vchannel}",
            create_vchannel=pb.CreateVChannel(name=vchannel, pchannel=pchannel),
        )
    lease = s.step("grant a 10 s lease", grant_lease=pb.GrantLease(ttl_ms=10_000, holder="etl"))
    s.step(
        "lease locks db/orders EXCLUSIVE",
        lock=pb.Lock(key="db/orders", mode=pb.LOCK_MODE_EXCLUSIVE, lease_id=lease.lease_id),
    )
    broadcast = pb.CreateBroadcast(
        message=b"CREATE INDEX ON orders",
        msg_type="ddl",
        vchannels=["orders", "payments"],
        resource_keys=[pb.ResourceKey(key="db/orders", mode=pb.LOCK_MODE_EXCLUSIVE)],
        idempotency_key="ddl-1",
    )
    s.step("broadcast DDL while the lease holds the key", create_broadcast=broadcast)
    s.step("revoke the lease", revoke_lease=pb.RevokeLease(lease_id=lease.lease_id))
    created = s.step("broadcast DDL again", create_broadcast=broadcast)
    s.step("same idempotency key: deduplicated", create_broadcast=broadcast)
    for vchannel in ("orders", "payments"):
        s.step(
            f"consumer of {vchannel} acks the DDL",
            ack_broadcast=pb.AckBroadcast(
                broadcast_id=created.broadcast_id, vchannel=vchannel, checkpoint=1
            ),
        )
    old = s.state.pchannels["wal_1"]
    old_owner, old_term = old.owner_node_id, old.term
    s.step(f"{old_owner} stops heartbeating", mark_node_down=pb.MarkNodeDown(node_id=old_owner))
    live = [n for n in ("n1", "n2", "n3") if n != old_owner]
    for command in plan(s.state, live):
        s.step(f"balancer moves {command.assign_pchannel.pchannel}", **_body(command))
    s.step(
        f"the old owner {old_owner} tries to commit a segment of wal_1 at term {old_term}",
        commit_segment=pb.CommitSegment(
            pchannel="wal_1",
            term=old_term,
            first_lsn=1,
            last_lsn=10,
            first_term=old_term,
            last_term=old_term,
            count=10,
            bytes=1000,
            replica_node_ids=list(old.replica_node_ids),
        ),
    )
    if not json_output:
        console.print(
            _pchannel_table(
                f"pchannels at revision {s.state.revision}",
                [s.state.pchannels[name] for name in sorted(s.state.pchannels)],
            )
        )
        console.print(f"state digest {state_digest(s.state)[:16]}, invariants hold")
    return 0


def _body(command: pb.Command) -> dict[str, object]:
    kind = command.WhichOneof("body")
    assert kind is not None
    return {kind: getattr(command, kind)}
