"""How sticky Raft leadership is on a noisy host: followers paused at random, a write load.

Three `peer_main.py` processes on 127.0.0.1 (tests/raft/raft_harness.py). For
`--duration-s`, one proposal every `--write-interval-s` goes to the leader, and every
`--pause-every-s` one follower (never the leader) is stopped with SIGSTOP for a random
time in `--pause-min-s`..`--pause-max-s`, then resumed: a descheduled or starved process,
without burning CPU the way busy-loop hogs would on a shared machine. Nothing here should
cost the leader its leadership: a follower that merely missed heartbeats must not raise
its term (PreVote) and a leader that hears a majority keeps it (CheckQuorum).

Reports, per run: the Raft term first and last, leader changes seen (in once-a-second
samples of the leader the running peers agree on, and on failed writes), samples with no
agreed leader, failed writes, and write p50/p99. `--tick-mode loop` ticks every peer on an event loop
(RAFTWAL_RAFT_TICK_ON_LOOP=1). Every process it starts is stopped by its own pid.

    .venv/bin/python bench/raft_stickiness.py --duration-s 60
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "raft"))

from raft_harness import Cluster, PeerDied, PeerProcess  # noqa: E402


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run(args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(args.seed)
    env = {"RAFTWAL_RAFT_TICK_ON_LOOP": "1" if args.tick_mode == "loop" else "0"}
    with tempfile.TemporaryDirectory(prefix="raft-stickiness-") as directory:
        cluster = Cluster(Path(directory), 3, env=env)
        cluster.start_all()
        try:
            leader = cluster.wait_for_leader(20.0)
            first_term = leader.status()["status"]["term"]
            leaders_seen = [leader.name]
            latencies_ms: list[float] = []
            failed = 0
            paused: PeerProcess | None = None
            resume_at = 0.0
            next_pause = time.monotonic() + args.pause_every_s
            until = time.monotonic() + args.duration_s
            index = 0
            # Once a second: the leader the running peers name (None: no agreed leader).
            samples: list[str | None] = []
            next_sample = time.monotonic()
            while time.monotonic() < until:
                now = time.monotonic()
                if now >= next_sample:
                    next_sample = now + 1.0
                    named = {
                        p.status()["status"]["leader"] for p in cluster.peers if p is not paused
                    }
                    samples.append(named.pop() if len(named) == 1 else None)
                if paused is not None and now >= resume_at:
                    paused.resume()
                    paused = None
                if paused is None and now >= next_pause:
                    followers = [p for p in cluster.peers if p is not leader]
                    paused = rng.choice(followers)
                    paused.pause()
                    resume_at = now + rng.uniform(args.pause_min_s, args.pause_max_s)
                    next_pause = resume_at + args.pause_every_s
                index += 1
                started = time.monotonic()
                try:
                    answer = leader.request(
                        "propose", data=f"w{index}", timeout_s=args.write_timeout_s
                    )
                    ok = bool(answer.get("ok"))
                except (PeerDied, TimeoutError):
                    ok = False
                if ok:
                    latencies_ms.append((time.monotonic() - started) * 1000)
                else:
                    failed += 1
                    # Find the leader again among the peers that answer.
                    alive = [p for p in cluster.peers if p is not paused]
                    with contextlib.suppress(TimeoutError):
                        leader = cluster.wait_for_leader(10.0, among=alive)
                    if leader.name != leaders_seen[-1]:
                        leaders_seen.append(leader.name)
                time.sleep(max(0.0, args.write_interval_s - (time.monotonic() - started)))
            if paused is not None:
                paused.resume()
            final = cluster.wait_for_leader(20.0)
            if final.name != leaders_seen[-1]:
                leaders_seen.append(final.name)
            last_term = max(p.status()["status"]["term"] for p in cluster.peers)
        finally:
            cluster.stop_all()
    return {
        "tick_mode": args.tick_mode,
        "duration_s": args.duration_s,
        "term_first": first_term,
        "term_last": last_term,
        "leader_changes": sum(
            1 for a, b in zip(samples, samples[1:], strict=False) if a and b and a != b
        )
        + (len(leaders_seen) - 1),
        "samples_without_leader": f"{sum(1 for x in samples if x is None)} of {len(samples)}",
        "writes": index,
        "failed_writes": failed,
        "write_p50_ms": round(statistics.median(latencies_ms), 1) if latencies_ms else None,
        "write_p99_ms": round(_percentile(latencies_ms, 0.99), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--write-interval-s", type=float, default=0.1)
    parser.add_argument("--write-timeout-s", type=float, default=5.0)
    parser.add_argument("--pause-every-s", type=float, default=1.5)
    parser.add_argument("--pause-min-s", type=float, default=0.5)
    parser.add_argument("--pause-max-s", type=float, default=2.5)
    parser.add_argument("--tick-mode", choices=("thread", "loop"), default="thread")
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args()
    if not 5 <= args.duration_s <= 3600:
        parser.error(f"invalid --duration-s ({args.duration_s}; expected 5..3600)")
    if not 0 < args.pause_min_s <= args.pause_max_s <= 30:
        parser.error(
            f"invalid pause range ({args.pause_min_s}..{args.pause_max_s}; expected "
            "0 < min <= max <= 30)"
        )
    print(f"seed {args.seed}", file=sys.stderr)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
