"""A short chaos run across network namespaces (issue 36; the `slow` tier): a three-node cluster of
`raftwal dev up --netns`, one producer writing throughout, and about a minute of faults on
the pchannel's owner and the Raft leader inside their namespaces: kill -9 (then a restart),
SIGSTOP (then SIGCONT) and a partition (the host's veth on the bridge set down, then up).
Afterwards every acknowledged message is in the log exactly once, at the LSN it was
acknowledged with, and nothing is there that was never sent.

Skipped, with the reason, where namespaces cannot be made (not root, no iproute2). Every
fault is undone and the cluster and its namespaces removed also when the test fails. The
seed is printed; RAFTWAL_CHAOS_SEED=N replays the same order of faults.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from raftwal.cli import dev, netns
from rpc.protos import coordination_pb2 as pb
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, consume_all, setup_channels, wait_assigned
from tests.timing import scaled, wait_for

pytestmark = pytest.mark.cluster

REASON = netns.unavailable()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")

# How long faults are injected (a workload length: not scaled), and how long each lasts.
RUN_S = 60.0
FAULT_S = 5.0
KINDS = ("kill", "stop", "partition")


def _healthy(client: Api, pchannel: str) -> bool:
    """All three nodes UP and answering, and the pchannel ASSIGNED."""
    try:
        status = client.status()
    except Exception:  # noqa: BLE001 - a node still coming back: ask again
        return False
    return (
        sum(1 for n in status.nodes if n.state == pb.NODE_STATE_UP) == 3
        and sum(1 for m in status.members if m.reachable) == 3
        and any(
            c.name == pchannel and c.state == pb.PCHANNEL_STATE_ASSIGNED for c in status.pchannels
        )
    )


@pytest.mark.slow
@needs_netns
def test_a_minute_of_faults_across_namespaces_loses_no_acknowledged_message(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("RAFTWAL_CHAOS_SEED", random.randrange(1 << 31)))
    print(f"chaos seed {seed} (RAFTWAL_CHAOS_SEED={seed} replays it)")
    rng = random.Random(seed)
    env = {**os.environ, "RAFTWAL_NODE_TIMEOUT_MS": "2000"}
    local = dev.up(tmp_path / "cluster", 3, timeout_s=90, in_netns=True, env=env)
    hosts = local.netns
    assert hosts is not None
    client = Api(local.endpoints)
    writer_client = Api(local.endpoints)
    stopped: set[int] = set()  # pids under SIGSTOP
    cut: set[str] = set()  # hosts off the bridge
    done = threading.Event()
    history = History()
    sent: list[bytes] = []
    unfinished: list[int] = []
    faults: list[str] = []
    writer: threading.Thread | None = None
    try:
        (pchannel,) = setup_channels(client, "chaos", {"chaos_v": 0})
        wait_assigned(client, pchannel)
        producer = Producer(writer_client, pchannel, "chaos")

        def write() -> None:
            batch = 0
            try:
                while not done.is_set():
                    payloads = [b"chaos-%d-%d" % (batch, i) for i in range(5)]
                    sent.extend(payloads)
                    if not producer.send("chaos_v", payloads, history, budget_s=30):
                        unfinished.append(batch)
                    batch += 1
            finally:
                producer.close()

        writer = threading.Thread(target=write, name="chaos-writer", daemon=True)
        writer.start()
        started = time.monotonic()
        order = list(KINDS)
        # At least one fault of each kind, however slow the machine.
        while time.monotonic() - started < RUN_S or len(faults) < len(KINDS):
            if not order:
                order = list(KINDS)
            kind = order.pop(rng.randrange(len(order)))
            owner, _, _ = wait_assigned(client, pchannel, timeout_s=60)
            leader = client.status().leader_node_id or owner
            acked_before = len(history.acked)
            if kind == "kill":
                target = owner
                local.kill(target, signal.SIGKILL)
                time.sleep(rng.uniform(0.5, FAULT_S))
                local.start_node(target)
            elif kind == "stop":
                target = leader
                pid = local.pid(target)
                assert pid is not None
                dev.signal_node(pid, signal.SIGSTOP)
                stopped.add(pid)
                time.sleep(rng.uniform(1.0, FAULT_S))
                dev.signal_node(pid, signal.SIGCONT)
                stopped.discard(pid)
            else:
                target = owner
                hosts.set_connected(target, False)
                cut.add(target)
                time.sleep(rng.uniform(1.0, FAULT_S))
                hosts.set_connected(target, True)
                cut.discard(target)
            faults.append(f"{kind} {target} (owner {owner}, leader {leader})")
            wait_for(
                f"the cluster healthy after {faults[-1]}", lambda: _healthy(client, pchannel), 90
            )
            # Writes go on after each fault.
            wait_for(
                f"an acknowledged write after {faults[-1]}",
                lambda before=acked_before: len(history.acked) > before,
                60,
            )
        done.set()
        writer.join(timeout=scaled(60))
        assert not writer.is_alive(), "the writer did not finish its last batch"
        print(f"{len(faults)} faults: {'; '.join(faults)}")
        print(f"{len(history.acked)} acknowledged, {len(unfinished)} batches unfinished")
        entries = consume_all(client, "chaos_v", pchannel, expect=len(history.acked), timeout_s=90)
        logged = Counter(e.payload for e in entries)
        at = {e.payload: e.lsn for e in entries}
        # Every acknowledged message exactly once, where it was acknowledged; nothing else
        # but messages sent (an unfinished batch may be there, once).
        lost = [a.payload for a in history.acked if logged[a.payload] == 0]
        moved = [a.payload for a in history.acked if a.payload in at and at[a.payload] != a.lsn]
        twice = [p for p, n in logged.items() if n > 1]
        unknown = set(logged) - set(sent)
        assert not lost, f"acknowledged but lost: {lost[:10]} (seed {seed})"
        assert not moved, f"acknowledged at another LSN: {moved[:10]} (seed {seed})"
        assert not twice, f"in the log twice: {twice[:10]} (seed {seed})"
        assert not unknown, f"never sent: {sorted(unknown)[:10]} (seed {seed})"
        lsns = [e.lsn for e in entries]
        assert lsns == sorted(set(lsns)), f"LSNs not increasing (seed {seed})"
    finally:
        # Undo every fault, then stop everything, whatever failed above.
        done.set()
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                dev.signal_node(pid, signal.SIGCONT)
        for node_id in cut:
            with contextlib.suppress(netns.NetnsError):
                hosts.set_connected(node_id, True)
        if writer is not None:
            writer.join(timeout=scaled(60))
        writer_client.close()
        client.close()
        local.stop_all()
        local.remove_hosts()
    assert not hosts.exists()
