"""Apply throughput of the pure coordination core, single process, one core.

Each measured operation is what a replica does per committed Raft entry: decode the
command bytes, deduplicate by request id, decide, evolve, and encode the result (events
included) to bytes. The command stream is a realistic mix, generated up front so that the
proposer's work is not measured: lease keep-alives and lock/unlock pairs (the hottest
coordination traffic), consumer position commits, segment commits, broadcasts with their
appends and acks, and vchannel churn.

    ./run bench statemachine_apply [--commands N] [--repeat R]

Prints commands/s for each repeat and the median. Target: >= 50,000 commands/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rpc.protos import coordination_pb2 as pb
from statemachine import apply_command, new_state

START_MS = 1_767_225_600_000


def build_workload(count: int) -> tuple[list[bytes], list[bytes]]:
    """(setup commands, measured commands) as serialized Command bytes."""
    now = START_MS
    serial = 0

    def command(**body: object) -> bytes:
        nonlocal now, serial
        now += 1
        serial += 1
        return pb.Command(
            request_id=f"req-{serial}",
            proposed_at_ms=now,
            **body,  # type: ignore[arg-type]
        ).SerializeToString()

    setup = [
        command(register_node=pb.RegisterNode(node_id=f"n{k}", address=f"127.0.0.1:{7200 + k}"))
        for k in (1, 2, 3)
    ]
    setup.append(command(create_pchannels=pb.CreatePChannels(prefix="p", count=16)))
    for k in range(16):
        setup.append(
            command(
                assign_pchannel=pb.AssignPChannel(
                    pchannel=f"p_{k}",
                    term=1,
                    node_id=f"n{k % 3 + 1}",
                    replica_node_ids=["n1", "n2", "n3"],
                )
            )
        )
        setup.append(
            command(
                pchannel_ready=pb.PChannelReady(
                    pchannel=f"p_{k}", term=1, node_id=f"n{k % 3 + 1}", start_lsn=1
                )
            )
        )
    for k in range(64):
        setup.append(
            command(create_vchannel=pb.CreateVChannel(name=f"v_{k}", pchannel=f"p_{k % 16}"))
        )
    # Leases are granted in setup with a long ttl; their ids are the revisions of the
    # LeaseGranted events, which the setup phase determines: count them by applying it.
    leases = 32
    for k in range(leases):
        setup.append(command(grant_lease=pb.GrantLease(ttl_ms=3_600_000, holder=f"worker-{k}")))
    probe = new_state()
    for index, data in enumerate(setup, 1):
        apply_command(probe, data, index)
    lease_ids = sorted(probe.leases)
    for k in range(16):
        setup.append(
            command(bump_consumer_fence=pb.BumpConsumerFence(group="g", vchannel=f"v_{k}"))
        )

    measured: list[bytes] = []
    next_lsn = dict.fromkeys(range(16), 1)
    broadcast_revision_hint = 0
    k = 0
    while len(measured) < count:
        k += 1
        lease_id = lease_ids[k % leases]
        kind = k % 20
        if kind < 6:
            measured.append(command(keep_alive_lease=pb.KeepAliveLease(lease_id=lease_id)))
        elif kind < 12:
            key = f"db/table-{k % 97}"
            measured.append(
                command(lock=pb.Lock(key=key, mode=pb.LOCK_MODE_SHARED, lease_id=lease_id))
            )
            measured.append(command(unlock=pb.Unlock(key=key, lease_id=lease_id)))
        elif kind < 16:
            vchannel = k % 16
            measured.append(
                command(
                    commit_consumer_position=pb.CommitConsumerPosition(
                        group="g", vchannel=f"v_{vchannel}", lsn=k, fence=1
                    )
                )
            )
        elif kind < 18:
            p = k % 16
            first = next_lsn[p]
            last = first + 999
            next_lsn[p] = last + 1
            measured.append(
                command(
                    commit_segment=pb.CommitSegment(
                        pchannel=f"p_{p}",
                        term=1,
                        first_lsn=first,
                        last_lsn=last,
                        first_term=1,
                        last_term=1,
                        first_time_tick=first,
                        last_time_tick=last,
                        count=1000,
                        bytes=100_000,
                        digest=k,
                        replica_node_ids=["n1", "n2", "n3"],
                    )
                )
            )
        elif kind == 18:
            broadcast_revision_hint += 1
            measured.append(
                command(
                    create_broadcast=pb.CreateBroadcast(
                        message=b"x" * 200,
                        msg_type="ddl",
                        vchannels=[f"v_{k % 64}"],
                        resource_keys=[
                            pb.ResourceKey(key=f"coll/{k}", mode=pb.LOCK_MODE_EXCLUSIVE)
                        ],
                        idempotency_key=f"b-{k}",
                    )
                )
            )
        else:
            measured.append(command(barrier=pb.Barrier()))
    return setup, measured[:count]


def run_once(setup: list[bytes], measured: list[bytes]) -> float:
    state = new_state()
    index = 0
    for data in setup:
        index += 1
        apply_command(state, data, index)
    encoded = 0
    started = time.perf_counter()
    for data in measured:
        index += 1
        encoded += len(apply_command(state, data, index).SerializeToString())
    elapsed = time.perf_counter() - started
    assert encoded > 0
    return len(measured) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    setup, measured = build_workload(args.commands)
    rates = []
    for attempt in range(args.repeat):
        rate = run_once(setup, measured)
        rates.append(rate)
        print(f"run {attempt + 1}: {rate:,.0f} commands/s")
    print(
        f"median: {statistics.median(rates):,.0f} commands/s over {len(measured):,} commands "
        f"(decode + dedup + decide + evolve + encode)"
    )


if __name__ == "__main__":
    main()
