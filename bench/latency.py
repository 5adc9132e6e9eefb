"""Latency between hosts: raftwal, etcd 3.4 and NATS JetStream, three members each, at
several round-trip times between the members, in the same run.

The members talk to each other through the chaos suite's per-link TCP proxies
(raftwal/chaos/net.py), which delay what they forward by RTT/2 each way (+- jitter/2):
raftwal's Raft, gRPC and transfer links, etcd's peer links and JetStream's cluster routes
(each etcd member and nats-server advertises a proxy of its peer port; each nats-server's
routes name the proxies of its links). Clients reach the members directly. (This kernel
has no netem, so the delay is in user space; its proxies run on their own thread.) For
each RTT, raftwal runs first, then etcd, then JetStream:

- write p50/p99 via the leader, sequential (raftwal: Lock/Unlock RPC; etcd: put), as in
  bench/coord.py;
- failover: kill -9 the leader (JetStream: the stream leader), time to the first
  successful write (publish) through the survivors (median of `--trials`);
- WAL produce p50/p99 (raftwal and JetStream): one 1 KiB message per send, sequential:
  raftwal through the SDK's Producer (acknowledged when a majority of the replicas fsynced
  it), JetStream as a publish to an R3 file stream with `sync_interval: always` (acked once
  a quorum fsynced it; bench/wal.py's setup), on the stream leader's server.

    python bench/latency.py [--rtts 0,1,5] [--jitter-ms 0] [--trials 3] [--ops 200] [--json]

etcd comes from scripts/install-etcd.sh (--skip-etcd to run without), nats-server >= 2.10
from scripts/install-nats.sh (--skip-nats). Every process is stopped by pid and every proxy
closed, also on error.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from _harness import Latencies, median, percentile, sequential, wait_until
from coord import (
    ERRORS,
    HEALTHY_TIMEOUT_S,
    READ_PCHANNEL,
    EtcdMember,
    EtcdSystem,
    RaftwalSystem,
    System,
    failover_trial,
    make_raftwal_client,
    say,
    warm_up,
)
from wal import ERRORS as NATS_ERRORS
from wal import NATS_SYNC_ALWAYS_MIN_VERSION, NatsWal, find_nats_server

from raftwal.chaos.net import ProxyNet
from raftwal.cli import dev
from raftwal.node.config import NodeConfig
from rpc.streaming.client import StreamingClient

PAYLOAD = b"x" * 1024


class DelayedRaftwal(RaftwalSystem):
    """Three raftwal nodes whose links to each other go through delaying proxies."""

    def __init__(self, directory: Path, delay_ms: float, jitter_ms: float) -> None:
        super().__init__(directory)
        self._delay = (delay_ms, jitter_ms)
        self._net: ProxyNet | None = None

    async def start(self) -> None:
        config = dev.make_config(self._directory, 3)
        self._net = ProxyNet(config.nodes)
        self._net.start()
        self._net.set_latency(*self._delay)
        config = replace(config, nodes=self._net.configure(config.nodes))
        self._cluster = await asyncio.to_thread(
            functools.partial(dev.up, self._directory, 3, config=config)
        )
        for node in self.cluster.config.nodes:
            self._status_clients[node.id] = make_raftwal_client(node.grpc_address, "status")
        sdk = make_raftwal_client(self.cluster.endpoints[0], "setup")
        try:
            await sdk.create_channel(READ_PCHANNEL)
        finally:
            await sdk.close()

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            if self._net is not None:
                self._net.close()


class DelayedEtcd(EtcdSystem):
    """Three etcd members, each advertising a delaying proxy of its peer port."""

    def __init__(self, directory: Path, binary: str, delay_ms: float, jitter_ms: float) -> None:
        super().__init__(directory, binary)
        members = list(self._members.values())
        nodes = [
            NodeConfig(m.name, "127.0.0.1", m.client_port, m.peer_port, m.data_dir) for m in members
        ]
        self._net = ProxyNet(nodes)
        configured = {n.id: n for n in self._net.configure(nodes)}
        # Every peer dials member k at one proxy of its peer port (etcd advertises one
        # address per member): the link proxy of the next member to k.
        self._advertised = {
            m.peer_url: "http://"
            + configured[members[(k + 1) % len(members)].name].dial_raft_address(nodes[k])
            for k, m in enumerate(members)
        }
        self._delay = (delay_ms, jitter_ms)

    def _command(self, member: EtcdMember) -> list[str]:
        argv = super()._command(member)
        for k, value in enumerate(argv):
            if argv[k - 1] in ("--initial-advertise-peer-urls", "--initial-cluster"):
                for real, proxy in self._advertised.items():
                    value = value.replace(real, proxy)
                argv[k] = value
        return argv

    async def start(self) -> None:
        self._net.start()
        self._net.set_latency(*self._delay)
        await super().start()

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            self._net.close()


class DelayedNats(NatsWal):
    """Three nats-servers (JetStream, R3 file streams, sync always) whose cluster routes go
    through delaying proxies: each server's routes name its links' proxies, and it
    advertises a proxy of its own cluster port (as DelayedEtcd does)."""

    def __init__(
        self,
        directory: Path,
        binary: str,
        version: tuple[int, ...],
        delay_ms: float,
        jitter_ms: float,
    ) -> None:
        super().__init__(directory, binary, version, True, {"small": PAYLOAD, "large": PAYLOAD})
        self.name = "jetstream"
        members = list(self._nodes.values())
        self._configs = [
            NodeConfig(m.name, "127.0.0.1", m.client_port, m.cluster_port, m.store_dir)
            for m in members
        ]
        self._net = ProxyNet(self._configs)
        self._dial = {n.id: n for n in self._net.configure(self._configs)}
        self._delay = (delay_ms, jitter_ms)

    def _write_configs(self) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        members = self._configs
        for k, node in enumerate(self._nodes.values()):
            me = self._dial[node.name]
            routes = ", ".join(
                f'"nats-route://{me.dial_raft_address(peer)}"'
                for peer in members
                if peer.id != node.name
            )
            # The link proxy of the next member to this one: what the others learn of it.
            advertised = self._dial[members[(k + 1) % len(members)].id].dial_raft_address(
                members[k]
            )
            node.config_path.write_text(
                f'server_name: "{node.name}"\n'
                f'listen: "127.0.0.1:{node.client_port}"\n'
                "jetstream {\n"
                f'  store_dir: "{node.store_dir}"\n'
                "  sync_interval: always\n"
                "}\n"
                "cluster {\n"
                '  name: "latency"\n'
                f'  listen: "127.0.0.1:{node.cluster_port}"\n'
                f'  advertise: "{advertised}"\n'
                f"  routes: [{routes}]\n"
                "}\n"
            )

    async def start(self) -> None:
        self._net.start()
        self._net.set_latency(*self._delay)
        await super().start()

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            self._net.close()


async def _measure_nats(system: DelayedNats, args: argparse.Namespace) -> dict[str, Any]:
    say(f"starting {system.name}")
    await system.start()
    try:
        producer = (await system.producers("small", 1, 1))[0]
        try:

            async def one() -> None:
                await asyncio.wait_for(await producer.submit(), 10.0)

            for _ in range(20):  # warm-up
                await one()
            produce = await sequential(one, args.ops, 60.0, NATS_ERRORS)
        finally:
            await producer.close()
        failovers: list[float | None] = []
        for trial in range(args.trials):
            await wait_until(system.healthy, HEALTHY_TIMEOUT_S, 0.2)
            await asyncio.sleep(1.0)
            outcome = await system.failover_trial()
            failovers.append(outcome.outcome.elapsed_s)
            say(
                f"{system.name} failover {trial + 1}/{args.trials}: killed {outcome.killed}, "
                f"{outcome.outcome.elapsed_s}"
            )
            await system.restart(outcome.killed)
        await wait_until(system.healthy, HEALTHY_TIMEOUT_S, 0.2)
        done = [f for f in failovers if f is not None]
        return {
            "produce_p50_ms": _ms(produce.samples_s, 0.5),
            "produce_p99_ms": _ms(produce.samples_s, 0.99),
            "produce_errors": dict(produce.errors),
            "failover_p50_s": round(median(done), 3) if done else None,
            "failover_trials_s": [None if f is None else round(f, 3) for f in failovers],
        }
    finally:
        say(f"stopping {system.name}")
        await system.stop()


def _ms(values: list[float], fraction: float) -> float | None:
    return round(percentile(values, fraction) * 1000, 2) if values else None


async def _write_latency(system: System, ops: int) -> Latencies:
    leader = await system.leader()
    client = await system.client(leader, 10_000)
    try:
        return await sequential(client.write, ops, 60.0, ERRORS)
    finally:
        await client.close()


async def _failovers(system: System, trials: int) -> list[float | None]:
    out: list[float | None] = []
    for trial in range(trials):
        await wait_until(system.healthy, HEALTHY_TIMEOUT_S, 0.2)
        await asyncio.sleep(1.0)
        leader, outcome = await failover_trial(system)
        out.append(outcome.elapsed_s)
        say(f"{system.name} failover {trial + 1}/{trials}: killed {leader}, {outcome.elapsed_s}")
        await system.restart(leader)
        await wait_until(system.healthy, HEALTHY_TIMEOUT_S, 0.2)
    return out


async def _produce_latency(system: RaftwalSystem, ops: int) -> Latencies:
    pchannel = f"lat_{uuid.uuid4().hex[:6]}"
    vchannel = f"{pchannel}_v"
    client = StreamingClient(system.cluster.endpoints)
    admin = client.coordinator
    # Request ids: a create retried by the client is answered once.
    await admin.create_channels(names=[pchannel], request_id=uuid.uuid4().hex)
    await admin.create_vchannel(vchannel, pchannel, request_id=uuid.uuid4().hex)
    producer = client.producer(producer_id=f"latency-{pchannel}")
    try:
        # The first sends wait for the pchannel's owner and open the stream.
        deadline = time.monotonic() + 60
        while True:
            try:
                await producer.send(vchannel, PAYLOAD)
                break
            except ERRORS:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

        async def one() -> None:
            await producer.send(vchannel, PAYLOAD)

        return await sequential(one, ops, 60.0, ERRORS)
    finally:
        await producer.close()
        await client.close()


async def _measure(system: System, args: argparse.Namespace) -> dict[str, Any]:
    say(f"starting {system.name}")
    await system.start()
    try:
        await warm_up(system)
        writes = await _write_latency(system, args.ops)
        entry: dict[str, Any] = {
            "write_p50_ms": _ms(writes.samples_s, 0.5),
            "write_p99_ms": _ms(writes.samples_s, 0.99),
            "write_errors": dict(writes.errors),
        }
        if isinstance(system, RaftwalSystem):
            produce = await _produce_latency(system, args.ops)
            entry["produce_p50_ms"] = _ms(produce.samples_s, 0.5)
            entry["produce_p99_ms"] = _ms(produce.samples_s, 0.99)
            entry["produce_errors"] = dict(produce.errors)
        failovers = await _failovers(system, args.trials)
        done = [f for f in failovers if f is not None]
        entry["failover_p50_s"] = round(median(done), 3) if done else None
        entry["failover_trials_s"] = [None if f is None else round(f, 3) for f in failovers]
        return entry
    finally:
        say(f"stopping {system.name}")
        await system.stop()


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    etcd_binary = None if args.skip_etcd else shutil.which("etcd")
    if not args.skip_etcd and etcd_binary is None:
        raise SystemExit("etcd is not installed: run scripts/install-etcd.sh (or --skip-etcd)")
    nats_server = None if args.skip_nats else find_nats_server(None)
    if nats_server is not None and nats_server[1][:2] < NATS_SYNC_ALWAYS_MIN_VERSION:
        say(f"nats-server {nats_server[1]} has no sync_interval always: JetStream skipped")
        nats_server = None
    if not args.skip_nats and nats_server is None:
        raise SystemExit(
            "nats-server >= 2.10 is not installed: run scripts/install-nats.sh (or --skip-nats)"
        )
    results: dict[str, Any] = {}
    for rtt in args.rtts:
        delay = (rtt / 2, args.jitter_ms / 2)
        row: dict[str, Any] = {}
        row["raftwal"] = await _measure(DelayedRaftwal(root / f"raftwal-{rtt}", *delay), args)
        if etcd_binary is not None:
            row["etcd"] = await _measure(
                DelayedEtcd(root / f"etcd-{rtt}", etcd_binary, *delay), args
            )
        if nats_server is not None:
            row["jetstream"] = await _measure_nats(
                DelayedNats(root / f"nats-{rtt}", *nats_server, *delay), args
            )
        results[f"{rtt:g}"] = row
        say(f"RTT {rtt:g} ms: {json.dumps(row)}")
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        "| RTT | raftwal write p50 | etcd write p50 | raftwal produce p50 | JetStream produce "
        "p50 | raftwal failover | etcd failover | JetStream failover |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rtt, row in results.items():
        r, e, j = row["raftwal"], row.get("etcd", {}), row.get("jetstream", {})
        lines.append(
            f"| {rtt} ms | {r['write_p50_ms']} ms | {e.get('write_p50_ms', '-')} ms "
            f"| {r['produce_p50_ms']} ms | {j.get('produce_p50_ms', '-')} ms "
            f"| {r['failover_p50_s']} s | {e.get('failover_p50_s', '-')} s "
            f"| {j.get('failover_p50_s', '-')} s |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtts", default="0,1,5", help="round-trip times in ms (default 0,1,5)")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="RTT jitter (default 0)")
    parser.add_argument("--trials", type=int, default=3, help="failover trials (default 3)")
    parser.add_argument("--ops", type=int, default=200, help="sequential writes (default 200)")
    parser.add_argument("--skip-etcd", action="store_true")
    parser.add_argument("--skip-nats", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.rtts = [float(x) for x in args.rtts.split(",") if x]
    with tempfile.TemporaryDirectory(prefix="raftwal-latency-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    if args.json:
        print(json.dumps({"command": " ".join(["python", *sys.argv]), "results": results}))
    else:
        print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
